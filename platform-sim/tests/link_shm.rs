//! The shared-memory link ([`bluerdma_sim::link::shm`]) between cards of this host: frames
//! move through rings once both ends have one, over UDP to everyone else; a sleeping
//! receiver is woken; a card that goes away is noticed and replaced; faults and capture
//! work on it; and nothing a hostile peer puts in a ring or on a bell makes it misbehave.
//!
//! Each test has its own bell directory under /dev/shm and its own UDP port (chosen by the
//! kernel), so tests running at once never meet.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bluerdma_sim::link::shm::bell::{bell_path, namespace_dir, BellMsg, PeerBell};
use bluerdma_sim::link::shm::ring::{Geometry, RingId, RxRing, TxRing, HEADER_LEN};
use bluerdma_sim::link::{
    CaptureDirection, CapturingLink, FaultConfig, FaultyLink, LinkPort, PcapSink, ShmConfig,
    ShmLink, UdpLink, UdpLinkConfig,
};
use proptest::prelude::*;

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 1);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 2);
const C: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 3);
/// The failsafe of every wait: far beyond anything the test needs, so that a broken link
/// fails the test instead of hanging it.
const FAILSAFE: Duration = Duration::from_secs(60);

/// A bell directory of its own, removed when dropped.
struct TestDir(PathBuf);

impl TestDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Self(PathBuf::from(format!(
            "/dev/shm/bluerdma-link-test-{}-{n}",
            std::process::id()
        )))
    }

    fn cfg(&self) -> ShmConfig {
        ShmConfig {
            probe_every: Duration::from_millis(5),
            retry: Duration::from_millis(5),
            ..ShmConfig::in_dir(&self.0)
        }
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A frame from `src` to `dst` whose last four bytes are `n`: the link routes by bytes
/// 30..33 only.
fn frame(src: Ipv4Addr, dst: Ipv4Addr, n: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(38)];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[26..30].copy_from_slice(&src.octets());
    f[30..34].copy_from_slice(&dst.octets());
    for (i, b) in f.iter_mut().enumerate().skip(34) {
        *b = (i as u32).wrapping_mul(31).wrapping_add(n) as u8;
    }
    let end = f.len();
    f[end - 4..].copy_from_slice(&n.to_be_bytes());
    f
}

fn number(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[f.len() - 4..].try_into().unwrap())
}

/// UDP ports on one kernel-chosen port for each address, the first `shm` of them with
/// bells as `cfg` says.
fn cards(cfg: &ShmConfig, ips: &[Ipv4Addr], shm: usize) -> (Vec<ShmLink>, Vec<UdpLink>) {
    for _ in 0..20 {
        let first = UdpLink::bind(UdpLinkConfig::new(ips[0]).with_port(0)).expect("bind");
        let port = first.local_addr().port();
        let mut udp = vec![first];
        for ip in &ips[1..] {
            match UdpLink::bind(UdpLinkConfig::new(*ip).with_port(port)) {
                Ok(l) => udp.push(l),
                Err(_) => break,
            }
        }
        if udp.len() < ips.len() {
            continue;
        }
        let plain = udp.split_off(shm);
        let with_shm = udp
            .into_iter()
            .map(|u| {
                ShmLink::over(u, cfg.clone())
                    .map_err(|(_, e)| e)
                    .expect("bell")
            })
            .collect();
        return (with_shm, plain);
    }
    panic!("no UDP port free on every address");
}

/// Receives until `want` frames have arrived (or the failsafe).
fn recv_n(port: &mut dyn LinkPort, want: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + FAILSAFE;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        port.recv_frames(Duration::from_millis(20), &mut |f| got.push(f.to_vec()))
            .unwrap();
    }
    got
}

