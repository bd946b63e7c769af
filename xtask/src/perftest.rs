//! `cargo xtask perftest` (issue G): unmodified `ibverbs-utils` and `perftest` binaries on the
//! emulated NIC, through the `libibverbs.so.1` stand-in (`platform-linux/ibverbs`).
//!
//! 1. Builds the stand-in in release and copies it to `target/ibverbs/libibverbs.so.1`.
//! 2. Installs `ibverbs-utils` and `perftest` with apt-get if `ibv_devinfo` or `ib_write_bw`
//!    is missing.
//! 3. Runs `ibv_devices`, `ibv_devinfo`, `ibv_rc_pingpong` (polling, `-e` and `-N`),
//!    `ibv_srq_pingpong -q 64`, `ibv_ud_pingpong -s 2048`, `ib_write_bw` (and `-t 4096`),
//!    `ib_read_bw`, `ib_send_bw`, `ib_write_lat`, `ib_atomic_bw` and `ib_atomic_lat` (8-byte
//!    fetch-and-add: no `-s`) with `LD_LIBRARY_PATH` pointing there;
//!    every pair is a server on the first device and a client on the second, with its own
//!    TCP exchange port, and the client starts once the server listens on it. Each command
//!    has a hard timeout (both ends are killed), and every exit code is checked.
//! 4. Measures the TCP loopback baseline in the same run ([`bluerdma_sim::baseline`], run
//!    through `xtask --features tcp-baseline` so that plain `cargo xtask` stays std-only)
//!    and prints one table with the figures and the ratios to TCP.
//!
//! Wiring (main.rs): `mod perftest;`, `Some("perftest") => perftest::perftest(&root,
//! &args[1..])`, and in `ci`: `rows.push(perftest::ci_row(&root, quick));`.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::backends::{build_release, Backend, ServedCards};
use super::Row;

/// The hidden first argument that makes `perftest` measure the TCP baseline only (needs the
/// `tcp-baseline` feature).
const TCP_BASELINE: &str = "--tcp-baseline";
/// The first TCP exchange port (`-p`); pair `i` uses `port + i`. Not the tools' default
/// (18515), so that a hand-run pair on the same machine does not meet ours.
const DEFAULT_PORT: u16 = 18600;
/// The devices when `BLUERDMA_DEVICES` is not set (the stand-in's default).
const DEFAULT_IPS: [&str; 2] = ["127.0.0.1", "127.0.0.2"];
/// The UDP port of the emulated link each opened device binds on its address.
const LINK_PORT: u16 = 4791;
/// Message sizes: the bandwidth tools and the TCP stream, then the latency tool and the TCP
/// ping-pong.
const BW_SIZE: usize = 65536;
const LAT_SIZE: usize = 8;
/// Lines of a failed command's output that are printed.
const TAIL: usize = 25;

const USAGE: &str = "\
usage: cargo xtask perftest [--quick] [--keep-going] [--only TEXT] [--timeout SECS] [--port N]
                            [--backend emulated|rtl|pci]
       cargo xtask perftest --shared N [shared-perf options]

Builds target/ibverbs/libibverbs.so.1 (the blue-rdma stand-in) and runs ibverbs-utils and
perftest over it on the emulated NIC (bluerdma0 = server, bluerdma1 = client; the devices
come from BLUERDMA_DEVICES when it is set), next to a TCP loopback baseline measured in the
same run. Installs ibverbs-utils and perftest with apt-get if they are missing.

With --backend rtl the two devices are cards served by `bluerdma-sim serve` (the RTL
simulator's sockets; smaller sizes, which fit its speed); with --backend pci they are fake
PCI cards served by `bluerdma-sim pci-serve` (root only), and the tools run with the
hugepage allocator preloaded (target/release/libbluerdma_hugealloc.so) so that their
malloc'd buffers register.

options:
  --quick         fewer iterations (bw/lat -n 200, pingpong -n 100) and a shorter baseline
  --keep-going    run every tool even after one failed (default: stop at the first failure)
  --only TEXT     run only the tools whose command line contains TEXT (e.g. `write_bw`, `-e`)
  --timeout SECS  hard limit per command; both ends of a pair are killed (default 30)
  --port N        first TCP exchange port (-p); pair i uses N + i (default 18600)
  --backend NAME  emulated (default), rtl or pci
  --shared N      instead: N pairs at once on the two devices shared (BLUERDMA_SHARED=1),
                  as `cargo xtask shared-perf --pairs N` (`cargo xtask shared-perf --help`)
";

/// Options of one run.
#[derive(Clone, Debug)]
struct Opts {
    quick: bool,
    keep_going: bool,
    only: Option<String>,
    timeout: Duration,
    port: u16,
    backend: Backend,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            quick: false,
            keep_going: false,
            only: None,
            timeout: Duration::from_secs(30),
            port: DEFAULT_PORT,
            backend: Backend::Emulated,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |what: &str| {
                it.next()
                    .ok_or_else(|| format!("perftest: {a} needs {what}"))
                    .cloned()
            };
            match a.as_str() {
                "--quick" => o.quick = true,
                "--keep-going" => o.keep_going = true,
                "--only" => o.only = Some(value("a text")?),
                "--timeout" => {
                    let v = value("a number of seconds")?;
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| format!("perftest: --timeout {v}: not a number"))?;
                    o.timeout = Duration::from_secs(secs.max(1));
                }
                "--port" => {
                    let v = value("a port")?;
                    o.port = v
                        .parse()
                        .map_err(|_| format!("perftest: --port {v}: not a port"))?;
                }
                "--backend" => o.backend = Backend::parse(&value("a backend")?)?,
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                other => return Err(format!("perftest: unknown option `{other}`\n{USAGE}")),
            }
        }
        Ok(Some(o))
    }

    /// Whether `--only` selects the tool run as `label`.
    fn selects(&self, label: &str) -> bool {
        self.only.as_deref().is_none_or(|t| label.contains(t))
    }

    /// `-n` of the bandwidth and latency tools, and of the ping-pong.
    fn iters(&self) -> (u32, u32) {
        match (self.quick, self.backend) {
            // The RTL protocol's DMA socket moves a few MB/s.
            (_, Backend::Rtl) => (100, 50),
            (true, _) => (200, 100),
            (false, _) => (1000, 500),
        }
    }

    /// `-s` of the bandwidth tools (the same on every backend: 64 KiB over the RTL protocol
    /// failed with RETRY_EXC_ERR before its backend had an ACK-timeout floor).
    fn bw_size(&self) -> usize {
        BW_SIZE
    }

    /// Seconds of TCP stream and round trips of TCP ping-pong.
    fn baseline(&self) -> (f64, u32) {
        if self.quick {
            (0.3, 2_000)
        } else {
            (1.0, 10_000)
        }
    }
}

/// `cargo xtask perftest [OPTIONS]`.
pub fn perftest(root: &Path, args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some(TCP_BASELINE) {
        return tcp_baseline_main(&args[1..]);
    }
    if let Some(i) = args.iter().position(|a| a == "--shared") {
        let n = args
            .get(i + 1)
            .ok_or("perftest: --shared needs a number of pairs")?;
        let mut rest = vec!["--pairs".to_string(), n.clone()];
        rest.extend(args[..i].iter().cloned());
        rest.extend(args.get(i + 2..).unwrap_or(&[]).iter().cloned());
        return super::shared_perf::shared_perf(root, &rest);
    }
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let report = run(root, &opts)?;
    report.print();
    report.verdict()
}

