//! Project automation. Every subcommand is one function; no dependencies beyond std.
//!
//! - `cargo xtask ci`: every check (fmt, clippy, tests, loom, the no_std firmware-target
//!   build), one summary table, non-zero exit on any failure.
//! - `cargo xtask sim`: two emulated NICs in one process and the scenarios run against
//!   them (`platform-sim/src/scenarios.rs`, run through the `sim` example of bluerdma-sim so
//!   that xtask itself stays free of dependencies).
//! - `cargo xtask perftest`: ibverbs-utils and perftest over the libibverbs.so.1 stand-in
//!   on the emulated NIC, next to a TCP baseline (`perftest.rs`).
//! - `cargo xtask shared-perf`: N perftest pairs at once on two devices shared between
//!   processes (`BLUERDMA_SHARED=1`), next to one exclusive pair (`shared_perf.rs`).
//! - `cargo xtask bench`: the headline figures next to their same-run baselines
//!   (`bench.rs`).
//! - `cargo xtask cluster [N]`: UCX and Open MPI over the stand-in on N namespaced nodes
//!   (`cluster.rs`); `ci` runs it with 2 nodes.
//! - `cargo xtask rdmacm`: rdma_cm programs (rping, udaddy, perftest -R) over the
//!   librdmacm.so.1 stand-in (`rdmacm.rs`).
//! - `cargo xtask fuzz [SECS]`: every cargo-fuzz target of tests/fuzz for SECS seconds
//!   (`fuzz.rs`); `ci` runs each for a few seconds.
//! - `cargo xtask pyverbs`: rdma-core's own test suite over the stand-in (`pyverbs.rs`).
//! - `cargo xtask ecosystem`: the Rust RDMA crates (rust-ibverbs, sideway) over the stand-in
//!   (`ecosystem.rs`, programs in examples/ecosystem).

mod backends;
mod bench;
mod cluster;
mod ecosystem;
mod firmware;
mod fuzz;
mod perftest;
mod pyverbs;
mod rdmacm;
mod shared_perf;
mod stress;

use std::env;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The firmware target of the soft-core (issue F) and of the core's no_std check.
const RISCV_TARGET: &str = "riscv32imac-unknown-none-elf";

