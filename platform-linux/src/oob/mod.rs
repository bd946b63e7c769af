//! The out-of-band channel over TCP: core's [`OobTransport`] for Linux (oob-channel.md,
//! normative; reference-latest.md 2.3 to 2.5 for what the reference driver does).
//!
//! A [`TcpOob`] belongs to one device IP. It listens on `device_ip:60000` ([`OOB_PORT`],
//! configurable) and keeps **one TCP connection per peer IP**, shared by all QPs and used in
//! both directions. Each connection starts with a handshake, a hello (magic, version,
//! capabilities, device IP, a fresh nonce) and a proof of the shared secret from each side
//! (see *Authentication*), then carries 32-byte records back to back
//! ([`bluerdma_core::oob`] has the layout): receive-WR records and, to a peer whose hello
//! announces [`LENGTH_ERRORS`](bluerdma_core::oob::Capabilities::LENGTH_ERRORS),
//! receive-WR-too-short records; to one that announces
//! [`ATOMICS`](bluerdma_core::oob::Capabilities::ATOMICS), atomic requests (two records)
//! and replies. Such a record queued for a peer without the capability is dropped when it
//! would be written (counted in [`TcpOobStats::records_withheld`]), so that peer sees only
//! what it knows; a withheld atomic request is answered here with an
//! [`OobEvent::Atomic`] reply of status unsupported, so that the requester fails it
//! instead of waiting.
//!
//! # Connections
//! - Whichever side sends first dials. The dialer binds its own device IP before
//!   connecting, so the listener knows which device talks even when several share a host;
//!   the listener checks that the hello's device IP is the connection's source address.
//! - The dialer sends its hello at once; the listener answers with its hello; the dialer
//!   sends its proof; the listener, once the proof holds, decides whether the connection
//!   becomes the peer's (the rules below) and if so sends its own proof, which opens the
//!   connection on both sides. No record is written before that, so a connection that is
//!   refused carried nothing.
//! - **Both sides dial at once**: the connection dialed by the lower IP is kept. The lower
//!   side refuses the higher side's dial (closes it before its proof) while its own dial is
//!   pending or open; the higher side takes the lower side's dial and drops its own. A higher
//!   side whose dial is closed in its handshake waits one hello timeout for the lower side's
//!   connection before it gives up. Both end with the same single connection, and records
//!   queued meanwhile wait and go out on it.
//! - A peer that dials again while its connection is open has restarted (the driver never
//!   opens a second connection otherwise): once the new connection's proof holds, the old
//!   connection is dropped with [`OobEvent::PeerLost`] and the new one replaces it. The one
//!   exception is the stale race dial above (the higher side dialing while the lower side's
//!   own connection is open), which is refused.
//!
//! # Authentication
//! The hello's device IP only says where a connection comes from, and any local process
//! can bind a loopback address. So each side proves that it holds the devices' shared
//! secret ([`OobKey`]: a key file, by default one created 0600 for this user) with
//! HMAC-SHA256 over both hellos, whose nonces are fresh for each connection (`auth`).
//! Nothing is decided before the proof: a spoofed hello (wrong or no proof) or a replayed
//! one (the proof was made for other nonces) is refused with a logged error and a closed
//! connection, and the live connection, a dial under way and the queued records are not
//! touched. Two devices with different keys both log that the proof does not match,
//! naming the key file; the dialer reports the peer lost.
//!
//! This is protocol version 2. A version-1 peer (no nonce, no proof) is refused with an
//! error naming both versions, like any other version: there is no unauthenticated
//! fallback, which anyone could claim. Records are not encrypted nor authenticated one by
//! one: the channel protects against processes and hosts that do not hold the key and
//! cannot alter the TCP stream, not against an eavesdropper or a machine in the middle
//! (README.md, "The out-of-band channel's security").
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
//!   whose IP is not the source address, a proof that does not match) gets a logged error
//!   naming the problem and a closed connection. A peer speaking another version receives
//!   this side's hello before the close, so both sides can name the mismatch.
//! - At most `max_handshaking` accepted connections (`max_handshaking_per_ip` per source
//!   address) may be in their handshake, each for `hello_timeout`; more are closed at once.
//!   Per-connection memory is the decoder's 32 bytes and a bounded write buffer; the event
//!   queue is bounded (reading pauses while it is full, so TCP pushes back on the peer)
//!   and so is each peer's send queue ([`PlatformError::WouldBlock`] when full).
//! - What the network causes is logged at most 20 lines a second for connections that
//!   never became a peer's and 20 for peers; [`TcpOobStats`] counts everything.
//! - A second `TcpOob` on the same IP and port, in this or another process, fails with
//!   [`TcpOobError::Listen`], which says that another driver instance owns the address.
//!   A key that cannot be used (missing file, readable by others, too short) fails
//!   `bind` with [`TcpOobError::Key`], which names the file and the problem.
//!
//! # Use by the engine
//! - One `TcpOob` per opened device: `TcpOob::bind(TcpOobConfig::new(device_ip))` is the
//!   platform's `Oob`.
//! - `post_recv` on a QP that knows its peer's IP sends one record with the QP's own QPN.
//!   `WouldBlock` means the peer's queue is full: keep the WR and try again after `poll`.
//! - A SEND longer than the receive WR it was matched with sends one receive-WR-too-short
//!   record (the requester's own QPN) with [`OobTransport::send_too_short`].
//! - An atomic goes with [`OobTransport::send_atomic`] (a request: two records; the reply:
//!   one), and comes back as `OobEvent::Atomic`; a request for a peer without ATOMICS is
//!   answered here with status unsupported. [`TcpOob::notifier`] lets the owner be woken
//!   when records arrive (the verbs `Context` wakes its progress thread).
//! - Each progress step drains `poll`. `RecvWr { from, wr }` goes to the QP whose peer QPN
//!   is `wr.qpn` and whose peer IP is `from`; so does `RecvTooShort { from, rec }`.
//!   `PeerLost { peer }` moves the QPs whose peer IP is `peer` and that have a SEND
//!   waiting for a receive WR to the error state; the others keep running until a SEND
//!   finds no receive WR. It also follows a failed dial,
//!   so it can come for a peer that never had a connection.
//!
//! # Layout
//! - `machine`: the connection protocol above as a state machine without sockets,
//!   threads or clock (with its tests); `auth`: the proofs; `key`: the secret;
//! - `io_thread`: the I/O thread, sockets and the `poll(2)` loop that feed the machine;
//! - `queues`: the bounded per-peer send queues; `stats`: [`TcpOobStats`];
//!   `waker`: the eventfd that wakes the I/O thread; `log_budget`: log rate limits;
//! - [`relay`]: one device's transport shared by several processes (a daemon's
//!   [`relay::RelayHub`] and a [`relay::RelayClient`] per process, over a Unix socket).

