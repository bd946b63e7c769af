//! 1,000 connections, one after the other, through one listener: each connects with private
//! data, is accepted with an answer, moves a SEND from client to server (the bytes are
//! checked), disconnects from the client and is torn down (QPs, CQs, ids, MRs). After a
//! warm-up of 100 cycles the process's open file descriptors must not change and its
//! resident memory must stay flat: nothing a connection makes outlives it.
//!
//! Both ends run in this process, on two devices of their own (127.0.3.1 and 127.0.3.2).

mod common;

use common::abi::*;
use common::*;
use std::net::{Ipv4Addr, SocketAddrV4};

const SERVER: Ipv4Addr = Ipv4Addr::new(127, 0, 3, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 3, 2);
const PORT: u16 = 7300;
const CYCLES: u32 = 1000;
const WARM_UP: u32 = 100;
/// Resident memory the 900 measured cycles may add (allocator slack, never per-cycle state).
const RSS_SLACK_KB: u64 = 8 * 1024;

/// Open fds, the least seen over 100 ms: a CM socket closed with the last cycle may still be
/// on its way out (the CM thread closes it once its last bytes are sent).
fn open_fds() -> usize {
    (0..20)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            std::fs::read_dir("/proc/self/fd")
                .map(|d| d.count())
                .unwrap_or(0)
        })
        .min()
        .unwrap_or(0)
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// One connection: connect, accept, a SEND, disconnect, teardown.
fn cycle(api: &Api, listen_ch: *mut RdmaEventChannel, cli_ch: *mut RdmaEventChannel, n: u32) {
    let cli = api.resolved(cli_ch, RDMA_PS_TCP, CLIENT, SocketAddrV4::new(SERVER, PORT));
    let cqp = api.qp(cli, false);
    let hello = n.to_be_bytes();
    let cp = conn_param(&hello);
    // SAFETY: a route-resolved id with a QP; `hello` outlives the call.
    let rc = unsafe { (api.rdma_connect)(cli, &cp) };
    assert_eq!(rc, 0, "rdma_connect: errno {}", errno());

    let req = api.expect(listen_ch, RDMA_CM_EVENT_CONNECT_REQUEST, false);
    assert_eq!(req.private, hello, "cycle {n}: the REQ's private data");
    let child = req.id;
    let sqp = api.qp(child, false);
    // SAFETY: the new id's PD (the device's).
    let rmr = buffer(api, unsafe { (*child).pd }, 64);
    post_recv(sqp, rmr, 64);
    let answer = [0xA5u8, (n & 0xFF) as u8];
    let ap = conn_param(&answer);
    // SAFETY: a connect request's id with a QP.
    let rc = unsafe { (api.rdma_accept)(child, &ap) };
    assert_eq!(rc, 0, "rdma_accept: errno {}", errno());

    let est = api.expect(cli_ch, RDMA_CM_EVENT_ESTABLISHED, false);
    assert_eq!(est.private, answer, "cycle {n}: the REP's private data");
    api.expect(listen_ch, RDMA_CM_EVENT_ESTABLISHED, false);
    if n == 0 {
        // The CM gave each QP the other's number and PSN, and moved both to RTS.
        let (cs, cdest, csq, crq) = api.qp_numbers(cqp);
        let (ss, sdest, ssq, srq) = api.qp_numbers(sqp);
        // SAFETY: live QPs.
        let (cqpn, sqpn) = unsafe { ((*cqp).qp_num, (*sqp).qp_num) };
        assert_eq!((cs, ss), (IBV_QPS_RTS, IBV_QPS_RTS));
        assert_eq!((cdest, sdest), (sqpn, cqpn));
        assert_eq!(
            (crq, srq),
            (ssq, csq),
            "each receive PSN is the peer's send PSN"
        );
    }

    // SAFETY: the client id's PD.
    let smr = buffer(api, unsafe { (*cli).pd }, 64);
    let payload: Vec<u8> = (0..64u32).map(|i| (i as u8) ^ (n as u8)).collect();
    bytes(smr).copy_from_slice(&payload);
    post_send(cqp, smr, 64);
    // SAFETY: the CQs the library made for the ids.
    let (scq, rcq) = unsafe { ((*cli).send_cq, (*child).recv_cq) };
    let wc = poll_one(scq);
    assert_eq!(
        (wc.status, wc.opcode),
        (0, 0),
        "cycle {n}: the SEND's completion"
    );
    let wc = poll_one(rcq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (0, 128, 64),
        "cycle {n}: the receive"
    );
    assert_eq!(
        bytes(rmr),
        &payload[..],
        "cycle {n}: the bytes that arrived"
    );

    // SAFETY: connected ids.
    assert_eq!(unsafe { (api.rdma_disconnect)(cli) }, 0);
    api.expect(cli_ch, RDMA_CM_EVENT_DISCONNECTED, false);
    api.expect(listen_ch, RDMA_CM_EVENT_DISCONNECTED, false);
    // SAFETY: as above; the server's disconnect after the peer's is a no-op that succeeds.
    assert_eq!(unsafe { (api.rdma_disconnect)(child) }, 0);
    free_buffer(api, smr);
    free_buffer(api, rmr);
    // SAFETY: the ids and their QPs are given up.
    unsafe {
        (api.rdma_destroy_qp)(cli);
        (api.rdma_destroy_qp)(child);
        assert_eq!((api.rdma_destroy_id)(cli), 0);
        assert_eq!((api.rdma_destroy_id)(child), 0);
    }
}

#[test]
fn a_thousand_connections_through_one_listener_leak_nothing() {
    let api = api("srv=127.0.3.1,cli=127.0.3.2", 5000);
    let listen_ch = api.channel();
    let cli_ch = api.channel();
    let listener = api.listener(listen_ch, RDMA_PS_TCP, SocketAddrV4::new(SERVER, PORT));
    let mut baseline = None;
    for n in 0..CYCLES {
        if n == WARM_UP {
            baseline = Some((open_fds(), rss_kb()));
        }
        cycle(api, listen_ch, cli_ch, n);
    }
    let (fds0, rss0) = baseline.expect("the warm-up ran");
    let (fds1, rss1) = (open_fds(), rss_kb());
    assert_eq!(
        fds1, fds0,
        "open fds after {WARM_UP} cycles and after {CYCLES}"
    );
    assert!(
        rss1 <= rss0 + RSS_SLACK_KB,
        "resident memory grew from {rss0} kB to {rss1} kB over {} cycles",
        CYCLES - WARM_UP
    );
    // SAFETY: the listener and channels are given up.
    unsafe {
        assert_eq!((api.rdma_destroy_id)(listener), 0);
        (api.rdma_destroy_event_channel)(cli_ch);
        (api.rdma_destroy_event_channel)(listen_ch);
    }
}
