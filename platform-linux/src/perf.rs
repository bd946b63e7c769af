//! Measurements of the verbs API on two emulated NICs in this process, each next to the
//! TCP loopback baseline of the same run. Used by the `verbs` bench and by `cargo xtask sim`.
//!
//! The waiting loops yield instead of spinning: the emulated cards share the machine's
//! cores with the measuring threads.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr, WorkCompletion};
use bluerdma_sim::link::{UdpLink, UdpLinkConfig};

use crate::{Context, Cq, DeviceSpec, Mr, Pd, Qp};

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Local write, remote write, remote read.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A PD, a CQ and a QP of one device.
pub struct Side {
    /// A protection domain.
    pub pd: Pd,
    /// The CQ of the QP.
    pub cq: Cq,
    /// The QP.
    pub qp: Qp,
}

/// Two devices blue0 (127.0.0.1) and blue1 (127.0.0.2) on the UDP link at `port`, with the
/// out-of-band channel over TCP at `port + 1`, and a connected QP pair.
pub fn open_udp_pair(port: u16) -> (Context, Context, Side, Side) {
    open_pair_on(port, &|ip| {
        Box::new(UdpLink::bind(UdpLinkConfig::new(ip).with_port(port)).expect("bind UDP link"))
    })
}

/// The same two devices on the link a device of this host gets by default: rings in shared
/// memory between the two cards (over the UDP link at `port`), unless `BLUERDMA_LINK_SHM=0`.
pub fn open_local_pair(port: u16) -> (Context, Context, Side, Side) {
    open_pair_on(port, &|ip| {
        let opts = bluerdma_sim::inproc::DeviceLinkOptions {
            port: Some(port),
            shm: bluerdma_sim::link::shm::ShmConfig::from_env(),
            ..Default::default()
        };
        bluerdma_sim::inproc::device_link(ip, &opts).expect("open the device link")
    })
}

fn open_pair_on(
    port: u16,
    link: &dyn Fn(Ipv4Addr) -> Box<dyn bluerdma_sim::link::LinkPort>,
) -> (Context, Context, Side, Side) {
    let oob = |ip| -> Option<Box<dyn bluerdma_core::platform::OobTransport + Send>> {
        let mut cfg = crate::oob::TcpOobConfig::new(ip);
        cfg.port = port.wrapping_add(1);
        Some(Box::new(
            crate::oob::TcpOob::bind(cfg).expect("bind the OOB channel"),
        ))
    };
    let a = Context::open_emulated_with_oob(DeviceSpec::new("blue0", IP0), link(IP0), oob(IP0))
        .expect("open blue0");
    let b = Context::open_emulated_with_oob(DeviceSpec::new("blue1", IP1), link(IP1), oob(IP1))
        .expect("open blue1");
    let (sa, sb) = fresh_pair(&a, &b);
    (a, b, sa, sb)
}

/// A new connected QP pair (with its own PDs and CQs) on two open devices, so that one
/// measurement's leftover receive WRs and completions do not leak into the next.
pub fn fresh_pair(a: &Context, b: &Context) -> (Side, Side) {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();
    qa.connect(qb.endpoint(0), 0, 16, 7).unwrap();
    qb.connect(qa.endpoint(0), 0, 16, 7).unwrap();
    (
        Side {
            pd: pa,
            cq: ca,
            qp: qa,
        },
        Side {
            pd: pb,
            cq: cb,
            qp: qb,
        },
    )
}

