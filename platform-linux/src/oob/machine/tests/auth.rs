//! The proofs of the shared secret: spoofed, replayed and unproven hellos change nothing,
//! and two devices with different keys both see why they cannot talk.

use super::*;
use bluerdma_core::oob::PROOF_LEN;

#[test]
fn a_hello_from_the_peers_own_address_with_a_wrong_proof_leaves_the_live_connection() {
    // B dialed A, so a proven dial from B would replace the connection (a restart).
    let mut net = connected_pair(B);
    let now = net.now;
    let a = net.node(A);
    let (t, answer) = a.accept_proven(B, &other_secret(), now);
    assert_eq!(answer, b"", "no proof for a spoofer");
    let (closed, last_words) = &a.closed[0];
    assert_eq!(*closed, t);
    assert_eq!(
        last_words.len(),
        PROOF_LEN,
        "A's proof, so an honest dialer can tell"
    );
    assert_eq!(a.events, [], "no PeerLost, no records");
    let s = a.stats();
    let counts = (
        s.auth_failures,
        s.protocol_errors,
        s.peers_lost,
        s.established,
    );
    assert_eq!(counts, (1, 1, 0, 1), "{s}");
    assert_eq!(a.peers(), [B]);
    still_works(&mut net, 10);
}

#[test]
fn a_hello_without_a_proof_changes_nothing_and_times_out() {
    let mut net = connected_pair(B);
    let now = net.now;
    let a = net.node(A);
    let t = a.accept_raw(B, &Hello::new(B).to_bytes(), now);
    assert_eq!(
        a.sent(t).len(),
        HELLO_LEN,
        "A answers with its hello (its nonce)"
    );
    // Records in place of the proof are taken as the proof, and do not hold.
    let t2 = a.accept_raw(B, &Hello::new(B).to_bytes(), now);
    a.m.on_bytes(t2, &wr(5).to_bytes().unwrap(), now);
    a.collect();
    assert_eq!(a.closed.len(), 1);
    assert_eq!(a.events, []);
    net.advance(HELLO_TIMEOUT);
    let a = net.node(A);
    assert_eq!(a.closed.iter().map(|c| c.0).collect::<Vec<_>>(), [t2, t]);
    assert_eq!(a.events, []);
    let s = a.stats();
    let counts = (
        s.hello_timeouts,
        s.auth_failures,
        s.peers_lost,
        s.handshaking,
    );
    assert_eq!(counts, (1, 1, 0, 0), "{s}");
    still_works(&mut net, 10);
}

#[test]
fn a_replayed_hello_and_proof_are_refused_and_the_first_connection_stays() {
    let mut net = connected_pair(A);
    let now = net.now;
    let a = net.node(A);
    // C proves itself honestly; someone records what C sent.
    let first = a.m.on_accepted(C, now).unwrap();
    let hello = Hello::new(C).with_nonce([0x11; 16]);
    let (answer, recorded) = a.prove_to(first, hello, &secret(), now);
    assert_eq!(answer.len(), PROOF_LEN);
    assert_eq!(a.peers(), [B, C]);
    // Replayed on a new connection from C's address: A's new nonce breaks the proof.
    let replay = a.accept_raw(C, &recorded, now);
    assert_eq!(a.closed.len(), 1);
    assert_eq!(a.closed[0].0, replay);
    let s = a.stats();
    let counts = (s.auth_failures, s.peers_lost, s.open_connections);
    assert_eq!(counts, (1, 0, 2), "{s}");
    // C's first connection still carries records.
    a.m.on_bytes(first, &wr(3).to_bytes().unwrap(), now);
    a.collect();
    assert_eq!(a.events, [got(C, 3)]);
    still_works(&mut net, 10);
}

#[test]
fn devices_with_different_keys_both_refuse_and_the_dialer_loses_the_peer() {
    let now = Instant::now();
    let mut net = Net {
        nodes: vec![
            Node::with_auth(A, now, |_| {}, auth(A, secret())),
            Node::with_auth(B, now, |_| {}, auth(B, other_secret())),
        ],
        wires: Vec::new(),
        now,
    };
    net.node(A).send(B, 1);
    net.settle();
    assert_eq!(net.open_wires(), []);
    // B refused A's proof and sent its own, which A refused in turn.
    assert_eq!(net.node(A).events, [lost(B)]);
    assert_eq!(net.node(B).events, []);
    let (sa, sb) = (net.node(A).stats(), net.node(B).stats());
    assert_eq!((sa.auth_failures, sb.auth_failures), (1, 1), "{sa}\n{sb}");
    assert_eq!(
        (sa.records_dropped, sa.established, sb.established),
        (1, 0, 0)
    );
}

#[test]
fn a_dialer_refuses_a_listener_whose_proof_does_not_hold() {
    let mut node = Node::new(A, Instant::now(), |_| {});
    let now = Instant::now();
    node.send(B, 1);
    let (t, _) = node.dial_raw(B, &Hello::new(B).to_bytes(), now);
    assert_eq!(node.sent(t).len(), PROOF_LEN, "A proves itself");
    node.m.on_bytes(t, &[0x5a; PROOF_LEN], now);
    node.collect();
    assert_eq!(node.events, [lost(B)]);
    assert_eq!(node.closed, [(t, vec![])]);
    assert_eq!(node.stats().auth_failures, 1);
}

#[test]
fn without_a_nonce_a_dial_fails_instead_of_sending_a_predictable_hello() {
    let now = Instant::now();
    let failing = Auth {
        nonces: Box::new(|| Err(io::Error::other("no entropy"))),
        ..auth(A, secret())
    };
    let mut node = Node::with_auth(A, now, |_| {}, failing);
    node.send(B, 1);
    node.pump(now);
    let t = node.take_dial();
    node.m.on_connected(t, now);
    node.collect();
    assert_eq!(node.events, [lost(B)]);
    assert_eq!(node.m.output(t), b"");
    // A listener without nonces closes the connection at the hello.
    let t = node.accept_raw(C, &Hello::new(C).to_bytes(), now);
    assert_eq!(node.closed.last(), Some(&(t, vec![])));
}
