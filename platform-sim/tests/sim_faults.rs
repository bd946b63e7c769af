//! Fault injection at 5 % drop on the sender's link is visible in the link and card
//! counters and reproducible from its seed (issue B, "Done when"). Two cards on the UDP
//! link; a few hundred WRITE packets from blue0 to blue1, paced so that nothing is lost
//! below the fault injector.

use std::collections::BTreeMap;

use bluerdma_sim::link::FaultConfig;
use bluerdma_sim::scenarios::faults::{drive, plausible, FaultRun, TRAFFIC};
use bluerdma_sim::scenarios::testbed::{Testbed, TestbedConfig};

const DROP: f64 = 0.05;

fn faults(seed: u64) -> FaultConfig {
    FaultConfig {
        drop: DROP,
        seed,
        ..FaultConfig::none()
    }
}

/// The traffic through a 5 % drop on blue0's transmit side only.
fn run(seed: u64) -> FaultRun {
    let mut config = TestbedConfig::new(0);
    config.faults[0] = Some(faults(seed));
    config.record_received = true;
    let mut bed = Testbed::start(config).unwrap();
    let run = drive(&mut bed, TRAFFIC, seed).unwrap();
    assert!(run.settled, "nothing lost below the injector: {run:?}");
    run
}

/// The PSNs received, counting each once (the sender's PSNs start at 0 and are
/// consecutive, one per frame).
fn psns(run: &FaultRun) -> Vec<u32> {
    run.received_psns.keys().copied().collect()
}

#[test]
fn five_percent_drop_shows_in_the_counters_and_replays_from_the_seed() {
    let first = run(42);
    let sent = first.nic[0].tx_packets;
    let dropped = first.link[0].frames_dropped;
    assert!(sent >= 300, "a few hundred packets: {sent}");
    assert!(
        plausible(dropped, sent, DROP),
        "{dropped} of {sent} dropped is not about 5 %"
    );
    assert!(dropped > 0);
    assert_eq!(first.link[0].frames_sent, sent - dropped);
    assert_eq!(
        first.nic[1].rx_frames,
        sent - dropped,
        "blue1 received every frame that was not dropped, and only those"
    );
    assert_eq!(first.nic[1].rx_accepted, sent - dropped);
    assert!(first.nic[1].naks_sent > 0, "the gaps made blue1 send NAKs");

    // The dropped frames are exactly those the seed's decisions name: the card's transmit
    // thread sends through the port's first sender (handle 1), one frame per PSN.
    let decisions = faults(42).for_handle(1);
    let predicted: Vec<u32> = (0..sent as u32)
        .filter(|&psn| !decisions.decide(u64::from(psn), 0).drop)
        .collect();
    assert_eq!(psns(&first), predicted, "received PSNs follow the seed");

    let again = run(42);
    assert_eq!(again.link[0].frames_dropped, dropped);
    assert_eq!(
        again.received_psns, first.received_psns,
        "the same seed drops the same PSNs"
    );

    let other = run(43);
    assert_ne!(psns(&other), psns(&first), "another seed drops other PSNs");
    let counts: BTreeMap<&str, u64> = [
        ("seed 42", dropped),
        ("seed 43", other.link[0].frames_dropped),
    ]
    .into();
    println!("dropped of {sent}: {counts:?}");
}
