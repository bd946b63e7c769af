//! Tests of the connection state machine ([`super::machine`]), without sockets or threads:
//! a [`Net`] of machines in one thread, whose dials and connections the test carries out
//! step by step on a virtual clock. Each test pins down one rule of the `oob` module docs.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::oob::{Capabilities, Hello, RecvTooShort, RecvWr, HELLO_LEN, RECV_WR_LEN};
use bluerdma_core::platform::OobEvent;

use super::machine::{Action, Closed, Machine, Token, CONN_OUT_HIGH};
use super::queues::{Outbox, QueueFull};
use super::stats::{Counters, TcpOobStats};
use super::TcpOobConfig;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const PORT: u16 = 60000;
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);

fn wr(i: u64) -> RecvWr {
    RecvWr {
        wr_id: i,
        addr: 0x1000 * i,
        length: 64,
        lkey: 0x100,
        qpn: 0x2a,
    }
}

fn got(from: Ipv4Addr, i: u64) -> OobEvent {
    OobEvent::RecvWr { from, wr: wr(i) }
}

fn lost(peer: Ipv4Addr) -> OobEvent {
    OobEvent::PeerLost { peer }
}

/// One device: its machine, its send queues, and what the socket layer would have done.
struct Node {
    ip: Ipv4Addr,
    m: Machine,
    outbox: Outbox,
    counters: Arc<Counters>,
    /// Events published to `poll`.
    events: Vec<OobEvent>,
    /// Dials asked for and not yet carried out.
    dials: Vec<(Token, Ipv4Addr)>,
    /// Connections the machine closed, with their last words.
    closed: Vec<(Token, Vec<u8>)>,
}

impl Node {
    fn new(ip: Ipv4Addr, now: Instant, tweak: impl Fn(&mut TcpOobConfig)) -> Node {
        let mut cfg = TcpOobConfig::new(ip);
        cfg.hello_timeout = HELLO_TIMEOUT;
        cfg.connect_timeout = HELLO_TIMEOUT;
        tweak(&mut cfg);
        let counters = Arc::new(Counters::default());
        let outbox = Outbox::new(cfg.max_queued_per_peer);
        let local = SocketAddrV4::new(ip, PORT);
        Node {
            ip,
            m: Machine::new(cfg, local, Arc::clone(&counters), now),
            outbox,
            counters,
            events: Vec::new(),
            dials: Vec::new(),
            closed: Vec::new(),
        }
    }

    fn send(&mut self, peer: Ipv4Addr, i: u64) {
        self.outbox.push(peer, &wr(i).to_bytes().unwrap()).unwrap();
    }

    /// What the I/O loop does at the top of each turn, and after each input.
    fn pump(&mut self, now: Instant) {
        self.m.take_outbox(&mut self.outbox, now);
        self.collect();
    }

    fn collect(&mut self) {
        while let Some(action) = self.m.poll_action() {
            match action {
                Action::Dial { token, peer } => self.dials.push((token, peer)),
                Action::Close { token, last_words } => self.closed.push((token, last_words)),
            }
        }
        self.m.purge(&mut self.outbox);
        self.events.extend(self.m.take_events());
    }

    /// Everything the machine has to write on `token`, marked written.
    fn sent(&mut self, token: Token) -> Vec<u8> {
        let out = self.m.output(token).to_vec();
        if !out.is_empty() {
            self.m.on_written(token, out.len());
        }
        out
    }

    fn take_dial(&mut self) -> Token {
        assert_eq!(self.dials.len(), 1, "one dial expected: {:?}", self.dials);
        self.dials.remove(0).0
    }

    fn stats(&self) -> TcpOobStats {
        self.counters.snapshot()
    }

    fn peers(&self) -> Vec<Ipv4Addr> {
        let mut peers: Vec<_> = self.m.connected_peers().collect();
        peers.sort();
        peers
    }

