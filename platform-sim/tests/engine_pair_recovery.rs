//! Recovery where a resend could do harm, on the two-card harness: a resent SEND or
//! WRITE_WITH_IMM must not consume a second receive WR, a duplicated READ request must not
//! be answered into the next READ, and loss on one QP or one direction leaves the other
//! alone.

mod common;

use std::time::Duration;

use bluerdma_sim::core::engine::{VerbsError, WcOpcode, WcStatus};
use bluerdma_sim::core::wire::RdmaOpcode;
use bluerdma_sim::pair::{Fault, PairConfig, QpOptions, Side};
use common::*;

const PKT: usize = 4096;

fn fast() -> QpOptions {
    QpOptions {
        timeout: 10,
        ..QpOptions::default()
    }
}

#[test]
fn a_send_resent_after_a_lost_ack_consumes_one_receive() {
    let (mut p, c) = connected(&fast());
    let rbuf = buffer(&mut p, &c, B, 2 * 100);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 100), recv(2, &rbuf, 100, 100)],
    );
    let src = filled(&mut p, &c, A, 100, 1);
    p.inject(Fault::Drop, Some(1), |f| f.from == Side::B && f.is_ack());
    post(&mut p, &c, A, &[send(1, &src, 0, 100, Some(5))]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert_eq!(p.stats(A).timeouts, 1, "the SEND went twice");
    let got = recv_wcs(&mut p, &c, B, 1, ms(10));
    assert_eq!((got[0].wr_id, got[0].imm_data), (1, 5));
    p.run_for(ms(50)).unwrap();
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "receive WR 2 untouched by the duplicate"
    );
    assert!(p.bytes(&rbuf)[100..].iter().all(|&b| b == 0));
}

#[test]
fn a_write_with_imm_resent_after_a_lost_ack_completes_once_at_the_target() {
    let (mut p, c) = connected(&fast());
    let rbuf = buffer(&mut p, &c, B, 16);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 16), recv(2, &rbuf, 0, 16)],
    );
    let src = filled(&mut p, &c, A, 3 * PKT, 2);
    let dst = buffer(&mut p, &c, B, 3 * PKT);
    p.inject(Fault::Drop, None, |f| f.from == Side::B && f.acks(2));
    post(
        &mut p,
        &c,
        A,
        &[write_imm(1, &src, 0, &dst, 0, 3 * PKT, 77)],
    );
    p.run_for(ms(2 * 4 + 1)).unwrap();
    p.clear_faults();
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.stats(A).timeouts >= 2, "resent at least twice");
    let got = recv_wcs(&mut p, &c, B, 1, ms(10));
    assert_eq!(
        (got[0].wr_id, got[0].opcode, got[0].imm_data),
        (1, WcOpcode::RecvRdmaWithImm, 77)
    );
    p.run_for(ms(50)).unwrap();
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "one message, one receive completion"
    );
    assert!(p.bytes(&dst) == &pattern(3 * PKT, 2)[..]);
}

#[test]
fn a_lost_packet_of_a_send_is_resent_and_the_receive_completes_once_whole() {
    let (mut p, c) = connected(&fast());
    let rbuf = buffer(&mut p, &c, B, 8 * PKT);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 8 * PKT), recv(2, &rbuf, 0, 8 * PKT)],
    );
    let src = filled(&mut p, &c, A, 6 * PKT, 3);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(2)
    });
    post(&mut p, &c, A, &[send(1, &src, 0, 6 * PKT, None)]);
    let got = recv_wcs(&mut p, &c, B, 1, ms(100));
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].byte_len),
        (1, WcStatus::Success, 6 * PKT as u32)
    );
    assert!(p.bytes(&rbuf)[..6 * PKT] == pattern(6 * PKT, 3)[..]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(10))[0].status,
        WcStatus::Success
    );
    p.run_for(ms(50)).unwrap();
    assert!(p.poll_cq(B, c.recv_cq[1]).is_empty());
}

