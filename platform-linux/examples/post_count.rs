//! A fixed amount of post_send work (500 batches of 32 64-byte WRITEs between two emulated
//! NICs on the link two devices of one host get by default), for instruction counts that do
//! not depend on the load of the machine:
//!
//! `cargo build --release -p bluerdma-linux --example post_count && valgrind --tool=callgrind
//! target/release/examples/post_count [--one]`, then `callgrind_annotate --inclusive=yes` and
//! read the lines of `Qp::post_send` (what the application's call costs, the inline card's
//! transmit side and wake-ups included), `Device::post_send` and `Device::poll`
//! (docs/BENCHMARKS.md). `--one` posts the 32 WRITEs of a batch one per call.

use bluerdma_linux::perf::*;

fn main() {
    let one = std::env::args().any(|a| a == "--one");
    let port = 41_000 + (std::process::id() % 20_000) as u16;
    let (_ctx_a, _ctx_b, a, b) = open_local_pair(port);
    let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 20, ALL).unwrap();
    let batch: Vec<_> = (0..32)
        .map(|k| write(k, &src, k * 64, 64, &dst, k * 64, k == 31))
        .collect();
    let per_call = if one { 1 } else { batch.len() };
    for _ in 0..500 {
        for wrs in batch.chunks(per_call) {
            // SAFETY: both MRs outlive every completion (each batch is drained before the
            // next).
            unsafe { a.qp.post_send(wrs).expect("post") };
        }
        drain(&a.cq, 1);
    }
    println!("posted {} WRITEs, {per_call} per call", 500 * 32);
}
