//! The post_send rate through the Rust API: 64 B WRITEs between two emulated NICs in this
//! process, timed around `post_send` only, posted one per call and 32 per call (one
//! signaled in 32; the completion is drained outside the timing). Measured on the link two
//! devices of one host get by default (shared memory) and again on the UDP link. The
//! posting thread runs on CPU 0 and the devices' threads (progress, out-of-band) on the
//! last CPU, so that the posts have a core of their own, as beside a card that is not
//! emulated by the host (`pinned 0` says pinning was not possible).
//!
//! `cargo bench -p bluerdma-linux --bench post_rate [-- --seconds S] [--no-udp]` prints
//! `post_send_1 <WR/s>` and `post_send_32 <WR/s>` (all bursts of 32 posts over the time spent
//! posting) and `post_send_1_median`, `post_send_32_median` (the median burst's own rate),
//! for the default link, then the same keys ending in `_udp`; `cargo xtask bench` reads them.

use bluerdma_linux::perf::*;
use bluerdma_linux::Context;

/// Pins the calling thread to `cpu`; whether it could.
fn pin(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
    // sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Opens a pair with `open` so that its threads (progress threads, the out-of-band
/// channel's) start on the last CPU, then moves this thread to CPU 0: the application's
/// posts get a core of their own, as with a card that is not emulated by the host's CPUs.
/// Without a second CPU, or where pinning is refused, nothing is pinned.
fn open_pinned<T>(open: impl FnOnce() -> T) -> (T, bool) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinned = cpus >= 2 && pin(cpus - 1);
    let pair = open();
    (pair, pinned && pin(0))
}

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
    let (pair, pinned) = open_pinned(|| open_local_pair(port));
    println!("pinned {}", u8::from(pinned));
    measure(pair, seconds, "");
    if !std::env::args().any(|a| a == "--no-udp") {
        measure(open_pinned(|| open_udp_pair(port + 2)).0, seconds, "_udp");
    }
}
