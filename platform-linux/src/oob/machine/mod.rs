//! The OOB channel's connection protocol as a state machine with no sockets, threads or
//! clock (oob-channel.md; the rules it implements are in the [`oob` module docs](super)).
//!
//! The socket layer ([`super::io_thread`]) feeds it what happened: a connection accepted
//! ([`Machine::on_accepted`]), a dial connected or failed, bytes read
//! ([`Machine::on_bytes`]), a connection closed ([`Machine::on_closed`]), the time
//! ([`Machine::on_tick`]), records queued ([`Machine::take_outbox`]). It carries out what
//! the machine asks: the [`Action`]s (dial, close) and the bytes of [`Machine::output`].
//! What the engine gets, records and `PeerLost`, comes out of [`Machine::take_events`] in
//! the order it happened; [`Machine::purge`] drops the queued records of lost peers.
//!
//! Every decision is made here: the hello and proof checks (`handshake.rs`), which
//! connection survives when both sides dial, when a peer has restarted, timeouts, the
//! handshake limits, how many queued records a connection takes. `now` and the nonces are
//! inputs too, so the tests (`tests/`) step two machines in one thread with a virtual
//! clock. `conn.rs` holds the per-connection state.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use bluerdma_core::oob::{
    AtomicMessage, AtomicReply, AtomicStatus, Capabilities, Hello, OobError, OobMessage,
    RECV_WR_LEN,
};
use bluerdma_core::platform::OobEvent;

use super::auth::Auth;
use super::log_budget::LogBudget;
use super::queues::{withhold, Outbox};
use super::stats::Counters;
use super::TcpOobConfig;

/// A connection takes more queued records only while it has less than this to write.
pub(super) const CONN_OUT_HIGH: usize = 64 * 1024;

/// Logs a message caused by the network within one of the machine's log budgets:
/// `garbage_log` for connections that never became a peer's link, `link_log` for peers.
macro_rules! net_log {
    ($m:expr, $budget:ident, $level:expr, $($arg:tt)*) => {
        if let Some(skipped) = $m.$budget.take($m.now) {
            log::log!($level, "OOB {}: {}{}", $m.local, format_args!($($arg)*), skipped);
        }
    };
}

mod conn;
mod handshake;
#[cfg(test)]
mod tests;

pub(super) use conn::{Action, Closed, Interest, Token};
use conn::{Conn, Handshakes, PeerLink, Phase};

