//! SEND / SEND_WITH_IMM over the out-of-band receive announcements (issue D engine side),
//! on two emulated NICs in one process with the in-process OOB hub.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{QpCaps, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WC_WITH_IMM};
use bluerdma_core::qp::QpState;
use bluerdma_linux::oob_hub::OobHub;
use bluerdma_linux::{Context, Cq, DeviceSpec, Mr, Pd, Qp};
use bluerdma_sim::link::MemHub;

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

struct Side {
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn devices() -> (Context, Context, OobHub) {
    let hub = MemHub::new();
    let oob = OobHub::new();
    let a = Context::open_emulated_with_oob(
        DeviceSpec::new("blue0", IP0),
        Box::new(hub.attach(IP0).unwrap()),
        Some(Box::new(oob.attach(IP0))),
    )
    .unwrap();
    let b = Context::open_emulated_with_oob(
        DeviceSpec::new("blue1", IP1),
        Box::new(hub.attach(IP1).unwrap()),
        Some(Box::new(oob.attach(IP1))),
    )
    .unwrap();
    (a, b, oob)
}

fn sides(a: &Context, b: &Context) -> (Side, Side) {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    // ibv_rc_pingpong's 500 receive WRs fit.
    let caps = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    let qa = pa.create_qp_with(&ca, &ca, caps).unwrap();
    let qb = pb.create_qp_with(&cb, &cb, caps).unwrap();
    (
        Side {
            pd: pa,
            cq: ca,
            qp: qa,
        },
        Side {
            pd: pb,
            cq: cb,
            qp: qb,
        },
    )
}

fn connect(sa: &Side, sb: &Side, rnr_retry: u8) {
    sa.qp
        .connect_rnr(sb.qp.endpoint(20), 10, 14, 7, rnr_retry, 1)
        .unwrap();
    sb.qp
        .connect_rnr(sa.qp.endpoint(10), 20, 14, 7, rnr_retry, 1)
        .unwrap();
}

fn recv(qp: &Qp, wr_id: u64, mr: &Mr, off: u64, len: u32) {
    let r = RecvWr {
        wr_id,
        addr: VirtAddr(mr.addr() + off),
        len,
        lkey: mr.key(),
    };
    // SAFETY: the MR outlives the completion.
    unsafe { qp.post_recv(&[r]).unwrap() };
}

fn send(
    qp: &Qp,
    wr_id: u64,
    op: SendOp,
    mr: &Mr,
    off: u64,
    len: u32,
) -> Result<(), bluerdma_linux::Error> {
    let wr = SendWr {
        wr_id,
        op,
        laddr: VirtAddr(mr.addr() + off),
        len,
        lkey: mr.key(),
        raddr: VirtAddr(0),
        rkey: bluerdma_core::keys::MrKey::from_raw(0),
        signaled: true,
        solicited: false,
    };
    // SAFETY: the MR outlives the completion.
    unsafe { qp.post_send(&[wr]) }.map_err(|(_, e)| e)
}

#[test]
fn send_of_many_sizes_lands_in_the_posted_buffers_with_byte_len() {
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    let size = 16 << 20;
    let mut src = sa.pd.alloc_mr(size, ALL).unwrap();
    for (i, x) in src.bytes_mut().unwrap().iter_mut().enumerate() {
        *x = (i * 31 + 5) as u8;
    }
    let dst = sb
        .pd
        .alloc_mr(size + 8192, AccessFlags::LOCAL_WRITE)
        .unwrap();
    // Receives posted in INIT, before the QP is connected, are announced at RTR.
    sb.qp
        .modify(
            &bluerdma_core::qp::RawQpAttr {
                qp_state: QpState::Init.to_ibv(),
                qp_access_flags: 7,
                ..Default::default()
            },
            bluerdma_core::qp::QpAttrMask::STATE
                | bluerdma_core::qp::QpAttrMask::PKEY_INDEX
                | bluerdma_core::qp::QpAttrMask::PORT
                | bluerdma_core::qp::QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let sizes = [0u32, 1, 4096, 65_537, 1 << 20, 16 << 20];
    for (k, len) in sizes.iter().enumerate() {
        recv(&sb.qp, 100 + k as u64, &dst, 4096, *len + 64);
    }
    connect(&sa, &sb, 7);
    for (k, len) in sizes.iter().enumerate() {
        let op = if k % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendWithImm(0xABC0 + k as u32)
        };
        send(&sa.qp, k as u64, op, &src, 0, *len).unwrap();
        let w = sa.cq.wait(1, Duration::from_secs(20)).unwrap();
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].opcode),
            (k as u64, WcStatus::Success, WcOpcode::Send),
            "{len} B: {:?}",
            b.stats()
        );
        let r = sb.cq.wait(1, Duration::from_secs(20)).unwrap();
        assert_eq!(r.len(), 1, "{len} B: a receive completion");
        assert_eq!(
            (r[0].wr_id, r[0].status, r[0].opcode, r[0].byte_len),
            (100 + k as u64, WcStatus::Success, WcOpcode::Recv, *len)
        );
        if k % 2 == 1 {
            assert_eq!(
                (r[0].imm_data, r[0].wc_flags & WC_WITH_IMM),
                (0xABC0 + k as u32, WC_WITH_IMM)
            );
        }
        let got = &dst.bytes().unwrap()[4096..4096 + *len as usize];
        assert!(
            got == &src.bytes().unwrap()[..*len as usize],
            "{len} B intact"
        );
    }
}