fn main() -> ExitCode {
    // Every emulated card the tasks start freezes where the RTL stops and fails the test or
    // run that caused it, naming the event (platform-sim/src/model/stops.rs); children
    // inherit it. Set before any thread exists.
    if env::var_os("BLUERDMA_RTL_STOPS").is_none() {
        env::set_var("BLUERDMA_RTL_STOPS", "fail");
    }
    let args: Vec<String> = env::args().skip(1).collect();
    let root = project_root();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(&root, &args[1..]),
        Some("sim") => sim(&root, &args[1..]),
        Some("doctor") => doctor(&root, &args[1..]),
        Some("perftest") => perftest::perftest(&root, &args[1..]),
        Some("shared-perf") => shared_perf::shared_perf(&root, &args[1..]),
        Some("bench") => bench::bench(&root, &args[1..]),
        Some("cluster") => cluster::cluster(&root, &args[1..]),
        Some("rdmacm") => rdmacm::rdmacm(&root, &args[1..]),
        Some("fuzz") => fuzz::fuzz(&root, &args[1..]),
        Some("pyverbs") => pyverbs::pyverbs(&root, &args[1..]),
        Some("ecosystem") => ecosystem::ecosystem(&root, &args[1..]),
        Some("firmware") => firmware::run(&root),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!(
            "unknown subcommand `{other}` (try `cargo xtask help`)"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask <command>\n\n\
         commands:\n  \
         ci [--quick]   fmt, clippy, all tests, loom model, no_std build for {RISCV_TARGET};\n                 \
         prints a summary table and exits non-zero on any failure\n                 \
         (--quick skips the loom model and the firmware-target build, and runs\n                 \
         perftest --quick)\n  \
         ci --stress    only the tests, twice at once (the second in its own network\n                 \
         namespace, root) with a busy thread per CPU: what flakes under load\n  \
         sim [options]  two emulated NICs (blue0 = 127.0.0.1, blue1 = 127.0.0.2) on the UDP\n                 \
         link and the scenarios run against them; a summary table, non-zero exit on\n                 \
         any mismatch: first the card through raw rings, then the driver engine through\n                 \
         the verbs API (--faults SPEC, --pcap FILE, --seed N, --port N, --only TEXT,\n                 \
         --list, --soak SECS, --no-perf; `cargo xtask sim --help` for details);\n                 \
         --backend rtl|pci runs the verbs scenarios on cards served by bluerdma-sim\n                 \
         serve (the RTL protocol) or pci-serve (a fake PCI card, root only); the\n                 \
         cards freeze where the RTL stops and the run fails naming the event\n                 \
         (BLUERDMA_RTL_STOPS=continue lets them carry on)\n  \
         doctor [opts]  checks this machine for the real card and prints the fix for each\n                 \
         problem (`cargo xtask doctor --help`)\n  \
         perftest [opts] ibverbs-utils and perftest (ib_write_bw, ...) over\n                 \
         target/ibverbs/libibverbs.so.1 on the emulated NIC, with a TCP baseline;\n                 \
         a table, non-zero exit on any failure (`cargo xtask perftest --help`)\n  \
         shared-perf [opts] N perftest pairs at once (default 1, 2, 4) on the two devices\n                 \
         shared by all tools (BLUERDMA_SHARED=1, one bluerdma-devd per device), each\n                 \
         pair's figure and the sum next to one exclusive pair, and the post_send rate\n                 \
         of N processes; also `perftest --shared N` (`cargo xtask shared-perf --help`)\n  \
         bench [opts]   the headline figures (ib_write_bw, ib_write_lat, post_send rate, CPU\n                 \
         per GB) each next to its same-run baseline (`cargo xtask bench --help`)\n  \
         cluster [N]    UCX (ucx_info, ucx_perftest) and an MPI test on N emulated nodes\n                 \
         (namespaces on a bridge), then over UCX's TCP; needs root, not in ci\n                 \
         (`cargo xtask cluster --help`)\n  \
         rdmacm [opts]  rping, udaddy, rdma_server/rdma_client and perftest -R over\n                 \
         target/ibverbs/librdmacm.so.1, then the crate's tests (`cargo xtask rdmacm --help`)\n  \
         pyverbs [opts] rdma-core's own tests (python3-pyverbs) over target/ibverbs/; needs\n                 \
         root (`cargo xtask pyverbs --help`)\n  \
         ecosystem [opts] the Rust crates rust-ibverbs and sideway (crates.io) over\n                 \
         target/ibverbs/: a WRITE and a SEND per crate (`cargo xtask ecosystem --help`)\n  \
         firmware       the firmware rows of ci alone: build, size, core with defmt, QEMU boot\n  \
         fuzz [SECS]    every fuzz target of tests/fuzz for SECS seconds (default 60; nightly\n                 \
         and cargo-fuzz); a table of runs and crashes, non-zero exit on a crash"
    );
}