/// Sends numbered frames from `a` to `dst` one at a time (receiving them at `b`) until
/// one arrives through shared memory; returns how many were sent.
fn until_shm(a: &mut ShmLink, b: &mut dyn LinkPort, src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
    let deadline = Instant::now() + FAILSAFE;
    let mut n = 0;
    while b.stats().snapshot().shm_frames_received == 0 {
        assert!(
            Instant::now() < deadline,
            "no frame came through shared memory"
        );
        a.send_frames(&[&frame(src, dst, n, 100)]).unwrap();
        n += 1;
        recv_n(b, 1);
    }
    n
}

#[test]
fn frames_move_to_the_ring_intact_and_in_order_after_the_first_ones() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    let sent = until_shm(&mut a, &mut b, A, B);
    assert_eq!(a.peers().sending, [B]);
    assert_eq!(b.peers().receiving, [A]);
    // Every size up to a full slot, in batches, both ways.
    let sizes = [38usize, 60, 1000, 4096, 4192, 4344];
    let to_b: Vec<Vec<u8>> = (0..2000u32)
        .map(|n| frame(A, B, 1000 + n, sizes[n as usize % sizes.len()]))
        .collect();
    for batch in to_b.chunks(37) {
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        a.send_frames(&refs).unwrap();
        // Keep the ring from filling: this test is about order, not back-pressure.
        let got = recv_n(&mut b, batch.len());
        assert_eq!(got, batch, "frames changed or out of order");
    }
    b.send_frames(&[&frame(B, A, 7, 64)]).unwrap();
    assert_eq!(recv_n(&mut a, 1), [frame(B, A, 7, 64)]);
    let (sa, sb) = (a.stats().snapshot(), b.stats().snapshot());
    assert!(sa.shm_frames_sent >= 2000, "{sa:?}");
    assert_eq!(sb.frames_received, u64::from(sent) + 2000, "{sb:?}");
    assert_eq!((sb.bad_datagrams, sb.rx_queue_drops), (0, 0), "{sb:?}");
}

#[test]
fn a_sleeping_receiver_is_woken_by_the_first_frame() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    until_shm(&mut a, &mut b, A, B);
    let waiter = std::thread::spawn(move || {
        let mut got = Vec::new();
        let start = Instant::now();
        // Waits of the whole failsafe: a wake-up ends one early. A bell message that is not
        // a frame (the peer's probe, every 5 ms here) may end one with nothing received,
        // so the receiver waits again (this failed once in ci: nothing received).
        while got.is_empty() && start.elapsed() < FAILSAFE {
            b.recv_frames(FAILSAFE - start.elapsed(), &mut |f| got.push(f.to_vec()))
                .unwrap();
        }
        (got, start.elapsed(), b)
    });
    // Give the receiver time to fall asleep; the test is correct either way.
    std::thread::sleep(Duration::from_millis(50));
    a.send_frames(&[&frame(A, B, 99, 200)]).unwrap();
    let (got, waited, b) = waiter.join().unwrap();
    assert_eq!(got, [frame(A, B, 99, 200)]);
    assert!(waited < FAILSAFE, "the receiver was not woken");
    assert!(b.stats().snapshot().shm_frames_received >= 2);
}

