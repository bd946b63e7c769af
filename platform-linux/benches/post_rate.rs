//! The post_send rate through the Rust API: 64 B WRITEs between two emulated NICs in this
//! process, timed around `post_send` only, posted one per call and 32 per call (one
//! signaled in 32; the completion is drained outside the timing).
//!
//! `cargo bench -p bluerdma-linux --bench post_rate [-- --seconds S]` prints
//! `post_send_1 <WR/s>` and `post_send_32 <WR/s>`; `cargo xtask bench` reads them.

use bluerdma_linux::perf::*;

fn main() {
    let seconds = seconds_arg(1.0);
    let (_ctx_a, _ctx_b, a, b) = open_udp_pair(process_port(42_000));
    // Warm up the rings and the card before the first measurement.
    post_rate(&a, &b, seconds, 32);
    println!("post_send_1 {:.0}", post_rate(&a, &b, seconds, 1));
    println!("post_send_32 {:.0}", post_rate(&a, &b, seconds, 32));
}
