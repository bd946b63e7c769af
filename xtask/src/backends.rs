//! The backends `cargo xtask sim` and `cargo xtask perftest` run on (`--backend`): the
//! emulated card in the driver's process (the default), cards served by `bluerdma-sim
//! serve` behind the RTL simulator's sockets (`rtl`), or fake PCI cards served by
//! `bluerdma-sim pci-serve` (`pci`, root only). For the last two this module builds
//! `bluerdma-sim`, starts one served card per device address on the UDP link, and gives
//! the device list (`BLUERDMA_DEVICES` syntax) that opens them; the cards stop when the
//! [`ServedCards`] value is dropped.

use std::env;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Which backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Backend {
    #[default]
    Emulated,
    Rtl,
    Pci,
}

impl Backend {
    pub(crate) fn parse(text: &str) -> Result<Backend, String> {
        match text {
            "emulated" => Ok(Backend::Emulated),
            "rtl" => Ok(Backend::Rtl),
            "pci" => Ok(Backend::Pci),
            other => Err(format!("--backend {other}: expected emulated, rtl or pci")),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Emulated => "emulated",
            Backend::Rtl => "rtl",
            Backend::Pci => "pci",
        }
    }
}

/// The 2 MiB hugepage pool, grown for a run and shrunk back by as much afterwards.
pub(crate) struct Hugepages {
    added: u64,
}

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn pool(name: &str) -> u64 {
    std::fs::read_to_string(format!("{POOL}/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

impl Hugepages {
    /// At least `pages` free hugepages (root only).
    pub(crate) fn reserve(pages: u64) -> Result<Hugepages, String> {
        let before = pool("nr_hugepages");
        // Memory that is all page cache has few free 2 MiB blocks until it is compacted.
        for _ in 0..3 {
            let free = pool("free_hugepages");
            if free >= pages {
                break;
            }
            let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
            let nr = pool("nr_hugepages");
            std::fs::write(
                format!("{POOL}/nr_hugepages"),
                (nr + pages - free).to_string(),
            )
            .map_err(|e| format!("cannot grow the hugepage pool: {e}"))?;
        }
        let added = pool("nr_hugepages").saturating_sub(before);
        let free = pool("free_hugepages");
        if free < pages {
            let _ = std::fs::write(format!("{POOL}/nr_hugepages"), before.to_string());
            return Err(format!(
                "only {free} of {pages} 2 MiB hugepages are free (memory is fragmented?)"
            ));
        }
        Ok(Hugepages { added })
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        if self.added > 0 {
            let nr = pool("nr_hugepages").saturating_sub(self.added);
            let _ = std::fs::write(format!("{POOL}/nr_hugepages"), nr.to_string());
        }
    }
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// `cargo build --release -p PACKAGE` of one target kind (`--bin NAME`, or the library);
/// returns `target/release`.
pub(crate) fn build_release(
    root: &Path,
    package: &str,
    bin: Option<&str>,
) -> Result<PathBuf, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--quiet", "--release", "-p", package]);
    if let Some(b) = bin {
        cmd.args(["--bin", b]);
    }
    let status = cmd
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot start `{cargo} build`: {e}"))?;
    if !status.success() {
        return Err(format!("building {package} failed (see above)"));
    }
    Ok(root.join("target").join("release"))
}

/// Served cards, one per device, and the device list that opens them.
pub(crate) struct ServedCards {
    children: Vec<Child>,
    /// `blue0=IP+backend,...` for the served cards.
    pub(crate) devices: String,
    /// The hugepages the drivers of fake PCI cards register.
    _pages: Option<Hugepages>,
}

impl ServedCards {
    /// Starts a card of `backend` (rtl or pci) for each of `ips`, named `names`, on the
    /// UDP link; the fake PCI cards' trees go under `target/xtask/pci-<n>`, and `hugepages`
    /// are reserved for their drivers.
    pub(crate) fn start(
        root: &Path,
        backend: Backend,
        names: &[&str],
        ips: &[&str],
        hugepages: u64,
    ) -> Result<ServedCards, String> {
        if backend == Backend::Pci && !is_root() {
            return Err(
                "--backend pci needs root: the fake PCI card reads the driver's page map and \
                 memory, and /proc/iomem"
                    .into(),
            );
        }
        let bin = build_release(root, "bluerdma-sim", Some("bluerdma-sim"))?.join("bluerdma-sim");
        let pages = match backend {
            Backend::Pci => Some(Hugepages::reserve(hugepages)?),
            _ => None,
        };
        let mut cards = ServedCards {
            children: Vec::new(),
            devices: String::new(),
            _pages: pages,
        };
        for (n, (name, ip)) in names.iter().zip(ips).enumerate() {
            let link = format!("udp:{ip}");
            let mut args: Vec<String> = Vec::new();
            let entry_backend = match backend {
                Backend::Rtl => {
                    args.extend(["serve", "--csr-port", "0", "--dma-port", "0"].map(String::from));
                    None
                }
                Backend::Pci => {
                    let dir = root.join("target").join("xtask").join(format!("pci-{n}"));
                    let _ = std::fs::remove_dir_all(&dir);
                    args.extend([
                        "pci-serve".into(),
                        "--root".into(),
                        dir.display().to_string(),
                    ]);
                    // The BAR is polled: a loaded machine may answer after the card's 2 s.
                    Some(format!("+pci;root={};command_timeout=20", dir.display()))
                }
                Backend::Emulated => return Err("emulated cards are not served".into()),
            };
            args.extend(["--link".into(), link, "--name".into(), name.to_string()]);
            args.extend(["--log".into(), "warn".into()]);
            let (child, banner) = spawn_serving(&bin, &args)?;
            cards.children.push(child);
            let entry = entry_backend.unwrap_or_else(|| {
                let port = |key: &str| {
                    banner
                        .split(key)
                        .nth(1)
                        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                        .unwrap_or("0")
                        .to_string()
                };
                format!("+rtl:{}/{}", port("CSR 127.0.0.1:"), port("DMA 127.0.0.1:"))
            });
            if !cards.devices.is_empty() {
                cards.devices.push(',');
            }
            cards.devices.push_str(&format!("{name}={ip}{entry}"));
            println!("{}: {banner}", backend.name());
        }
        Ok(cards)
    }
}

/// Starts `bin args` and waits for the line that says it serves.
fn spawn_serving(bin: &Path, args: &[String]) -> Result<(Child, String), String> {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok));
        for _ in lines {}
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Some(line)) if line.contains("serving") => Ok((child, line)),
        other => {
            let _ = child.kill();
            let status = child.wait();
            Err(format!(
                "{} {} did not start serving: {other:?}, {status:?}",
                bin.display(),
                args.join(" ")
            ))
        }
    }
}

