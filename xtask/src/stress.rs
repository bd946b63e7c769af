//! `cargo xtask ci --stress`: the workspace's tests twice at once on a machine kept busy by
//! a CPU hog, the load under which timing assumptions in tests (or in the engine) break.
//!
//! - The tests are built first, then two `cargo test --workspace` runs start together:
//!   run A in this network namespace, run B in a fresh one (`ip netns`, root), so the
//!   tests that bind fixed loopback ports (the emulated card's UDP 4791, the out-of-band
//!   channel's TCP 60000) do not collide between the runs. Without root both run here and
//!   such collisions are expected: the summary says so.
//! - One busy thread per CPU spins for the whole time.
//! - One row per test binary and run; a failure in either run fails the check.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use crate::{backends, parse_test_output, print_table, run_logged, Row};

const NETNS: &str = "bluerdma-stress";
const TESTS: &str = "cargo test --workspace --no-fail-fast --locked";

/// A namespace with its loopback up, deleted on drop.
struct Netns;

impl Netns {
    fn create() -> Result<Netns, String> {
        // A namespace left by a killed run; usually there is none.
        let _ = Command::new("ip")
            .args(["netns", "del", NETNS])
            .stderr(std::process::Stdio::null())
            .status();
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        if !ok(&["netns", "add", NETNS]) {
            return Err(format!("`ip netns add {NETNS}` failed"));
        }
        let ns = Netns;
        if !ok(&["-n", NETNS, "link", "set", "lo", "up"]) {
            return Err(format!("cannot bring up lo in {NETNS}"));
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", NETNS]).status();
    }
}

/// Busy threads, one per CPU, until dropped.
struct Hog {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<u64>>,
}

impl Hog {
    fn start() -> Hog {
        let n = thread::available_parallelism().map_or(2, |n| n.get());
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        }
                    }
                    x
                })
            })
            .collect();
        println!("stress: {n} busy threads");
        Hog { stop, threads }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs the stress check; its rows, named `A: binary` and `B: binary`.
pub(crate) fn run(root: &Path, logs: &Path) -> Result<(), String> {
    let start = Instant::now();
    println!("stress: building the tests ({TESTS} --no-run)");
    let (built, out) = run_logged(
        root,
        &logs.join("stress_build.log"),
        &format!("{TESTS} --no-run"),
    );
    if !built {
        crate::print_tail(&out, 40);
        return Err("stress: the tests did not build".into());
    }
    let netns = if backends::is_root() {
        Some(Netns::create()?)
    } else {
        println!(
            "stress: not root, so both runs share this network namespace: tests that bind \
             fixed ports may fail for that reason alone"
        );
        None
    };
    let b_cmd = match netns {
        Some(_) => format!("ip netns exec {NETNS} {TESTS}"),
        None => TESTS.to_string(),
    };
    let hog = Hog::start();
    let runs: Vec<(&str, String)> = vec![("A", TESTS.to_string()), ("B", b_cmd)];
    let handles: Vec<_> = runs
        .into_iter()
        .map(|(name, cmd)| {
            let root = root.to_path_buf();
            let log = logs.join(format!("stress_{name}.log"));
            println!("stress: run {name}: {cmd}");
            thread::spawn(move || {
                let (ok, out) = run_logged(&root, &log, &cmd);
                (name, ok, out, log)
            })
        })
        .collect();
    let mut rows: Vec<Row> = Vec::new();
    for h in handles {
        let (name, ok, out, log) = h.join().map_err(|_| "stress: a run panicked")?;
        let mut got = parse_test_output(&out, &log);
        if !ok && got.iter().all(|r| r.failed == 0) {
            got.push(Row::failure(
                "cargo test",
                start.elapsed(),
                format!("failed without a failing test; see {}", log.display()),
            ));
        }
        rows.extend(got.into_iter().map(|mut r| {
            r.suite = format!("{name}: {}", r.suite);
            r
        }));
    }
    drop(hog);
    drop(netns);
    print_table(&rows);
    let passed: u64 = rows.iter().map(|r| r.passed).sum();
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    let t = start.elapsed().as_secs();
    println!(
        "stress: {passed} passed, {failed} failed in {}m{:02}s (two runs at once, CPU hog)",
        t / 60,
        t % 60
    );
    if failed > 0 {
        let failing: Vec<&str> = rows
            .iter()
            .filter(|r| r.failed > 0)
            .map(|r| r.suite.as_str())
            .collect();
        return Err(format!(
            "stress: {failed} failed: {}; logs in {}",
            failing.join(", "),
            logs.display()
        ));
    }
    Ok(())
}