    /// A connection accepted from `src` that says `bytes`; its token.
    fn accept_raw(&mut self, src: Ipv4Addr, bytes: &[u8], now: Instant) -> Token {
        let t = self.m.on_accepted(src, now).expect("accepted");
        self.m.on_bytes(t, bytes, now);
        self.collect();
        t
    }

    /// Dials `peer` (after `send`) and lets a hand-made listener answer with `answer`.
    fn dial_raw(&mut self, peer: Ipv4Addr, answer: &[u8], now: Instant) -> Token {
        self.pump(now);
        assert_eq!(self.dials.first().map(|d| d.1), Some(peer));
        let t = self.take_dial();
        self.m.on_connected(t, now);
        assert_eq!(self.sent(t), Hello::new(self.ip).to_bytes());
        self.m.on_bytes(t, answer, now);
        self.pump(now);
        t
    }
}

/// A TCP connection between two nodes, with the bytes written and not yet read.
struct Wire {
    d: usize,
    dt: Token,
    l: usize,
    lt: Token,
    open: bool,
    /// In flight from the dialer, and from the listener.
    in_flight: [Vec<u8>; 2],
}

impl Wire {
    /// The node and token of the writing end and the reading end.
    fn ends(&self, from_dialer: bool) -> ((usize, Token), (usize, Token)) {
        if from_dialer {
            ((self.d, self.dt), (self.l, self.lt))
        } else {
            ((self.l, self.lt), (self.d, self.dt))
        }
    }
}

/// Nodes and the connections between them; `now` is the virtual clock.
struct Net {
    nodes: Vec<Node>,
    wires: Vec<Wire>,
    now: Instant,
}

fn two<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j);
    if i < j {
        let (lo, hi) = v.split_at_mut(j);
        (&mut lo[i], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(i);
        (&mut hi[0], &mut lo[j])
    }
}

impl Net {
    fn new(ips: &[Ipv4Addr]) -> Net {
        Self::with(ips, |_| {})
    }

    fn with(ips: &[Ipv4Addr], tweak: impl Fn(&mut TcpOobConfig)) -> Net {
        let now = Instant::now();
        let nodes = ips.iter().map(|&ip| Node::new(ip, now, &tweak)).collect();
        Net {
            nodes,
            wires: Vec::new(),
            now,
        }
    }