#[test]
fn send_without_a_receive_waits_under_rnr_and_completes_when_one_is_posted() {
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 7);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    let dst = sb.pd.alloc_mr(4096, ALL).unwrap();
    send(&sa.qp, 1, SendOp::Send, &src, 0, 100).unwrap();
    assert!(
        sa.cq.wait(1, Duration::from_millis(50)).unwrap().is_empty(),
        "no receive yet: the SEND waits"
    );
    recv(&sb.qp, 9, &dst, 0, 4096);
    let w = sa.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success));
    assert!(a.stats().rnr_waits > 0);
}

#[test]
fn rnr_retries_run_out_with_rnr_retry_exc_err() {
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 2);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    // One chain: with min_rnr_timer 1 (10 us) the retries run out in tens of microseconds,
    // and a second post_send could find the QP in ERR already.
    let wr = |wr_id| SendWr {
        wr_id,
        op: SendOp::Send,
        laddr: VirtAddr(src.addr()),
        len: 10,
        lkey: src.key(),
        raddr: VirtAddr(0),
        rkey: bluerdma_core::keys::MrKey::from_raw(0),
        signaled: true,
        solicited: false,
    };
    // SAFETY: the MR outlives the completions.
    unsafe { sa.qp.post_send(&[wr(3), wr(4)]) }.unwrap();
    let w = sa.cq.wait(2, Duration::from_secs(5)).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (3, WcStatus::RnrRetryExcErr));
    assert_eq!((w[1].wr_id, w[1].status), (4, WcStatus::WrFlushErr));
    assert_eq!(sa.qp.query().unwrap().state, QpState::Err);
    drop(b);
}

/// A SEND longer than the receive WR it is matched with: the requester completes it with
/// REM_INV_REQ_ERR and writes nothing; the receiver is told over the out-of-band channel and
/// completes that receive WR with LOC_LEN_ERR, after the SEND that fitted, and its QP goes
/// to ERR: the receive WRs behind it and any posted later are flushed.
#[test]
fn send_longer_than_the_receive_buffer_is_an_error() {
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 7);
    let src = sa.pd.alloc_mr(8192, ALL).unwrap();
    let dst = sb.pd.alloc_mr(8192, ALL).unwrap();
    recv(&sb.qp, 1, &dst, 0, 100);
    recv(&sb.qp, 2, &dst, 4096, 100);
    recv(&sb.qp, 3, &dst, 4096, 4096);
    send(&sa.qp, 6, SendOp::Send, &src, 0, 100).unwrap();
    send(&sa.qp, 7, SendOp::Send, &src, 0, 101).unwrap();
    let w = sa.cq.wait(2, Duration::from_secs(5)).unwrap();
    let w: Vec<_> = w.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(w, [(6, WcStatus::Success), (7, WcStatus::RemInvReqErr)]);
    assert_eq!(sa.qp.query().unwrap().state, QpState::Err);
    assert!(
        dst.bytes().unwrap()[4096..].iter().all(|x| *x == 0),
        "nothing of the long SEND written"
    );
    let r = sb.cq.wait(3, Duration::from_secs(5)).unwrap();
    let r: Vec<_> = r
        .iter()
        .map(|r| (r.wr_id, r.status, r.opcode, r.byte_len))
        .collect();
    assert_eq!(
        r,
        [
            (1, WcStatus::Success, WcOpcode::Recv, 100),
            (2, WcStatus::LocLenErr, WcOpcode::Recv, 0),
            (3, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
        ]
    );
    assert_eq!(sb.qp.query().unwrap().state, QpState::Err);
    recv(&sb.qp, 4, &dst, 0, 100);
    let r = sb.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((r[0].wr_id, r[0].status), (4, WcStatus::WrFlushErr));
    assert_eq!(
        (a.stats().sends_too_long, b.stats().recvs_too_short),
        (1, 1)
    );
}

#[test]
fn a_lost_peer_flushes_the_qps_that_depend_on_it() {
    let (a, b, oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 7);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    send(&sa.qp, 5, SendOp::Send, &src, 0, 10).unwrap();
    oob.disconnect(IP1, IP0);
    let w = sa.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (5, WcStatus::WrFlushErr));
    assert_eq!(sa.qp.query().unwrap().state, QpState::Err);
    assert_eq!(a.stats().peers_lost, 1);
    drop((sb, b));
}

