//! The out-of-band channel over TCP: core's [`OobTransport`] for Linux (oob-channel.md,
//! normative; reference-latest.md 2.3 to 2.5 for what the reference driver does).
//!
//! A [`TcpOob`] belongs to one device IP. It listens on `device_ip:60000` ([`OOB_PORT`],
//! configurable) and keeps **one TCP connection per peer IP**, shared by all QPs and used in
//! both directions. Each connection starts with a [`Hello`] from each side (magic, version,
//! capabilities, device IP), then carries 32-byte records back to back
//! ([`bluerdma_core::oob`] has the layout): receive-WR records and, to a peer whose hello
//! announces [`Capabilities::LENGTH_ERRORS`], receive-WR-too-short records. Such a record
//! queued for a peer without the capability is dropped when it would be written (counted in
//! [`TcpOobStats::records_withheld`]), so that peer sees only the compatible record.
//!
//! # Connections
//! - Whichever side sends first dials. The dialer binds its own device IP before
//!   connecting, so the listener knows which device talks even when several share a host;
//!   the listener checks that the hello's device IP is the connection's source address.
//! - The dialer sends its hello at once; the listener answers with its own hello when it
//!   takes the connection as the peer's connection. No record is written before both
//!   hellos, so a connection that is refused carried nothing.
//! - **Both sides dial at once**: the connection dialed by the lower IP is kept. The lower
//!   side refuses the higher side's dial (closes it without a hello) while its own dial is
//!   pending or open; the higher side takes the lower side's dial and drops its own. A higher
//!   side whose dial is closed before the hello waits one hello timeout for the lower side's
//!   connection before it gives up. Both end with the same single connection, and records
//!   queued meanwhile wait and go out on it.
//! - A peer that dials again while its connection is open has restarted (the driver never
//!   opens a second connection otherwise): the old connection is dropped with
//!   [`OobEvent::PeerLost`] and the new one replaces it. The one exception is the stale race
//!   dial above (the higher side dialing while the lower side's own connection is open),
//!   which is refused.
//!
//! # Threads and queues
//! [`OobTransport::send`] and [`OobTransport::poll`] never block on the network: `send`
//! appends the record to the peer's queue under a short lock and wakes an I/O thread;
//! `poll` pops an event (and costs one atomic load when there is none). The I/O thread
//! (one per `TcpOob`, non-blocking sockets and `poll(2)`) dials, accepts, shakes hands,
//! writes each connection's queued records in one `send(2)` where it can, and reads
//! records into the event queue. A send to the device's own IP is delivered to its own
//! event queue without TCP.
//!
//! # Failures
//! - A connection that breaks, a failed dial, or a peer that sends garbage after its hello
//!   ends in [`OobEvent::PeerLost`]; the records still queued for that peer are dropped
//!   (the engine errors the QPs that depend on it). A later send dials a new connection.
//! - Garbage on the port (bad magic, another protocol version, a truncated message, a hello
//!   whose IP is not the source address) gets a logged error naming the problem and a
//!   closed connection. A peer speaking another version receives this side's hello before
//!   the close, so both sides can name the mismatch.
//! - At most `max_handshaking` accepted connections (`max_handshaking_per_ip` per source
//!   address) may wait for their hello, each for `hello_timeout`; more are closed at once.
//!   Per-connection memory is the decoder's 32 bytes and a bounded write buffer; the event
//!   queue is bounded (reading pauses while it is full, so TCP pushes back on the peer)
//!   and so is each peer's send queue ([`PlatformError::WouldBlock`] when full).
//! - What the network causes is logged at most 20 lines a second for connections that
//!   never became a peer's and 20 for peers; [`TcpOobStats`] counts everything.
//! - A second `TcpOob` on the same IP and port, in this or another process, fails with
//!   [`TcpOobError::Listen`], which says that another driver instance owns the address.
//!
//! # Use by the engine
//! - One `TcpOob` per opened device: `TcpOob::bind(TcpOobConfig::new(device_ip))` is the
//!   platform's `Oob`.
//! - `post_recv` on a QP that knows its peer's IP sends one record with the QP's own QPN.
//!   `WouldBlock` means the peer's queue is full: keep the WR and try again after `poll`.
//! - A SEND longer than the receive WR it was matched with sends one receive-WR-too-short
//!   record (the requester's own QPN) with [`OobTransport::send_too_short`].
//! - Each progress step drains `poll`. `RecvWr { from, wr }` goes to the QP whose peer QPN
//!   is `wr.qpn` and whose peer IP is `from`; so does `RecvTooShort { from, rec }`. `PeerLost { peer }` moves the QPs whose peer
//!   IP is `peer` and that have a SEND waiting for a receive WR to the error state; the
//!   others keep running until a SEND finds no receive WR. It also follows a failed dial,
//!   so it can come for a peer that never had a connection.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bluerdma_core::oob::{
    Capabilities, Hello, OobDecoder, OobError, OobMessage, Record, RecordKind, RecvTooShort,
    RecvWr, RECV_WR_LEN,
};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};
use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

/// The TCP port of the out-of-band listener (the reference driver's `RECV_WORKER_PORT`).
pub const OOB_PORT: u16 = 60000;

/// How a [`TcpOob`] listens, dials and bounds its resources.
#[derive(Clone, Debug)]
pub struct TcpOobConfig {
    /// The device's IPv4 address: the listener's address and the dialer's source.
    pub device_ip: Ipv4Addr,
    /// The listening port; 0 picks a free one ([`TcpOob::local_addr`] tells which).
    pub port: u16,
    /// The port peers listen on; `None` means the port this side listens on.
    pub peer_port: Option<u16>,
    /// How long a dial may take to connect.
    pub connect_timeout: Duration,
    /// How long a new connection may take to deliver its hello.
    pub hello_timeout: Duration,
    /// Accepted connections that may wait for their hello at once.
    pub max_handshaking: usize,
    /// Of those, how many may come from one source address.
    pub max_handshaking_per_ip: usize,
    /// Peers (open, dialing or awaited connections) at once.
    pub max_peers: usize,
    /// Records queued for one peer and not yet written; `send` returns `WouldBlock` beyond.
    pub max_queued_per_peer: usize,
    /// Events waiting for `poll`; reading from the network pauses beyond.
    pub max_events: usize,
}