    fn node(&mut self, ip: Ipv4Addr) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.ip == ip).unwrap()
    }

    fn index(&self, ip: Ipv4Addr) -> Option<usize> {
        self.nodes.iter().position(|n| n.ip == ip)
    }

    /// Carries out `from`'s dial `dt`: the peer accepts it (or the dial fails); the
    /// wire's index.
    fn connect(&mut self, from: Ipv4Addr, dt: Token, peer: Ipv4Addr) -> Option<usize> {
        let now = self.now;
        let d = self.index(from).unwrap();
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let Some(l) = self.index(peer) else {
            self.nodes[d].m.on_connect_failed(dt, &refused, now);
            return None;
        };
        let (dn, ln) = two(&mut self.nodes, d, l);
        let Some(lt) = ln.m.on_accepted(from, now) else {
            dn.m.on_connect_failed(dt, &refused, now);
            return None;
        };
        dn.m.on_connected(dt, now);
        self.wires.push(Wire {
            d,
            dt,
            l,
            lt,
            open: true,
            in_flight: [Vec::new(), Vec::new()],
        });
        Some(self.wires.len() - 1)
    }

    /// One end of wire `w` writes what its machine has; whether it had anything.
    fn write(&mut self, w: usize, from_dialer: bool) -> bool {
        let wire = &mut self.wires[w];
        let ((f, ft), _) = wire.ends(from_dialer);
        if !wire.open {
            return false;
        }
        let bytes = self.nodes[f].sent(ft);
        wire.in_flight[usize::from(!from_dialer)].extend_from_slice(&bytes);
        !bytes.is_empty()
    }

    /// The other end of wire `w` reads what is in flight to it; whether anything was.
    fn deliver(&mut self, w: usize, from_dialer: bool) -> bool {
        let now = self.now;
        let wire = &mut self.wires[w];
        let (_, (t, tt)) = wire.ends(from_dialer);
        let bytes = std::mem::take(&mut wire.in_flight[usize::from(!from_dialer)]);
        if !wire.open || bytes.is_empty() {
            return false;
        }
        self.nodes[t].m.on_bytes(tt, &bytes, now);
        true
    }

    /// Writes and delivers in one direction.
    fn carry(&mut self, w: usize, from_dialer: bool) -> bool {
        let wrote = self.write(w, from_dialer);
        self.deliver(w, from_dialer) || wrote
    }

    /// Closes the wires whose end the machines closed: the other end reads what was in
    /// flight to it and the last words, then EOF.
    fn close_wires(&mut self) -> bool {
        let now = self.now;
        let mut progress = false;
        for n in 0..self.nodes.len() {
            for (token, last_words) in std::mem::take(&mut self.nodes[n].closed) {
                let Some(w) = self.wires.iter_mut().find(|w| {
                    w.open && ((w.d == n && w.dt == token) || (w.l == n && w.lt == token))
                }) else {
                    continue;
                };
                w.open = false;
                progress = true;
                let closer_dialed = w.d == n;
                let (_, (o, ot)) = w.ends(closer_dialed);
                let mut bytes = std::mem::take(&mut w.in_flight[usize::from(!closer_dialed)]);
                bytes.extend_from_slice(&last_words);
                let other = &mut self.nodes[o].m;
                if !bytes.is_empty() && !other.on_bytes(ot, &bytes, now) {
                    continue;
                }
                other.on_closed(ot, Closed::Eof, now);
            }
        }
        progress
    }

    /// Runs everything to quiescence: queued records, dials, bytes, closes.
    fn settle(&mut self) {
        for _ in 0..1000 {
            let now = self.now;
            let mut progress = false;
            for n in &mut self.nodes {
                n.pump(now);
            }
            for n in 0..self.nodes.len() {
                for (dt, peer) in std::mem::take(&mut self.nodes[n].dials) {
                    progress = true;
                    let from = self.nodes[n].ip;
                    self.connect(from, dt, peer);
                }
            }
            for w in 0..self.wires.len() {
                progress |= self.carry(w, true);
                progress |= self.carry(w, false);
            }
            for n in &mut self.nodes {
                n.collect();
            }
            progress |= self.close_wires();
            if !progress {
                return;
            }
        }
        panic!("the net did not settle");
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        let now = self.now;
        for n in &mut self.nodes {
            n.m.on_tick(now);
            n.collect();
        }
    }

    fn open_wires(&self) -> Vec<(Ipv4Addr, Ipv4Addr)> {
        let ip = |i: usize| self.nodes[i].ip;
        let wires = self.wires.iter().filter(|w| w.open);
        wires.map(|w| (ip(w.d), ip(w.l))).collect()
    }
}

/// A and B exchanged one record each way over a connection that `dialer` dialed.
fn connected_pair(dialer: Ipv4Addr) -> Net {
    let mut net = Net::new(&[A, B]);
    let other = if dialer == A { B } else { A };
    net.node(dialer).send(other, 1);
    net.settle();
    net.node(other).send(dialer, 2);
    net.settle();
    assert_eq!(net.node(other).events, [got(dialer, 1)]);
    assert_eq!(net.node(dialer).events, [got(other, 2)]);
    assert_eq!(net.open_wires(), [(dialer, other)]);
    for n in &mut net.nodes {
        n.events.clear();
    }
    net
}

/// After whatever the test did, A and B still exchange records over one connection.
fn still_works(net: &mut Net, tag: u64) {
    net.node(A).send(B, tag);
    net.node(B).send(A, tag + 1);
    net.settle();
    assert_eq!(net.node(B).events.last(), Some(&got(A, tag)));
    assert_eq!(net.node(A).events.last(), Some(&got(B, tag + 1)));
    let wires = net.open_wires();
    let between_a_and_b = wires.iter().filter(|&&(d, l)| (d == A) != (l == A));
    assert_eq!(between_a_and_b.count(), 1, "{wires:?}");
}

