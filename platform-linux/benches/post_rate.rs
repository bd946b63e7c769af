//! The post_send rate through the Rust API: 64 B WRITEs between two emulated NICs in this
//! process, timed around `post_send` only, posted one per call and 32 per call (one
//! signaled in 32; the completion is drained outside the timing). Measured on the link two
//! devices of one host get by default (shared memory) and again on the UDP link. Threads
//! are not pinned: with the posting thread alone on CPU 0 and the devices' threads on the
//! other, UDP posts were slower and shared-memory posts no faster (docs/BENCHMARKS.md,
//! session 10).
//!
//! `cargo bench -p bluerdma-linux --bench post_rate [-- --seconds S] [--no-udp]` prints
//! `post_send_1 <WR/s>` and `post_send_32 <WR/s>` (all bursts of 32 WRs over the time spent
//! posting) and `post_send_1_median`, `post_send_32_median` (the median burst's own rate),
//! for the default link, then the same keys ending in `_udp`; `cargo xtask bench` reads them.

use bluerdma_linux::perf::*;
use bluerdma_linux::Context;

/// Prints the two rates of one pair, each key ending in `suffix`.
fn measure(pair: (Context, Context, Side, Side), seconds: f64, suffix: &str) {
    let (_ctx_a, _ctx_b, a, b) = pair;
    // Warm up the rings and the card before the first measurement.
    post_rate(&a, &b, seconds, 32);
    for per_call in [1, 32] {
        let r = post_rates(&a, &b, seconds, per_call);
        println!("post_send_{per_call}{suffix} {:.0}", r.mean);
        println!("post_send_{per_call}_median{suffix} {:.0}", r.median_burst);
    }
}

fn main() {
    let seconds = seconds_arg(1.0);
    let port = process_port(42_000);
    // One pair at a time: the first pair's cards are closed before the next opens.
    measure(open_local_pair(port), seconds, "");
    if !std::env::args().any(|a| a == "--no-udp") {
        measure(open_udp_pair(port + 2), seconds, "_udp");
    }
}
