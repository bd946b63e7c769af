//! Many processes on one device (`BLUERDMA_SHARED=1`): the first open starts the device's
//! daemon (`bluerdma-devd`), every process runs its own engine on a share of the card.
//!
//! - Two processes on one device (this one and a `verbs_peer` child) each connect a QP to
//!   a third device and move bytes both ways; a SEND reaches the child's posted receive
//!   (the out-of-band relay of the daemon); the two got QPNs from disjoint windows.
//! - A process killed with SIGKILL while its WRITEs are in flight: this process's QP on the
//!   same device keeps working, and the daemon's card tables go back to what they held
//!   before the child came (read from the emulated card's own tables).
//!
//! Each test has its own pair of devices in 127.0.4.0/24, so they may run at once.

use std::sync::Once;
use std::time::{Duration, Instant};

use bluerdma_core::engine::{SendOp, WcStatus};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_linux::{Context, Endpoint};
use bluerdma_tests::shared::{open, setup, status, status_field, Peer};
use bluerdma_tests::{fill_pattern, line_field, parse_hex, pattern_mismatch, raw_wr, ALL};

const DEVICES: &str = "sa=127.0.4.1,sb=127.0.4.2,sc=127.0.4.3,sd=127.0.4.4";
const STEP: Duration = Duration::from_secs(30);
const KIB: usize = 1024;

fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("verbs_shared-{}", std::process::id()));
        setup(DEVICES, &dir);
    });
}

fn hex(line: &str, k: &str) -> u64 {
    line_field(line, k)
        .and_then(parse_hex)
        .unwrap_or_else(|| panic!("{k} in {line:?}"))
}

/// A QP with its CQ, PD and one MR of `len` bytes on `ctx`.
struct End {
    qp: bluerdma_linux::Qp,
    cq: bluerdma_linux::Cq,
    mr: bluerdma_linux::Mr,
    _pd: bluerdma_linux::Pd,
}

fn end(ctx: &Context, len: usize) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq().unwrap();
    let qp = pd.create_qp(&cq, &cq).unwrap();
    let mr = pd.alloc_mr(len, ALL).unwrap();
    End {
        qp,
        cq,
        mr,
        _pd: pd,
    }
}

fn ep(e: &End, ctx: &Context) -> Endpoint {
    Endpoint {
        qpn: e.qp.qpn(),
        ip: ctx.spec().ip,
        psn: 0,
    }
}

fn write_and_wait(from: &End, off: usize, len: usize, to: u64, key: MrKey) -> WcStatus {
    let wr = raw_wr(
        7,
        SendOp::Write,
        (from.mr.addr() + off as u64, from.mr.key()),
        len,
        (to, key),
    );
    // SAFETY: the MR outlives the WRITE (we wait for its completion).
    unsafe { from.qp.post_send(&[wr]) }.unwrap();
    from.cq.wait(1, STEP).unwrap()[0].status
}

#[test]
fn two_processes_on_one_device_each_move_bytes_to_a_third() {
    init();
    let a = open("sa").expect("open sa through its daemon");
    let b = open("sb").expect("open sb through its daemon");
    let mut ea = end(&a, 512 * KIB);
    let mut eb1 = end(&b, 2048 * KIB);
    let eb2 = end(&b, 64 * KIB);
    ea.qp.connect(ep(&eb1, &b), 0, 14, 7).unwrap();
    eb1.qp.connect(ep(&ea, &a), 0, 14, 7).unwrap();

    let (mut child, ready) = Peer::spawn(env!("CARGO_BIN_EXE_verbs_peer"), "sa", 512 * KIB);
    let child_qpn = hex(&ready, "qpn") as u32;
    let (child_addr, child_key) = (
        hex(&ready, "addr"),
        MrKey::from_raw(hex(&ready, "key") as u32),
    );
    assert_ne!(
        Qpn::from_raw(child_qpn).index() / 128,
        ea.qp.qpn().index() / 128,
        "the two processes' QPs come from disjoint windows of the card's table"
    );
    let r = child.ask(&format!(
        "CONNECT qpn={:#x} ip={} psn=0 mypsn=0 timeout=14 retries=7",
        eb2.qp.qpn().get(),
        b.spec().ip
    ));
    assert_eq!(r, "OK");
    let child_ep = Endpoint {
        qpn: Qpn::from_raw(child_qpn),
        ip: a.spec().ip,
        psn: 0,
    };
    eb2.qp.connect(child_ep, 0, 14, 7).unwrap();

    // This process's WRITE from the shared device, and the child's.
    fill_pattern(ea.mr.bytes_mut().unwrap(), 1, 0);
    let st = write_and_wait(&ea, 0, 512 * KIB, eb1.mr.addr(), eb1.mr.key());
    assert_eq!(st, WcStatus::Success);
    assert_eq!(child.ask("FILL off=0 len=524288 seed=2"), "OK");
    let r = child.ask(&format!(
        "WRITE raddr={:#x} rkey={:#x} off=0 len=524288",
        eb1.mr.addr() + 1024 * 1024,
        eb1.mr.key().get()
    ));
    assert_eq!(r, "DONE status=0", "the child's WRITE completes");
    let got = eb1.mr.bytes().unwrap();
    assert_eq!(
        pattern_mismatch(&got[..512 * KIB], 1, 0),
        None,
        "this process's bytes"
    );
    assert_eq!(
        pattern_mismatch(&got[1024 * KIB..1536 * KIB], 2, 0),
        None,
        "the child's bytes"
    );

    // A WRITE into each of the two processes' memory on the shared device.
    fill_pattern(&mut eb1.mr.bytes_mut().unwrap()[..64 * KIB], 3, 0);
    let st = write_and_wait(&eb1, 0, 64 * KIB, ea.mr.addr(), ea.mr.key());
    assert_eq!(st, WcStatus::Success);
    assert_eq!(
        pattern_mismatch(&ea.mr.bytes().unwrap()[..64 * KIB], 3, 0),
        None
    );
    let st = write_and_wait(&eb1, 0, 64 * KIB, child_addr, child_key);
    assert_eq!(st, WcStatus::Success);
    assert_eq!(child.ask("CHECK off=0 len=65536 seed=3"), "OK");

    // A SEND to the child: its receive WR travels through the daemons' relay.
    assert_eq!(child.ask("RECV wr=9 off=4096 len=8192"), "OK");
    std::thread::sleep(Duration::from_millis(200));
    let send = raw_wr(
        8,
        SendOp::Send,
        (eb2.mr.addr(), eb2.mr.key()),
        4000,
        (0, MrKey::from_raw(0)),
    );
    // SAFETY: the MR outlives the SEND.
    unsafe { eb2.qp.post_send(&[send]) }.unwrap();
    assert_eq!(eb2.cq.wait(1, STEP).unwrap()[0].status, WcStatus::Success);
    let r = child.ask("WAITRECV");
    assert_eq!(r, "RECVD wr=9 len=4000 status=0");
    child.quit();
}

