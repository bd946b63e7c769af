//! `cargo xtask rdmacm` (issue K): unmodified rdma_cm programs over the librdmacm.so.1 and
//! libibverbs.so.1 stand-ins, with no kernel rdma_cm.
//!
//! 1. Builds both stand-ins into `target/ibverbs/` ([`perftest::build_library`]).
//! 2. Installs `rdmacm-utils` and `perftest` with apt-get if `rping` or `ib_write_bw` is
//!    missing.
//! 3. Runs rping (CM-made QPs and `-q`, the program's own QPs), udaddy, rdma_server with
//!    rdma_client, and `ib_write_bw`, `ib_read_bw` and `ib_send_lat` with `-R`: each pair is
//!    a server on the first device and a client on the second, started once the server's CM
//!    port listens, both ends killed at the deadline, every exit code and output checked.
//! 4. Unless `--no-cargo-test` (as in `cargo xtask ci`, whose test rows already run them),
//!    runs the crate's Rust tests in release: the ABI checks, the fault tests and 1,000
//!    connect/disconnect cycles on one listener.
//!
//! Wiring (main.rs): `mod rdmacm;`, `Some("rdmacm") => rdmacm::rdmacm(&root, &args[1..])`,
//! and in `ci`: `rows.push(rdmacm::ci_row(&root));`.

use std::env;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::perftest::{self, Exit, Proc, TableRow};
use super::Row;

/// The CM's TCP port the servers listen on (the library's default).
const CM_PORT: u16 = 60001;
/// The UDP port of the emulated link each device binds.
const LINK_PORT: u16 = 4791;
const SERVER_IP: &str = "127.0.0.1";
const CLIENT_IP: &str = "127.0.0.2";
/// Lines of a failed command's output that are printed.
const TAIL: usize = 25;

const USAGE: &str = "\
usage: cargo xtask rdmacm [--only TEXT] [--timeout SECS] [--no-cargo-test]

Builds target/ibverbs/{libibverbs,librdmacm}.so.1 (the blue-rdma stand-ins) and runs rping,
udaddy, rdma_server/rdma_client and perftest with -R over them on the emulated NIC (server
on 127.0.0.1, client on 127.0.0.2, the CM exchange on TCP port 60001), then the Rust tests
of bluerdma-rdmacm. Installs rdmacm-utils and perftest with apt-get if they are missing.

options:
  --only TEXT      run only the programs whose label contains TEXT (e.g. `rping`)
  --timeout SECS   hard limit per pair; both ends are killed (default 60)
  --no-cargo-test  skip `cargo test -p bluerdma-rdmacm`
";