impl TcpOobConfig {
    /// The defaults for `device_ip`: port 60000, 3 s to connect and to say hello, 256
    /// connections waiting for their hello (16 per source), 1024 peers, 65536 queued records
    /// per peer (2 MiB) and 65536 events.
    pub fn new(device_ip: Ipv4Addr) -> Self {
        TcpOobConfig {
            device_ip,
            port: OOB_PORT,
            peer_port: None,
            connect_timeout: Duration::from_secs(3),
            hello_timeout: Duration::from_secs(3),
            max_handshaking: 256,
            max_handshaking_per_ip: 16,
            max_peers: 1024,
            max_queued_per_peer: 65536,
            max_events: 65536,
        }
    }
}

/// Why a [`TcpOob`] could not start.
#[derive(Debug)]
pub enum TcpOobError {
    /// The listener could not bind or listen on the device address.
    Listen {
        /// The address.
        addr: SocketAddrV4,
        /// The OS error.
        source: io::Error,
    },
    /// The I/O thread or its wake-up descriptor could not be created.
    Setup(io::Error),
}

impl fmt::Display for TcpOobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TcpOobError::Listen { addr, source } => {
                write!(f, "cannot listen for the OOB channel on {addr}: ")?;
                match source.kind() {
                    io::ErrorKind::AddrInUse => write!(
                        f,
                        "the address is in use: another driver instance (in this or another \
                         process) owns device IP {} on port {}",
                        addr.ip(),
                        addr.port()
                    ),
                    io::ErrorKind::AddrNotAvailable => write!(
                        f,
                        "no interface of this host has address {} (assign it to the device's \
                         netdev, e.g. `ip addr add {}/24 dev blue0`)",
                        addr.ip(),
                        addr.ip()
                    ),
                    _ => write!(f, "{source}"),
                }
            }
            TcpOobError::Setup(e) => write!(f, "cannot start the OOB channel's I/O thread: {e}"),
        }
    }
}

impl std::error::Error for TcpOobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TcpOobError::Listen { source, .. } | TcpOobError::Setup(source) => Some(source),
        }
    }
}

/// Declares the counters once: the snapshot type with its docs, the atomics behind it,
/// and the one-line state dump.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Counters of a [`TcpOob`], for tests and state dumps. Gauges say "now"; the
        /// others count since the transport started.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct TcpOobStats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        #[derive(Default)]
        struct Counters {
            $($name: AtomicU64,)*
        }

        impl Counters {
            fn snapshot(&self) -> TcpOobStats {
                TcpOobStats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl fmt::Display for TcpOobStats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut sep = "";
                $(
                    write!(f, "{sep}{}={}", stringify!($name), self.$name)?;
                    sep = " ";
                )*
                let _ = sep;
                Ok(())
            }
        }
    };
}

