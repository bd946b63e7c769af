//! `cargo xtask ecosystem` (issue J2 item 4): the Rust RDMA crates from crates.io over the
//! libibverbs.so.1 stand-in.
//!
//! 1. Builds the stand-in into `target/ibverbs/` ([`perftest::build_library`]).
//! 2. Installs what the crates' build scripts need with apt-get if missing: cmake and
//!    libclang (bindgen) for both sys crates; libnl-3/libnl-route-3 (rdma-core's cmake
//!    configure, which ibverbs-sys runs to generate its headers); libibverbs-dev (the
//!    `libibverbs.so` that ibverbs-sys links against; at run time the stand-in replaces it).
//! 3. Builds `examples/ecosystem` (its own workspace and Cargo.lock, fetched from crates.io)
//!    with `--locked` into `target/ecosystem`; a fetch failure says so.
//! 4. Runs each example with `LD_LIBRARY_PATH=target/ibverbs` and two emulated devices, and
//!    checks its exit code and its `<crate>: ok:` line. The programs find `bluerdma0` and
//!    `bluerdma1` only through the stand-in (the system library lists no device here), so a
//!    pass also proves the stand-in was the library they used.
//!
//! Wiring (main.rs): `mod ecosystem;`, `Some("ecosystem") => ecosystem::ecosystem(..)`, and in
//! `ci`: `rows.push(ecosystem::ci_row(&root));`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::perftest::{self, Exit, TableRow};
use super::Row;

/// The devices the examples open (unless BLUERDMA_DEVICES is set): addresses of their own,
/// so a perftest or sim run on the same machine does not collide.
const DEVICES: &str = "bluerdma0=127.0.66.1,bluerdma1=127.0.66.2";
/// Lines of a failed command's output that are printed.
const TAIL: usize = 25;

const USAGE: &str = "\
usage: cargo xtask ecosystem [--only TEXT] [--timeout SECS]

Builds target/ibverbs/libibverbs.so.1 (the blue-rdma stand-in) and examples/ecosystem (one
program per Rust RDMA crate from crates.io: rust-ibverbs, sideway), then runs each: an RC QP
pair between bluerdma0 and bluerdma1 in one process, an RDMA WRITE and a SEND/RECV, bytes
and completions checked. Devices: BLUERDMA_DEVICES, else bluerdma0=127.0.66.1,
bluerdma1=127.0.66.2. Installs cmake, libclang-dev, libnl-3-dev, libnl-route-3-dev and
libibverbs-dev with apt-get if they are missing.

options:
  --only TEXT     run only the examples whose name contains TEXT (e.g. `sideway`)
  --timeout SECS  hard limit per example run (default 120)
";

/// One example: its binary (the package name) and the program name its result line starts with.
struct Example {
    bin: &'static str,
    program: &'static str,
}

const EXAMPLES: [Example; 2] = [
    Example {
        bin: "eco-rust-ibverbs",
        program: "rust-ibverbs 0.9",
    },
    Example {
        bin: "eco-sideway",
        program: "sideway 0.4",
    },
];

struct Opts {
    only: Option<String>,
    timeout: Duration,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            only: None,
            timeout: Duration::from_secs(120),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--only" => {
                    o.only = Some(it.next().ok_or("ecosystem: --only needs a text")?.clone())
                }
                "--timeout" => {
                    let v = it.next().ok_or("ecosystem: --timeout needs seconds")?;
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| format!("ecosystem: --timeout {v}: not a number"))?;
                    o.timeout = Duration::from_secs(secs.max(1));
                }
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("ecosystem: unknown option `{other}`\n{USAGE}")),
            }
        }
        Ok(Some(o))
    }
}

/// One example run, as it ended.
struct Run {
    program: &'static str,
    exit: Exit,
    time: Duration,
    /// The result line, or what is wrong with the output.
    line: Result<String, String>,
    log: PathBuf,
}

