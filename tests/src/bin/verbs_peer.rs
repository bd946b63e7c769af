//! The far end of `tests/tests/verbs_two_process.rs`: one emulated device on a UDP link in
//! its own process, driven by lines on stdin, answering on stdout.
//!
//! Usage: `verbs_peer <ip> <udp-port> <mr-bytes> <watchdog-seconds>`. It binds the link,
//! opens the device, creates a QP and one MR of `mr-bytes`, and prints
//! `READY qpn=<hex> ip=<ip> addr=<hex> key=<hex> len=<n>`. Then, one line each:
//!
//! - `CONNECT qpn=<hex> ip=<ip> psn=<n> mypsn=<n> timeout=<n> retries=<n>`: connects the QP
//!   to the peer's (RESET -> INIT -> RTR -> RTS); answers `OK`.
//! - `FILL off=<n> len=<n> seed=<n>`: writes pattern `seed` into the MR; answers `OK`.
//! - `CHECK off=<n> len=<n> seed=<n>`: compares the MR with pattern `seed`; answers `OK`
//!   or `MISMATCH at=<offset> got=<byte> want=<byte>`.
//! - `ZERO off=<n> len=<n>`: checks the bytes are untouched; answers `OK` or `DIRTY at=<n>`.
//! - `RECV wr=<n> off=<n> len=<n>`: posts a receive WR on that part of the MR (announced to
//!   the peer over the out-of-band channel); answers `OK`.
//! - `WAITRECV`: waits for one receive completion; answers
//!   `RECVD wr=<n> len=<byte_len> status=<code>` or `ERR`.
//! - `DUMP`: answers the device's state dump on one line (` | ` between its lines).
//!
//! With `VERBS_PEER_OOB_PORT` set, the device also opens the out-of-band channel (TCP on
//! its IP at that port), so SEND/RECV work.
//! - `QUIT`, or the end of stdin: exits 0.
//!
//! - `WRITE raddr=<hex> rkey=<hex> off=<n> len=<n>`: RDMA WRITEs that part of the MR to
//!   the peer's memory and waits for its completion; answers `DONE status=<code>`.
//! - `STREAM raddr=<hex> rkey=<hex> len=<n> count=<n>`: posts `count` WRITEs of `len`
//!   bytes from the MR's start and answers `POSTED` at once (traffic in flight, for a test
//!   that kills this process).
//!
//! `verbs_peer shared <device> <mr-bytes> <watchdog-seconds>` opens `<device>` of
//! `BLUERDMA_DEVICES` through its daemon instead (many processes on one device; the
//! environment must carry `BLUERDMA_SHARED=1`), with the same commands.
//!
//! A bad line is answered `ERR <why>`. Whatever happens, the process exits after
//! `watchdog-seconds` (status 3) so that a test run never leaves it behind.

use std::io::{self, BufRead, Write};
use std::net::Ipv4Addr;
use std::process::exit;
use std::time::Duration;

use bluerdma_core::engine::SendOp;
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_linux::{Context, DeviceSpec, Endpoint, Mr, Qp};
use bluerdma_sim::link::{UdpLink, UdpLinkConfig};
use bluerdma_tests::{
    fill_pattern, line_field, parse_hex, pattern_byte, pattern_mismatch, raw_wr, ALL,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("shared") {
        let [_, device, mr_bytes, watchdog] = args.as_slice() else {
            eprintln!("usage: verbs_peer shared <device> <mr-bytes> <watchdog-seconds>");
            exit(2);
        };
        let (Ok(mr_bytes), Ok(watchdog)) = (mr_bytes.parse::<usize>(), watchdog.parse::<u64>())
        else {
            eprintln!("verbs_peer: bad arguments {args:?}");
            exit(2);
        };
        watchdog_thread(watchdog);
        let ctx =
            bluerdma_tests::shared::open(device).unwrap_or_else(|e| fail(&format!("open: {e}")));
        let ip = ctx.spec().ip;
        serve(ctx, ip, mr_bytes);
        return;
    }
    let [ip, port, mr_bytes, watchdog] = args.as_slice() else {
        eprintln!("usage: verbs_peer <ip> <udp-port> <mr-bytes> <watchdog-seconds>");
        exit(2);
    };
    let (Ok(ip), Ok(port), Ok(mr_bytes), Ok(watchdog)) = (
        ip.parse::<Ipv4Addr>(),
        port.parse::<u16>(),
        mr_bytes.parse::<usize>(),
        watchdog.parse::<u64>(),
    ) else {
        eprintln!("verbs_peer: bad arguments {args:?}");
        exit(2);
    };
    watchdog_thread(watchdog);
    let mut out = io::stdout().lock();
    let link = match UdpLink::bind(UdpLinkConfig::new(ip).with_port(port)) {
        Ok(l) => l,
        Err(e) => {
            // The parent retries on another port.
            let _ = writeln!(out, "ERR bind {ip}:{port}: {e}");
            exit(1);
        }
    };
    let oob = std::env::var("VERBS_PEER_OOB_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .map(|p| {
            let mut cfg = bluerdma_linux::oob::TcpOobConfig::new(ip);
            cfg.port = p;
            let oob = bluerdma_linux::oob::TcpOob::bind(cfg)
                .unwrap_or_else(|e| fail(&format!("oob: {e}")));
            Box::new(oob) as Box<dyn bluerdma_core::platform::OobTransport + Send>
        });
    let ctx = Context::open_emulated_with_oob(DeviceSpec::new("peer", ip), Box::new(link), oob)
        .unwrap_or_else(|e| fail(&format!("open: {e}")));
    drop(out);
    serve(ctx, ip, mr_bytes);
}

