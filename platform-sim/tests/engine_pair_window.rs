//! The card's window quirks on the two-card harness (nic-behaviour.md section 3): a 128-PSN
//! receive window of 16-PSN strides that the sender must never outrun, MIDDLE packets
//! reported only on retry, the quiet-timer report that lets the receiving driver
//! acknowledge, and the first PSNs the card cannot take after a QP reset.

mod common;

use bluerdma_sim::core::engine::WcStatus;
use bluerdma_sim::core::mtu::Pmtu;
use bluerdma_sim::core::transport::Psn;
use bluerdma_sim::pair::PairError;
use bluerdma_sim::pair::{Fault, FrameInfo, FrameKind, Pair, PairConfig, QpOptions, Side};
use common::*;

const PKT: usize = 4096;

/// The most PSNs A had sent beyond B's latest cumulative ACK, over the whole log.
fn max_outstanding(p: &Pair) -> u32 {
    let mut acked = 0u32;
    let mut max = 0;
    for e in p.log() {
        match (e.info.from, e.info.kind) {
            (Side::B, FrameKind::DriverAck { psn, .. }) => acked = psn,
            (
                Side::A,
                FrameKind::Packet {
                    psn, retry: false, ..
                },
            ) => max = max.max(Psn::from_raw(acked).forward_distance(Psn::from_raw(psn)) + 1),
            _ => {}
        }
    }
    max
}

fn small_packets() -> QpOptions {
    QpOptions {
        pmtu: Pmtu::Mtu256,
        ..QpOptions::default()
    }
}

#[test]
fn the_sender_never_has_more_than_112_psns_beyond_the_last_ack() {
    let (mut p, c) = connected(&small_packets());
    let src = filled(&mut p, &c, A, 300 * 256, 1);
    let dst = buffer(&mut p, &c, B, 300 * 256);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 300 * 256)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(300 * 256, 1)[..]);
    assert_eq!(
        max_outstanding(&p),
        112,
        "seven 16-PSN strides: the window fills, never more"
    );
    assert_eq!(
        p.nic_stats(B).stale_psns,
        0,
        "nothing fell behind the card's window"
    );
    assert_eq!(p.stats(A).retransmits, 0);
}

#[test]
fn a_smaller_configured_send_window_is_honoured() {
    let cfg = PairConfig {
        send_window: 4,
        ..PairConfig::default()
    };
    let (mut p, c) = connected_with(cfg, &small_packets());
    let src = filled(&mut p, &c, A, 40 * 256, 2);
    let dst = buffer(&mut p, &c, B, 40 * 256);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 40 * 256)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(40 * 256, 2)[..]);
    assert_eq!(max_outstanding(&p), 4);
}

#[test]
fn a_gap_never_leaves_the_cards_window_so_the_quiet_report_makes_the_driver_nak() {
    let (mut p, c) = connected(&small_packets());
    let src = filled(&mut p, &c, A, 300 * 256, 3);
    let dst = buffer(&mut p, &c, B, 300 * 256);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(5)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 300 * 256)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(300 * 256, 3)[..]);
    // A stops 112 PSNs past the hole, inside the card's 128-PSN window: the card never
    // slides the hole out, so it sends no NAK of its own.
    assert_eq!(p.nic_stats(B).naks_sent, 0);
    assert!(p.nic_stats(B).quiet_reports >= 1);
    assert_eq!(
        p.stats(B).naks_sent,
        1,
        "the receiving driver NAKed after the quiet report"
    );
    assert_eq!(p.stats(A).retransmits, 1);
    let resent: Vec<u32> = p
        .sent_by(A)
        .filter(|f| f.is_retry())
        .filter_map(FrameInfo::psn)
        .collect();
    // Everything sent before the NAK from the hole on: the window held A at PSN 112
    // (112 past the first ACK, which covered PSN 0).
    let newest = p
        .sent_by(A)
        .take_while(|f| !f.is_retry())
        .filter_map(FrameInfo::psn)
        .max()
        .unwrap();
    assert_eq!(newest, 112);
    assert_eq!(
        resent,
        (5..=newest).collect::<Vec<u32>>(),
        "from the hole to the newest"
    );
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn middle_packets_are_reported_only_when_retransmitted() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 32 * PKT, 4);
    let dst = buffer(&mut p, &c, B, 32 * PKT);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(p.nic_stats(B).meta_reports, 2, "FIRST and LAST only");
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == Side::A && f.psn() == Some(21)
    });
    post(
        &mut p,
        &c,
        A,
        &[write(2, &src, 16 * PKT, &dst, 16 * PKT, 16 * PKT)],
    );
    send_wcs(&mut p, &c, A, 1, ms(100));
    assert!(p.bytes(&dst) == &pattern(32 * PKT, 4)[..]);
    // FIRST and LAST of the second WRITE, then the resent MIDDLEs 21..30 and LAST 31.
    assert_eq!(p.nic_stats(B).meta_reports, 2 + 2 + 10 + 1);
}

fn ack_time_of_a_16_packet_write(cfg: PairConfig) -> (u64, u64) {
    let (mut p, c) = connected_with(cfg, &QpOptions::default());
    let src = filled(&mut p, &c, A, 16 * PKT, 5);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(p.nic_stats(B).quiet_reports, 1);
    let last = p
        .sent_by(Side::A)
        .filter(|f| f.psn() == Some(15))
        .map(|f| f.sent_ns)
        .next()
        .unwrap();
    let ack = p
        .sent_by(Side::B)
        .find(|f| f.acks(15))
        .map(|f| f.sent_ns)
        .unwrap();
    (last, ack)
}

#[test]
fn the_quiet_timer_report_lets_the_receiver_acknowledge_middle_packets() {
    let (last, ack) = ack_time_of_a_16_packet_write(PairConfig::default());
    assert_eq!(
        ack - last,
        10_001,
        "strictly more than the 10 us quiet time after the last packet"
    );
    let (last, ack) = ack_time_of_a_16_packet_write(PairConfig {
        quiet_timeout: us(50),
        ..PairConfig::default()
    });
    assert_eq!(ack - last, 50_001, "the card's quiet time sets it");
}

#[test]
fn a_first_psn_the_card_cannot_take_is_refused_and_the_error_says_why() {
    let o = QpOptions {
        psn: [0x80_0000, 0x80_0000],
        timeout: 8,
        retry_cnt: 1,
        ..QpOptions::default()
    };
    let mut p = Pair::new().unwrap();
    let err = match p.connect(&o) {
        Err(PairError::Verbs(e)) => e.to_string(),
        Err(other) => panic!("not the verb's error: {other}"),
        Ok(_) => panic!("modify_qp took a first PSN the card's reset window takes as stale"),
    };
    assert!(
        err.contains("0x7FFFF0..=0xFFFF7F") && err.contains("stale"),
        "{err}"
    );
    // Just outside the range on either side works.
    for psn in [0x7F_FFEF, 0xFF_FF80] {
        let o = QpOptions {
            psn: [psn, psn],
            ..QpOptions::default()
        };
        let mut p = Pair::new().unwrap();
        let c = p.connect(&o).unwrap();
        let src = filled(&mut p, &c, A, 16 * PKT, 6);
        let dst = buffer(&mut p, &c, B, 16 * PKT);
        post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 16 * PKT)]);
        let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
        assert_eq!(wc.status, WcStatus::Success, "first PSN {psn:#x}");
        assert!(p.bytes(&dst) == &pattern(16 * PKT, 6)[..]);
        assert_eq!(p.nic_stats(B).stale_psns, 0, "card: {}", p.nic_stats(B));
    }
}
