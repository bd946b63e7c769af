//! The 24-bit PSN wrap on the two-card harness: connections that start at 0xFFFFF0 carry
//! WRITEs, SENDs and READs across 0xFFFFFF -> 0, and go-back-N works across it.

mod common;

use bluerdma_sim::core::engine::{WcOpcode, WcStatus};
use bluerdma_sim::pair::{Fault, FrameInfo, QpOptions};
use common::*;

const START: u32 = 0xFF_FFF0;
const PKT: usize = 4096;

fn wrapping() -> QpOptions {
    QpOptions {
        psn: [START, START],
        ..QpOptions::default()
    }
}

/// PSNs from `start`, `n` of them, modulo 2^24.
fn psns(start: u32, n: u32) -> Vec<u32> {
    (0..n).map(|k| (start + k) & 0xFF_FFFF).collect()
}

/// The PSNs `from` retransmitted, in order.
fn resent(p: &bluerdma_sim::pair::Pair, from: bluerdma_sim::pair::Side) -> Vec<u32> {
    p.sent_by(from)
        .filter(|f| f.is_retry())
        .filter_map(FrameInfo::psn)
        .collect()
}

/// A go-back-N resend: one run of consecutive PSNs (mod 2^24) that ends with the
/// message's last PSN and contains `lost`.
fn assert_go_back_n(resent: &[u32], lost: u32, last: u32) {
    assert!(!resent.is_empty(), "nothing resent");
    let run = psns(resent[0], resent.len() as u32);
    assert_eq!(resent, &run[..], "one consecutive run");
    assert_eq!(*resent.last().unwrap(), last, "up to the last PSN sent");
    assert!(resent.contains(&lost), "PSN {lost:#x} resent: {resent:x?}");
}

#[test]
fn a_write_across_the_psn_wrap_lands_intact_with_wrapped_psns() {
    let (mut p, c) = connected(&wrapping());
    let src = filled(&mut p, &c, A, 48 * PKT, 1);
    let dst = buffer(&mut p, &c, B, 48 * PKT);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 48 * PKT)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert!(p.bytes(&dst) == &pattern(48 * PKT, 1)[..]);
    let first: Vec<u32> = p
        .sent_by(A)
        .filter(|f| !f.is_retry())
        .filter_map(FrameInfo::psn)
        .collect();
    assert_eq!(first, psns(START, 48), "0xFFFFF0..0xFFFFFF then 0..0x1F");
    assert!(
        p.sent_by(B).any(|f| f.acks(0x1F)),
        "acknowledged past the wrap"
    );
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
#[ignore = "engine bug: a multi-packet message whose MIDDLE packets fall in the card's reset window (PSN 0xFFFF80..0xFFFFFF right after RTR) is always resent go-back-N from its second packet on a clean wire: the engine distrusts the reset bitmap and the card reports no MIDDLE packet, so the receiver NAKs PSNs that arrived"]
fn a_clean_write_from_0xfffff0_is_not_retransmitted() {
    let (mut p, c) = connected(&wrapping());
    let src = filled(&mut p, &c, A, 48 * PKT, 1);
    let dst = buffer(&mut p, &c, B, 48 * PKT);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 48 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert_eq!(resent(&p, A), Vec::<u32>::new(), "nothing was lost");
    assert_eq!(p.stats(B).naks_sent, 0);
}

#[test]
fn go_back_n_from_the_first_psn_after_the_wrap() {
    let (mut p, c) = connected(&wrapping());
    let src = filled(&mut p, &c, A, 32 * PKT, 2);
    let dst = buffer(&mut p, &c, B, 32 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == A && f.psn() == Some(0));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 32 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(32 * PKT, 2)[..]);
    assert_go_back_n(&resent(&p, A), 0, 0x0F);
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn go_back_n_from_a_psn_before_the_wrap_resends_across_it() {
    let (mut p, c) = connected(&wrapping());
    let src = filled(&mut p, &c, A, 32 * PKT, 3);
    let dst = buffer(&mut p, &c, B, 32 * PKT);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == A && f.psn() == Some(0xFF_FFFA)
    });
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 32 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(32 * PKT, 3)[..]);
    assert_go_back_n(&resent(&p, A), 0xFF_FFFA, 0x0F);
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn sends_across_the_wrap_consume_receive_wrs_in_order() {
    let (mut p, c) = connected(&wrapping());
    let n = 40u64;
    let rbuf = buffer(&mut p, &c, B, n as usize * 64);
    post_recvs(&mut p, &c, B, &recvs(n as usize, &rbuf, 64, 64));
    let src = filled(&mut p, &c, A, n as usize * 64, 4);
    let sends: Vec<_> = (0..n)
        .map(|k| send(100 + k, &src, k as usize * 64, 64, Some(k as u32 * 3)))
        .collect();
    post(&mut p, &c, A, &sends);
    let got = recv_wcs(&mut p, &c, B, n as usize, ms(100));
    for (k, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.imm_data, wc.byte_len),
            (k as u64, WcStatus::Success, k as u32 * 3, 64),
            "receive {k}"
        );
    }
    assert!(p.bytes(&rbuf) == &pattern(n as usize * 64, 4)[..]);
    assert_eq!(
        send_wcs(&mut p, &c, A, n as usize, ms(10)).len(),
        n as usize
    );
}

#[test]
fn a_read_whose_response_crosses_the_wrap_returns_every_byte() {
    let (mut p, c) = connected(&wrapping());
    let source = filled(&mut p, &c, B, 64 * PKT, 5);
    let sink = buffer(&mut p, &c, A, 64 * PKT);
    post(&mut p, &c, A, &[read(1, &sink, 0, &source, 0, 64 * PKT)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(100))[0];
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 64 * PKT as u32)
    );
    assert!(p.bytes(&sink) == &pattern(64 * PKT, 5)[..]);
    let resp: Vec<u32> = p
        .sent_by(B)
        .filter(|f| f.is_data() && !f.is_retry())
        .filter_map(FrameInfo::psn)
        .collect();
    assert_eq!(resp, psns(START, 64), "the responder's PSNs wrap");
}

#[test]
fn a_lost_ack_at_the_wrap_is_recovered_by_one_timeout() {
    let o = QpOptions {
        psn: [0xFF_FFFF, 0xFF_FFFF],
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 2 * PKT, 6);
    let dst = buffer(&mut p, &c, B, 2 * PKT);
    p.inject(Fault::Drop, Some(1), |f| f.from == B && f.acks(0));
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 2 * PKT)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(2 * PKT, 6)[..]);
    assert_eq!(p.stats(A).timeouts, 1);
}