#[test]
fn records_wait_for_both_hellos_then_go_out_in_order() {
    let mut net = Net::new(&[A, B]);
    for i in 0..3 {
        net.node(A).send(B, i);
    }
    let now = net.now;
    net.node(A).pump(now);
    let dt = net.node(A).take_dial();
    assert_eq!(
        net.node(A).m.output(dt),
        b"",
        "nothing before the TCP connect"
    );
    let w = net.connect(A, dt, B).unwrap();
    net.node(A).pump(now);
    // Only the hello before B's hello, though three records wait.
    assert_eq!(net.node(A).m.output(dt), Hello::new(A).to_bytes());
    assert!(net.carry(w, true));
    assert_eq!(net.node(A).outbox.queued(B), 3);
    net.settle();
    assert_eq!(net.node(B).events, [got(A, 0), got(A, 1), got(A, 2)]);
    assert_eq!(net.node(A).outbox.queued(B), 0);
    assert_eq!(
        (net.node(A).peers(), net.node(B).peers()),
        (vec![B], vec![A])
    );
    let s = net.node(A).stats();
    assert_eq!(
        (s.established, s.open_connections, s.records_sent),
        (1, 1, 3),
        "{s}"
    );
    assert_eq!(s.bytes_written, (HELLO_LEN + 3 * RECV_WR_LEN) as u64, "{s}");
}

/// Both dial; whichever hello is read first, both keep the lower IP's dial.
fn dial_race(lower_reads_first: bool) {
    let mut net = Net::new(&[A, B]);
    net.node(A).send(B, 1);
    net.node(B).send(A, 2);
    let now = net.now;
    net.node(A).pump(now);
    net.node(B).pump(now);
    let (da, db) = (net.node(A).take_dial(), net.node(B).take_dial());
    let w_ab = net.connect(A, da, B).unwrap();
    let w_ba = net.connect(B, db, A).unwrap();
    // Both hellos are on the wire before either is read.
    assert!(net.write(w_ab, true) && net.write(w_ba, true));
    if lower_reads_first {
        net.deliver(w_ba, true);
        net.deliver(w_ab, true);
    } else {
        net.deliver(w_ab, true);
        net.deliver(w_ba, true);
    }
    net.settle();
    assert_eq!(net.open_wires(), [(A, B)], "the lower side's dial survives");
    assert_eq!(net.node(B).events, [got(A, 1)]);
    assert_eq!(net.node(A).events, [got(B, 2)]);
    let (sa, sb) = (net.node(A).stats(), net.node(B).stats());
    assert_eq!((sa.established, sb.established), (1, 1), "{sa}\n{sb}");
    assert_eq!(sa.peers_lost + sb.peers_lost, 0, "{sa}\n{sb}");
    assert!(sa.race_closed + sb.race_closed >= 1, "{sa}\n{sb}");
    still_works(&mut net, 10);
}

#[test]
fn dial_race_lower_side_reads_first_both_keep_the_lower_ips_dial() {
    dial_race(true);
}

#[test]
fn dial_race_higher_side_reads_first_both_keep_the_lower_ips_dial() {
    dial_race(false);
}

#[test]
fn higher_side_whose_dial_is_refused_waits_for_the_lower_side_then_gives_up() {
    let mut net = Net::new(&[A, B]);
    net.node(A).send(B, 1);
    net.node(B).send(A, 2);
    let now = net.now;
    net.node(A).pump(now);
    net.node(B).pump(now);
    let _stuck = net.node(A).take_dial(); // A's dial never connects
    let db = net.node(B).take_dial();
    let w = net.connect(B, db, A).unwrap();
    net.carry(w, true); // A, dialing itself, refuses B's dial without a hello
    net.settle();
    assert_eq!(net.open_wires(), []);
    assert_eq!(
        net.node(B).events,
        [],
        "B waits for A's dial: no PeerLost yet"
    );
    assert_eq!(net.node(B).outbox.queued(A), 1, "B's record still waits");
    net.advance(HELLO_TIMEOUT);
    assert_eq!(net.node(B).events, [lost(A)]);
    assert_eq!(net.node(A).events, [lost(B)], "A's dial timed out");
    assert_eq!(net.node(B).stats().records_dropped, 1);
}