/// The connections and peer links of one device's OOB channel (see the module docs).
pub(super) struct Machine {
    cfg: TcpOobConfig,
    local: SocketAddrV4,
    peer_port: u16,
    auth: Auth,
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
    /// `cfg.peer_port` (or `local`'s port), proving and checking `auth`'s secret.
    pub(super) fn new(
        cfg: TcpOobConfig,
        local: SocketAddrV4,
        auth: Auth,
        counters: Arc<Counters>,
        now: Instant,
    ) -> Self {
        let peer_port = cfg.peer_port.unwrap_or(local.port());
        Machine {
            cfg,
            local,
            peer_port,
            auth,
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
    /// that guards `outbox`, so the caller's side sees both at once
    /// ([`Machine::take_outbox`] also calls it first).
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

    /// The peers with an open connection, and the capabilities of their hellos.
    pub(super) fn connected_caps(&self) -> impl Iterator<Item = (Ipv4Addr, Capabilities)> + '_ {
        self.peers.iter().filter_map(|(&peer, link)| match link {
            PeerLink::Connected(t) => Some((peer, self.conns.get(t)?.peer_caps)),
            _ => None,
        })
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
        let conns = self.conns.values().filter_map(|c| c.phase.deadline());
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
        // What was queued for a peer lost since the last purge goes, rather than dialing
        // it again.
        self.purge(outbox);
        let mut to_dial = Vec::new();
        let counters = &self.counters;
        let events = &mut self.events;
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
                let withheld = withhold(queued, conn.peer_caps);
                Counters::add(&counters.records_withheld, withheld.records);
                // A peer that takes no atomics never sees the request: answer for it, so
                // that the requester fails the atomic instead of waiting for a reply.
                events.extend(withheld.atomics.iter().map(|req| OobEvent::Atomic {
                    from: peer,
                    msg: AtomicMessage::Reply(AtomicReply::refusal(req, AtomicStatus::Unsupported)),
                }));
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

    /// A dial's TCP connect completed: send the hello, with a fresh nonce.
    pub(super) fn on_connected(&mut self, token: Token, now: Instant) {
        self.now = now;
        let nonce = match (self.auth.nonces)() {
            Ok(nonce) => nonce,
            Err(e) => {
                let why = format!("cannot draw a nonce for the hello: {e}");
                return self.conn_failed(token, &why, false);
            }
        };
        let hello = Hello::new(self.ip()).with_nonce(nonce).to_bytes();
        let until = now + self.cfg.hello_timeout;
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.phase = Phase::Hello { until };
        conn.hellos[0] = hello;
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
                // The decoder yields records only after the proof, which opened the
                // connection (the listener's side) or was the last thing read before
                // the listener opened it (the dialer's).
                Ok(Some(OobMessage::RecvWr(wr))) => OobEvent::RecvWr {
                    from: conn.peer,
                    wr,
                },
                Ok(Some(OobMessage::RecvTooShort(rec))) => OobEvent::RecvTooShort {
                    from: conn.peer,
                    rec,
                },
                Ok(Some(OobMessage::AtomicRequest(req))) => OobEvent::Atomic {
                    from: conn.peer,
                    msg: AtomicMessage::Request(req),
                },
                Ok(Some(OobMessage::AtomicReply(reply))) => OobEvent::Atomic {
                    from: conn.peer,
                    msg: AtomicMessage::Reply(reply),
                },
                Ok(Some(OobMessage::Check(msg))) => OobEvent::Check {
                    from: conn.peer,
                    msg,
                },
                Ok(Some(OobMessage::Hello(hello))) => {
                    if !self.on_hello(token, hello) {
                        return false;
                    }
                    continue;
                }
                Ok(Some(OobMessage::Proof(proof))) => {
                    if !self.on_proof(token, proof) {
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
        let before_open = conn.phase.handshaking();
        let peer = conn.peer;
        match how {
            Closed::Eof => {
                if let Err(e) = conn.decoder.finish() {
                    self.protocol_error(token, e);
                    return;
                }
                let why = match conn.phase {
                    Phase::Hello { .. } => format!("{peer} closed the connection before its hello"),
                    Phase::Proof { .. } => format!("{peer} closed the connection before its proof"),
                    _ => format!("{peer} closed the connection"),
                };
                self.conn_failed(token, &why, before_open);
            }
            Closed::Read(e) => {
                // A reset in the handshake is a refusal, like a close (the refusing side
                // resets when it had unread bytes).
                let refused = before_open && e.kind() == io::ErrorKind::ConnectionReset;
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
            .filter(|(_, c)| c.phase.deadline().is_some_and(|until| until <= now))
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
                let what = match phase {
                    Phase::Hello { .. } => "hello",
                    _ => "proof",
                };
                if !dialed {
                    net_log!(
                        self,
                        garbage_log,
                        log::Level::Warn,
                        "dropping a connection from {peer}: no {what} within {timeout:?}"
                    );
                }
                format!("no {what} from {peer} within {timeout:?}")
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

    /// Forgets a connection and asks the socket layer to close it, keeping the gauges
    /// right. The peer's link is the caller's business.
    fn close_conn(&mut self, token: Token) -> Option<Conn> {
        self.close_conn_saying(token, Vec::new())
    }

    /// As [`Machine::close_conn`], writing what the connection has pending and then
    /// `last_words` first (when there are any), so the other side can read why.
    fn close_conn_saying(&mut self, token: Token, mut last_words: Vec<u8>) -> Option<Conn> {
        let conn = self.conns.remove(&token)?;
        if !last_words.is_empty() {
            let pending = conn.out.get(conn.out_pos..).unwrap_or(&[]);
            last_words.splice(0..0, pending.iter().copied());
        }
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
    /// the higher side of a dial race whose dial was closed in its handshake
    /// (`closed_before_open`): it waits for the lower side's connection.
    fn conn_failed(&mut self, token: Token, why: &str, closed_before_open: bool) {
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
        if conn.dialed && closed_before_open && peer < self.ip() {
            log::debug!(
                "OOB {}: {peer} closed our dial in its handshake; awaiting its own dial",
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
