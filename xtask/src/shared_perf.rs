//! `cargo xtask shared-perf` (issue N items 3 and 4): several perftest pairs at once on the
//! same two devices, shared between processes (`BLUERDMA_SHARED=1`, each device's card
//! owned by its `bluerdma-devd`), next to the exclusive single pair (the default, no
//! daemon) of the same run.
//!
//! - For each tool (`ib_write_bw -s 65536`, `ib_write_lat -s 8`, `ib_send_bw -s 65536`) and
//!   each number of pairs N: N servers on bluerdma0 (pair `i` with its own `-p`), then, once
//!   all listen, N clients on bluerdma1, all through the stand-in
//!   ([`super::perftest::PairRunner::run_at_once`]). Every pair must exit 0 with a figure
//!   above 0. The table gives each pair's figure, their sum (bandwidth) or mean (latency),
//!   its ratio to the exclusive pair, and how much of the time the N clients all ran
//!   (overlap: the sum is an aggregate only when they ran together). A batch in which
//!   every failure is perftest's own CPU clock calibration (`r^2 < 0.9` on a busy machine,
//!   before any report) runs once more.
//! - post_send rate: N processes at once (`tests/src/bin/shared_post_rate.rs`), each with
//!   both devices open and a QP pair between them, timing 64 B WRITEs around `post_send`
//!   (one per call, 32 per call), started together; against one process with the devices
//!   exclusive.
//!
//! The daemons' sockets go to a fresh `BLUERDMA_RUN_DIR` under the temporary directory; a
//! daemon exits 3 s after its last client, so an exclusive run first waits for the link
//! ports to be free, and the run ends once they are (a daemon still there after 10 s is a
//! failure).
//!
//! Wiring (main.rs): `mod shared_perf;`, `Some("shared-perf") =>
//! shared_perf::shared_perf(&root, &args[1..])`, and in `ci`:
//! `rows.push(shared_perf::ci_row(&root));`. `cargo xtask perftest --shared N` comes here
//! too (`--pairs N`).

use std::env;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::backends::build_release;
use super::perftest::{
    print_tail_folded, read_log, wait_link_ports_free, PairFigure, PairRunner, CLOCK_CALIBRATION,
};
use super::Row;

/// The first TCP exchange port (perftest's `-p`); every pair of the run takes the next one.
const DEFAULT_PORT: u16 = 18600;
/// How long a daemon may stay after its last client left (it exits after 3 s).
const DAEMON_EXIT: Duration = Duration::from_secs(10);

const USAGE: &str = "\
usage: cargo xtask shared-perf [--pairs LIST] [--tools LIST] [--quick] [--iters N]
                               [--no-exclusive] [--no-post] [--seconds S] [--timeout SECS]
                               [--port N]
       cargo xtask perftest --shared N [the same options]   (= --pairs N)

Runs N perftest pairs AT ONCE on the same two devices, shared (BLUERDMA_SHARED=1: each
device's card is owned by its bluerdma-devd, started by the first tool that opens it):
N servers on bluerdma0, N clients on bluerdma1, pair i with its own -p port, through
target/ibverbs/libibverbs.so.1. Checks that every pair exits 0 with a figure above 0 and
prints each pair's figure, their sum (bandwidth) or mean (latency) and its ratio to one
exclusive pair (the default: no daemon, each tool owns its device) of the same run. Then
the post_send rate of N processes at once on the shared devices (64 B WRITEs, one and 32
per call), against one process with the devices exclusive. Non-zero exit on any failure.

options:
  --pairs LIST     numbers of pairs (and post_send processes), comma-separated (default 1,2,4)
  --tools LIST     of write_bw, write_lat, send_bw (default all three)
  --quick          fewer iterations (bw -n 1000, lat -n 200) and 0.5 s post_send phases
  --iters N        -n of every tool (default: bw 5000, lat 1000)
  --no-exclusive   skip the exclusive pair and process (no ratios)
  --no-post        skip the post_send rate
  --seconds S      length of each post_send phase (default 1)
  --timeout SECS   hard limit per batch of pairs; every process is killed (default 60)
  --port N         first TCP exchange port (-p); each pair of the run takes the next (default 18600)
";

/// A perftest case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tool {
    WriteBw,
    WriteLat,
    SendBw,
}

