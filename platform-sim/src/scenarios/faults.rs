//! The fault-injection scenarios: with faults on, the raw rings cannot expect intact
//! delivery (nothing retransmits before the driver engine of issue C), so these rows check
//! what the fault injector promises instead (`link::fault`): the counts match the rates,
//! and the same seed and the same traffic give the same faults.
//!
//! The traffic is [`TRAFFIC`]: WRITEs from blue0 to blue1, posted in batches with the link
//! settled between them, so that no frame is lost below the fault injector (a full socket
//! buffer would make the run irreproducible for reasons that are not the seed's).

use std::collections::BTreeMap;
use std::time::Duration;

use bluerdma_core::mtu::Pmtu;
use bluerdma_core::regs::Counter;
use bluerdma_core::wire::RocePacket;

use super::raw::{packet_count, pattern};
use super::testbed::{Testbed, ALL_ACCESS, CARD_NAMES};
use super::{ensure, Failure, Report, Sim};
use crate::link::{FaultConfig, LinkStatsSnapshot};
use crate::model::NicStatsSnapshot;

/// The shape of the WRITE traffic of a fault run.
#[derive(Clone, Copy, Debug)]
pub struct Traffic {
    /// How many WRITEs.
    pub writes: usize,
    /// Bytes per WRITE.
    pub len: usize,
    /// Path MTU.
    pub pmtu: Pmtu,
    /// WRITEs posted between two settles of the link.
    pub batch: usize,
}

/// 32 WRITEs of 16 KiB at PMTU 1024: 512 data packets, 8 WRITEs (128 packets) at a time.
pub const TRAFFIC: Traffic = Traffic {
    writes: 32,
    len: 16 * 1024,
    pmtu: Pmtu::Mtu1024,
    batch: 8,
};

/// What one run of the traffic did.
#[derive(Clone, Debug)]
pub struct FaultRun {
    /// The fault configuration of each card.
    pub faults: [FaultConfig; 2],
    /// Each card's link counters at the end.
    pub link: [LinkStatsSnapshot; 2],
    /// Each card's own counters at the end.
    pub nic: [NicStatsSnapshot; 2],
    /// Counter registers of blue1 that a damaged packet may bump, by name.
    pub blue1_drops: Vec<(Counter, u32)>,
    /// How many times each PSN reached blue1 (a corrupted PSN counts as received).
    pub received_psns: BTreeMap<u32, u32>,
    /// Whether every frame sent was received (nothing lost below the fault injector).
    pub settled: bool,
}

impl FaultRun {
    /// Frames card `side` handed to its link (before faults).
    pub fn offered(&self, side: usize) -> u64 {
        let n = &self.nic[side];
        n.tx_packets + n.naks_sent + n.simple_tx
    }

    /// One line per card with the link and card counters.
    pub fn counter_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (side, name) in CARD_NAMES.iter().enumerate() {
            let l = &self.link[side];
            lines.push(format!(
                "{name} link: offered {} sent {} dropped {} duplicated {} reordered {} \
                 corrupted {} received {} rx-queue drops {}",
                self.offered(side),
                l.frames_sent,
                l.frames_dropped,
                l.frames_duplicated,
                l.frames_reordered,
                l.frames_corrupted,
                l.frames_received,
                l.rx_queue_drops
            ));
            lines.push(format!("{name} card: {}", self.nic[side]));
        }
        let regs: Vec<String> = self
            .blue1_drops
            .iter()
            .filter(|(_, v)| *v != 0)
            .map(|(c, v)| format!("{c:?}={v}"))
            .collect();
        if !regs.is_empty() {
            lines.push(format!("blue1 drop counters: {}", regs.join(" ")));
        }
        lines
    }
}

/// The fault configuration of each card: blue0 keeps `faults`; blue1 gets the same rates
/// with a seed derived from it, so that the two directions fail independently.
pub fn per_card(faults: FaultConfig) -> [Option<FaultConfig>; 2] {
    let blue1 = FaultConfig {
        seed: faults.seed ^ 0x6A09_E667_F3BC_C909,
        ..faults
    };
    [Some(faults), Some(blue1)]
}