counters! {
    /// TCP connections the listener accepted (before any check).
    accepted,
    /// Dials started.
    dialed,
    /// Connections that became a peer's connection (dialed or accepted).
    established,
    /// Gauge: peer connections open now.
    open_connections,
    /// Gauge: accepted connections waiting for their hello now.
    handshaking,
    /// Accepted connections closed at once because too many waited for their hello.
    refused_over_limit,
    /// Connections closed because their hello did not arrive in time.
    hello_timeouts,
    /// Connections closed for bytes that break the protocol (any of the kinds below too).
    protocol_errors,
    /// Of the protocol errors: a peer speaking another protocol version.
    version_mismatches,
    /// Connections closed by the tie-break when both sides dialed.
    race_closed,
    /// Dials that failed to connect.
    dial_failures,
    /// `PeerLost` events reported.
    peers_lost,
    /// Records handed to a connection (or delivered locally, for the device's own IP).
    records_sent,
    /// Records received (including the locally delivered ones).
    records_received,
    /// Records dropped from a send queue because their peer was lost.
    records_dropped,
    /// Receive-WR-too-short records not sent because the peer's hello lacks LENGTH_ERRORS.
    records_withheld,
    /// `send(2)` calls that wrote bytes (records per call shows the batching).
    write_calls,
    /// Bytes written to connections.
    bytes_written,
    /// `send` calls refused with `WouldBlock` (the peer's queue or the event queue full).
    would_block,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The out-of-band transport of one device over TCP (see the module docs).
pub struct TcpOob {
    shared: Arc<Shared>,
    local_addr: SocketAddrV4,
    io_thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for TcpOob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpOob")
            .field("local_addr", &self.local_addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl TcpOob {
    /// Listens on `config.device_ip:config.port` and starts the I/O thread.
    pub fn bind(config: TcpOobConfig) -> Result<TcpOob, TcpOobError> {
        let addr = SocketAddrV4::new(config.device_ip, config.port);
        let listen_err = |source| TcpOobError::Listen { addr, source };
        let listener = listen(addr).map_err(listen_err)?;
        let local_addr = listener
            .local_addr()
            .map_err(listen_err)?
            .as_socket_ipv4()
            .ok_or_else(|| listen_err(io::ErrorKind::InvalidData.into()))?;
        let shared = Arc::new(Shared {
            device_ip: config.device_ip,
            max_queued_bytes: config.max_queued_per_peer.saturating_mul(RECV_WR_LEN),
            max_events: config.max_events.max(1),
            queues: Mutex::new(Queues::default()),
            events_len: AtomicUsize::new(0),
            reading_paused: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            waker: Waker::new().map_err(TcpOobError::Setup)?,
            counters: Counters::default(),
        });
        let io = IoLoop::new(Arc::clone(&shared), config, local_addr, listener);
        let io_thread = thread::Builder::new()
            .name(format!("oob-{}", local_addr.ip()))
            .spawn(move || io.run())
            .map_err(TcpOobError::Setup)?;
        log::info!("OOB {local_addr}: listening");
        Ok(TcpOob {
            shared,
            local_addr,
            io_thread: Some(io_thread),
        })
    }

    /// The listening address (with the port actually bound when the config said 0).
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local_addr
    }

    /// The device IP this transport speaks for.
    pub fn device_ip(&self) -> Ipv4Addr {
        self.shared.device_ip
    }

    /// The counters now.
    pub fn stats(&self) -> TcpOobStats {
        self.shared.counters.snapshot()
    }

    /// The peers with an open connection now, in address order.
    pub fn connected_peers(&self) -> Vec<Ipv4Addr> {
        self.shared.lock().connected.iter().copied().collect()
    }

    /// Appends `record` to `peer`'s send queue and wakes the I/O thread (or, for the
    /// device's own IP, delivers it as an event at once).
    fn queue(&mut self, peer: Ipv4Addr, record: &Record) -> Result<(), PlatformError> {
        let shared = &*self.shared;
        let bytes = record
            .to_bytes()
            .map_err(|_| PlatformError::Os(libc::EINVAL))?;
        if peer.is_unspecified() || peer.is_broadcast() || peer.is_multicast() {
            return Err(PlatformError::Disconnected { peer });
        }
        let counters = &shared.counters;
        let mut q = shared.lock();
        if peer == shared.device_ip {
            // A QP connected to a QP of the same device: no TCP needed.
            if q.events.len() >= shared.max_events {
                Counters::add(&counters.would_block, 1);
                return Err(PlatformError::WouldBlock);
            }
            q.events.push_back(match *record {
                Record::RecvWr(wr) => OobEvent::RecvWr { from: peer, wr },
                Record::RecvTooShort(rec) => OobEvent::RecvTooShort { from: peer, rec },
            });
            shared.events_len.store(q.events.len(), Ordering::SeqCst);
            Counters::add(&counters.records_sent, 1);
            Counters::add(&counters.records_received, 1);
            return Ok(());
        }
        let queue = q.outbox.entry(peer).or_default();
        if queue.len() >= shared.max_queued_bytes {
            Counters::add(&counters.would_block, 1);
            return Err(PlatformError::WouldBlock);
        }
        queue.extend_from_slice(&bytes);
        drop(q);
        shared.waker.wake();
        Ok(())
    }
}

impl OobTransport for TcpOob {
    /// Queues `wr` for `peer` (dialing it if needed) and returns at once. Fails with
    /// `WouldBlock` when `max_queued_per_peer` records already wait for `peer`, and with
    /// `Disconnected` for an address no device can have. A failure later on the network is
    /// reported by [`OobEvent::PeerLost`].
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        self.queue(peer, &Record::RecvWr(*wr))
    }

    /// Queues `rec` like [`TcpOob::send`] does a receive WR; it is written only if `peer`'s
    /// hello announced [`Capabilities::LENGTH_ERRORS`] (else dropped and counted in
    /// `records_withheld`).
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        self.queue(peer, &Record::RecvTooShort(*rec))
    }

    fn poll(&mut self) -> Option<OobEvent> {
        let shared = &*self.shared;
        if shared.events_len.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut q = shared.lock();
        let event = q.events.pop_front();
        let left = q.events.len();
        shared.events_len.store(left, Ordering::SeqCst);
        drop(q);
        if left <= shared.max_events / 2 && shared.reading_paused.swap(false, Ordering::SeqCst) {
            shared.waker.wake();
        }
        event
    }
}

impl Drop for TcpOob {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.waker.wake_now();
        if let Some(thread) = self.io_thread.take() {
            let _ = thread.join();
        }
    }
}

/// The listener: SO_REUSEADDR so a restarted driver can bind while old connections linger
/// in TIME_WAIT; without SO_REUSEPORT a second listener on the same address still fails.
fn listen(addr: SocketAddrV4) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// What the caller's side and the I/O thread share.
struct Shared {
    device_ip: Ipv4Addr,
    max_queued_bytes: usize,
    max_events: usize,
    queues: Mutex<Queues>,
    /// `queues.events.len()`, readable without the lock.
    events_len: AtomicUsize,
    /// The I/O thread stopped reading because the event queue was full.
    reading_paused: AtomicBool,
    stop: AtomicBool,
    waker: Waker,
    counters: Counters,
}

#[derive(Default)]
struct Queues {
    /// Encoded records per peer, not yet taken by the I/O thread.
    outbox: HashMap<Ipv4Addr, Vec<u8>>,
    /// Events for `poll`.
    events: VecDeque<OobEvent>,
    /// Peers with an open connection.
    connected: BTreeSet<Ipv4Addr>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // The queues stay consistent at every unlock, so a panic elsewhere cannot leave
        // them half-updated.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Wakes the I/O thread out of `poll(2)`: an eventfd, written at most once per wake-up.
struct Waker {
    fd: File,
    pending: AtomicBool,
}

impl Waker {
    fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Waker {
            fd: File::from(fd),
            pending: AtomicBool::new(false),
        })
    }

    /// Wakes the I/O thread unless a wake-up is already pending: it then has yet to
    /// `clear` and look at the queues, and will see what the caller queued.
    fn wake(&self) {
        if !self.pending.swap(true, Ordering::SeqCst) {
            self.wake_now();
        }
    }

    fn wake_now(&self) {
        // A full counter (EAGAIN) is already readable, which is all a wake-up needs.
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    /// Called by the I/O thread before it looks at the queues: runs [`Waker::CLEAR_STEPS`].
    fn clear(&self) {
        for step in Self::CLEAR_STEPS {
            step(self);
        }
    }

    /// The eventfd is drained before the flag drops. In the other order a `wake` landing
    /// between the two steps is swallowed while the flag stays set; every later `wake` then
    /// skips the write and queued records wait for the idle timeout (a lost wake-up that
    /// cut the SEND rate over TCP to a few hundred per second). The test below injects a
    /// `wake` at every point of this list.
    const CLEAR_STEPS: [fn(&Waker); 2] = [Waker::drain, Waker::lower_flag];

    fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = (&self.fd).read(&mut buf);
    }

    fn lower_flag(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }

    /// Whether a `poll(2)` on the eventfd would return at once.
    #[cfg(test)]
    fn readable(&self) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        sys_poll(&mut fds, Duration::ZERO).expect("poll") > 0
    }
}