fn watchdog_thread(watchdog: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(watchdog));
        eprintln!("verbs_peer: watchdog: {watchdog} s passed, exiting");
        exit(3);
    });
}

/// Makes the QP and the MR on `ctx` and answers commands until QUIT.
fn serve(ctx: Context, ip: Ipv4Addr, mr_bytes: usize) {
    let mut out = io::stdout().lock();
    let pd = ctx.alloc_pd().unwrap_or_else(|e| fail(&format!("{e}")));
    let cq = ctx.create_cq().unwrap_or_else(|e| fail(&format!("{e}")));
    let qp = pd
        .create_qp(&cq, &cq)
        .unwrap_or_else(|e| fail(&format!("{e}")));
    let mut mr = pd
        .alloc_mr(mr_bytes, ALL)
        .unwrap_or_else(|e| fail(&format!("{e}")));
    let _ = writeln!(
        out,
        "READY qpn={:#x} ip={ip} addr={:#x} key={:#x} len={}",
        qp.qpn().get(),
        mr.addr(),
        mr.key().get(),
        mr.len()
    );
    let _ = out.flush();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match line.split_whitespace().next() {
            Some("QUIT") => break,
            Some("CONNECT") => connect(&qp, &line),
            Some("FILL") => fill(&mut mr, &line),
            Some("CHECK") => check(&mr, &line),
            Some("ZERO") => zero(&mr, &line),
            Some("DUMP") => Ok(ctx.dump().trim_end().replace('\n', " | ")),
            Some("RECV") => recv(&qp, &mr, &line),
            Some("WAITRECV") => wait_recv(&cq),
            Some("WRITE") => write(&qp, &cq, &mr, &line),
            Some("STREAM") => stream(&qp, &mr, &line),
            _ => Err(format!("unknown command {line:?}")),
        };
        let _ = match reply {
            Ok(r) => writeln!(out, "{r}"),
            Err(e) => writeln!(out, "ERR {e}"),
        };
        let _ = out.flush();
    }
    drop((qp, mr, pd, cq));
    drop(ctx);
}

fn fail(why: &str) -> ! {
    println!("ERR {why}");
    exit(1);
}