impl Tool {
    fn parse(s: &str) -> Result<Tool, String> {
        match s.trim().trim_start_matches("ib_") {
            "write_bw" => Ok(Tool::WriteBw),
            "write_lat" => Ok(Tool::WriteLat),
            "send_bw" => Ok(Tool::SendBw),
            other => Err(format!(
                "shared-perf: unknown tool `{other}` (write_bw, write_lat, send_bw)"
            )),
        }
    }

    fn program(self) -> &'static str {
        match self {
            Tool::WriteBw => "ib_write_bw",
            Tool::WriteLat => "ib_write_lat",
            Tool::SendBw => "ib_send_bw",
        }
    }

    fn size(self) -> usize {
        match self {
            Tool::WriteLat => 8,
            _ => 65536,
        }
    }

    fn case(self) -> String {
        match self {
            Tool::WriteLat => format!("{} 8 B", self.program()),
            _ => format!("{} 64 KiB", self.program()),
        }
    }

    fn is_lat(self) -> bool {
        self == Tool::WriteLat
    }
}

/// Options of one run.
#[derive(Clone, Debug)]
struct Opts {
    pairs: Vec<usize>,
    tools: Vec<Tool>,
    quick: bool,
    iters: Option<u32>,
    exclusive: bool,
    post: bool,
    seconds: Option<f64>,
    timeout: Duration,
    port: u16,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            pairs: vec![1, 2, 4],
            tools: vec![Tool::WriteBw, Tool::WriteLat, Tool::SendBw],
            quick: false,
            iters: None,
            exclusive: true,
            post: true,
            seconds: None,
            timeout: Duration::from_secs(60),
            port: DEFAULT_PORT,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| {
                it.next()
                    .ok_or_else(|| format!("shared-perf: {a} needs {what}"))
                    .cloned()
            };
            let bad = |v: &str, what: &str| format!("shared-perf: {a} {v}: not {what}");
            match a.as_str() {
                "--pairs" => {
                    let v = value("a list of numbers")?;
                    o.pairs = v
                        .split(',')
                        .map(|n| {
                            n.trim()
                                .parse::<usize>()
                                .ok()
                                .filter(|n| (1..=16).contains(n))
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| bad(&v, "numbers from 1 to 16"))?;
                }
                "--tools" => {
                    let v = value("a list of tools")?;
                    o.tools = v.split(',').map(Tool::parse).collect::<Result<_, _>>()?;
                }
                "--quick" => o.quick = true,
                "--iters" => {
                    let v = value("a number")?;
                    o.iters = Some(
                        v.parse::<u32>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| bad(&v, "a number above 0"))?,
                    );
                }
                "--no-exclusive" => o.exclusive = false,
                "--no-post" => o.post = false,
                "--seconds" => {
                    let v = value("a number of seconds")?;
                    o.seconds = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|s| (0.05..=30.0).contains(s))
                            .ok_or_else(|| bad(&v, "seconds from 0.05 to 30"))?,
                    );
                }
                "--timeout" => {
                    let v = value("a number of seconds")?;
                    let secs: u64 = v.parse().map_err(|_| bad(&v, "a number"))?;
                    o.timeout = Duration::from_secs(secs.max(1));
                }
                "--port" => {
                    let v = value("a port")?;
                    o.port = v.parse().map_err(|_| bad(&v, "a port"))?;
                }
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("shared-perf: unknown option `{other}`\n{USAGE}")),
            }
        }
        Ok(Some(o))
    }

    /// `-n` of `tool`.
    fn iters(&self, tool: Tool) -> u32 {
        // A shared device's 8 B round trip is in milliseconds (see docs/BENCHMARKS.md).
        self.iters.unwrap_or(match (self.quick, tool.is_lat()) {
            (true, false) => 1000,
            (true, true) => 200,
            (false, false) => 5000,
            (false, true) => 1000,
        })
    }

    fn seconds(&self) -> f64 {
        self.seconds.unwrap_or(if self.quick { 0.5 } else { 1.0 })
    }
}

