//! Atomics on the two-card harness: fetch-and-add and compare-and-swap results in the sink
//! and in the responder's memory, their order with WRITEs both ways, the requester's
//! checks at post time, the responder's access errors, a lost request or reply (executed
//! once), a peer that takes no atomics and retries that run out.

mod common;

use bluerdma_sim::core::desc::AccessFlags;
use bluerdma_sim::core::engine::{SendOp, SendWr, VerbsError, WcOpcode, WcStatus};
use bluerdma_sim::core::keys::MrKey;
use bluerdma_sim::core::oob::AtomicOp;
use bluerdma_sim::core::qp::{QpAccessFlags, QpState};
use bluerdma_sim::pair::{Conn, Fault, Mr, Pair, QpOptions, Side};
use common::*;

/// QP access with REMOTE_ATOMIC (the default options leave it out).
fn atomic_qps() -> QpOptions {
    QpOptions {
        access: QpAccessFlags::LOCAL_WRITE
            | QpAccessFlags::REMOTE_WRITE
            | QpAccessFlags::REMOTE_READ
            | QpAccessFlags::REMOTE_ATOMIC,
        ..QpOptions::default()
    }
}

/// Every access right, REMOTE_ATOMIC included.
const ATOMIC_MR: AccessFlags = ALL.union(AccessFlags::REMOTE_ATOMIC);

fn mr(p: &mut Pair, c: &Conn, side: Side, len: usize, access: AccessFlags) -> Mr {
    p.reg_mr(side, c.pd[side.index()], len, access)
        .expect("reg_mr")
}

/// The u64 at `off` of `m`, as the CPU reads it.
fn value(p: &mut Pair, m: &Mr, off: usize) -> u64 {
    let b = &p.bytes(m)[off..off + 8];
    u64::from_ne_bytes(b.try_into().unwrap())
}

