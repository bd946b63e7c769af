//! `cargo xtask pyverbs` (issue J2): rdma-core's own test suite (pyverbs, Debian's
//! python3-pyverbs, shipped under /usr/share/doc/rdma-core/tests), unmodified, over the
//! libibverbs.so.1 stand-in with `--dev bluerdma0 --gid 0`.
//!
//! 1. Builds the stand-ins into `target/ibverbs/` ([`perftest::build_library`]).
//! 2. Installs python3-pyverbs with apt-get if the shipped tests are missing.
//! 3. Runs the generic modules ([`MODULES`]) through `tests/pyverbs/run.sh` (root: a private
//!    mount namespace for the sysfs view the tests read, and a private network namespace so
//!    that the devices' ports meet no other test's), verbose, into
//!    `target/xtask/pyverbs/pyverbs.log`.
//! 4. Reads unittest's summary (`Ran N tests`, `OK` / `FAILED (failures=, errors=,
//!    skipped=)`), the names of the tests that failed or errored and every skip reason, and
//!    prints them as a table.
//!
//! It fails on any FAIL or ERROR, except the ones listed in [`KNOWN`], each with the reason
//! and what would fix it; a known one that passes fails the run too, so that the list is
//! kept true. Skips are the tests' own: they raise unittest.SkipTest when the device says it
//! lacks a feature (no ODP, no memory windows, ...), and the table lists each reason.
//!
//! Wiring (main.rs): `mod pyverbs;`, `Some("pyverbs") => pyverbs::pyverbs(&root, &args[1..])`,
//! and in `ci`: `rows.push(pyverbs::ci_row(&root));`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::backends::is_root;
use super::perftest::{self, Exit};
use super::Row;

/// The generic modules (the rest are vendor-specific: mlx5, efa, cuda; test_rdmacm needs
/// two processes on one device, issue N, and has its own script, run_rdmacm.sh).
pub const MODULES: &[&str] = &[
    "test_addr",
    "test_atomic",
    "test_cq",
    "test_cq_events",
    "test_cqex",
    "test_device",
    "test_fork",
    "test_mr",
    "test_pd",
    "test_qp",
    "test_qpex",
    "test_relaxed_ordering",
    "test_shared_pd",
    "test_odp",
    "test_parent_domain",
];

/// Tests that fail or error for a reason outside this library, and what would fix it.
/// (test_qp_ex_rc_rdma_read_zero_size was here until the engine took zero-length READs,
/// test_mw_type2_invalidate_remote until SEND_WITH_INV was built.)
const KNOWN: &[(&str, &str)] = &[];

/// Where the shipped tests are.
const SHIPPED: &str = "/usr/share/doc/rdma-core/tests";
/// The limit of the whole run (it takes seconds; the script's own `timeout` ends it).
const RUN_LIMIT: Duration = Duration::from_secs(600);

const USAGE: &str = "\
usage: cargo xtask pyverbs [--only MODULE]...