/// The row of `cargo xtask ci`: every tool run counts as one check (passed or failed), and
/// the note carries the headline figures or the first failure.
pub fn ci_row(root: &Path, quick: bool, backend: Backend) -> Row {
    println!(
        "ci: perftest: ibverbs-utils and perftest over target/ibverbs/libibverbs.so.1 ({})",
        backend.name()
    );
    let start = Instant::now();
    let opts = Opts {
        quick,
        keep_going: true,
        only: None,
        timeout: Duration::from_secs(if backend == Backend::Rtl { 60 } else { 30 }),
        port: DEFAULT_PORT,
        backend,
    };
    let suite = match backend {
        Backend::Emulated => "perftest (ibverbs tools)".to_string(),
        b => format!("perftest (ibverbs tools, {})", b.name()),
    };
    match run(root, &opts) {
        Ok(report) => {
            report.print();
            let failed = report.runs.iter().filter(|r| !r.ok()).count() as u64
                + report.baseline.is_err() as u64;
            Row {
                suite,
                passed: report.runs.iter().filter(|r| r.ok()).count() as u64,
                failed,
                time: start.elapsed(),
                note: match report.verdict() {
                    Ok(()) => report.headline(),
                    Err(e) => e,
                },
            }
        }
        Err(e) => {
            eprintln!("ci: perftest: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

/// What one run found.
struct Report {
    runs: Vec<ToolRun>,
    baseline: Result<Baseline, String>,
    lib_dir: PathBuf,
    elapsed: Duration,
}

/// Builds the library, makes sure the tools are there, and runs everything.
fn run(root: &Path, opts: &Opts) -> Result<Report, String> {
    let start = Instant::now();
    let lib_dir = build_library(root)?;
    ensure_tools(opts)?;
    let ips = match opts.backend {
        Backend::Emulated => device_ips(),
        _ => DEFAULT_IPS.iter().map(|s| s.to_string()).collect(),
    };
    if ips.len() < 2 {
        return Err(format!(
            "perftest: needs two devices, BLUERDMA_DEVICES gives {}",
            ips.len()
        ));
    }
    check_link_ports_free(&ips)?;
    // Served cards for the other backends, and what the tools need to open them.
    let mut env = Vec::new();
    let cards = match opts.backend {
        Backend::Emulated => None,
        b => {
            let names = ["bluerdma0", "bluerdma1"];
            let ip_refs: Vec<&str> = ips.iter().map(String::as_str).collect();
            let cards = ServedCards::start(root, b, &names, &ip_refs, 128)?;
            env.push(("BLUERDMA_DEVICES".to_string(), cards.devices.clone()));
            Some(cards)
        }
    };
    if opts.backend == Backend::Pci {
        // perftest mallocs its buffers; the card registers 2 MiB hugetlb pages only.
        let lib = build_release(root, "bluerdma-hugealloc", None)?.join("libbluerdma_hugealloc.so");
        env.push(("LD_PRELOAD".to_string(), lib.display().to_string()));
    }
    // One directory per backend: the rows run one after another and name their logs by
    // tool, so a later row overwrote the logs of an earlier row's failure.
    let logs = match opts.backend {
        Backend::Emulated => root.join("target").join("xtask").join("perftest"),
        b => root
            .join("target")
            .join("xtask")
            .join("perftest")
            .join(format!("{b:?}").to_lowercase()),
    };
    fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let ctx = RunCtx {
        lib_dir: &lib_dir,
        logs: &logs,
        timeout: opts.timeout,
        env: &env,
    };

    let baseline = measure_baseline(root, opts, &ips[0]);
    let mut runs = Vec::new();
    for (tool, check) in [
        ("ibv_devices", Check::Devices),
        ("ibv_devinfo", Check::DevInfo),
    ] {
        if !opts.selects(tool) {
            continue;
        }
        let run = ctx.single(tool, check, ips.len());
        let ok = run.ok();
        runs.push(run);
        if !ok && !opts.keep_going {
            return Ok(Report::new(runs, baseline, lib_dir, start));
        }
    }
    let _cards = cards;
    for (i, pair) in pairs(opts).iter().enumerate() {
        if !opts.selects(&format!("{} {}", pair.tool, pair.tag)) {
            continue;
        }
        let port = opts.port.wrapping_add(i as u16);
        let pair_runs = ctx.pair(pair, port, &ips[0]);
        let ok = pair_runs.iter().all(ToolRun::ok);
        runs.extend(pair_runs);
        if !ok && !opts.keep_going {
            break;
        }
    }
    Ok(Report::new(runs, baseline, lib_dir, start))
}

/// `cargo build --release -p bluerdma-ibverbs -p bluerdma-rdmacm -p bluerdma-linux`, then the
/// copies named `libibverbs.so.1` and `librdmacm.so.1` in one directory (one LD_LIBRARY_PATH
/// serves both), and `bluerdma-devd` beside them (where the library looks for it first when
/// a device is shared, `BLUERDMA_SHARED=1`).
pub(crate) fn build_library(root: &Path) -> Result<PathBuf, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!(
        "perftest: cargo build --release -p bluerdma-ibverbs -p bluerdma-rdmacm -p bluerdma-linux"
    );
    let status = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "bluerdma-ibverbs",
            "-p",
            "bluerdma-rdmacm",
            "-p",
            "bluerdma-linux",
        ])
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot start `{cargo} build`: {e}"))?;
    if !status.success() {
        return Err(
            "perftest: building bluerdma-ibverbs or bluerdma-rdmacm failed (see above)".into(),
        );
    }
    let dir = root.join("target").join("ibverbs");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for name in ["libibverbs.so", "librdmacm.so"] {
        let built = root.join("target").join("release").join(name);
        let lib = dir.join(format!("{name}.1"));
        // Remove first: a running tool may still map the old file, which a copy would overwrite.
        let _ = fs::remove_file(&lib);
        fs::copy(&built, &lib)
            .map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), lib.display()))?;
        println!("perftest: the stand-in is {}", lib.display());
    }
    let devd = root.join("target").join("release").join("bluerdma-devd");
    let to = dir.join("bluerdma-devd");
    let _ = fs::remove_file(&to);
    fs::copy(&devd, &to)
        .map_err(|e| format!("cannot copy {} to {}: {e}", devd.display(), to.display()))?;
    println!("perftest:   export LD_LIBRARY_PATH={}", dir.display());
    Ok(dir)
}

