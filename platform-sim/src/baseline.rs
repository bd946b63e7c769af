//! The TCP loopback baseline that bandwidth figures are reported against (measured in the
//! same run, because the machines are shared and noisy).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// What a [`tcp_stream`] run moved.
#[derive(Clone, Copy, Debug)]
pub struct TcpStreamRun {
    /// Bytes the receiver read.
    pub bytes: u64,
    /// `write_all` calls of the sender.
    pub writes: u64,
    /// From the first write until the receiver saw the end of the stream.
    pub elapsed: Duration,
}

impl TcpStreamRun {
    /// Throughput in Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64() / 1e9
    }
}

/// Streams `chunk` over one TCP connection on `ip` (a loopback address) with `write_all`
/// for `run`; the receiver reads into a buffer of the same size.
pub fn tcp_stream(ip: Ipv4Addr, chunk: &[u8], run: Duration) -> std::io::Result<TcpStreamRun> {
    let listener = TcpListener::bind((ip, 0))?;
    let addr = listener.local_addr()?;
    let read_len = chunk.len().max(1);
    let receiver = thread::spawn(move || -> std::io::Result<u64> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = vec![0u8; read_len];
        let mut bytes = 0u64;
        loop {
            match conn.read(&mut buf) {
                Ok(0) => return Ok(bytes),
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    });
    let mut conn = TcpStream::connect(addr)?;
    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < run {
        conn.write_all(chunk)?;
        writes += 1;
    }
    drop(conn);
    let bytes = receiver
        .join()
        .map_err(|_| std::io::Error::other("TCP receiver panicked"))??;
    Ok(TcpStreamRun {
        bytes,
        writes,
        elapsed: start.elapsed(),
    })
}

/// Half a round trip of `msg_len`-byte ping-pong over one TCP connection on `ip` (a
/// loopback address), with `TCP_NODELAY` on both ends, averaged over `iters` round trips:
/// the baseline of the latency figures.
pub fn tcp_pingpong(ip: Ipv4Addr, msg_len: usize, iters: u32) -> std::io::Result<Duration> {
    let listener = TcpListener::bind((ip, 0))?;
    let addr = listener.local_addr()?;
    let echo = thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = vec![0u8; msg_len];
        while conn.read_exact(&mut buf).is_ok() {
            conn.write_all(&buf)?;
        }
        Ok(())
    });
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut msg = vec![0u8; msg_len];
    let start = Instant::now();
    for n in 0..iters {
        if let Some(first) = msg.first_mut() {
            *first = n as u8;
        }
        conn.write_all(&msg)?;
        conn.read_exact(&mut msg)?;
    }
    let elapsed = start.elapsed();
    drop(conn);
    echo.join()
        .map_err(|_| std::io::Error::other("TCP echo panicked"))??;
    Ok(elapsed / iters.max(1) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_and_stream_run_on_loopback() {
        let half_rtt = tcp_pingpong(Ipv4Addr::LOCALHOST, 8, 100).expect("ping-pong");
        assert!(half_rtt > Duration::ZERO && half_rtt < Duration::from_secs(1));
        let run = tcp_stream(Ipv4Addr::LOCALHOST, &[1u8; 4096], Duration::from_millis(20))
            .expect("stream");
        assert_eq!(run.bytes, run.writes * 4096);
    }
}
