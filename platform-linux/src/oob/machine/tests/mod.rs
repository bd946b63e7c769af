//! Tests of the connection state machine ([`super::Machine`]), without sockets or threads:
//! a [`Net`] of machines in one thread, whose dials and connections the test carries out
//! step by step on a virtual clock, and hand-made peers that say what a test needs. Each
//! test pins down one rule of the `oob` module docs: `protocol.rs` the connections,
//! `auth.rs` the proofs of the secret.

mod auth;
mod protocol;

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::oob::{Hello, Proof, RecvWr, HELLO_LEN};
use bluerdma_core::platform::OobEvent;

use super::super::auth::{self as proofs, Auth, Role};
use super::super::key::OobSecret;
use super::super::queues::Outbox;
use super::super::stats::{Counters, TcpOobStats};
use super::super::TcpOobConfig;
use super::{Action, Closed, Machine, Token};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const PORT: u16 = 60000;
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);

/// The secret every node of a test shares unless the test says otherwise.
fn secret() -> OobSecret {
    OobSecret::new(b"the machine tests' secret").unwrap()
}

fn other_secret() -> OobSecret {
    OobSecret::new(b"another device's secret").unwrap()
}

/// Nonces that differ per node and per connection, the same in every run.
fn counting_nonces(ip: Ipv4Addr) -> proofs::NonceSource {
    let mut n = 0u64;
    Box::new(move || {
        n += 1;
        let mut nonce = [ip.octets()[3]; 16];
        nonce[..8].copy_from_slice(&n.to_be_bytes());
        Ok(nonce)
    })
}

fn auth(ip: Ipv4Addr, secret: OobSecret) -> Auth {
    Auth {
        secret,
        source: "key file /test/oob.key".into(),
        nonces: counting_nonces(ip),
    }
}

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
        Self::with_auth(ip, now, tweak, auth(ip, secret()))
    }

    fn with_auth(
        ip: Ipv4Addr,
        now: Instant,
        tweak: impl Fn(&mut TcpOobConfig),
        auth: Auth,
    ) -> Node {
        let mut cfg = TcpOobConfig::new(ip);
        cfg.hello_timeout = HELLO_TIMEOUT;
        cfg.connect_timeout = HELLO_TIMEOUT;
        tweak(&mut cfg);
        let counters = Arc::new(Counters::default());
        let outbox = Outbox::new(cfg.max_queued_per_peer);
        let local = SocketAddrV4::new(ip, PORT);
        Node {
            ip,
            m: Machine::new(cfg, local, auth, Arc::clone(&counters), now),
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
        let mut peers: Vec<_> = self.m.connected_caps().map(|(p, _)| p).collect();
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

    /// On accepted connection `t`, a hand-made dialer says `hello`, reads the node's hello
    /// and proves `secret`; returns what the node wrote after that (its proof if it took
    /// the connection) and the dialer's bytes (hello and proof, for replays).
    fn prove_to(
        &mut self,
        t: Token,
        hello: Hello,
        secret: &OobSecret,
        now: Instant,
    ) -> (Vec<u8>, Vec<u8>) {
        self.m.on_bytes(t, &hello.to_bytes(), now);
        let reply = self.sent(t);
        let (listener, _) = Hello::parse(&reply).expect("the node answers with its hello");
        assert_eq!(listener.device_ip, self.ip);
        let hellos = [hello.to_bytes(), listener.to_bytes()];
        let proof = proofs::proof(secret, Role::Dialer, &hellos).to_bytes();
        self.m.on_bytes(t, &proof, now);
        self.collect();
        let said = [hello.to_bytes(), proof].concat();
        (self.sent(t), said)
    }

    /// A connection from `src` that proves `secret`: the token and [`Node::prove_to`]'s
    /// answer.
    fn accept_proven(
        &mut self,
        src: Ipv4Addr,
        secret: &OobSecret,
        now: Instant,
    ) -> (Token, Vec<u8>) {
        let t = self.m.on_accepted(src, now).expect("accepted");
        let hello = Hello::new(src).with_nonce([0x77; 16]);
        let (answer, _) = self.prove_to(t, hello, secret, now);
        (t, answer)
    }

    /// Dials `peer` (after `send`), reads the node's hello; a hand-made listener answers
    /// with `answer`; returns the dial's token and the node's hello.
    fn dial_raw(&mut self, peer: Ipv4Addr, answer: &[u8], now: Instant) -> (Token, Hello) {
        self.pump(now);
        assert_eq!(self.dials.first().map(|d| d.1), Some(peer));
        let t = self.take_dial();
        self.m.on_connected(t, now);
        let sent = self.sent(t);
        let (ours, rest) = Hello::parse(&sent).unwrap();
        assert_eq!((ours.device_ip, rest.len()), (self.ip, 0));
        self.m.on_bytes(t, answer, now);
        self.pump(now);
        (t, ours)
    }

    /// As [`Node::dial_raw`], the hand-made listener answering with `answer` and then,
    /// if the node's proof holds, with its own proof of `secret`.
    fn dial_proven(
        &mut self,
        peer: Ipv4Addr,
        answer: Hello,
        secret: &OobSecret,
        now: Instant,
    ) -> Token {
        let (t, ours) = self.dial_raw(peer, &answer.to_bytes(), now);
        let hellos = [ours.to_bytes(), answer.to_bytes()];
        let theirs = Proof::parse(&self.sent(t))
            .expect("the node proves itself")
            .0;
        assert!(proofs::verify(secret, Role::Dialer, &hellos, &theirs));
        let proof = proofs::proof(secret, Role::Listener, &hellos);
        self.m.on_bytes(t, &proof.to_bytes(), now);
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