fn num(line: &str, key: &str) -> Result<u64, String> {
    line_field(line, key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{key}=<number> missing in {line:?}"))
}

fn connect(qp: &Qp, line: &str) -> Result<String, String> {
    let qpn = line_field(line, "qpn")
        .and_then(parse_hex)
        .ok_or("qpn=<hex> missing")?;
    let ip: Ipv4Addr = line_field(line, "ip")
        .and_then(|v| v.parse().ok())
        .ok_or("ip=<address> missing")?;
    let remote = Endpoint {
        qpn: Qpn::from_raw(qpn as u32),
        ip,
        psn: num(line, "psn")? as u32,
    };
    qp.connect(
        remote,
        num(line, "mypsn")? as u32,
        num(line, "timeout")? as u8,
        num(line, "retries")? as u8,
    )
    .map_err(|e| e.to_string())?;
    Ok("OK".into())
}

/// The MR bytes `off=`, `len=` of a command names.
fn range(mr_len: usize, line: &str) -> Result<std::ops::Range<usize>, String> {
    let (off, len) = (num(line, "off")? as usize, num(line, "len")? as usize);
    match off.checked_add(len) {
        Some(end) if end <= mr_len => Ok(off..end),
        _ => Err(format!("{off}+{len} is outside the MR of {mr_len} bytes")),
    }
}

fn fill(mr: &mut Mr, line: &str) -> Result<String, String> {
    let r = range(mr.len(), line)?;
    let seed = num(line, "seed")? as u32;
    let bytes = mr.bytes_mut().ok_or("not an owned MR")?;
    fill_pattern(&mut bytes[r], seed, 0);
    Ok("OK".into())
}

fn check(mr: &Mr, line: &str) -> Result<String, String> {
    let r = range(mr.len(), line)?;
    let seed = num(line, "seed")? as u32;
    let bytes = &mr.bytes().ok_or("not an owned MR")?[r];
    Ok(match pattern_mismatch(bytes, seed, 0) {
        None => "OK".into(),
        Some(i) => format!(
            "MISMATCH at={i} got={:#04x} want={:#04x}",
            bytes[i],
            pattern_byte(seed, i as u64)
        ),
    })
}

fn recv(qp: &Qp, mr: &Mr, line: &str) -> Result<String, String> {
    let r = range(mr.len(), line)?;
    let wr = bluerdma_core::engine::RecvWr {
        wr_id: num(line, "wr")?,
        addr: bluerdma_core::addr::VirtAddr(mr.addr() + r.start as u64),
        len: r.len() as u32,
        lkey: mr.key(),
    };
    // SAFETY: the MR lives until the process exits.
    unsafe { qp.post_recv(&[wr]) }.map_err(|(_, e)| e.to_string())?;
    Ok("OK".into())
}

fn wait_recv(cq: &bluerdma_linux::Cq) -> Result<String, String> {
    let got = cq
        .wait(1, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let w = got.first().ok_or("no receive completion within 30 s")?;
    Ok(format!(
        "RECVD wr={} len={} status={}",
        w.wr_id, w.byte_len, w.status as u32
    ))
}

fn remote(line: &str) -> Result<(u64, MrKey), String> {
    let raddr = line_field(line, "raddr")
        .and_then(parse_hex)
        .ok_or("raddr=<hex> missing")?;
    let rkey = line_field(line, "rkey")
        .and_then(parse_hex)
        .ok_or("rkey=<hex> missing")?;
    Ok((raddr, MrKey::from_raw(rkey as u32)))
}

fn write(qp: &Qp, cq: &bluerdma_linux::Cq, mr: &Mr, line: &str) -> Result<String, String> {
    let r = range(mr.len(), line)?;
    let (raddr, rkey) = remote(line)?;
    let wr = raw_wr(
        1,
        SendOp::Write,
        (mr.addr() + r.start as u64, mr.key()),
        r.len(),
        (raddr, rkey),
    );
    // SAFETY: the MR lives until the process exits.
    unsafe { qp.post_send(&[wr]) }.map_err(|(_, e)| e.to_string())?;
    let got = cq
        .wait(1, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let w = got.first().ok_or("no completion within 30 s")?;
    Ok(format!("DONE status={}", w.status as u32))
}

fn stream(qp: &Qp, mr: &Mr, line: &str) -> Result<String, String> {
    let len = (num(line, "len")? as usize).min(mr.len());
    let count = num(line, "count")?;
    let (raddr, rkey) = remote(line)?;
    for k in 0..count {
        let mut wr = raw_wr(
            100 + k,
            SendOp::Write,
            (mr.addr(), mr.key()),
            len,
            (raddr, rkey),
        );
        wr.signaled = false;
        // SAFETY: the MR lives until the process exits.
        if let Err((_, e)) = unsafe { qp.post_send(&[wr]) } {
            return Ok(format!("POSTED {k} ({e})"));
        }
    }
    Ok("POSTED".into())
}

fn zero(mr: &Mr, line: &str) -> Result<String, String> {
    let r = range(mr.len(), line)?;
    let bytes = &mr.bytes().ok_or("not an owned MR")?[r];
    Ok(match bytes.iter().position(|x| *x != 0) {
        None => "OK".into(),
        Some(i) => format!("DIRTY at={i}"),
    })
}