/// What a program's output must show.
#[derive(Clone, Copy)]
enum Check {
    /// Exit code 0 is all (rping prints nothing with `-V` and no `-v`).
    Exit,
    /// A line containing this text, on both ends.
    Line(&'static str),
    /// perftest's result table: the column after `#bytes #iterations` at this index.
    Table(usize, &'static str),
}

/// One server/client pair.
struct Pair {
    label: &'static str,
    server: Vec<String>,
    client: Vec<String>,
    check: Check,
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn pairs() -> Vec<Pair> {
    let (s, c) = (SERVER_IP, CLIENT_IP);
    let perf = |label, tool: &str, size: usize, port: u16, check| Pair {
        label,
        server: args(&format!(
            "{tool} -R -d bluerdma0 -s {size} -n 500 -p {port}"
        )),
        client: args(&format!(
            "{tool} -R -d bluerdma1 -s {size} -n 500 -p {port} --source_ip {c} {s}"
        )),
        check,
    };
    vec![
        // rping's server reads the client's buffer into one of its own -S size: both
        // ends need the same -S.
        Pair {
            label: "rping",
            server: args(&format!("rping -s -a {s} -S 4096 -p 7174")),
            client: args(&format!("rping -c -I {c} -a {s} -C 100 -S 4096 -V -p 7174")),
            check: Check::Exit,
        },
        Pair {
            label: "rping -q",
            server: args(&format!("rping -s -q -a {s} -S 4096 -p 7175")),
            client: args(&format!(
                "rping -c -q -I {c} -a {s} -C 100 -S 4096 -V -p 7175"
            )),
            check: Check::Exit,
        },
        Pair {
            label: "udaddy",
            server: args(&format!("udaddy -b {s}")),
            client: args(&format!("udaddy -b {c} -s {s}")),
            check: Check::Line("return status 0"),
        },
        Pair {
            label: "rdma_server/rdma_client",
            server: args(&format!("rdma_server -s {s} -p 7471")),
            client: args(&format!("rdma_client -s {s} -p 7471")),
            check: Check::Line(": end 0"),
        },
        perf(
            "ib_write_bw -R",
            "ib_write_bw",
            65536,
            18620,
            Check::Table(3, "MB/s"),
        ),
        perf(
            "ib_read_bw -R",
            "ib_read_bw",
            65536,
            18621,
            Check::Table(3, "MB/s"),
        ),
        perf(
            "ib_send_lat -R",
            "ib_send_lat",
            8,
            18622,
            Check::Table(4, "usec"),
        ),
    ]
}

struct Opts {
    only: Option<String>,
    timeout: Duration,
    cargo_test: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            only: None,
            timeout: Duration::from_secs(60),
            cargo_test: true,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--only" => o.only = Some(it.next().ok_or("rdmacm: --only needs a text")?.clone()),
                "--timeout" => {
                    let v = it.next().ok_or("rdmacm: --timeout needs seconds")?;
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| format!("rdmacm: --timeout {v}: not a number"))?;
                    o.timeout = Duration::from_secs(secs.max(1));
                }
                "--no-cargo-test" => o.cargo_test = false,
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("rdmacm: unknown option `{other}`\n{USAGE}")),
            }
        }
        Ok(Some(o))
    }
}

/// One program run, as it ended.
struct Run {
    label: String,
    role: &'static str,
    exit: Exit,
    time: Duration,
    figure: String,
    problem: Option<String>,
    log: PathBuf,
    command: String,
}

impl Run {
    fn ok(&self) -> bool {
        self.exit == Exit::Code(0) && self.problem.is_none()
    }
}

/// `cargo xtask rdmacm [OPTIONS]`.
pub fn rdmacm(root: &Path, args: &[String]) -> Result<(), String> {
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let runs = run(root, &opts)?;
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} {}", r.label, r.role))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("rdmacm: failed: {}", failed.join(", ")))
    }
}