/// Whether `bin` is an executable file in a `PATH` directory.
pub(crate) fn on_path(bin: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    env::var_os("PATH").is_some_and(|path| {
        env::split_paths(&path).any(|d| {
            fs::metadata(d.join(bin))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Installs `ibverbs-utils` and `perftest` with apt-get when their probe binary is missing.
fn ensure_tools(opts: &Opts) -> Result<(), String> {
    let missing: Vec<&str> = [
        ("ibv_devinfo", "ibverbs-utils"),
        ("ib_write_bw", "perftest"),
    ]
    .iter()
    .filter(|(bin, _)| !on_path(bin))
    .map(|(_, pkg)| *pkg)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install("perftest", &missing, opts.timeout)?;
    for bin in ["ibv_devinfo", "ib_write_bw"] {
        if !on_path(bin) {
            return Err(format!(
                "perftest: {bin} still missing after installing {}",
                missing.join(" ")
            ));
        }
    }
    Ok(())
}

/// `apt-get update` then `apt-get install` of `packages` (through `sudo -n` when not root),
/// each with a hard limit; `tag` prefixes the messages. A clear error when it cannot be done.
pub(crate) fn apt_install(tag: &str, packages: &[&str], timeout: Duration) -> Result<(), String> {
    let list = packages.join(" ");
    if !on_path("apt-get") {
        return Err(format!(
            "{tag}: {list} not installed and apt-get is not available; install them with \
             the system's package manager"
        ));
    }
    let root_user = crate::backends::is_root();
    let sudo: &[&str] = if root_user { &[] } else { &["sudo", "-n"] };
    let apt = |args: &[&str]| -> Result<(), String> {
        let mut argv: Vec<&str> = sudo.to_vec();
        argv.push("apt-get");
        argv.extend_from_slice(args);
        println!("{tag}: {}", argv.join(" "));
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
        let limit = Duration::from_secs(300).max(timeout);
        match Proc::started(child).wait(Instant::now() + limit) {
            Exit::Code(0) => Ok(()),
            other => Err(format!(
                "{tag}: `{}` failed ({other}); install {list} by hand \
                 (apt-get install {list})",
                argv.join(" ")
            )),
        }
    };
    println!("{tag}: {list} missing: installing with apt-get");
    apt(&["update", "-q"])?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(packages.iter().copied());
    apt(&install)?;
    Ok(())
}

/// The device addresses in order (`bluerdma0`, `bluerdma1`, …), as the stand-in reads them.
fn device_ips() -> Vec<String> {
    match env::var("BLUERDMA_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            // `name=ip[@mac][+backend][;options]`: the address alone.
            .map(|d| {
                let addr = d.split_once('=').map_or(d, |(_, rest)| rest);
                addr.split(['@', '+', ';'])
                    .next()
                    .unwrap_or(addr)
                    .trim()
                    .to_string()
            })
            .filter(|ip| !ip.is_empty())
            .collect(),
        _ => DEFAULT_IPS.iter().map(|s| s.to_string()).collect(),
    }
}

/// Waits until no process binds the devices' link ports (a shared device's daemon exits
/// 3 s after its last client), up to `limit`; then [`check_link_ports_free`]'s answer.
pub(crate) fn wait_link_ports_free(ips: &[String], limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match check_link_ports_free(ips) {
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
            done => return done,
        }
    }
}

/// Each opened device binds UDP `<ip>:4791`; a stray process holding it makes every tool
/// fail with `Address already in use`, so say so once, up front.
fn check_link_ports_free(ips: &[String]) -> Result<(), String> {
    let taken: Vec<String> = ips
        .iter()
        .filter(|ip| {
            ip.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| socket_in(&["/proc/net/udp"], Some(a), LINK_PORT, None))
        })
        .map(|ip| format!("{ip}:{LINK_PORT}"))
        .collect();
    if taken.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "perftest: UDP {} already bound by another process (an ibverbs tool or \
             `cargo xtask sim` still running?); stop it (`ss -uanp | grep {LINK_PORT}`) or \
             run with other addresses, e.g. BLUERDMA_DEVICES=a=127.0.9.1,b=127.0.9.2",
            taken.join(", ")
        ))
    }
}

/// Whether a socket in the `/proc/net/{tcp,udp}*` tables has local `port` (and address
/// `ip` if given; IPv4 tables only then) and state `state` (hex, `0A` = LISTEN) if given.
pub(crate) fn socket_in(
    tables: &[&str],
    ip: Option<std::net::Ipv4Addr>,
    port: u16,
    state: Option<&str>,
) -> bool {
    let want_port = format!("{port:04X}");
    // /proc/net/udp and tcp print the IPv4 address as the native-endian u32 in hex.
    let want_ip = ip.map(|a| format!("{:08X}", u32::from_ne_bytes(a.octets())));
    tables.iter().any(|t| {
        fs::read_to_string(t).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let Some((addr, p)) = f.get(1).and_then(|a| a.rsplit_once(':')) else {
                    return false;
                };
                p == want_port
                    && want_ip.as_deref().is_none_or(|w| addr == w)
                    && state.is_none_or(|s| f.get(3) == Some(&s))
            })
        })
    })
}

fn listening(port: u16) -> bool {
    socket_in(&["/proc/net/tcp", "/proc/net/tcp6"], None, port, Some("0A"))
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
    /// Killed by us at the deadline (or because its peer failed and it did not follow).
    Timeout,
    /// Could not be started.
    NoStart,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "{c}"),
            Exit::Signal(s) => write!(f, "sig {s}"),
            Exit::Timeout => write!(f, "timeout"),
            Exit::NoStart => write!(f, "no start"),
        }
    }
}

impl From<ExitStatus> for Exit {
    fn from(s: ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        }
    }
}

/// A started command that is waited for with a deadline.
pub(crate) struct Proc {
    child: Option<Child>,
    pub(crate) exit: Option<Exit>,
    started: Instant,
    ended: Option<Instant>,
    /// CPU time (user + system, clock ticks) at the last poll while it ran: the whole of
    /// it once it has ended, read from its zombie before it is reaped.
    cpu_ticks: u64,
}

impl Proc {
    pub(crate) fn started(child: Child) -> Proc {
        Proc {
            child: Some(child),
            exit: None,
            started: Instant::now(),
            ended: None,
            cpu_ticks: 0,
        }
    }

    pub(crate) fn failed_to_start() -> Proc {
        Proc {
            child: None,
            exit: Some(Exit::NoStart),
            started: Instant::now(),
            ended: Some(Instant::now()),
            cpu_ticks: 0,
        }
    }

    /// Records the exit if the command has ended; true once it has.
    pub(crate) fn poll(&mut self) -> bool {
        if self.exit.is_none() {
            if let Some(ticks) = self.child.as_ref().and_then(|c| cpu_ticks(c.id())) {
                self.cpu_ticks = ticks;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.exit = Some(status.into());
                self.ended = Some(Instant::now());
            }
        }
        self.exit.is_some()
    }

    pub(crate) fn kill(&mut self) {
        if !self.poll() {
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            self.exit = Some(Exit::Timeout);
            self.ended = Some(Instant::now());
        }
    }

    pub(crate) fn wait(mut self, deadline: Instant) -> Exit {
        wait_all(std::slice::from_mut(&mut self), deadline);
        self.exit.unwrap_or(Exit::Timeout)
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.ended.unwrap_or_else(Instant::now) - self.started
    }

    /// When the command started and ended (`None` while it runs or if it never started).
    fn span(&self) -> Option<(Instant, Instant)> {
        match (self.exit, self.ended) {
            (Some(Exit::NoStart), _) | (_, None) => None,
            (_, Some(end)) => Some((self.started, end)),
        }
    }

    /// CPU seconds (user + system) the command used, as last sampled (every 20 ms by
    /// [`wait_all`]; the last sample of a command that ended is its total).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        self.cpu_ticks as f64 / CLOCK_TICKS_PER_S
    }
}

/// `sysconf(_SC_CLK_TCK)` on Linux.
const CLOCK_TICKS_PER_S: f64 = 100.0;