#[cfg(test)]
mod waker_tests {
    use super::*;

    /// A `wake` at any point of `clear` leaves the I/O thread able to be woken: whenever
    /// the flag says a wake-up is pending, the eventfd is readable, so `poll(2)` returns.
    #[test]
    fn a_wake_during_clear_is_never_lost() {
        for at in 0..=Waker::CLEAR_STEPS.len() {
            let w = Waker::new().unwrap();
            w.wake();
            for (i, step) in Waker::CLEAR_STEPS.iter().enumerate() {
                if i == at {
                    w.wake();
                }
                step(&w);
            }
            if at == Waker::CLEAR_STEPS.len() {
                w.wake();
            }
            let pending = w.pending.load(Ordering::SeqCst);
            assert!(
                !pending || w.readable(),
                "a wake before step {at} of clear was swallowed: flag set, eventfd empty"
            );
            // The next sender's wake must reach the I/O thread.
            w.wake();
            assert!(
                w.readable(),
                "wake after a wake at step {at} did not wake poll(2)"
            );
        }
    }
}

/// How long the I/O thread sleeps at most when nothing happens.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How long accepting pauses after an accept error such as EMFILE (which would otherwise
/// leave the listener readable and spin the loop).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// A connection takes more queued records only while it has less than this to write.
const CONN_OUT_HIGH: usize = 64 * 1024;
/// Bytes read per `read(2)`; at most [`READS_PER_WAKE`] reads per connection per wake-up.
const READ_CHUNK: usize = 64 * 1024;
const READS_PER_WAKE: usize = 4;
/// Keepalive, so a peer whose host vanished is noticed even when nothing is sent.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 4;

type Token = u64;

/// The state of the link to one peer.
#[derive(Clone, Copy, Debug)]
enum PeerLink {
    /// Our dial is under way.
    Dialing(Token),
    /// Both sides dialed and ours was refused: the lower-IP peer's dial should arrive.
    AwaitingPeer { until: Instant },
    /// The connection is open.
    Connected(Token),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// A dial waiting for the TCP connect.
    Connecting { until: Instant },
    /// Waiting for the other side's hello.
    Hello { until: Instant },
    /// Records flow.
    Open,
}

struct Conn {
    socket: Socket,
    /// The dialed peer, or the accepted connection's source address.
    peer: Ipv4Addr,
    dialed: bool,
    phase: Phase,
    decoder: OobDecoder,
    /// The capabilities of the peer's hello (empty before it).
    peer_caps: Capabilities,
    out: Vec<u8>,
    out_pos: usize,
}

impl Conn {
    fn has_output(&self) -> bool {
        self.out_pos < self.out.len()
    }
}

/// At most [`LogBudget::PER_SECOND`] messages a second, so a peer flooding the port
/// cannot flood the log; the next message says how many were skipped.
struct LogBudget {
    window: Instant,
    used: u32,
    skipped: u64,
}

impl LogBudget {
    const PER_SECOND: u32 = 20;

    fn new() -> Self {
        LogBudget {
            window: Instant::now(),
            used: 0,
            skipped: 0,
        }
    }

    fn take(&mut self, now: Instant) -> Option<Skipped> {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.used = 0;
        }
        if self.used < Self::PER_SECOND {
            self.used += 1;
            Some(Skipped(std::mem::take(&mut self.skipped)))
        } else {
            self.skipped += 1;
            None
        }
    }
}

struct Skipped(u64);

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} similar messages suppressed)"),
        }
    }
}

/// The I/O thread's state.
struct IoLoop {
    shared: Arc<Shared>,
    cfg: TcpOobConfig,
    local: SocketAddrV4,
    peer_port: u16,
    listener: Socket,
    accept_paused_until: Option<Instant>,
    conns: HashMap<Token, Conn>,
    next_token: Token,
    peers: HashMap<Ipv4Addr, PeerLink>,
    handshaking: usize,
    handshaking_by_ip: HashMap<Ipv4Addr, usize>,
    read_buf: Vec<u8>,
    /// Events decoded from one read, pushed to the shared queue under one lock.
    pending_events: Vec<OobEvent>,
    garbage_log: LogBudget,
    link_log: LogBudget,
}

/// Logs a message caused by the network within one of the I/O thread's log budgets:
/// `garbage_log` for connections that never became a peer's link, `link_log` for peers.
macro_rules! net_log {
    ($io:expr, $budget:ident, $level:expr, $($arg:tt)*) => {
        if let Some(skipped) = $io.$budget.take(Instant::now()) {
            log::log!($level, "OOB {}: {}{}", $io.local, format_args!($($arg)*), skipped);
        }
    };
}

impl IoLoop {
    fn new(shared: Arc<Shared>, cfg: TcpOobConfig, local: SocketAddrV4, listener: Socket) -> Self {
        let peer_port = cfg.peer_port.unwrap_or(local.port());
        IoLoop {
            shared,
            cfg,
            local,
            peer_port,
            listener,
            accept_paused_until: None,
            conns: HashMap::new(),
            next_token: 0,
            peers: HashMap::new(),
            handshaking: 0,
            handshaking_by_ip: HashMap::new(),
            read_buf: vec![0; READ_CHUNK],
            pending_events: Vec::new(),
            garbage_log: LogBudget::new(),
            link_log: LogBudget::new(),
        }
    }

