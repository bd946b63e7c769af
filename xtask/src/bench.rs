//! `cargo xtask bench` (issue L item 6): the headline figures of the emulated NIC in one
//! run, each next to its baseline measured in the same run (the machine is shared and
//! noisy: the ratios compare between runs, the absolute numbers do not).
//!
//! - perftest through the stand-in ([`super::perftest::PairRunner`]): `ib_write_bw` of
//!   64 KiB and 1 MiB, `ib_read_bw` and `ib_send_bw` of 64 KiB against a TCP loopback
//!   stream of the same chunk size, `ib_write_lat` of 8 B (t_typical) against half the
//!   round trip of an 8 B TCP ping-pong. The devices use the link they pick by default
//!   (shared memory between the two cards of this host); `ib_write_bw` and `ib_write_lat`
//!   run again with `BLUERDMA_LINK_SHM=0` (the UDP link) unless `--no-udp`.
//! - CPU per GB: the CPU time of both perftest processes of `ib_write_bw` 1 MiB (from
//!   `/proc/PID/stat`, setup included) per 10^9 bytes written, against the CPU time of the
//!   TCP stream's process per 10^9 bytes, and against one core's memcpy of 1 MiB blocks.
//! - post_send rate: WR/s of 64 B WRITEs through the Rust API, timed around `post_send`
//!   only, one per call and 32 per call (`cargo bench -p bluerdma-linux --bench post_rate`),
//!   against the goal of 5 M WR/s.
//!
//! Every perftest case runs `--repeat` times (3 by default), the two links back to back in
//! each round, after that round's baselines; the figures are the medians of the rounds, the
//! ratios the medians of each round's figure over the same round's baseline. The baselines
//! run in `xtask --features tcp-baseline bench --baseline` (release) so that a plain
//! `cargo xtask` stays std-only.
//!
//! Wiring (main.rs): `mod bench;` and `Some("bench") => bench::bench(&root, &args[1..])`.

use std::env;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::perftest::{keyed_number, run_baseline, PairFigure, PairRunner};

/// The hidden first argument that makes `bench` measure the baselines only.
const BASELINE: &str = "--baseline";
/// The first TCP exchange port (perftest's `-p`); run `i` uses `port + i`.
const DEFAULT_PORT: u16 = 18700;
/// The goal for post_send (one 64 B WRITE), in WR/s.
const POST_GOAL: f64 = 5e6;
/// The goal for two idle devices with QPs connected, in percent of one core.
const IDLE_GOAL: f64 = 0.5;
/// Bytes in perftest's MB.
#[cfg(feature = "tcp-baseline")]
const MIB: f64 = (1u64 << 20) as f64;

const USAGE: &str = "\
usage: cargo xtask bench [--quick] [--no-udp] [--repeat N] [--timeout SECS] [--port N]

Prints in one run, each next to its baseline of the same run as a ratio: ib_write_bw 64 KiB
and 1 MiB, ib_read_bw and ib_send_bw 64 KiB (vs a TCP loopback stream of the same chunk),
ib_write_lat 8 B (vs half the round trip of an 8 B TCP ping-pong), CPU per GB of
ib_write_bw 1 MiB (vs the TCP stream and vs memcpy), the post_send rate of 64 B WRITEs
through the Rust API (vs the 5 M WR/s goal; over all bursts of 32 WRs and the median
burst) and the idle CPU of two devices with a QP pair connected (vs the 0.5 % goal). The
tools run through the libibverbs.so.1 stand-in on the default devices (or
BLUERDMA_DEVICES); ib_write_bw and ib_write_lat run on the shared-memory link and again on
the UDP link (BLUERDMA_LINK_SHM=0).

options:
  --quick         fewer iterations, shorter baselines, one round
  --no-udp        skip the runs on the UDP link
  --repeat N      rounds of every perftest case, the median reported (default 3, quick 1)
  --timeout SECS  hard limit per tool pair (default 60)
  --port N        first TCP exchange port (-p); run i uses N + i (default 18700)
";

