//! The connection rules: records after the handshake, dial races, restarts, garbage,
//! versions, timeouts and bounds.

use super::*;
use bluerdma_core::oob::{
    AtomicMessage, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus, Capabilities, RecvTooShort,
    PROOF_LEN, RECV_WR_LEN,
};
use bluerdma_core::platform::OobEvent;

use super::super::super::queues::QueueFull;
use super::super::CONN_OUT_HIGH;

#[test]
fn records_wait_for_the_handshake_then_go_out_in_order() {
    let mut net = Net::new(&[A, B]);
    for i in 0..3 {
        net.node(A).send(B, i);
    }
    let now = net.now;
    net.node(A).pump(now);
    let dt = net.node(A).take_dial();
    let nothing: &[u8] = b"";
    assert_eq!(
        net.node(A).m.output(dt),
        nothing,
        "nothing before the connect"
    );
    let w = net.connect(A, dt, B).unwrap();
    net.node(A).pump(now);
    // Only the hello, though three records wait.
    let (hello, rest) = Hello::parse(net.node(A).m.output(dt)).unwrap();
    assert_eq!((hello.device_ip, rest.len()), (A, 0));
    assert!(net.carry(w, true));
    // B's hello, then A's proof; still no record.
    assert!(net.carry(w, false));
    net.node(A).pump(now);
    assert_eq!(net.node(A).m.output(dt).len(), PROOF_LEN);
    assert_eq!(net.node(A).outbox.queued(B), 3);
    net.settle();
    assert_eq!(net.node(B).events, [got(A, 0), got(A, 1), got(A, 2)]);
    assert_eq!(net.node(A).outbox.queued(B), 0);
    assert_eq!(net.node(A).peers(), [B]);
    assert_eq!(net.node(B).peers(), [A]);
    let s = net.node(A).stats();
    let (established, open) = (s.established, s.open_connections);
    assert_eq!((established, open, s.records_sent), (1, 1, 3), "{s}");
    let handshake = (HELLO_LEN + PROOF_LEN) as u64;
    assert_eq!(s.bytes_written, handshake + 3 * RECV_WR_LEN as u64, "{s}");
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
    net.connect(B, db, A).unwrap();
    // A, dialing itself, refuses B's dial after B's proof, without its own.
    net.settle();
    assert_eq!(net.open_wires(), []);
    assert_eq!(net.node(A).stats().race_closed, 1);
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
    let ours = Hello::new(A).to_bytes().to_vec();
    let mut v3 = Hello::new(C).to_bytes();
    v3[4..6].copy_from_slice(&3u16.to_be_bytes());
    let t = net.node(A).accept_raw(C, &v3, now);
    assert_eq!(net.node(A).closed, [(t, ours.clone())]);
    // A version-1 peer (16-byte hello, no proof) is refused on its 16 bytes.
    let mut v1 = Hello::new(C).to_bytes();
    v1[4..6].copy_from_slice(&1u16.to_be_bytes());
    let t1 = net.node(A).accept_raw(C, &v1[..16], now);
    assert_eq!(net.node(A).closed[1], (t1, ours));
    let s = net.node(A).stats();
    let counts = (s.protocol_errors, s.version_mismatches, s.handshaking);
    assert_eq!(counts, (2, 2, 0), "{s}");
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
    let (t, _) = net.node(A).dial_raw(B, &v9, now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).events, [lost(B)]);
    let s = net.node(A).stats();
    assert_eq!((s.version_mismatches, s.records_dropped), (1, 1), "{s}");
}

#[test]
fn a_hello_naming_another_address_is_refused_and_the_live_connection_stays() {
    let mut net = connected_pair(A);
    let now = net.now;
    let mut bytes = Hello::new(B).to_bytes().to_vec();
    bytes.extend_from_slice(&wr(666).to_bytes().unwrap());
    let t = net.node(A).accept_raw(C, &bytes, now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(net.node(A).events, [], "the spoofed record went nowhere");
    let s = net.node(A).stats();
    let counts = (s.protocol_errors, s.peers_lost, s.open_connections);
    assert_eq!(counts, (1, 0, 1), "{s}");
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
        ..Hello::new(C)
    };
    let bare = node.accept_raw(C, &no_records.to_bytes(), now);
    assert_eq!(node.closed, [(own, vec![]), (bare, vec![])]);
    let s = node.stats();
    let counts = (s.protocol_errors, s.established, s.handshaking);
    assert_eq!(counts, (2, 0, 0), "{s}");
}

#[test]
fn a_peer_that_dials_again_has_restarted_its_old_connection_is_lost() {
    // B dialed A; a new, proven dial from B means a new B process.
    let mut net = connected_pair(B);
    let now = net.now;
    let a = net.node(A);
    let (new, answer) = a.accept_proven(B, &secret(), now);
    assert_eq!(answer.len(), PROOF_LEN, "A takes the new connection");
    a.m.on_bytes(new, &wr(9).to_bytes().unwrap(), now);
    a.collect();
    assert_eq!(
        a.events,
        [lost(B), got(B, 9)],
        "the loss comes before new records"
    );
    assert_eq!(a.peers(), [B]);
    let s = a.stats();
    let counts = (s.established, s.open_connections, s.peers_lost);
    assert_eq!(counts, (2, 1, 1), "{s}");
    // The old connection was closed: the old B loses A.
    net.close_wires();
    net.node(B).collect();
    assert_eq!(net.node(B).events, [lost(A)]);
}

