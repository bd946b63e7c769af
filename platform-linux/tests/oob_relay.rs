//! The out-of-band relay (`bluerdma_linux::oob::relay`): processes that share one device
//! each get a `RelayClient`, and a daemon's `RelayHub` owns the device's real transport.
//! Two hubs over the real TCP transport on 127.0.0.1 and 127.0.0.2 (test-chosen ports,
//! the tests' key): records from B reach only the client on A that owns (or bound) their
//! QP, for every kind of record; a record that comes before its binding waits for it; an
//! atomic for a QP no client owns is dropped and counted; a removed client's later
//! records are dropped and it sees the daemon lost; a lost peer reaches every client;
//! capabilities reach the clients; two clients of one device talk through the daemon's
//! transport; a client cannot send for or bind another client's QP.
//! With a scripted transport: a transport that blocks keeps the records in order,
//! capability changes are told. And malformed frames in both directions end the stream
//! without a panic.

#[allow(dead_code)]
#[path = "oob/support.rs"]
mod support;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::oob::{
    AccessCheck, AccessVerdict, AtomicMessage, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus,
    Capabilities, CheckMessage, CheckVerdict, Record, RecvTooShort, RecvWr,
};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};
use bluerdma_linux::oob::relay::{
    ClientId, QpOwner, RelayClient, RelayClientConfig, RelayHub, RelayHubConfig,
};
use support::{capture_logs, logged, pair, IP_A, IP_B};

/// QPs of the clients on A: client 1 owns QP indices 1..100, client 2 100..200.
const QP_1: u32 = 0x0105;
const QP_2: u32 = 0x6405;
/// QPs of the client on B (indices 1..1000).
const QP_B1: u32 = 0x0A01;
const QP_B2: u32 = 0x0B02;
/// A QP index no client on A owns.
const UNOWNED: u32 = 500 << 8 | 7;

fn client(stream: UnixStream) -> RelayClient {
    RelayClient::new(stream, RelayClientConfig::default()).unwrap()
}

/// Hub A with clients 1 and 2, hub B with one client, over TCP between 127.0.0.1 and
/// 127.0.0.2; what each client polled so far.
struct World {
    hub_a: RelayHub,
    hub_b: Option<RelayHub>,
    c1: RelayClient,
    c2: RelayClient,
    cb: RelayClient,
    id1: ClientId,
    got1: Vec<OobEvent>,
    got2: Vec<OobEvent>,
    gotb: Vec<OobEvent>,
}

impl World {
    fn new() -> World {
        capture_logs();
        let (a, b) = pair();
        let mut hub_a = RelayHub::new(Box::new(a), RelayHubConfig::default());
        let mut hub_b = RelayHub::new(Box::new(b), RelayHubConfig::default());
        let (s1, d1) = UnixStream::pair().unwrap();
        let (s2, d2) = UnixStream::pair().unwrap();
        let (sb, db) = UnixStream::pair().unwrap();
        let id1 = hub_a.add_client(d1, 1..100).unwrap();
        hub_a.add_client(d2, 100..200).unwrap();
        hub_b.add_client(db, 1..1000).unwrap();
        World {
            hub_a,
            hub_b: Some(hub_b),
            c1: client(s1),
            c2: client(s2),
            cb: client(sb),
            id1,
            got1: vec![],
            got2: vec![],
            gotb: vec![],
        }
    }

    /// Client 1's QP_1 and client 2's QP_2 are connected to B's QP_B1 and QP_B2.
    fn connected() -> World {
        let w = World::new();
        w.c1.bind(QP_1, IP_B, QP_B1).unwrap();
        w.c2.bind(QP_2, IP_B, QP_B2).unwrap();
        w.cb.bind(QP_B1, IP_A, QP_1).unwrap();
        w.cb.bind(QP_B2, IP_A, QP_2).unwrap();
        w
    }

    /// Pumps both hubs and takes what the clients can poll.
    fn step(&mut self) {
        self.hub_a.pump();
        if let Some(hub_b) = &mut self.hub_b {
            hub_b.pump();
        }
        self.got1.extend(std::iter::from_fn(|| self.c1.poll()));
        self.got2.extend(std::iter::from_fn(|| self.c2.poll()));
        self.gotb.extend(std::iter::from_fn(|| self.cb.poll()));
    }