impl Run {
    fn ok(&self) -> bool {
        self.exit == Exit::Code(0) && self.line.is_ok()
    }
}

/// `cargo xtask ecosystem [OPTIONS]`.
pub fn ecosystem(root: &Path, args: &[String]) -> Result<(), String> {
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let runs = run(root, &opts)?;
    let failed: Vec<&str> = runs.iter().filter(|r| !r.ok()).map(|r| r.program).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("ecosystem: failed: {}", failed.join(", ")))
    }
}

/// The row of `cargo xtask ci`: each example is one check.
pub fn ci_row(root: &Path) -> Row {
    println!(
        "ci: ecosystem: rust-ibverbs and sideway examples over target/ibverbs/libibverbs.so.1"
    );
    let start = Instant::now();
    let opts = Opts {
        only: None,
        timeout: Duration::from_secs(120),
    };
    let suite = "ecosystem (rust-ibverbs, sideway)".to_string();
    match run(root, &opts) {
        Ok(runs) => {
            let failed: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
            Row {
                suite,
                passed: (runs.len() - failed.len()) as u64,
                failed: failed.len() as u64,
                time: start.elapsed(),
                note: match failed.first() {
                    None => "WRITE + SEND/RECV verified per crate".into(),
                    Some(r) => format!("{} failed; see {}", r.program, r.log.display()),
                },
            }
        }
        Err(e) => {
            eprintln!("ci: ecosystem: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

fn run(root: &Path, opts: &Opts) -> Result<Vec<Run>, String> {
    let start = Instant::now();
    let lib_dir = perftest::build_library(root)?;
    ensure_build_tools(opts.timeout)?;
    let logs = root.join("target").join("xtask").join("ecosystem");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let bin_dir = build_examples(root, &logs)?;
    let devices = match env::var("BLUERDMA_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => DEVICES.to_string(),
    };
    let mut runs = Vec::new();
    for ex in &EXAMPLES {
        if opts.only.as_deref().is_some_and(|t| !ex.bin.contains(t)) {
            continue;
        }
        runs.push(run_example(
            ex,
            &bin_dir,
            &lib_dir,
            &devices,
            &logs,
            opts.timeout,
        ));
    }
    print_report(&runs, &lib_dir, &devices, start);
    Ok(runs)
}

/// Installs, in one apt run, the packages whose probe file is missing.
fn ensure_build_tools(timeout: Duration) -> Result<(), String> {
    // bindgen (clang-sys) finds libclang under /usr/lib/llvm-*/lib.
    let libclang = || {
        std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with("llvm-")
                    && e.path().join("lib/libclang.so").exists()
            })
    };
    let probes: [(&str, &str); 5] = [
        ("/usr/bin/cmake", "cmake"),
        ("/usr/include/libnl3/netlink/netlink.h", "libnl-3-dev"),
        (
            "/usr/include/libnl3/netlink/route/link.h",
            "libnl-route-3-dev",
        ),
        ("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
        ("/usr/bin/pkg-config", "pkg-config"),
    ];
    let missing = |clang: bool| {
        let mut m: Vec<&str> = probes
            .iter()
            .filter(|(f, _)| !Path::new(f).exists())
            .map(|(_, p)| *p)
            .collect();
        if !clang {
            m.push("libclang-dev");
        }
        m
    };
    let need = missing(libclang());
    if need.is_empty() {
        return Ok(());
    }
    perftest::apt_install("ecosystem", &need, timeout)?;
    match missing(libclang()).as_slice() {
        [] => Ok(()),
        still => Err(format!(
            "ecosystem: still missing after apt-get: {} (the sys crates' build scripts need them)",
            still.join(" ")
        )),
    }
}

/// `cargo build --release --locked` of the examples workspace; returns its binary directory.
fn build_examples(root: &Path, logs: &Path) -> Result<PathBuf, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = root.join("target").join("ecosystem");
    let manifest = root.join("examples").join("ecosystem").join("Cargo.toml");
    let log = logs.join("build.log");
    println!(
        "ecosystem: cargo build --release --locked --manifest-path {} --target-dir {}",
        manifest.display(),
        target.display()
    );
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .current_dir(root);
    let exit = perftest::spawn_logged(cmd, &log).wait(Instant::now() + Duration::from_secs(1800));
    if exit == Exit::Code(0) {
        return Ok(target.join("release"));
    }
    let out = perftest::read_log(&log);
    perftest::print_tail_folded(&out, TAIL);
    let fetch = [
        "failed to download",
        "failed to get",
        "failed to query replaced source",
        "Unable to update registry",
        "Could not resolve host",
        "failed to fetch",
        "spurious network error",
    ];
    Err(if fetch.iter().any(|t| out.contains(t)) {
        format!(
            "ecosystem: cargo could not FETCH the crates from crates.io (no network or registry \
             down?); nothing was tested. Log: {}",
            log.display()
        )
    } else {
        format!(
            "ecosystem: building examples/ecosystem failed (exit {exit}); see {}",
            log.display()
        )
    })
}

fn run_example(
    ex: &Example,
    bin_dir: &Path,
    lib_dir: &Path,
    devices: &str,
    logs: &Path,
    timeout: Duration,
) -> Run {
    let log = logs.join(format!("{}.log", ex.bin));
    let bin = bin_dir.join(ex.bin);
    println!(
        "ecosystem: LD_LIBRARY_PATH={} BLUERDMA_DEVICES={devices} {}",
        lib_dir.display(),
        bin.display()
    );
    let mut cmd = Command::new(&bin);
    cmd.env("LD_LIBRARY_PATH", lib_dir)
        .env("BLUERDMA_DEVICES", devices);
    let mut procs = [perftest::spawn_logged(cmd, &log)];
    perftest::wait_all(&mut procs, Instant::now() + timeout);
    let exit = procs[0].exit.unwrap_or(Exit::Timeout);
    let out = perftest::read_log(&log);
    let ok_prefix = format!("{}: ok:", ex.program);
    let line = match out.lines().find(|l| l.starts_with(&ok_prefix)) {
        Some(l) => Ok(l.to_string()),
        None => Err(out
            .lines()
            .find(|l| l.starts_with(ex.program))
            .map_or_else(|| format!("no `{ok_prefix}` line"), str::to_string)),
    };
    Run {
        program: ex.program,
        exit,
        time: procs[0].elapsed(),
        line,
        log,
    }
}

fn print_report(runs: &[Run], lib_dir: &Path, devices: &str, start: Instant) {
    let rows: Vec<TableRow> = runs
        .iter()
        .map(|r| TableRow {
            label: r.program,
            who: "0 -> 1",
            exit: r.exit,
            time: r.time,
            figure: match &r.line {
                Ok(l) => l
                    .split_once(": ok: ")
                    .map_or(l.as_str(), |(_, s)| s)
                    .to_string(),
                Err(p) => format!("BAD OUTPUT: {p}"),
            },
        })
        .collect();
    perftest::print_table(["crate", "devices"], &rows);
    let failed: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
    for r in &failed {
        eprintln!();
        eprintln!("ecosystem: FAILED {} (exit {})", r.program, r.exit);
        eprintln!("  last lines of {}:", r.log.display());
        perftest::print_tail_folded(&perftest::read_log(&r.log), TAIL);
    }
    println!(
        "ecosystem: {} of {} examples passed in {:.0} s (build included); \
         BLUERDMA_DEVICES={devices} LD_LIBRARY_PATH={}",
        runs.len() - failed.len(),
        runs.len(),
        start.elapsed().as_secs_f64(),
        lib_dir.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let o = Opts::parse(&[
            "--only".into(),
            "sideway".into(),
            "--timeout".into(),
            "5".into(),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.only.as_deref(), Some("sideway"));
        assert_eq!(o.timeout, Duration::from_secs(5));
        assert!(Opts::parse(&["--bogus".into()]).is_err());
    }
}
