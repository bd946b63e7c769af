//! End-to-end figures of the verbs API on two emulated NICs in this process, each next to
//! the TCP loopback baseline measured in the same run (the machine is shared and noisy:
//! ratios, not absolute numbers, are what compare between runs).
//!
//! `cargo bench -p bluerdma-linux --bench verbs [-- --seconds S]`
//!
//! - post_send rate: WRITE work requests (64 B, one signaled per batch of 32) posted into
//!   the send ring, timed around `post_send` only.
//! - WRITE bandwidth: 1 MiB WRITEs, 8 in flight, over the UDP link, vs a TCP stream.
//! - 8 B WRITE ping-pong latency (each side waits on its buffer) vs TCP ping-pong of 8 B.
//! - SEND/RECV (receive WRs announced over the TCP out-of-band channel): 64 B message rate
//!   vs 64 B messages on a TCP stream, and 8 B SEND ping-pong vs TCP ping-pong.
//! - Idle CPU: two devices open with a connected QP pair and nothing to do.

use std::thread;
use std::time::Duration;

use bluerdma_linux::perf::*;

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
    let (ctx_a, ctx_b, a, b) = open_udp_pair(port);

    let rate = post_rate(&a, &b, seconds, 32);
    let tcp_gbps = tcp_stream_gbps(seconds);
    let bw = write_bw(&a, &b, 1 << 20, 8, seconds);
    let bw64k = write_bw(&a, &b, 64 << 10, 32, seconds);
    let iters = (2_000.0 * seconds) as u32 + 100;
    let tcp_lat = tcp_pingpong_us(iters);
    let lat = write_latency(&a, &b, iters);
    let (sa, sb) = fresh_pair(&ctx_a, &ctx_b);
    let send_mps = send_rate(&sa, &sb, 64, seconds);
    let tcp_mps = tcp_message_rate(64, seconds);
    let (sa, sb) = fresh_pair(&ctx_a, &ctx_b);
    let send_lat = send_latency(&sa, &sb, iters);

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
        "{:<42} {:>10.0} k/s {:>10.0} k/s {:>7.2}x",
        "SEND 64 B message rate vs TCP 64 B messages",
        send_mps / 1e3,
        tcp_mps / 1e3,
        send_mps / tcp_mps
    );
    println!(
        "{:<42} {:>12.1} us {:>12.1} us {:>7.2}x",
        "8 B SEND ping-pong (half RTT) vs TCP",
        send_lat,
        tcp_lat,
        send_lat / tcp_lat
    );
    println!(
        "{:<42} {:>13.1} % {:>14} {:>8}",
        "idle CPU, two devices open (of one core)", idle_cpu, "-", "-"
    );
    println!("engine a: {:?}", ctx_a.stats());
    println!("engine b: {:?}", ctx_b.stats());
    println!("card a: {}", ctx_a.card_stats());
    println!("card b: {}", ctx_b.card_stats());
}
