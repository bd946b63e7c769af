//! Where the RTL stops, on the two-card harness: the driver never makes the card stop
//! (deregistering an MR or destroying a QP while the card has not fetched the descriptors
//! that name it, retransmissions after RETRY_EXC_ERR), a frozen card is reported as such
//! instead of hanging the driver, and the stops a peer or the network can cause (a stale
//! PSN, a runt frame) freeze the card and are named.

mod common;

use bluerdma_sim::core::engine::{VerbsError, WcStatus};
use bluerdma_sim::core::qp::QpState;
use bluerdma_sim::model::RtlStop;
use bluerdma_sim::pair::{
    Fault, Frame, FrameInfo, FrameKind, Pair, PairConfig, PairError, QpOptions, Side,
};
use common::*;

const PKT: usize = 4096;

/// A pair whose tests make the card stop on purpose.
fn stopping_pair() -> (Pair, bluerdma_sim::pair::Conn) {
    connected_with(
        PairConfig {
            allow_rtl_stops: true,
            ..PairConfig::default()
        },
        &QpOptions::default(),
    )
}

#[test]
fn deregistering_an_mr_the_card_has_not_fetched_a_wqe_of_waits_for_the_card() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 8 * PKT, 1);
    let dst = buffer(&mut p, &c, B, 8 * PKT);
    post(&mut p, &c, A, &writes(1, 4, &src, &dst, 2 * PKT));
    // Nothing has stepped: the WQEs' descriptors are on A's send ring, not yet fetched.
    assert_eq!(p.nic_stats(A).wqes, 0);
    p.dereg_mr(&src).unwrap();
    // The card fetched them (with the MR still valid) before the MR went.
    assert_eq!(p.nic_stats(A).wqes, 4);
    assert_eq!(p.nic_stats(A).bad_wqes, 0);
    assert_eq!(p.rtl_stop(A), None, "{}", p.dump());
    // The WRs that used it fail (the QP goes to ERR), the rest is flushed.
    let wcs = send_wcs(&mut p, &c, A, 4, ms(10));
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    assert!(wcs[1..].iter().all(|w| w.status == WcStatus::WrFlushErr));
    // Its key is refused at once.
    let now = p.instant();
    let refused = p
        .engine(A)
        .post_send(c.qp(A), &[write(9, &src, 0, &dst, 0, 8)], now);
    assert!(refused.is_err());
    p.run_for(ms(500)).unwrap();
    assert_eq!(p.rtl_stop(A), None);
}

#[test]
fn destroying_a_qp_and_its_mr_right_after_posting_never_stops_the_card() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 16 * PKT, 2);
    let dst = buffer(&mut p, &c, B, 16 * PKT);
    post(&mut p, &c, A, &writes(1, 16, &src, &dst, PKT));
    p.destroy_qp(A, c.qp(A)).unwrap();
    p.dereg_mr(&src).unwrap();
    assert_eq!(p.nic_stats(A).wqes, 16);
    p.run_for(ms(200)).unwrap();
    assert_eq!(p.rtl_stop(A), None, "{}", p.dump());
}

#[test]
fn an_mr_deregistered_after_retry_exc_err_is_never_named_by_a_retransmission() {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 64 * PKT, 3);
    let dst = buffer(&mut p, &c, B, 64 * PKT);
    // B never hears A: every try times out, then RETRY_EXC_ERR.
    p.inject(Fault::Drop, None, |f| f.from == Side::A);
    post(&mut p, &c, A, &writes(1, 8, &src, &dst, 8 * PKT));
    let wcs = send_wcs(&mut p, &c, A, 8, ms(100));
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    let retransmits = p.stats(A).retransmits;
    assert!(retransmits >= 2, "{retransmits} retransmissions");
    p.dereg_mr(&src).unwrap();
    p.run_for(ms(500)).unwrap();
    assert_eq!(
        p.stats(A).retransmits,
        retransmits,
        "a QP in ERR retransmits nothing"
    );
    assert_eq!(p.nic_stats(A).bad_wqes, 0);
    assert_eq!(p.rtl_stop(A), None, "{}", p.dump());
}