#[test]
fn a_hello_of_another_version_is_refused_and_answered_with_ours() {
    let mut net = connected_pair(A);
    let now = net.now;
    let mut v2 = Hello::new(C).to_bytes();
    v2[4..6].copy_from_slice(&2u16.to_be_bytes());
    let t = net.node(A).accept_raw(C, &v2, now);
    assert_eq!(net.node(A).closed, [(t, Hello::new(A).to_bytes().to_vec())]);
    let s = net.node(A).stats();
    assert_eq!(
        (s.protocol_errors, s.version_mismatches, s.handshaking),
        (1, 1, 0),
        "{s}"
    );
    assert_eq!(net.node(A).events, []);
    still_works(&mut net, 10);
}

#[test]
fn a_dialer_answered_in_another_version_loses_the_peer() {
    let mut net = Net::new(&[A]);
    let now = net.now;
    let mut v9 = Hello::new(B).to_bytes();
    v9[4..6].copy_from_slice(&9u16.to_be_bytes());
    net.node(A).send(B, 1);
    let t = net.node(A).dial_raw(B, &v9, now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).events, [lost(B)]);
    let s = net.node(A).stats();
    assert_eq!((s.version_mismatches, s.records_dropped), (1, 1), "{s}");
}

#[test]
fn a_spoofed_hello_naming_another_address_is_refused_and_the_live_connection_stays() {
    let mut net = connected_pair(A);
    let now = net.now;
    let mut bytes = Hello::new(B).to_bytes().to_vec();
    bytes.extend_from_slice(&wr(666).to_bytes().unwrap());
    let t = net.node(A).accept_raw(C, &bytes, now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).events, [], "the spoofed record went nowhere");
    let s = net.node(A).stats();
    assert_eq!(
        (s.protocol_errors, s.peers_lost, s.open_connections),
        (1, 0, 1),
        "{s}"
    );
    assert_eq!(net.node(A).peers(), [B]);
    still_works(&mut net, 10);
}

#[test]
fn a_hello_naming_our_own_ip_or_without_receive_wr_records_is_refused() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    let own = node.accept_raw(A, &Hello::new(A).to_bytes(), now);
    let no_records = Hello {
        capabilities: Capabilities::LENGTH_ERRORS,
        device_ip: C,
    };
    let bare = node.accept_raw(C, &no_records.to_bytes(), now);
    assert_eq!(node.closed, [(own, vec![]), (bare, vec![])]);
    let s = node.stats();
    assert_eq!(
        (s.protocol_errors, s.established, s.handshaking),
        (2, 0, 0),
        "{s}"
    );
}

#[test]
fn a_peer_that_dials_again_has_restarted_its_old_connection_is_lost() {
    // B dialed A; a new dial from B means a new B process.
    let mut net = connected_pair(B);
    let now = net.now;
    let mut bytes = Hello::new(B).to_bytes().to_vec();
    bytes.extend_from_slice(&wr(9).to_bytes().unwrap());
    let a = net.node(A);
    let new = a.accept_raw(B, &bytes, now);
    assert_eq!(
        a.events,
        [lost(B), got(B, 9)],
        "the loss comes before the new records"
    );
    assert_eq!(
        a.sent(new),
        Hello::new(A).to_bytes(),
        "A answers the new connection"
    );
    assert_eq!(a.peers(), [B]);
    let s = a.stats();
    assert_eq!(
        (s.established, s.open_connections, s.peers_lost),
        (2, 1, 1),
        "{s}"
    );
    // The old connection was closed: the old B loses A.
    net.close_wires();
    net.node(B).collect();
    assert_eq!(net.node(B).events, [lost(A)]);
}

