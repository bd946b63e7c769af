//! Devices shared between processes (`BLUERDMA_SHARED=1`, `bluerdma-devd`): opening one
//! of the environment's list through its daemon, and reading the daemon's state.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use bluerdma_linux::devices::{DeviceList, Settings};
use bluerdma_linux::Context;

/// Opens `device` of `BLUERDMA_DEVICES` (through its daemon when `BLUERDMA_SHARED=1`).
pub fn open(device: &str) -> Result<Context, String> {
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .get(device)
        .ok_or_else(|| format!("no device {device} in BLUERDMA_DEVICES"))?;
    let settings = Settings::from_env()?;
    let mut spec = entry.spec();
    spec.name = device.to_string();
    settings.apply(&mut spec);
    bluerdma_linux::devices::open(&list, entry, spec, &settings).map_err(|e| e.to_string())
}

/// The state text of `device`'s daemon (a line per client, then the card's).
pub fn status(device: &str) -> Result<String, String> {
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .get(device)
        .ok_or_else(|| format!("no device {device} in BLUERDMA_DEVICES"))?;
    bluerdma_linux::shared::status(entry).map_err(|e| e.to_string())
}

/// The value of `key=` in the line of `text` that starts with `prefix`.
pub fn status_field(text: &str, prefix: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| crate::line_field(l, key))
        .and_then(|v| v.parse().ok())
}

/// Sets this process's environment for shared devices `devices` (a `BLUERDMA_DEVICES`
/// value) with daemons' sockets under `run_dir`, building `bluerdma-devd` in this test's
/// profile. Call once, before any thread reads the environment.
pub fn setup(devices: &str, run_dir: &std::path::Path) -> PathBuf {
    let devd = crate::served::cargo_build(&["-p", "bluerdma-linux", "--bin", "bluerdma-devd"])
        .join("bluerdma-devd");
    assert!(devd.exists(), "the build did not make {}", devd.display());
    std::fs::create_dir_all(run_dir).expect("run dir");
    // SAFETY (of the environment): called before the test starts threads that read it.
    std::env::set_var("BLUERDMA_SHARED", "1");
    std::env::set_var("BLUERDMA_DEVD", &devd);
    std::env::set_var("BLUERDMA_RUN_DIR", run_dir);
    std::env::set_var("BLUERDMA_DEVICES", devices);
    devd
}

/// How long one answer of a [`Peer`] may take.
pub const STEP: Duration = Duration::from_secs(30);

/// A `verbs_peer shared` child process (its commands: `tests/src/bin/verbs_peer.rs`);
/// killed and reaped on drop.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Peer {
    /// Starts `verbs_peer` (`bin`: `env!("CARGO_BIN_EXE_verbs_peer")`) on shared `device`
    /// with an MR of `mr` bytes; returns it with its READY line.
    pub fn spawn(bin: &str, device: &str, mr: usize) -> (Peer, String) {
        let mut child = Command::new(bin)
            .args(["shared", device, &mr.to_string(), "120"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn verbs_peer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut p = Peer {
            child,
            stdin,
            lines,
        };
        let ready = p.next_line();
        assert!(ready.starts_with("READY"), "verbs_peer: {ready}");
        (p, ready)
    }

    /// The next line it printed.
    pub fn next_line(&mut self) -> String {
        self.lines
            .recv_timeout(STEP)
            .unwrap_or_else(|e| panic!("no answer from verbs_peer within {STEP:?}: {e}"))
    }

    /// Sends one command line and returns the answer.
    pub fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to verbs_peer");
        self.stdin.flush().expect("flush");
        self.next_line()
    }
}

impl Peer {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for it to exit (after a kill).
    pub fn reap(&mut self) {
        let _ = self.child.wait();
    }

    /// Asks the child to exit and waits for its status 0.
    pub fn quit(mut self) {
        let _ = writeln!(self.stdin, "QUIT");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => {
                    assert!(s.success(), "verbs_peer exited with {s}");
                    return;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => panic!("verbs_peer did not exit after QUIT: {other:?}"),
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