#[test]
fn a_duplicated_read_request_is_answered_once_and_the_next_read_gets_its_own_bytes() {
    let (mut p, c) = default_pair();
    let source = filled(&mut p, &c, B, 2 * 5000, 4);
    let sink = buffer(&mut p, &c, A, 2 * 5000);
    p.inject(Fault::Duplicate, Some(1), |f| {
        f.opcode() == Some(RdmaOpcode::ReadRequest)
    });
    post(
        &mut p,
        &c,
        A,
        &[
            read(1, &sink, 0, &source, 0, 5000),
            read(2, &sink, 5000, &source, 5000, 5000),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(p.bytes(&sink) == &pattern(10_000, 4)[..]);
    let first_responses = p
        .sent_by(Side::B)
        .filter(|f| f.is_data() && !f.is_retry())
        .count();
    assert_eq!(
        first_responses, 4,
        "two packets per READ, the duplicate not answered"
    );
}

#[test]
fn loss_on_one_qp_leaves_another_qp_of_the_same_cards_untouched() {
    let mut p = bluerdma_sim::pair::Pair::new().unwrap();
    let c1 = p.connect(&fast()).unwrap();
    let c2 = p.connect(&fast()).unwrap();
    let lossy = c1.qp(B);
    p.inject(Fault::Drop, None, move |f| {
        f.from == Side::A
            && matches!(f.kind, bluerdma_sim::pair::FrameKind::Packet { dqpn, .. } if dqpn == lossy)
    });
    let s1 = filled(&mut p, &c1, A, 1000, 5);
    let d1 = buffer(&mut p, &c1, B, 1000);
    let s2 = filled(&mut p, &c2, A, 8 * PKT, 6);
    let d2 = buffer(&mut p, &c2, B, 8 * PKT);
    post(&mut p, &c1, A, &[write(1, &s1, 0, &d1, 0, 1000)]);
    post(&mut p, &c2, A, &[write(2, &s2, 0, &d2, 0, 8 * PKT)]);
    let ok = send_wcs(&mut p, &c2, A, 1, ms(1));
    assert_eq!((ok[0].wr_id, ok[0].status), (2, WcStatus::Success));
    assert!(p.bytes(&d2) == &pattern(8 * PKT, 6)[..]);
    let failed = send_wcs(&mut p, &c1, A, 1, Duration::from_secs(1));
    assert_eq!(
        (failed[0].wr_id, failed[0].status),
        (1, WcStatus::RetryExcErr)
    );
    assert_eq!(
        p.qp_state(A, c2.qp(A)).unwrap(),
        bluerdma_sim::core::qp::QpState::Rts
    );
}

#[test]
fn writes_both_ways_at_once_with_loss_both_ways_arrive_intact() {
    let (mut p, c) = connected(&fast());
    let a_src = filled(&mut p, &c, A, 20 * PKT, 7);
    let b_dst = buffer(&mut p, &c, B, 20 * PKT);
    let b_src = filled(&mut p, &c, B, 20 * PKT, 8);
    let a_dst = buffer(&mut p, &c, A, 20 * PKT);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(7)
    });
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::B && f.psn() == Some(13)
    });
    p.inject(Fault::Drop, Some(1), |f| f.from == Side::A && f.is_ack());
    post(&mut p, &c, A, &[write(1, &a_src, 0, &b_dst, 0, 20 * PKT)]);
    post(&mut p, &c, B, &[write(2, &b_src, 0, &a_dst, 0, 20 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert_eq!(
        send_wcs(&mut p, &c, B, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&b_dst) == &pattern(20 * PKT, 7)[..]);
    assert!(p.bytes(&a_dst) == &pattern(20 * PKT, 8)[..]);
}

#[test]
fn a_full_send_queue_refuses_the_next_wr_naming_it() {
    let cfg = PairConfig {
        sq_depth: 4,
        ..PairConfig::default()
    };
    let (mut p, c) = connected_with(cfg, &QpOptions::default());
    let src = filled(&mut p, &c, A, 600, 9);
    let dst = buffer(&mut p, &c, B, 600);
    let wrs = writes(0, 6, &src, &dst, 100);
    let r = p.post_send(A, c.qp(A), &wrs);
    assert_eq!(r, Err((4, VerbsError::SendQueueFull)));
    let wcs = send_wcs(&mut p, &c, A, 4, ms(100));
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    post(&mut p, &c, A, &wrs[4..]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 2, ms(100))
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        [4, 5]
    );
    assert!(p.bytes(&dst) == &pattern(600, 9)[..]);
}

#[test]
fn a_receive_cq_overrun_is_counted_and_the_kept_completions_are_the_oldest() {
    let cfg = PairConfig {
        cq_depth: 2,
        ..PairConfig::default()
    };
    let (mut p, c) = connected_with(cfg, &QpOptions::default());
    let rbuf = buffer(&mut p, &c, B, 4 * 10);
    post_recvs(&mut p, &c, B, &recvs(4, &rbuf, 10, 10));
    let src = filled(&mut p, &c, A, 40, 10);
    let sends: Vec<_> = (0..4)
        .map(|k| send(k, &src, k as usize * 10, 10, Some(k as u32)))
        .collect();
    post(&mut p, &c, A, &sends);
    let qp = c.qp(A);
    p.run_until(|p| p.engine(A).sq_retired(qp).unwrap() == 4, ms(100))
        .unwrap();
    p.run_for(ms(1)).unwrap();
    let got = p.poll_cq(B, c.recv_cq[1]);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(p.stats(B).cq_overruns, 2);
    assert!(
        p.bytes(&rbuf) == &pattern(40, 10)[..],
        "the data of all four arrived"
    );
}

#[test]
fn a_write_with_imm_without_a_receive_waits_and_writes_nothing_until_one_is_posted() {
    let o = QpOptions {
        min_rnr_timer: 12,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 1000, 11);
    let dst = buffer(&mut p, &c, B, 1000);
    post(&mut p, &c, A, &[write_imm(1, &src, 0, &dst, 0, 1000, 3)]);
    p.run_for(ms(5)).unwrap();
    assert!(
        p.bytes(&dst).iter().all(|&b| b == 0),
        "nothing written before a receive WR"
    );
    assert!(p.stats(A).rnr_waits >= 1);
    let rbuf = buffer(&mut p, &c, B, 8);
    post_recvs(&mut p, &c, B, &[recv(9, &rbuf, 0, 8)]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!((wc.wr_id, wc.imm_data, wc.byte_len), (9, 3, 1000));
    assert!(p.bytes(&dst) == &pattern(1000, 11)[..]);
}

#[test]
fn a_lost_nak_is_covered_by_the_timer() {
    let (mut p, c) = connected(&fast());
    let src = filled(&mut p, &c, A, 16 * PKT, 12);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(4)
    });
    p.inject(Fault::Drop, Some(1), |f| {
        matches!(f.kind, bluerdma_sim::pair::FrameKind::DriverNak { .. })
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 12)[..]);
    assert_eq!((p.stats(B).naks_sent, p.stats(A).timeouts), (1, 1));
}