#[test]
fn cards_without_a_bell_and_frames_too_large_go_over_udp() {
    let dir = TestDir::new();
    let (mut shm, mut plain) = cards(&dir.cfg(), &[A, B, C], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    let mut c = plain.pop().unwrap();
    until_shm(&mut a, &mut b, A, B);
    // One call to both: B's through the ring, C's (a plain UDP card) over UDP.
    let big = frame(A, B, 5, 9000);
    let frames = [frame(A, C, 1, 300), frame(A, B, 2, 300), big.clone()];
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    a.send_frames(&refs).unwrap();
    assert_eq!(recv_n(&mut c, 1), [frame(A, C, 1, 300)]);
    let mut at_b = recv_n(&mut b, 2);
    at_b.sort_by_key(|f| number(f));
    assert_eq!(at_b, [frame(A, B, 2, 300), big]);
    // C answers over UDP; A, waiting on its ring and its socket at once, takes it.
    c.send_frames(&[&frame(C, A, 3, 80)]).unwrap();
    assert_eq!(recv_n(&mut a, 1), [frame(C, A, 3, 80)]);
    assert_eq!(a.peers().sending, [B], "no ring to a card without a bell");
    assert!(c.stats().snapshot().datagrams_received >= 1);
}

/// One batch whose frames alternate between two ring destinations in runs of different
/// lengths: each destination gets exactly its frames, in order, all through its ring.
#[test]
fn a_batch_to_two_cards_in_runs_reaches_each_in_order() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B, C], 3);
    let (mut c, mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap(), shm.pop().unwrap());
    until_shm(&mut a, &mut b, A, B);
    until_shm(&mut a, &mut c, A, C);
    let (b0, c0) = (
        b.stats().snapshot().shm_frames_received,
        c.stats().snapshot().shm_frames_received,
    );
    let dsts = [B, B, C, C, C, B, C, B, B, B, C];
    let frames: Vec<Vec<u8>> = dsts
        .iter()
        .enumerate()
        .map(|(n, &d)| frame(A, d, 500 + n as u32, 100 + 50 * n))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    a.send_frames(&refs).unwrap();
    let want = |d: Ipv4Addr| -> Vec<Vec<u8>> {
        frames
            .iter()
            .zip(dsts)
            .filter(|(_, x)| *x == d)
            .map(|(f, _)| f.clone())
            .collect()
    };
    assert_eq!(recv_n(&mut b, 6), want(B), "B's frames, in order");
    assert_eq!(recv_n(&mut c, 5), want(C), "C's frames, in order");
    assert_eq!(b.stats().snapshot().shm_frames_received - b0, 6);
    assert_eq!(c.stats().snapshot().shm_frames_received - c0, 5);
}

