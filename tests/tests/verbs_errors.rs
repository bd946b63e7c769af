//! Errors end to end on two emulated NICs, each as the real card and driver give them:
//!
//! - a WRITE the responder's card refuses (rkey, bounds, access) is dropped silently
//!   (hardware-contract.md 12): the requester times out, retries `retry_cnt` times, then
//!   completes it with RETRY_EXC_ERR, flushes the rest with WR_FLUSH_ERR and moves the QP to
//!   ERR; not one byte of a refused packet lands on the responder;
//! - a READ the responder's driver refuses (rkey, bounds, REMOTE_READ: the card does not
//!   check READ requests, 12a) gets no response and no ACK, so the same RETRY_EXC_ERR;
//! - a refused QP transition names both states and the missing or forbidden attributes;
//! - a chain with a bad WR posts the ones before it and reports its index (bad_wr).

use std::time::{Duration, Instant};

use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};
use bluerdma_core::keys::MrKey;
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, RawQpAttr};
use bluerdma_linux::{Context, Mr, Qp};
use bluerdma_tests::{
    assert_bytes_eq, assert_untouched, connect_pair, fill_pattern, raw_wr, two_devices, wr, Side,
    ALL, IP1,
};

/// IB `timeout` 10: 4.19 ms per try.
const TIMEOUT: u8 = 10;
const RETRIES: u8 = 3;
/// One try and every retry.
const TRIES: u64 = RETRIES as u64 + 1;
const WAIT: Duration = Duration::from_secs(10);

/// The value of `name=<n>` in the emulated card's counter line (0 when absent).
fn card_counter(ctx: &Context, name: &str) -> u64 {
    ctx.card_stats()
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(0)
}

/// Waits until `count()` reaches `want` (or 2 s pass) and returns its value: the last try
/// reached the responder a timeout before the requester gave up, but its threads may lag.
fn settle(want: u64, count: impl Fn() -> u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    while count() < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    count()
}

fn opcode(w: &SendWr) -> WcOpcode {
    match w.op {
        SendOp::Read => WcOpcode::RdmaRead,
        _ => WcOpcode::RdmaWrite,
    }
}

/// Posts `bad` then `good`, and checks the failure the requester must see: RETRY_EXC_ERR
/// for `bad` after one try and every retry timed out, WR_FLUSH_ERR for `good`, the QP in
/// ERR and refusing new work.
fn expect_retry_exceeded(a: &Context, sa: &Side, bad: SendWr, good: SendWr, what: &str) {
    let start = Instant::now();
    // SAFETY: the callers' MRs outlive the completions awaited here.
    unsafe { sa.qp.post_send(&[bad, good]) }.unwrap();
    let wc = sa.cq.wait(2, WAIT).unwrap();
    let took = start.elapsed();
    assert_eq!(wc.len(), 2, "{what}: two completions\n{}", a.dump());
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (bad.wr_id, WcStatus::RetryExcErr, opcode(&bad)),
        "{what}: the bad WR"
    );
    assert_eq!(
        (wc[1].wr_id, wc[1].status),
        (good.wr_id, WcStatus::WrFlushErr),
        "{what}: the WR after it is flushed"
    );
    // Each try times out; one that makes progress (part of a multi-packet WR acknowledged)
    // earns a fresh set of retries, as in IB. A NAK from the responder's driver (the good
    // WR arrived after a hole) may add one retransmission.
    let stats = a.stats();
    assert!(
        stats.timeouts >= TRIES && stats.retransmits >= RETRIES as u64,
        "{what}: one try and at least {RETRIES} retries, each timed out: {stats:?}"
    );
    let one_packet = bad.op == SendOp::Read || bad.raddr.0 % 4096 + bad.len as u64 <= 4096;
    if one_packet {
        assert_eq!(stats.timeouts, TRIES, "{what}: exactly {RETRIES} retries");
    }
    let expected = Duration::from_nanos(4096 << TIMEOUT) * TRIES as u32;
    assert!(
        took >= expected.mul_f32(0.9),
        "{what}: not before the retries ran out ({took:?} < {expected:?})"
    );
    assert_eq!(sa.qp.query().unwrap().state, QpState::Err, "{what}");
    // SAFETY: refused before anything is posted.
    let err = unsafe { sa.qp.post_send(&[good]) }.unwrap_err();
    assert_eq!(
        (err.0, err.1.to_string()),
        (
            0,
            "post_send: post_send is not allowed in QP state ERR".into()
        ),
        "{what}"
    );
}

