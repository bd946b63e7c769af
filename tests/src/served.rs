//! Cards served by `bluerdma-sim` processes, for the backend tests: `serve` (the RTL
//! simulator's sockets) and `pci-serve` (a fake PCI card under a root directory). The
//! binary is built once per test binary with the test's own profile and target directory;
//! each served card is a child process, stopped (SIGTERM, then SIGKILL) when dropped.
//! [`exercise`] is the traffic every backend test runs over its pair of devices.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use bluerdma_core::engine::{RecvWr, SendOp, WcOpcode, WcStatus};
use bluerdma_linux::devices::{self, DeviceList, Settings};
use bluerdma_linux::Context;

use crate::{assert_bytes_eq, fill_pattern, wr, Side, ALL};

/// How long a served card may take to say it serves (a cold start builds nothing; the
/// binary is built before).
const START_LIMIT: Duration = Duration::from_secs(60);

/// Builds with `cargo build ARGS` in this test's profile and target directory; returns
/// the profile's output directory (`<target>/<profile dir>`).
pub fn cargo_build(args: &[&str]) -> PathBuf {
    // A test runs as <target dir>/<profile dir>/deps/<name>.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lies in <target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("a target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("no profile directory in {}", exe.display()),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .arg("build")
        .args(args)
        .args(["--profile", &profile])
        .arg("--target-dir")
        .arg(target_dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{cargo} build`: {e}"));
    assert!(
        out.status.success(),
        "`{cargo} build {}` failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir.to_path_buf()
}

/// The `bluerdma-sim` binary, built with this test's profile.
pub fn sim_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        cargo_build(&["-p", "bluerdma-sim", "--bin", "bluerdma-sim"]).join("bluerdma-sim")
    })
}

/// A card served by a child `bluerdma-sim` process.
pub struct Served {
    child: Child,
    /// The CSR and DMA ports of an RTL-protocol card (0 for a PCI card).
    pub ports: (u16, u16),
    /// The line the process printed when it started serving.
    pub banner: String,
}

impl Served {
    /// `bluerdma-sim serve` on free CSR and DMA ports, on the UDP link at `ip`.
    pub fn rtl(ip: Ipv4Addr, name: &str) -> Served {
        let mut served = Self::start(&["serve", "--csr-port", "0", "--dma-port", "0"], ip, name);
        let port = |key: &str| -> u16 {
            served
                .banner
                .split(key)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no {key} port in `{}`", served.banner))
        };
        served.ports = (port("CSR 127.0.0.1:"), port("DMA 127.0.0.1:"));
        served
    }

    /// `bluerdma-sim pci-serve` building its fake card under `root`, on the UDP link at
    /// `ip`.
    pub fn pci(root: &Path, ip: Ipv4Addr, name: &str) -> Served {
        let root = root.to_str().expect("a UTF-8 root");
        Self::start(&["pci-serve", "--root", root], ip, name)
    }

    /// The `bluerdma-sim` device entry backend of this card: `+rtl:CSR/DMA`.
    pub fn rtl_backend(&self) -> String {
        format!("+rtl:{}/{}", self.ports.0, self.ports.1)
    }

    /// `bluerdma-sim <args>` on the UDP link at `ip`, as card `name`.
    fn start(args: &[&str], ip: Ipv4Addr, name: &str) -> Served {
        let link = format!("udp:{ip}");
        let args = [args, &["--link", &link, "--name", name, "--log", "warn"]].concat();
        let mut child = Command::new(sim_binary())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start bluerdma-sim {args:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = tx.send(first);
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let banner = match rx.recv_timeout(START_LIMIT) {
            Ok(Some(line)) if line.contains("serving") => line,
            other => {
                let _ = child.kill();
                let status = child.wait();
                panic!("bluerdma-sim {args:?} did not start serving: {other:?}, {status:?}");
            }
        };
        Served {
            child,
            ports: (0, 0),
            banner,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: signals our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long one completion may take.
const WAIT: Duration = Duration::from_secs(60);
/// The sizes [`exercise`] moves.
pub const SIZES: [usize; 3] = [4096, 65536 + 17, 1 << 20];

/// Opens every device of the inline list `text`.
pub fn open_all(text: &str) -> Vec<Context> {
    let list = DeviceList::parse_inline(text).unwrap();
    let settings = Settings::from_vars(&|_| None).unwrap();
    list.entries()
        .iter()
        .map(|e| devices::open(&list, e, e.spec(), &settings).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The next completion of `cq`; fails the test after [`WAIT`].
fn one(cq: &bluerdma_linux::Cq, what: &str) -> bluerdma_core::engine::WorkCompletion {
    let got = cq.wait(1, WAIT).unwrap();
    assert_eq!(got.len(), 1, "{what}: no completion within {WAIT:?}");
    got[0]
}

/// WRITE and READ from `a` to `b`, and SEND from `a` into a receive WR of `b`, at each
/// size, every byte checked.
pub fn exercise(a: &Context, b: &Context, (sa, sb): (&Side, &Side), seed: u32) {
    let len_max = *SIZES.iter().max().unwrap();
    let mut src = sa.pd.alloc_mr(len_max, ALL).unwrap();
    let dst = sb.pd.alloc_mr(len_max, ALL).unwrap();
    let sink = sa.pd.alloc_mr(len_max, ALL).unwrap();
    for (k, len) in SIZES.into_iter().enumerate() {
        for (n, op) in [SendOp::Write, SendOp::Read, SendOp::Send]
            .into_iter()
            .enumerate()
        {
            let id = 10 * n as u64 + k as u64;
            let what = format!("{op:?} {len} B");
            fill_pattern(src.bytes_mut().unwrap(), seed + id as u32, 0);
            let mut w = match op {
                SendOp::Read => wr(id, op, &sink, 0, len, &dst, 0),
                _ => wr(id, op, &src, 0, len, &dst, 0),
            };
            if op == SendOp::Send {
                w.raddr = bluerdma_core::addr::VirtAddr(0);
                let recv = RecvWr {
                    wr_id: 100 + id,
                    addr: bluerdma_core::addr::VirtAddr(dst.addr()),
                    len: len_max as u32,
                    lkey: dst.key(),
                };
                // SAFETY: the MR outlives the completion waited for.
                unsafe { sb.qp.post_recv(&[recv]) }.unwrap();
            }
            // SAFETY: the MRs outlive the completion waited for.
            unsafe { sa.qp.post_send(&[w]) }.unwrap();
            let done = one(&sa.cq, &what);
            let dump = || format!("{what}\n{}\n{}", a.dump(), b.dump());
            assert_eq!(
                (done.wr_id, done.status),
                (id, WcStatus::Success),
                "{}",
                dump()
            );
            if op == SendOp::Send {
                let r = one(&sb.cq, "RECV");
                assert_eq!(
                    (r.wr_id, r.status, r.opcode, r.byte_len),
                    (100 + id, WcStatus::Success, WcOpcode::Recv, len as u32),
                    "{}",
                    dump()
                );
            }
            let (got, want) = match op {
                SendOp::Read => (&sink, &dst),
                _ => (&dst, &src),
            };
            assert_bytes_eq(
                &what,
                &got.bytes().unwrap()[..len],
                &want.bytes().unwrap()[..len],
            );
        }
    }
}

/// Whether this process runs as root (the fake PCI card needs it); says why a test that
/// needs it did nothing otherwise.
pub fn root_or_skip(why: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {why} needs root (CI runs as root)"
        );
    }
    root
}

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn pool(name: &str) -> u64 {
    std::fs::read_to_string(format!("{POOL}/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// At least `pages` free 2 MiB hugepages for the test (root only): the pool grows if it
/// must, and shrinks back by as much when the last guard of this process is dropped.
pub struct Hugepages {
    _guard: (),
}

/// Guards alive in this process and what they added.
static HUGEPAGES: std::sync::Mutex<(usize, u64)> = std::sync::Mutex::new((0, 0));

impl Hugepages {
    /// Reserves; panics with the reason if the kernel cannot give them.
    pub fn reserve(pages: u64) -> Hugepages {
        let mut g = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
        let before = pool("nr_hugepages");
        grow_pool(pages);
        let added = pool("nr_hugepages").saturating_sub(before);
        let got = pool("free_hugepages");
        if got < pages {
            let _ = std::fs::write(format!("{POOL}/nr_hugepages"), before.to_string());
            panic!("only {got} of {pages} 2 MiB hugepages could be reserved");
        }
        g.0 += 1;
        g.1 += added;
        Hugepages { _guard: () }
    }
}

/// Grows the pool until `pages` are free, compacting memory between tries (a machine
/// whose memory is page cache has few free 2 MiB blocks until it compacts).
fn grow_pool(pages: u64) {
    for _ in 0..3 {
        let free = pool("free_hugepages");
        if free >= pages {
            return;
        }
        let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
        let nr = pool("nr_hugepages");
        let _ = std::fs::write(
            format!("{POOL}/nr_hugepages"),
            (nr + pages - free).to_string(),
        );
    }
}

impl Drop for Hugepages {
    fn drop(&mut self) {
        let mut g = HUGEPAGES.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0 && g.1 > 0 {
            let nr = pool("nr_hugepages");
            let _ = std::fs::write(
                format!("{POOL}/nr_hugepages"),
                nr.saturating_sub(g.1).to_string(),
            );
            g.1 = 0;
        }
    }
}