#[test]
fn a_card_that_goes_away_is_noticed_and_its_successor_gets_a_new_ring() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    let port = a.udp().local_addr().port();
    let mut b = b;
    until_shm(&mut a, &mut b, A, B);
    drop(b);
    // A notices at its next probe (or its next wake-up) and goes back to UDP.
    let deadline = Instant::now() + FAILSAFE;
    while !a.peers().sending.is_empty() {
        assert!(Instant::now() < deadline, "A never noticed B had gone");
        a.send_frames(&[&frame(A, B, 0, 64)]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut b2 = ShmLink::bind(UdpLinkConfig::new(B).with_port(port), dir.cfg()).unwrap();
    until_shm(&mut a, &mut b2, A, B);
    assert_eq!(a.peers().sending, [B]);
    // And the other way: B2 notices A's departure by its closed ring.
    drop(a);
    let deadline = Instant::now() + FAILSAFE;
    while !b2.peers().receiving.is_empty() {
        assert!(Instant::now() < deadline, "B never let A's ring go");
        b2.recv_frames(Duration::from_millis(1), &mut |_| {})
            .unwrap();
    }
}

#[test]
fn a_full_ring_drops_at_the_receiver_and_counts_it() {
    let dir = TestDir::new();
    let geometry = Geometry {
        slots: 16,
        slot_len: 256,
    };
    let cfg = ShmConfig {
        geometry,
        full_wait: Duration::from_millis(1),
        ..dir.cfg()
    };
    let (mut shm, _) = cards(&cfg, &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    until_shm(&mut a, &mut b, A, B);
    let frames: Vec<Vec<u8>> = (0..40).map(|n| frame(A, B, n, 100)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    a.send_frames(&refs).unwrap();
    let got = recv_n(&mut b, 16);
    assert_eq!(got, frames[..16], "the first 16 fill the ring, in order");
    let s = b.stats().snapshot();
    assert_eq!(s.rx_queue_drops, 24, "{s:?}");
}

#[test]
fn faults_and_capture_stack_on_the_shared_memory_link() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    until_shm(&mut a, &mut b, A, B);
    let pcap = std::env::temp_dir().join(format!("link_shm_{}.pcap", std::process::id()));
    let sink = PcapSink::create(&pcap).unwrap();
    let faults = FaultConfig {
        duplicate: 1.0,
        ..FaultConfig::none()
    };
    let mut a = CapturingLink::new(
        FaultyLink::new(a, faults).unwrap(),
        sink.clone(),
        CaptureDirection::Transmit,
    );
    let frames: Vec<Vec<u8>> = (0..10).map(|n| frame(A, B, n, 500)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    // Through the port and through a second handle, as the card's two threads send.
    a.send_frames(&refs[..5]).unwrap();
    a.sender().unwrap().send_frames(&refs[5..]).unwrap();
    let got = recv_n(&mut b, 20);
    let mut expect: Vec<Vec<u8>> = frames.iter().flat_map(|f| [f.clone(), f.clone()]).collect();
    let mut got_sorted = got.clone();
    got_sorted.sort_by_key(|f| number(f));
    expect.sort_by_key(|f| number(f));
    assert_eq!(got_sorted, expect, "every frame twice");
    let s = b.stats().snapshot();
    assert!(s.shm_frames_received >= 20, "{s:?}");
    assert_eq!(a.stats().snapshot().frames_duplicated, 10);
    sink.flush().unwrap();
    assert_eq!(
        sink.frames().unwrap(),
        10,
        "capture sees what the card sent"
    );
    let _ = std::fs::remove_file(&pcap);
}

/// Passes `ring` to the bell of the card at `dst` as if `src` had made it.
fn pass_ring(dir: &TestDir, dst: Ipv4Addr, port: u16, src: Ipv4Addr, ring: &TxRing) {
    let ns = namespace_dir(&dir.0).unwrap();
    let bell = PeerBell::connect(&bell_path(&ns, dst, port)).unwrap();
    let msg = BellMsg::Attach {
        src,
        nonce: ring.id().nonce,
    };
    bell.send(msg, Some(ring.fd().as_fd())).unwrap();
}

#[test]
fn hostile_rings_and_messages_are_counted_and_change_nothing() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    let port = b.udp().local_addr().port();
    let geometry = ShmConfig::default().geometry;
    // A ring that claims to be for another card, and garbage datagrams on the bell.
    let wrong = TxRing::create(
        RingId {
            src: A,
            dst: C,
            port,
            nonce: 1,
        },
        geometry,
    )
    .unwrap();
    pass_ring(&dir, B, port, A, &wrong);
    let raw = UnixDatagram::unbound().unwrap();
    let path = b.bell_path().to_owned();
    for junk in [
        &b"BLSM\x01\x09\0\0"[..],
        b"",
        b"hello world, this is not a bell",
    ] {
        raw.send_to(junk, &path).unwrap();
    }
    recv_n(&mut b, 0);
    b.recv_frames(Duration::from_millis(1), &mut |_| {})
        .unwrap();
    assert_eq!(b.stats().snapshot().bad_datagrams, 4);
    assert!(b.peers().receiving.is_empty());
    // A real ring whose sender then writes garbage: lengths, then indices.
    until_shm(&mut a, &mut b, A, B);
    let good = TxRing::create(
        RingId {
            src: A,
            dst: B,
            port,
            nonce: 77,
        },
        geometry,
    )
    .unwrap();
    pass_ring(&dir, B, port, A, &good);
    let deadline = Instant::now() + FAILSAFE;
    while !good.attached() {
        assert!(Instant::now() < deadline);
        b.recv_frames(Duration::from_millis(1), &mut |_| {})
            .unwrap();
    }
    assert!(good.write_raw(HEADER_LEN, &60_000u32.to_ne_bytes()));
    assert!(good.write_raw(128, &1u64.to_ne_bytes()));
    let before = b.stats().snapshot().bad_datagrams;
    b.recv_frames(Duration::from_millis(1), &mut |_| panic!("no frame"))
        .unwrap();
    assert_eq!(b.stats().snapshot().bad_datagrams, before + 1, "the slot");
    assert!(good.write_raw(128, &u64::MAX.to_ne_bytes()));
    b.recv_frames(Duration::from_millis(1), &mut |_| panic!("no frame"))
        .unwrap();
    assert_eq!(b.stats().snapshot().bad_datagrams, before + 2, "the ring");
    assert!(b.peers().receiving.is_empty(), "a corrupt ring is let go");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever a sender writes over a ring's header and slots, taking and reading it
    /// fails cleanly or yields frames that fit their slots.
    #[test]
    fn garbage_in_a_ring_never_panics(
        writes in proptest::collection::vec(
            (0usize..HEADER_LEN + 4 * 256, proptest::collection::vec(any::<u8>(), 1..16)),
            0..24,
        ),
        head in any::<u64>(),
        before_open in any::<bool>(),
    ) {
        let geometry = Geometry { slots: 4, slot_len: 256 };
        let id = RingId { src: A, dst: B, port: 1, nonce: 3 };
        let tx = TxRing::create(id, geometry).unwrap();
        let scribble = || {
            for (off, bytes) in &writes {
                tx.write_raw(*off, bytes);
            }
            tx.write_raw(128, &(head % 8).to_ne_bytes());
        };
        if before_open {
            scribble();
        }
        let Ok(mut rx) = RxRing::open(tx.fd().try_clone().unwrap(), &id) else {
            return Ok(());
        };
        if !before_open {
            scribble();
        }
        let mut scratch = vec![0u8; geometry.max_frame()];
        if let Ok((n, bad)) = rx.pop(u64::MAX, &mut scratch, &mut |f| {
            assert!(!f.is_empty() && f.len() <= 248);
        }) {
            prop_assert!(n as u64 + bad <= 4);
        }
        let _ = rx.pending();
    }

    #[test]
    fn garbage_on_a_bell_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..40),
        valid_start in any::<bool>(),
        fds in 0usize..3,
    ) {
        let mut msg = if valid_start { b"BLSM\x01".to_vec() } else { Vec::new() };
        msg.extend_from_slice(&bytes);
        if let Ok(m) = BellMsg::parse(&msg, fds) {
            let (enc, len) = m.encode();
            prop_assert_eq!(&enc[..len], &msg[..]);
        }
    }
}

