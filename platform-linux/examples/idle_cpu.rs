//! Idle cost of emulated devices: two devices in this process, one QP pair connected and
//! one 4 KiB WRITE done, then nothing for `--seconds S` (default 10): prints the process's
//! CPU time over that span as a share of one core, on the link two devices of one host
//! get by default (shared memory; `idle_cpu_shm <percent>`) and on the UDP link
//! (`idle_cpu_udp <percent>`; not with `--no-udp`). `BLUERDMA_CARD=threads` measures the
//! threaded card. `cargo xtask bench` prints both next to the goal (0.5 % of a core).
//!
//! `cargo run --release -p bluerdma-linux --features emulator --example idle_cpu`

use std::time::{Duration, Instant};

use bluerdma_linux::perf::*;
use bluerdma_linux::Context;

/// The idle share of one core, in percent, of a connected pair left alone for `seconds`.
fn idle(pair: (Context, Context, Side, Side), seconds: f64) -> f64 {
    let (_ctx_a, _ctx_b, a, b) = pair;
    let src = a.pd.alloc_mr(4096, ALL).unwrap();
    let dst = b.pd.alloc_mr(4096, ALL).unwrap();
    // SAFETY: both MRs outlive the completion drained below.
    unsafe { a.qp.post_send(&[write(1, &src, 0, 4096, &dst, 0, true)]) }.unwrap();
    drain(&a.cq, 1);
    // Let the last timers (the card's quiet timer, the engine's ACK) run out.
    std::thread::sleep(Duration::from_millis(200));
    let (t0, c0) = (Instant::now(), cpu_seconds());
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (wall, cpu) = (t0.elapsed(), cpu_seconds() - c0);
    100.0 * cpu / wall.as_secs_f64()
}

fn main() {
    let seconds = seconds_arg(10.0);
    let port = process_port(42_000);
    println!("idle_cpu_shm {:.3}", idle(open_local_pair(port), seconds));
    if !std::env::args().any(|a| a == "--no-udp") {
        println!("idle_cpu_udp {:.3}", idle(open_udp_pair(port + 2), seconds));
    }
}
