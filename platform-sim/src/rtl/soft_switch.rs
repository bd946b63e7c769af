//! A soft switch for many simulated nodes, speaking the RTL bench's protocol
//! (`nic-behaviour.md` 8.5), so that [`SoftSwitchLink`](super::eth::SoftSwitchLink) and
//! multi-node setups are tested without the bench's Python switch.
//!
//! A node connects, sends its decimal instance id on the first line and is reachable at
//! 17.34.51.(9 + id) from then on (a later node with the same id replaces it). Every further
//! line is a base64 frame, forwarded unchanged to the node whose address is the IPv4
//! destination at frame bytes 30..=33; a source address (bytes 26..=29) other than the
//! sender's only draws a warning. No broadcast, no MAC learning.
//!
//! The bench's switch stalls a sender forever on a frame for an address nobody has
//! registered. This one holds the frame (stalling that sender, as the bench does) and
//! re-checks every 20 ms for at most [`SoftSwitchConfig::hold_unknown`], then drops it and
//! counts it in [`SoftSwitchStats::dropped_unknown_destination`], so that a missing node
//! shows up as a counter instead of a hang. Lines that are not base64 and frames too short
//! to hold an IPv4 header are counted and skipped.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::eth::SOFT_SWITCH_PORT;
use super::line::{excerpt, trim, Line, LineReader};
use super::listener::{accept_loop, bind_loopback};

/// Frame bytes holding the IPv4 source address (Ethernet 14 + IPv4 offset 12).
const SRC_IP: std::ops::Range<usize> = 26..30;
/// Frame bytes holding the IPv4 destination address.
const DST_IP: std::ops::Range<usize> = 30..34;

/// How often a held frame re-checks the routing table.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// The address of node `instance`: 17.34.51.(9 + instance), if that fits in the last octet.
pub fn node_ip(instance: u8) -> Option<Ipv4Addr> {
    instance
        .checked_add(9)
        .map(|last| Ipv4Addr::new(17, 34, 51, last))
}

/// How a [`SoftSwitch`] listens and holds frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftSwitchConfig {
    /// TCP port on 127.0.0.1 (0 picks a free port).
    pub port: u16,
    /// How long a frame for an unregistered address is held before it is dropped.
    pub hold_unknown: Duration,
}

impl Default for SoftSwitchConfig {
    fn default() -> Self {
        SoftSwitchConfig {
            port: SOFT_SWITCH_PORT,
            hold_unknown: Duration::from_secs(5),
        }
    }
}

/// What a [`SoftSwitch`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftSwitchStats {
    /// Successful registrations.
    pub nodes_registered: u64,
    /// Connections closed because their first line was not an instance id that maps to an
    /// address.
    pub bad_registrations: u64,
    /// Frames forwarded.
    pub frames_forwarded: u64,
    /// Lines that were not base64 (or too long), skipped.
    pub garbage_lines: u64,
    /// Frames shorter than the 34 bytes needed to route them, dropped.
    pub dropped_too_short: u64,
    /// Frames whose destination stayed unregistered for the hold time (or whose node's
    /// socket failed), dropped.
    pub dropped_unknown_destination: u64,
    /// Frames whose source address was not the sender's (forwarded anyway).
    pub source_mismatches: u64,
}

#[derive(Default)]
struct Counters {
    nodes_registered: AtomicU64,
    bad_registrations: AtomicU64,
    frames_forwarded: AtomicU64,
    garbage_lines: AtomicU64,
    dropped_too_short: AtomicU64,
    dropped_unknown_destination: AtomicU64,
    source_mismatches: AtomicU64,
}

/// A registered node: its connection number (to tell a replaced node from the current one)
/// and its socket for forwarding.
#[derive(Clone)]
struct Node {
    conn: u64,
    writer: Arc<Mutex<TcpStream>>,
}

#[derive(Default)]
struct Shared {
    hold_unknown: Duration,
    stop: AtomicBool,
    routes: Mutex<HashMap<Ipv4Addr, Node>>,
    /// Every open node connection, to end them on shutdown.
    open: Mutex<HashMap<u64, TcpStream>>,
    handlers: Mutex<Vec<JoinHandle<()>>>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The tables stay consistent across a panic (single inserts and removes).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn serve_node(&self, conn: u64, stream: TcpStream) {
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        let writer = match stream.try_clone() {
            Ok(w) => Arc::new(Mutex::new(w)),
            Err(e) => {
                log::error!("soft switch: cannot serve {peer}: {e}");
                return;
            }
        };
        let mut reader = LineReader::new(stream);
        let ip = match reader.next_line() {
            Ok(Some(Line::Text(t))) => std::str::from_utf8(trim(t))
                .ok()
                .and_then(|s| s.parse::<u8>().ok())
                .and_then(node_ip),
            _ => None,
        };
        let Some(ip) = ip else {
            self.counters
                .bad_registrations
                .fetch_add(1, Ordering::Relaxed);
            log::warn!("soft switch: {peer} did not register with a usable instance id");
            return;
        };
        lock(&self.routes).insert(
            ip,
            Node {
                conn,
                writer: Arc::clone(&writer),
            },
        );
        self.counters
            .nodes_registered
            .fetch_add(1, Ordering::Relaxed);
        log::info!("soft switch: {peer} registered as {ip}");
        loop {
            let line = match reader.next_line() {
                Ok(Some(Line::Text(t))) => trim(t),
                Ok(Some(Line::TooLong(n))) => {
                    self.counters.garbage_lines.fetch_add(1, Ordering::Relaxed);
                    log::warn!("soft switch: {ip} sent a line of {n} bytes");
                    continue;
                }
                Ok(None) | Err(_) => break,
            };
            if !line.is_empty() {
                self.route(ip, line);
            }
        }
        let mut routes = lock(&self.routes);
        if routes.get(&ip).is_some_and(|n| n.conn == conn) {
            routes.remove(&ip);
        }
        log::info!("soft switch: {ip} ({peer}) left");
    }