/// utime + stime of process `pid` from `/proc/PID/stat` (also readable while it is a
/// zombie, before it is reaped).
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the command name.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Waits for every command until `deadline`, then kills the ones still running. Once one
/// has failed, the others get five more seconds (a server whose client died would otherwise
/// wait for the whole timeout).
pub(crate) fn wait_all(procs: &mut [Proc], mut deadline: Instant) {
    let grace = Duration::from_secs(5);
    loop {
        let mut all = true;
        for p in procs.iter_mut() {
            all &= p.poll();
        }
        if all {
            return;
        }
        let now = Instant::now();
        if procs
            .iter()
            .any(|p| p.exit.is_some_and(|e| e != Exit::Code(0)))
        {
            deadline = deadline.min(now + grace);
        }
        if now >= deadline {
            procs.iter_mut().for_each(Proc::kill);
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// What is checked in, or read from, a command's output.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    /// `ibv_devices`: every device listed.
    Devices,
    /// `ibv_devinfo`: every device listed, each port `PORT_ACTIVE`.
    DevInfo,
    /// `ibv_rc_pingpong`: usec/iter.
    Pingpong,
    /// `ib_*_bw`: BW average and MsgRate.
    Bw,
    /// `ib_*_lat`: t_typical and t_avg.
    Lat,
    /// `ib_atomic_lat`: the client measures (t_typical and t_avg); its server is passive
    /// and prints no result table, so for it the exit code is all.
    ClientLat,
    /// Nothing to read (the passive server of [`Check::ClientLat`]).
    Passive,
}

/// One command of the run, as it ended.
struct ToolRun {
    /// The tool and the flags that tell it apart (`ibv_rc_pingpong -e`).
    label: String,
    role: &'static str,
    exit: Exit,
    time: Duration,
    /// The figure column (or what the output check found wrong).
    figure: String,
    /// The headline figure: MB/s for bandwidth, usec for latency.
    value: Option<f64>,
    /// Set when the exit was 0 but the output is not what it must be.
    problem: Option<String>,
    log: PathBuf,
    command: String,
    /// CPU seconds the command used.
    cpu_s: f64,
    /// When it started and ended.
    span: Option<(Instant, Instant)>,
}

impl ToolRun {
    fn ok(&self) -> bool {
        self.exit == Exit::Code(0) && self.problem.is_none()
    }
}

/// One server/client pair.
struct Pair {
    tool: &'static str,
    /// Extra flags that set the pair apart in the table.
    tag: &'static str,
    args: Vec<String>,
    check: Check,
}

fn pairs(opts: &Opts) -> Vec<Pair> {
    let (n, pp) = opts.iters();
    // The tag's words are flags of the tool, after the common ones.
    let pingpong = |tool: &'static str, tag: &'static str| {
        let mut args = vec!["-g".into(), "0".into(), "-n".into(), pp.to_string()];
        args.extend(tag.split_whitespace().map(String::from));
        Pair {
            tool,
            tag,
            args,
            check: Check::Pingpong,
        }
    };
    let perf = |tool: &'static str, tag: &'static str, size: usize, check: Check| {
        let mut args = vec!["-s".into(), size.to_string(), "-n".into(), n.to_string()];
        args.extend(tag.split_whitespace().map(String::from));
        Pair {
            tool,
            tag,
            args,
            check,
        }
    };
    let atomic = |tool: &'static str, check: Check| Pair {
        tool,
        tag: "",
        args: vec!["-n".into(), n.to_string()],
        check,
    };
    let bw = opts.bw_size();
    vec![
        pingpong("ibv_rc_pingpong", ""),
        pingpong("ibv_rc_pingpong", "-e"),
        // The new post-send API: ibv_create_qp_ex, ibv_qp_to_qp_ex, ibv_wr_* (issue J2).
        pingpong("ibv_rc_pingpong", "-N"),
        // 64 QPs on one shared receive queue of 500 WRs (issue J1: it deadlocked).
        pingpong("ibv_srq_pingpong", "-q 64"),
        // Datagrams over one simple-NIC frame (issue J1: UD stopped at 1978 bytes).
        pingpong("ibv_ud_pingpong", "-s 2048"),
        perf("ib_write_bw", "", bw, Check::Bw),
        // A send queue 4096 deep (issue J1: queues stopped at 512).
        perf("ib_write_bw", "-t 4096", bw, Check::Bw),
        perf("ib_read_bw", "", bw, Check::Bw),
        perf("ib_send_bw", "", bw, Check::Bw),
        perf("ib_write_lat", "", LAT_SIZE, Check::Lat),
        // Fetch-and-add, executed by the responder's driver over the out-of-band channel
        // (issue J2 item 2; ib_atomic_lat reports a whole round trip, not half).
        atomic("ib_atomic_bw", Check::Bw),
        atomic("ib_atomic_lat", Check::ClientLat),
    ]
}

/// Where the commands run: the library directory, the log directory, the timeout and the
/// environment of the backend (its device list, a preloaded allocator).
struct RunCtx<'a> {
    lib_dir: &'a Path,
    logs: &'a Path,
    timeout: Duration,
    env: &'a [(String, String)],
}

impl RunCtx<'_> {
    /// Starts `tool args` with the stand-in first on the library path and its stdout and
    /// stderr (interleaved) in `log`.
    fn spawn(&self, tool: &str, args: &[String], log: &Path) -> Proc {
        let path = match env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut p = self.lib_dir.as_os_str().to_owned();
                p.push(":");
                p.push(old);
                p
            }
            _ => self.lib_dir.as_os_str().to_owned(),
        };
        let mut cmd = Command::new(tool);
        cmd.args(args).env("LD_LIBRARY_PATH", path);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        spawn_logged(cmd, log)
    }

    fn log(&self, label: &str, role: &str) -> PathBuf {
        let name: String = format!("{label} {role}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.logs.join(format!("{name}.log"))
    }

    /// A command without a peer (`ibv_devices`, `ibv_devinfo`).
    fn single(&self, tool: &str, check: Check, devices: usize) -> ToolRun {
        let log = self.log(tool, "");
        println!("perftest: {tool}");
        let mut p = self.spawn(tool, &[], &log);
        wait_all(std::slice::from_mut(&mut p), Instant::now() + self.timeout);
        finish(tool.into(), "-", &p, check, devices, log, tool.into())
    }

    /// Server on the first device, then (once it listens on `port`) client on the second.
    fn pair(&self, pair: &Pair, port: u16, server_ip: &str) -> Vec<ToolRun> {
        let label = format!("{} {}", pair.tool, pair.tag).trim().to_string();
        let mut server_args = vec!["-d".to_string(), "bluerdma0".into()];
        server_args.extend(pair.args.iter().cloned());
        server_args.extend(["-p".into(), port.to_string()]);
        let mut client_args = server_args.clone();
        client_args[1] = "bluerdma1".into();
        client_args.push(server_ip.into());
        let cmd = |args: &[String]| format!("{} {}", pair.tool, args.join(" "));
        let (slog, clog) = (self.log(&label, "server"), self.log(&label, "client"));
        println!("perftest: {}  &&  {}", cmd(&server_args), cmd(&client_args));
        let deadline = Instant::now() + self.timeout;
        let mut procs = Vec::with_capacity(2);
        if listening(port) {
            let note = format!("TCP port {port} is already in use; pick another with --port");
            let mut runs = Vec::new();
            for (role, args, log) in [
                ("server", &server_args, slog),
                ("client", &client_args, clog),
            ] {
                let mut r = finish(
                    label.clone(),
                    role,
                    &Proc::failed_to_start(),
                    pair.check,
                    0,
                    log,
                    cmd(args),
                );
                r.problem = Some(note.clone());
                r.figure = note.clone();
                runs.push(r);
            }
            return runs;
        }
        procs.push(self.spawn(pair.tool, &server_args, &slog));
        // The client starts once the server's exchange port listens, not after a fixed sleep.
        while !procs[0].poll() && !listening(port) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        procs.push(if procs[0].exit.is_none() && listening(port) {
            self.spawn(pair.tool, &client_args, &clog)
        } else {
            let _ = File::create(&clog);
            Proc::failed_to_start()
        });
        wait_all(&mut procs, deadline);
        vec![
            finish(
                label.clone(),
                "server",
                &procs[0],
                pair.check,
                0,
                slog,
                cmd(&server_args),
            ),
            finish(
                label,
                "client",
                &procs[1],
                pair.check,
                0,
                clog,
                cmd(&client_args),
            ),
        ]
    }
}

