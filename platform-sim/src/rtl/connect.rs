//! Connecting to a simulator socket that may not be listening yet.
//!
//! The RTL simulator opens its sockets only after Verilator has elaborated the design, which
//! can take minutes, so every client retries with exponential backoff
//! (`shared/spec/rtl-sim-protocol.md`, "Register access": 100 ms initial, 2 s cap, 300 s
//! default give-up). The two-card Ethernet link retries at a fixed 100 ms
//! (`nic-behaviour.md` section 8.4), which is the same policy with equal initial and cap.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// How a client retries a connection that is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait after the first failed attempt.
    pub initial: Duration,
    /// The wait doubles after each failure up to this cap.
    pub max_interval: Duration,
    /// Stop retrying (and return the last error) once this much time has passed.
    pub give_up_after: Duration,
}

impl RetryPolicy {
    /// The simulator clients' policy: 100 ms doubling to 2 s, give up after 300 s.
    pub const SIMULATOR: RetryPolicy = RetryPolicy {
        initial: Duration::from_millis(100),
        max_interval: Duration::from_secs(2),
        give_up_after: Duration::from_secs(300),
    };

    /// A fixed retry interval (no backoff), as the two-card link's card 2 uses.
    pub const fn fixed(interval: Duration, give_up_after: Duration) -> Self {
        RetryPolicy {
            initial: interval,
            max_interval: interval,
            give_up_after,
        }
    }

    /// The same policy with a different give-up time.
    pub const fn giving_up_after(self, give_up_after: Duration) -> Self {
        RetryPolicy {
            give_up_after,
            ..self
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::SIMULATOR
    }
}

/// The loopback socket address of `port`; all simulator traffic stays on 127.0.0.1.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Connects to 127.0.0.1:`port`, retrying under `policy`, and sets TCP_NODELAY (every
/// message of the protocols is one small line that must leave at once).
///
/// The error after giving up keeps the kind of the last failure and names the address and
/// the time spent.
pub fn connect_loopback(port: u16, policy: &RetryPolicy) -> io::Result<TcpStream> {
    let addr = loopback(port);
    let start = Instant::now();
    let mut interval = policy.initial;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let remaining = policy.give_up_after.saturating_sub(start.elapsed());
        // Loopback either accepts or refuses at once; the timeout only guards a stuck SYN
        // queue, so a short one is enough.
        let attempt_timeout = remaining.clamp(Duration::from_millis(10), Duration::from_secs(2));
        match TcpStream::connect_timeout(&addr, attempt_timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                if attempts > 1 {
                    log::info!("connected to {addr} after {attempts} attempts");
                }
                return Ok(stream);
            }
            Err(e) => {
                let elapsed = start.elapsed();
                if elapsed >= policy.give_up_after {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "cannot connect to {addr}: gave up after {attempts} attempts in \
                             {elapsed:.1?}: {e}"
                        ),
                    ));
                }
                if attempts == 1 {
                    log::info!("{addr} not reachable yet ({e}); retrying");
                }
                thread::sleep(interval.min(policy.give_up_after - elapsed));
                interval = (interval * 2).min(policy.max_interval);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_with_an_error_naming_the_address() {
        // Port 1 on loopback is never listening in a test environment.
        let policy = RetryPolicy::fixed(Duration::from_millis(20), Duration::from_millis(120));
        let start = Instant::now();
        let err = connect_loopback(1, &policy).unwrap_err();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(120), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let text = err.to_string();
        assert!(
            text.contains("127.0.0.1:1") && text.contains("gave up"),
            "{text}"
        );
    }
}