fn set(p: &mut Pair, m: &Mr, off: usize, v: u64) {
    p.bytes_mut(m)[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// A signaled atomic: the original value of `target + off` into `sink + soff`.
fn atomic(wr_id: u64, op: AtomicOp, sink: &Mr, soff: usize, target: &Mr, off: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Atomic(op),
        laddr: sink.at(soff),
        len: 8,
        lkey: sink.key,
        raddr: target.at(off),
        rkey: target.key,
        signaled: true,
        solicited: false,
    }
}

fn faa(add: u64) -> AtomicOp {
    AtomicOp::FetchAdd { add }
}

fn cas(compare: u64, swap: u64) -> AtomicOp {
    AtomicOp::CompareSwap { compare, swap }
}

/// A pair whose QPs take atomics, a target MR on B and a sink MR on A.
fn setup() -> (Pair, Conn, Mr, Mr) {
    setup_with(atomic_qps())
}

fn setup_with(o: QpOptions) -> (Pair, Conn, Mr, Mr) {
    let (mut p, c) = connected(&o);
    let target = mr(&mut p, &c, B, 64, ATOMIC_MR);
    let sink = mr(&mut p, &c, A, 64, ATOMIC_MR);
    (p, c, target, sink)
}

#[test]
fn fetch_and_add_returns_the_original_value_and_adds() {
    let (mut p, c, target, sink) = setup();
    set(&mut p, &target, 8, 0x0101_0101_0101_0101);
    post(
        &mut p,
        &c,
        A,
        &[atomic(7, faa(0x0202), &sink, 16, &target, 8)],
    );
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(value(&mut p, &sink, 16), 0x0101_0101_0101_0101);
    assert_eq!(value(&mut p, &target, 8), 0x0101_0101_0101_0303);
    // Nothing around the 8 bytes moved.
    assert!(p.bytes(&sink)[..16].iter().all(|&b| b == 0));
    assert!(p.bytes(&target)[16..].iter().all(|&b| b == 0));
    assert_eq!(
        (p.stats(A).atomics_sent, p.stats(B).atomics_executed),
        (1, 1)
    );
}

#[test]
fn compare_and_swap_swaps_only_when_the_value_matches() {
    let (mut p, c, target, sink) = setup();
    set(&mut p, &target, 0, 5);
    post(
        &mut p,
        &c,
        A,
        &[
            atomic(1, cas(5, 9), &sink, 0, &target, 0),
            atomic(2, cas(5, 11), &sink, 8, &target, 0),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::CompSwap),
            (2, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
    assert_eq!(value(&mut p, &sink, 0), 5, "the first matched");
    assert_eq!(
        value(&mut p, &sink, 8),
        9,
        "the second saw the swap and did not match"
    );
    assert_eq!(value(&mut p, &target, 0), 9);
}

#[test]
fn more_atomics_than_the_window_complete_in_order_each_seeing_the_one_before() {
    let (mut p, c, target, sink) = setup();
    let n = 40;
    let sink = {
        let _ = sink;
        mr(&mut p, &c, A, 8 * n, ATOMIC_MR)
    };
    let wrs: Vec<SendWr> = (0..n)
        .map(|k| atomic(k as u64, faa(1), &sink, 8 * k, &target, 0))
        .collect();
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, n, ms(500));
    assert!(wcs
        .iter()
        .enumerate()
        .all(|(k, w)| w.wr_id == k as u64 && w.status == WcStatus::Success));
    for k in 0..n {
        assert_eq!(value(&mut p, &sink, 8 * k), k as u64, "atomic {k}");
    }
    assert_eq!(value(&mut p, &target, 0), n as u64);
    assert_eq!(p.stats(B).atomics_executed, n as u64);
}

#[test]
fn an_atomic_after_a_write_sees_the_write_even_when_the_write_is_resent() {
    let o = QpOptions {
        timeout: 10,
        ..atomic_qps()
    };
    let (mut p, c, target, sink) = setup_with(o);
    let src = mr(&mut p, &c, A, 8, ATOMIC_MR);
    set(&mut p, &src, 0, 1000);
    // The WRITE's packet is lost once: the atomic, on the faster channel, must wait for
    // the retransmission to be placed.
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.is_data());
    post(
        &mut p,
        &c,
        A,
        &[
            write(1, &src, 0, &target, 0, 8),
            atomic(2, faa(1), &sink, 0, &target, 0),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(500));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(p.stats(A).retransmits > 0, "the WRITE was resent");
    assert_eq!(
        value(&mut p, &sink, 0),
        1000,
        "the atomic saw the WRITE's data"
    );
    assert_eq!(value(&mut p, &target, 0), 1001);
}

#[test]
fn a_write_after_an_atomic_does_not_overtake_it() {
    let (mut p, c, target, sink) = setup();
    let src = mr(&mut p, &c, A, 8, ATOMIC_MR);
    set(&mut p, &src, 0, 77);
    set(&mut p, &target, 0, 5);
    // The channel is slow: a WRITE sent at once would land before the atomic runs.
    p.set_oob_delay(B, ms(5));
    post(
        &mut p,
        &c,
        A,
        &[
            atomic(1, faa(1), &sink, 0, &target, 0),
            write(2, &src, 0, &target, 0, 8),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(500));
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(value(&mut p, &sink, 0), 5);
    assert_eq!(
        value(&mut p, &target, 0),
        77,
        "the WRITE came after the atomic"
    );
}

#[test]
fn the_requester_refuses_misaligned_addresses_wrong_lengths_and_sinks_it_may_not_write() {
    let (mut p, c, target, sink) = setup();
    let read_only = mr(&mut p, &c, A, 64, AccessFlags::REMOTE_READ);
    let misaligned = atomic(1, faa(1), &sink, 0, &target, 4);
    let short = SendWr {
        len: 4,
        ..atomic(2, faa(1), &sink, 0, &target, 0)
    };
    let unwritable = atomic(3, faa(1), &read_only, 0, &target, 0);
    let bad_lkey = SendWr {
        lkey: MrKey::from_raw(sink.key.get() ^ 0x100),
        ..atomic(4, faa(1), &sink, 0, &target, 0)
    };
    for (wr, why) in [
        (misaligned, "aligned"),
        (short, "exactly 8 bytes"),
        (unwritable, "lkey"),
        (bad_lkey, "lkey"),
    ] {
        match p.post_send(A, c.qp(A), &[wr]) {
            Err((0, VerbsError::InvalidArgument { what })) => assert!(what.contains(why)),
            Err((0, VerbsError::LocalProtection { .. })) => assert_eq!(why, "lkey"),
            other => panic!("WR {} posted: {other:?}", wr.wr_id),
        }
    }
    assert_eq!(p.stats(A).atomics_sent, 0);
    // The QP is fine: a good atomic still goes.
    post(&mut p, &c, A, &[atomic(5, faa(1), &sink, 0, &target, 0)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
}

/// Posts an atomic that B must refuse and a WRITE after it; returns A's completions.
fn refused(p: &mut Pair, c: &Conn, wr: SendWr, target: &Mr) -> Vec<(u64, WcStatus)> {
    let src = mr(p, c, A, 8, ATOMIC_MR);
    set(p, target, 0, 42);
    post(p, c, A, &[wr, write(9, &src, 0, target, 0, 8)]);
    let wcs = send_wcs(p, c, A, 2, ms(200));
    assert_eq!(value(p, target, 0), 42, "nothing written at the responder");
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(p.qp_state(B, c.qp(B)).unwrap(), QpState::Rts);
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

const REFUSED: [(u64, WcStatus); 2] = [(1, WcStatus::RemAccessErr), (9, WcStatus::WrFlushErr)];

#[test]
fn a_responder_qp_without_remote_atomic_refuses_with_rem_access_err() {
    let (mut p, c, target, sink) = setup_with(QpOptions::default());
    let wr = atomic(1, faa(1), &sink, 0, &target, 0);
    assert_eq!(refused(&mut p, &c, wr, &target), REFUSED);
    assert_eq!(value(&mut p, &sink, 0), 0, "no value for a refused atomic");
}

#[test]
fn an_mr_without_remote_atomic_refuses_with_rem_access_err() {
    let (mut p, c, _, sink) = setup();
    let target = mr(&mut p, &c, B, 64, ALL);
    let wr = atomic(1, faa(1), &sink, 0, &target, 0);
    assert_eq!(refused(&mut p, &c, wr, &target), REFUSED);
}

#[test]
fn a_bad_rkey_or_an_address_past_the_mr_refuses_with_rem_access_err() {
    let (mut p, c, target, sink) = setup();
    let wr = SendWr {
        rkey: MrKey::from_raw(target.key.get() ^ 0x5a),
        ..atomic(1, faa(1), &sink, 0, &target, 0)
    };
    assert_eq!(refused(&mut p, &c, wr, &target), REFUSED);
    let (mut p, c, target, sink) = setup();
    let past = atomic(1, faa(1), &sink, 0, &target, 64);
    assert_eq!(refused(&mut p, &c, past, &target), REFUSED);
}

#[test]
fn a_lost_reply_makes_a_resent_request_that_is_answered_without_executing_again() {
    let o = QpOptions {
        timeout: 10,
        ..atomic_qps()
    };
    let (mut p, c, target, sink) = setup_with(o);
    set(&mut p, &target, 0, 10);
    p.drop_oob_atomics(A, 1);
    post(&mut p, &c, A, &[atomic(1, faa(5), &sink, 0, &target, 0)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(500))[0];
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(value(&mut p, &sink, 0), 10);
    assert_eq!(value(&mut p, &target, 0), 15, "executed once");
    let (a, b) = (p.stats(A), p.stats(B));
    assert_eq!(
        (a.atomics_resent, b.atomics_executed, b.atomic_duplicates),
        (1, 1, 1)
    );
}

#[test]
fn a_lost_request_is_resent_and_executed_once_in_order() {
    let o = QpOptions {
        timeout: 10,
        ..atomic_qps()
    };
    let (mut p, c, target, sink) = setup_with(o);
    // The first of three is lost: the two behind it arrive early and wait their turn.
    p.drop_oob_atomics(B, 1);
    let wrs: Vec<SendWr> = (0..3)
        .map(|k| atomic(k, faa(1), &sink, 8 * k as usize, &target, 0))
        .collect();
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 3, ms(500));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let originals: Vec<u64> = (0..3).map(|k| value(&mut p, &sink, 8 * k)).collect();
    assert_eq!(originals, [0, 1, 2]);
    assert_eq!(value(&mut p, &target, 0), 3);
    assert_eq!(p.stats(B).atomics_executed, 3);
}

#[test]
fn a_peer_that_takes_no_atomics_fails_the_atomic_at_once_with_rem_inv_req_err() {
    let (mut p, c, target, sink) = setup();
    p.set_oob_atomics(B, false);
    post(&mut p, &c, A, &[atomic(1, cas(0, 1), &sink, 0, &target, 0)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(1))[0];
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::RemInvReqErr, WcOpcode::CompSwap)
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(value(&mut p, &target, 0), 0);
}

#[test]
fn an_atomic_that_is_never_answered_fails_with_retry_exc_err() {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..atomic_qps()
    };
    let (mut p, c, target, sink) = setup_with(o);
    p.drop_oob_atomics(B, 100);
    post(&mut p, &c, A, &[atomic(1, faa(1), &sink, 0, &target, 0)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert_eq!(p.stats(A).atomics_resent, 2);
    assert_eq!(value(&mut p, &target, 0), 0);
}
