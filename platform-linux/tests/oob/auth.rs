//! Authentication of the OOB channel over real sockets: a process that binds a device's
//! address cannot take over its connection with a spoofed or replayed hello, devices with
//! different keys say so, an old (version-1) peer is refused by name, and key files that
//! cannot be trusted stop `bind` with an error naming the file.

use std::io::Read;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;

use bluerdma_core::oob::{Capabilities, Hello, HELLO_LEN, PROOF_LEN};
use bluerdma_core::platform::{OobEvent, OobTransport};
use bluerdma_linux::oob::{OobKey, OobSecret, TcpOob, TcpOobError};

use super::support::*;

const WRONG: &[u8] = b"a secret some other process made up";

/// B dialed A: a new proven connection from B's address would replace it (a restart).
fn pair_b_dialed() -> (TcpOob, TcpOob) {
    let (mut a, mut b) = pair();
    send(&mut b, IP_A, &record(1));
    next_event(&mut a, "B's record at A");
    (a, b)
}

#[test]
fn a_hello_spoofed_from_the_peers_own_address_is_refused_and_the_connection_survives() {
    let (mut a, mut b) = pair_b_dialed();
    let addr = a.local_addr();
    // Any local process can bind 127.0.0.2 and say B's hello; it cannot prove B's key.
    let mut spoof = RawPeer::connect(IP_B, addr);
    let (theirs, _) = spoof.handshake(IP_B, Capabilities::OURS, WRONG);
    assert_eq!(theirs.device_ip, IP_A);
    let last = spoof.read_to_close();
    assert_eq!(last.len(), PROOF_LEN, "A's proof, then the close");
    // A hello and then records instead of a proof: refused the same way.
    let mut eager = RawPeer::connect(IP_B, addr);
    eager.send(&Hello::new(IP_B).to_bytes());
    eager.send(&record(666).to_bytes().unwrap());
    let answer = eager.read_to_close();
    assert_eq!(answer.len(), HELLO_LEN + PROOF_LEN);
    // A hello and nothing more: A waits for the proof and changes nothing meanwhile.
    let mut silent = RawPeer::connect(IP_B, addr);
    silent.send(&Hello::new(IP_B).to_bytes());
    let mut hello = [0u8; HELLO_LEN];
    silent.0.read_exact(&mut hello).unwrap();

    let s = a.stats();
    let counts = (
        s.auth_failures,
        s.peers_lost,
        s.established,
        s.open_connections,
    );
    assert_eq!(counts, (2, 0, 1, 1), "{s}");
    assert_eq!(a.poll(), None, "no PeerLost and no spoofed record");
    assert_eq!(b.poll(), None, "B's connection was not touched");
    let lines = logged(&[
        &addr.to_string(),
        "refusing a connection from 127.0.0.2: its proof of the OOB secret does not match",
    ]);
    assert!(
        lines.len() >= 2 && lines[0].starts_with("ERROR"),
        "{lines:?}"
    );
    still_works(&mut a, &mut b, 70);
    drop(silent);
    still_works(&mut a, &mut b, 72);
    assert_eq!(a.stats().peers_lost + b.stats().peers_lost, 0);
}