#[test]
fn a_dial_from_the_higher_side_while_ours_is_open_is_a_stale_race_and_refused() {
    let mut net = connected_pair(A);
    let now = net.now;
    let t = net.node(A).accept_raw(B, &Hello::new(B).to_bytes(), now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).m.output(t), b"", "refused without a hello");
    let s = net.node(A).stats();
    assert_eq!(
        (s.race_closed, s.peers_lost, s.established),
        (1, 0, 1),
        "{s}"
    );
    still_works(&mut net, 10);
}

#[test]
fn garbage_before_the_hello_closes_only_that_connection() {
    let mut net = connected_pair(A);
    let now = net.now;
    let t = net.node(A).accept_raw(C, b"GET / HTTP/1.1\r\n", now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).events, []);
    let s = net.node(A).stats();
    assert_eq!(
        (s.protocol_errors, s.handshaking, s.peers_lost),
        (1, 0, 0),
        "{s}"
    );
    still_works(&mut net, 10);
}

#[test]
fn garbage_after_the_hello_loses_that_peer_after_its_good_records() {
    let mut net = connected_pair(A);
    let now = net.now;
    let mut bytes = Hello::new(C).to_bytes().to_vec();
    bytes.extend_from_slice(&wr(5).to_bytes().unwrap());
    let mut unknown = wr(6).to_bytes().unwrap();
    unknown[31] = 9;
    bytes.extend_from_slice(&unknown);
    net.node(A).accept_raw(C, &bytes, now);
    assert_eq!(net.node(A).events, [got(C, 5), lost(C)]);
    assert_eq!(net.node(A).peers(), [B]);
    // A truncated record at the close is garbage too.
    let mut bytes = Hello::new(C).to_bytes().to_vec();
    bytes.extend_from_slice(&wr(7).to_bytes().unwrap()[..20]);
    let a = net.node(A);
    a.events.clear();
    let t = a.accept_raw(C, &bytes, now);
    a.m.on_closed(t, Closed::Eof, now);
    a.collect();
    assert_eq!(a.events, [lost(C)]);
    assert_eq!(a.stats().protocol_errors, 2);
    still_works(&mut net, 10);
}

#[test]
fn handshake_limits_refuse_connections_over_the_bounds_until_slots_free() {
    let mut node = Node::new(A, Instant::now(), |c| {
        c.max_handshaking = 3;
        c.max_handshaking_per_ip = 2;
    });
    let now = Instant::now();
    let c1 = node.m.on_accepted(C, now).unwrap();
    node.m.on_accepted(C, now).unwrap();
    assert_eq!(node.m.on_accepted(C, now), None, "per-address bound");
    let d = Ipv4Addr::new(10, 0, 0, 4);
    node.m.on_accepted(d, now).unwrap();
    assert_eq!(node.m.on_accepted(B, now), None, "total bound");
    assert_eq!(node.stats().handshaking, 3);
    // A hello frees its slot.
    node.m.on_bytes(c1, &Hello::new(C).to_bytes(), now);
    assert_eq!(node.stats().handshaking, 2);
    node.m.on_accepted(B, now).unwrap();
    // The others time out and free theirs.
    node.m.on_tick(now + HELLO_TIMEOUT);
    node.collect();
    let s = node.stats();
    assert_eq!(
        (s.handshaking, s.hello_timeouts, s.refused_over_limit),
        (0, 3, 2),
        "{s}"
    );
    assert_eq!(s.accepted, 6, "{s}");
    assert_eq!(node.m.conn_count(), 1, "only C's open connection is left");
}

