//! A peer that exits right after its last CM call: a server that rejects a request and
//! `_exit`s at once (as pyverbs' reject test does) must still have its REJ, with its
//! private data, reach the requester, as with the kernel's CM; the requester must not see
//! the bare end of the TCP connection (UNREACHABLE).
//!
//! The server is a small C program run with the stand-ins on `LD_LIBRARY_PATH` and its own
//! device, 127.0.5.1; this binary is the client, on 127.0.5.2.

mod common;

use common::abi::*;
use common::*;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const SRV: Ipv4Addr = Ipv4Addr::new(127, 0, 5, 1);
const CLI: Ipv4Addr = Ipv4Addr::new(127, 0, 5, 2);
const TIMEOUT_MS: u64 = 3000;
/// What the server rejects with (and its terminating NUL).
const WHY: &[u8] = b"no thanks\0";

/// Listens on argv[1]:argv[2], rejects the first request with WHY and exits at once.
const SERVER_C: &str = r#"
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    alarm(60); /* a broken library never hangs the suite */
    if (argc != 3)
        return 2;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *l;
    struct rdma_cm_event *ev;
    if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) ||
        rdma_bind_addr(l, (struct sockaddr *)&a) || rdma_listen(l, 1)) {
        perror("listen");
        return 3;
    }
    printf("listening\n");
    fflush(stdout);
    if (rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        fprintf(stderr, "no connect request\n");
        return 4;
    }
    struct rdma_cm_id *child = ev->id;
    rdma_ack_cm_event(ev);
    static const char why[] = "no thanks";
    if (rdma_reject(child, why, sizeof(why))) {
        perror("rdma_reject");
        return 5;
    }
    _exit(0); /* at once: no rdma_destroy_id, no time for the library's CM thread */
}
"#;

/// The server program, and a directory where the stand-ins are `lib*.so.1`.
fn server_and_libs() -> (std::path::PathBuf, std::path::PathBuf) {
    let profile_dir = build();
    // One directory per process: two test runs at once (`cargo xtask ci --stress`) must
    // not rebuild the program the other is running ("Text file busy").
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cm_exit-{}", std::process::id()));
    let libs = dir.join("lib");
    std::fs::create_dir_all(&libs).unwrap();
    for name in ["libibverbs.so", "librdmacm.so"] {
        let link = libs.join(format!("{name}.1"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(profile_dir.join(name), &link).unwrap();
    }
    let (src, bin) = (dir.join("reject_exit.c"), dir.join("reject_exit"));
    std::fs::write(&src, SERVER_C).unwrap();
    let mut cc = Command::new("cc");
    cc.args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-lrdmacm");
    let out = output(
        cc,
        Duration::from_secs(120),
        "install a C compiler and librdmacm-dev (apt-get install gcc librdmacm-dev)",
    );
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (bin, libs)
}

#[test]
fn a_reject_reaches_the_peer_though_the_server_exits_at_once() {
    let a = api("cli=127.0.5.2", TIMEOUT_MS);
    let (bin, libs) = server_and_libs();
    for (round, port) in (7501u16..7504).enumerate() {
        let mut server = Command::new(&bin)
            .arg(SRV.to_string())
            .arg(port.to_string())
            .env("LD_LIBRARY_PATH", &libs)
            .env("BLUERDMA_DEVICES", format!("srv={SRV}"))
            .env("BLUERDMA_CM_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server program was just built");
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "listening",
            "round {round}: the server did not listen"
        );
        let cch = a.channel();
        let cli = a.resolved(cch, RDMA_PS_TCP, CLI, SocketAddrV4::new(SRV, port));
        let mut p = conn_param(&[]);
        p.qp_num = 0x42;
        // SAFETY: a route-resolved id without a QP.
        assert_eq!(unsafe { (a.rdma_connect)(cli, &p) }, 0);
        let e = a.next_event(cch, false);
        assert_eq!(
            (e.event, e.status),
            (RDMA_CM_EVENT_REJECTED, 28),
            "round {round}: a consumer-defined reject, not the end of the connection"
        );
        assert_eq!(e.private, WHY, "round {round}: the reject's private data");
        assert!(
            server.wait().unwrap().success(),
            "round {round}: the server failed"
        );
        // SAFETY: an id of this test, given up.
        unsafe {
            assert_eq!((a.rdma_destroy_id)(cli), 0);
            (a.rdma_destroy_event_channel)(cch);
        }
    }
}