impl RunCtx<'_> {
    /// `ports.len()` pairs of `pair` at once: every server on the first device (pair `i`
    /// with exchange port `ports[i]`), then, once all of them listen (or have ended), every
    /// client on the second; one deadline for all. The runs of each pair, server first.
    fn pairs_at_once(&self, pair: &Pair, ports: &[u16], server_ip: &str) -> Vec<[ToolRun; 2]> {
        let base = format!("{} {}", pair.tool, pair.tag).trim().to_string();
        let args = |port: u16, device: &str, peer: Option<&str>| {
            let mut a = vec!["-d".to_string(), device.into()];
            a.extend(pair.args.iter().cloned());
            a.extend(["-p".into(), port.to_string()]);
            a.extend(peer.map(String::from));
            a
        };
        let cmd = |args: &[String]| format!("{} {}", pair.tool, args.join(" "));
        struct One {
            label: String,
            server: Vec<String>,
            client: Vec<String>,
            logs: [PathBuf; 2],
        }
        let ones: Vec<One> = ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let label = format!("{base} #{}", i + 1);
                let logs = [self.log(&label, "server"), self.log(&label, "client")];
                One {
                    server: args(port, "bluerdma0", None),
                    client: args(port, "bluerdma1", Some(server_ip)),
                    label,
                    logs,
                }
            })
            .collect();
        let rows = |one: &One, procs: [&Proc; 2]| -> [ToolRun; 2] {
            let [s, c] = procs;
            [
                finish(
                    one.label.clone(),
                    "server",
                    s,
                    pair.check,
                    0,
                    one.logs[0].clone(),
                    cmd(&one.server),
                ),
                finish(
                    one.label.clone(),
                    "client",
                    c,
                    pair.check,
                    0,
                    one.logs[1].clone(),
                    cmd(&one.client),
                ),
            ]
        };
        if let Some(&taken) = ports.iter().find(|&&p| listening(p)) {
            let note = format!("TCP port {taken} is already in use; pick another with --port");
            let none = Proc::failed_to_start();
            return ones
                .iter()
                .map(|one| {
                    let mut r = rows(one, [&none, &none]);
                    for run in &mut r {
                        run.problem = Some(note.clone());
                        run.figure = note.clone();
                    }
                    r
                })
                .collect();
        }
        for one in &ones {
            println!("perftest: {}  &&  {}", cmd(&one.server), cmd(&one.client));
        }
        let deadline = Instant::now() + self.timeout;
        let mut servers: Vec<Proc> = ones
            .iter()
            .map(|one| self.spawn(pair.tool, &one.server, &one.logs[0]))
            .collect();
        // The clients start once every server listens, so that all pairs run together.
        loop {
            let waiting = servers
                .iter_mut()
                .zip(ports)
                .any(|(s, &port)| !s.poll() && !listening(port));
            if !waiting || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let clients: Vec<Proc> = ones
            .iter()
            .zip(servers.iter_mut())
            .zip(ports)
            .map(|((one, s), &port)| {
                if !s.poll() && listening(port) {
                    self.spawn(pair.tool, &one.client, &one.logs[1])
                } else {
                    let _ = File::create(&one.logs[1]);
                    Proc::failed_to_start()
                }
            })
            .collect();
        let mut procs: Vec<Proc> = servers.into_iter().chain(clients).collect();
        wait_all(&mut procs, deadline);
        let n = ones.len();
        ones.iter()
            .enumerate()
            .map(|(i, one)| rows(one, [&procs[i], &procs[n + i]]))
            .collect()
    }
}

/// One perftest server/client pair at a time through the stand-in, for `cargo xtask bench`
/// (`bench.rs`), or several pairs at once (`shared_perf.rs`): the library built, the tools
/// installed, the devices of `BLUERDMA_DEVICES` (or the default two) checked free.
pub(crate) struct PairRunner {
    lib_dir: PathBuf,
    logs: PathBuf,
    timeout: Duration,
    ips: Vec<String>,
}

/// What one pair measured.
pub(crate) struct PairFigure {
    /// The client's headline figure (MB/s, 2^20 B, for `ib_*_bw`; t_typical usec for
    /// `ib_*_lat`), or what went wrong.
    pub(crate) value: Result<f64, String>,
    /// CPU seconds of both processes together.
    pub(crate) cpu_s: f64,
    /// When the client started and ended (`None` if it did not start).
    pub(crate) client_span: Option<(Instant, Instant)>,
}

impl PairRunner {
    /// Builds the stand-in and installs the tools if they are missing.
    pub(crate) fn new(root: &Path, timeout: Duration, logs: &str) -> Result<Self, String> {
        let lib_dir = build_library(root)?;
        let opts = Opts {
            timeout,
            ..Opts::parse(&[])?.ok_or("no default options")?
        };
        ensure_tools(&opts)?;
        let ips = device_ips();
        if ips.len() < 2 {
            return Err(format!(
                "needs two devices, BLUERDMA_DEVICES gives {}",
                ips.len()
            ));
        }
        check_link_ports_free(&ips)?;
        let logs = root.join("target").join("xtask").join(logs);
        fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
        Ok(Self {
            lib_dir,
            logs,
            timeout,
            ips,
        })
    }

    /// The device addresses (bluerdma0's first).
    pub(crate) fn ips(&self) -> &[String] {
        &self.ips
    }

    /// The directory of the stand-in (and of `bluerdma-devd`).
    pub(crate) fn lib_dir(&self) -> &Path {
        &self.lib_dir
    }

    fn ctx<'a>(&'a self, env: &'a [(String, String)]) -> RunCtx<'a> {
        RunCtx {
            lib_dir: &self.lib_dir,
            logs: &self.logs,
            timeout: self.timeout,
            env,
        }
    }

    fn pair_of(tool: &'static str, tag: &'static str, args: &[String]) -> Pair {
        let check = if tool.ends_with("_lat") {
            Check::Lat
        } else {
            Check::Bw
        };
        Pair {
            tool,
            tag,
            args: args.to_vec(),
            check,
        }
    }