/// The row of `cargo xtask ci`: each program end is one check.
pub fn ci_row(root: &Path) -> Row {
    println!("ci: rdmacm: rdma_cm programs over target/ibverbs/librdmacm.so.1");
    let start = Instant::now();
    let opts = Opts {
        only: None,
        timeout: Duration::from_secs(60),
        cargo_test: false,
    };
    let suite = "rdmacm (rping, udaddy, perftest -R)".to_string();
    match run(root, &opts) {
        Ok(runs) => {
            let failed: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
            Row {
                suite,
                passed: (runs.len() - failed.len()) as u64,
                failed: failed.len() as u64,
                time: start.elapsed(),
                note: match failed.first() {
                    None => headline(&runs),
                    Some(r) => format!("{} {} failed; see {}", r.label, r.role, r.log.display()),
                },
            }
        }
        Err(e) => {
            eprintln!("ci: rdmacm: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

/// The note of a passing row: perftest's figures.
fn headline(runs: &[Run]) -> String {
    runs.iter()
        .filter(|r| {
            r.role == "client" && (r.figure.ends_with("MB/s") || r.figure.ends_with("usec"))
        })
        .map(|r| format!("{} {}", r.label.trim_end_matches(" -R"), r.figure))
        .collect::<Vec<_>>()
        .join("; ")
}

fn run(root: &Path, opts: &Opts) -> Result<Vec<Run>, String> {
    let start = Instant::now();
    let lib_dir = perftest::build_library(root)?;
    ensure_tools(opts.timeout)?;
    for ip in [SERVER_IP, CLIENT_IP] {
        let a: Ipv4Addr = ip.parse().expect("a literal address");
        if perftest::socket_in(&["/proc/net/udp"], Some(a), LINK_PORT, None) {
            return Err(format!(
                "rdmacm: UDP {ip}:{LINK_PORT} is already bound by another process (an ibverbs \
                 tool still running?); stop it (`ss -uanp | grep {LINK_PORT}`)"
            ));
        }
    }
    let logs = root.join("target").join("xtask").join("rdmacm");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let mut runs = Vec::new();
    for pair in pairs() {
        if opts
            .only
            .as_deref()
            .is_some_and(|t| !pair.label.contains(t))
        {
            continue;
        }
        runs.extend(run_pair(&pair, &lib_dir, &logs, opts.timeout));
    }
    print_report(&runs, &lib_dir, start);
    if opts.cargo_test {
        runs.push(cargo_test(root, &logs));
    }
    Ok(runs)
}

/// Installs `rdmacm-utils` and `perftest` when their probe binary is missing.
fn ensure_tools(timeout: Duration) -> Result<(), String> {
    let probes = [("rping", "rdmacm-utils"), ("ib_write_bw", "perftest")];
    let missing: Vec<&str> = probes
        .iter()
        .filter(|(b, _)| !perftest::on_path(b))
        .map(|(_, p)| *p)
        .collect();
    if !missing.is_empty() {
        perftest::apt_install("rdmacm", &missing, timeout)?;
    }
    match probes.iter().find(|(b, _)| !perftest::on_path(b)) {
        Some((bin, pkg)) => Err(format!(
            "rdmacm: {bin} still missing (apt-get install {pkg})"
        )),
        None => Ok(()),
    }
}

fn spawn(argv: &[String], lib_dir: &Path, log: &Path) -> Proc {
    let path = match env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = lib_dir.as_os_str().to_owned();
            p.push(":");
            p.push(old);
            p
        }
        _ => lib_dir.as_os_str().to_owned(),
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).env("LD_LIBRARY_PATH", path);
    perftest::spawn_logged(cmd, log)
}

/// Whether the server's CM port listens on its address.
fn cm_listening() -> bool {
    let ip: Ipv4Addr = SERVER_IP.parse().expect("a literal address");
    perftest::socket_in(&["/proc/net/tcp"], Some(ip), CM_PORT, Some("0A"))
}

fn run_pair(pair: &Pair, lib_dir: &Path, logs: &Path, timeout: Duration) -> [Run; 2] {
    let name: String = pair
        .label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let (slog, clog) = (
        logs.join(format!("{name}_server.log")),
        logs.join(format!("{name}_client.log")),
    );
    println!(
        "rdmacm: {}  &&  {}",
        pair.server.join(" "),
        pair.client.join(" ")
    );
    let deadline = Instant::now() + timeout;
    let mut procs = Vec::with_capacity(2);
    let busy = cm_listening();
    procs.push(if busy {
        Proc::failed_to_start()
    } else {
        spawn(&pair.server, lib_dir, &slog)
    });
    // The client starts once the server's CM port listens, not after a fixed sleep.
    while !procs[0].poll() && !cm_listening() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    procs.push(if procs[0].exit.is_none() && cm_listening() {
        spawn(&pair.client, lib_dir, &clog)
    } else {
        Proc::failed_to_start()
    });
    perftest::wait_all(&mut procs, deadline);
    let finish = |role: &'static str, p: &Proc, log: PathBuf, argv: &[String]| {
        let out = perftest::read_log(&log);
        let exit = p.exit.unwrap_or(Exit::Timeout);
        let (figure, mut problem) = examine(pair.check, role, &out);
        if busy {
            problem = Some(format!(
                "TCP port {CM_PORT} on {SERVER_IP} is already in use"
            ));
        }
        Run {
            label: pair.label.to_string(),
            role,
            exit,
            time: p.elapsed(),
            figure,
            problem: problem.filter(|_| exit == Exit::Code(0) || busy),
            log,
            command: argv.join(" "),
        }
    };
    [
        finish("server", &procs[0], slog, &pair.server),
        finish("client", &procs[1], clog, &pair.client),
    ]
}

/// The figure column and, if the output is not what it must be, the problem.
fn examine(check: Check, role: &str, out: &str) -> (String, Option<String>) {
    match check {
        Check::Exit => ("-".into(), None),
        Check::Line(text) => match out.lines().find(|l| l.contains(text)) {
            Some(l) => (l.trim().to_string(), None),
            None => ("-".into(), Some(format!("no `{text}` line"))),
        },
        Check::Table(col, unit) => {
            let value = out
                .lines()
                .skip_while(|l| !l.trim_start().starts_with("#bytes"))
                .skip(1)
                .map(|l| {
                    l.split_whitespace()
                        .map(str::parse::<f64>)
                        .collect::<Result<Vec<_>, _>>()
                })
                .find_map(|v| v.ok().filter(|v| v.len() > col))
                .map(|v| v[col]);
            match (value, role) {
                (Some(v), _) => (format!("{v:.2} {unit}"), None),
                // ib_send_lat's server prints no table.
                (None, "server") if unit == "usec" => ("-".into(), None),
                (None, _) => ("-".into(), Some("no result table".into())),
            }
        }
    }
}

fn print_report(runs: &[Run], lib_dir: &Path, start: Instant) {
    let rows: Vec<TableRow> = runs
        .iter()
        .map(|r| TableRow {
            label: &r.label,
            who: r.role,
            exit: r.exit,
            time: r.time,
            figure: match &r.problem {
                Some(p) => format!("{}  BAD OUTPUT: {p}", r.figure),
                None => r.figure.clone(),
            },
        })
        .collect();
    perftest::print_table(["program", "role"], &rows);
    let failed: Vec<&Run> = runs.iter().filter(|r| !r.ok()).collect();
    for r in &failed {
        eprintln!();
        eprintln!(
            "rdmacm: FAILED {} {} (exit {}): {}",
            r.label, r.role, r.exit, r.command
        );
        if let Some(p) = &r.problem {
            eprintln!("  {p}");
        }
        eprintln!("  last lines of {}:", r.log.display());
        perftest::print_tail_folded(&perftest::read_log(&r.log), TAIL);
    }
    println!(
        "rdmacm: {} of {} program runs passed in {:.0} s; library: export LD_LIBRARY_PATH={}",
        runs.len() - failed.len(),
        runs.len(),
        start.elapsed().as_secs_f64(),
        lib_dir.display()
    );
}

/// `cargo test --release -p bluerdma-rdmacm`, as one run.
fn cargo_test(root: &Path, logs: &Path) -> Run {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let log = logs.join("cargo_test.log");
    println!("rdmacm: cargo test --release -p bluerdma-rdmacm");
    let mut cmd = Command::new(&cargo);
    cmd.args(["test", "--release", "-p", "bluerdma-rdmacm"])
        .current_dir(root);
    let p = perftest::spawn_logged(cmd, &log);
    let exit = p.wait(Instant::now() + Duration::from_secs(900));
    let out = perftest::read_log(&log);
    let passed: u64 = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("test result: "))
        .filter_map(|l| {
            l.split(';')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        })
        .sum();
    if exit != Exit::Code(0) {
        perftest::print_tail_folded(&out, TAIL);
    }
    println!("rdmacm: cargo test: exit {exit}, {passed} tests passed");
    Run {
        label: "cargo test -p bluerdma-rdmacm".into(),
        role: "-",
        exit,
        time: Duration::ZERO,
        figure: format!("{passed} passed"),
        problem: None,
        log,
        command: "cargo test --release -p bluerdma-rdmacm".into(),
    }
}
