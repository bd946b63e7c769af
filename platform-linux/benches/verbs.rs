//! End-to-end figures of the verbs API on two emulated NICs in this process, each next to
//! the TCP loopback baseline measured in the same run (the machine is shared and noisy:
//! ratios, not absolute numbers, are what compare between runs).
//!
//! `cargo bench -p bluerdma-linux --bench verbs [-- --seconds S]`
//!
//! - post_send rate: WRITE work requests (64 B, one signaled per batch of 32) posted into
//!   the send ring, timed around `post_send` only.
//! - WRITE bandwidth: 1 MiB WRITEs, 8 in flight, over the UDP link, vs a TCP stream.
//! - 8 B WRITE ping-pong latency (each side spins on its buffer) vs TCP ping-pong of 8 B.
//! - Idle CPU: two devices open with a connected QP pair and nothing to do.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr, WorkCompletion};
use bluerdma_linux::{Context, Cq, DeviceSpec, Mr, Pd, Qp};
use bluerdma_sim::link::{UdpLink, UdpLinkConfig};

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn open(port: u16) -> (Side, Side) {
    let link = |ip| {
        Box::new(UdpLink::bind(UdpLinkConfig::new(ip).with_port(port)).expect("bind UDP link"))
    };
    let a = Context::open_emulated(DeviceSpec::new("blue0", IP0), link(IP0)).expect("open blue0");
    let b = Context::open_emulated(DeviceSpec::new("blue1", IP1), link(IP1)).expect("open blue1");
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();
    qa.connect(qb.endpoint(0), 0, 16, 7).unwrap();
    qb.connect(qa.endpoint(0), 0, 16, 7).unwrap();
    (
        Side {
            ctx: a,
            pd: pa,
            cq: ca,
            qp: qa,
        },
        Side {
            ctx: b,
            pd: pb,
            cq: cb,
            qp: qb,
        },
    )
}

fn write(wr_id: u64, src: &Mr, soff: u64, len: u32, dst: &Mr, doff: u64, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write,
        laddr: VirtAddr(src.addr() + soff),
        len,
        lkey: src.key(),
        raddr: VirtAddr(dst.addr() + doff),
        rkey: dst.key(),
        signaled,
        solicited: false,
    }
}

fn drain(cq: &Cq, n: usize) {
    let got = cq.wait(n, Duration::from_secs(30)).expect("poll");
    assert_eq!(got.len(), n, "completions");
    for w in &got {
        assert_eq!(w.status, bluerdma_core::engine::WcStatus::Success, "{w:?}");
    }
}

/// Work requests posted per second (post_send only).
fn post_rate(a: &Side, b: &Side, seconds: f64) -> f64 {
    let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 20, ALL).unwrap();
    let batch: Vec<SendWr> = (0..32)
        .map(|k| write(k, &src, k * 64, 64, &dst, k * 64, k == 31))
        .collect();
    let mut posted = 0u64;
    let mut in_post = Duration::ZERO;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        // SAFETY: both MRs outlive every completion (drained below).
        unsafe { a.qp.post_send(&batch).expect("post") };
        in_post += t.elapsed();
        posted += 32;
        drain(&a.cq, 1);
    }
    posted as f64 / in_post.as_secs_f64()
}

/// WRITE bandwidth in Gbit/s: `len`-byte WRITEs, `depth` in flight.
fn write_bw(a: &Side, b: &Side, len: u32, depth: usize, seconds: f64) -> f64 {
    let src = a.pd.alloc_mr(len as usize * depth, ALL).unwrap();
    let dst = b.pd.alloc_mr(len as usize * depth, ALL).unwrap();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut bytes = 0u64;
    let mut k = 0u64;
    let mut inflight = 0usize;
    while Instant::now() < end || inflight > 0 {
        while inflight < depth && Instant::now() < end {
            let slot = k % depth as u64;
            let wr = write(
                k,
                &src,
                slot * len as u64,
                len,
                &dst,
                slot * len as u64,
                true,
            );
            // SAFETY: both MRs outlive every completion (drained below).
            unsafe { a.qp.post_send(&[wr]).expect("post") };
            k += 1;
            inflight += 1;
        }
        let mut wc = [WorkCompletion::EMPTY; 16];
        let n = a.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, bluerdma_core::engine::WcStatus::Success, "{w:?}");
        }
        inflight -= n;
        bytes += n as u64 * len as u64;
        if n == 0 {
            thread::yield_now();
        }
    }
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// Half round trip of 8 B WRITE ping-pong, in microseconds.
fn write_latency(a: &Side, b: &Side, iters: u32) -> f64 {
    let buf_a = a.pd.alloc_mr(4096, ALL).unwrap();
    let buf_b = b.pd.alloc_mr(4096, ALL).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // B echoes: waits for sequence n at offset 0 of its buffer, writes n back to A.
    let (bq, bcq) = (&b.qp, &b.cq);
    let (addr_a, addr_b) = (buf_a.addr(), buf_b.addr());
    let (ra, rb) = (&buf_a, &buf_b);
    let t = thread::scope(|s| {
        let stop2 = Arc::clone(&stop);
        let echo = s.spawn(move || {
            let mut want = 1u64;
            while !stop2.load(Ordering::Relaxed) {
                // SAFETY: buf_b is registered, 4096 bytes, alive for the scope; the card writes
                // the 8 bytes we read (a volatile read sees them).
                let got = unsafe { std::ptr::read_volatile(addr_b as *const u64) };
                if got == want {
                    // SAFETY: buf_b outlives the completion polled below.
                    unsafe { std::ptr::write_volatile((addr_b + 8) as *mut u64, want) };
                    let wr = write(want, rb, 8, 8, ra, 0, true);
                    // SAFETY: both MRs outlive the completion.
                    unsafe { bq.post_send(&[wr]).expect("echo") };
                    drain(bcq, 1);
                    want += 1;
                } else {
                    // Yield: the emulated cards share these two cores with us.
                    thread::yield_now();
                }
            }
        });
        let start = Instant::now();
        for n in 1..=iters as u64 {
            // SAFETY: buf_a is registered and alive; see above.
            unsafe { std::ptr::write_volatile((addr_a + 8) as *mut u64, n) };
            let wr = write(n, &buf_a, 8, 8, &buf_b, 0, true);
            // SAFETY: both MRs outlive the completion.
            unsafe { a.qp.post_send(&[wr]).expect("ping") };
            // SAFETY: as above.
            while unsafe { std::ptr::read_volatile(addr_a as *const u64) } != n {
                thread::yield_now();
            }
            drain(&a.cq, 1);
        }
        let t = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        echo.join().unwrap();
        t
    });
    t.as_secs_f64() * 1e6 / iters as f64 / 2.0
}