#[test]
fn a_sender_whose_ring_was_let_go_attaches_a_new_one() {
    let dir = TestDir::new();
    let (mut shm, _) = cards(&dir.cfg(), &[A, B], 2);
    let (mut b, mut a) = (shm.pop().unwrap(), shm.pop().unwrap());
    let port = b.udp().local_addr().port();
    until_shm(&mut a, &mut b, A, B);
    // B takes another ring "from A": it lets A's real one go.
    let other = TxRing::create(
        RingId {
            src: A,
            dst: B,
            port,
            nonce: 5,
        },
        ShmConfig::default().geometry,
    )
    .unwrap();
    pass_ring(&dir, B, port, A, &other);
    let deadline = Instant::now() + FAILSAFE;
    while !other.attached() {
        assert!(Instant::now() < deadline);
        b.recv_frames(Duration::from_millis(1), &mut |_| {})
            .unwrap();
    }
    // A's frames are not lost in a ring nobody reads: A notices and passes a new ring.
    let before = b.stats().snapshot().shm_frames_received;
    let mut n = 0;
    while b.stats().snapshot().shm_frames_received == before {
        assert!(
            Instant::now() < deadline,
            "A kept writing into a ring B let go"
        );
        a.send_frames(&[&frame(A, B, n, 64)]).unwrap();
        n += 1;
        b.recv_frames(Duration::from_millis(1), &mut |_| {})
            .unwrap();
    }
    assert!(!other.attached(), "the impostor's ring was let go in turn");
    assert_eq!(a.peers().sending, [B]);
}
