//! A fixed amount of post_send work (500 batches of 32 64-byte WRITEs between two emulated
//! NICs), for instruction counts that do not depend on the load of the machine:
//!
//! `cargo build --release -p bluerdma-linux --example post_count && valgrind --tool=callgrind
//! target/release/examples/post_count`, then `callgrind_annotate --inclusive=yes` and read
//! the lines of `Device::post_send` and `Device::poll` (docs/BENCHMARKS.md).

use bluerdma_linux::perf::*;

fn main() {
    let port = 41_000 + (std::process::id() % 20_000) as u16;
    let (_ctx_a, _ctx_b, a, b) = open_udp_pair(port);
    let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 20, ALL).unwrap();
    let batch: Vec<_> = (0..32)
        .map(|k| write(k, &src, k * 64, 64, &dst, k * 64, k == 31))
        .collect();
    for _ in 0..500 {
        // SAFETY: both MRs outlive every completion (each batch is drained before the next).
        unsafe { a.qp.post_send(&batch).expect("post") };
        drain(&a.cq, 1);
    }
    println!("posted {} WRITEs", 500 * 32);
}
