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

/// This process and a `verbs_peer` child (`bin`) on shared device `a_name` (`a`), each with
/// a QP connected to a QP of its own on device `b`: the scenario of the shared-device tests
/// of every backend ([`SharedPair::write_both_ways`]).
pub struct SharedPair {
    /// This process's QP on A, its CQ and MR (64 KiB).
    pub qa: bluerdma_linux::Qp,
    /// Its CQ.
    pub ca: bluerdma_linux::Cq,
    /// Its MR.
    pub ma: bluerdma_linux::Mr,
    qb1: bluerdma_linux::Qp,
    qb2: bluerdma_linux::Qp,
    cb: bluerdma_linux::Cq,
    mb: bluerdma_linux::Mr,
    /// The child on A.
    pub child: Peer,
    child_addr: u64,
    child_key: u32,
    _pds: (bluerdma_linux::Pd, bluerdma_linux::Pd),
}

const KIB: usize = 1024;

impl SharedPair {
    /// Makes the QPs and MRs and connects them (local ACK timeout exponent `timeout`, 7
    /// retries).
    pub fn connect(
        bin: &str,
        (a, a_name): (&bluerdma_linux::Context, &str),
        b: &bluerdma_linux::Context,
        timeout: u8,
    ) -> SharedPair {
        use bluerdma_core::keys::Qpn;
        use bluerdma_linux::Endpoint;
        let (ip_a, ip_b) = (a.spec().ip, b.spec().ip);
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
        let qa = pa.create_qp(&ca, &ca).unwrap();
        let qb1 = pb.create_qp(&cb, &cb).unwrap();
        let qb2 = pb.create_qp(&cb, &cb).unwrap();
        let ma = pa.alloc_mr(64 * KIB, crate::ALL).unwrap();
        let mb = pb.alloc_mr(256 * KIB, crate::ALL).unwrap();
        let ep = |qpn: Qpn, ip| Endpoint { qpn, ip, psn: 0 };
        qa.connect(ep(qb1.qpn(), ip_b), 0, timeout, 7).unwrap();
        qb1.connect(ep(qa.qpn(), ip_a), 0, timeout, 7).unwrap();
        let (mut child, ready) = Peer::spawn(bin, a_name, 64 * KIB);
        let hex = |k| {
            crate::line_field(&ready, k)
                .and_then(crate::parse_hex)
                .expect("READY field")
        };
        let (child_qpn, child_addr, child_key) = (hex("qpn"), hex("addr"), hex("key"));
        let r = child.ask(&format!(
            "CONNECT qpn={:#x} ip={ip_b} psn=0 mypsn=0 timeout={timeout} retries=7",
            qb2.qpn().get()
        ));
        assert_eq!(r, "OK");
        qb2.connect(ep(Qpn::from_raw(child_qpn as u32), ip_a), 0, timeout, 7)
            .unwrap();
        SharedPair {
            qa,
            ca,
            ma,
            qb1,
            qb2,
            cb,
            mb,
            child,
            child_addr,
            child_key: child_key as u32,
            _pds: (pa, pb),
        }
    }

    /// A WRITE from each process on A into B's memory, then a WRITE from B into each of
    /// them, every byte checked.
    pub fn write_both_ways(&mut self, step: Duration) {
        use crate::{fill_pattern, pattern_mismatch, raw_wr};
        use bluerdma_core::engine::{SendOp, WcStatus};
        use bluerdma_core::keys::MrKey;
        let (ma, mb) = (&mut self.ma, &mut self.mb);
        fill_pattern(ma.bytes_mut().unwrap(), 11, 0);
        let w = raw_wr(
            1,
            SendOp::Write,
            (ma.addr(), ma.key()),
            64 * KIB,
            (mb.addr(), mb.key()),
        );
        // SAFETY: the MRs outlive the WRITE (its completion is awaited).
        unsafe { self.qa.post_send(&[w]) }.unwrap();
        assert_eq!(self.ca.wait(1, step).unwrap()[0].status, WcStatus::Success);
        assert_eq!(self.child.ask("FILL off=0 len=65536 seed=12"), "OK");
        let r = self.child.ask(&format!(
            "WRITE raddr={:#x} rkey={:#x} off=0 len=65536",
            mb.addr() + 128 * 1024,
            mb.key().get()
        ));
        assert_eq!(r, "DONE status=0");
        let got = mb.bytes().unwrap();
        assert_eq!(
            pattern_mismatch(&got[..64 * KIB], 11, 0),
            None,
            "this process's bytes"
        );
        assert_eq!(
            pattern_mismatch(&got[128 * KIB..192 * KIB], 12, 0),
            None,
            "the child's bytes"
        );
        fill_pattern(&mut mb.bytes_mut().unwrap()[..16 * KIB], 13, 0);
        for (qp, addr, key) in [
            (&self.qb1, ma.addr(), ma.key()),
            (&self.qb2, self.child_addr, MrKey::from_raw(self.child_key)),
        ] {
            let w = raw_wr(
                2,
                SendOp::Write,
                (mb.addr(), mb.key()),
                16 * KIB,
                (addr, key),
            );
            // SAFETY: as above.
            unsafe { qp.post_send(&[w]) }.unwrap();
            assert_eq!(self.cb.wait(1, step).unwrap()[0].status, WcStatus::Success);
        }
        assert_eq!(
            pattern_mismatch(&ma.bytes().unwrap()[..16 * KIB], 13, 0),
            None
        );
        assert_eq!(self.child.ask("CHECK off=0 len=16384 seed=13"), "OK");
    }
}
