//! The ring on its own: order, wrap-around, wake-ups, and what a broken sender is told.

use super::*;

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const GEO: Geometry = Geometry {
    slots: 4,
    slot_len: 128,
};

fn id(nonce: u64) -> RingId {
    RingId {
        src: A,
        dst: B,
        port: 4791,
        nonce,
    }
}

fn pair() -> (TxRing, RxRing) {
    let tx = TxRing::create(id(7), GEO).unwrap();
    let fd = tx.fd().try_clone().unwrap();
    let rx = RxRing::open(fd, &id(7)).unwrap();
    (tx, rx)
}

fn drain(rx: &mut RxRing) -> (Vec<Vec<u8>>, u64) {
    let mut scratch = vec![0u8; GEO.max_frame()];
    let mut got = Vec::new();
    let (_, bad) = rx
        .pop(u64::MAX, &mut scratch, &mut |f| got.push(f.to_vec()))
        .unwrap();
    (got, bad)
}

#[test]
fn frames_wrap_around_the_ring_in_order() {
    let (mut tx, mut rx) = pair();
    rx.acknowledge();
    assert!(tx.attached());
    let mut expect = Vec::new();
    for round in 0u8..5 {
        assert_eq!(tx.free_slots().unwrap(), 4);
        for k in 0..3u8 {
            let frame = vec![round * 10 + k; 1 + usize::from(k) * 50];
            assert!(tx.push(&frame));
            expect.push(frame);
        }
        assert_eq!(rx.pending().unwrap(), 0, "nothing visible before publish");
        assert!(!tx.publish());
        assert_eq!(drain(&mut rx), (expect.split_off(0), 0));
    }
    assert!(!tx.push(&[0; 121]), "longer than a slot");
    assert!(!tx.push(&[]), "empty");
}

#[test]
fn a_full_ring_refuses_until_the_receiver_moves_its_tail() {
    let (mut tx, mut rx) = pair();
    for k in 0..4u8 {
        assert!(tx.push(&[k]), "slot {k} is free");
    }
    assert!(!tx.has_room().unwrap());
    assert!(!tx.push(&[9]), "no fifth frame in four slots");
    tx.publish();
    assert_eq!(drain(&mut rx), ((0..4u8).map(|k| vec![k]).collect(), 0));
    assert!(tx.has_room().unwrap(), "the tail moved: room again");
    assert!(tx.push(&[4]));
    tx.publish();
    assert_eq!(drain(&mut rx), (vec![vec![4]], 0));
}

#[test]
fn a_sleeping_receiver_is_woken_once() {
    let (mut tx, rx) = pair();
    assert!(!rx.set_sleeping(true));
    assert!(tx.push(&[1]));
    assert!(tx.publish(), "the receiver slept");
    assert!(!tx.publish(), "one wake-up per sleep");
    assert!(rx.set_sleeping(true), "a frame waits: do not sleep");
}

#[test]
fn bad_lengths_and_indices_are_reported_not_followed() {
    let (mut tx, mut rx) = pair();
    assert!(tx.push(&[1, 2, 3]));
    assert!(tx.push(&[4]));
    tx.publish();
    // Slot 0 claims 4096 bytes, more than a slot.
    assert!(tx.write_raw(HEADER_LEN, &4096u32.to_ne_bytes()));
    assert_eq!(drain(&mut rx), (vec![vec![4]], 1));
    // A head far beyond the tail.
    assert!(tx.write_raw(OFF_HEAD, &1000u64.to_ne_bytes()));
    assert!(matches!(
        rx.pending(),
        Err(RingError::Corrupt { head: 1000, .. })
    ));
    // A tail ahead of the sender's head.
    let (mut tx, rx) = pair();
    assert!(tx.write_raw(OFF_TAIL, &9u64.to_ne_bytes()));
    assert!(tx.free_slots().is_err());
    drop(rx);
}

#[test]
fn open_checks_the_header_against_the_announcement() {
    let tx = TxRing::create(id(7), GEO).unwrap();
    let open = |expected: RingId| RxRing::open(tx.fd().try_clone().unwrap(), &expected);
    let err = open(id(8)).unwrap_err();
    assert!(err.to_string().contains("announced as"), "{err}");
    assert!(tx.write_raw(OFF_VERSION, &2u32.to_ne_bytes()));
    assert!(open(id(7)).unwrap_err().to_string().contains("version 2"));
    assert!(tx.write_raw(OFF_VERSION, &VERSION.to_ne_bytes()));
    assert!(tx.write_raw(OFF_SLOT_COUNT, &8u32.to_ne_bytes()));
    let err = open(id(7)).unwrap_err().to_string();
    assert!(err.contains("expected"), "{err}");
    assert!(tx.write_raw(OFF_SLOT_COUNT, &3u32.to_ne_bytes()));
    let err = open(id(7)).unwrap_err().to_string();
    assert!(err.contains("outside the limits"), "{err}");
}

#[test]
fn an_unsealed_memfd_is_refused() {
    let name = CString::new("x").unwrap();
    // SAFETY: a NUL-terminated name that outlives the call.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone().unwrap())
        .set_len(GEO.check().unwrap() as u64)
        .unwrap();
    let err = RxRing::open(fd, &id(7)).unwrap_err();
    assert!(err.to_string().contains("not sealed"), "{err}");
}