    fn until(&mut self, what: &str, mut done: impl FnMut(&World) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            self.step();
            if done(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; A: {}",
                self.hub_a.stats()
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A while longer, so that anything misrouted would have arrived.
    fn settle(&mut self) {
        for _ in 0..50 {
            self.step();
            thread::sleep(Duration::from_millis(1));
        }
    }
}

fn recv_wr(wr_id: u64, qpn: u32) -> RecvWr {
    RecvWr {
        wr_id,
        addr: 0x7f00_0000_0000 + wr_id * 4096,
        length: 4096,
        lkey: 0x300 | wr_id as u32,
        qpn,
    }
}

fn atomic_request(qpn: u32, dest_qpn: u32) -> AtomicRequest {
    AtomicRequest {
        qpn,
        dest_qpn,
        seq: 3,
        raddr: 0x1000,
        rkey: 0x200,
        op: AtomicOp::FetchAdd { add: 5 },
    }
}

#[test]
fn records_from_the_peer_reach_only_the_client_of_their_qp_for_every_kind() {
    let mut w = World::connected();
    let too_short = RecvTooShort {
        wr_id: 9,
        send_len: 8192,
        qpn: QP_B1,
    };
    let reply = AtomicReply {
        qpn: QP_B1,
        dest_qpn: QP_1,
        seq: 1,
        status: AtomicStatus::Done,
        value: 42,
    };
    let check = AccessCheck {
        psn: 77,
        addr: 0x5000,
        len: 64,
        rkey: 0x400,
        qpn: QP_B1,
        ..AccessCheck::default()
    };
    let verdict = AccessVerdict {
        psn: 78,
        verdict: CheckVerdict::AccessError,
        qpn: QP_B2,
    };
    let request = atomic_request(QP_B2, QP_2);
    let cb = &mut w.cb;
    cb.send(IP_A, &recv_wr(1, QP_B1)).unwrap();
    cb.send(IP_A, &recv_wr(2, QP_B2)).unwrap();
    cb.send_too_short(IP_A, &too_short).unwrap();
    cb.send_atomic(IP_A, &AtomicMessage::Request(request))
        .unwrap();
    cb.send_atomic(IP_A, &AtomicMessage::Reply(reply)).unwrap();
    cb.send_check(IP_A, &CheckMessage::Check(check)).unwrap();
    cb.send_check(IP_A, &CheckMessage::Verdict(verdict))
        .unwrap();
    // And the other way: client 1 announces a receive WR to B's client.
    w.c1.send(IP_B, &recv_wr(3, QP_1)).unwrap();

    w.until("the records at both clients of A", |w| {
        w.got1.len() >= 4 && w.got2.len() >= 3 && !w.gotb.is_empty()
    });
    w.settle();
    let expect1 = [
        OobEvent::RecvWr {
            from: IP_B,
            wr: recv_wr(1, QP_B1),
        },
        OobEvent::RecvTooShort {
            from: IP_B,
            rec: too_short,
        },
        OobEvent::Atomic {
            from: IP_B,
            msg: AtomicMessage::Reply(reply),
        },
        OobEvent::Check {
            from: IP_B,
            msg: CheckMessage::Check(check),
        },
    ];
    let expect2 = [
        OobEvent::RecvWr {
            from: IP_B,
            wr: recv_wr(2, QP_B2),
        },
        OobEvent::Atomic {
            from: IP_B,
            msg: AtomicMessage::Request(request),
        },
        OobEvent::Check {
            from: IP_B,
            msg: CheckMessage::Verdict(verdict),
        },
    ];
    assert_eq!(w.got1, expect1);
    assert_eq!(w.got2, expect2);
    assert_eq!(
        w.gotb,
        [OobEvent::RecvWr {
            from: IP_A,
            wr: recv_wr(3, QP_1)
        }]
    );
    let s = w.hub_a.stats();
    assert_eq!(
        (s.events_routed, s.events_unowned, s.events_held),
        (7, 0, 0),
        "{s}"
    );
    assert_eq!((s.records_forwarded, s.binds), (1, 2), "{s}");

    // The peer's capabilities reach the clients (B's hello announces this driver's).
    w.until("B's capabilities at both clients", |w| {
        w.c1.peer_capabilities(IP_B) == Some(Capabilities::OURS)
            && w.c2.peer_capabilities(IP_B) == Some(Capabilities::OURS)
    });
}

#[test]
fn a_record_before_its_binding_waits_for_it_and_an_unowned_atomic_is_dropped_and_counted() {
    let mut w = World::new();
    w.cb.bind(QP_B1, IP_A, QP_1).unwrap();
    // B's QP reached RTR first: its receive WR arrives before client 1 binds QP_1.
    w.cb.send(IP_A, &recv_wr(1, QP_B1)).unwrap();
    // An atomic for a QP that no client of A owns.
    w.cb.send_atomic(
        IP_A,
        &AtomicMessage::Request(atomic_request(QP_B1, UNOWNED)),
    )
    .unwrap();
    w.until("the record held and the atomic dropped", |w| {
        let s = w.hub_a.stats();
        s.events_held == 1 && s.events_unowned == 1
    });
    w.settle();
    assert!(w.got1.is_empty() && w.got2.is_empty());
    assert!(
        !logged(&[
            "OOB relay",
            "atomic request",
            &format!("{UNOWNED:#x}"),
            "dropped"
        ])
        .is_empty(),
        "the drop is logged"
    );

    w.c1.bind(QP_1, IP_B, QP_B1).unwrap();
    w.until("the held record at client 1", |w| !w.got1.is_empty());
    w.settle();
    assert_eq!(
        w.got1,
        [OobEvent::RecvWr {
            from: IP_B,
            wr: recv_wr(1, QP_B1)
        }]
    );
    assert!(w.got2.is_empty());
    let s = w.hub_a.stats();
    assert_eq!((s.events_routed, s.events_unowned), (1, 1), "{s}");
}

#[test]
fn a_removed_clients_later_records_are_dropped_and_it_sees_the_daemon_lost() {
    let mut w = World::connected();
    w.cb.send(IP_A, &recv_wr(1, QP_B1)).unwrap();
    w.until("the first record at client 1", |w| !w.got1.is_empty());

    assert!(w.hub_a.remove_client(w.id1));
    assert!(!w.hub_a.remove_client(w.id1), "removed once");
    // Records for client 1's QP, by binding and by QPN, then one for client 2.
    w.cb.send(IP_A, &recv_wr(2, QP_B1)).unwrap();
    let reply = AtomicReply::refusal(&atomic_request(QP_1, QP_B1), AtomicStatus::AccessError);
    w.cb.send_atomic(IP_A, &AtomicMessage::Reply(reply))
        .unwrap();
    w.cb.send(IP_A, &recv_wr(3, QP_B2)).unwrap();
    w.until("client 2's record", |w| !w.got2.is_empty());
    w.settle();
    let s = w.hub_a.stats();
    assert_eq!(s.events_unowned, 2, "{s}");
    assert_eq!((s.clients, s.clients_removed), (1, 1), "{s}");
    assert_eq!(
        w.got2,
        [OobEvent::RecvWr {
            from: IP_B,
            wr: recv_wr(3, QP_B2)
        }]
    );
    // Client 1's stream was closed: its peers are lost, nothing else came.
    assert_eq!(
        w.got1,
        [
            OobEvent::RecvWr {
                from: IP_B,
                wr: recv_wr(1, QP_B1)
            },
            OobEvent::PeerLost { peer: IP_B }
        ]
    );
    assert!(w.c1.daemon_lost());
    assert_eq!(
        w.c1.send(IP_B, &recv_wr(4, QP_1)),
        Err(PlatformError::Disconnected { peer: IP_B })
    );
    assert_eq!(w.c1.peer_capabilities(IP_B), None);
}

#[test]
fn a_lost_peer_reaches_every_client() {
    let mut w = World::connected();
    w.cb.send(IP_A, &recv_wr(1, QP_B1)).unwrap();
    w.until("the connection", |w| {
        !w.got1.is_empty() && w.c2.peer_capabilities(IP_B).is_some()
    });
    // B's daemon goes away with its transport: its connection closes.
    drop(w.hub_b.take());
    let lost = OobEvent::PeerLost { peer: IP_B };
    w.until("B lost at both clients", |w| {
        w.got1.contains(&lost) && w.got2.contains(&lost)
    });
    assert_eq!(w.got2, [lost]);
    assert_eq!(w.hub_a.stats().events_broadcast, 1);
    w.until("B's capabilities forgotten", |w| {
        w.c1.peer_capabilities(IP_B).is_none() && w.c2.peer_capabilities(IP_B).is_none()
    });
}

#[test]
fn two_clients_of_one_device_talk_through_the_daemons_transport() {
    let mut w = World::new();
    // Client 1's QP_1 and client 2's QP_2 are connected to each other on device A.
    w.c1.bind(QP_1, IP_A, QP_2).unwrap();
    w.c2.bind(QP_2, IP_A, QP_1).unwrap();
    w.c1.send(IP_A, &recv_wr(1, QP_1)).unwrap();
    w.c2.send(IP_A, &recv_wr(2, QP_2)).unwrap();
    w.until("each record at the other client", |w| {
        !w.got1.is_empty() && !w.got2.is_empty()
    });
    w.settle();
    assert_eq!(
        w.got2,
        [OobEvent::RecvWr {
            from: IP_A,
            wr: recv_wr(1, QP_1)
        }]
    );
    assert_eq!(
        w.got1,
        [OobEvent::RecvWr {
            from: IP_A,
            wr: recv_wr(2, QP_2)
        }]
    );
    assert!(w.gotb.is_empty());
    assert_eq!(w.c1.peer_capabilities(IP_A), Some(Capabilities::OURS));
}

#[test]
fn a_client_cannot_send_for_or_bind_another_clients_qp() {
    let mut w = World::connected();
    // Client 2 claims to be client 1's QP, and tries to take its peer's records.
    w.c2.send(IP_B, &recv_wr(1, QP_1)).unwrap();
    w.c2.bind(QP_1, IP_B, QP_B1).unwrap();
    w.c2.send(IP_B, &recv_wr(2, QP_2)).unwrap();
    w.until("client 2's own record at B", |w| !w.gotb.is_empty());
    w.cb.send(IP_A, &recv_wr(3, QP_B1)).unwrap();
    w.until("B's record at client 1", |w| !w.got1.is_empty());
    w.settle();
    assert_eq!(
        w.gotb,
        [OobEvent::RecvWr {
            from: IP_A,
            wr: recv_wr(2, QP_2)
        }]
    );
    assert!(w.got2.is_empty(), "{:?}", w.got2);
    let s = w.hub_a.stats();
    assert_eq!((s.sends_refused, s.binds_refused), (1, 1), "{s}");
    assert!(!logged(&["OOB relay", "which it does not own; refused"]).is_empty());
}

#[test]
fn malformed_frames_from_the_daemon_end_the_relay_without_a_panic() {
    capture_logs();
    let valid_event = {
        // A well-formed event frame: length, version 1, kind 0x81, IP, record.
        let mut f = 38u32.to_be_bytes().to_vec();
        f.extend_from_slice(&[1, 0x81]);
        f.extend_from_slice(&IP_B.octets());
        f.extend_from_slice(&recv_wr(1, QP_B1).to_bytes().unwrap());
        f
    };
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        (
            "another version",
            [&[0, 0, 0, 38, 9, 0x81][..], &[0; 36]].concat(),
        ),
        (
            "a length out of bounds",
            vec![0xff, 0xff, 0xff, 0xff, 1, 0x81],
        ),
        ("an unknown kind", vec![0, 0, 0, 6, 1, 0x7e, 0, 0, 0, 0]),
        ("a body of the wrong size", vec![0, 0, 0, 4, 1, 0x82, 1, 2]),
        (
            "an unknown record kind",
            [&valid_event[..6 + 4 + 28], &[0, 0, 0, 0x42]].concat(),
        ),
        ("a frame cut by the close", valid_event[..20].to_vec()),
    ];
    let mut daemons = vec![];
    for (what, bytes) in garbage {
        let (ours, mut daemon) = UnixStream::pair().unwrap();
        let mut c = client(ours);
        c.send(IP_B, &recv_wr(7, QP_1)).unwrap();
        // The daemon takes it (a close with unread bytes would be a reset instead).
        let mut frame = [0u8; 42];
        daemon.read_exact(&mut frame).unwrap();
        assert_eq!(frame[..6], [0, 0, 0, 38, 1, 1], "{what}: a record frame");
        // A valid event first: it is delivered before the relay ends.
        daemon.write_all(&valid_event).unwrap();
        daemon.write_all(&bytes).unwrap();
        if what == "a frame cut by the close" {
            drop(daemon);
        } else {
            // The daemon still holds the stream: only the bytes end it.
            daemons.push(daemon);
        }
        let mut got = vec![];
        let deadline = Instant::now() + Duration::from_secs(5);
        while !c.daemon_lost() {
            got.extend(std::iter::from_fn(|| c.poll()));
            assert!(Instant::now() < deadline, "{what}: the daemon is not lost");
        }
        got.extend(std::iter::from_fn(|| c.poll()));
        assert_eq!(
            got,
            [
                OobEvent::RecvWr {
                    from: IP_B,
                    wr: recv_wr(1, QP_B1)
                },
                OobEvent::PeerLost { peer: IP_B }
            ],
            "{what}"
        );
        assert_eq!(
            c.send(IP_B, &recv_wr(8, QP_1)),
            Err(PlatformError::Disconnected { peer: IP_B }),
            "{what}"
        );
        assert_eq!(c.poll(), None);
    }
    assert!(!logged(&["OOB relay", "malformed frame from the daemon", "version 9"]).is_empty());
    assert!(
        !logged(&["OOB relay", "closed the relay inside a frame"]).is_empty(),
        "{:?}",
        logged(&["OOB relay"])
    );

    // Random bytes: whatever they are, the client ends lost or waiting, never panics.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200 {
        let (ours, mut daemon) = UnixStream::pair().unwrap();
        let mut c = client(ours);
        let mut bytes = vec![0u8; 1 + round % 97];
        for b in &mut bytes {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        // Now and then a plausible header, so that decoding gets past it.
        if round % 3 == 0 && bytes.len() > 6 {
            let len = bytes.len() as u32 - 4;
            bytes[..4].copy_from_slice(&len.to_be_bytes());
            bytes[4] = 1;
        }
        daemon.write_all(&bytes).unwrap();
        drop(daemon);
        for _ in 0..10 {
            while c.poll().is_some() {}
        }
        assert!(c.daemon_lost(), "round {round}: a closed daemon is lost");
    }
}

#[test]
fn a_malformed_frame_from_a_client_drops_only_that_client() {
    let mut w = World::connected();
    let (mut raw, daemon_side) = UnixStream::pair().unwrap();
    let raw_id = w
        .hub_a
        .add_client(daemon_side, QpOwner::Predicate(Box::new(|q| q >> 8 == 300)))
        .unwrap();
    raw.write_all(&[0, 0, 0, 3, 1, 0x55, 0]).unwrap();
    w.until("the raw client dropped", |w| {
        w.hub_a.stats().protocol_errors == 1
    });
    assert_eq!(w.hub_a.take_gone(), [raw_id]);
    assert_eq!(w.hub_a.clients().len(), 2);
    // The hub closed the raw client's stream.
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = vec![];
    raw.read_to_end(&mut rest).unwrap();
    assert!(!logged(&["OOB relay", "malformed frame", "unknown kind 0x55"]).is_empty());
    // The others keep working.
    w.cb.send(IP_A, &recv_wr(1, QP_B1)).unwrap();
    w.until("B's record at client 1", |w| !w.got1.is_empty());
}

#[test]
fn a_full_relay_queue_is_would_block_until_the_daemon_reads() {
    let (ours, mut daemon) = UnixStream::pair().unwrap();
    let cfg = RelayClientConfig {
        max_queued_bytes: 4096,
        ..RelayClientConfig::default()
    };
    let mut c = RelayClient::new(ours, cfg).unwrap();
    let mut sent = 0u64;
    loop {
        match c.send(IP_B, &recv_wr(sent, QP_1)) {
            Ok(()) => sent += 1,
            Err(PlatformError::WouldBlock) => break,
            Err(e) => panic!("send {sent}: {e}"),
        }
        assert!(sent < 1_000_000, "never WouldBlock");
    }
    assert!(c.queued_bytes() > 4096 - 42, "{}", c.queued_bytes());
    assert_eq!(c.stats().would_block, 1);
    // The daemon reads everything: the queue drains through poll and sends go again.
    daemon.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut read = 0usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    while read < sent as usize * 42 {
        assert_eq!(c.poll(), None);
        match daemon.read(&mut buf) {
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline);
    }
    assert_eq!(read, sent as usize * 42, "each record is one 42-byte frame");
    assert_eq!(c.queued_bytes(), 0);
    c.send(IP_B, &recv_wr(sent, QP_1)).unwrap();
}

/// A transport whose behaviour the test sets: it refuses the next `refuse` sends with
/// `WouldBlock`, records what it took, and reports `caps`.
#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<ScriptedState>>);

#[derive(Default)]
struct ScriptedState {
    refuse: usize,
    sent: Vec<(Ipv4Addr, Record)>,
    events: VecDeque<OobEvent>,
    caps: HashMap<Ipv4Addr, Capabilities>,
}

impl Scripted {
    fn take(&self, peer: Ipv4Addr, record: Record) -> Result<(), PlatformError> {
        let mut s = self.0.lock().unwrap();
        if s.refuse > 0 {
            s.refuse -= 1;
            return Err(PlatformError::WouldBlock);
        }
        s.sent.push((peer, record));
        Ok(())
    }
}

impl OobTransport for Scripted {
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        self.take(peer, Record::RecvWr(*wr))
    }
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        self.take(peer, Record::RecvTooShort(*rec))
    }
    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        self.take(
            peer,
            match *msg {
                AtomicMessage::Request(r) => Record::AtomicRequest(r),
                AtomicMessage::Reply(r) => Record::AtomicReply(r),
            },
        )
    }
    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<Capabilities> {
        self.0.lock().unwrap().caps.get(&peer).copied()
    }
    fn poll(&mut self) -> Option<OobEvent> {
        self.0.lock().unwrap().events.pop_front()
    }
}