#[test]
fn a_silent_listener_loses_the_peer_at_the_hello_timeout_with_its_queued_records() {
    let mut net = Net::new(&[A]);
    let now = net.now;
    for i in 0..3 {
        net.node(A).send(B, i);
    }
    let a = net.node(A);
    a.pump(now);
    let t = a.take_dial();
    a.m.on_connected(t, now);
    a.pump(now);
    assert_eq!(a.m.next_deadline(), Some(now + HELLO_TIMEOUT));
    a.m.on_tick(now + HELLO_TIMEOUT - Duration::from_millis(1));
    a.collect();
    assert_eq!(a.events, []);
    a.m.on_tick(now + HELLO_TIMEOUT);
    a.collect();
    assert_eq!(a.events, [lost(B)]);
    assert_eq!(a.closed, [(t, vec![])]);
    let s = a.stats();
    assert_eq!(
        (s.hello_timeouts, s.records_dropped, s.peers_lost),
        (1, 3, 1),
        "{s}"
    );
    assert_eq!(a.outbox.queued(B), 0);
    // A later record dials again.
    a.send(B, 4);
    a.pump(now + HELLO_TIMEOUT);
    assert_eq!(a.dials.len(), 1);
}

#[test]
fn a_dial_that_fails_or_times_out_loses_the_peer() {
    let mut net = Net::new(&[A]);
    net.node(A).send(B, 1);
    net.settle(); // nobody at B: connection refused
    assert_eq!(net.node(A).events, [lost(B)]);
    net.node(A).send(B, 2);
    let now = net.now;
    net.node(A).pump(now);
    let _never = net.node(A).take_dial();
    net.advance(HELLO_TIMEOUT);
    assert_eq!(net.node(A).events, [lost(B), lost(B)]);
    let s = net.node(A).stats();
    assert_eq!(
        (s.dialed, s.dial_failures, s.records_dropped),
        (2, 2, 2),
        "{s}"
    );
}

#[test]
fn too_short_records_are_withheld_from_a_peer_that_does_not_announce_them() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    let short = RecvTooShort {
        wr_id: 3,
        send_len: 100,
        qpn: 0x2a,
    };
    node.outbox.push(B, &short.to_bytes().unwrap()).unwrap();
    node.send(B, 1);
    let compatible = Hello {
        capabilities: Capabilities::RECV_WR_RECORDS,
        device_ip: B,
    };
    let t = node.dial_raw(B, &compatible.to_bytes(), now);
    assert_eq!(node.sent(t), wr(1).to_bytes().unwrap());
    let s = node.stats();
    assert_eq!((s.records_withheld, s.records_sent), (1, 1), "{s}");
}

#[test]
fn a_connection_takes_queued_records_only_below_its_high_water_mark() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    node.send(B, 0);
    let t = node.dial_raw(B, &Hello::new(B).to_bytes(), now);
    let per_batch = CONN_OUT_HIGH / RECV_WR_LEN + 10;
    (1..=per_batch as u64).for_each(|i| node.send(B, i));
    node.pump(now);
    assert_eq!(node.m.output(t).len(), (per_batch + 1) * RECV_WR_LEN);
    node.send(B, 9999);
    node.pump(now);
    assert_eq!(node.outbox.queued(B), 1, "the connection is over its mark");
    node.sent(t);
    node.pump(now);
    assert_eq!(node.outbox.queued(B), 0);
    assert_eq!(node.sent(t), wr(9999).to_bytes().unwrap());
}

#[test]
fn send_queues_and_peers_are_bounded() {
    let mut node = Node::new(A, Instant::now(), |c| {
        c.max_queued_per_peer = 2;
        c.max_peers = 1;
    });
    node.send(B, 1);
    node.send(B, 2);
    let full = node.outbox.push(B, &wr(3).to_bytes().unwrap());
    assert_eq!(full, Err(QueueFull));
    node.send(C, 4);
    node.pump(Instant::now());
    // One peer may be dialed; the other is lost with its record.
    assert_eq!(node.dials.len(), 1);
    let dialed = node.dials[0].1;
    let other = if dialed == B { C } else { B };
    assert_eq!(node.events, [lost(other)]);
    assert_eq!(node.outbox.queued(other), 0);
}