    /// Forwards one frame line from the node at `from`.
    fn route(&self, from: Ipv4Addr, line: &[u8]) {
        let c = &self.counters;
        let frame = match STANDARD.decode(line) {
            Ok(f) => f,
            Err(e) => {
                c.garbage_lines.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "soft switch: {from} sent a line that is not base64 ({e}): {:?}",
                    excerpt(line)
                );
                return;
            }
        };
        let (Some(src), Some(dst)) = (frame.get(SRC_IP), frame.get(DST_IP)) else {
            c.dropped_too_short.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "soft switch: {from} sent a {}-byte frame, too short to route",
                frame.len()
            );
            return;
        };
        let src = Ipv4Addr::new(src[0], src[1], src[2], src[3]);
        let dst = Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]);
        if src != from {
            c.source_mismatches.fetch_add(1, Ordering::Relaxed);
            log::warn!("soft switch: frame from {from} carries source address {src}");
        }
        let Some(node) = self.wait_for_route(dst) else {
            c.dropped_unknown_destination
                .fetch_add(1, Ordering::Relaxed);
            log::warn!("soft switch: dropped a frame from {from} for unregistered {dst}");
            return;
        };
        let mut out = Vec::with_capacity(line.len() + 1);
        out.extend_from_slice(line);
        out.push(b'\n');
        if let Err(e) = lock(&node.writer).write_all(&out) {
            c.dropped_unknown_destination
                .fetch_add(1, Ordering::Relaxed);
            log::warn!("soft switch: cannot forward to {dst}: {e}");
            let mut routes = lock(&self.routes);
            if routes.get(&dst).is_some_and(|n| n.conn == node.conn) {
                routes.remove(&dst);
            }
            return;
        }
        c.frames_forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// The node at `dst`, waiting for it to register for at most the hold time.
    fn wait_for_route(&self, dst: Ipv4Addr) -> Option<Node> {
        let hold = self.hold_unknown;
        let deadline = Instant::now() + hold;
        loop {
            if let Some(node) = lock(&self.routes).get(&dst) {
                return Some(node.clone());
            }
            if Instant::now() >= deadline || self.stop.load(Ordering::Acquire) {
                return None;
            }
            thread::sleep(HOLD_POLL.min(hold));
        }
    }
}

/// A soft switch on 127.0.0.1 for tests and mixed setups (module docs).
pub struct SoftSwitch {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for SoftSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftSwitch")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SoftSwitch {
    /// Listens on 127.0.0.1:`config.port` and starts switching.
    pub fn bind(config: SoftSwitchConfig) -> io::Result<Self> {
        let listener = bind_loopback(config.port)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            hold_unknown: config.hold_unknown,
            ..Shared::default()
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("soft-switch-{}", addr.port()))
            .spawn(move || {
                let mut next_conn = 0u64;
                accept_loop(&listener, &accept_shared.stop, |stream| {
                    next_conn += 1;
                    let conn = next_conn;
                    let Ok(clone) = stream.try_clone() else {
                        return ControlFlow::Continue(());
                    };
                    lock(&accept_shared.open).insert(conn, clone);
                    let node_shared = Arc::clone(&accept_shared);
                    let spawned = thread::Builder::new()
                        .name(format!("soft-switch-node-{conn}"))
                        .spawn(move || {
                            node_shared.serve_node(conn, stream);
                            lock(&node_shared.open).remove(&conn);
                        });
                    match spawned {
                        Ok(h) => {
                            let mut handlers = lock(&accept_shared.handlers);
                            handlers.retain(|h| !h.is_finished());
                            handlers.push(h);
                        }
                        Err(e) => {
                            log::error!("soft switch: cannot serve a node: {e}");
                            lock(&accept_shared.open).remove(&conn);
                        }
                    }
                    ControlFlow::Continue(())
                });
            })?;
        Ok(SoftSwitch {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the switch listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether a node is registered at `ip`.
    pub fn is_registered(&self, ip: Ipv4Addr) -> bool {
        lock(&self.shared.routes).contains_key(&ip)
    }

    /// The counters so far.
    pub fn stats(&self) -> SoftSwitchStats {
        let c = &self.shared.counters;
        SoftSwitchStats {
            nodes_registered: c.nodes_registered.load(Ordering::Relaxed),
            bad_registrations: c.bad_registrations.load(Ordering::Relaxed),
            frames_forwarded: c.frames_forwarded.load(Ordering::Relaxed),
            garbage_lines: c.garbage_lines.load(Ordering::Relaxed),
            dropped_too_short: c.dropped_too_short.load(Ordering::Relaxed),
            dropped_unknown_destination: c.dropped_unknown_destination.load(Ordering::Relaxed),
            source_mismatches: c.source_mismatches.load(Ordering::Relaxed),
        }
    }

    /// Stops listening, disconnects every node and joins the switch's threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        for stream in lock(&self.shared.open).values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let handlers = std::mem::take(&mut *lock(&self.shared.handlers));
        for h in handlers {
            let _ = h.join();
        }
    }
}

impl Drop for SoftSwitch {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_follow_the_bench() {
        assert_eq!(node_ip(1), Some(Ipv4Addr::new(17, 34, 51, 10)));
        assert_eq!(node_ip(246), Some(Ipv4Addr::new(17, 34, 51, 255)));
        assert_eq!(node_ip(247), None);
    }
}
