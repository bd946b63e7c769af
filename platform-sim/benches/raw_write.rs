//! Raw-ring WRITE throughput from blue0 to blue1: two emulated cards in this process on the
//! UDP link (real sockets on 127.0.0.1 and 127.0.0.2), WRITE chunks of 64 KiB and 1 MiB
//! posted on blue0's send ring, counted when blue1 has written them into its registered
//! memory. Next to each, a TCP loopback stream with writes of the same size, measured in
//! the same run, so that the ratio holds even on a busy machine.
//!
//! `cargo bench -p bluerdma-sim --bench raw_write [-- --seconds S]` (default 2 s per case).
//! Under `cargo test --benches` (no `--bench` argument) each case runs for 50 ms as a smoke
//! test.
//!
//! The sender keeps at most [`WINDOW`] bytes posted and not yet written at blue1 (the
//! engine of issue C will pace by its send window; here a fixed window keeps the socket
//! buffers from overflowing). Each chunk is one work request at PMTU 4096; blue1's meta
//! reports are drained as they come. At the end the destination must equal the source.

use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::mtu::Pmtu;
use bluerdma_sim::scenarios::raw::{packet_count, pattern};
use bluerdma_sim::scenarios::testbed::{Testbed, TestbedConfig, ALL_ACCESS, CARD_IPS};

/// Bytes posted and not yet written at blue1, at most.
const WINDOW: u64 = 4 << 20;
/// The registered buffers; chunk i goes to offset (i * chunk) % SPAN on both sides.
const SPAN: usize = 16 << 20;

struct Measured {
    bytes: u64,
    chunks: u64,
    packets: u64,
    elapsed: Duration,
}

impl Measured {
    fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64() / 1e9
    }
}

fn raw_write(chunk: usize, run: Duration) -> Measured {
    let mut bed = Testbed::start(TestbedConfig::new(0)).expect("two cards on the UDP link");
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu4096).expect("QP pair");
    let src = bed
        .register(0, SPAN, ALL_ACCESS, |i| pattern(1, i))
        .expect("source MR");
    let dst = bed
        .register(1, SPAN, ALL_ACCESS, |_| 0)
        .expect("destination MR");
    let written = |bed: &Testbed| bed.nic_stats(1).rx_payload_bytes;
    let start_bytes = written(&bed);
    let (mut posted, mut chunks, mut packets, mut psn) = (0u64, 0u64, 0u64, 0u32);
    let start = Instant::now();
    while start.elapsed() < run {
        let done = written(&bed) - start_bytes;
        if posted - done + chunk as u64 > WINDOW {
            bed.drain_reports();
            // Sleep rather than spin: the two cards' threads need the cores.
            thread::sleep(Duration::from_micros(50));
            continue;
        }
        let offset = (chunks as usize * chunk) % SPAN;
        let n = packet_count(dst.at(offset), chunk, Pmtu::Mtu4096);
        bed.post(0, &[qp.write(&src, offset, &dst, offset, chunk, psn)])
            .expect("post");
        psn = (psn + n) & 0x00FF_FFFF;
        posted += chunk as u64;
        chunks += 1;
        packets += u64::from(n);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while written(&bed) - start_bytes < posted && Instant::now() < deadline {
        bed.drain_reports();
        thread::sleep(Duration::from_micros(50));
    }
    let elapsed = start.elapsed();
    let bytes = written(&bed) - start_bytes;
    assert_eq!(
        bytes,
        posted,
        "blue1 wrote every posted byte (link: {:?})",
        bed.link_stats(1)
    );
    let covered = (chunks as usize * chunk).min(SPAN);
    assert!(
        bed.bytes(&dst)[..covered] == bed.bytes(&src)[..covered],
        "the destination equals the source"
    );
    Measured {
        bytes,
        chunks,
        packets,
        elapsed,
    }
}

fn tcp_stream(chunk: usize, run: Duration) -> Measured {
    let data: Vec<u8> = (0..chunk).map(|i| pattern(1, i)).collect();
    let r = bluerdma_sim::baseline::tcp_stream(CARD_IPS[0], &data, run).expect("TCP baseline");
    Measured {
        bytes: r.bytes,
        chunks: r.writes,
        packets: 0,
        elapsed: r.elapsed,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(if benching { 2.0 } else { 0.05 });
    let run = Duration::from_secs_f64(seconds);

    println!(
        "raw-ring WRITE blue0 -> blue1 on the UDP link, PMTU 4096, window {} MiB, {seconds} s per case",
        WINDOW >> 20
    );
    println!(
        "{:<22} {:>10} {:>12} {:>10} {:>8}",
        "case", "chunks", "packets/s", "Gbit/s", "vs TCP"
    );
    for (name, chunk) in [("64 KiB", 64 << 10), ("1 MiB", 1 << 20)] {
        let tcp = tcp_stream(chunk, run);
        let raw = raw_write(chunk, run);
        for (label, m) in [
            (format!("TCP, {name} writes"), &tcp),
            (format!("raw WRITE, {name}"), &raw),
        ] {
            let rate = if m.packets > 0 {
                format!("{:.0}", m.packets as f64 / m.elapsed.as_secs_f64())
            } else {
                "-".into()
            };
            println!(
                "{:<22} {:>10} {:>12} {:>10.2} {:>7.2}x",
                label,
                m.chunks,
                rate,
                m.gbit_per_s(),
                m.gbit_per_s() / tcp.gbit_per_s()
            );
        }
    }
}