    fn ip(&self) -> Ipv4Addr {
        *self.local.ip()
    }

    fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    fn run(mut self) {
        let mut pollfds: Vec<libc::pollfd> = Vec::new();
        let mut tokens: Vec<Token> = Vec::new();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.shared.waker.clear();
            self.take_outbox();
            self.flush_all();
            let now = Instant::now();
            let timeout = self.next_deadline().map_or(IDLE_POLL, |d| {
                d.saturating_duration_since(now).min(IDLE_POLL)
            });
            self.fill_pollfds(&mut pollfds, &mut tokens, now);
            if let Err(e) = sys_poll(&mut pollfds, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("OOB {}: poll failed: {e}", self.local);
                    thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            if pollfds.get(1).is_some_and(|p| p.revents != 0) {
                self.accept_all();
            }
            for (pfd, &token) in pollfds.iter().skip(2).zip(&tokens) {
                if pfd.revents != 0 {
                    self.on_ready(token, pfd.revents);
                }
            }
            self.expire(Instant::now());
        }
        log::info!("OOB {}: stopped", self.local);
    }

    fn fill_pollfds(&mut self, fds: &mut Vec<libc::pollfd>, tokens: &mut Vec<Token>, now: Instant) {
        let shared = &self.shared;
        let mut events_full = shared.events_len.load(Ordering::SeqCst) >= shared.max_events;
        if events_full {
            shared.reading_paused.store(true, Ordering::SeqCst);
            // `poll` may have drained the queue between the load and the store; it wakes
            // this thread only if it saw the flag, so look again.
            events_full = shared.events_len.load(Ordering::SeqCst) >= shared.max_events;
        }
        if self.accept_paused_until.is_some_and(|t| t <= now) {
            self.accept_paused_until = None;
        }
        let pollfd = |fd, events| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        fds.clear();
        tokens.clear();
        fds.push(pollfd(shared.waker.fd.as_raw_fd(), libc::POLLIN));
        let listener_fd = match self.accept_paused_until {
            Some(_) => -1,
            None => self.listener.as_raw_fd(),
        };
        fds.push(pollfd(listener_fd, libc::POLLIN));
        for (&token, conn) in &self.conns {
            let events = match conn.phase {
                Phase::Connecting { .. } => libc::POLLOUT,
                Phase::Hello { .. } => libc::POLLIN,
                Phase::Open if events_full => 0,
                Phase::Open => libc::POLLIN,
            } | if conn.has_output() { libc::POLLOUT } else { 0 };
            fds.push(pollfd(conn.socket.as_raw_fd(), events));
            tokens.push(token);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| match c.phase {
            Phase::Connecting { until } | Phase::Hello { until } => Some(until),
            Phase::Open => None,
        });
        let peers = self.peers.values().filter_map(|p| match p {
            PeerLink::AwaitingPeer { until } => Some(*until),
            _ => None,
        });
        conns.chain(peers).chain(self.accept_paused_until).min()
    }

    /// Moves queued records to open connections and dials peers that have none.
    fn take_outbox(&mut self) {
        let mut to_dial = Vec::new();
        {
            let mut q = self.shared.lock();
            for (peer, queued) in q.outbox.iter_mut() {
                if queued.is_empty() {
                    continue;
                }
                match self.peers.get(peer) {
                    None => to_dial.push(*peer),
                    Some(PeerLink::Connected(token)) => {
                        let Some(conn) = self.conns.get_mut(token) else {
                            continue;
                        };
                        let pending = conn.out.len() - conn.out_pos;
                        if pending >= CONN_OUT_HIGH {
                            continue;
                        }
                        if !conn.peer_caps.contains(Capabilities::LENGTH_ERRORS) {
                            let withheld = withhold_too_short(queued);
                            Counters::add(&self.shared.counters.records_withheld, withheld);
                        }
                        let records = (queued.len() / RECV_WR_LEN) as u64;
                        if pending == 0 {
                            conn.out.clear();
                            conn.out_pos = 0;
                            std::mem::swap(&mut conn.out, queued);
                        } else {
                            conn.out.extend_from_slice(queued);
                            queued.clear();
                        }
                        Counters::add(&self.shared.counters.records_sent, records);
                    }
                    Some(_) => {}
                }
            }
            q.outbox.retain(|_, queued| !queued.is_empty());
        }
        for peer in to_dial {
            self.dial(peer);
        }
    }