fn project_root() -> PathBuf {
    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    Path::new(&manifest)
        .ancestors()
        .nth(1)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Builds and runs both halves of the emulated-NIC scenarios in release mode: the card's
/// raw-ring scenarios (the `sim` example of bluerdma-sim) and the driver engine's verbs
/// scenarios, soak and measurements (the `sim` example of bluerdma-linux). Options go to
/// the half that knows them: `--soak SECS` and `--no-perf` to the verbs half, `--pcap`,
/// `--only` and `--list` to the raw half, `--faults`, `--seed` and `--port` to both (the
/// verbs half uses the next port).
fn sim(root: &Path, args: &[String]) -> Result<(), String> {
    if let Some(i) = args.iter().position(|a| a == "--backend") {
        let backend = backends::Backend::parse(args.get(i + 1).map_or("", String::as_str))?;
        let rest: Vec<String> = [&args[..i], args.get(i + 2..).unwrap_or(&[])].concat();
        if backend != backends::Backend::Emulated {
            return backends::sim(root, backend, &rest);
        }
        return sim(root, &rest);
    }
    let mut raw: Vec<String> = Vec::new();
    let mut verbs: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.clone().next().cloned();
        match a.as_str() {
            "--soak" => {
                verbs.push(a.clone());
                verbs.extend(it.next().cloned());
            }
            "--no-perf" => verbs.push(a.clone()),
            "--faults" | "--seed" => {
                let v = it.next().cloned().unwrap_or_default();
                raw.extend([a.clone(), v.clone()]);
                verbs.extend([a.clone(), v]);
            }
            "--port" => {
                let v = it.next().cloned().unwrap_or_default();
                let next = v
                    .parse::<u16>()
                    .map(|p| p.wrapping_add(1).to_string())
                    .unwrap_or(v.clone());
                raw.extend([a.clone(), v]);
                verbs.extend([a.clone(), next]);
            }
            "--help" | "-h" | "--list" => {
                raw.push(a.clone());
                verbs.clear();
                verbs.push("--help".into());
            }
            _ => {
                raw.push(a.clone());
                if let Some(v) = value.filter(|v| !v.starts_with("--")) {
                    if matches!(a.as_str(), "--pcap" | "--only") {
                        raw.push(v);
                        it.next();
                    }
                }
            }
        }
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let run = |pkg: &str, args: &[String]| -> Result<bool, String> {
        let status = Command::new(&cargo)
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                pkg,
                "--example",
                "sim",
                "--",
            ])
            .args(args)
            .current_dir(root)
            .status()
            .map_err(|e| format!("cannot start `{cargo} run`: {e}"))?;
        Ok(status.success())
    };
    println!("== sim: the emulated card through raw rings (platform-sim)");
    let raw_ok = run("bluerdma-sim", &raw)?;
    println!();
    println!("== sim: the driver engine through the verbs API (platform-linux)");
    let verbs_ok = run("bluerdma-linux", &verbs)?;
    match (raw_ok, verbs_ok) {
        (true, true) => Ok(()),
        (false, true) => Err("sim: raw-ring scenarios failed".into()),
        (true, false) => Err("sim: verbs scenarios failed".into()),
        (false, false) => Err("sim: raw-ring and verbs scenarios failed".into()),
    }
}

/// Checks this machine for the real card (privileges, hugepages, pagemap, u-dma-buf, the
/// PCI device and its BAR) and prints the command that fixes each failure.
fn doctor(root: &Path, args: &[String]) -> Result<(), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "run",
            "--quiet",
            "-p",
            "bluerdma-linux",
            "--bin",
            "bluerdma-doctor",
            "--",
        ])
        .args(args)
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot start `{cargo} run`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("doctor found problems (see above)".into())
    }
}

/// One row of the summary table.
pub(crate) struct Row {
    suite: String,
    passed: u64,
    failed: u64,
    time: Duration,
    note: String,
}

impl Row {
    /// A check that could not run at all: one failure, and why.
    fn failure(suite: impl Into<String>, time: Duration, note: String) -> Row {
        Row {
            suite: suite.into(),
            passed: 0,
            failed: 1,
            time,
            note,
        }
    }
}

