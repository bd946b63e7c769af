//! Cards served by `bluerdma-sim` processes, for the backend tests: `serve` (the RTL
//! simulator's sockets) and `pci-serve` (a fake PCI card under a root directory). The
//! binary is built once per test binary with the test's own profile and target directory;
//! each served card is a child process, stopped (SIGTERM, then SIGKILL) when dropped.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a served card may take to say it serves (a cold start builds nothing; the
/// binary is built before).
const START_LIMIT: Duration = Duration::from_secs(60);

/// The `bluerdma-sim` binary, built with this test's profile.
pub fn sim_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
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
            .args(["build", "-p", "bluerdma-sim", "--bin", "bluerdma-sim"])
            .args(["--profile", &profile])
            .arg("--target-dir")
            .arg(target_dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{cargo} build`: {e}"));
        assert!(
            out.status.success(),
            "building bluerdma-sim failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("bluerdma-sim")
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
        let link = format!("udp:{ip}");
        let mut served = Self::start(&[
            "serve",
            "--csr-port",
            "0",
            "--dma-port",
            "0",
            "--link",
            &link,
            "--name",
            name,
            "--log",
            "warn",
        ]);
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
        let link = format!("udp:{ip}");
        Self::start(&[
            "pci-serve",
            "--root",
            root.to_str().expect("a UTF-8 root"),
            "--link",
            &link,
            "--name",
            name,
            "--log",
            "warn",
        ])
    }

    /// The `bluerdma-sim` device entry backend of this card: `+rtl:CSR/DMA`.
    pub fn rtl_backend(&self) -> String {
        format!("+rtl:{}/{}", self.ports.0, self.ports.1)
    }

    fn start(args: &[&str]) -> Served {
        let mut child = Command::new(sim_binary())
            .args(args)
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