    /// `ports.len()` pairs of `tool ARGS` at once (pair `i` with `-p ports[i]`), servers on
    /// bluerdma0 and clients on bluerdma1, with `env` added; the figure of each pair.
    pub(crate) fn run_at_once(
        &self,
        tool: &'static str,
        tag: &'static str,
        args: &[String],
        env: &[(String, String)],
        ports: &[u16],
    ) -> Vec<PairFigure> {
        let pair = Self::pair_of(tool, tag, args);
        self.ctx(env)
            .pairs_at_once(&pair, ports, &self.ips[0])
            .iter()
            .map(|runs| figure_of(tool, runs))
            .collect()
    }

    /// Runs `tool ARGS -p PORT` as server on bluerdma0 and client on bluerdma1 with `env`
    /// added; `tag` names the run in the log files.
    pub(crate) fn run(
        &self,
        tool: &'static str,
        tag: &'static str,
        args: &[String],
        env: &[(String, String)],
        port: u16,
    ) -> PairFigure {
        let pair = Self::pair_of(tool, tag, args);
        let runs = self.ctx(env).pair(&pair, port, &self.ips[0]);
        figure_of(tool, &runs)
    }
}

/// What the error of a pair says when perftest itself gave up before its report because its
/// CPU clock calibration failed (`Correlation coefficient r^2: 0.70 < 0.9`, `Can't produce a
/// report`): the machine was too busy while it timed its clock, not a transfer error.
pub(crate) const CLOCK_CALIBRATION: &str = "perftest's CPU clock calibration failed";

/// The figure of one pair's runs (server and client), or its first failure (whose log's
/// last lines are printed).
fn figure_of(tool: &str, runs: &[ToolRun]) -> PairFigure {
    let cpu_s = runs.iter().map(|r| r.cpu_s).sum();
    let client = runs.iter().find(|r| r.role == "client");
    let value = match runs.iter().find(|r| !r.ok()) {
        Some(bad) => {
            eprintln!(
                "FAILED {} {} (exit {}): {}; last lines of {}:",
                bad.label,
                bad.role,
                bad.exit,
                bad.problem.as_deref().unwrap_or(&bad.command),
                bad.log.display()
            );
            let out = read_log(&bad.log);
            print_tail_folded(&out, 12);
            let calibration = if out.contains("Correlation coefficient") {
                format!(": {CLOCK_CALIBRATION} (r^2 < 0.9, the machine was busy)")
            } else {
                String::new()
            };
            Err(format!(
                "{} {} failed (exit {}){calibration}",
                bad.label, bad.role, bad.exit
            ))
        }
        None => match client.and_then(|r| r.value.map(|v| (r, v))) {
            // perftest can also go on after a failed calibration and report `inf` (its
            // clock rate taken as 0): the same busy machine, not a transfer error.
            Some((r, v))
                if !v.is_finite() && read_log(&r.log).contains("Correlation coefficient") =>
            {
                Err(format!(
                    "{} client reported {v}: {CLOCK_CALIBRATION} (r^2 < 0.9, the machine was busy)",
                    r.label
                ))
            }
            Some((_, v)) => Ok(v),
            None => Err(format!("{tool}: no figure")),
        },
    };
    PairFigure {
        value,
        cpu_s,
        client_span: client.and_then(|r| r.span),
    }
}

/// Starts `cmd` with no standard input and its stdout and stderr (interleaved) in `log`.
/// The program runs line-buffered under `stdbuf` (which execs it, same pid) when that is
/// installed, so that a command killed at its deadline still leaves what it printed.
pub(crate) fn spawn_logged(cmd: Command, log: &Path) -> Proc {
    let files = File::create(log).and_then(|f| Ok((f.try_clone()?, f)));
    let Ok((out, err)) = files else {
        return Proc::failed_to_start();
    };
    let mut cmd = if on_path("stdbuf") {
        let mut c = Command::new("stdbuf");
        c.args(["-oL", "-eL"])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            c.current_dir(dir);
        }
        c
    } else {
        cmd
    };
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_or_else(|_| Proc::failed_to_start(), Proc::started)
}

/// The text of a command's log (empty if it cannot be read).
pub(crate) fn read_log(log: &Path) -> String {
    fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Reads the log of an ended command and makes its row.
fn finish(
    label: String,
    role: &'static str,
    p: &Proc,
    check: Check,
    devices: usize,
    log: PathBuf,
    command: String,
) -> ToolRun {
    let out = read_log(&log);
    let check = match (check, role) {
        (Check::ClientLat, "server") => Check::Passive,
        (Check::ClientLat, _) => Check::Lat,
        (c, _) => c,
    };
    let (figure, value, problem) = examine(check, &out, devices);
    let exit = p.exit.unwrap_or(Exit::Timeout);
    ToolRun {
        label,
        role,
        exit,
        time: p.elapsed(),
        figure: if exit == Exit::Code(0) || value.is_some() {
            figure
        } else {
            "-".into()
        },
        value,
        problem: problem.filter(|_| exit == Exit::Code(0)),
        log,
        command,
        cpu_s: p.cpu_seconds(),
        span: p.span(),
    }
}

/// The figure column, the headline value and (if the output is wrong) the problem.
fn examine(check: Check, out: &str, devices: usize) -> (String, Option<f64>, Option<String>) {
    let names: Vec<String> = (0..devices).map(|i| format!("bluerdma{i}")).collect();
    match check {
        Check::Devices => {
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| {
                    !out.lines()
                        .any(|l| l.split_whitespace().next() == Some(n.as_str()))
                })
                .collect();
            let found = out
                .lines()
                .filter(|l| l.trim_start().starts_with("bluerdma"))
                .count();
            let problem = (!missing.is_empty()).then(|| format!("missing {missing:?}"));
            (format!("{found} devices"), None, problem)
        }
        Check::DevInfo => {
            let hcas: Vec<&str> = out
                .lines()
                .filter_map(|l| l.trim().strip_prefix("hca_id:"))
                .map(str::trim)
                .collect();
            let active = out.matches("PORT_ACTIVE").count();
            let missing: Vec<&String> = names
                .iter()
                .filter(|n| !hcas.contains(&n.as_str()))
                .collect();
            let problem = if !missing.is_empty() {
                Some(format!("missing {missing:?}"))
            } else if active < devices {
                Some(format!("{active} of {devices} ports PORT_ACTIVE"))
            } else {
                None
            };
            (
                format!("{} hca, {active} PORT_ACTIVE", hcas.len()),
                None,
                problem,
            )
        }
        Check::Pingpong => {
            let usec = out
                .lines()
                .find(|l| l.contains("usec/iter"))
                .and_then(|l| number_before(l, "usec/iter"));
            match usec {
                Some(u) => (format!("{u:.2} usec/iter"), Some(u), None),
                None => ("-".into(), None, Some("no `usec/iter` line".into())),
            }
        }
        Check::Bw => {
            let t = perftest_table(out);
            let bw = column(&t, "BW average");
            let rate = column(&t, "MsgRate");
            match (bw, rate) {
                (Some(bw), Some(rate)) => (
                    format!("BW average {bw:.2} MB/s, MsgRate {rate:.6} Mpps"),
                    Some(bw),
                    None,
                ),
                _ => ("-".into(), None, Some("no result table".into())),
            }
        }
        Check::Passive | Check::ClientLat => ("passive side".into(), None, None),
        Check::Lat => {
            let t = perftest_table(out);
            match (column(&t, "t_typical"), column(&t, "t_avg")) {
                (Some(typ), Some(avg)) => (
                    format!("t_typical {typ:.2} usec, t_avg {avg:.2} usec"),
                    Some(typ),
                    None,
                ),
                _ => ("-".into(), None, Some("no result table".into())),
            }
        }
    }
}

