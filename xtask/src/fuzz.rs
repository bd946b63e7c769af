//! `cargo xtask fuzz [SECS] [TARGET...]`: builds the cargo-fuzz crate (tests/fuzz, nightly,
//! no sanitizer: the decoders are safe Rust, and debug assertions and overflow checks stay
//! on) and runs each target for SECS seconds (default 60) from its committed seeds
//! (tests/fuzz/seeds/<target>) and its working corpus (target/fuzz/corpus/<target>, kept
//! between runs). Prints a table of target, runs (execs), execs per second, the CPU seconds
//! the target got and execs per CPU second (the figure that survives a loaded machine) and
//! crashes; fails if any target crashed. A crash input is saved under target/fuzz/artifacts/<target>/.
//!
//! `cargo xtask ci` runs every target for [`CI_SECS`] seconds ([`ci_row`]). Without nightly
//! or cargo-fuzz it says FALLBACK and runs the same checks on stable over the seeds and
//! their mutations (tests/tests/fuzz_fallback.rs) instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::{check, Row};

/// Seconds per target in `cargo xtask ci`.
pub const CI_SECS: u64 = 3;

/// The fuzz crate, relative to the repository root.
const FUZZ_DIR: &str = "tests/fuzz";

/// What one target's run gave.
struct Run {
    target: String,
    execs: u64,
    secs: f64,
    /// CPU seconds the target used (user + system): on a loaded machine a target gets a
    /// share of a core, so execs per CPU second is the figure that compares across runs.
    cpu: f64,
    crashed: bool,
    note: String,
}

/// libFuzzer options of single targets beyond the common ones.
const EXTRA_OPTIONS: &[(&str, &str)] = &[
    // Fed in chunks of one byte, a 4 KiB stream costs 4096 reads per input; 1 KiB streams
    // still hold lines over every bound the target picks (1..=256).
    ("rtl_lines", "-max_len=1024"),
];

/// CPU seconds (user + system) of this process's waited-for children so far: fields 16 and
/// 17 of /proc/self/stat, in clock ticks of 1/100 s (Linux's USER_HZ).
fn children_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `after` starts at field 3, so fields 16 and 17 are at 13 and 14.
    (tick(13) + tick(14)) as f64 / 100.0
}

/// Whether nightly and cargo-fuzz are there; `Err` names what is missing and how to get it.
fn tools() -> Result<(), String> {
    let ok = |args: &[&str]| {
        rustup_free(Command::new("cargo"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut missing = Vec::new();
    if !ok(&["+nightly", "--version"]) {
        missing.push("the nightly toolchain (rustup toolchain install nightly --profile minimal)");
    }
    if !ok(&["fuzz", "--version"]) {
        missing.push("cargo-fuzz (cargo install cargo-fuzz --locked)");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("missing {}", missing.join(" and ")))
    }
}

/// `cmd` without the variables of the cargo that runs xtask, so that `+nightly` applies.
fn rustup_free(mut cmd: Command) -> Command {
    for v in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "CARGO",
        "RUSTC_WRAPPER",
    ] {
        cmd.env_remove(v);
    }
    cmd
}

/// The targets of the fuzz crate, in its manifest's order.
fn targets(root: &Path) -> Result<Vec<String>, String> {
    let manifest = root.join(FUZZ_DIR).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let mut out = Vec::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(name) = line.strip_prefix("name = \"").filter(|_| in_bin) {
            out.push(name.trim_end_matches('"').to_string());
        }
    }
    Ok(out)
}

fn build_dir(root: &Path) -> PathBuf {
    root.join("target").join("fuzz").join("build")
}

