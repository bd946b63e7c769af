//! The fuzz targets' checks (tests/fuzz/src/checks) on stable, without libFuzzer: every
//! committed seed (regression inputs included) and pseudo-random mutations of the seeds,
//! the same for every run. This keeps the checks running in every `cargo test`, and is the
//! FALLBACK of `cargo xtask ci`'s fuzz row where nightly or cargo-fuzz is missing
//! (`BLUERDMA_FUZZ_FALLBACK_ITERS` raises the number of mutations per target, 5000 by
//! default). A failing input is printed in hex with its target.

#[allow(dead_code)]
#[path = "../fuzz/src/checks/mod.rs"]
mod checks;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random edits of `input` (bit flips, byte changes, inserts, deletes, cuts,
/// copies of a run of bytes, a splice with `other`).
fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = rng.next() as u8;
            }
            2 => v.insert(at, rng.next() as u8),
            3 if at < v.len() => {
                v.remove(at);
            }
            4 => v.truncate(at),
            5 if !v.is_empty() => {
                let from = rng.below(v.len());
                let len = rng.below(16).min(v.len() - from);
                let run: Vec<u8> = v[from..from + len].to_vec();
                let at = at.min(v.len());
                v.splice(at..at, run);
            }
            _ => {
                let cut = rng.below(other.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[cut..]);
            }
        }
    }
    v
}

fn run_one(target: &str, check: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        panic!("fuzz target `{target}` failed on input {hex}");
    }
}

#[test]
fn every_target_holds_on_its_seeds_and_their_mutations() {
    let iters: usize = std::env::var("BLUERDMA_FUZZ_FALLBACK_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let seeds_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut total = 0usize;
    for (k, &(target, check)) in checks::TARGETS.iter().enumerate() {
        let dir = seeds_root.join(target);
        let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "no seeds for `{target}`");
        for s in &seeds {
            run_one(target, check, s);
        }
        let mut rng = Rng(0x5EED_0000 + k as u64 * 0x9E37_79B9);
        for _ in 0..iters {
            let a = &seeds[rng.below(seeds.len())];
            let b = &seeds[rng.below(seeds.len())];
            let input = mutate(a, b, &mut rng);
            run_one(target, check, &input);
        }
        total += seeds.len() + iters;
    }
    println!(
        "fuzz fallback: {total} inputs over {} targets, no failure",
        checks::TARGETS.len()
    );
}
