//! The OOB channel's connection protocol as a state machine with no sockets, threads or
//! clock (oob-channel.md; the rules it implements are in the [`oob` module docs](super)).
//!
//! The socket layer ([`super::io_thread`]) feeds it what happened: a connection accepted
//! ([`Machine::on_accepted`]), a dial connected or failed, bytes read
//! ([`Machine::on_bytes`]), a connection closed ([`Machine::on_closed`]), the time
//! ([`Machine::on_tick`]), records queued ([`Machine::take_outbox`]). It carries out what
//! the machine asks: the [`Action`]s (dial, close) and the bytes of [`Machine::output`].
//! What the engine gets, records and `PeerLost`, comes out of [`Machine::take_events`] in
//! the order it happened.
//!
//! Every decision is made here: the hello checks, which connection survives when both
//! sides dial, when a peer has restarted, timeouts, the handshake limits, how many queued
//! records a connection takes. `now` is an argument of every input, so the tests
//! (`machine_tests.rs`) step two machines in one thread with a virtual clock.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use bluerdma_core::oob::{Capabilities, Hello, OobDecoder, OobError, OobMessage, RECV_WR_LEN};
use bluerdma_core::platform::OobEvent;

use super::log_budget::LogBudget;
use super::queues::{withhold_too_short, Outbox};
use super::stats::Counters;
use super::TcpOobConfig;

/// Names one connection between the machine and the socket layer.
pub(super) type Token = u64;

/// A connection takes more queued records only while it has less than this to write.
pub(super) const CONN_OUT_HIGH: usize = 64 * 1024;

/// What the socket layer must do for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Open a TCP connection from the device IP to `peer` on the peer port, then report
    /// [`Machine::on_connected`] or [`Machine::on_connect_failed`] for `token`.
    Dial {
        /// The connection's name from now on.
        token: Token,
        /// Whom to dial.
        peer: Ipv4Addr,
    },
    /// Close the connection (the machine has forgotten it). `last_words` are written first
    /// if the socket takes them at once.
    Close {
        /// The connection.
        token: Token,
        /// Bytes to try to send before closing (usually none).
        last_words: Vec<u8>,
    },
}

/// How a connection ended, as the socket layer saw it.
#[derive(Debug)]
pub(super) enum Closed<'a> {
    /// The peer closed it (a read returned 0).
    Eof,
    /// A read failed.
    Read(&'a io::Error),
    /// A write failed.
    Write(&'a io::Error),
}

/// What the socket layer waits for on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Interest {
    /// A dial waiting for its TCP connect (writable means done).
    pub(super) connecting: bool,
    /// Both hellos are through: records flow (reading may pause when events pile up).
    pub(super) open: bool,
    /// The machine has bytes for it ([`Machine::output`]).
    pub(super) has_output: bool,
}

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
    fn new(peer: Ipv4Addr, dialed: bool, phase: Phase) -> Self {
        Conn {
            peer,
            dialed,
            phase,
            decoder: OobDecoder::new(),
            peer_caps: Capabilities::empty(),
            out: Vec::new(),
            out_pos: 0,
        }
    }

    fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// An accepted connection still waiting for its hello (it holds a handshake slot).
    fn holds_handshake_slot(&self) -> bool {
        !self.dialed && matches!(self.phase, Phase::Hello { .. })
    }
}

/// Accepted connections waiting for their hello, in all and per source address.
#[derive(Default)]
struct Handshakes {
    total: usize,
    by_ip: HashMap<Ipv4Addr, usize>,
}

impl Handshakes {
    fn from(&self, src: Ipv4Addr) -> usize {
        self.by_ip.get(&src).copied().unwrap_or(0)
    }

    fn begin(&mut self, src: Ipv4Addr) {
        self.total += 1;
        *self.by_ip.entry(src).or_default() += 1;
    }

    fn end(&mut self, src: Ipv4Addr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_ip.get_mut(&src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_ip.remove(&src);
            }
        }
    }
}