#[test]
fn a_lost_peer_fails_a_passive_receiver_and_the_next_send() {
    let (a, b, oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 7);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    let dst = sb.pd.alloc_mr(4096, ALL).unwrap();
    // B's receive WR is posted and announced; B only waits (ib_send_bw's server). Then the
    // channel breaks both ways: the peers are gone for each other.
    recv(&sb.qp, 1, &dst, 0, 100);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.stats().recvs_received < 1 && std::time::Instant::now() < deadline {
        a.poll();
    }
    oob.disconnect(IP1, IP0);
    oob.disconnect(IP0, IP1);
    // The passive receiver learns it: its receive WR is flushed, its QP is in ERR.
    let r = sb.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((r[0].wr_id, r[0].status), (1, WcStatus::WrFlushErr));
    assert_eq!(sb.qp.query().unwrap().state, QpState::Err);
    // A had nothing waiting: its QP runs on, but a SEND can never find a receive WR (the
    // one B announced went with B): it fails at once instead of waiting under the RNR
    // rules (rnr_retry 7 would wait forever).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.stats().peers_lost < 1 && std::time::Instant::now() < deadline {
        a.poll();
    }
    assert_eq!(sa.qp.query().unwrap().state, QpState::Rts, "A keeps its QP");
    send(&sa.qp, 3, SendOp::Send, &src, 0, 64).unwrap();
    let w = sa.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (3, WcStatus::WrFlushErr));
    assert_eq!(sa.qp.query().unwrap().state, QpState::Err);
    assert_eq!((a.stats().peers_lost, b.stats().peers_lost), (1, 1));
    drop((sb, b));
}

#[test]
fn a_whole_receive_queue_announced_before_the_sender_connects_is_kept() {
    // ibv_rc_pingpong's order: the server posts 500 receive WRs and connects first; they
    // reach the client while its QP is still in INIT.
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    let dst = sb.pd.alloc_mr(500 * 64, ALL).unwrap();
    sb.qp
        .connect_rnr(sa.qp.endpoint(10), 20, 14, 7, 0, 1)
        .unwrap();
    for k in 0..500u64 {
        recv(&sb.qp, k, &dst, k * 64, 64);
    }
    // Let A's engine take the announcements in while its QP is not connected.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.stats().recvs_early < 500 && std::time::Instant::now() < deadline {
        a.poll();
    }
    assert_eq!(a.stats().recvs_early, 500, "all 500 waited for A's QP");
    sa.qp
        .connect_rnr(sb.qp.endpoint(20), 10, 14, 7, 0, 1)
        .unwrap();
    let mut src = sa.pd.alloc_mr(64, ALL).unwrap();
    src.bytes_mut().unwrap().fill(0xA5);
    // rnr_retry 0: a SEND that found no receive WR would fail with RNR_RETRY_EXC_ERR.
    for k in 0..500u64 {
        send(&sa.qp, k, SendOp::Send, &src, 0, 64).unwrap();
        let w = sa.cq.wait(1, Duration::from_secs(5)).unwrap();
        assert_eq!((w[0].wr_id, w[0].status), (k, WcStatus::Success));
    }
    let r = sb.cq.wait(500, Duration::from_secs(10)).unwrap();
    assert_eq!(r.len(), 500);
    for (k, w) in r.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (k as u64, WcStatus::Success, 64)
        );
    }
    assert!(
        dst.bytes().unwrap().iter().all(|x| *x == 0xA5),
        "every buffer filled"
    );
    assert_eq!(a.stats().recvs_dropped, 0);
}

#[test]
fn a_send_ignores_its_remote_address_and_key() {
    // The peer's receive WR gives a SEND's destination; whatever the caller left in the
    // request's remote fields (an address range that wraps) does not matter.
    let (a, b, _oob) = devices();
    let (sa, sb) = sides(&a, &b);
    connect(&sa, &sb, 7);
    let mut src = sa.pd.alloc_mr(64, ALL).unwrap();
    src.bytes_mut().unwrap().fill(0x5A);
    let dst = sb.pd.alloc_mr(64, ALL).unwrap();
    recv(&sb.qp, 1, &dst, 0, 64);
    let wr = SendWr {
        wr_id: 9,
        op: SendOp::Send,
        laddr: VirtAddr(src.addr()),
        len: 64,
        lkey: src.key(),
        raddr: VirtAddr(u64::MAX - 10),
        rkey: bluerdma_core::keys::MrKey::from_raw(0xDEAD_BEEF),
        signaled: true,
        solicited: false,
    };
    // SAFETY: the MR outlives the completion.
    unsafe { sa.qp.post_send(&[wr]) }.unwrap();
    let w = sa.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (9, WcStatus::Success));
    let r = sb.cq.wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (1, WcStatus::Success, 64)
    );
    assert!(dst.bytes().unwrap().iter().all(|x| *x == 0x5A));
}