/// A WRITE work request between two MRs.
#[allow(clippy::too_many_arguments)]
pub fn write(
    wr_id: u64,
    src: &Mr,
    soff: u64,
    len: u32,
    dst: &Mr,
    doff: u64,
    signaled: bool,
) -> SendWr {
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

/// Waits for `n` successful completions (panics otherwise: a measurement with errors is void).
pub fn drain(cq: &Cq, n: usize) {
    let got = cq.wait(n, Duration::from_secs(30)).expect("poll");
    assert_eq!(got.len(), n, "completions");
    for w in &got {
        assert_eq!(w.status, bluerdma_core::engine::WcStatus::Success, "{w:?}");
    }
}

/// Work requests posted per second (post_send only): 64 B WRITEs, `per_call` in each
/// post_send, one signaled in 32 (the completion drained outside the timing).
pub fn post_rate(a: &Side, b: &Side, seconds: f64, per_call: usize) -> f64 {
    post_rates(a, b, seconds, per_call).mean
}

/// The post_send rate of a run of [`post_rates`], two ways.
#[derive(Clone, Copy, Debug)]
pub struct PostRates {
    /// Work requests posted over the time spent in post_send, all bursts together: a burst
    /// in which the thread lost its CPU to another counts with the time it waited.
    pub mean: f64,
    /// The median over the bursts of 32 of each burst's own rate: what post_send costs
    /// while the posting thread runs.
    pub median_burst: f64,
}

/// As [`post_rate`], with the median over bursts too.
pub fn post_rates(a: &Side, b: &Side, seconds: f64, per_call: usize) -> PostRates {
    let src = a.pd.alloc_mr(1 << 20, ALL).unwrap();
    let dst = b.pd.alloc_mr(1 << 20, ALL).unwrap();
    let batch: Vec<SendWr> = (0..32)
        .map(|k| write(k, &src, k * 64, 64, &dst, k * 64, k == 31))
        .collect();
    let mut bursts: Vec<Duration> = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        let t = Instant::now();
        for chunk in batch.chunks(per_call.max(1)) {
            // SAFETY: both MRs outlive every completion (drained below, before reuse).
            unsafe { a.qp.post_send(chunk).expect("post") };
        }
        bursts.push(t.elapsed());
        drain(&a.cq, 1);
    }
    let in_post: Duration = bursts.iter().sum();
    let per_burst = batch.len() as f64;
    bursts.sort_unstable();
    let median = bursts.get(bursts.len() / 2).copied().unwrap_or_default();
    PostRates {
        mean: per_burst * bursts.len() as f64 / in_post.as_secs_f64(),
        median_burst: per_burst / median.as_secs_f64(),
    }
}