/// Runs every check and prints one summary table.
fn ci(root: &Path, args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let start = Instant::now();
    let logs = root.join("target").join("xtask");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    if args.iter().any(|a| a == "--stress") {
        return stress::run(root, &logs);
    }
    let mut rows: Vec<Row> = Vec::new();

    // Everything the checks need comes first (apt packages, the riscv32 target, nightly and
    // cargo-fuzz), so a fresh machine passes the README's two commands in either order.
    // `.ci/run` has run the same script already.
    if std::env::var_os("BLUERDMA_CI_INSTALLED").is_some() {
        println!("ci: install: done by .ci/run");
    } else if backends::is_root() {
        rows.push(check(
            root,
            &logs,
            "install (.ci/install)",
            "bash .ci/install",
        ));
    } else {
        println!(
            "ci: install: not root, so nothing is installed; the checks that need a missing \
             package fail and name it (run `sudo bash .ci/install` once)"
        );
    }
    rows.push(check(root, &logs, "fmt", "cargo fmt --all -- --check"));
    rows.push(check(
        root,
        &logs,
        "clippy",
        "cargo clippy --workspace --all-targets --locked -- -D warnings",
    ));
    rows.extend(test_suites(
        root,
        &logs,
        "cargo test --workspace --no-fail-fast --locked",
    ));
    rows.push(fuzz::ci_row(root, &logs));
    rows.push(check(
        root,
        &logs,
        "bluerdma-linux without the emulator",
        "cargo test -p bluerdma-linux --no-default-features --locked && \
         ! cargo tree -p bluerdma-linux --no-default-features -e normal | grep bluerdma-sim",
    ));
    if quick {
        println!("ci: --quick: skipping the loom model and the {RISCV_TARGET} build");
    } else {
        rows.push(check(
            root,
            &logs,
            "loom model (ring protocol)",
            "RUSTFLAGS='--cfg loom' CARGO_TARGET_DIR=target/loom \
             cargo test -p bluerdma-core --test ring_loom --release --locked",
        ));
        rows.push(no_std_build(root, &logs));
        rows.extend(firmware::firmware_checks(root, &logs));
    }
    rows.push(perftest::ci_row(root, quick, backends::Backend::Emulated));
    rows.push(shared_perf::ci_row(root));
    rows.push(rdmacm::ci_row(root));
    rows.push(ecosystem::ci_row(root));
    rows.push(pyverbs::ci_row(root));
    // The other backends at sizes that keep CI short (the fake PCI card needs root).
    for backend in [backends::Backend::Rtl, backends::Backend::Pci] {
        rows.push(backends::ci_sim_row(root, backend));
        rows.push(perftest::ci_row(root, true, backend));
    }
    if quick {
        println!("ci: --quick: skipping the cluster run");
    } else {
        rows.push(cluster::ci_row(root));
    }

    print_table(&rows);
    let passed: u64 = rows.iter().map(|r| r.passed).sum();
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    let total = start.elapsed().as_secs();
    println!(
        "ci: {passed} passed, {failed} failed in {}m{:02}s (wall, builds included)",
        total / 60,
        total % 60
    );
    if failed > 0 {
        Err(format!(
            "{failed} check(s) failed; logs in {}",
            logs.display()
        ))
    } else {
        Ok(())
    }
}

/// Runs `cmd` through the shell in `root`, teeing its output to `log`; returns success and
/// the captured output.
pub(crate) fn run_logged(root: &Path, log: &Path, cmd: &str) -> (bool, String) {
    let mut child = match Command::new("bash")
        .arg("-c")
        .arg(format!("{cmd} 2>&1"))
        .current_dir(root)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (false, format!("cannot start `{cmd}`: {e}")),
    };
    let mut out = String::new();
    let mut file = std::fs::File::create(log).ok();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
    (ok, out)
}

fn log_path(logs: &Path, suite: &str) -> PathBuf {
    let name: String = suite
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    logs.join(format!("{name}.log"))
}

/// A check that passes or fails as a whole.
fn check(root: &Path, logs: &Path, suite: &str, cmd: &str) -> Row {
    println!("ci: {suite}: {cmd}");
    let start = Instant::now();
    let log = log_path(logs, suite);
    let (ok, out) = run_logged(root, &log, cmd);
    if !ok {
        print_tail(&out, 40);
    }
    Row {
        suite: suite.into(),
        passed: ok as u64,
        failed: !ok as u64,
        time: start.elapsed(),
        note: if ok {
            String::new()
        } else {
            format!("see {}", log.display())
        },
    }
}