mod auth;
mod io_thread;
mod key;
mod log_budget;
mod machine;
mod queues;
pub mod relay;
mod stats;
mod waker;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bluerdma_core::oob::{AtomicMessage, Capabilities, CheckMessage, Record, RecvTooShort, RecvWr};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};

use auth::Auth;
use io_thread::IoLoop;
pub use key::{KeyError, OobKey, OobSecret, KEY_ENV, MIN_SECRET_LEN};
use queues::Outbox;
use stats::Counters;
pub use stats::TcpOobStats;
use waker::Waker;

/// The TCP port of the out-of-band listener (the reference driver's `RECV_WORKER_PORT`).
pub const OOB_PORT: u16 = 60000;

/// What a [`TcpOob`] calls, on its I/O thread, when records arrived for `poll`: the
/// owner's wake-up (its progress thread polls now instead of after an idle sleep). It must
/// be quick and must not call back into the transport.
pub type OobNotify = Arc<dyn Fn() + Send + Sync>;

/// Sets the [`OobNotify`] of a [`TcpOob`] after the transport was handed on (boxed into an
/// engine); see [`TcpOob::notifier`].
#[derive(Clone)]
pub struct OobNotifier(Arc<Mutex<Option<OobNotify>>>);

impl OobNotifier {
    /// From now on, `f` is called whenever records arrive.
    pub fn set(&self, f: OobNotify) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(f);
    }

    fn notify(&self) {
        let f = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(f) = f {
            f();
        }
    }
}

impl fmt::Debug for OobNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OobNotifier")
    }
}

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
    /// The secret this device shares with its peers ([`OobKey::Default`]: the host's).
    pub key: OobKey,
}

impl TcpOobConfig {
    /// The defaults for `device_ip`: port 60000, 3 s to connect and to say hello, 256
    /// connections waiting for their hello (16 per source), 1024 peers, 65536 queued records
    /// per peer (2 MiB), 65536 events, and the default key ([`OobKey::Default`]).
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
            key: OobKey::Default,
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
    /// The OOB secret could not be loaded.
    Key(KeyError),
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
            TcpOobError::Key(e) => write!(f, "cannot authenticate the OOB channel: {e}"),
        }
    }
}