#[test]
fn a_replayed_hello_and_proof_are_refused_and_the_recorded_connection_survives() {
    let (mut a, mut b) = pair();
    let addr = a.local_addr();
    let c = Ipv4Addr::new(127, 0, 0, 11);
    // C proves itself honestly; someone records every byte C sent.
    let mut honest = RawPeer::connect(c, addr);
    let (listener, recorded) = honest.handshake(c, Capabilities::OURS, SECRET);
    let mut proof = [0u8; PROOF_LEN];
    honest.0.read_exact(&mut proof).unwrap();
    let hellos = [&recorded[..HELLO_LEN], &listener.to_bytes()].concat();
    assert_eq!(proof, super::support::proof(SECRET, false, &hellos));
    honest.send(&record(1).to_bytes().unwrap());
    let at_a = next_event(&mut a, "C's record");
    assert_eq!(
        at_a,
        OobEvent::RecvWr {
            from: c,
            wr: record(1)
        }
    );

    // The same bytes from C's address on a new connection: A's new nonce breaks the proof.
    let mut replay = RawPeer::connect(c, addr);
    replay.send(&recorded);
    let answer = replay.read_to_close();
    assert_eq!(
        answer.len(),
        HELLO_LEN + PROOF_LEN,
        "A's hello, its proof, the close"
    );
    assert_ne!(answer[..HELLO_LEN], listener.to_bytes(), "a fresh nonce");
    let s = a.stats();
    assert_eq!((s.auth_failures, s.peers_lost), (1, 0), "{s}");
    assert_eq!(a.connected_peers(), [c]);

    // The recorded connection still carries records, and so does A-B.
    honest.send(&record(2).to_bytes().unwrap());
    let at_a = next_event(&mut a, "C's second record");
    assert_eq!(
        at_a,
        OobEvent::RecvWr {
            from: c,
            wr: record(2)
        }
    );
    still_works(&mut a, &mut b, 80);
    let needle = "refusing a connection from 127.0.0.11: its proof of the OOB secret";
    assert!(!logged(&[&addr.to_string(), needle]).is_empty());
}

#[test]
fn devices_with_different_keys_both_log_that_the_keys_differ() {
    let (mut a, b) = pair_with(|c| {
        if c.device_ip == IP_B {
            c.key = OobKey::Secret(OobSecret::new(WRONG).unwrap());
        }
    });
    send(&mut a, IP_B, &record(1));
    let lost = next_event(&mut a, "PeerLost at A");
    assert_eq!(lost, OobEvent::PeerLost { peer: IP_B });
    wait_until("B's refusal", || {
        (b.stats().auth_failures == 1).then_some(())
    });
    assert_eq!(a.stats().auth_failures, 1);
    assert_eq!(a.stats().records_dropped, 1);
    let why = "its proof of the OOB secret does not match this device's (given in the \
               configuration): the two devices use different OOB keys";
    let at_a = logged(&[&a.local_addr().to_string(), "lost 127.0.0.2", why]);
    assert!(at_a[0].starts_with("WARN"), "{at_a:?}");
    let at_b = logged(&[&b.local_addr().to_string(), "from 127.0.0.1", why]);
    assert!(at_b[0].starts_with("ERROR"), "{at_b:?}");
}

#[test]
fn a_version_1_peer_without_authentication_is_refused_naming_both_versions() {
    let (mut a, mut b) = pair();
    let addr = a.local_addr();
    let old = Ipv4Addr::new(127, 0, 0, 12);
    let mut raw = RawPeer::connect(old, addr);
    // Version 1: magic, version, reserved, capabilities, IP; 16 bytes, no nonce.
    raw.send(&hello_with_version(old, 1)[..16]);
    let reply = raw.read_to_close();
    assert_eq!(
        reply.len(),
        HELLO_LEN,
        "A's hello names version 2, then A closes"
    );
    assert_eq!(reply[4..6], [0, 2]);
    assert_eq!(a.stats().version_mismatches, 1);
    let needle = "127.0.0.12: peer speaks OOB protocol version 1, this driver speaks version 2";
    assert!(!logged(&[&addr.to_string(), needle]).is_empty());
    still_works(&mut a, &mut b, 90);
}

#[test]
fn key_files_work_when_only_their_owner_can_read_them_and_fail_bind_by_name_otherwise() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oob.key");
    std::fs::write(&path, "4f6f4221a3b6b8f1d35b1bfc8e2d0e2c\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cfg = config(IP_A, 0);
    cfg.key = OobKey::File(path.clone());
    let err = TcpOob::bind(cfg.clone()).unwrap_err();
    assert!(matches!(err, TcpOobError::Key(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(
        text.contains("mode 0644") && text.contains("chmod 600"),
        "{text}"
    );

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (mut a, mut b) = pair_with(|c| c.key = OobKey::File(path.clone()));
    still_works(&mut a, &mut b, 100);

    cfg.key = OobKey::File(dir.path().join("missing.key"));
    let text = TcpOob::bind(cfg).unwrap_err().to_string();
    assert!(text.contains("missing.key: does not exist"), "{text}");
}