/// Runs `traffic` on `bed` (which should record what blue1 receives) and collects the
/// counters.
pub fn drive(bed: &mut Testbed, traffic: Traffic, seed: u64) -> Result<FaultRun, Failure> {
    let qp = bed.connect(ALL_ACCESS, traffic.pmtu)?;
    let src = bed.register(0, traffic.len, ALL_ACCESS, |i| pattern(seed, i))?;
    let dst = bed.register(1, traffic.len, ALL_ACCESS, |_| 0)?;
    let per_write = packet_count(dst.va, traffic.len, traffic.pmtu);
    let mut psn = 0u32;
    let mut settled = true;
    let mut posted = 0;
    while posted < traffic.writes {
        let batch: Vec<_> = (posted..traffic.writes.min(posted + traffic.batch))
            .map(|_| {
                let request = qp.write(&src, 0, &dst, 0, traffic.len, psn);
                psn = (psn + per_write) & 0x00FF_FFFF;
                request
            })
            .collect();
        bed.post(0, &batch)?;
        posted += batch.len();
        settled &= bed.settle(Duration::from_millis(20), Duration::from_secs(5));
        bed.drain_reports();
    }
    let received = bed
        .received_frames(1)
        .ok_or_else(|| Failure("the testbed does not record received frames".into()))?;
    let mut received_psns = BTreeMap::new();
    for frame in &received {
        if let Ok((packet, _)) = RocePacket::parse_frame(frame) {
            *received_psns.entry(packet.headers.bth.psn).or_insert(0) += 1;
        }
    }
    let blue1_drops = [
        Counter::InvalidQpContext,
        Counter::InvalidQpAccess,
        Counter::InvalidMrKey,
        Counter::InvalidMrAccess,
        Counter::MemOutOfBounds,
        Counter::PacketLengthError,
    ]
    .into_iter()
    .map(|c| (c, bed.counter(1, c)))
    .collect();
    Ok(FaultRun {
        faults: [FaultConfig::none(); 2],
        link: [bed.link_stats(0), bed.link_stats(1)],
        nic: [bed.nic_stats(0), bed.nic_stats(1)],
        blue1_drops,
        received_psns,
        settled,
    })
}

/// Whether `count` events out of `trials` at probability `rate` is plausible: within four
/// standard deviations of the mean, plus one for rounding.
pub fn plausible(count: u64, trials: u64, rate: f64) -> bool {
    let mean = trials as f64 * rate;
    let sd = (trials as f64 * rate * (1.0 - rate)).sqrt();
    (count as f64 - mean).abs() <= 4.0 * sd + 1.0
}

fn run_once(sim: &mut Sim<'_>) -> Result<FaultRun, Failure> {
    let seed = sim.seed();
    let faults = sim
        .options()
        .effective_faults()
        .ok_or_else(|| Failure("no fault configuration".into()))?;
    let mut bed = sim.fresh_bed(|c| c.record_received = true)?;
    sim.step("posting WRITEs through the faulty link");
    let mut run = drive(&mut bed, TRAFFIC, seed)?;
    let configs = per_card(faults);
    run.faults = [
        configs[0].unwrap_or_default(),
        configs[1].unwrap_or_default(),
    ];
    Ok(run)
}