#[test]
fn a_packet_lost_every_time_fails_retry_exceeded_with_the_bytes_before_it_placed() {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 8 * PKT, 13);
    let dst = buffer(&mut p, &c, B, 8 * PKT);
    p.inject(Fault::Drop, None, |f| {
        f.from == Side::A && f.psn() == Some(5)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 8 * PKT)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert_eq!(p.stats(A).timeouts, 3, "retry_cnt + 1 expiries");
    let first_resend = p.sent_by(Side::A).find(|f| f.is_retry()).unwrap().sent_ns;
    assert_eq!(
        p.now(),
        first_resend + 3 * ib_timeout_ns(8),
        "the NAK's resend starts the count"
    );
    assert!(p.bytes(&dst)[..5 * PKT] == pattern(8 * PKT, 13)[..5 * PKT]);
    assert!(
        p.bytes(&dst)[5 * PKT..6 * PKT].iter().all(|&b| b == 0),
        "PSN 5 never landed"
    );
}

#[test]
fn a_zero_length_send_completes_a_receive_with_byte_len_0() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 16);
    post_recvs(&mut p, &c, B, &[recv(1, &rbuf, 0, 16)]);
    let src = filled(&mut p, &c, A, 16, 14);
    post(&mut p, &c, A, &[send(1, &src, 0, 0, Some(8))]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data),
        (1, WcStatus::Success, 0, 8)
    );
    assert!(p.bytes(&rbuf).iter().all(|&b| b == 0));
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(10))[0].status,
        WcStatus::Success
    );
}

#[test]
fn go_back_n_from_a_psn_the_window_held_back_resends_only_from_there() {
    let o = QpOptions {
        pmtu: bluerdma_sim::core::mtu::Pmtu::Mtu256,
        ..fast()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 300 * 256, 15);
    let dst = buffer(&mut p, &c, B, 300 * 256);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(150)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 300 * 256)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(300 * 256, 15)[..]);
    let resent: Vec<u32> = p
        .sent_by(Side::A)
        .filter(|f| f.is_retry())
        .filter_map(|f| f.psn())
        .collect();
    assert_eq!(resent.first(), Some(&150), "from the lost PSN: {resent:?}");
    assert!(resent.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn a_lost_first_packet_of_a_send_still_gives_the_whole_message_and_its_length() {
    let (mut p, c) = connected(&fast());
    let rbuf = buffer(&mut p, &c, B, 8 * PKT);
    post_recvs(&mut p, &c, B, &[recv(1, &rbuf, 0, 8 * PKT)]);
    let src = filled(&mut p, &c, A, 5 * PKT + 7, 16);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(0)
    });
    post(&mut p, &c, A, &[send(1, &src, 0, 5 * PKT + 7, Some(2))]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.status, wc.byte_len, wc.imm_data),
        (WcStatus::Success, 5 * PKT as u32 + 7, 2)
    );
    assert!(p.bytes(&rbuf)[..5 * PKT + 7] == pattern(5 * PKT + 7, 16)[..]);
}