struct Opts {
    quick: bool,
    udp: bool,
    repeat: u32,
    timeout: Duration,
    port: u16,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            quick: false,
            udp: true,
            repeat: 0,
            timeout: Duration::from_secs(60),
            port: DEFAULT_PORT,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut number = |what: &str| -> Result<u64, String> {
                let v = it
                    .next()
                    .ok_or_else(|| format!("bench: {a} needs {what}"))?;
                v.parse().map_err(|_| format!("bench: {a} {v}: not {what}"))
            };
            match a.as_str() {
                "--quick" => o.quick = true,
                "--no-udp" => o.udp = false,
                "--timeout" => o.timeout = Duration::from_secs(number("a number")?.max(1)),
                "--repeat" => o.repeat = number("a number")?.clamp(1, 100) as u32,
                "--port" => {
                    o.port = u16::try_from(number("a port")?).map_err(|_| "bench: bad --port")?
                }
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("bench: unknown option `{other}`\n{USAGE}")),
            }
        }
        if o.repeat == 0 {
            o.repeat = if o.quick { 1 } else { 3 };
        }
        Ok(Some(o))
    }

    /// `-n` of: 64 KiB bandwidth, 1 MiB bandwidth, 8 B latency.
    fn iters(&self) -> (u32, u32, u32) {
        if self.quick {
            (1000, 200, 1000)
        } else {
            (5000, 1000, 5000)
        }
    }
}

/// What a perftest case is compared with.
#[derive(Clone, Copy)]
enum Base {
    Stream64k,
    Stream1m,
    PingPong,
}

/// One perftest row of the table (run on the shared-memory link, and on UDP if `udp_too`).
struct Case {
    name: &'static str,
    tool: &'static str,
    tag: [&'static str; 2],
    size: usize,
    iters: u32,
    udp_too: bool,
    base: Base,
}

/// The runs of one case on one link, and their median.
#[derive(Default)]
struct Runs {
    /// The figure of each round that gave one, with the round (0-based).
    values: Vec<(usize, f64)>,
    cpu_s: Vec<(usize, f64)>,
    errors: Vec<String>,
}

impl Runs {
    fn add(&mut self, round: usize, f: PairFigure) {
        match f.value {
            Ok(v) => {
                self.values.push((round, v));
                self.cpu_s.push((round, f.cpu_s));
            }
            Err(e) => self.errors.push(e),
        }
    }