#[test]
fn a_dial_from_the_higher_side_while_ours_is_open_is_a_stale_race_and_refused() {
    let mut net = connected_pair(A);
    let now = net.now;
    let (t, answer) = net.node(A).accept_proven(B, &secret(), now);
    assert_eq!(net.node(A).closed, [(t, vec![])]);
    assert_eq!(answer, b"", "refused without A's proof");
    let s = net.node(A).stats();
    let counts = (s.race_closed, s.peers_lost, s.established);
    assert_eq!(counts, (1, 0, 1), "{s}");
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
    let counts = (s.protocol_errors, s.handshaking, s.peers_lost);
    assert_eq!(counts, (1, 0, 0), "{s}");
    still_works(&mut net, 10);
}

#[test]
fn garbage_after_the_handshake_loses_that_peer_after_its_good_records() {
    let mut net = connected_pair(A);
    let now = net.now;
    let (t, _) = net.node(A).accept_proven(C, &secret(), now);
    let mut unknown = wr(6).to_bytes().unwrap();
    unknown[31] = 9;
    let bytes = [wr(5).to_bytes().unwrap(), unknown].concat();
    net.node(A).m.on_bytes(t, &bytes, now);
    net.node(A).collect();
    assert_eq!(net.node(A).events, [got(C, 5), lost(C)]);
    assert_eq!(net.node(A).peers(), [B]);
    // A truncated record at the close is garbage too.
    let a = net.node(A);
    a.events.clear();
    let (t, _) = a.accept_proven(C, &secret(), now);
    a.m.on_bytes(t, &wr(7).to_bytes().unwrap()[..20], now);
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
    // A hello keeps its slot; the connection frees it when it opens, after the proof.
    node.m.on_bytes(c1, &Hello::new(C).to_bytes(), now);
    assert_eq!(node.stats().handshaking, 3);
    let reply: [u8; HELLO_LEN] = node.sent(c1).try_into().unwrap();
    let hellos = [Hello::new(C).to_bytes(), reply];
    let proof = proofs::proof(&secret(), Role::Dialer, &hellos);
    node.m.on_bytes(c1, &proof.to_bytes(), now);
    assert_eq!(node.stats().handshaking, 2);
    node.m.on_accepted(B, now).unwrap();
    // The others time out and free theirs.
    node.m.on_tick(now + HELLO_TIMEOUT);
    node.collect();
    let s = node.stats();
    let counts = (s.handshaking, s.hello_timeouts, s.refused_over_limit);
    assert_eq!(counts, (0, 3, 2), "{s}");
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
    let counts = (s.hello_timeouts, s.records_dropped, s.peers_lost);
    assert_eq!(counts, (1, 3, 1), "{s}");
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
    let counts = (s.dialed, s.dial_failures, s.records_dropped);
    assert_eq!(counts, (2, 2, 2), "{s}");
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
        ..Hello::new(B)
    };
    let t = node.dial_proven(B, compatible, &secret(), now);
    assert_eq!(node.sent(t), wr(1).to_bytes().unwrap());
    let s = node.stats();
    assert_eq!((s.records_withheld, s.records_sent), (1, 1), "{s}");
}

#[test]
fn atomics_to_a_peer_without_them_are_withheld_and_answered_unsupported() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    let req = AtomicRequest {
        qpn: 0x2a,
        dest_qpn: 0x105,
        seq: 7,
        raddr: 0x1000,
        rkey: 0x300,
        op: AtomicOp::FetchAdd { add: 1 },
    };
    node.send(B, 1);
    node.outbox.push(B, &req.to_bytes().unwrap()).unwrap();
    node.send(B, 2);
    let no_atomics = Hello {
        capabilities: Capabilities::RECV_WR_RECORDS | Capabilities::LENGTH_ERRORS,
        ..Hello::new(B)
    };
    let t = node.dial_proven(B, no_atomics, &secret(), now);
    node.collect();
    let records = [wr(1).to_bytes().unwrap(), wr(2).to_bytes().unwrap()].concat();
    assert_eq!(node.sent(t), records, "only the receive WRs went out");
    let reply = AtomicReply::refusal(&req, AtomicStatus::Unsupported);
    let answer = OobEvent::Atomic {
        from: B,
        msg: AtomicMessage::Reply(reply),
    };
    assert_eq!(
        node.events,
        [answer],
        "the requester hears the refusal at once"
    );
    let s = node.stats();
    assert_eq!((s.records_withheld, s.records_sent), (2, 2), "{s}");
}

#[test]
fn a_connection_takes_queued_records_only_below_its_high_water_mark() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    node.send(B, 0);
    let t = node.dial_proven(B, Hello::new(B), &secret(), now);
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