    fn flush_all(&mut self) {
        let ready: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.has_output() && !matches!(c.phase, Phase::Connecting { .. }))
            .map(|(&t, _)| t)
            .collect();
        for token in ready {
            self.flush(token);
        }
    }

    fn dial(&mut self, peer: Ipv4Addr) {
        if self.peers.len() >= self.cfg.max_peers {
            let why = format!("too many peers (max_peers = {})", self.cfg.max_peers);
            self.lose_peer(peer, &why);
            return;
        }
        Counters::add(&self.counters().dialed, 1);
        let now = Instant::now();
        match self.start_connect(peer) {
            Ok((socket, connected)) => {
                let token = self.insert_conn(Conn {
                    socket,
                    peer,
                    dialed: true,
                    phase: Phase::Connecting {
                        until: now + self.cfg.connect_timeout,
                    },
                    decoder: OobDecoder::new(),
                    peer_caps: Capabilities::empty(),
                    out: Vec::new(),
                    out_pos: 0,
                });
                self.peers.insert(peer, PeerLink::Dialing(token));
                if connected {
                    self.finish_connect(token);
                }
            }
            Err(e) => {
                Counters::add(&self.counters().dial_failures, 1);
                let why = format!("cannot dial {peer}:{}: {e}", self.peer_port);
                self.lose_peer(peer, &why);
            }
        }
    }

    /// A non-blocking connect from the device IP; `true` if it completed at once.
    fn start_connect(&self, peer: Ipv4Addr) -> io::Result<(Socket, bool)> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.set_nonblocking(true)?;
        socket.set_tcp_nodelay(true)?;
        socket.bind(&SocketAddrV4::new(self.ip(), 0).into())?;
        let target: SockAddr = SocketAddrV4::new(peer, self.peer_port).into();
        match socket.connect(&target) {
            Ok(()) => Ok((socket, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok((socket, false)),
            Err(e) => Err(e),
        }
    }

    fn finish_connect(&mut self, token: Token) {
        let hello_timeout = self.cfg.hello_timeout;
        let hello = Hello::new(self.ip()).to_bytes();
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let error = match conn.socket.take_error() {
            Ok(None) => None,
            Ok(Some(e)) | Err(e) => Some(e),
        };
        if let Some(e) = error {
            Counters::add(&self.shared.counters.dial_failures, 1);
            let why = format!("cannot connect to {}:{}: {e}", conn.peer, self.peer_port);
            self.conn_failed(token, &why, false);
            return;
        }
        conn.phase = Phase::Hello {
            until: Instant::now() + hello_timeout,
        };
        conn.out.extend_from_slice(&hello);
        self.flush(token);
    }

    fn insert_conn(&mut self, conn: Conn) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        self.conns.insert(token, conn);
        token
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((socket, addr)) => self.on_accept(socket, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    net_log!(
                        self,
                        garbage_log,
                        log::Level::Error,
                        "accept failed: {e}; pausing accepts"
                    );
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    break;
                }
            }
        }
    }

    fn on_accept(&mut self, socket: Socket, addr: SockAddr) {
        Counters::add(&self.counters().accepted, 1);
        let Some(src) = addr.as_socket_ipv4().map(|a| *a.ip()) else {
            return;
        };
        let from_src = self.handshaking_by_ip.get(&src).copied().unwrap_or(0);
        if self.handshaking >= self.cfg.max_handshaking
            || from_src >= self.cfg.max_handshaking_per_ip
        {
            Counters::add(&self.counters().refused_over_limit, 1);
            net_log!(
                self,
                garbage_log,
                log::Level::Warn,
                "refusing a connection from {src}: {} connections ({from_src} from {src}) \
                 already wait for their hello (limits {} and {} per address)",
                self.handshaking,
                self.cfg.max_handshaking,
                self.cfg.max_handshaking_per_ip
            );
            // Reset rather than close: nothing to say, and no TIME_WAIT left behind.
            let _ = socket.set_linger(Some(Duration::ZERO));
            return;
        }
        if socket.set_nonblocking(true).is_err() {
            return;
        }
        let _ = socket.set_tcp_nodelay(true);
        self.insert_conn(Conn {
            socket,
            peer: src,
            dialed: false,
            phase: Phase::Hello {
                until: Instant::now() + self.cfg.hello_timeout,
            },
            decoder: OobDecoder::new(),
            peer_caps: Capabilities::empty(),
            out: Vec::new(),
            out_pos: 0,
        });
        self.handshaking += 1;
        *self.handshaking_by_ip.entry(src).or_default() += 1;
        self.set_handshaking_gauge();
    }

    fn end_handshake(&mut self, src: Ipv4Addr) {
        self.handshaking = self.handshaking.saturating_sub(1);
        if let Some(n) = self.handshaking_by_ip.get_mut(&src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.handshaking_by_ip.remove(&src);
            }
        }
        self.set_handshaking_gauge();
    }

    fn set_handshaking_gauge(&self) {
        let gauge = &self.counters().handshaking;
        gauge.store(self.handshaking as u64, Ordering::Relaxed);
    }

    fn on_ready(&mut self, token: Token, revents: libc::c_short) {
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        if let Phase::Connecting { .. } = conn.phase {
            if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0 {
                self.finish_connect(token);
            }
            return;
        }
        if revents & libc::POLLOUT != 0 {
            self.flush(token);
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            self.read(token);
        }
    }

    /// Writes what the connection has queued, until done or the socket is full.
    fn flush(&mut self, token: Token) {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            let Some(pending) = conn.out.get(conn.out_pos..).filter(|p| !p.is_empty()) else {
                conn.out.clear();
                conn.out_pos = 0;
                return;
            };
            // MSG_NOSIGNAL: a broken connection is an error here, not a SIGPIPE in the
            // application that loaded the driver.
            match conn.socket.send_with_flags(pending, libc::MSG_NOSIGNAL) {
                Ok(n) if n > 0 => {
                    conn.out_pos += n;
                    let counters = &self.shared.counters;
                    Counters::add(&counters.write_calls, 1);
                    Counters::add(&counters.bytes_written, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                result => {
                    let e = result
                        .err()
                        .unwrap_or_else(|| io::ErrorKind::WriteZero.into());
                    let why = format!("write to {} failed: {e}", conn.peer);
                    self.conn_failed(token, &why, false);
                    return;
                }
            }
        }
    }

    fn read(&mut self, token: Token) {
        let mut buf = std::mem::take(&mut self.read_buf);
        for _ in 0..READS_PER_WAKE {
            let Some(conn) = self.conns.get(&token) else {
                break;
            };
            match (&conn.socket).read(&mut buf) {
                Ok(0) => {
                    self.on_eof(token);
                    break;
                }
                Ok(n) => {
                    let alive = self.on_bytes(token, buf.get(..n).unwrap_or(&[]));
                    if !alive || n < buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // A reset before the hello is a refusal, like a close (the refusing
                    // side resets when it had unread bytes).
                    let refused = matches!(conn.phase, Phase::Hello { .. })
                        && e.kind() == io::ErrorKind::ConnectionReset;
                    let why = format!("read from {} failed: {e}", conn.peer);
                    self.conn_failed(token, &why, refused);
                    break;
                }
            }
        }
        self.read_buf = buf;
    }

    /// Decodes bytes from a connection; `false` if the connection was closed.
    fn on_bytes(&mut self, token: Token, mut input: &[u8]) -> bool {
        let mut failure = None;
        let mut alive = true;
        while let Some(conn) = self.conns.get_mut(&token) {
            match conn.decoder.decode(&mut input) {
                Ok(None) => break,
                Ok(Some(OobMessage::RecvWr(wr))) => {
                    // The decoder yields records only after the hello, which opened the
                    // connection.
                    let from = conn.peer;
                    self.pending_events.push(OobEvent::RecvWr { from, wr });
                }
                Ok(Some(OobMessage::RecvTooShort(rec))) => {
                    let from = conn.peer;
                    self.pending_events
                        .push(OobEvent::RecvTooShort { from, rec });
                }
                Ok(Some(OobMessage::Hello(hello))) => {
                    if !self.on_hello(token, hello) {
                        alive = false;
                        break;
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        // Records first, so that a PeerLost caused by what follows them comes after them.
        self.push_events();
        if let Some(e) = failure {
            self.protocol_error(token, e);
            return false;
        }
        alive && self.conns.contains_key(&token)
    }

    fn push_events(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        let records = self.pending_events.len() as u64;
        let mut q = self.shared.lock();
        q.events.extend(self.pending_events.drain(..));
        self.shared
            .events_len
            .store(q.events.len(), Ordering::SeqCst);
        drop(q);
        Counters::add(&self.shared.counters.records_received, records);
    }

    /// The other side's hello arrived: check it and decide which connection the peer
    /// keeps (module docs). `false` if this connection was closed.
    fn on_hello(&mut self, token: Token, hello: Hello) -> bool {
        let Some(conn) = self.conns.get(&token) else {
            return false;
        };
        let (peer, dialed) = (conn.peer, conn.dialed);
        let refusal = if hello.device_ip != peer {
            Some(format!(
                "its hello names device {} but the connection comes from {peer}",
                hello.device_ip
            ))
        } else if peer == self.ip() {
            Some(format!("its hello names this device's own IP {peer}"))
        } else if !hello.capabilities.contains(Capabilities::RECV_WR_RECORDS) {
            Some(format!(
                "its hello does not announce receive-WR records (capabilities {:#x})",
                hello.capabilities.bits()
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            Counters::add(&self.counters().protocol_errors, 1);
            if dialed {
                net_log!(self, link_log, log::Level::Error, "refusing {peer}: {why}");
            } else {
                net_log!(
                    self,
                    garbage_log,
                    log::Level::Error,
                    "refusing a connection from {peer}: {why}"
                );
            }
            self.conn_failed(token, &why, false);
            return false;
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.peer_caps = hello.capabilities;
        }
        if dialed {
            self.open(token, peer);
            return true;
        }
        match self.peers.get(&peer).copied() {
            None | Some(PeerLink::AwaitingPeer { .. }) => {}
            Some(PeerLink::Dialing(ours)) => {
                Counters::add(&self.counters().race_closed, 1);
                if self.ip() < peer {
                    log::debug!(
                        "OOB {}: {peer} dialed while we dial it; keeping ours (lower IP)",
                        self.local
                    );
                    self.close_conn(token);
                    return false;
                }
                log::debug!(
                    "OOB {}: {peer} dialed while we dial it; keeping theirs (lower IP)",
                    self.local
                );
                self.close_conn(ours);
            }
            Some(PeerLink::Connected(current)) => {
                let current_dialed = self.conns.get(&current).is_some_and(|c| c.dialed);
                if peer > self.ip() && current_dialed {
                    // The higher side's dial from a race we already settled.
                    Counters::add(&self.counters().race_closed, 1);
                    self.close_conn(token);
                    return false;
                }
                self.lose_peer(peer, "it opened a new connection (it restarted?)");
            }
        }
        let hello = Hello::new(self.ip()).to_bytes();
        if let Some(conn) = self.conns.get_mut(&token) {
            // Nothing is queued on an accepted connection before its hello.
            conn.out.extend_from_slice(&hello);
        }
        self.open(token, peer);
        self.flush(token);
        self.conns.contains_key(&token)
    }

    /// The connection becomes the peer's connection.
    fn open(&mut self, token: Token, peer: Ipv4Addr) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let was_handshaking = !conn.dialed && matches!(conn.phase, Phase::Hello { .. });
        conn.phase = Phase::Open;
        let keepalive = TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        let _ = conn.socket.set_tcp_keepalive(&keepalive);
        let how = if conn.dialed { "dialed" } else { "accepted" };
        self.peers.insert(peer, PeerLink::Connected(token));
        self.shared.lock().connected.insert(peer);
        let counters = &self.shared.counters;
        Counters::add(&counters.established, 1);
        Counters::add(&counters.open_connections, 1);
        net_log!(
            self,
            link_log,
            log::Level::Info,
            "connected to {peer} ({how})"
        );
        if was_handshaking {
            self.end_handshake(peer);
        }
    }

    /// Removes and closes a connection, keeping the gauges right. The peer's link is the
    /// caller's business.
    fn close_conn(&mut self, token: Token) -> Option<Conn> {
        let conn = self.conns.remove(&token)?;
        match conn.phase {
            Phase::Hello { .. } if !conn.dialed => self.end_handshake(conn.peer),
            Phase::Open => {
                self.shared
                    .counters
                    .open_connections
                    .fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Some(conn)
    }

    /// A connection failed (`why`). If it was the peer's link, the peer is lost, except for
    /// the higher side of a dial race whose dial was closed before the hello
    /// (`closed_before_hello`): it waits for the lower side's connection.
    fn conn_failed(&mut self, token: Token, why: &str, closed_before_hello: bool) {
        let Some(conn) = self.close_conn(token) else {
            return;
        };
        let peer = conn.peer;
        let is_link = match self.peers.get(&peer) {
            Some(PeerLink::Dialing(t)) | Some(PeerLink::Connected(t)) => *t == token,
            _ => false,
        };
        if !is_link {
            // A connection that was never the peer's link; its callers log what matters.
            log::debug!("OOB {}: closed a connection with {peer}: {why}", self.local);
            return;
        }
        if conn.dialed && closed_before_hello && peer < self.ip() {
            log::debug!(
                "OOB {}: {peer} closed our dial before its hello; awaiting its own dial",
                self.local
            );
            let until = Instant::now() + self.cfg.hello_timeout;
            self.peers.insert(peer, PeerLink::AwaitingPeer { until });
            return;
        }
        self.lose_peer(peer, why);
    }

    /// Drops the peer's link and queued records and reports `PeerLost`.
    fn lose_peer(&mut self, peer: Ipv4Addr, why: &str) {
        match self.peers.remove(&peer) {
            Some(PeerLink::Dialing(t)) | Some(PeerLink::Connected(t)) => {
                self.close_conn(t);
            }
            Some(PeerLink::AwaitingPeer { .. }) | None => {}
        }
        let mut q = self.shared.lock();
        let dropped = q.outbox.remove(&peer).map_or(0, |b| b.len() / RECV_WR_LEN);
        q.connected.remove(&peer);
        q.events.push_back(OobEvent::PeerLost { peer });
        self.shared
            .events_len
            .store(q.events.len(), Ordering::SeqCst);
        drop(q);
        let counters = &self.shared.counters;
        Counters::add(&counters.peers_lost, 1);
        Counters::add(&counters.records_dropped, dropped as u64);
        net_log!(
            self,
            link_log,
            log::Level::Warn,
            "lost {peer}: {why}; {dropped} queued records dropped"
        );
    }

    fn protocol_error(&mut self, token: Token, e: OobError) {
        let counters = &self.shared.counters;
        Counters::add(&counters.protocol_errors, 1);
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let peer = conn.peer;
        let handshaking = matches!(conn.phase, Phase::Hello { .. });
        if let OobError::UnsupportedVersion { .. } = e {
            Counters::add(&counters.version_mismatches, 1);
            if handshaking && !conn.dialed {
                // Our hello tells the dialer which version we speak, so it can say so too.
                let hello = Hello::new(self.ip()).to_bytes();
                let _ = conn.socket.send_with_flags(&hello, libc::MSG_NOSIGNAL);
            }
        }
        if handshaking && !conn.dialed {
            net_log!(
                self,
                garbage_log,
                log::Level::Error,
                "refusing a connection from {peer}: {e}"
            );
        } else {
            net_log!(
                self,
                link_log,
                log::Level::Error,
                "closing the connection with {peer}: {e}"
            );
        }
        self.conn_failed(token, &e.to_string(), false);
    }

    fn on_eof(&mut self, token: Token) {
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        if let Err(e) = conn.decoder.finish() {
            self.protocol_error(token, e);
            return;
        }
        let before_hello = matches!(conn.phase, Phase::Hello { .. });
        let why = if before_hello {
            format!("{} closed the connection before its hello", conn.peer)
        } else {
            format!("{} closed the connection", conn.peer)
        };
        self.conn_failed(token, &why, before_hello);
    }

    fn expire(&mut self, now: Instant) {
        let expired: Vec<(Token, Phase)> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.phase {
                Phase::Connecting { until } | Phase::Hello { until } => until <= now,
                Phase::Open => false,
            })
            .map(|(&t, c)| (t, c.phase))
            .collect();
        for (token, phase) in expired {
            let Some(conn) = self.conns.get(&token) else {
                continue;
            };
            let peer = conn.peer;
            let why = match phase {
                Phase::Connecting { .. } => {
                    Counters::add(&self.counters().dial_failures, 1);
                    let timeout = self.cfg.connect_timeout;
                    format!("connecting to {peer} timed out after {timeout:?}")
                }
                _ => {
                    Counters::add(&self.counters().hello_timeouts, 1);
                    let timeout = self.cfg.hello_timeout;
                    if !conn.dialed {
                        net_log!(
                            self,
                            garbage_log,
                            log::Level::Warn,
                            "dropping a connection from {peer}: no hello within {timeout:?}"
                        );
                    }
                    format!("no hello from {peer} within {timeout:?}")
                }
            };
            self.conn_failed(token, &why, false);
        }
        let awaited: Vec<Ipv4Addr> = self
            .peers
            .iter()
            .filter(|(_, link)| matches!(link, PeerLink::AwaitingPeer { until } if *until <= now))
            .map(|(&peer, _)| peer)
            .collect();
        for peer in awaited {
            self.lose_peer(
                peer,
                "it refused our dial and its own did not arrive in time",
            );
        }
    }
}

/// Removes the receive-WR-too-short records from `queued` (whole 32-byte records, kept in
/// order otherwise), for a peer that did not announce them; returns how many.
fn withhold_too_short(queued: &mut Vec<u8>) -> u64 {
    let too_short = (RecordKind::RecvTooShort as u32).to_be_bytes();
    let is_too_short = |r: &[u8]| r.get(28..RECV_WR_LEN) == Some(&too_short[..]);
    let n = queued
        .chunks_exact(RECV_WR_LEN)
        .filter(|r| is_too_short(r))
        .count();
    if n > 0 {
        let kept: Vec<u8> = queued
            .chunks_exact(RECV_WR_LEN)
            .filter(|r| !is_too_short(r))
            .flatten()
            .copied()
            .collect();
        *queued = kept;
    }
    n as u64
}

/// `poll(2)` over `fds`, waiting at most `timeout` (rounded up to a millisecond).
fn sys_poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs,
    // which poll only reads and writes within that length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