/// Runs the workspace tests once and makes one row per test binary.
fn test_suites(root: &Path, logs: &Path, cmd: &str) -> Vec<Row> {
    println!("ci: tests: {cmd}");
    let start = Instant::now();
    let log = log_path(logs, "tests");
    let (ok, out) = run_logged(root, &log, cmd);
    let mut rows = parse_test_output(&out, &log);
    let counted_failures: u64 = rows.iter().map(|r| r.failed).sum();
    if !ok {
        print_tail(&out, 60);
        if counted_failures == 0 {
            // A build error: no test binary ran, so no row says so.
            rows.push(Row::failure(
                "tests (build)",
                start.elapsed(),
                format!("see {}", log.display()),
            ));
        }
    }
    rows
}

/// One row per test binary in the output of `cargo test`. A binary that started but printed
/// no `test result:` line crashed (signal, abort, exit from a test) and counts as one failure.
pub(crate) fn parse_test_output(out: &str, log: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut current: Option<String> = None;
    let crashed = |suite: String| {
        Row::failure(
            suite,
            Duration::ZERO,
            format!("crashed before its summary; see {}", log.display()),
        )
    };
    for line in out.lines() {
        let t = line.trim();
        let started = if let Some(rest) = t.strip_prefix("Running ") {
            Some(suite_name(rest))
        } else {
            t.strip_prefix("Doc-tests ")
                .map(|name| format!("doc {name}"))
        };
        if let Some(next) = started {
            rows.extend(current.replace(next).map(crashed));
        } else if let Some(res) = t.strip_prefix("test result: ") {
            let (p, f) = parse_counts(res);
            if let Some(suite) = current.take() {
                if p + f > 0 {
                    rows.push(Row {
                        suite,
                        passed: p,
                        failed: f,
                        time: parse_secs(res),
                        note: if f > 0 {
                            format!("see {}", log.display())
                        } else {
                            String::new()
                        },
                    });
                }
            }
        }
    }
    rows.extend(current.map(crashed));
    rows
}

/// `unittests src/lib.rs (target/debug/deps/bluerdma_core-1234)` -> `bluerdma_core unit`;
/// `tests/golden_desc.rs (...)` -> `golden_desc`.
fn suite_name(running: &str) -> String {
    let (what, bin) = match running.split_once(" (") {
        Some((w, b)) => (w, b.trim_end_matches(')')),
        None => (running, ""),
    };
    let bin = Path::new(bin)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("")
        .rsplit_once('-')
        .map(|(n, _)| n.to_string())
        .unwrap_or_default();
    let what = what.trim_start_matches("unittests ");
    let stem = Path::new(what)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(what);
    match stem {
        "lib" | "main" => format!("{bin} unit"),
        _ => stem.to_string(),
    }
}

fn parse_counts(res: &str) -> (u64, u64) {
    let mut passed = 0;
    let mut failed = 0;
    for part in res.split([';', '.']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(kind)) = (words.next(), words.next()) {
            if let Ok(n) = n.parse::<u64>() {
                match kind {
                    "passed" => passed = n,
                    "failed" => failed = n,
                    _ => {}
                }
            }
        }
    }
    (passed, failed)
}