Builds target/ibverbs/libibverbs.so.1 (the blue-rdma stand-in) and runs rdma-core's own
test suite (Debian's python3-pyverbs, /usr/share/doc/rdma-core/tests) over it, unmodified,
with --dev bluerdma0 --gid 0: the generic modules (test_addr, test_atomic, test_cq, ...,
test_parent_domain). Needs root (tests/pyverbs/run.sh uses private mount and network
namespaces). Installs python3-pyverbs with apt-get if it is missing. Prints the counts,
every FAIL and ERROR and every skip reason; fails on a FAIL or ERROR not listed as known.

options:
  --only MODULE   run this module only (repeatable), e.g. --only test_qpex
";

/// What unittest said.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    pub ran: u64,
    pub failures: u64,
    pub errors: u64,
    pub skipped: u64,
    /// `expected failures` and `unexpected successes` (none in these modules).
    pub other: u64,
    /// The names of the tests that failed or errored, with the kind.
    pub bad: Vec<(String, &'static str)>,
    /// Skip reason -> how many tests gave it.
    pub skips: BTreeMap<String, u64>,
}

impl Summary {
    pub fn ok(&self) -> u64 {
        self.ran
            .saturating_sub(self.failures + self.errors + self.skipped + self.other)
    }

    /// The failures and errors not in [`KNOWN`], and the known ones that did not fail.
    fn verdict(&self) -> (Vec<String>, Vec<&'static str>) {
        self.verdict_with(KNOWN)
    }

    /// [`Summary::verdict`] against the list `known`.
    fn verdict_with(&self, known: &[(&'static str, &str)]) -> (Vec<String>, Vec<&'static str>) {
        let unknown = self
            .bad
            .iter()
            .filter(|(t, _)| !known.iter().any(|(k, _)| k == t))
            .map(|(t, kind)| format!("{kind}: {t}"))
            .collect();
        let fixed = known
            .iter()
            .filter(|(k, _)| !self.bad.iter().any(|(t, _)| t == k))
            .map(|(k, _)| *k)
            .collect();
        (unknown, fixed)
    }
}

/// Reads the output of `run_tests.py -v`: the summary at its end, the `FAIL:` / `ERROR:`
/// headings of the report and the `skipped '...'` of each test line. The library's log
/// lines interleave with unittest's (both write to stderr), so each piece is matched on its
/// own, not by line position. None if there is no `Ran N tests` line (the run broke).
pub fn parse(out: &str) -> Option<Summary> {
    let mut s = Summary::default();
    let mut ran = None;
    for line in out.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Ran ") {
            ran = rest.split_whitespace().next().and_then(|n| n.parse().ok());
        }
        for (head, kind) in [("FAIL: ", "FAIL"), ("ERROR: ", "ERROR")] {
            if let Some(rest) = t.strip_prefix(head) {
                let name = rest.split_whitespace().next().unwrap_or(rest);
                s.bad.push((name.to_string(), kind));
            }
        }
        if let Some(at) = line.find("skipped '") {
            let reason = &line[at + "skipped '".len()..];
            let reason = reason.strip_suffix('\'').unwrap_or(reason);
            *s.skips.entry(reason.to_string()).or_default() += 1;
        }
        let counts = t
            .strip_prefix("FAILED (")
            .or_else(|| t.strip_prefix("OK ("))
            .and_then(|r| r.strip_suffix(')'));
        if let Some(counts) = counts {
            for part in counts.split(", ") {
                let (key, n) = part.split_once('=').unwrap_or((part, "0"));
                let n: u64 = n.parse().unwrap_or(0);
                match key {
                    "failures" => s.failures = n,
                    "errors" => s.errors = n,
                    "skipped" => s.skipped = n,
                    _ => s.other += n,
                }
            }
        }
    }
    s.ran = ran?;
    Some(s)
}

/// `cargo xtask pyverbs [--only MODULE]...`.
pub fn pyverbs(root: &Path, args: &[String]) -> Result<(), String> {
    let mut only: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--only" => only.push(it.next().ok_or("pyverbs: --only needs a module")?.clone()),
            "--help" | "-h" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("pyverbs: unknown option `{other}`\n{USAGE}")),
        }
    }
    let modules: Vec<&str> = if only.is_empty() {
        MODULES.to_vec()
    } else {
        only.iter().map(String::as_str).collect()
    };
    let (s, log) = run(root, &modules)?;
    report(&s, &log);
    let (unknown, fixed) = s.verdict();
    if unknown.is_empty() && (fixed.is_empty() || !only.is_empty()) {
        Ok(())
    } else {
        Err(problems(&unknown, &fixed))
    }
}

