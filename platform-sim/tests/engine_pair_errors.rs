//! Errors on the two-card harness: flushes when a QP goes to ERR or is destroyed, remote
//! access violations (nothing written, the failure the requester sees), local protection
//! errors at post time, CQ overruns, and a QP brought up again after RESET.

mod common;

use std::time::Duration;

use bluerdma_sim::core::desc::AccessFlags;
use bluerdma_sim::core::engine::{AsyncEvent, SendWr, VerbsError, WcOpcode, WcStatus};
use bluerdma_sim::core::keys::MrKey;
use bluerdma_sim::core::qp::QpState;
use bluerdma_sim::core::regs::Counter;
use bluerdma_sim::pair::{Fault, Mr, Pair, PairConfig, QpOptions, Side};
use common::*;

const PKT: usize = 4096;

fn quick_failure() -> QpOptions {
    QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..QpOptions::default()
    }
}

#[test]
fn moving_a_qp_to_err_flushes_its_send_and_receive_wrs_in_posting_order() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 3000, 1);
    let dst = buffer(&mut p, &c, B, 3000);
    let rbuf = buffer(&mut p, &c, A, 200);
    p.inject(Fault::Drop, None, |f| f.from == Side::A);
    let wrs = writes(1, 3, &src, &dst, 1000);
    post(&mut p, &c, A, &wrs);
    post_recvs(
        &mut p,
        &c,
        A,
        &[recv(10, &rbuf, 0, 100), recv(11, &rbuf, 100, 100)],
    );
    p.run_for(ms(1)).unwrap();
    p.set_state(A, c.qp(A), QpState::Err).unwrap();
    let sent = send_wcs(&mut p, &c, A, 3, ms(1));
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let recvd = recv_wcs(&mut p, &c, A, 2, ms(1));
    assert_eq!(
        recvd
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (10, WcStatus::WrFlushErr, WcOpcode::Recv),
            (11, WcStatus::WrFlushErr, WcOpcode::Recv)
        ]
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    p.run_for(ms(500)).unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "no timer left running on a flushed QP"
    );
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn a_receive_posted_to_a_qp_in_err_is_flushed_at_once() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 100);
    p.set_state(B, c.qp(B), QpState::Err).unwrap();
    post_recvs(&mut p, &c, B, &[recv(4, &rbuf, 0, 100)]);
    let wc = p.poll_cq(B, c.recv_cq[1]);
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(4, WcStatus::WrFlushErr)]
    );
}

/// A WRITE that B's card refuses: nothing lands anywhere in `target`, B's card counts
/// `counter`, and A fails RETRY_EXC_ERR after retry_cnt + 1 timeouts (the card sends no
/// NAK for a refused packet).
fn refused_write(
    p: &mut Pair,
    c: &bluerdma_sim::pair::Conn,
    target: &Mr,
    wr: SendWr,
    counter: Counter,
) {
    let posted = p.now();
    // A second WR refused the same way: flushed behind the first.
    let behind = SendWr { wr_id: 2, ..wr };
    post(p, c, A, &[wr, behind]);
    let wcs = send_wcs(p, c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.now() - posted, 3 * ib_timeout_ns(8));
    assert!(
        p.bytes(target).iter().all(|&b| b == 0),
        "not one byte written"
    );
    assert_eq!(
        p.counter(B, counter),
        6,
        "both packets, sent three times, refused"
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(
        p.qp_state(B, c.qp(B)).unwrap(),
        QpState::Rts,
        "the responder is not harmed"
    );
}

#[test]
fn a_write_with_a_bad_rkey_writes_nothing_and_fails_retry_exceeded() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 2);
    let dst = buffer(&mut p, &c, B, 4096);
    let mut wr = write(1, &src, 0, &dst, 0, 4096);
    wr.rkey = MrKey::from_raw(dst.key.get() ^ 0x01);
    refused_write(&mut p, &c, &dst, wr, Counter::InvalidMrKey);
}

#[test]
fn a_write_past_the_end_of_the_mr_writes_nothing() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 3);
    // 3900..4050 of an MR of 4000 bytes: one packet (the card checks each packet's own
    // range, so a longer WRITE would see its in-bounds first packet written).
    let dst = buffer(&mut p, &c, B, 4000);
    refused_write(
        &mut p,
        &c,
        &dst,
        write(1, &src, 0, &dst, 3900, 150),
        Counter::MemOutOfBounds,
    );
}

#[test]
fn a_write_into_an_mr_without_remote_write_writes_nothing() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 4);
    let dst = p
        .reg_mr(
            B,
            c.pd[1],
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    refused_write(
        &mut p,
        &c,
        &dst,
        write(1, &src, 0, &dst, 0, 100),
        Counter::InvalidMrAccess,
    );
}

#[test]
fn a_write_into_a_deregistered_mr_writes_nothing() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 5);
    let dst = buffer(&mut p, &c, B, 4096);
    p.dereg_mr(&dst).unwrap();
    refused_write(
        &mut p,
        &c,
        &dst,
        write(1, &src, 0, &dst, 0, 100),
        Counter::InvalidMrKey,
    );
}

#[test]
fn a_local_buffer_outside_its_mr_is_refused_at_post_naming_the_wr_and_key() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 4096, 6);
    let dst = buffer(&mut p, &c, B, 8192);
    let good = write(1, &src, 0, &dst, 0, 100);
    let bad = write(2, &src, 4000, &dst, 0, 200);
    let r = p.post_send(A, c.qp(A), &[good, bad]);
    assert_eq!(
        r,
        Err((
            1,
            VerbsError::LocalProtection {
                lkey: src.key.get()
            }
        ))
    );
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::Success),
        "the WR before it was posted"
    );
    assert_eq!(p.engine(A).sq_retired(c.qp(A)).unwrap(), 1);
}