/// Logs a message caused by the network within one of the machine's log budgets:
/// `garbage_log` for connections that never became a peer's link, `link_log` for peers.
macro_rules! net_log {
    ($m:expr, $budget:ident, $level:expr, $($arg:tt)*) => {
        if let Some(skipped) = $m.$budget.take($m.now) {
            log::log!($level, "OOB {}: {}{}", $m.local, format_args!($($arg)*), skipped);
        }
    };
}

/// The connections and peer links of one device's OOB channel (see the module docs).
pub(super) struct Machine {
    cfg: TcpOobConfig,
    local: SocketAddrV4,
    peer_port: u16,
    counters: Arc<Counters>,
    /// The time of the input being handled.
    now: Instant,
    conns: HashMap<Token, Conn>,
    next_token: Token,
    peers: HashMap<Ipv4Addr, PeerLink>,
    handshakes: Handshakes,
    actions: VecDeque<Action>,
    events: Vec<OobEvent>,
    /// Peers lost since the last [`Machine::purge`], with why.
    lost: Vec<(Ipv4Addr, String)>,
    links_changed: bool,
    garbage_log: LogBudget,
    link_log: LogBudget,
}

impl Machine {
    /// A machine for the listener at `local` (its IP is the device IP), dialing peers on
    /// `cfg.peer_port` (or `local`'s port).
    pub(super) fn new(
        cfg: TcpOobConfig,
        local: SocketAddrV4,
        counters: Arc<Counters>,
        now: Instant,
    ) -> Self {
        let peer_port = cfg.peer_port.unwrap_or(local.port());
        Machine {
            cfg,
            local,
            peer_port,
            counters,
            now,
            conns: HashMap::new(),
            next_token: 0,
            peers: HashMap::new(),
            handshakes: Handshakes::default(),
            actions: VecDeque::new(),
            events: Vec::new(),
            lost: Vec::new(),
            links_changed: false,
            garbage_log: LogBudget::new(now),
            link_log: LogBudget::new(now),
        }
    }

    fn ip(&self) -> Ipv4Addr {
        *self.local.ip()
    }

    // ---- outputs ----

    /// The next thing the socket layer must do.
    pub(super) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Records and `PeerLost` events since the last call, in order.
    pub(super) fn take_events(&mut self) -> Vec<OobEvent> {
        std::mem::take(&mut self.events)
    }

    /// Drops what `outbox` still queues for the peers lost since the last call and logs
    /// each loss. Call it with the events of [`Machine::take_events`], under the same lock
    /// that guards `outbox`, so the caller's side sees both at once.
    pub(super) fn purge(&mut self, outbox: &mut Outbox) {
        for (peer, why) in std::mem::take(&mut self.lost) {
            let dropped = outbox.drop_peer(peer);
            Counters::add(&self.counters.records_dropped, dropped as u64);
            net_log!(
                self,
                link_log,
                log::Level::Warn,
                "lost {peer}: {why}; {dropped} queued records dropped"
            );
        }
    }

    /// Whether the set of connected peers changed since the last call.
    pub(super) fn take_links_changed(&mut self) -> bool {
        std::mem::take(&mut self.links_changed)
    }

    /// The peers with an open connection.
    pub(super) fn connected_peers(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.peers
            .iter()
            .filter(|(_, link)| matches!(link, PeerLink::Connected(_)))
            .map(|(&peer, _)| peer)
    }

    /// What the socket layer waits for on `token`; `None` if the machine does not know it.
    pub(super) fn interest(&self, token: Token) -> Option<Interest> {
        let conn = self.conns.get(&token)?;
        Some(Interest {
            connecting: matches!(conn.phase, Phase::Connecting { .. }),
            open: conn.phase == Phase::Open,
            has_output: conn.pending_out() > 0,
        })
    }

    /// The bytes to write on `token` next (empty: nothing, or the dial is not connected).
    pub(super) fn output(&self, token: Token) -> &[u8] {
        match self.conns.get(&token) {
            Some(c) if !matches!(c.phase, Phase::Connecting { .. }) => {
                c.out.get(c.out_pos..).unwrap_or(&[])
            }
            _ => &[],
        }
    }