/// The row of `cargo xtask ci`: the passing tests, and one failure per unknown FAIL or
/// ERROR (or known one that passed).
pub fn ci_row(root: &Path) -> Row {
    println!("ci: pyverbs: rdma-core's tests over target/ibverbs/libibverbs.so.1");
    let start = Instant::now();
    let suite = "pyverbs (rdma-core's tests)".to_string();
    match run(root, MODULES) {
        Ok((s, log)) => {
            report(&s, &log);
            let (unknown, fixed) = s.verdict();
            let failed = (unknown.len() + fixed.len()) as u64;
            Row {
                suite,
                passed: s.ok(),
                failed,
                time: start.elapsed(),
                note: if failed == 0 {
                    format!(
                        "{} ok, {} skipped, {} known ({})",
                        s.ok(),
                        s.skipped,
                        s.bad.len(),
                        s.bad
                            .iter()
                            .map(|b| b.0.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    format!("{}; see {}", problems(&unknown, &fixed), log.display())
                },
            }
        }
        Err(e) => {
            eprintln!("ci: pyverbs: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

fn problems(unknown: &[String], fixed: &[&str]) -> String {
    let mut p = Vec::new();
    if !unknown.is_empty() {
        p.push(format!("pyverbs: {}", unknown.join(", ")));
    }
    if !fixed.is_empty() {
        p.push(format!(
            "pyverbs: known failures now pass (take them out of KNOWN in xtask/src/pyverbs.rs): {}",
            fixed.join(", ")
        ));
    }
    p.join("; ")
}

/// Builds the library, makes sure the tests are there, runs `modules`; the summary and the
/// log's path.
fn run(root: &Path, modules: &[&str]) -> Result<(Summary, std::path::PathBuf), String> {
    if !is_root() {
        return Err(
            "pyverbs needs root: tests/pyverbs/run.sh runs the suite in private mount and \
             network namespaces (unshare)"
                .into(),
        );
    }
    perftest::build_library(root)?;
    if !Path::new(SHIPPED).is_dir() {
        perftest::apt_install("pyverbs", &["python3-pyverbs"], RUN_LIMIT)?;
        if !Path::new(SHIPPED).is_dir() {
            return Err(format!(
                "pyverbs: {SHIPPED} still missing (apt-get install python3-pyverbs)"
            ));
        }
    }
    let logs = root.join("target").join("xtask").join("pyverbs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let log = logs.join("pyverbs.log");
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("tests/pyverbs/run.sh"))
        .arg("--work")
        .arg(root.join("target/pyverbs-run"))
        .arg("-v")
        .args(modules)
        .env("PYVERBS_TIMEOUT", (RUN_LIMIT.as_secs() - 30).to_string())
        .current_dir(root);
    println!("pyverbs: tests/pyverbs/run.sh -v {}", modules.join(" "));
    let start = Instant::now();
    let exit = perftest::spawn_logged(cmd, &log).wait(Instant::now() + RUN_LIMIT);
    let out = perftest::read_log(&log);
    match parse(&out) {
        Some(s) => {
            println!(
                "pyverbs: exit {exit} after {:.0} s; log {}",
                start.elapsed().as_secs_f64(),
                log.display()
            );
            Ok((s, log))
        }
        None => {
            perftest::print_tail_folded(&out, 30);
            Err(format!(
                "pyverbs: the run ended ({}) without unittest's summary; see {}",
                match exit {
                    Exit::Timeout => "killed at the time limit".to_string(),
                    e => format!("exit {e}"),
                },
                log.display()
            ))
        }
    }
}

fn report(s: &Summary, log: &Path) {
    println!();
    println!(
        "pyverbs: ran {}: {} ok, {} FAIL, {} ERROR, {} skipped",
        s.ran,
        s.ok(),
        s.failures,
        s.errors,
        s.skipped
    );
    for (t, kind) in &s.bad {
        match KNOWN.iter().find(|(k, _)| k == t) {
            Some((_, why)) => println!("  {kind:<5} {t}  (known: {why})"),
            None => println!("  {kind:<5} {t}"),
        }
    }
    println!("  skips by reason:");
    let mut skips: Vec<(&String, &u64)> = s.skips.iter().collect();
    skips.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (reason, n) in skips {
        println!("  {n:>4}  {reason}");
    }
    println!("  log: {}", log.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_failures_and_skips_are_read_through_interleaved_logs() {
        let out = "\
test_a (tests.test_x.T.test_a) ... ok
test_b (tests.test_x.T.test_b) ... bluerdma error: create_qp: QP type 3 is not supported
skipped 'Create UC QP without attrs is not supported'
test_c (tests.test_x.T.test_c) ... skipped 'ODP is not supported - No ODP caps'
test_d (tests.test_x.T.test_d) ... skipped 'ODP is not supported - No ODP caps'
test_e (tests.test_x.T.test_e) ... ERROR
test_f (tests.test_x.T.test_f) ... FAIL

======================================================================
ERROR: test_e (tests.test_x.T.test_e)
----------------------------------------------------------------------
Traceback (most recent call last):
FAIL: test_f (tests.test_x.T.test_f)
----------------------------------------------------------------------
Ran 6 tests in 0.874s

FAILED (failures=1, errors=1, skipped=3)
";
        let s = parse(out).expect("a summary");
        assert_eq!(
            (s.ran, s.failures, s.errors, s.skipped, s.ok()),
            (6, 1, 1, 3, 1)
        );
        assert_eq!(
            s.bad,
            [
                ("test_e".to_string(), "ERROR"),
                ("test_f".to_string(), "FAIL")
            ]
        );
        assert_eq!(s.skips["ODP is not supported - No ODP caps"], 2);
        assert_eq!(s.skips["Create UC QP without attrs is not supported"], 1);
        let (unknown, fixed) = s.verdict_with(&[]);
        assert_eq!(unknown, ["ERROR: test_e", "FAIL: test_f"]);
        assert!(fixed.is_empty());
        let known = [("test_e", "why"), ("test_z", "why")];
        let (unknown, fixed) = s.verdict_with(&known);
        assert_eq!(unknown, ["FAIL: test_f"], "a known failure is not counted");
        assert_eq!(
            fixed,
            ["test_z"],
            "a known failure that did not fail is reported"
        );
    }

    #[test]
    fn a_clean_run_and_a_broken_one() {
        let s = parse("Ran 3 tests in 0.1s\n\nOK (skipped=1)\n").expect("a summary");
        assert_eq!((s.ran, s.skipped, s.ok()), (3, 1, 2));
        let s = parse("Ran 2 tests in 0.1s\n\nOK\n").expect("a summary");
        assert_eq!(s.ok(), 2);
        assert_eq!(
            parse("Traceback (most recent call last):\nImportError: x\n"),
            None
        );
    }
}