/// The value after `--seconds` on the command line, else `default`.
pub fn seconds_arg(default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A UDP port for this process's emulated pair: `base` plus the pid modulo 20,000, so that
/// benchmark processes running at once do not collide.
pub fn process_port(base: u16) -> u16 {
    base + (std::process::id() % 20_000) as u16
}

/// WRITE bandwidth in Gbit/s: `len`-byte WRITEs, `depth` in flight.
pub fn write_bw(a: &Side, b: &Side, len: u32, depth: usize, seconds: f64) -> f64 {
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
pub fn write_latency(a: &Side, b: &Side, iters: u32) -> f64 {
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

/// A TCP loopback stream in Gbit/s (the baseline).
pub fn tcp_stream_gbps(seconds: f64) -> f64 {
    let chunk = vec![7u8; 1 << 20];
    bluerdma_sim::baseline::tcp_stream(IP0, &chunk, Duration::from_secs_f64(seconds))
        .expect("TCP loopback baseline")
        .gbit_per_s()
}

/// SEND messages of `len` bytes per second: the receiver keeps 256 receive WRs posted, the
/// sender keeps up to 64 SENDs in flight (one signaled in 16).
pub fn send_rate(a: &Side, b: &Side, len: u32, seconds: f64) -> f64 {
    use bluerdma_core::engine::RecvWr;
    let src = a.pd.alloc_mr(4096, ALL).unwrap();
    let dst = b.pd.alloc_mr(256 * 4096, ALL).unwrap();
    let recv = |k: u64| RecvWr {
        wr_id: k,
        addr: VirtAddr(dst.addr() + (k % 256) * 4096),
        len: 4096,
        lkey: dst.key(),
    };
    let mut posted_recv = 0u64;
    while posted_recv < 256 {
        // SAFETY: the MR outlives every completion (drained below).
        unsafe { b.qp.post_recv(&[recv(posted_recv)]).expect("post_recv") };
        posted_recv += 1;
    }
    let (mut sent, mut received, mut signaled_out) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut wc = [WorkCompletion::EMPTY; 64];
    while Instant::now() < end {
        while signaled_out < 4 && sent - received < 64 {
            let mut w = write(sent, &src, 0, len, &src, 0, sent % 16 == 15);
            w.op = SendOp::Send;
            // SAFETY: the MRs outlive every completion.
            unsafe { a.qp.post_send(&[w]).expect("post SEND") };
            if sent % 16 == 15 {
                signaled_out += 1;
            }
            sent += 1;
        }
        let n = a.cq.poll(&mut wc).unwrap();
        signaled_out -= n as u64;
        let r = b.cq.poll(&mut wc).unwrap();
        received += r as u64;
        for _ in 0..r {
            // SAFETY: as above.
            unsafe { b.qp.post_recv(&[recv(posted_recv)]).expect("repost") };
            posted_recv += 1;
        }
        if n == 0 && r == 0 {
            thread::yield_now();
        }
    }
    received as f64 / start.elapsed().as_secs_f64()
}

/// Half round trip of 8 B SEND ping-pong (each side waits for its receive completion), in
/// microseconds.
pub fn send_latency(a: &Side, b: &Side, iters: u32) -> f64 {
    use bluerdma_core::engine::RecvWr;
    let buf_a = a.pd.alloc_mr(4096, ALL).unwrap();
    let buf_b = b.pd.alloc_mr(4096, ALL).unwrap();
    let post_recv = |s: &Side, mr: &Mr, k: u64| {
        let r = RecvWr {
            wr_id: k,
            addr: VirtAddr(mr.addr()),
            len: 64,
            lkey: mr.key(),
        };
        // SAFETY: the MRs outlive every completion.
        unsafe { s.qp.post_recv(&[r]).expect("post_recv") };
    };
    let send = |s: &Side, mr: &Mr, k: u64| {
        let mut w = write(k, mr, 64, 8, mr, 0, true);
        w.op = SendOp::Send;
        // SAFETY: as above.
        unsafe { s.qp.post_send(&[w]).expect("post SEND") };
    };
    // Each side's CQ carries its SEND and its receive completions: wait for both.
    let wait = |cq: &Cq| drain(cq, 2);
    post_recv(a, &buf_a, 0);
    post_recv(b, &buf_b, 0);
    let t = thread::scope(|s| {
        let echo = s.spawn(|| {
            for k in 1..=iters as u64 {
                let got = b.cq.wait(1, Duration::from_secs(30)).expect("poll");
                assert_eq!(got.len(), 1, "echo: a message");
                post_recv(b, &buf_b, k);
                send(b, &buf_b, k);
                drain(&b.cq, 1);
            }
        });
        let start = Instant::now();
        for k in 1..=iters as u64 {
            send(a, &buf_a, k);
            wait(&a.cq);
            post_recv(a, &buf_a, k);
        }
        let t = start.elapsed();
        echo.join().unwrap();
        t
    });
    t.as_secs_f64() * 1e6 / iters as f64 / 2.0
}

/// 64-byte messages per second over a TCP loopback stream (the baseline of [`send_rate`]).
pub fn tcp_message_rate(len: usize, seconds: f64) -> f64 {
    let listener = TcpListener::bind((IP0, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; len];
        let mut n = 0u64;
        while s.read_exact(&mut buf).is_ok() {
            n += 1;
        }
        n
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let msg = vec![1u8; len];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        s.write_all(&msg).unwrap();
    }
    drop(s);
    let n = reader.join().unwrap();
    n as f64 / start.elapsed().as_secs_f64()
}

/// TCP ping-pong of 8 B over loopback, half round trip in microseconds (the baseline).
pub fn tcp_pingpong_us(iters: u32) -> f64 {
    bluerdma_sim::baseline::tcp_pingpong(IP0, 8, iters)
        .expect("TCP ping-pong baseline")
        .as_secs_f64()
        * 1e6
}

/// CPU time of this process (user + system) in seconds (getrusage: microseconds, where
/// /proc's clock ticks are 10 ms, as long as a 10 s idle measurement at 0.1 % of a core).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given; all-zero is a valid initial value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage on this stack frame.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