#[test]
fn a_killed_process_leaves_nothing_in_the_card_and_the_others_go_on() {
    init();
    let c = open("sc").expect("open sc through its daemon");
    let d = open("sd").expect("open sd through its daemon");
    let mut ec = end(&c, 256 * KIB);
    let ed1 = end(&d, 1024 * KIB);
    let ed2 = end(&d, 1024 * KIB);
    ec.qp.connect(ep(&ed1, &d), 0, 14, 7).unwrap();
    ed1.qp.connect(ep(&ec, &c), 0, 14, 7).unwrap();
    let before = status("sc").unwrap();
    let base_qps = status_field(&before, "card", "valid_qps").expect("card tables in status");
    let base_mrs = status_field(&before, "card", "valid_mrs").expect("card tables in status");

    let (mut child, ready) = Peer::spawn(env!("CARGO_BIN_EXE_verbs_peer"), "sc", 256 * KIB);
    let pid = child.pid();
    let r = child.ask(&format!(
        "CONNECT qpn={:#x} ip={} psn=0 mypsn=0 timeout=14 retries=7",
        ed2.qp.qpn().get(),
        d.spec().ip
    ));
    assert_eq!(r, "OK");
    ed2.qp
        .connect(
            Endpoint {
                qpn: Qpn::from_raw(hex(&ready, "qpn") as u32),
                ip: c.spec().ip,
                psn: 0,
            },
            0,
            14,
            7,
        )
        .unwrap();
    let during = status("sc").unwrap();
    assert!(
        status_field(&during, "card", "valid_qps").unwrap() > base_qps,
        "the child's QP is in the card:\n{during}"
    );
    let r = child.ask(&format!(
        "STREAM raddr={:#x} rkey={:#x} len=65536 count=200",
        ed2.mr.addr(),
        ed2.mr.key().get()
    ));
    assert!(r.starts_with("POSTED"), "{r}");
    // SAFETY: kill on the child's pid, which this test owns until it reaps it.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    child.reap();

    // This process's QP on the same device still works.
    fill_pattern(ec.mr.bytes_mut().unwrap(), 5, 0);
    let st = write_and_wait(&ec, 0, 256 * KIB, ed1.mr.addr(), ed1.mr.key());
    assert_eq!(st, WcStatus::Success);
    assert_eq!(
        pattern_mismatch(&ed1.mr.bytes().unwrap()[..256 * KIB], 5, 0),
        None
    );

    // The daemon cleans the child's QP and MR out of the card.
    let deadline = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let s = status("sc").unwrap();
        let child_line = s.lines().any(|l| l.contains(&format!("pid={pid} ")));
        let qps = status_field(&s, "card", "valid_qps");
        let mrs = status_field(&s, "card", "valid_mrs");
        if !child_line && qps == Some(base_qps) && mrs == Some(base_mrs) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the killed process's resources remain:\n{s}\nbefore:\n{before}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        last.contains("reaped: 1 "),
        "the daemon counts one client cleaned up:\n{last}"
    );

    // And the device still takes a new process.
    let (again, _) = Peer::spawn(env!("CARGO_BIN_EXE_verbs_peer"), "sc", 64 * KIB);
    again.quit();
}
