//! The post_send rate through the Rust API: 64 B WRITEs between two emulated NICs in this
//! process, timed around `post_send` only, posted one per call and 32 per call (one
//! signaled in 32; the completion is drained outside the timing). Measured on the link two
//! devices of one host get by default (shared memory) and again on the UDP link.
//!
//! `cargo bench -p bluerdma-linux --bench post_rate [-- --seconds S]` prints
//! `post_send_1 <WR/s>`, `post_send_32 <WR/s>` (default link), `post_send_1_udp` and
//! `post_send_32_udp`; `cargo xtask bench` reads them.

use bluerdma_linux::perf::*;

fn main() {
    let seconds = seconds_arg(1.0);
    let port = process_port(42_000);
    for (k, suffix) in ["", "_udp"].into_iter().enumerate() {
        // One pair at a time: the first pair's cards are closed before the next opens.
        let at = port + 2 * k as u16;
        let (_ctx_a, _ctx_b, a, b) = if k == 0 {
            open_local_pair(at)
        } else {
            open_udp_pair(at)
        };
        // Warm up the rings and the card before the first measurement.
        post_rate(&a, &b, seconds, 32);
        println!("post_send_1{suffix} {:.0}", post_rate(&a, &b, seconds, 1));
        println!("post_send_32{suffix} {:.0}", post_rate(&a, &b, seconds, 32));
    }
}