fn tcp_stream_gbps(seconds: f64) -> f64 {
    let listener = TcpListener::bind((IP0, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let buf = vec![7u8; 1 << 20];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        s.write_all(&buf).unwrap();
    }
    drop(s);
    let total = reader.join().unwrap();
    total as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

fn tcp_pingpong_us(iters: u32) -> f64 {
    let listener = TcpListener::bind((IP0, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let echo = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 8];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [0u8; 8];
    let start = Instant::now();
    for n in 0..iters as u64 {
        s.write_all(&n.to_le_bytes()).unwrap();
        s.read_exact(&mut b).unwrap();
    }
    let t = start.elapsed();
    drop(s);
    let _ = echo.join();
    t.as_secs_f64() * 1e6 / iters as f64 / 2.0
}

/// CPU time of this process (user + system) in seconds, from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(if args.iter().any(|a| a == "--bench") {
            2.0
        } else {
            0.2
        });
    let port = 40_000 + (std::process::id() % 20_000) as u16;
    let (a, b) = open(port);

    let rate = post_rate(&a, &b, seconds);
    let tcp_gbps = tcp_stream_gbps(seconds);
    let bw = write_bw(&a, &b, 1 << 20, 8, seconds);
    let bw64k = write_bw(&a, &b, 64 << 10, 32, seconds);
    let iters = (2_000.0 * seconds) as u32 + 100;
    let tcp_lat = tcp_pingpong_us(iters);
    let lat = write_latency(&a, &b, iters);

    thread::sleep(Duration::from_millis(300));
    let cpu0 = cpu_seconds();
    let idle = Duration::from_secs_f64(seconds.max(1.0));
    thread::sleep(idle);
    let idle_cpu = (cpu_seconds() - cpu0) / idle.as_secs_f64() * 100.0;

    println!("verbs on two emulated NICs (UDP link, port {port}), {seconds} s per case");
    println!(
        "{:<42} {:>14} {:>14} {:>8}",
        "case", "ours", "baseline", "ratio"
    );
    println!(
        "{:<42} {:>11.2} M/s {:>14} {:>8}",
        "post_send WRITE (64 B, batches of 32)",
        rate / 1e6,
        "-",
        "-"
    );
    println!(
        "{:<42} {:>9.2} Gbit/s {:>9.2} Gbit/s {:>7.2}x",
        "WRITE 1 MiB, 8 in flight vs TCP stream",
        bw,
        tcp_gbps,
        bw / tcp_gbps
    );
    println!(
        "{:<42} {:>9.2} Gbit/s {:>9.2} Gbit/s {:>7.2}x",
        "WRITE 64 KiB, 32 in flight vs TCP stream",
        bw64k,
        tcp_gbps,
        bw64k / tcp_gbps
    );
    println!(
        "{:<42} {:>12.1} us {:>12.1} us {:>7.2}x",
        "8 B WRITE ping-pong (half RTT) vs TCP",
        lat,
        tcp_lat,
        lat / tcp_lat
    );
    println!(
        "{:<42} {:>13.1} % {:>14} {:>8}",
        "idle CPU, two devices open (of one core)", idle_cpu, "-", "-"
    );
    println!("engine a: {:?}", a.ctx.stats());
    println!("engine b: {:?}", b.ctx.stats());
    println!("card a: {}", a.ctx.card_stats());
    println!("card b: {}", b.ctx.card_stats());
}