/// Responder memory with an MR inside: `len` bytes registered with `access` at a
/// page-aligned offset, with at least a page of unregistered bytes on each side.
struct Target {
    backing: Vec<u8>,
    start: usize,
    mr: Mr,
}

fn target(side: &Side, len: usize, access: AccessFlags) -> Target {
    let mut backing = vec![0u8; len + 3 * 4096];
    let start = 4096 + (4096 - backing.as_ptr() as usize % 4096) % 4096;
    // SAFETY: `backing` outlives the MR: `Target::release` drops the MR first, and the
    // Vec's heap buffer does not move when the Vec is moved.
    let mr = unsafe { side.pd.reg_mr(backing.as_mut_ptr().add(start), len, access) }.unwrap();
    Target { backing, start, mr }
}

impl Target {
    /// Deregisters the MR and hands back the memory, with the MR's offset in it.
    fn release(self) -> (Vec<u8>, usize) {
        drop(self.mr);
        (self.backing, self.start)
    }
}

/// A WRITE of `len` bytes to `bad(mr)` (an MR of `mr_len` bytes with `access`) that the
/// responder's card must refuse: everything of `expect_retry_exceeded`, and the card dropped
/// `dropped` packets per try. Returns the responder's memory, the MR's offset in it and
/// the source bytes.
fn refused_write(
    (mr_len, access): (usize, AccessFlags),
    len: usize,
    bad: fn(&Mr) -> (u64, MrKey),
    dropped: u64,
    what: &str,
) -> (Vec<u8>, usize, Vec<u8>) {
    let (a, b) = two_devices();
    let (sa, sb) = connect_pair(&a, &b, (100, 500), TIMEOUT, RETRIES);
    let mut src = sa.pd.alloc_mr(len, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), 9, 0);
    let dst = target(&sb, mr_len, access);
    let bad_wr = raw_wr(1, SendOp::Write, (src.addr(), src.key()), len, bad(&dst.mr));
    // A valid WRITE elsewhere: the card takes it, but the responder cannot acknowledge it
    // past the missing PSN before it.
    let elsewhere = sb.pd.alloc_mr(64, ALL).unwrap();
    let good = wr(2, SendOp::Write, &src, 0, 8, &elsewhere, 0);
    expect_retry_exceeded(&a, &sa, bad_wr, good, what);
    // Every try (the first and each retransmission) carried the bad packets.
    let want = (1 + a.stats().retransmits) * dropped;
    assert_eq!(
        settle(want, || card_counter(&b, "rx_check_failed")),
        want,
        "{what}: the responder's card dropped every try: {}",
        b.card_stats()
    );
    let (backing, start) = dst.release();
    (backing, start, src.bytes().unwrap().to_vec())
}

#[test]
fn write_with_a_bad_rkey_is_dropped_by_the_card() {
    let (mem, _, _) = refused_write(
        (4096, ALL),
        4096,
        |mr| (mr.addr(), MrKey::from_raw(mr.key().get() ^ 0x01)),
        1,
        "rkey violation",
    );
    assert_untouched("rkey violation", &mem);
}

#[test]
fn write_one_byte_past_the_mr_is_dropped_by_the_card() {
    // One packet: 100 bytes from MR start + 1, the last byte one past the end.
    let (mem, _, _) = refused_write(
        (100, ALL),
        100,
        |mr| (mr.addr() + 1, mr.key()),
        1,
        "bounds violation",
    );
    assert_untouched("bounds violation", &mem);
}

