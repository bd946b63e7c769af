//! The post_send rate through the Rust API: 64 B WRITEs between two emulated NICs in this
//! process, timed around `post_send` only, posted one per call and 32 per call (one
//! signaled in 32; the completion is drained outside the timing).
//!
//! `cargo bench -p bluerdma-linux --bench post_rate [-- --seconds S]` prints
//! `post_send_1 <WR/s>` and `post_send_32 <WR/s>`; `cargo xtask bench` reads them.

use std::time::{Duration, Instant};

use bluerdma_core::engine::SendWr;
use bluerdma_linux::perf::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let port = 42_000 + (std::process::id() % 20_000) as u16;
    let (_ctx_a, _ctx_b, a, b) = open_udp_pair(port);
    let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 20, ALL).unwrap();
    let wrs: Vec<SendWr> = (0..32)
        .map(|k| write(k, &src, k * 64, 64, &dst, k * 64, k == 31))
        .collect();
    let rate = |per_call: usize| {
        let (mut posted, mut in_post) = (0u64, Duration::ZERO);
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < end {
            let t = Instant::now();
            for chunk in wrs.chunks(per_call) {
                // SAFETY: both MRs outlive every completion (drained below, before reuse).
                unsafe { a.qp.post_send(chunk).expect("post") };
            }
            in_post += t.elapsed();
            posted += wrs.len() as u64;
            drain(&a.cq, 1);
        }
        posted as f64 / in_post.as_secs_f64()
    };
    // Warm up the rings and the card before the first measurement.
    rate(32);
    println!("post_send_1 {:.0}", rate(1));
    println!("post_send_32 {:.0}", rate(32));
}
