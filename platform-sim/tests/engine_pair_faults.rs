//! Duplicated and reordered frames on the two-card harness: every message is delivered
//! once, in PSN order, with its bytes; duplicated and reordered ACKs change nothing; and
//! the harness itself replays a faulty run frame for frame.

mod common;

use bluerdma_sim::core::engine::{WcOpcode, WcStatus};
use bluerdma_sim::pair::{Fault, LogEntry, Side};
use common::*;

const PKT: usize = 4096;

#[test]
fn duplicated_data_packets_deliver_a_write_with_imm_once() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 64), recv(2, &rbuf, 0, 64)],
    );
    let src = filled(&mut p, &c, A, 16 * PKT, 1);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    p.inject(Fault::Duplicate, None, |f| f.from == Side::A && f.is_data());
    post(
        &mut p,
        &c,
        A,
        &[write_imm(5, &src, 0, &dst, 0, 16 * PKT, 99)],
    );
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data),
        (1, WcOpcode::RecvRdmaWithImm, 16 * PKT as u32, 99)
    );
    p.run_for(ms(10)).unwrap();
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "delivered once: receive WR 2 still posted"
    );
    assert!(p.bytes(&dst) == &pattern(16 * PKT, 1)[..]);
    assert_eq!(
        p.nic_stats(B).rx_frames,
        32,
        "every data packet arrived twice"
    );
}

#[test]
fn duplicated_sends_consume_one_receive_each() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 4 * 100);
    post_recvs(&mut p, &c, B, &recvs(4, &rbuf, 100, 100));
    let src = filled(&mut p, &c, A, 200, 2);
    p.inject(Fault::Duplicate, None, |f| f.from == Side::A && f.is_data());
    post(
        &mut p,
        &c,
        A,
        &[
            send(1, &src, 0, 100, Some(1)),
            send(2, &src, 100, 100, Some(2)),
        ],
    );
    let got = recv_wcs(&mut p, &c, B, 2, ms(100));
    assert_eq!(
        got.iter()
            .map(|w| (w.wr_id, w.imm_data))
            .collect::<Vec<_>>(),
        [(0, 1), (1, 2)]
    );
    p.run_for(ms(10)).unwrap();
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "no third receive completion"
    );
    assert!(p.bytes(&rbuf)[..200] == pattern(200, 2)[..]);
}

#[test]
fn a_packet_overtaken_within_the_quiet_time_causes_no_retransmission() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 8 * PKT, 3);
    let dst = buffer(&mut p, &c, B, 8 * PKT);
    p.inject(Fault::Hold, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(3)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 8 * PKT)]);
    p.run_until(
        |p| p.in_flight(B).is_empty() && !p.held().is_empty() && p.nic_stats(B).rx_frames == 7,
        ms(1),
    )
    .unwrap();
    assert_eq!(p.now(), 0, "the rest arrived at once");
    assert_eq!(p.release_held(), 1);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(8 * PKT, 3)[..]);
    assert_eq!((p.stats(A).retransmits, p.stats(B).naks_sent), (0, 0));
}

#[test]
fn a_packet_arriving_after_its_retransmission_changes_nothing() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 8 * PKT, 4);
    let dst = buffer(&mut p, &c, B, 8 * PKT);
    p.inject(Fault::Hold, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(3)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 8 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert_eq!(p.stats(A).retransmits, 1, "the hole was NAKed and resent");
    // Now the late original: a duplicate of bytes already placed.
    assert_eq!(p.release_held(), 1);
    p.run_for(ms(10)).unwrap();
    assert!(
        p.bytes(&dst) == &pattern(8 * PKT, 4)[..],
        "the late copy carries the same bytes"
    );
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty());
    // Seven, then PSN 3..7 resent, then the late original.
    assert_eq!(p.nic_stats(B).rx_frames, 7 + 5 + 1);
}

#[test]
fn messages_that_arrive_in_reverse_complete_in_psn_order() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(&mut p, &c, B, &recvs(4, &rbuf, 0, 64));
    let src = filled(&mut p, &c, A, 4 * 100, 5);
    let dst = buffer(&mut p, &c, B, 4 * 100);
    p.pause(B, true);
    let wrs: Vec<_> = (0..4)
        .map(|k| {
            write_imm(
                k,
                &src,
                k as usize * 100,
                &dst,
                k as usize * 100,
                100,
                10 + k as u32,
            )
        })
        .collect();
    post(&mut p, &c, A, &wrs);
    p.run_until(|p| p.in_flight(B).len() == 4, ms(1)).unwrap();
    p.in_flight_mut(B).make_contiguous().reverse();
    assert_eq!(
        p.in_flight(B)
            .iter()
            .map(|f| f.info.psn().unwrap())
            .collect::<Vec<_>>(),
        [3, 2, 1, 0]
    );
    p.pause(B, false);
    let got = recv_wcs(&mut p, &c, B, 4, ms(100));
    assert_eq!(
        got.iter()
            .map(|w| (w.wr_id, w.imm_data))
            .collect::<Vec<_>>(),
        [(0, 10), (1, 11), (2, 12), (3, 13)],
        "PSN order, not arrival order"
    );
    assert_eq!(
        send_wcs(&mut p, &c, A, 4, ms(100))
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(p.bytes(&dst) == &pattern(400, 5)[..]);
}

#[test]
fn duplicated_acks_complete_each_request_once() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 3 * 1000, 6);
    let dst = buffer(&mut p, &c, B, 3 * 1000);
    p.inject(Fault::Duplicate, None, |f| f.from == Side::B && f.is_ack());
    let wrs = writes(0, 3, &src, &dst, 1000);
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 3, ms(100));
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    p.run_for(ms(10)).unwrap();
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty());
    assert!(p.bytes(&dst) == &pattern(3000, 6)[..]);
}

#[test]
fn an_old_ack_arriving_after_a_newer_one_is_ignored() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 16 * PKT, 7);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    // The first ACK (PSN 1, after the FIRST report) is held back until the last one went.
    p.inject(Fault::Hold, Some(1), |f| f.from == Side::B && f.is_ack());
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.release_held(), 1);
    p.run_for(ms(100)).unwrap();
    assert_eq!(
        p.stats(A).retransmits + p.stats(A).timeouts,
        0,
        "nothing resent for a stale ACK"
    );
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty());
}

/// A run under loss, duplication and reordering, as its wire log.
fn faulty_run() -> (Vec<LogEntry>, u64) {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 40 * PKT, 8);
    let dst = buffer(&mut p, &c, B, 40 * PKT);
    p.drop_nth(Side::A, 7);
    p.inject(Fault::Duplicate, Some(3), |f| {
        f.from == Side::A && f.psn().is_some_and(|x| x % 5 == 0)
    });
    p.inject(Fault::Drop, Some(1), |f| f.from == Side::B && f.is_ack());
    let wrs = writes(0, 4, &src, &dst, 10 * PKT);
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 4, ms(500));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(p.bytes(&dst) == &pattern(40 * PKT, 8)[..]);
    (p.log().to_vec(), p.now())
}

#[test]
fn the_same_faults_give_the_same_frames_at_the_same_virtual_times() {
    let (a, ta) = faulty_run();
    let (b, tb) = faulty_run();
    assert_eq!(ta, tb);
    assert_eq!(a.len(), b.len());
    assert!(a == b, "the two runs differ");
    assert!(a
        .iter()
        .any(|e| e.fate == bluerdma_sim::pair::Fate::Dropped));
}
