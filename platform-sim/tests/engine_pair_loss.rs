//! Loss on the two-card harness: go-back-N from a NAK, recovery by timeout, retry
//! exhaustion at the virtual times of IB's timeout formula (4.096 us * 2^timeout).

mod common;

use std::time::Duration;

use bluerdma_sim::core::engine::{VerbsError, WcStatus};
use bluerdma_sim::core::qp::QpState;
use bluerdma_sim::pair::{Fault, FrameInfo, FrameKind, Pair, QpOptions, Side};
use common::*;

const PKT: usize = 4096;

/// The PSNs `side` retransmitted, in order.
fn retried(p: &Pair, side: Side) -> Vec<u32> {
    p.sent_by(side)
        .filter(|f| f.is_retry())
        .filter_map(FrameInfo::psn)
        .collect()
}

#[test]
fn a_lost_data_packet_is_resent_go_back_n_from_it_after_the_receivers_nak() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 16 * PKT, 1);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(5));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(500));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 1)[..]);
    assert_eq!(
        retried(&p, A),
        (5..16).collect::<Vec<u32>>(),
        "exactly PSN 5..15 again"
    );
    assert_eq!(p.stats(A).retransmits, 1);
    assert_eq!(
        p.stats(A).timeouts,
        0,
        "the NAK, not the timer, recovered it"
    );
    assert_eq!(p.stats(B).naks_sent, 1);
    assert!(
        p.now() < ib_timeout_ns(QpOptions::default().timeout),
        "recovered long before the 67 ms timeout: {} ns",
        p.now()
    );
}

#[test]
fn a_lost_first_packet_is_resent_from_the_start_of_the_message() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 8 * PKT, 2);
    let dst = buffer(&mut p, &c, B, 8 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(0));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 8 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(500));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(&dst) == &pattern(8 * PKT, 2)[..]);
    assert_eq!(retried(&p, A), (0..8).collect::<Vec<u32>>());
}

#[test]
fn a_lost_ack_costs_one_timeout_at_the_ib_timeout_then_succeeds() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let t = ib_timeout_ns(10);
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 100, 3);
    let dst = buffer(&mut p, &c, B, 100);
    p.inject(Fault::Drop, Some(1), |f| f.from == B && f.acks(0));
    let posted = p.now();
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 100)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(
        p.now() - posted,
        t,
        "completed at the first timeout (4.096 us * 2^10)"
    );
    assert_eq!(p.stats(A).timeouts, 1);
    assert_eq!(retried(&p, A), [0], "the WRITE went again once");
    assert!(p.bytes(&dst) == &pattern(100, 3)[..]);
    let acks = p.sent_by(B).filter(|f| f.acks(0)).count();
    assert_eq!(acks, 2, "the duplicate was acknowledged again");
}

#[test]
fn a_lost_last_packet_is_recovered_by_the_timer_and_only_it_is_resent() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 16 * PKT, 4);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(15));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 4)[..]);
    assert_eq!(
        p.stats(A).timeouts,
        1,
        "nothing after PSN 15 shows the receiver a hole"
    );
    assert_eq!(retried(&p, A), [15]);
}

#[test]
fn a_lost_retransmission_is_recovered_by_the_timer_one_timeout_after_it() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 16 * PKT, 5);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Drop, Some(2), |f| f.from == A && f.psn() == Some(5));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 5)[..]);
    let first_retry = p
        .sent_by(A)
        .find(|f| f.is_retry())
        .map(|f| f.sent_ns)
        .unwrap();
    assert_eq!(p.stats(B).naks_sent, 1, "one NAK per hole");
    assert_eq!((p.stats(A).retransmits, p.stats(A).timeouts), (2, 1));
    assert_eq!(
        p.now(),
        first_retry + ib_timeout_ns(10),
        "the timer runs from the NAK's resend"
    );
}

#[test]
fn a_loss_in_the_middle_of_a_chain_keeps_completions_in_posting_order() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 3 * 4 * PKT, 6);
    let dst = buffer(&mut p, &c, B, 3 * 4 * PKT);
    let wrs = writes(10, 3, &src, &dst, 4 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(5));
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 3, ms(500));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    assert!(p.bytes(&dst) == &pattern(3 * 4 * PKT, 6)[..]);
    assert_eq!(
        retried(&p, A),
        (5..12).collect::<Vec<u32>>(),
        "from the lost PSN to the end, no earlier"
    );
}

#[test]
fn retry_exhaustion_fails_the_head_at_retry_cnt_plus_one_timeouts_and_flushes_the_rest() {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 3,
        ..QpOptions::default()
    };
    let t = ib_timeout_ns(8);
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 3 * 1000, 7);
    let dst = buffer(&mut p, &c, B, 3 * 1000);
    p.inject(Fault::Drop, None, |f| f.from == A);
    let posted = p.now();
    let wrs = writes(20, 3, &src, &dst, 1000);
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 3, ms(100));
    assert_eq!(
        p.now() - posted,
        4 * t,
        "(retry_cnt + 1) timeouts of 4.096 us * 2^8"
    );
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (20, WcStatus::RetryExcErr),
            (21, WcStatus::WrFlushErr),
            (22, WcStatus::WrFlushErr)
        ]
    );
    assert!(wcs.iter().all(|w| w.byte_len == 0));
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!((p.stats(A).timeouts, p.stats(A).retransmits), (4, 3));
    let resend_times: Vec<u64> = p
        .sent_by(A)
        .filter(|f| f.is_retry() && f.psn() == Some(0))
        .map(|f| f.sent_ns - posted)
        .collect();
    assert_eq!(resend_times, [t, 2 * t, 3 * t], "one resend per timeout");
    assert!(p.bytes(&dst).iter().all(|&b| b == 0));
}