/// Exclusive devices (the default) or shared through their daemons.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Exclusive,
    Shared,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// What one batch (N pairs or processes at once) measured.
struct Batch {
    case: String,
    mode: Mode,
    /// The figure of each pair (process), or what went wrong.
    figures: Vec<Result<f64, String>>,
    unit: &'static str,
    /// Bandwidth and rates add up; latencies are averaged.
    adds: bool,
    /// The share of the batch's span during which every client ran.
    overlap: Option<f64>,
}

impl Batch {
    fn ok(&self) -> bool {
        self.figures.iter().all(|f| f.is_ok())
    }

    /// The sum (bandwidth, rate) or the mean (latency) of the figures, when all are there.
    fn total(&self) -> Option<f64> {
        let v: Vec<f64> = self.figures.iter().filter_map(|f| f.clone().ok()).collect();
        if v.len() != self.figures.len() || v.is_empty() {
            return None;
        }
        let sum: f64 = v.iter().sum();
        Some(if self.adds { sum } else { sum / v.len() as f64 })
    }
}

/// What a run found.
struct Report {
    date: String,
    batches: Vec<Batch>,
    /// A failure outside the batches (the daemons did not exit, the post_send program did
    /// not build).
    problems: Vec<String>,
    elapsed: Duration,
}

/// `cargo xtask shared-perf [OPTIONS]` (and `cargo xtask perftest --shared N`).
pub fn shared_perf(root: &Path, args: &[String]) -> Result<(), String> {
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let report = run(root, &opts)?;
    report.print(&opts);
    report.verdict()
}