/// The number just before `unit` in `line` (`... = 123.45 usec/iter`).
fn number_before(line: &str, unit: &str) -> Option<f64> {
    let (before, _) = line.split_once(unit)?;
    before.split_whitespace().last()?.parse().ok()
}

/// perftest's result table: the header line that starts with `#bytes` and the first line of
/// numbers after it, as (column name, value). Column names are runs of words up to one that
/// ends in `]` (`BW average[MB/sec]`, `99% percentile[usec]`), or a `#` word.
fn perftest_table(out: &str) -> Vec<(String, f64)> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut name = String::new();
    for word in header.split_whitespace() {
        if !name.is_empty() {
            name.push(' ');
        }
        name.push_str(word);
        if word.starts_with('#') || word.ends_with(']') {
            names.push(std::mem::take(&mut name));
        }
    }
    let values = lines
        .map(|l| {
            l.split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<Vec<_>, _>>()
        })
        .find_map(|v| v.ok().filter(|v| !v.is_empty()))
        .unwrap_or_default();
    names.into_iter().zip(values).collect()
}

fn column(table: &[(String, f64)], prefix: &str) -> Option<f64> {
    table
        .iter()
        .find(|(n, _)| n.starts_with(prefix))
        .map(|(_, v)| *v)
}

/// The TCP loopback figures, in perftest's units.
#[derive(Clone, Copy, Debug)]
struct Baseline {
    /// 64 KiB `write_all` stream, MB/s with perftest's MB (2^20 bytes).
    stream_mb_s: f64,
    /// 8 B ping-pong, half a round trip in usec (what `ib_write_lat` reports).
    pingpong_us: f64,
}

/// Runs `xtask --features tcp-baseline perftest --tcp-baseline SECS ITERS IP` in release and
/// reads its two figures.
fn measure_baseline(root: &Path, opts: &Opts, ip: &str) -> Result<Baseline, String> {
    let (secs, iters) = opts.baseline();
    println!("perftest: TCP loopback baseline ({BW_SIZE} B stream for {secs} s, {LAT_SIZE} B ping-pong x {iters})");
    let (ok, text) = run_baseline(
        root,
        &[
            "perftest",
            TCP_BASELINE,
            &secs.to_string(),
            &iters.to_string(),
            ip,
        ],
    )?;
    let field = |key: &str| keyed_number(&text, key);
    match (ok, field("stream_mb_s"), field("pingpong_us")) {
        (true, Some(stream_mb_s), Some(pingpong_us)) => Ok(Baseline {
            stream_mb_s,
            pingpong_us,
        }),
        _ => Err(format!("TCP baseline failed: {}", text.trim())),
    }
}

/// `perftest --tcp-baseline SECS ITERS IP`: prints `stream_mb_s X` and `pingpong_us Y`.
#[cfg(feature = "tcp-baseline")]
fn tcp_baseline_main(args: &[String]) -> Result<(), String> {
    use bluerdma_sim::baseline::{tcp_pingpong, tcp_stream};
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let secs: f64 = arg(0).parse().map_err(|_| "--tcp-baseline SECS ITERS IP")?;
    let iters: u32 = arg(1).parse().map_err(|_| "--tcp-baseline SECS ITERS IP")?;
    let ip: std::net::Ipv4Addr = arg(2).parse().map_err(|_| "--tcp-baseline SECS ITERS IP")?;
    let chunk = vec![7u8; BW_SIZE];
    let stream = tcp_stream(ip, &chunk, Duration::from_secs_f64(secs))
        .map_err(|e| format!("TCP stream: {e}"))?;
    let half_rtt = tcp_pingpong(ip, LAT_SIZE, iters).map_err(|e| format!("TCP ping-pong: {e}"))?;
    println!(
        "stream_mb_s {:.2}",
        stream.bytes as f64 / stream.elapsed.as_secs_f64() / (1u64 << 20) as f64
    );
    println!("pingpong_us {:.3}", half_rtt.as_secs_f64() * 1e6);
    Ok(())
}

#[cfg(not(feature = "tcp-baseline"))]
fn tcp_baseline_main(_: &[String]) -> Result<(), String> {
    Err(format!(
        "perftest {TCP_BASELINE} needs the tcp-baseline feature (cargo xtask perftest runs it)"
    ))
}

/// The last `n` lines of `out`, runs of lines that differ only in their digits (a warning
/// per packet) folded into one line with its count.
pub(crate) fn print_tail_folded(out: &str, n: usize) {
    let shape = |l: &str| l.replace(|c: char| c.is_ascii_hexdigit(), "#");
    let mut folded: Vec<(usize, &str)> = Vec::new();
    for line in out.lines() {
        match folded.last_mut() {
            Some((count, last)) if shape(last) == shape(line) => {
                *count += 1;
                *last = line;
            }
            _ => folded.push((1, line)),
        }
    }
    for (count, line) in &folded[folded.len().saturating_sub(n)..] {
        if *count > 1 {
            eprintln!("  | [{count} lines like] {line}");
        } else {
            eprintln!("  | {line}");
        }
    }
}

/// One line of the table of commands (perftest's tools, cluster's steps).
pub(crate) struct TableRow<'a> {
    pub(crate) label: &'a str,
    /// The role or node.
    pub(crate) who: &'a str,
    pub(crate) exit: Exit,
    pub(crate) time: Duration,
    pub(crate) figure: String,
}

/// Prints the table of commands between two rules; `heads` names the first two columns.
pub(crate) fn print_table(heads: [&str; 2], rows: &[TableRow]) {
    let w = rows.iter().map(|r| r.label.len()).max().unwrap_or(4).max(4);
    let v = rows.iter().map(|r| r.who.len()).max().unwrap_or(6).max(6);
    let rule = "-".repeat(w + v + 64);
    println!();
    println!(
        "{:<w$}  {:<v$}  {:>8}  {:>7}  figure",
        heads[0], heads[1], "exit", "time"
    );
    println!("{rule}");
    for r in rows {
        println!(
            "{:<w$}  {:<v$}  {:>8}  {:>6.1}s  {}",
            r.label,
            r.who,
            r.exit.to_string(),
            r.time.as_secs_f64(),
            r.figure
        );
    }
    println!("{rule}");
}

impl Report {
    fn new(
        runs: Vec<ToolRun>,
        baseline: Result<Baseline, String>,
        lib_dir: PathBuf,
        start: Instant,
    ) -> Report {
        Report {
            runs,
            baseline,
            lib_dir,
            elapsed: start.elapsed(),
        }
    }

    /// The client's figure of `tool` (the server prints the same table for bw).
    fn figure(&self, tool: &str) -> Option<f64> {
        let of = |role: &str| {
            self.runs
                .iter()
                .find(|r| r.label == tool && r.role == role && r.ok())
                .and_then(|r| r.value)
        };
        of("client").or_else(|| of("server"))
    }