/// The card checks each packet on its own (hardware-contract.md 12): of a multi-packet
/// WRITE whose last packet crosses the end, the packets inside the MR land, the last is
/// dropped, and the requester still gets RETRY_EXC_ERR. Nothing outside the MR is written.
#[test]
fn multi_packet_write_past_the_mr_writes_nothing_outside_it() {
    let (mem, start, src) = refused_write(
        (8192, ALL),
        8192,
        |mr| (mr.addr() + 1, mr.key()),
        1,
        "multi-packet bounds violation",
    );
    assert_untouched("before the MR", &mem[..start]);
    assert_untouched("after the MR", &mem[start + 8192..]);
    assert_bytes_eq(
        "the packets inside the MR",
        &mem[start + 1..start + 8192],
        &src[..8191],
    );
}

#[test]
fn write_into_an_mr_without_remote_write_is_dropped_by_the_card() {
    let (mem, _, _) = refused_write(
        (4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
        4096,
        |mr| (mr.addr(), mr.key()),
        1,
        "access violation",
    );
    assert_untouched("access violation", &mem);
}

/// A READ the responder's driver must refuse: it counts every try in `read_refused`,
/// answers none (no READ response leaves), and the requester's sink stays untouched.
fn refused_read(source_access: AccessFlags, bad: fn(&Mr) -> (u64, MrKey), what: &str) {
    let (a, b) = two_devices();
    let (sa, sb) = connect_pair(&a, &b, (100, 500), TIMEOUT, RETRIES);
    let sink = sa.pd.alloc_mr(4096, ALL).unwrap();
    let mut source = sb.pd.alloc_mr(4096, source_access).unwrap();
    fill_pattern(source.bytes_mut().unwrap(), 4, 0);
    let bad_wr = raw_wr(
        1,
        SendOp::Read,
        (sink.addr(), sink.key()),
        4096,
        bad(&source),
    );
    let elsewhere = sb.pd.alloc_mr(64, ALL).unwrap();
    let good = wr(2, SendOp::Write, &sink, 0, 8, &elsewhere, 0);
    expect_retry_exceeded(&a, &sa, bad_wr, good, what);
    let tries = 1 + a.stats().retransmits;
    let refused = settle(tries, || b.stats().read_refused);
    assert_eq!(
        (refused, b.stats().chunks),
        (tries, 0),
        "{what}: the responder's driver refused every try and sent no data: {:?}",
        b.stats()
    );
    assert_untouched(what, sink.bytes().unwrap());
}

#[test]
fn read_with_a_bad_rkey_is_refused_by_the_responders_driver() {
    refused_read(
        ALL,
        |mr| (mr.addr(), MrKey::from_raw(mr.key().get() ^ 0x80)),
        "READ rkey violation",
    );
}

#[test]
fn read_past_the_mr_is_refused_by_the_responders_driver() {
    refused_read(ALL, |mr| (mr.addr() + 1, mr.key()), "READ bounds violation");
}

#[test]
fn read_from_an_mr_without_remote_read_is_refused_by_the_responders_driver() {
    refused_read(
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        |mr| (mr.addr(), mr.key()),
        "READ access violation",
    );
}

/// The RTR attributes `Qp::connect` uses, with `mask` to choose which are passed.
fn rtr(peer: &Qp) -> RawQpAttr {
    RawQpAttr {
        qp_state: QpState::Rtr.to_ibv(),
        path_mtu: 5,
        dest_qp_num: peer.qpn().get(),
        rq_psn: 500,
        dgid: Gid::from_ipv4(IP1),
        min_rnr_timer: 12,
        ..RawQpAttr::default()
    }
}

const RTR_MASK: QpAttrMask = QpAttrMask::STATE
    .union(QpAttrMask::AV)
    .union(QpAttrMask::PATH_MTU)
    .union(QpAttrMask::DEST_QPN)
    .union(QpAttrMask::RQ_PSN)
    .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
    .union(QpAttrMask::MIN_RNR_TIMER);

fn to_init(qp: &Qp) {
    qp.modify(
        &RawQpAttr {
            qp_state: QpState::Init.to_ibv(),
            qp_access_flags: 7,
            ..RawQpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
}

#[test]
fn qp_transition_errors_name_the_states_and_the_attributes() {
    let (a, b) = two_devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();

    let err = qa.modify(&rtr(&qb), RTR_MASK).unwrap_err();
    assert_eq!(
        err.to_string(),
        "modify_qp: RESET -> RTR on RC: not a valid transition"
    );
    assert_eq!(qa.query().unwrap().state, QpState::Reset, "still in RESET");

    to_init(&qa);
    let err = qa
        .modify(&rtr(&qb), RTR_MASK.difference(QpAttrMask::DEST_QPN))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "modify_qp: INIT -> RTR on RC: missing DEST_QPN"
    );
    let err = qa
        .modify(
            &rtr(&qb),
            RTR_MASK
                .difference(QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN)
                .union(QpAttrMask::SQ_PSN),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "modify_qp: INIT -> RTR on RC: missing RQ_PSN|DEST_QPN; forbidden SQ_PSN"
    );
    let err = qa
        .modify(
            &RawQpAttr {
                qp_state: QpState::Rts.to_ibv(),
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "modify_qp: INIT -> RTS on RC: not a valid transition"
    );
    assert_eq!(qa.query().unwrap().state, QpState::Init, "still in INIT");

    // Posting needs RTS.
    let mr = pa.alloc_mr(64, ALL).unwrap();
    let w = wr(1, SendOp::Write, &mr, 0, 8, &mr, 8);
    // SAFETY: refused before anything is posted.
    let err = unsafe { qa.post_send(&[w]) }.unwrap_err();
    assert_eq!(
        (err.0, err.1.to_string()),
        (
            0,
            "post_send: post_send is not allowed in QP state INIT".into()
        )
    );
    let mut none = [WorkCompletion::EMPTY; 2];
    assert_eq!(
        ca.poll(&mut none).unwrap(),
        0,
        "a refused WR completes nothing"
    );
}

#[test]
fn bad_wr_is_the_index_of_the_first_invalid_request() {
    let (a, b) = two_devices();
    let (sa, sb) = connect_pair(&a, &b, (100, 500), 14, 7);
    let mut src = sa.pd.alloc_mr(3 * 4096, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), 5, 0);
    let dst = sb.pd.alloc_mr(3 * 4096, ALL).unwrap();
    let bad_lkey = MrKey::from_raw(src.key().get() ^ 0x01);
    let wrs = [
        wr(10, SendOp::Write, &src, 0, 4096, &dst, 0),
        wr(11, SendOp::Write, &src, 4096, 4096, &dst, 4096),
        raw_wr(
            12,
            SendOp::Write,
            (src.addr() + 8192, bad_lkey),
            4096,
            (dst.addr() + 8192, dst.key()),
        ),
    ];
    // SAFETY: the MRs outlive the completions.
    let (index, err) = unsafe { sa.qp.post_send(&wrs) }.unwrap_err();
    assert_eq!(index, 2, "bad_wr names the third WR: {err}");
    assert_eq!(
        err.to_string(),
        format!(
            "post_send: local buffer is not inside the MR of lkey {:#x} with the needed access",
            bad_lkey.get()
        )
    );
    let wc = sa.cq.wait(2, WAIT).unwrap();
    let got: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [(10, WcStatus::Success), (11, WcStatus::Success)],
        "the two before it were posted and complete"
    );
    let mut none = [WorkCompletion::EMPTY; 2];
    assert_eq!(
        sa.cq.poll(&mut none).unwrap(),
        0,
        "the third was never posted"
    );
    let (s, d) = (src.bytes().unwrap(), dst.bytes().unwrap());
    assert_bytes_eq("the first two WRs", &d[..8192], &s[..8192]);
    assert_untouched("the third WR's target", &d[8192..]);
    assert_eq!(sa.qp.query().unwrap().state, QpState::Rts, "the QP is fine");
}