impl Drop for ServedCards {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SIGTERM first: the card stops cleanly and prints its counters.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for c in &mut self.children {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `cargo xtask sim --backend rtl|pci [--small] [--no-perf] [--port N]`: the verbs
/// scenarios and measurements (the `sim` example of bluerdma-linux) on two served cards,
/// blue0 = 127.0.0.1 and blue1 = 127.0.0.2. The RTL protocol's sizes are always small;
/// `--small` makes the PCI card's small too. (The raw-ring half of `sim` exercises the
/// emulated card alone and does not run here.)
pub(crate) fn sim(root: &Path, backend: Backend, args: &[String]) -> Result<(), String> {
    sim_output(root, backend, args).map(|_| ())
}

/// [`sim`], returning what the scenarios printed.
fn sim_output(root: &Path, backend: Backend, args: &[String]) -> Result<String, String> {
    let mut verbs: Vec<String> = Vec::new();
    let mut small = backend == Backend::Rtl;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--small" => small = true,
            "--no-perf" => verbs.push(a.clone()),
            "--port" | "--seed" => {
                verbs.push(a.clone());
                verbs.extend(it.next().cloned());
            }
            other => {
                return Err(format!(
                    "sim --backend {}: `{other}` is an option of the emulated backend only \
                     (here: --small, --no-perf, --port, --seed)",
                    backend.name()
                ))
            }
        }
    }
    // A full-size run registers up to 16 MiB + 64 per side (hugepages on the card).
    let cards = ServedCards::start(
        root,
        backend,
        &["blue0", "blue1"],
        &["127.0.0.1", "127.0.0.2"],
        if small { 16 } else { 64 },
    )?;
    verbs.extend(["--devices".into(), cards.devices.clone()]);
    if small {
        verbs.push("--small".into());
    }
    println!(
        "== sim: the driver engine through the verbs API on {} cards (platform-linux)",
        backend.name()
    );
    let (ok, out) = run_teed(root, &verbs)?;
    drop(cards);
    if ok {
        Ok(out)
    } else {
        Err(format!(
            "sim --backend {}: verbs scenarios failed",
            backend.name()
        ))
    }
}

/// Runs the verbs `sim` example with `args`, its output on our stdout as it comes;
/// returns whether it passed and what it printed.
fn run_teed(root: &Path, args: &[String]) -> Result<(bool, String), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(&cargo)
        .args(["run", "--quiet", "--release", "-p", "bluerdma-linux"])
        .args(["--example", "sim", "--"])
        .args(args)
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{cargo} run`: {e}"))?;
    let mut out = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            out.push_str(&line);
            out.push('\n');
        }
    }
    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
    Ok((ok, out))
}

/// The row of `cargo xtask ci` for `sim --backend <backend> --small`: one check per
/// scenario, the bandwidth figure in the note.
pub(crate) fn ci_sim_row(root: &Path, backend: Backend) -> crate::Row {
    let suite = format!("sim (verbs, {})", backend.name());
    println!(
        "ci: {suite}: cargo xtask sim --backend {} --small",
        backend.name()
    );
    let start = Instant::now();
    let args = ["--small".to_string()];
    let (passed, failed, note) = match sim_output(root, backend, &args) {
        Ok(out) => {
            let count = |word: &str| {
                out.lines()
                    .filter(|l| l.starts_with('[') && l.contains(word))
                    .count() as u64
            };
            // The table row: name, result, time, then the notes.
            let bw = out
                .lines()
                .find(|l| !l.starts_with('[') && l.contains("bandwidth") && l.contains(" ok "))
                .and_then(|l| l.split_once("s  "))
                .map(|(_, notes)| notes.trim().to_string())
                .unwrap_or_default();
            (count(" ok ("), count(" FAILED ("), bw)
        }
        Err(e) => (0, 1, e),
    };
    crate::Row {
        suite,
        passed,
        failed: failed.max((passed == 0) as u64),
        time: start.elapsed(),
        note,
    }
}