#[test]
fn records_the_transport_blocks_wait_in_order_and_capability_changes_are_told() {
    let script = Scripted::default();
    script.0.lock().unwrap().refuse = 3;
    let mut hub = RelayHub::new(Box::new(script.clone()), RelayHubConfig::default());
    let (ours, daemon) = UnixStream::pair().unwrap();
    hub.add_client(daemon, 1..100).unwrap();
    let mut c = client(ours);
    for i in 0..5 {
        c.send(IP_B, &recv_wr(i, QP_1)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while script.0.lock().unwrap().sent.len() < 5 {
        hub.pump();
        assert!(Instant::now() < deadline, "{}", hub.stats());
    }
    let sent = script.0.lock().unwrap().sent.clone();
    let want: Vec<_> = (0..5)
        .map(|i| (IP_B, Record::RecvWr(recv_wr(i, QP_1))))
        .collect();
    assert_eq!(sent, want);
    let s = hub.stats();
    assert_eq!((s.would_block, s.records_forwarded), (3, 5), "{s}");

    // A send for a check the transport does not take is dropped and counted.
    let check = CheckMessage::Check(AccessCheck {
        qpn: QP_1,
        ..AccessCheck::default()
    });
    c.send_check(IP_B, &check).unwrap();
    while hub.stats().send_errors == 0 {
        hub.pump();
        assert!(Instant::now() < deadline, "{}", hub.stats());
    }

    // Capabilities: known, changed, forgotten.
    for caps in [
        Some(Capabilities::OURS),
        Some(Capabilities::RECV_WR_RECORDS),
        None,
    ] {
        match caps {
            Some(c) => script.0.lock().unwrap().caps.insert(IP_B, c),
            None => script.0.lock().unwrap().caps.remove(&IP_B),
        };
        while c.peer_capabilities(IP_B) != caps {
            hub.pump();
            assert_eq!(c.poll(), None);
            assert!(Instant::now() < deadline, "caps {caps:?}: {}", hub.stats());
            thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(hub.stats().caps_updates, 3);
    // Idle: a pump does nothing.
    thread::sleep(Duration::from_millis(30));
    hub.pump();
    assert!(!hub.pump());
}
