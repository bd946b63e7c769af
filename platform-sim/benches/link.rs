//! Link throughput: full-size RoCE frames (96 bytes of headers + 4 KiB payload) through
//! `UdpLink` between 127.0.0.1 and 127.0.0.2, next to a TCP loopback stream measured in the
//! same run, so that the ratio holds even on a busy machine.
//!
//! `cargo bench -p bluerdma-sim --bench link [-- --seconds S]` (default 1 s per case).
//! Under `cargo test --benches` (no `--bench` argument) each case runs for 50 ms as a smoke
//! test. The sender is not paced: frames the receiver cannot keep up with are lost in the
//! kernel, and the loss is reported next to the goodput.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_sim::link::{LinkPort, UdpLink, UdpLinkConfig};

const PAYLOAD: usize = 4096;
const FRAME: usize = 96 + PAYLOAD;
const SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A WRITE_MIDDLE frame to DST with a 4 KiB payload (layout: nic-behaviour.md 1.4).
fn frame() -> Vec<u8> {
    let mut f = vec![0u8; FRAME];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((FRAME - 14) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&SRC.octets());
    f[30..34].copy_from_slice(&DST.octets());
    f[36..38].copy_from_slice(&4791u16.to_be_bytes());
    f[38..40].copy_from_slice(&((FRAME - 34) as u16).to_be_bytes());
    f[42] = 0x07;
    for (i, b) in f[96..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

struct Measured {
    sent: u64,
    received: u64,
    bytes: u64,
    elapsed: Duration,
    datagrams: u64,
    queue_drops: u64,
    /// SO_RCVBUF granted to the receiving socket (0 for TCP).
    recv_buffer: usize,
}

impl Measured {
    fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64() / 1e9
    }
}

fn udp_link(batch: usize, run: Duration) -> Measured {
    let (mut tx, mut rx) = loop {
        let a = UdpLink::bind(UdpLinkConfig::new(SRC).with_port(0)).expect("bind 127.0.0.1");
        let port = a.local_addr().port();
        if let Ok(b) = UdpLink::bind(UdpLinkConfig::new(DST).with_port(port)) {
            break (a, b);
        }
    };
    let recv_buffer = rx.recv_buffer_bytes().unwrap_or(0);
    let done = Arc::new(AtomicBool::new(false));
    let receiver = {
        let done = done.clone();
        thread::spawn(move || {
            let (mut frames, mut bytes) = (0u64, 0u64);
            let mut quiet_since = None;
            loop {
                let n = rx
                    .recv_frames(Duration::from_millis(5), &mut |f| bytes += f.len() as u64)
                    .expect("recv");
                frames += n as u64;
                if n > 0 {
                    quiet_since = None;
                } else if done.load(Ordering::Acquire) {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(50) {
                        break;
                    }
                }
            }
            let stats = rx.stats().snapshot();
            (frames, bytes, stats.rx_queue_drops)
        })
    };
    let f = frame();
    let frames: Vec<&[u8]> = vec![f.as_slice(); batch];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < run {
        tx.send_frames(&frames).expect("send");
        sent += batch as u64;
    }
    let elapsed = start.elapsed();
    done.store(true, Ordering::Release);
    let (received, bytes, queue_drops) = receiver.join().expect("receiver thread");
    Measured {
        sent,
        received,
        bytes,
        elapsed,
        datagrams: tx.stats().snapshot().datagrams_sent,
        queue_drops,
        recv_buffer,
    }
}

fn tcp_stream(run: Duration) -> Measured {
    let chunk: Vec<u8> = frame().repeat(15); // ~61 KiB, the size of one full UDP datagram
    let r = bluerdma_sim::baseline::tcp_stream(SRC, &chunk, run).expect("TCP baseline");
    Measured {
        sent: r.writes * 15,
        received: r.bytes / FRAME as u64,
        bytes: r.bytes,
        elapsed: r.elapsed,
        datagrams: 0,
        queue_drops: 0,
        recv_buffer: 0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(if benching { 1.0 } else { 0.05 });
    let run = Duration::from_secs_f64(seconds);

    println!("link throughput, {FRAME}-byte frames (4 KiB payload), {seconds} s per case");
    println!(
        "{:<22} {:>12} {:>12} {:>8} {:>10} {:>12} {:>10}",
        "case", "frames/s", "Gbit/s", "loss %", "frames/dg", "queue drops", "vs TCP"
    );
    let tcp = tcp_stream(run);
    let mut rows = vec![("TCP stream".to_string(), tcp)];
    for batch in [1, 16, 64] {
        rows.push((format!("UdpLink, {batch}/send"), udp_link(batch, run)));
    }
    let tcp_rate = rows[0].1.gbit_per_s();
    for (name, m) in &rows {
        let loss = 100.0 * (m.sent.saturating_sub(m.received)) as f64 / m.sent.max(1) as f64;
        let per_dg = if m.datagrams > 0 {
            format!("{:.1}", m.sent as f64 / m.datagrams as f64)
        } else {
            "-".to_string()
        };
        println!(
            "{:<22} {:>12.0} {:>12.2} {:>8.1} {:>10} {:>12} {:>9.2}x",
            name,
            m.received as f64 / m.elapsed.as_secs_f64(),
            m.gbit_per_s(),
            loss,
            per_dg,
            m.queue_drops,
            m.gbit_per_s() / tcp_rate
        );
    }
    if let Some((_, m)) = rows.last() {
        println!("UDP receive buffer granted: {} KiB", m.recv_buffer >> 10);
    }
}