fn parse_secs(res: &str) -> Duration {
    res.split("finished in ")
        .nth(1)
        .and_then(|s| s.trim_end_matches('s').trim().parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or_default()
}

/// The core must build for the soft-core target with no std and no alloc. If the target
/// cannot be installed, say so loudly and fall back to a host build of the no_std crate.
fn no_std_build(root: &Path, logs: &Path) -> Row {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(RISCV_TARGET))
        .unwrap_or(false);
    let have = installed || {
        println!("ci: installing {RISCV_TARGET} (timeout 180 s)");
        Command::new("timeout")
            .args(["180", "rustup", "target", "add", RISCV_TARGET])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if have {
        let mut row = check(
            root,
            logs,
            "no_std core for riscv32imac",
            &format!("cargo build -p bluerdma-core --target {RISCV_TARGET} --release --locked"),
        );
        row.note = if row.failed == 0 {
            format!("built for {RISCV_TARGET}")
        } else {
            row.note
        };
        row
    } else {
        let banner = "!".repeat(78);
        eprintln!("{banner}");
        eprintln!("!! WARNING: the {RISCV_TARGET} target could not be installed.");
        eprintln!("!! The no_std check falls back to a HOST build of bluerdma-core; it does NOT");
        eprintln!("!! prove that the core builds for the soft-core. Fix: rustup target add {RISCV_TARGET}");
        eprintln!("{banner}");
        let mut row = check(
            root,
            logs,
            "no_std core (HOST FALLBACK)",
            "cargo build -p bluerdma-core --release --locked",
        );
        row.note = format!("FALLBACK: {RISCV_TARGET} unavailable");
        row
    }
}

pub(crate) fn print_tail(out: &str, n: usize) {
    let lines: Vec<&str> = out.lines().collect();
    let from = lines.len().saturating_sub(n);
    for l in &lines[from..] {
        eprintln!("  | {l}");
    }
}

pub(crate) fn print_table(rows: &[Row]) {
    let w = rows.iter().map(|r| r.suite.len()).max().unwrap_or(5).max(5);
    println!();
    println!(
        "{:<w$}  {:>7}  {:>7}  {:>9}  note",
        "suite", "passed", "failed", "time"
    );
    println!("{}", "-".repeat(w + 40));
    for r in rows {
        println!(
            "{:<w$}  {:>7}  {:>7}  {:>8.1}s  {}",
            r.suite,
            r.passed,
            r.failed,
            r.time.as_secs_f64(),
            r.note
        );
    }
    println!("{}", "-".repeat(w + 40));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_libtest_summaries() {
        let (p, f) = parse_counts(
            "ok. 10 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
        );
        assert_eq!((p, f), (10, 0));
        let (p, f) = parse_counts(
            "FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s",
        );
        assert_eq!((p, f), (3, 2));
        assert_eq!(
            parse_secs("ok. 1 passed; finished in 1.50s"),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn a_binary_without_a_summary_counts_as_failed() {
        let out = "\
     Running unittests src/lib.rs (target/debug/deps/bluerdma_core-22212384905e3e03)
test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s
     Running tests/ring_model.rs (target/debug/deps/ring_model-0123)
running 1 test
error: test failed, to rerun pass `-p bluerdma-core --test ring_model`
process didn't exit successfully: (signal: 6, SIGABRT: process abort signal)
     Running tests/golden_desc.rs (target/debug/deps/golden_desc-0123)
test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s
   Doc-tests bluerdma_core
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
     Running tests/wire_fuzz.rs (target/debug/deps/wire_fuzz-0123)
running 3 tests
";
        let rows = parse_test_output(out, Path::new("tests.log"));
        let table: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.suite.as_str(), r.passed, r.failed))
            .collect();
        assert_eq!(
            table,
            [
                ("bluerdma_core unit", 5, 0),
                ("ring_model", 0, 1),
                ("golden_desc", 2, 1),
                ("wire_fuzz", 0, 1),
            ]
        );
    }

    #[test]
    fn suite_names_say_crate_and_file() {
        assert_eq!(
            suite_name("unittests src/lib.rs (target/debug/deps/bluerdma_core-22212384905e3e03)"),
            "bluerdma_core unit"
        );
        assert_eq!(
            suite_name("tests/golden_desc.rs (target/debug/deps/golden_desc-0123)"),
            "golden_desc"
        );
    }
}