/// The row of `cargo xtask ci`: two pairs of `ib_write_bw` and two of `ib_write_lat` at
/// once on the shared devices, quick; each pair counts as one check.
pub fn ci_row(root: &Path) -> Row {
    let suite = "perftest: two pairs at once on shared devices";
    println!("ci: {suite}: cargo xtask shared-perf --pairs 2 --tools write_bw,write_lat --quick --no-exclusive --no-post");
    let start = Instant::now();
    let opts = Opts {
        pairs: vec![2],
        tools: vec![Tool::WriteBw, Tool::WriteLat],
        quick: true,
        iters: None,
        exclusive: false,
        post: false,
        seconds: None,
        timeout: Duration::from_secs(30),
        port: DEFAULT_PORT,
    };
    match run(root, &opts) {
        Ok(report) => {
            report.print(&opts);
            let count = |ok: bool| {
                report
                    .batches
                    .iter()
                    .flat_map(|b| &b.figures)
                    .filter(|f| f.is_ok() == ok)
                    .count() as u64
            };
            Row {
                suite: suite.into(),
                passed: count(true),
                failed: count(false) + report.problems.len() as u64,
                time: start.elapsed(),
                note: match report.verdict() {
                    Ok(()) => report.headline(),
                    Err(e) => e,
                },
            }
        }
        Err(e) => {
            eprintln!("ci: shared-perf: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

/// Builds what is needed and runs every batch.
fn run(root: &Path, opts: &Opts) -> Result<Report, String> {
    let start = Instant::now();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let runner = PairRunner::new(root, opts.timeout, "shared-perf")?;
    let ips = runner.ips().to_vec();
    let run_dir = env::temp_dir().join(format!("bluerdma-shared-perf-{}", std::process::id()));
    fs::create_dir_all(&run_dir)
        .map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    let run_dir_s = run_dir.display().to_string();
    let shared_env = [
        ("BLUERDMA_SHARED".to_string(), "1".to_string()),
        ("BLUERDMA_RUN_DIR".to_string(), run_dir_s.clone()),
    ];
    let exclusive_env = [("BLUERDMA_SHARED".to_string(), "0".to_string())];
    println!(
        "shared-perf: shared devices: BLUERDMA_SHARED=1 BLUERDMA_RUN_DIR={run_dir_s} \
         (bluerdma-devd from {})",
        runner.lib_dir().display()
    );
    let mut batches = Vec::new();
    let mut problems = Vec::new();
    let mut port = opts.port;
    let mut ports = |n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| {
                let p = port;
                port = if port == u16::MAX {
                    opts.port
                } else {
                    port + 1
                };
                p
            })
            .collect()
    };
    for &tool in &opts.tools {
        let args = [
            "-s".to_string(),
            tool.size().to_string(),
            "-n".to_string(),
            opts.iters(tool).to_string(),
        ];
        let mut modes: Vec<(Mode, usize)> = Vec::new();
        if opts.exclusive {
            modes.push((Mode::Exclusive, 1));
        }
        modes.extend(opts.pairs.iter().map(|&n| (Mode::Shared, n)));
        for (mode, n) in modes {
            let env: &[(String, String)] = match mode {
                Mode::Exclusive => {
                    // The daemons of the shared batches before must be gone.
                    wait_link_ports_free(&ips, DAEMON_EXIT)?;
                    &exclusive_env
                }
                Mode::Shared => &shared_env,
            };
            println!(
                "shared-perf: {} {}, {n} pair(s) at once, {} devices",
                tool.program(),
                args.join(" "),
                mode.name()
            );
            let tag = match mode {
                Mode::Exclusive => "exclusive",
                Mode::Shared => "shared",
            };
            let mut figures = runner.run_at_once(tool.program(), tag, &args, env, &ports(n));
            if only_calibration_failed(&figures) {
                println!(
                    "shared-perf: {CLOCK_CALIBRATION} in every failed pair (the machine is \
                     busy): running the batch once more"
                );
                figures = runner.run_at_once(tool.program(), tag, &args, env, &ports(n));
            }
            batches.push(Batch {
                case: tool.case(),
                mode,
                overlap: overlap(&figures),
                figures: figures.into_iter().map(plausible).collect(),
                unit: if tool.is_lat() { "us" } else { "MB/s" },
                adds: !tool.is_lat(),
            });
        }
    }
    if opts.post {
        match post_batches(root, opts, &runner, &shared_env, &exclusive_env) {
            Ok(b) => batches.extend(b),
            Err(e) => problems.push(e),
        }
    }
    // Every daemon exits 3 s after its last client.
    if let Err(e) = wait_link_ports_free(&ips, DAEMON_EXIT) {
        problems.push(format!(
            "a device's daemon was still running {} s after the last client: {e}",
            DAEMON_EXIT.as_secs()
        ));
    } else {
        let _ = fs::remove_dir_all(&run_dir);
    }
    Ok(Report {
        date,
        batches,
        problems,
        elapsed: start.elapsed(),
    })
}

/// Whether some pair failed and every failure was perftest's clock calibration.
fn only_calibration_failed(figures: &[PairFigure]) -> bool {
    let errors: Vec<&String> = figures
        .iter()
        .filter_map(|f| f.value.as_ref().err())
        .collect();
    !errors.is_empty() && errors.iter().all(|e| e.contains(CLOCK_CALIBRATION))
}

/// A pair's figure, which must be a number above 0.
fn plausible(f: PairFigure) -> Result<f64, String> {
    match f.value {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(v) => Err(format!("implausible figure {v}")),
        Err(e) => Err(e),
    }
}

/// How much of the span from the first client's start to the last one's end every client
/// ran (1.0: all at once throughout); `None` for a single pair or a client that did not run.
fn overlap(figures: &[PairFigure]) -> Option<f64> {
    let spans: Vec<(Instant, Instant)> = figures
        .iter()
        .map(|f| f.client_span)
        .collect::<Option<_>>()?;
    span_overlap(&spans)
}

fn span_overlap(spans: &[(Instant, Instant)]) -> Option<f64> {
    if spans.len() < 2 {
        return None;
    }
    let first = spans.iter().map(|s| s.0).min()?;
    let last = spans.iter().map(|s| s.1).max()?;
    let all_from = spans.iter().map(|s| s.0).max()?;
    let all_to = spans.iter().map(|s| s.1).min()?;
    let whole = (last - first).as_secs_f64();
    let together = all_to.saturating_duration_since(all_from).as_secs_f64();
    (whole > 0.0).then(|| together / whole)
}

/// The post_send batches: one process with the devices exclusive, then N processes at once
/// on the shared devices for each N.
fn post_batches(
    root: &Path,
    opts: &Opts,
    runner: &PairRunner,
    shared_env: &[(String, String)],
    exclusive_env: &[(String, String)],
) -> Result<Vec<Batch>, String> {
    println!("shared-perf: cargo build --release -p bluerdma-tests --bin shared_post_rate");
    let bin = build_release(root, "bluerdma-tests", Some("shared_post_rate"))
        .map_err(|e| format!("shared-perf: {e}"))?
        .join("shared_post_rate");
    let logs = root.join("target").join("xtask").join("shared-perf");
    let devd = runner.lib_dir().join("bluerdma-devd");
    let mut env = vec![("BLUERDMA_DEVD".to_string(), devd.display().to_string())];
    let mut modes: Vec<(Mode, usize)> = Vec::new();
    if opts.exclusive {
        modes.push((Mode::Exclusive, 1));
    }
    modes.extend(opts.pairs.iter().map(|&n| (Mode::Shared, n)));
    let mut batches = Vec::new();
    for (mode, n) in modes {
        env.truncate(1);
        env.extend_from_slice(match mode {
            Mode::Exclusive => {
                wait_link_ports_free(runner.ips(), DAEMON_EXIT)?;
                exclusive_env
            }
            Mode::Shared => shared_env,
        });
        println!(
            "shared-perf: post_send rate, {n} process(es) at once, {} devices, {} s per phase",
            mode.name(),
            opts.seconds()
        );
        let rates = post_rates(&bin, n, &env, opts.seconds(), &logs, mode, opts.timeout);
        let (one, batch): (Vec<_>, Vec<_>) = rates
            .into_iter()
            .map(|r| match r {
                Ok((a, b)) => (Ok(a / 1e6), Ok(b / 1e6)),
                Err(e) => (Err(e.clone()), Err(e)),
            })
            .unzip();
        for (case, figures) in [
            ("post_send 64 B, 1 per call", one),
            ("post_send 64 B, 32 per call", batch),
        ] {
            batches.push(Batch {
                case: case.into(),
                mode,
                figures,
                unit: "M WR/s",
                adds: true,
                overlap: None,
            });
        }
    }
    Ok(batches)
}

/// Runs `n` copies of `shared_post_rate` at once: each opens the devices and says `ready`;
/// once all have, each is told to start; then the rates of each (WR/s, 1 and 32 per call).
fn post_rates(
    bin: &Path,
    n: usize,
    env: &[(String, String)],
    seconds: f64,
    logs: &Path,
    mode: Mode,
    timeout: Duration,
) -> Vec<Result<(f64, f64), String>> {
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut errors: Vec<Option<String>> = vec![None; n];
    let log_of = |i: usize| logs.join(format!("post_rate_{}_{}.log", mode.name(), i + 1));
    for (i, error) in errors.iter_mut().enumerate() {
        let log = log_of(i);
        let child = File::create(&log).map_err(|e| e.to_string()).and_then(|f| {
            Command::new(bin)
                .args(["--seconds", &seconds.to_string()])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(f)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", bin.display()))
        });
        match child {
            Ok(mut c) => {
                if let Some(out) = c.stdout.take() {
                    let tx = tx.clone();
                    thread::spawn(move || {
                        for line in BufReader::new(out).lines().map_while(Result::ok) {
                            let _ = tx.send((i, Some(line)));
                        }
                        let _ = tx.send((i, None));
                    });
                }
                children.push(Some(c));
            }
            Err(e) => {
                *error = Some(e);
                children.push(None);
            }
        }
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    let mut ready = vec![false; n];
    let mut one: Vec<Option<f64>> = vec![None; n];
    let mut batch: Vec<Option<f64>> = vec![None; n];
    let mut ended = vec![false; n];
    let mut started = false;
    loop {
        let live = |i: usize| errors[i].is_none() && !ended[i];
        if !started && (0..n).all(|i| ready[i] || !live(i)) {
            // Every process is ready (or gone): start them all at once.
            started = true;
            for c in children.iter_mut().flatten() {
                if let Some(stdin) = c.stdin.as_mut() {
                    let _ = stdin.write_all(b"go\n").and_then(|()| stdin.flush());
                }
            }
        }
        if (0..n).all(|i| !live(i)) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match rx.recv_timeout(deadline - now) {
            Ok((i, Some(line))) => {
                let mut words = line.split_whitespace();
                match (
                    words.next(),
                    words.next().and_then(|v| v.parse::<f64>().ok()),
                ) {
                    (Some("ready"), _) => ready[i] = true,
                    (Some("post_send_1"), Some(v)) => one[i] = Some(v),
                    (Some("post_send_32"), Some(v)) => batch[i] = Some(v),
                    _ => {}
                }
            }
            Ok((i, None)) => ended[i] = true,
            Err(_) => break,
        }
    }
    let mut results = Vec::with_capacity(n);
    for (i, c) in children.iter_mut().enumerate() {
        let status = c.as_mut().map(|c| {
            if !ended[i] || matches!(c.try_wait(), Ok(None)) {
                // Its stdout ended; give it a moment to exit before it is killed.
                let until = Instant::now() + Duration::from_secs(2);
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < until {
                    thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
            }
            c.wait()
        });
        let result = match (errors[i].take(), one[i], batch[i], status) {
            (Some(e), ..) => Err(e),
            (None, Some(a), Some(b), Some(Ok(s))) if s.success() => Ok((a, b)),
            (None, _, _, s) => {
                let log = log_of(i);
                eprintln!(
                    "FAILED shared_post_rate #{} ({} devices, {:?}); last lines of {}:",
                    i + 1,
                    mode.name(),
                    s,
                    log.display()
                );
                print_tail_folded(&read_log(&log), 12);
                Err(format!(
                    "shared_post_rate #{} failed ({})",
                    i + 1,
                    match s {
                        Some(Ok(s)) => s.to_string(),
                        _ => "no exit status".into(),
                    }
                ))
            }
        };
        results.push(result);
    }
    results
}

impl Report {
    /// The exclusive batch of `case`, the same run's baseline.
    fn exclusive(&self, case: &str) -> Option<f64> {
        self.batches
            .iter()
            .find(|b| b.case == case && b.mode == Mode::Exclusive)
            .and_then(Batch::total)
    }

    fn print(&self, opts: &Opts) {
        println!();
        println!(
            "cargo xtask shared-perf ({}): pairs run at once, servers on bluerdma0 and clients \
             on bluerdma1",
            self.date
        );
        let w = self
            .batches
            .iter()
            .map(|b| b.case.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let rule = "-".repeat(w + 88);
        println!(
            "{:<w$}  {:<9}  {:>5}  {:<36}  {:>14}  {:>7}  {:>7}",
            "case", "devices", "pairs", "per pair", "sum or mean", "ratio", "overlap"
        );
        println!("{rule}");
        for b in &self.batches {
            let digits = if b.unit == "us" || b.unit == "M WR/s" {
                2
            } else {
                0
            };
            let per: Vec<String> = b
                .figures
                .iter()
                .map(|f| match f {
                    Ok(v) => format!("{v:.digits$}"),
                    Err(_) => "FAILED".into(),
                })
                .collect();
            let total = b.total().map_or("-".into(), |t| {
                format!(
                    "{} {t:.digits$} {}",
                    if b.adds { "sum" } else { "mean" },
                    b.unit
                )
            });
            let ratio = match (b.total(), self.exclusive(&b.case)) {
                (Some(t), Some(base)) if base > 0.0 => format!("{:.2}x", t / base),
                _ => "-".into(),
            };
            let overlap = b
                .overlap
                .map_or("-".into(), |o| format!("{:.0} %", o * 100.0));
            println!(
                "{:<w$}  {:<9}  {:>5}  {:<36}  {:>14}  {:>7}  {:>7}",
                b.case,
                b.mode.name(),
                b.figures.len(),
                format!("{} {}", per.join(" "), b.unit),
                total,
                ratio,
                overlap
            );
        }
        println!("{rule}");
        println!(
            "ratio = sum (bandwidth, rate) or mean (latency) / the exclusive single pair of this \
             run; overlap = share of the batch's time during which every client ran"
        );
        let its = |t: Tool| format!("-n {}", opts.iters(t));
        println!(
            "iterations: bw {}, lat {}; logs in target/xtask/shared-perf; {:.0} s",
            its(Tool::WriteBw),
            its(Tool::WriteLat),
            self.elapsed.as_secs_f64()
        );
        for b in &self.batches {
            for (i, f) in b.figures.iter().enumerate() {
                if let Err(e) = f {
                    eprintln!(
                        "shared-perf: FAILED {} {} pair {} of {}: {e}",
                        b.case,
                        b.mode.name(),
                        i + 1,
                        b.figures.len()
                    );
                }
            }
        }
        for p in &self.problems {
            eprintln!("shared-perf: {p}");
        }
    }

    /// The note of the ci row: each batch's figures.
    fn headline(&self) -> String {
        self.batches
            .iter()
            .map(|b| {
                let per: Vec<String> = b
                    .figures
                    .iter()
                    .filter_map(|f| f.as_ref().ok())
                    .map(|v| format!("{v:.1}"))
                    .collect();
                format!(
                    "{} {}",
                    b.case.trim_start_matches("ib_"),
                    format_args!("{} {}", per.join("+"), b.unit)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn verdict(&self) -> Result<(), String> {
        let mut failed: Vec<String> = self
            .batches
            .iter()
            .filter(|b| !b.ok())
            .map(|b| {
                let bad = b.figures.iter().filter(|f| f.is_err()).count();
                format!(
                    "{} {} ({bad} of {} failed)",
                    b.case,
                    b.mode.name(),
                    b.figures.len()
                )
            })
            .collect();
        failed.extend(self.problems.iter().cloned());
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("shared-perf: failed: {}", failed.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_the_share_of_time_every_client_ran() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let o = span_overlap(&[(at(0), at(100)), (at(50), at(150))]).unwrap();
        assert!((o - 50.0 / 150.0).abs() < 1e-9, "{o}");
        assert_eq!(
            span_overlap(&[(at(0), at(10)), (at(20), at(30))]),
            Some(0.0)
        );
        assert_eq!(span_overlap(&[(at(0), at(10))]), None);
    }

    #[test]
    fn options_name_pairs_and_tools() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = Opts::parse(&args("--pairs 2,4 --tools write_lat,ib_send_bw --quick"))
            .unwrap()
            .unwrap();
        assert_eq!(o.pairs, [2, 4]);
        assert_eq!(o.tools, [Tool::WriteLat, Tool::SendBw]);
        assert_eq!(
            (o.iters(Tool::SendBw), o.iters(Tool::WriteLat)),
            (1000, 200)
        );
        assert!(Opts::parse(&args("--pairs 0")).is_err());
        assert!(Opts::parse(&args("--tools read_bw")).is_err());
    }

    #[test]
    fn only_a_batch_failed_by_clock_calibration_alone_runs_again() {
        let fig = |value: Result<f64, String>| PairFigure {
            value,
            cpu_s: 0.0,
            client_span: None,
        };
        let calibration = || {
            Err(format!(
                "ib_send_bw #2 server failed (exit 1): {CLOCK_CALIBRATION}"
            ))
        };
        assert!(only_calibration_failed(&[fig(Ok(1.0)), fig(calibration())]));
        assert!(!only_calibration_failed(&[fig(Ok(1.0)), fig(Ok(2.0))]));
        assert!(!only_calibration_failed(&[
            fig(calibration()),
            fig(Err("ib_send_bw #1 client failed (exit 1)".into()))
        ]));
    }

    #[test]
    fn a_failed_pair_fails_the_batch_and_has_no_total() {
        let b = Batch {
            case: "ib_write_bw 64 KiB".into(),
            mode: Mode::Shared,
            figures: vec![Ok(100.0), Err("exit 1".into())],
            unit: "MB/s",
            adds: true,
            overlap: None,
        };
        assert!(!b.ok());
        assert_eq!(b.total(), None);
        let lat = Batch {
            figures: vec![Ok(8.0), Ok(10.0)],
            adds: false,
            ..b
        };
        assert_eq!(lat.total(), Some(9.0));
        assert_eq!(
            plausible(PairFigure {
                value: Ok(0.0),
                cpu_s: 0.0,
                client_span: None
            }),
            Err("implausible figure 0".into())
        );
    }
}