    /// `ib_write_bw / TCP` and `ib_write_lat / TCP` lines.
    fn ratios(&self) -> Vec<String> {
        let Ok(b) = &self.baseline else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        if let Some(bw) = self.figure("ib_write_bw") {
            lines.push(format!(
                "ib_write_bw / TCP stream:     {:.4} ({bw:.2} / {:.2} MB/s)",
                bw / b.stream_mb_s,
                b.stream_mb_s
            ));
        }
        if let Some(lat) = self.figure("ib_write_lat") {
            lines.push(format!(
                "ib_write_lat / TCP ping-pong: {:.2} ({lat:.2} / {:.2} usec, t_typical / half RTT)",
                lat / b.pingpong_us,
                b.pingpong_us
            ));
        }
        if let Some(lat) = self.figure("ib_atomic_lat") {
            lines.push(format!(
                "ib_atomic_lat / TCP ping-pong: {:.2} ({lat:.2} / {:.2} usec, t_typical / whole RTT)",
                lat / (2.0 * b.pingpong_us),
                2.0 * b.pingpong_us
            ));
        }
        lines
    }

    /// The note of the ci row.
    fn headline(&self) -> String {
        let mut parts = Vec::new();
        if let Some(bw) = self.figure("ib_write_bw") {
            parts.push(format!("write_bw {bw:.1} MB/s"));
        }
        if let Some(lat) = self.figure("ib_write_lat") {
            parts.push(format!("write_lat {lat:.1} us"));
        }
        if let Ok(b) = &self.baseline {
            parts.push(format!(
                "TCP {:.0} MB/s, {:.1} us",
                b.stream_mb_s, b.pingpong_us
            ));
        }
        parts.join("; ")
    }

    fn print(&self) {
        let rows: Vec<TableRow> = self
            .runs
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
        print_table(["tool", "role"], &rows);
        match &self.baseline {
            Ok(b) => println!(
                "TCP loopback: {BW_SIZE} B stream {:.2} MB/s; {LAT_SIZE} B ping-pong {:.2} usec \
                 (half round trip); MB = 2^20 B as in perftest",
                b.stream_mb_s, b.pingpong_us
            ),
            Err(e) => println!("TCP loopback: {e}"),
        }
        for l in self.ratios() {
            println!("{l}");
        }
        let failed: Vec<&ToolRun> = self.runs.iter().filter(|r| !r.ok()).collect();
        for r in &failed {
            eprintln!();
            eprintln!(
                "perftest: FAILED {} {} (exit {}{}): {}",
                r.label,
                r.role,
                r.exit,
                r.problem
                    .as_deref()
                    .map(|p| format!(", {p}"))
                    .unwrap_or_default(),
                r.command
            );
            eprintln!("  last lines of {}:", r.log.display());
            let out = read_log(&r.log);
            print_tail_folded(&out, TAIL);
        }
        println!(
            "perftest: {} of {} runs passed in {:.0} s; logs in {}; library: export \
             LD_LIBRARY_PATH={}",
            self.runs.len() - failed.len(),
            self.runs.len(),
            self.elapsed.as_secs_f64(),
            self.runs
                .first()
                .and_then(|r| r.log.parent())
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            self.lib_dir.display()
        );
    }

    fn verdict(&self) -> Result<(), String> {
        let failed: Vec<String> = self
            .runs
            .iter()
            .filter(|r| !r.ok())
            .map(|r| format!("{} {}", r.label, r.role))
            .collect();
        match (&self.baseline, failed.is_empty()) {
            (Ok(_), true) => Ok(()),
            (Err(e), true) => Err(format!("perftest: {e}")),
            (_, false) => Err(format!("perftest: failed: {}", failed.join(", "))),
        }
    }
}

/// Runs `xtask --features tcp-baseline ARGS` in release (the baseline programs of perftest
/// and bench); returns whether it succeeded and its standard output.
pub(crate) fn run_baseline(root: &Path, args: &[&str]) -> Result<(bool, String), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["run", "--quiet", "--release", "-p", "xtask"])
        .args(["--features", "tcp-baseline", "--"])
        .args(args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{cargo} run`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok((out.status.success(), text))
}

/// The number after `key` on the first line of `text` that starts with it (the
/// `name value` lines the baseline and bench programs print).
pub(crate) fn keyed_number(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inf_figure_after_a_failed_clock_calibration_is_named_as_such() {
        let log = std::env::temp_dir().join(format!("xtask-calib-{}.log", std::process::id()));
        let run = |value: f64, text: &str| {
            fs::write(&log, text).unwrap();
            ToolRun {
                label: "ib_write_lat".into(),
                role: "client",
                exit: Exit::Code(0),
                time: Duration::ZERO,
                figure: String::new(),
                value: Some(value),
                problem: None,
                log: log.clone(),
                command: String::new(),
                cpu_s: 0.0,
                span: None,
            }
        };
        let calib = "Correlation coefficient r^2: 0.72 < 0.9\n 8 200 inf inf inf\n";
        let e = figure_of("ib_write_lat", &[run(f64::INFINITY, calib)])
            .value
            .unwrap_err();
        assert!(e.contains(CLOCK_CALIBRATION), "{e}");
        let ok = figure_of("ib_write_lat", &[run(8.5, calib)]).value;
        assert_eq!(ok, Ok(8.5), "a finite figure stands");
        let e = figure_of("ib_write_lat", &[run(f64::INFINITY, "no warning")]).value;
        assert_eq!(e, Ok(f64::INFINITY), "left to the plausibility check");
        let _ = fs::remove_file(&log);
    }

    #[test]
    fn perftest_tables_are_read_by_column_name() {
        let bw = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             39.66              17.49  \t\t   0.000280
---------------------------------------------------------------------------------------
";
        let t = perftest_table(bw);
        assert_eq!(column(&t, "BW average"), Some(17.49));
        assert_eq!(column(&t, "MsgRate"), Some(0.00028));
        let lat = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 8       1000          20.11          95.20        25.30     \t       26.01        3.10    \t40.00   \t\t90.00   
";
        let t = perftest_table(lat);
        assert_eq!(column(&t, "t_typical"), Some(25.30));
        assert_eq!(column(&t, "t_avg"), Some(26.01));
        assert_eq!(column(&t, "99.9% percentile"), Some(90.0));
        assert!(perftest_table("Couldn't allocate PD\n").is_empty());
    }

    #[test]
    fn pingpong_and_devinfo_are_checked() {
        let (_, v, p) = examine(
            Check::Pingpong,
            "8192000 bytes in 0.50 seconds = 131.07 Mbit/sec\n1000 iters in 0.50 seconds = 500.00 usec/iter\n",
            0,
        );
        assert_eq!((v, p), (Some(500.0), None));
        let info = "hca_id:\tbluerdma0\n\t\tstate:\t\t\tPORT_ACTIVE (4)\nhca_id:\tbluerdma1\n\t\tstate:\t\t\tPORT_DOWN (1)\n";
        let (_, _, p) = examine(Check::DevInfo, info, 2);
        assert_eq!(p.as_deref(), Some("1 of 2 ports PORT_ACTIVE"));
        let (_, _, p) = examine(Check::DevInfo, "hca_id:\tbluerdma0\nPORT_ACTIVE\n", 2);
        assert!(p.is_some_and(|p| p.contains("bluerdma1")));
    }
}