    fn value(&self) -> Option<f64> {
        median_of_rounds(&self.values)
    }
}

/// The median of per-round figures.
fn median_of_rounds(values: &[(usize, f64)]) -> Option<f64> {
    median(&values.iter().map(|(_, v)| *v).collect::<Vec<_>>())
}

/// The median over the rounds of each round's figure against `of` that round's baseline:
/// each ratio compares two measurements minutes apart at most, not the figure of one round
/// with the baseline of another.
fn paired_ratio(
    values: &[(usize, f64)],
    bases: &[Baseline],
    of: impl Fn(&Baseline) -> f64,
) -> Option<f64> {
    let ratios: Vec<f64> = values
        .iter()
        .filter_map(|(r, v)| bases.get(*r).map(|b| v / of(b)))
        .collect();
    median(&ratios)
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// `cargo xtask bench [OPTIONS]`.
pub fn bench(root: &Path, args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some(BASELINE) {
        return baseline_main(&args[1..]);
    }
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let runner = PairRunner::new(root, opts.timeout, "bench")?;
    let posts = post_rate(root, &opts);
    let idle = idle_cpu(root, &opts);
    let (n64, n1m, nlat) = opts.iters();
    let case = |name, tool, tag, size, iters, udp_too, base| Case {
        name,
        tool,
        tag,
        size,
        iters,
        udp_too,
        base,
    };
    let cases = [
        case(
            "ib_write_bw 64 KiB",
            "ib_write_bw",
            ["64k", "64k udp"],
            65536,
            n64,
            true,
            Base::Stream64k,
        ),
        case(
            "ib_write_bw 1 MiB",
            "ib_write_bw",
            ["1m", "1m udp"],
            1 << 20,
            n1m,
            true,
            Base::Stream1m,
        ),
        case(
            "ib_read_bw 64 KiB",
            "ib_read_bw",
            ["64k", ""],
            65536,
            n64,
            false,
            Base::Stream64k,
        ),
        case(
            "ib_send_bw 64 KiB",
            "ib_send_bw",
            ["64k", ""],
            65536,
            n64,
            false,
            Base::Stream64k,
        ),
        case(
            "ib_write_lat 8 B (t_typical)",
            "ib_write_lat",
            ["8", "8 udp"],
            8,
            nlat,
            true,
            Base::PingPong,
        ),
    ];
    let udp_env = [("BLUERDMA_LINK_SHM".to_string(), "0".to_string())];
    let mut results: Vec<[Runs; 2]> = cases.iter().map(|_| Default::default()).collect();
    let mut port = opts.port;
    // Rounds of every case, the two links back to back: a load that comes and goes hits
    // both alike, and the median of the rounds is reported. Each round starts with its
    // baselines and its figures are compared with those: a TCP stream measured once, in a
    // quiet or a busy minute, moved every ratio of a run by up to 2x (BENCHMARKS.md).
    let mut bases = Vec::new();
    for round in 1..=opts.repeat {
        bases.push(measure_baseline(root, &opts)?);
        for (c, runs) in cases.iter().zip(results.iter_mut()) {
            let args = [
                "-s".into(),
                c.size.to_string(),
                "-n".into(),
                c.iters.to_string(),
            ];
            for (link, env) in [(0, &[][..]), (1, &udp_env[..])] {
                if link == 1 && !(c.udp_too && opts.udp) {
                    continue;
                }
                let on = ["shared memory", "UDP"][link];
                println!(
                    "bench: round {round}/{}: {} {} on {on}",
                    opts.repeat,
                    c.tool,
                    args.join(" ")
                );
                runs[link].add(
                    round as usize - 1,
                    runner.run(c.tool, c.tag[link], &args, env, port),
                );
                port = port.wrapping_add(1);
                if port < 1024 {
                    port = opts.port;
                }
            }
        }
    }

    println!();
    let quick = if opts.quick { " --quick" } else { "" };
    println!(
        "cargo xtask bench{quick} ({date}; median of {} rounds)",
        opts.repeat
    );
    let rule = "-".repeat(100);
    println!(
        "{:<34} {:<5} {:>16}  {:<30} {:>7}",
        "case", "link", "ours", "baseline (same run)", "ratio"
    );
    println!("{rule}");
    let row = |case: &str, link: &str, ours: String, baseline: String, ratio: Option<f64>| {
        let ratio = ratio.map_or("-".into(), |r| format!("{r:.2}x"));
        println!("{case:<34} {link:<5} {ours:>16}  {baseline:<30} {ratio:>7}");
    };
    let med = |of: fn(&Baseline) -> f64| {
        median(&bases.iter().map(of).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    let rounds = bases.len();
    for (c, runs) in cases.iter().zip(&results) {
        let (of, baseline, unit): (fn(&Baseline) -> f64, String, &str) = match c.base {
            Base::Stream64k => (
                |b| b.stream_64k_mb_s,
                format!("TCP stream 64 KiB {:.0} MB/s", med(|b| b.stream_64k_mb_s)),
                "MB/s",
            ),
            Base::Stream1m => (
                |b| b.stream_1m_mb_s,
                format!("TCP stream 1 MiB {:.0} MB/s", med(|b| b.stream_1m_mb_s)),
                "MB/s",
            ),
            Base::PingPong => (
                |b| b.pingpong_us,
                format!("TCP 8 B half RTT {:.2} us", med(|b| b.pingpong_us)),
                "us",
            ),
        };
        for (link, r) in ["shm", "udp"].iter().zip(runs) {
            let ratio = paired_ratio(&r.values, &bases, of);
            match (r.value(), r.errors.first()) {
                (Some(v), _) if unit == "us" => {
                    row(c.name, link, format!("{v:.2} us"), baseline.clone(), ratio)
                }
                (Some(v), _) => row(
                    c.name,
                    link,
                    format!("{v:.0} MB/s"),
                    baseline.clone(),
                    ratio,
                ),
                (None, Some(e)) => row(c.name, link, "FAILED".into(), e.clone(), None),
                (None, None) => {}
            }
        }
    }
    // CPU per GB of the 1 MiB WRITEs: both processes, per 10^9 bytes written.
    let gb = c_bytes(&cases[1]) / 1e9;
    let tcp_cpu = med(|b| b.stream_1m_cpu_s_per_gb);
    let memcpy = 1.0 / med(|b| b.memcpy_gb_s);
    for (link, r) in ["shm", "udp"].iter().zip(&results[1]) {
        let per_gb: Vec<(usize, f64)> = r
            .cpu_s
            .iter()
            .filter(|(_, c)| *c > 0.0)
            .map(|(i, c)| (*i, c / gb))
            .collect();
        if let Some(v) = median_of_rounds(&per_gb) {
            row(
                "CPU per GB, ib_write_bw 1 MiB",
                link,
                format!("{v:.3} s/GB"),
                format!("TCP stream 1 MiB {tcp_cpu:.3} s/GB"),
                paired_ratio(&per_gb, &bases, |b| b.stream_1m_cpu_s_per_gb),
            );
            row(
                "",
                "",
                String::new(),
                format!("memcpy 1 MiB {memcpy:.3} s/GB"),
                paired_ratio(&per_gb, &bases, |b| 1.0 / b.memcpy_gb_s),
            );
        }
    }
    let goal = format!("goal {:.0} M WR/s", POST_GOAL / 1e6);
    match &posts {
        Ok(links) => {
            for p in links {
                for (case, v) in [
                    ("post_send 64 B WRITE, 1 per call", p.one),
                    ("  median burst of 32 WRs", p.one_median),
                    ("post_send 64 B WRITE, 32 per call", p.batch),
                    ("  median burst of 32 WRs", p.batch_median),
                ] {
                    row(
                        case,
                        p.link,
                        format!("{:.2} M WR/s", v / 1e6),
                        goal.clone(),
                        Some(v / POST_GOAL),
                    );
                }
            }
        }
        Err(e) => row(
            "post_send 64 B WRITE",
            "-",
            "FAILED".into(),
            e.clone(),
            None,
        ),
    }
    let idle_goal = format!("goal {IDLE_GOAL} % of a core");
    match &idle {
        Ok(links) => {
            for (link, v) in links {
                row(
                    "idle CPU, 2 devices, QPs connected",
                    link,
                    format!("{v:.3} %"),
                    idle_goal.clone(),
                    Some(v / IDLE_GOAL),
                );
            }
        }
        Err(e) => row("idle CPU", "-", "FAILED".into(), e.clone(), None),
    }
    println!("{rule}");
    println!(
        "ratio = median over the {rounds} rounds of ours / that round's baseline (bandwidth: higher is better; latency and CPU: lower is better); ours and baseline: medians"
    );
    if opts.udp {
        let vs = |i: usize| match (results[i][0].value(), results[i][1].value()) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        println!(
            "shared memory / UDP link, same run: ib_write_bw 64 KiB {}, 1 MiB {}, ib_write_lat {}",
            vs(0),
            vs(1),
            vs(4)
        );
    }
    println!("logs of the last round in target/xtask/bench");
    let failed: usize = results
        .iter()
        .flatten()
        .map(|r| r.errors.len())
        .sum::<usize>()
        + posts.is_err() as usize
        + idle.is_err() as usize;
    if failed > 0 {
        return Err(format!("bench: {failed} runs failed (see above)"));
    }
    Ok(())
}

/// Bytes a bandwidth case writes (perftest's `-n` messages of `-s` bytes).
fn c_bytes(c: &Case) -> f64 {
    f64::from(c.iters) * c.size as f64
}

/// The figures of [`baseline_main`].
struct Baseline {
    stream_64k_mb_s: f64,
    stream_1m_mb_s: f64,
    stream_1m_cpu_s_per_gb: f64,
    pingpong_us: f64,
    memcpy_gb_s: f64,
}

/// Runs `xtask --features tcp-baseline bench --baseline SECS ITERS IP` in release and reads
/// its figures.
fn measure_baseline(root: &Path, opts: &Opts) -> Result<Baseline, String> {
    let (secs, iters) = if opts.quick {
        (0.5, 5_000)
    } else {
        (2.0, 20_000)
    };
    println!("bench: baselines (TCP streams of 64 KiB and 1 MiB for {secs} s each, 8 B ping-pong x {iters}, memcpy)");
    let (ok, text) = run_baseline(
        root,
        &[
            "bench",
            BASELINE,
            &secs.to_string(),
            &iters.to_string(),
            "127.0.0.1",
        ],
    )?;
    let field = |key: &str| {
        keyed_number(&text, key)
            .filter(|v| *v > 0.0)
            .ok_or_else(|| format!("bench: baseline gave no {key}: {}", text.trim()))
    };
    if !ok {
        return Err(format!("bench: baseline failed: {}", text.trim()));
    }
    Ok(Baseline {
        stream_64k_mb_s: field("stream_64k_mb_s")?,
        stream_1m_mb_s: field("stream_1m_mb_s")?,
        stream_1m_cpu_s_per_gb: field("stream_1m_cpu_s_per_gb")?,
        pingpong_us: field("pingpong_us")?,
        memcpy_gb_s: field("memcpy_gb_s")?,
    })
}

/// One link's post_send rates (WR/s): one and 32 per call, over all bursts and the median
/// burst.
struct PostRow {
    link: &'static str,
    one: f64,
    batch: f64,
    one_median: f64,
    batch_median: f64,
}

/// `cargo bench -p bluerdma-linux --bench post_rate`: WR/s one per call and 32 per call, on
/// the link two local devices get by default (shared memory) and, unless `--no-udp`, on the
/// UDP link.
fn post_rate(root: &Path, opts: &Opts) -> Result<Vec<PostRow>, String> {
    let secs = if opts.quick { "0.5" } else { "2" };
    let text = cargo_keys(
        root,
        opts,
        &["bench", "-p", "bluerdma-linux", "--bench", "post_rate"],
        secs,
    )?;
    let failed = || format!("post_rate bench: no figures in: {}", text.trim());
    let links: &[(&'static str, &str)] = if opts.udp {
        &[("shm", ""), ("udp", "_udp")]
    } else {
        &[("shm", "")]
    };
    links
        .iter()
        .map(|&(link, suffix)| {
            let key = |k: &str| keyed_number(&text, &format!("post_send_{k}{suffix} "));
            match (key("1"), key("32"), key("1_median"), key("32_median")) {
                (Some(one), Some(batch), Some(one_median), Some(batch_median)) => Ok(PostRow {
                    link,
                    one,
                    batch,
                    one_median,
                    batch_median,
                }),
                _ => Err(failed()),
            }
        })
        .collect()
}

/// The idle example: the CPU share of two devices with a QP pair connected and nothing to
/// do, per link, in percent of one core.
fn idle_cpu(root: &Path, opts: &Opts) -> Result<Vec<(&'static str, f64)>, String> {
    let secs = if opts.quick { "1" } else { "5" };
    let text = cargo_keys(
        root,
        opts,
        &[
            "run",
            "--release",
            "-p",
            "bluerdma-linux",
            "--example",
            "idle_cpu",
        ],
        secs,
    )?;
    let failed = || format!("idle_cpu: no figures in: {}", text.trim());
    let links: &[&'static str] = if opts.udp { &["shm", "udp"] } else { &["shm"] };
    links
        .iter()
        .map(|&link| {
            keyed_number(&text, &format!("idle_cpu_{link} "))
                .map(|v| (link, v))
                .ok_or_else(failed)
        })
        .collect()
}

/// Runs `cargo ARGS -- --seconds SECS [--no-udp]` quietly in `root` and returns what it
/// printed (lines of `key value`); a failed run is an error with its output.
fn cargo_keys(root: &Path, opts: &Opts, args: &[&str], secs: &str) -> Result<String, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let no_udp: &[&str] = if opts.udp { &[] } else { &["--no-udp"] };
    let rest = [&["--", "--seconds", secs][..], no_udp].concat();
    println!("bench: cargo {} {}", args.join(" "), rest.join(" "));
    let out = Command::new(&cargo)
        .args(args)
        .arg("--quiet")
        .args(&rest)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{cargo} {}`: {e}", args[0]))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "`cargo {}` failed: {}",
            args.join(" "),
            text.trim()
        ));
    }
    Ok(text)
}

/// `bench --baseline SECS ITERS IP`: prints `stream_64k_mb_s`, `stream_1m_mb_s`,
/// `stream_1m_cpu_s_per_gb`, `pingpong_us` and `memcpy_gb_s`, one per line.
#[cfg(feature = "tcp-baseline")]
fn baseline_main(args: &[String]) -> Result<(), String> {
    use bluerdma_sim::baseline::{tcp_pingpong, tcp_stream};
    let usage = "--baseline SECS ITERS IP";
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let secs: f64 = arg(0).parse().map_err(|_| usage)?;
    let iters: u32 = arg(1).parse().map_err(|_| usage)?;
    let ip: std::net::Ipv4Addr = arg(2).parse().map_err(|_| usage)?;
    let run = Duration::from_secs_f64(secs);
    let stream = |chunk: usize| -> Result<(f64, f64), String> {
        let data = vec![7u8; chunk];
        let cpu0 = own_cpu_seconds();
        let r = tcp_stream(ip, &data, run).map_err(|e| format!("TCP stream: {e}"))?;
        let cpu = own_cpu_seconds() - cpu0;
        let mb_s = r.bytes as f64 / r.elapsed.as_secs_f64() / MIB;
        Ok((mb_s, cpu / (r.bytes as f64 / 1e9)))
    };
    let (mb64, _) = stream(64 << 10)?;
    let (mb1m, cpu1m) = stream(1 << 20)?;
    let half_rtt = tcp_pingpong(ip, 8, iters).map_err(|e| format!("TCP ping-pong: {e}"))?;
    println!("stream_64k_mb_s {mb64:.2}");
    println!("stream_1m_mb_s {mb1m:.2}");
    println!("stream_1m_cpu_s_per_gb {cpu1m:.4}");
    println!("pingpong_us {:.3}", half_rtt.as_secs_f64() * 1e6);
    println!("memcpy_gb_s {:.2}", memcpy_gb_s(run));
    Ok(())
}

#[cfg(not(feature = "tcp-baseline"))]
fn baseline_main(_: &[String]) -> Result<(), String> {
    Err(format!(
        "bench {BASELINE} needs the tcp-baseline feature (cargo xtask bench runs it)"
    ))
}

/// One core copying 1 MiB blocks (source and destination stay in cache) for `run`, in
/// 10^9 bytes per second.
#[cfg(feature = "tcp-baseline")]
fn memcpy_gb_s(run: Duration) -> f64 {
    let src = vec![5u8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    let start = std::time::Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < run {
        for _ in 0..64 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        bytes += 64 << 20;
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// CPU seconds (user + system) of this process so far.
#[cfg(feature = "tcp-baseline")]
fn own_cpu_seconds() -> f64 {
    super::perftest::cpu_ticks(std::process::id()).map_or(0.0, |t| t as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(stream: f64) -> Baseline {
        Baseline {
            stream_64k_mb_s: stream,
            stream_1m_mb_s: stream,
            stream_1m_cpu_s_per_gb: 1.0,
            pingpong_us: 1.0,
            memcpy_gb_s: 1.0,
        }
    }

    #[test]
    fn a_ratio_pairs_each_round_with_its_own_baseline() {
        // The load swings both alike: the rounds give 1.5x, 1.0x and 1.5x, a median of 1.5x,
        // while the median figure over the median baseline would say 1000/1000 = 1.0x.
        let bases = [base(400.0), base(1000.0), base(2000.0)];
        let ours = [(0, 600.0), (1, 1000.0), (2, 3000.0)];
        let r = paired_ratio(&ours, &bases, |b| b.stream_64k_mb_s).unwrap();
        assert!((r - 1.5).abs() < 1e-9, "{r}");
        assert_eq!(median_of_rounds(&ours), Some(1000.0));
        // A round that gave no figure is left out, not paired with another's baseline:
        // round 2's 2000 against round 2's 2000 is 1.0x (against round 1's it would be 2.0x).
        let r = paired_ratio(&[(0, 600.0), (2, 2000.0)], &bases, |b| b.stream_64k_mb_s);
        assert_eq!(r, Some(1.5));
        let r = paired_ratio(&[(2, 2000.0)], &bases, |b| b.stream_64k_mb_s);
        assert_eq!(r, Some(1.0));
    }
}