#[test]
fn a_frozen_card_fails_dereg_mr_and_commands_with_errors_that_say_so() {
    let (mut p, c) = stopping_pair();
    let src = filled(&mut p, &c, A, 4 * PKT, 4);
    let dst = buffer(&mut p, &c, B, 4 * PKT);
    // An access the RTL does not decode ends its simulation: the card freezes.
    let regs = &p.card(A).shared().regs;
    assert!(regs.write(0x180, 1).is_err());
    post(&mut p, &c, A, &writes(1, 1, &src, &dst, 4 * PKT));
    let e = p.dereg_mr(&src).unwrap_err();
    assert!(
        matches!(e, PairError::Verbs(VerbsError::CommandTimeout { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains("send-ring fetch dereg_mr waits for"),
        "{e}"
    );
    // A command gets no answer either: a timeout, not a hang.
    let e = p.reg_mr(A, c.pd[0], PKT, ALL).unwrap_err();
    assert!(
        matches!(e, PairError::Verbs(VerbsError::CommandTimeout { .. })),
        "{e}"
    );
    assert_eq!(
        p.rtl_stop(A),
        Some(RtlStop::UndecodedRegister {
            offset: 0x180,
            is_write: true
        })
    );
    let stats = p.nic_stats(A);
    assert_eq!((stats.rtl_stops, stats.wqes), (1, 0));
    assert!(p.dump().contains("undecoded_register"), "{}", p.dump());
}

#[test]
fn an_rtl_stop_fails_the_harness_with_the_event_named() {
    let (mut p, _c) = default_pair();
    assert!(p.card(B).shared().regs.read(0x040).is_err());
    let e = p.run_for(ms(1)).unwrap_err();
    assert!(
        matches!(
            e,
            PairError::RtlStop {
                side: Side::B,
                stop: RtlStop::UndecodedRegister { offset: 0x40, .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("undecoded_register"), "{e}");
    // The pair would panic when dropped; this test reported the stop itself.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(p)));
    let text = dropped.unwrap_err();
    let text = text.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("allow_rtl_stops"), "{text}");
}

#[test]
fn a_late_duplicate_more_than_eight_strides_behind_freezes_the_receiving_card() {
    let (mut p, c) = stopping_pair();
    let src = filled(&mut p, &c, A, 256 * PKT, 5);
    let dst = buffer(&mut p, &c, B, 256 * PKT);
    // Keep a copy of A's first data packet aside; it is resent and acknowledged.
    p.inject(Fault::Hold, Some(1), |f| {
        f.from == Side::A && matches!(f.kind, FrameKind::Packet { psn: 0, .. })
    });
    post(&mut p, &c, A, &writes(1, 4, &src, &dst, 64 * PKT));
    let wcs = send_wcs(&mut p, &c, A, 4, ms(2000));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(p.rtl_stop(B), None);
    // 256 PSNs later the copy arrives: the RTL's bitmap pipeline stops on it.
    assert_eq!(p.release_held(), 1);
    p.run_for(ms(1)).unwrap();
    match p.rtl_stop(B) {
        Some(RtlStop::StalePsn { psn: 0, .. }) => {}
        other => panic!("expected a stale PSN stop, got {other:?}\n{}", p.dump()),
    }
    assert_eq!(p.nic_stats(B).stale_psns, 1);
    // The frozen card takes nothing more: A's next WRITE never completes.
    post(&mut p, &c, A, &writes(9, 1, &src, &dst, PKT));
    p.run_for(ms(5)).unwrap();
    assert!(p.nic_stats(B).frozen_drops >= 1, "{}", p.nic_stats(B));
}

#[test]
fn a_runt_frame_freezes_the_card_that_receives_it() {
    let (mut p, _c) = stopping_pair();
    // A frame of one bus beat (32 bytes) for B: the RTL's classifier stops on it, before
    // it even looks at the addresses.
    let now = p.now();
    p.in_flight_mut(Side::B).push_back(Frame {
        info: FrameInfo {
            id: u64::MAX,
            from: Side::A,
            nth: u64::MAX,
            sent_ns: now,
            kind: FrameKind::Other,
            len: 32,
        },
        bytes: vec![0xFF; 32],
    });
    p.run_for(ms(1)).unwrap();
    assert_eq!(p.rtl_stop(B), Some(RtlStop::ShortFrame { len: 32 }));
    assert_eq!(p.rtl_stop(A), None);
}