#[test]
fn retry_cnt_zero_fails_at_the_first_timeout() {
    let o = QpOptions {
        timeout: 12,
        retry_cnt: 0,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 64, 8);
    let dst = buffer(&mut p, &c, B, 64);
    p.inject(Fault::Drop, None, |f| f.from == A);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 64)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(p.now(), ib_timeout_ns(12));
    assert!(
        p.sent_by(A).all(|f| !f.is_retry()),
        "no retransmission allowed"
    );
}

#[test]
fn the_default_67_ms_timeout_fails_after_eight_timeouts_of_virtual_time() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 64, 9);
    let dst = buffer(&mut p, &c, B, 64);
    p.inject(Fault::Drop, None, |f| f.from == A);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 64)]);
    let wcs = send_wcs(&mut p, &c, A, 1, Duration::from_secs(2));
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(
        p.now(),
        8 * ib_timeout_ns(14),
        "retry_cnt 7: 8 x 67.1 ms of virtual time"
    );
}

#[test]
fn timeout_zero_waits_forever() {
    let o = QpOptions {
        timeout: 0,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 64, 10);
    let dst = buffer(&mut p, &c, B, 64);
    p.inject(Fault::Drop, None, |f| f.from == A);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 64)]);
    p.run_for(Duration::from_secs(10)).unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "no completion without a timer"
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Rts);
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn after_retry_exhaustion_new_posts_are_refused_naming_the_error_state() {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 1,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 64, 11);
    let dst = buffer(&mut p, &c, B, 64);
    p.inject(Fault::Drop, None, |f| f.from == A);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 64)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    let refused = p.post_send(A, c.qp(A), &[write(2, &src, 0, &dst, 0, 64)]);
    assert!(
        matches!(
            refused,
            Err((
                0,
                VerbsError::WrongQpState {
                    state: QpState::Err,
                    op: "post_send"
                }
            ))
        ),
        "{refused:?}"
    );
}

#[test]
fn a_timer_that_fires_while_the_card_has_not_fetched_the_descriptors_uses_no_retry() {
    // A busy card (or a loaded host) leaves the QP's descriptors in the send ring for
    // longer than the ACK timeout: nothing is lost, so nothing is resent and no retry
    // is used; once the card fetches them the WRITE completes.
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 3,
        ..QpOptions::default()
    };
    let t = ib_timeout_ns(8);
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 3000, 9);
    let dst = buffer(&mut p, &c, B, 3000);
    p.hold_card_tx(A, true);
    post(&mut p, &c, A, &writes(1, 1, &src, &dst, 3000));
    p.run_for(Duration::from_nanos(10 * t)).unwrap();
    assert_eq!(p.stats(A).timeouts, 0, "no timeout counted");
    assert!(p.stats(A).timeouts_queued >= 9, "{:?}", p.stats(A));
    assert_eq!(p.stats(A).retransmits, 0);
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Rts);
    p.hold_card_tx(A, false);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    let want = p.bytes(&src).to_vec();
    assert_eq!(p.bytes(&dst), &want[..], "the WRITE landed intact");
    assert_eq!(p.stats(A).timeouts, 0, "sent once, acked at once");
}

#[test]
fn a_card_that_never_fetches_fails_the_qp_after_the_queued_waits_and_the_retries() {
    // The card stopped: waiting for it must end, in RETRY_EXC_ERR, not hang the QP.
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..QpOptions::default()
    };
    let t = ib_timeout_ns(8);
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 100, 3);
    let dst = buffer(&mut p, &c, B, 100);
    p.hold_card_tx(A, true);
    let posted = p.now();
    post(&mut p, &c, A, &writes(7, 1, &src, &dst, 100));
    let wcs = send_wcs(&mut p, &c, A, 1, ms(1000));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::RetryExcErr));
    let s = p.stats(A);
    assert_eq!(s.timeouts, 3, "retry_cnt + 1 timeouts counted: {s:?}");
    assert!(s.timeouts_queued >= 32, "{s:?}");
    assert!(p.now() - posted >= 35 * t, "32 queued waits and 3 timeouts");
    assert!(p.bytes(&dst).iter().all(|&b| b == 0));
}

#[test]
fn a_nak_that_arrives_after_everything_was_acknowledged_leaves_the_idle_qp_alone() {
    // The receiver's NAK for a lost packet is delayed (held) until the timer's resend has
    // repaired the loss and the WRITE has completed. The late NAK must not arm a timer on
    // the idle QP: one that did fired retry_cnt + 1 times over nothing and failed the QP
    // with RETRY_EXC_ERR between two WRITEs (verbs_loss_integrity under load).
    let o = QpOptions {
        timeout: 8,
        ..QpOptions::default()
    };
    let t = ib_timeout_ns(8);
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 16 * PKT, 4);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(5));
    p.inject(Fault::Hold, None, |f| {
        f.from == B && matches!(f.kind, FrameKind::DriverNak { .. })
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert!(!p.held().is_empty(), "the NAK was held");
    p.clear_faults();
    let timeouts = p.stats(A).timeouts;
    p.release_held();
    p.run_for(Duration::from_nanos(12 * t)).unwrap();
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Rts);
    assert_eq!(p.stats(A).timeouts, timeouts, "no timer on the idle QP");
    // And the QP still works.
    post(&mut p, &c, A, &[write(2, &src, 0, &dst, 0, 4 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::Success));
}
