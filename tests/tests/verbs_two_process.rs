//! End to end across two processes on the UDP link: this test opens one emulated device at
//! 127.0.0.1, a child process (`verbs_peer`) opens one at 127.0.0.2 on the same
//! test-chosen UDP port, they exchange QP and MR details over the child's stdin/stdout, and
//! WRITEs and READs of 1 MiB and 16 MiB are verified byte for byte by the side that
//! receives them (the child compares against the same deterministic pattern).
//!
//! The child exits on `QUIT`, on the end of its stdin (this process gone), and after a
//! watchdog; a guard kills it if a test panics, so no run leaves it behind.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use bluerdma_core::engine::{SendOp, WcOpcode, WcStatus};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_linux::{Context, Cq, DeviceSpec, Endpoint, Mr, Qp};
use bluerdma_sim::link::{UdpLink, UdpLinkConfig};
use bluerdma_tests::{
    fill_pattern, line_field, parse_hex, pattern_mismatch, raw_wr, ALL, IP0, IP1,
};

const MIB: usize = 1 << 20;
/// The MRs: room for 1 MiB and 16 MiB side by side at unaligned offsets.
const PEER_MR: usize = 18 * MIB;
/// How long the child may live at most.
const WATCHDOG_SECS: u64 = 120;
/// How long one answer from the child or one completion may take.
const STEP: Duration = Duration::from_secs(30);
/// IB timeout 14 (67 ms) and 7 retries: UDP may drop datagrams.
const TIMEOUT: u8 = 14;
const RETRIES: u8 = 7;

/// The child process, its stdin and its stdout lines; killed and reaped on drop.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Peer {
    /// Starts `verbs_peer` at `ip` on UDP `port`; returns it with its READY line, or the
    /// line that says why it could not start.
    fn spawn(ip: Ipv4Addr, port: u16, oob_port: u16) -> Result<(Peer, String), String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_verbs_peer"))
            .env("VERBS_PEER_OOB_PORT", oob_port.to_string())
            .args([
                ip.to_string(),
                port.to_string(),
                PEER_MR.to_string(),
                WATCHDOG_SECS.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn verbs_peer: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        // A reader thread, so every wait for the child has a timeout.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Peer {
            child,
            stdin,
            lines,
        };
        let ready = peer.next_line()?;
        if ready.starts_with("READY") {
            Ok((peer, ready))
        } else {
            Err(ready)
        }
    }

    fn next_line(&mut self) -> Result<String, String> {
        self.lines
            .recv_timeout(STEP)
            .map_err(|e| format!("no answer from verbs_peer within {STEP:?}: {e}"))
    }

    /// Sends one command line and returns the answer.
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to verbs_peer");
        self.stdin.flush().expect("flush to verbs_peer");
        self.next_line().unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }

    /// Asks the child to exit and waits for it (it is killed if it does not).
    fn quit(mut self) {
        let _ = writeln!(self.stdin, "QUIT");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(status.success(), "verbs_peer exited with {status}");
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for verbs_peer: {e}"),
            }
        }
        panic!("verbs_peer did not exit within 10 s of QUIT");
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

/// This process's end: a device at 127.0.0.1, a QP connected to the child's and a local MR.
struct Local {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    ctx: Context,
}

/// What the child's READY line says.
struct Remote {
    qpn: Qpn,
    addr: u64,
    key: MrKey,
}

fn parse_ready(line: &str) -> Remote {
    let hex = |k| {
        line_field(line, k)
            .and_then(parse_hex)
            .unwrap_or_else(|| panic!("{k} in {line:?}"))
    };
    Remote {
        qpn: Qpn::from_raw(hex("qpn") as u32),
        addr: hex("addr"),
        key: MrKey::from_raw(hex("key") as u32),
    }
}

