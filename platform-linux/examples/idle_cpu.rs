//! Idle cost of emulated devices: two devices in this process on the UDP link, one QP pair
//! connected and one 4 KiB WRITE done, then nothing for `--seconds S` (default 10): prints
//! the process's CPU time over that span as a share of one core (`idle_cpu <percent>`).
//! `BLUERDMA_CARD=threads` measures the threaded card.
//!
//! `cargo run --release -p bluerdma-linux --features emulator --example idle_cpu`

use std::time::{Duration, Instant};

use bluerdma_linux::perf::*;

/// The process's user + system CPU time.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given; all-zero is a valid initial value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage on this stack frame.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let port = 42_000 + (std::process::id() % 20_000) as u16;
    let (_ctx_a, _ctx_b, a, b) = open_udp_pair(port);
    let src = a.pd.alloc_mr(4096, ALL).unwrap();
    let dst = b.pd.alloc_mr(4096, ALL).unwrap();
    // SAFETY: both MRs outlive the completion drained below.
    unsafe { a.qp.post_send(&[write(1, &src, 0, 4096, &dst, 0, true)]) }.unwrap();
    drain(&a.cq, 1);
    // Let the last timers (the card's quiet timer, the engine's ACK) run out.
    std::thread::sleep(Duration::from_millis(200));
    let (t0, c0) = (Instant::now(), cpu_time());
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (wall, cpu) = (t0.elapsed(), cpu_time() - c0);
    println!(
        "idle_cpu {:.3}",
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
}