/// Builds every target; `Err` has the tail of cargo's output.
fn build(root: &Path) -> Result<(), String> {
    println!("fuzz: building the targets (cargo +nightly fuzz build, no sanitizer)");
    let out = rustup_free(Command::new("cargo"))
        .args([
            "+nightly",
            "fuzz",
            "build",
            "--fuzz-dir",
            FUZZ_DIR,
            "-s",
            "none",
        ])
        .arg("--target-dir")
        .arg(build_dir(root))
        .current_dir(root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(30).collect();
    for l in tail.iter().rev() {
        eprintln!("  | {l}");
    }
    Err("cargo fuzz build failed (see above)".into())
}

/// Runs one built target for `secs` seconds.
fn run(root: &Path, target: &str, secs: u64) -> Run {
    let bin = build_dir(root)
        .join(host_triple())
        .join("release")
        .join(target);
    let fuzz = root.join("target").join("fuzz");
    let corpus = fuzz.join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    let seeds = root.join(FUZZ_DIR).join("seeds").join(target);
    for d in [&corpus, &artifacts] {
        let _ = std::fs::create_dir_all(d);
    }
    let before = count_files(&artifacts);
    let extra = EXTRA_OPTIONS
        .iter()
        .filter(|(t, _)| *t == target)
        .map(|(_, o)| *o);
    let start = Instant::now();
    let cpu_before = children_cpu();
    let out = Command::new(&bin)
        .arg(format!("-max_total_time={secs}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .args(extra)
        .arg(&corpus)
        .arg(&seeds)
        .stdin(Stdio::null())
        .output();
    let secs = start.elapsed().as_secs_f64();
    let cpu = children_cpu() - cpu_before;
    let (ok, text) = match out {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ),
        Err(e) => (false, format!("cannot run {}: {e}", bin.display())),
    };
    let log = fuzz.join(format!("{target}.log"));
    let _ = std::fs::write(&log, &text);
    let execs = final_execs(&text).unwrap_or(0);
    let crashed = !ok || count_files(&artifacts) > before;
    let note = if crashed {
        let why = text
            .lines()
            .find(|l| l.contains("panicked at") || l.contains("ERROR: libFuzzer"))
            .unwrap_or("no summary")
            .trim()
            .to_string();
        format!(
            "{why}; log {}, input in {}",
            log.display(),
            artifacts.display()
        )
    } else {
        String::new()
    };
    Run {
        target: target.into(),
        execs,
        secs,
        cpu,
        crashed,
        note,
    }
}

/// The number of executed inputs from libFuzzer's final stats (or its `Done N runs` line).
fn final_execs(text: &str) -> Option<u64> {
    let stat = text.lines().find_map(|l| {
        l.trim()
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    });
    stat.or_else(|| {
        text.lines().rev().find_map(|l| {
            let rest = l.trim().strip_prefix("Done ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
    })
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// The host triple the targets are built for (cargo fuzz's default `--target`).
fn host_triple() -> String {
    let out = Command::new("rustc").arg("-vV").output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        })
        .unwrap_or_else(|| "x86_64-unknown-linux-gnu".into())
}

fn print_runs(runs: &[Run]) {
    println!();
    println!(
        "{:<16} {:>12} {:>10} {:>7} {:>12} {:>7}  note",
        "target", "runs", "execs/s", "cpu s", "execs/cpu-s", "crashes"
    );
    println!("{}", "-".repeat(78));
    for r in runs {
        println!(
            "{:<16} {:>12} {:>10.0} {:>7.1} {:>12.0} {:>7}  {}",
            r.target,
            r.execs,
            r.execs as f64 / r.secs.max(1e-9),
            r.cpu,
            r.execs as f64 / r.cpu.max(1e-9),
            r.crashed as u8,
            r.note
        );
    }
    println!("{}", "-".repeat(78));
}

/// Builds and runs the targets; the table, then `Err` if any crashed.
fn run_all(root: &Path, secs: u64, only: &[String]) -> Result<Vec<Run>, String> {
    tools()?;
    build(root)?;
    let all = targets(root)?;
    if let Some(bad) = only.iter().find(|t| !all.contains(t)) {
        return Err(format!(
            "no fuzz target `{bad}` (targets: {})",
            all.join(", ")
        ));
    }
    let mut runs = Vec::new();
    for t in all.iter().filter(|t| only.is_empty() || only.contains(t)) {
        println!("fuzz: {t} for {secs} s");
        runs.push(run(root, t, secs));
    }
    print_runs(&runs);
    Ok(runs)
}

/// `cargo xtask fuzz [SECS] [TARGET...]`.
pub fn fuzz(root: &Path, args: &[String]) -> Result<(), String> {
    let mut secs = 60;
    let mut only = Vec::new();
    for a in args {
        match a.parse::<u64>() {
            Ok(n) if n > 0 => secs = n,
            _ if a == "--help" || a == "-h" => {
                println!(
                    "cargo xtask fuzz [SECS] [TARGET...]: run each fuzz target (tests/fuzz) for \
                     SECS seconds (default 60); needs nightly and cargo-fuzz"
                );
                return Ok(());
            }
            _ => only.push(a.clone()),
        }
    }
    let runs = run_all(root, secs, &only)?;
    let crashed: Vec<&str> = runs
        .iter()
        .filter(|r| r.crashed)
        .map(|r| r.target.as_str())
        .collect();
    if crashed.is_empty() {
        println!("fuzz: {} passed, 0 failed", runs.len());
        Ok(())
    } else {
        Err(format!("fuzz: crashes in {}", crashed.join(", ")))
    }
}

/// The fuzz row of `cargo xtask ci`: every target for [`CI_SECS`] seconds, failing on a
/// crash. Without nightly or cargo-fuzz: a loud FALLBACK to the stable run of the same
/// checks over the seeds and their mutations.
pub fn ci_row(root: &Path, logs: &Path) -> Row {
    let suite = "fuzz targets";
    if let Err(missing) = tools() {
        let banner = "!".repeat(78);
        eprintln!("{banner}");
        eprintln!("!! WARNING: fuzzing needs what is not installed here: {missing}.");
        eprintln!("!! The fuzz row falls back to the targets' checks on STABLE over the seeds and");
        eprintln!("!! 50000 mutations each (tests/tests/fuzz_fallback.rs): no coverage guidance.");
        eprintln!("{banner}");
        let mut row = check(
            root,
            logs,
            "fuzz (FALLBACK: stable mutations)",
            "BLUERDMA_FUZZ_FALLBACK_ITERS=50000 cargo test -p bluerdma-tests \
             --test fuzz_fallback --release --locked",
        );
        row.note = format!("FALLBACK: {missing}");
        return row;
    }
    let start = Instant::now();
    match run_all(root, CI_SECS, &[]) {
        Ok(runs) => {
            let crashed: Vec<&Run> = runs.iter().filter(|r| r.crashed).collect();
            let execs: u64 = runs.iter().map(|r| r.execs).sum();
            Row {
                suite: suite.into(),
                passed: (runs.len() - crashed.len()) as u64,
                failed: crashed.len() as u64,
                time: start.elapsed(),
                note: match crashed.first() {
                    None => format!("{} targets x {CI_SECS} s, {execs} runs", runs.len()),
                    Some(r) => format!("{} crashed: {}", r.target, r.note),
                },
            }
        }
        Err(e) => {
            eprintln!("ci: {suite}: {e}");
            Row {
                suite: suite.into(),
                passed: 0,
                failed: 1,
                time: start.elapsed(),
                note: e,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execs_come_from_the_final_stats_or_the_done_line() {
        let stats = "#2\tINITED\nDone 1476805 runs in 16 second(s)\n\
                     stat::number_of_executed_units: 1476811\nstat::peak_rss_mb: 40\n";
        assert_eq!(final_execs(stats), Some(1_476_811));
        assert_eq!(final_execs("Done 42 runs in 1 second(s)\n"), Some(42));
        assert_eq!(final_execs("==1== ERROR: libFuzzer: deadly signal\n"), None);
    }

    #[test]
    fn every_target_of_the_fuzz_crate_is_found() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let t = targets(root).unwrap();
        assert!(t.len() >= 16, "{t:?}");
        assert!(t
            .iter()
            .all(|n| root.join(FUZZ_DIR).join("seeds").join(n).is_dir()));
        assert!(!t.iter().any(|n| n == "bluerdma-fuzz"));
    }
}