/// Binds this side's link on a free port, starts the child on the same port at
/// 127.0.0.2 (another port if that one is taken there) and connects the two QPs.
fn setup() -> (Local, Peer, Remote) {
    let mut last = String::new();
    for _ in 0..5 {
        let link = UdpLink::bind(UdpLinkConfig::new(IP0).with_port(0)).expect("bind 127.0.0.1");
        let port = link.local_addr().port();
        // The out-of-band channel (TCP) on a port free here; the child uses the same port
        // on its own IP.
        let oob_port = std::net::TcpListener::bind((IP0, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free TCP port");
        let mut cfg = bluerdma_linux::oob::TcpOobConfig::new(IP0);
        cfg.port = oob_port;
        let Ok(oob) = bluerdma_linux::oob::TcpOob::bind(cfg) else {
            continue;
        };
        let (mut peer, ready) = match Peer::spawn(IP1, port, oob_port) {
            Ok(p) => p,
            Err(why) => {
                last = why;
                continue;
            }
        };
        let remote = parse_ready(&ready);
        let ctx = Context::open_emulated_with_oob(
            DeviceSpec::new("blue0", IP0),
            Box::new(link),
            Some(Box::new(oob)),
        )
        .expect("open the local device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq().unwrap();
        let qp = pd.create_qp(&cq, &cq).unwrap();
        let mr = pd.alloc_mr(PEER_MR, ALL).unwrap();
        let (my_psn, peer_psn) = (100, 7);
        let answer = peer.ask(&format!(
            "CONNECT qpn={:#x} ip={IP0} psn={my_psn} mypsn={peer_psn} timeout={TIMEOUT} retries={RETRIES}",
            qp.qpn().get()
        ));
        assert_eq!(answer, "OK", "the child connects its QP");
        qp.connect(
            Endpoint {
                qpn: remote.qpn,
                ip: IP1,
                psn: peer_psn,
            },
            my_psn,
            TIMEOUT,
            RETRIES,
        )
        .unwrap();
        return (Local { qp, cq, mr, ctx }, peer, remote);
    }
    panic!("verbs_peer could not start: {last}");
}

/// One WRITE or READ of `len` bytes between local offset `off` and remote offset `roff`,
/// waited for; on failure both devices' state is printed.
fn transfer(
    local: &Local,
    peer: &mut Peer,
    remote: &Remote,
    op: SendOp,
    (off, len, roff): (usize, usize, usize),
) {
    let wr = raw_wr(
        len as u64,
        op,
        (local.mr.addr() + off as u64, local.mr.key()),
        len,
        (remote.addr + roff as u64, remote.key),
    );
    let start = Instant::now();
    // SAFETY: the local MR outlives the completion awaited here; the remote MR lives in
    // the child until QUIT.
    unsafe { local.qp.post_send(&[wr]) }.unwrap();
    let wc = local.cq.wait(1, STEP).unwrap();
    let state = |peer: &mut Peer| {
        format!(
            "this side:\n{}\nverbs_peer: {}",
            local.ctx.dump(),
            peer.ask("DUMP")
        )
    };
    assert_eq!(
        wc.len(),
        1,
        "{op:?} of {len} B completes within {STEP:?}\n{}",
        state(peer)
    );
    let want = if op == SendOp::Read {
        WcOpcode::RdmaRead
    } else {
        WcOpcode::RdmaWrite
    };
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (len as u64, WcStatus::Success, want),
        "{op:?} of {len} B\n{}",
        state(peer)
    );
    eprintln!(
        "{op:?} of {len} B across processes: {:?} ({:?})",
        start.elapsed(),
        local.ctx.stats()
    );
}

#[test]
fn write_of_1_and_16_mib_to_another_process_arrives_intact() {
    let (mut local, mut peer, remote) = setup();
    // (local offset, length, remote offset): side by side in the child's MR, unaligned.
    let cases = [(3, MIB, 5), (MIB + 1, 16 * MIB, MIB + 16)];
    let mut written_up_to = 0;
    for (k, (off, len, roff)) in cases.into_iter().enumerate() {
        let seed = 0x5EED + k as u32;
        fill_pattern(&mut local.mr.bytes_mut().unwrap()[off..off + len], seed, 0);
        transfer(&local, &mut peer, &remote, SendOp::Write, (off, len, roff));
        assert_eq!(
            peer.ask(&format!("CHECK off={roff} len={len} seed={seed}")),
            "OK",
            "the child verified every byte of {len} B"
        );
        assert_eq!(
            peer.ask(&format!(
                "ZERO off={written_up_to} len={}",
                roff - written_up_to
            )),
            "OK",
            "nothing written before the target"
        );
        assert_eq!(
            peer.ask(&format!("ZERO off={} len=16", roff + len)),
            "OK",
            "nothing written after the target"
        );
        written_up_to = roff + len;
    }
    peer.quit();
}

#[test]
fn read_of_1_and_16_mib_from_another_process_arrives_intact() {
    let (local, mut peer, remote) = setup();
    for (k, (off, len, roff)) in [(5, MIB, 3), (7, 16 * MIB, 1)].into_iter().enumerate() {
        let seed = 0xBEAD + k as u32;
        assert_eq!(
            peer.ask(&format!("FILL off={roff} len={len} seed={seed}")),
            "OK"
        );
        transfer(&local, &mut peer, &remote, SendOp::Read, (off, len, roff));
        let got = &local.mr.bytes().unwrap()[off..off + len];
        assert_eq!(
            pattern_mismatch(got, seed, 0),
            None,
            "every byte of the {len} B READ"
        );
    }
    peer.quit();
}

#[test]
fn send_of_1_and_16_mib_to_another_process_lands_in_its_posted_receives() {
    let (mut local, mut peer, _remote) = setup();
    // The child posts two receives; they travel to us over the TCP out-of-band channel.
    assert_eq!(peer.ask(&format!("RECV wr=1 off=0 len={}", MIB + 64)), "OK");
    assert_eq!(
        peer.ask(&format!("RECV wr=2 off={} len={}", 2 * MIB, 16 * MIB)),
        "OK"
    );
    for (k, (wr_id, len, roff)) in [(1u64, MIB, 0usize), (2, 16 * MIB, 2 * MIB)]
        .into_iter()
        .enumerate()
    {
        let seed = 0x5E4D + k as u32;
        fill_pattern(&mut local.mr.bytes_mut().unwrap()[..len], seed, 0);
        let mut wr = raw_wr(
            wr_id,
            SendOp::Send,
            (local.mr.addr(), local.mr.key()),
            len,
            (0, MrKey::from_raw(0)),
        );
        wr.signaled = true;
        // SAFETY: the local MR outlives the completion awaited here.
        unsafe { local.qp.post_send(&[wr]) }.unwrap();
        let wc = local.cq.wait(1, STEP).unwrap();
        assert_eq!(
            wc.len(),
            1,
            "SEND of {len} B completes\n{}",
            local.ctx.dump()
        );
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode),
            (wr_id, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(
            peer.ask("WAITRECV"),
            format!("RECVD wr={wr_id} len={len} status=0")
        );
        assert_eq!(
            peer.ask(&format!("CHECK off={roff} len={len} seed={seed}")),
            "OK",
            "every byte of the {len} B SEND"
        );
    }
    peer.quit();
}

#[test]
fn peer_killed_mid_stream_flushes_the_waiting_send() {
    let (local, mut peer, _remote) = setup();
    // Make sure the out-of-band connection exists: one receive, one SEND that uses it.
    assert_eq!(peer.ask("RECV wr=1 off=0 len=64"), "OK");
    let mut wr = raw_wr(
        1,
        SendOp::Send,
        (local.mr.addr(), local.mr.key()),
        8,
        (0, MrKey::from_raw(0)),
    );
    wr.signaled = true;
    // SAFETY: the local MR outlives the completions awaited here.
    unsafe { local.qp.post_send(&[wr]) }.unwrap();
    assert_eq!(local.cq.wait(1, STEP).unwrap()[0].status, WcStatus::Success);
    // A SEND with no receive waits (RNR, forever); then the peer dies.
    wr.wr_id = 2;
    // SAFETY: as above.
    unsafe { local.qp.post_send(&[wr]) }.unwrap();
    assert!(
        local
            .cq
            .wait(1, Duration::from_millis(100))
            .unwrap()
            .is_empty(),
        "waits for a receive"
    );
    peer.child.kill().unwrap();
    let wc = local.cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(
        wc.len(),
        1,
        "the lost peer ends the wait\n{}",
        local.ctx.dump()
    );
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::WrFlushErr));
    assert_eq!(local.ctx.stats().peers_lost, 1);
    assert_eq!(
        local.qp.query().unwrap().state,
        bluerdma_core::qp::QpState::Err
    );
}