    /// `n` bytes of [`Machine::output`] were written.
    pub(super) fn on_written(&mut self, token: Token, n: usize) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.out_pos = (conn.out_pos + n).min(conn.out.len());
        if conn.out_pos == conn.out.len() {
            conn.out.clear();
            conn.out_pos = 0;
        }
        Counters::add(&self.counters.write_calls, 1);
        Counters::add(&self.counters.bytes_written, n as u64);
    }

    /// The earliest time [`Machine::on_tick`] has something to do.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| match c.phase {
            Phase::Connecting { until } | Phase::Hello { until } => Some(until),
            Phase::Open => None,
        });
        let peers = self.peers.values().filter_map(|p| match p {
            PeerLink::AwaitingPeer { until } => Some(*until),
            _ => None,
        });
        conns.chain(peers).min()
    }

    // ---- inputs ----

    /// Moves queued records to open connections (each while it has less than
    /// [`CONN_OUT_HIGH`] to write) and dials the peers that have no link.
    pub(super) fn take_outbox(&mut self, outbox: &mut Outbox, now: Instant) {
        self.now = now;
        let mut to_dial = Vec::new();
        let counters = &self.counters;
        outbox.drain_with(|peer, queued| match self.peers.get(&peer) {
            None => to_dial.push(peer),
            Some(PeerLink::Connected(token)) => {
                let Some(conn) = self.conns.get_mut(token) else {
                    return;
                };
                let pending = conn.pending_out();
                if pending >= CONN_OUT_HIGH {
                    return;
                }
                if !conn.peer_caps.contains(Capabilities::LENGTH_ERRORS) {
                    let withheld = withhold_too_short(queued);
                    Counters::add(&counters.records_withheld, withheld);
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
                Counters::add(&counters.records_sent, records);
            }
            Some(_) => {}
        });
        for peer in to_dial {
            self.dial(peer);
        }
    }

    /// The listener accepted a connection from `src`: its token, or `None` if it must be
    /// closed at once (reset) because too many connections wait for their hello.
    pub(super) fn on_accepted(&mut self, src: Ipv4Addr, now: Instant) -> Option<Token> {
        self.now = now;
        Counters::add(&self.counters.accepted, 1);
        let from_src = self.handshakes.from(src);
        if self.handshakes.total >= self.cfg.max_handshaking
            || from_src >= self.cfg.max_handshaking_per_ip
        {
            Counters::add(&self.counters.refused_over_limit, 1);
            net_log!(
                self,
                garbage_log,
                log::Level::Warn,
                "refusing a connection from {src}: {} connections ({from_src} from {src}) \
                 already wait for their hello (limits {} and {} per address)",
                self.handshakes.total,
                self.cfg.max_handshaking,
                self.cfg.max_handshaking_per_ip
            );
            return None;
        }
        let until = now + self.cfg.hello_timeout;
        let token = self.insert_conn(Conn::new(src, false, Phase::Hello { until }));
        self.handshakes.begin(src);
        self.set_handshaking_gauge();
        Some(token)
    }

    /// A dial's TCP connect completed: send the hello.
    pub(super) fn on_connected(&mut self, token: Token, now: Instant) {
        self.now = now;
        let hello = Hello::new(self.ip()).to_bytes();
        let until = now + self.cfg.hello_timeout;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.phase = Phase::Hello { until };
        conn.out.extend_from_slice(&hello);
    }

    /// A dial could not connect.
    pub(super) fn on_connect_failed(&mut self, token: Token, e: &io::Error, now: Instant) {
        self.now = now;
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        Counters::add(&self.counters.dial_failures, 1);
        let why = format!("cannot connect to {}:{}: {e}", conn.peer, self.peer_port);
        self.conn_failed(token, &why, false);
    }

    /// Bytes read from a connection; `false` if the machine closed it.
    pub(super) fn on_bytes(&mut self, token: Token, mut input: &[u8], now: Instant) -> bool {
        self.now = now;
        while let Some(conn) = self.conns.get_mut(&token) {
            let event = match conn.decoder.decode(&mut input) {
                Ok(None) => return true,
                // The decoder yields records only after the hello, which opened the
                // connection.
                Ok(Some(OobMessage::RecvWr(wr))) => OobEvent::RecvWr {
                    from: conn.peer,
                    wr,
                },
                Ok(Some(OobMessage::RecvTooShort(rec))) => OobEvent::RecvTooShort {
                    from: conn.peer,
                    rec,
                },
                Ok(Some(OobMessage::Hello(hello))) => {
                    if !self.on_hello(token, hello) {
                        return false;
                    }
                    continue;
                }
                Err(e) => {
                    self.protocol_error(token, e);
                    return false;
                }
            };
            Counters::add(&self.counters.records_received, 1);
            self.events.push(event);
        }
        false
    }

    /// A connection ended (the socket layer closes its side; no [`Action::Close`] follows).
    pub(super) fn on_closed(&mut self, token: Token, how: Closed<'_>, now: Instant) {
        self.now = now;
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let before_hello = matches!(conn.phase, Phase::Hello { .. });
        let peer = conn.peer;
        match how {
            Closed::Eof => {
                if let Err(e) = conn.decoder.finish() {
                    self.protocol_error(token, e);
                    return;
                }
                let why = if before_hello {
                    format!("{peer} closed the connection before its hello")
                } else {
                    format!("{peer} closed the connection")
                };
                self.conn_failed(token, &why, before_hello);
            }
            Closed::Read(e) => {
                // A reset before the hello is a refusal, like a close (the refusing side
                // resets when it had unread bytes).
                let refused = before_hello && e.kind() == io::ErrorKind::ConnectionReset;
                self.conn_failed(token, &format!("read from {peer} failed: {e}"), refused);
            }
            Closed::Write(e) => {
                self.conn_failed(token, &format!("write to {peer} failed: {e}"), false);
            }
        }
    }

    /// The time is `now`: connects, hellos and awaited peers that are overdue fail.
    pub(super) fn on_tick(&mut self, now: Instant) {
        self.now = now;
        let mut expired: Vec<(Token, Phase)> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.phase {
                Phase::Connecting { until } | Phase::Hello { until } => until <= now,
                Phase::Open => false,
            })
            .map(|(&t, c)| (t, c.phase))
            .collect();
        expired.sort_by_key(|&(t, _)| t);
        for (token, phase) in expired {
            let Some(conn) = self.conns.get(&token) else {
                continue;
            };
            let (peer, dialed) = (conn.peer, conn.dialed);
            let why = if let Phase::Connecting { .. } = phase {
                Counters::add(&self.counters.dial_failures, 1);
                let timeout = self.cfg.connect_timeout;
                format!("connecting to {peer} timed out after {timeout:?}")
            } else {
                Counters::add(&self.counters.hello_timeouts, 1);
                let timeout = self.cfg.hello_timeout;
                if !dialed {
                    net_log!(
                        self,
                        garbage_log,
                        log::Level::Warn,
                        "dropping a connection from {peer}: no hello within {timeout:?}"
                    );
                }
                format!("no hello from {peer} within {timeout:?}")
            };
            self.conn_failed(token, &why, false);
        }
        let mut awaited: Vec<Ipv4Addr> = self
            .peers
            .iter()
            .filter(|(_, link)| matches!(link, PeerLink::AwaitingPeer { until } if *until <= now))
            .map(|(&peer, _)| peer)
            .collect();
        awaited.sort();
        for peer in awaited {
            self.lose_peer(
                peer,
                "it refused our dial and its own did not arrive in time",
            );
        }
    }

    // ---- the protocol ----

    fn insert_conn(&mut self, conn: Conn) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        self.conns.insert(token, conn);
        token
    }

    fn dial(&mut self, peer: Ipv4Addr) {
        if self.peers.len() >= self.cfg.max_peers {
            let why = format!("too many peers (max_peers = {})", self.cfg.max_peers);
            self.lose_peer(peer, &why);
            return;
        }
        Counters::add(&self.counters.dialed, 1);
        let until = self.now + self.cfg.connect_timeout;
        let token = self.insert_conn(Conn::new(peer, true, Phase::Connecting { until }));
        self.peers.insert(peer, PeerLink::Dialing(token));
        self.actions.push_back(Action::Dial { token, peer });
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
            Counters::add(&self.counters.protocol_errors, 1);
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
                Counters::add(&self.counters.race_closed, 1);
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
                    Counters::add(&self.counters.race_closed, 1);
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
        true
    }

    /// The connection becomes the peer's connection.
    fn open(&mut self, token: Token, peer: Ipv4Addr) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let was_handshaking = conn.holds_handshake_slot();
        conn.phase = Phase::Open;
        let how = if conn.dialed { "dialed" } else { "accepted" };
        self.peers.insert(peer, PeerLink::Connected(token));
        self.links_changed = true;
        Counters::add(&self.counters.established, 1);
        Counters::add(&self.counters.open_connections, 1);
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

    /// Forgets a connection and asks the socket layer to close it, keeping the gauges
    /// right. The peer's link is the caller's business.
    fn close_conn(&mut self, token: Token) -> Option<Conn> {
        self.close_conn_saying(token, Vec::new())
    }

    fn close_conn_saying(&mut self, token: Token, last_words: Vec<u8>) -> Option<Conn> {
        let conn = self.conns.remove(&token)?;
        if conn.holds_handshake_slot() {
            self.end_handshake(conn.peer);
        } else if conn.phase == Phase::Open {
            Counters::sub(&self.counters.open_connections, 1);
        }
        self.actions.push_back(Action::Close { token, last_words });
        Some(conn)
    }

    fn end_handshake(&mut self, src: Ipv4Addr) {
        self.handshakes.end(src);
        self.set_handshaking_gauge();
    }

    fn set_handshaking_gauge(&self) {
        Counters::set(&self.counters.handshaking, self.handshakes.total as u64);
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
            let until = self.now + self.cfg.hello_timeout;
            self.peers.insert(peer, PeerLink::AwaitingPeer { until });
            return;
        }
        self.lose_peer(peer, why);
    }

    /// Drops the peer's link and reports `PeerLost`; [`Machine::purge`] drops its queued
    /// records and logs the loss.
    fn lose_peer(&mut self, peer: Ipv4Addr, why: &str) {
        match self.peers.remove(&peer) {
            Some(PeerLink::Dialing(t)) | Some(PeerLink::Connected(t)) => {
                self.close_conn(t);
            }
            Some(PeerLink::AwaitingPeer { .. }) | None => {}
        }
        self.links_changed = true;
        self.events.push(OobEvent::PeerLost { peer });
        self.lost.push((peer, why.to_string()));
        Counters::add(&self.counters.peers_lost, 1);
    }

    fn protocol_error(&mut self, token: Token, e: OobError) {
        Counters::add(&self.counters.protocol_errors, 1);
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let peer = conn.peer;
        let from_listener = conn.holds_handshake_slot();
        let mut last_words = Vec::new();
        if let OobError::UnsupportedVersion { .. } = e {
            Counters::add(&self.counters.version_mismatches, 1);
            if from_listener {
                // Our hello tells the dialer which version we speak, so it can say so too.
                last_words.extend_from_slice(&Hello::new(self.ip()).to_bytes());
            }
        }
        if from_listener {
            net_log!(
                self,
                garbage_log,
                log::Level::Error,
                "refusing a connection from {peer}: {e}"
            );
            self.close_conn_saying(token, last_words);
            // Never a peer's link: nothing else to do.
            return;
        }
        net_log!(
            self,
            link_log,
            log::Level::Error,
            "closing the connection with {peer}: {e}"
        );
        self.conn_failed(token, &e.to_string(), false);
    }

    /// Test access: the number of connections the machine knows.
    #[cfg(test)]
    pub(super) fn conn_count(&self) -> usize {
        self.conns.len()
    }
}