#[test]
fn completions_beyond_the_cq_depth_fail_the_cq_and_its_qp() {
    // Issue J1: a full CQ is never silent. The completions that fit stay, the CQ raises
    // CQ_ERR and the QP that completes into it goes to ERR (QP_FATAL); nothing more is
    // posted on it.
    let cfg = PairConfig {
        cq_depth: 4,
        ..PairConfig::default()
    };
    let (mut p, c) = connected_with(cfg, &QpOptions::default());
    let src = filled(&mut p, &c, A, 7 * 100, 7);
    let dst = buffer(&mut p, &c, B, 7 * 100);
    let wrs = writes(0, 6, &src, &dst, 100);
    post(&mut p, &c, A, &wrs);
    let qp = c.qp(A);
    p.run_until(|p| p.engine(A).sq_retired(qp).unwrap() == 6, ms(100))
        .unwrap();
    p.run_until(
        |p| p.engine(A).query_qp(qp).unwrap().state == QpState::Err,
        ms(100),
    )
    .unwrap();
    let wcs = p.poll_cq(A, c.send_cq[0]);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [0, 1, 2, 3],
        "the oldest four kept"
    );
    assert_eq!(p.stats(A).cq_overruns, 2);
    assert_eq!(
        [p.engine(A).take_event(), p.engine(A).take_event()],
        [
            Some(AsyncEvent::CqError { cq: c.send_cq[0] }),
            Some(AsyncEvent::QpFatal { qpn: qp })
        ]
    );
    assert!(
        p.bytes(&dst)[..600] == pattern(700, 7)[..600],
        "the work itself was done"
    );
    assert!(
        p.post_send(A, qp, &[write(6, &src, 600, &dst, 600, 100)])
            .is_err(),
        "the QP is in ERR"
    );
}

#[test]
fn destroying_a_qp_with_work_outstanding_flushes_it_and_frees_its_cqs() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 2000, 8);
    let dst = buffer(&mut p, &c, B, 2000);
    let rbuf = buffer(&mut p, &c, A, 100);
    p.inject(Fault::Drop, None, |f| f.from == Side::A);
    post(
        &mut p,
        &c,
        A,
        &[
            write(1, &src, 0, &dst, 0, 1000),
            write(2, &src, 1000, &dst, 1000, 1000),
        ],
    );
    post_recvs(&mut p, &c, A, &[recv(3, &rbuf, 0, 100)]);
    p.run_for(ms(1)).unwrap();
    p.destroy_qp(A, c.qp(A)).unwrap();
    let sent = p.poll_cq(A, c.send_cq[0]);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    let recvd = p.poll_cq(A, c.recv_cq[0]);
    assert_eq!(
        recvd
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(3, WcStatus::WrFlushErr)]
    );
    assert!(p.engine(A).query_qp(c.qp(A)).is_err(), "the handle is gone");
    p.engine(A).destroy_cq(c.send_cq[0]).unwrap();
    p.engine(A).destroy_cq(c.recv_cq[0]).unwrap();
    p.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(p.stats(A).timeouts, 0, "no timer of the destroyed QP fires");
}

#[test]
fn a_write_to_a_destroyed_responder_qp_is_dropped_by_its_card() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 9);
    let dst = buffer(&mut p, &c, B, 4096);
    p.destroy_qp(B, c.qp(B)).unwrap();
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 4096)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert!(p.bytes(&dst).iter().all(|&b| b == 0));
    assert_eq!(p.counter(B, Counter::InvalidQpContext), 3);
}

#[test]
fn a_qp_pair_reset_and_brought_up_again_carries_data_from_psn_0() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 16 * PKT, 10);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 8 * PKT)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    for s in [A, B] {
        p.set_state(s, c.qp(s), QpState::Reset).unwrap();
    }
    let o = QpOptions::default();
    for s in [A, B] {
        p.bring_up(s, c.qp(s), c.qp(s.peer()), &o).unwrap();
    }
    post(
        &mut p,
        &c,
        A,
        &[write(2, &src, 8 * PKT, &dst, 8 * PKT, 8 * PKT)],
    );
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 10)[..]);
    let second: Vec<u32> = p.sent_by(A).skip(8).filter_map(|f| f.psn()).collect();
    assert_eq!(
        second,
        (0..8).collect::<Vec<u32>>(),
        "the new connection starts at PSN 0"
    );
    assert_eq!(
        p.stats(A).retransmits,
        0,
        "the card's window was reset with the QP"
    );
}

#[test]
fn a_responder_qp_in_err_takes_no_writes() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 4096, 11);
    let dst = buffer(&mut p, &c, B, 4096);
    p.set_state(B, c.qp(B), QpState::Err).unwrap();
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 4096)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert!(
        p.bytes(&dst).iter().all(|&b| b == 0),
        "written into a QP in ERR"
    );
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "a QP in ERR acknowledged a WRITE"
    );
}

#[test]
fn a_write_with_imm_to_a_qp_in_err_completes_no_phantom_receive() {
    let (mut p, c) = connected(&quick_failure());
    let src = filled(&mut p, &c, A, 64, 12);
    let dst = buffer(&mut p, &c, B, 64);
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(&mut p, &c, B, &[recv(1, &rbuf, 0, 64)]);
    p.set_state(B, c.qp(B), QpState::Err).unwrap();
    let flushed = p.poll_cq(B, c.recv_cq[1]);
    assert_eq!(
        flushed
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr)]
    );
    post(&mut p, &c, A, &[write_imm(2, &src, 0, &dst, 0, 10, 5)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    let after = p.poll_cq(B, c.recv_cq[1]);
    assert!(
        after.is_empty(),
        "a receive completion without a receive WR: {after:?}"
    );
}