impl std::error::Error for TcpOobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TcpOobError::Listen { source, .. } | TcpOobError::Setup(source) => Some(source),
            TcpOobError::Key(e) => Some(e),
        }
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
    /// Loads the key, listens on `config.device_ip:config.port` and starts the I/O thread.
    pub fn bind(config: TcpOobConfig) -> Result<TcpOob, TcpOobError> {
        let (secret, source) = config.key.load().map_err(TcpOobError::Key)?;
        let auth = Auth {
            secret,
            source: source.clone(),
            nonces: auth::random_nonces(),
        };
        let addr = SocketAddrV4::new(config.device_ip, config.port);
        let listen_err = |source| TcpOobError::Listen { addr, source };
        let listener = io_thread::listen(addr).map_err(listen_err)?;
        let local_addr = listener
            .local_addr()
            .map_err(listen_err)?
            .as_socket_ipv4()
            .ok_or_else(|| listen_err(io::ErrorKind::InvalidData.into()))?;
        let shared = Arc::new(Shared {
            device_ip: config.device_ip,
            max_events: config.max_events.max(1),
            queues: Mutex::new(Queues {
                outbox: Outbox::new(config.max_queued_per_peer),
                events: VecDeque::new(),
                connected: BTreeMap::new(),
            }),
            events_len: AtomicUsize::new(0),
            reading_paused: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            waker: Waker::new().map_err(TcpOobError::Setup)?,
            counters: Arc::new(Counters::default()),
            notifier: OobNotifier(Arc::new(Mutex::new(None))),
        });
        let io = IoLoop::new(Arc::clone(&shared), config, auth, local_addr, listener);
        let io_thread = thread::Builder::new()
            .name(format!("oob-{}", local_addr.ip()))
            .spawn(move || io.run())
            .map_err(TcpOobError::Setup)?;
        log::info!("OOB {local_addr}: listening (OOB secret: {source})");
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

    /// The handle that sets what is called when records arrive ([`OobNotify`]).
    pub fn notifier(&self) -> OobNotifier {
        self.shared.notifier.clone()
    }

    /// The peers with an open connection now, in address order.
    pub fn connected_peers(&self) -> Vec<Ipv4Addr> {
        self.shared.lock().connected.keys().copied().collect()
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
                Record::AtomicRequest(req) => OobEvent::Atomic {
                    from: peer,
                    msg: AtomicMessage::Request(req),
                },
                Record::AtomicReply(reply) => OobEvent::Atomic {
                    from: peer,
                    msg: AtomicMessage::Reply(reply),
                },
                Record::AccessCheck(c) => OobEvent::Check {
                    from: peer,
                    msg: CheckMessage::Check(c),
                },
                Record::AccessVerdict(v) => OobEvent::Check {
                    from: peer,
                    msg: CheckMessage::Verdict(v),
                },
            });
            shared.events_len.store(q.events.len(), Ordering::SeqCst);
            Counters::add(&counters.records_sent, 1);
            Counters::add(&counters.records_received, 1);
            return Ok(());
        }
        if q.outbox.push(peer, &bytes).is_err() {
            Counters::add(&counters.would_block, 1);
            return Err(PlatformError::WouldBlock);
        }
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
    /// hello announced [`LENGTH_ERRORS`](bluerdma_core::oob::Capabilities::LENGTH_ERRORS) (else dropped and counted in
    /// `records_withheld`).
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        self.queue(peer, &Record::RecvTooShort(*rec))
    }

    /// Queues an atomic request (two records) or reply like [`TcpOob::send`] does a
    /// receive WR. A request is written only if `peer`'s hello announced
    /// [`ATOMICS`](bluerdma_core::oob::Capabilities::ATOMICS); otherwise it is withheld
    /// and answered with a reply of status unsupported (an event of this transport).
    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        self.queue(
            peer,
            &match *msg {
                AtomicMessage::Request(r) => Record::AtomicRequest(r),
                AtomicMessage::Reply(r) => Record::AtomicReply(r),
            },
        )
    }

    /// Queues an access check or verdict like [`TcpOob::send`] does a receive WR; it is
    /// written only if `peer`'s hello announced
    /// [`ACCESS_CHECKS`](bluerdma_core::oob::Capabilities::ACCESS_CHECKS) (else dropped and
    /// counted in `records_withheld`: the check goes unanswered).
    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        self.queue(
            peer,
            &match *msg {
                CheckMessage::Check(c) => Record::AccessCheck(c),
                CheckMessage::Verdict(v) => Record::AccessVerdict(v),
            },
        )
    }

    /// The capabilities of `peer`'s hello while a connection to it is open (this driver's
    /// own for the device's own IP).
    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<Capabilities> {
        if peer == self.shared.device_ip {
            return Some(Capabilities::OURS);
        }
        self.shared.lock().connected.get(&peer).copied()
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

/// What the caller's side and the I/O thread share.
struct Shared {
    device_ip: Ipv4Addr,
    max_events: usize,
    queues: Mutex<Queues>,
    /// `queues.events.len()`, readable without the lock.
    events_len: AtomicUsize,
    /// The I/O thread stopped reading because the event queue was full.
    reading_paused: AtomicBool,
    stop: AtomicBool,
    waker: Waker,
    counters: Arc<Counters>,
    /// Called when the I/O thread queued events.
    notifier: OobNotifier,
}

struct Queues {
    /// Encoded records per peer, not yet taken by the I/O thread.
    outbox: Outbox,
    /// Events for `poll`.
    events: VecDeque<OobEvent>,
    /// Peers with an open connection, and the capabilities of their hellos.
    connected: BTreeMap<Ipv4Addr, Capabilities>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // The queues stay consistent at every unlock, so a panic elsewhere cannot leave
        // them half-updated.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
