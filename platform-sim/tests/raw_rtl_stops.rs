//! Where the RTL stops, driven through raw rings (no engine): the emulated card freezes at
//! each such event, names it, counts it and answers nothing more, on both ways of
//! attaching the driver (`in_process`, `rtl_protocol`); under `continue` it carries on,
//! and a threaded card that froze under `fail` panics when dropped.

mod raw;

use bluerdma_sim::model::RtlStop;
use bluerdma_sim::rawdrv::RawError;
use raw::*;

fn undecoded_register_access_is_rejected_loudly(pair: &Pair) {
    let regs = pair.cards[0].nic().regs();
    assert!(regs.write(0x180, 1).is_err());
    assert!(regs.read(0x040).is_err());
    assert_eq!(regs.undecoded().0, 2);
    // The RTL's simulation ends there: the card froze and names the access.
    let shared = pair.cards[0].nic().shared();
    assert_eq!(
        shared.take_rtl_stop(),
        Some(RtlStop::UndecodedRegister {
            offset: 0x040,
            is_write: false
        })
    );
    assert!(shared.frozen());
    assert_eq!(shared.stats.snapshot().rtl_stops, 1);
}

fn unknown_command_stops_the_card_and_the_next_command_times_out(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    let mut d = bluerdma_core::desc::RawDesc::ZERO;
    d.0[30] = 5; // UpdateErrorPsnRecoverPoint: declared, never answered
    d.0[31] = 0x80;
    s0.drv.push_command(&d).unwrap();
    // The RTL's simulation ends at it: the card answers nothing more, and the driver's
    // wait ends in a timeout rather than a hang.
    s0.drv.command_timeout = Duration::from_millis(300);
    let e = s0.drv.configure(MAC0, IP0).unwrap_err();
    assert!(
        matches!(
            e,
            RawError::CommandTimeout {
                op: "SetNetworkParam"
            }
        ),
        "{e}"
    );
    let shared = pair.cards[0].nic().shared();
    assert_eq!(shared.stats.snapshot().command_errors, 1);
    assert_eq!(
        shared.take_rtl_stop(),
        Some(RtlStop::UnknownCommand { op: 5 })
    );
}

/// Waits (at most `MAX`) until card `i` of `pair` froze at an RTL stop; takes it.
fn frozen_at(pair: &Pair, i: usize) -> RtlStop {
    let shared = pair.cards[i].nic().shared();
    let deadline = std::time::Instant::now() + MAX;
    while !shared.frozen() {
        assert!(
            std::time::Instant::now() < deadline,
            "card {i} did not freeze"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    shared
        .take_rtl_stop()
        .expect("a frozen card names its stop")
}

fn a_wqe_whose_lkey_has_no_valid_mr_entry_freezes_the_sender(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(4096, |i| i as u8);
    let dst = vec![0u8; 4096];
    let (lkey, rkey) = (MrKey::new(3, 0x33).unwrap(), MrKey::new(2, 0x22).unwrap());
    // The sink is registered on card 1; the source's lkey was never registered on card 0.
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let raddr = dst.as_ptr() as u64;
    s0.drv
        .post_send(&[
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 0),
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 1),
        ])
        .unwrap();
    assert_eq!(
        frozen_at(pair, 0),
        RtlStop::InvalidLkey {
            lkey: lkey.get(),
            sqpn: QPN0
        }
    );
    let stats = pair.cards[0].nic().stats().snapshot();
    assert_eq!(
        (stats.wqes, stats.tx_packets, stats.rtl_stops),
        (1, 0, 1),
        "the card stopped at the first WQE: {stats}"
    );
    // A frozen card answers no command either.
    s0.drv.command_timeout = Duration::from_millis(300);
    assert!(matches!(
        s0.drv.configure(MAC0, IP0),
        Err(RawError::CommandTimeout { .. })
    ));
    assert!(dst.iter().all(|b| *b == 0), "nothing reached the peer");
}

fn a_payloadless_wqe_that_is_not_first_and_last_freezes_the_sender(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    let src = buffer(64, |i| i as u8);
    let key = MrKey::new(1, 0x11).unwrap();
    let mut req = write_req(WorkReqOpcode::Read, &src, key, 0x1000, key, 64, 5);
    req.seg1.is_last = false;
    s0.drv.post_send(&[req]).unwrap();
    assert_eq!(frozen_at(pair, 0), RtlStop::PayloadlessNotWhole { op: 4 });
}

fn an_update_pgt_that_breaks_the_staging_rules_freezes_the_card(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    s0.drv.command_timeout = Duration::from_millis(300);
    // 8 bytes past a 512-byte boundary: the RTL ends its simulation (nic-behaviour.md 5.2).
    let e = s0
        .drv
        .command(bluerdma_core::desc::cmd::CmdRequest::UpdatePgt(
            bluerdma_core::desc::cmd::UpdatePgt {
                dma_addr: bluerdma_core::addr::DeviceAddr(0x1008),
                start_index: 0,
                entry_count: 1,
            },
        ))
        .unwrap_err();
    assert!(
        matches!(e, RawError::CommandTimeout { op: "UpdatePgt" }),
        "{e}"
    );
    let stop = frozen_at(pair, 0);
    assert!(
        matches!(&stop, RtlStop::UpdatePgt { reason } if reason.contains("512")),
        "{stop}"
    );
}

#[test]
fn a_threaded_card_that_froze_fails_its_owner_when_dropped_unless_the_stop_was_taken() {
    let start = |name: &str| {
        let hub = MemHub::new();
        let config = NicConfig {
            name: name.into(),
            rtl_stops: RtlStopPolicy::Fail,
            ..NicConfig::default()
        };
        InProcessCard::start(config, Box::new(hub.attach(IP0).unwrap())).unwrap()
    };
    let card = start("blue9");
    assert!(card.nic.regs().write(0x180, 1).is_err());
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(card)));
    let panic = dropped.expect_err("dropping a card that froze under `fail` panics");
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("blue9") && text.contains("undecoded_register"),
        "{text}"
    );
    // A stop its owner took (and reported) does not panic again.
    let card = start("blue8");
    assert!(card.nic.regs().read(0x040).is_err());
    assert!(card.nic.shared().take_rtl_stop().is_some());
    drop(card);
}

#[test]
fn a_card_that_carries_on_past_rtl_stops_skips_an_unknown_command() {
    for attach in [Attach::InProcess, Attach::Rtl] {
        let pair = Pair::in_memory_with(attach, Some(RtlStopPolicy::Continue));
        let (mut s0, _s1) = pair.open(ALL);
        let mut d = bluerdma_core::desc::RawDesc::ZERO;
        d.0[30] = 5;
        d.0[31] = 0x80;
        s0.drv.push_command(&d).unwrap();
        // The next good command still completes: the card skipped the unknown one (as
        // the synthesised hardware would, inferred), and counted it.
        s0.drv.configure(MAC0, IP0).unwrap();
        let stats = pair.cards[0].nic().stats().snapshot();
        assert_eq!(
            (stats.command_errors, stats.rtl_stops),
            (1, 1),
            "{attach:?}"
        );
        assert!(!pair.cards[0].nic().shared().frozen());
    }
}
on_both_attaches!(
    undecoded_register_access_is_rejected_loudly,
    unknown_command_stops_the_card_and_the_next_command_times_out,
    a_wqe_whose_lkey_has_no_valid_mr_entry_freezes_the_sender,
    a_payloadless_wqe_that_is_not_first_and_last_freezes_the_sender,
    an_update_pgt_that_breaks_the_staging_rules_freezes_the_card,
);