/// The traffic once through the faulty links: the drop, duplicate and corrupt counts are
/// plausible for their rates, blue1 saw fewer frames than blue0 sent if anything was
/// dropped, and nothing was lost below the injector.
pub fn traffic(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let run = run_once(sim)?;
    let offered: u64 = (0..2).map(|s| run.offered(s)).sum();
    let total = |f: fn(&LinkStatsSnapshot) -> u64| f(&run.link[0]) + f(&run.link[1]);
    let dropped = total(|l| l.frames_dropped);
    let rates = run.faults[0];
    let checks = [
        ("dropped", dropped, rates.drop),
        (
            "duplicated",
            total(|l| l.frames_duplicated),
            rates.duplicate * (1.0 - rates.drop),
        ),
        (
            "corrupted",
            total(|l| l.frames_corrupted),
            rates.corrupt * (1.0 - rates.drop),
        ),
    ];
    for (what, count, rate) in checks {
        ensure(plausible(count, offered, rate), || {
            format!(
                "{count} of {offered} frames {what}, implausible at rate {rate} (expected about {:.1})",
                offered as f64 * rate
            )
        })?;
    }
    ensure(run.settled, || {
        format!(
            "frames were lost below the fault injector (rx-queue drops {} / {})",
            run.link[0].rx_queue_drops, run.link[1].rx_queue_drops
        )
    })?;
    let (sent, arrived) = (run.nic[0].tx_packets, run.nic[1].rx_frames);
    if run.link[0].frames_dropped > 0 {
        ensure(arrived < sent, || {
            format!("blue0 dropped frames, yet blue1 received {arrived} of {sent}")
        })?;
    }
    let report = Report {
        notes: format!(
            "{dropped} of {offered} frames dropped ({:.1} %, rate {} %); blue1 received {arrived} of {sent} data packets",
            100.0 * dropped as f64 / offered.max(1) as f64,
            100.0 * rates.drop
        ),
        details: run.counter_lines(),
    };
    sim.fault_runs.push(run);
    Ok(report)
}

/// The same traffic again from the same seed: the same frames dropped, duplicated and
/// corrupted, and blue1 received exactly the same PSNs as in the first run.
pub fn replay(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let first = match sim.fault_runs.first() {
        Some(run) => run.clone(),
        None => {
            let run = run_once(sim)?;
            sim.fault_runs.push(run.clone());
            run
        }
    };
    sim.step("replaying the traffic from the seed");
    let second = run_once(sim)?;
    ensure(first.settled && second.settled, || {
        "frames were lost below the fault injector; the runs cannot be compared".into()
    })?;
    let counts =
        |l: &LinkStatsSnapshot| (l.frames_dropped, l.frames_duplicated, l.frames_corrupted);
    for ((name, a), b) in CARD_NAMES.iter().zip(&first.link).zip(&second.link) {
        ensure(counts(a) == counts(b), || {
            format!(
                "{name} (dropped, duplicated, corrupted) {:?} then {:?}",
                counts(a),
                counts(b)
            )
        })?;
    }
    if first.received_psns != second.received_psns {
        let differing: Vec<u32> = first
            .received_psns
            .keys()
            .chain(second.received_psns.keys())
            .filter(|p| first.received_psns.get(p) != second.received_psns.get(p))
            .copied()
            .take(8)
            .collect();
        return Err(Failure(format!(
            "blue1 received different PSNs, e.g. {differing:#x?}"
        )));
    }
    let frames: u32 = second.received_psns.values().sum();
    Ok(Report::notes(format!(
        "identical: {} dropped, blue1 received the same {frames} frames ({} distinct PSNs)",
        second.link[0].frames_dropped + second.link[1].frames_dropped,
        second.received_psns.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plausibility_band_is_about_four_sigma() {
        // 512 trials at 5 %: mean 25.6, sd 4.93, so 4.9 ..= 46.3.
        assert!(plausible(26, 512, 0.05));
        assert!(plausible(5, 512, 0.05) && plausible(46, 512, 0.05));
        assert!(!plausible(4, 512, 0.05) && !plausible(47, 512, 0.05));
        assert!(plausible(0, 512, 0.0) && !plausible(2, 512, 0.0));
    }

    #[test]
    fn the_two_cards_fail_independently() {
        let f: FaultConfig = "drop=0.1,seed=9".parse().unwrap();
        let [a, b] = per_card(f);
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, f);
        assert_eq!(b.drop, f.drop);
        assert_ne!(a.seed, b.seed);
    }
}
