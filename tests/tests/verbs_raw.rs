//! Raw frames through the simple NIC, end to end on two emulated NICs: `Context::send_raw`
//! on one side, `Context::set_raw_handler` on the other (the ring the card fills with every
//! frame whose UDP destination port is not 4791, nic-behaviour.md 2.1 and 5.5). Without a
//! handler the frames are drained and counted as dropped, so the card keeps receiving.

use std::time::{Duration, Instant};

use bluerdma_core::engine::VerbsError;
use bluerdma_core::wire::ud::{UD_MAX_FRAME, UD_MAX_PAYLOAD};
use bluerdma_tests::raw::{collect_raw as collect, send_raw as send, ud_frame, WAIT};
use bluerdma_tests::{two_devices, IP0, IP1};

/// A UD frame from IP0 to IP1 with `len` payload bytes numbered from `seed`.
fn frame(seed: u8, len: usize) -> Vec<u8> {
    ud_frame(IP0, IP1, seed, len)
}

#[test]
fn frames_reach_the_handler_whole_and_in_order() {
    let (a, b) = two_devices();
    let rx = collect(&b);
    let mut sent = Vec::new();
    for (i, len) in [0, 1, 1000, UD_MAX_PAYLOAD].into_iter().enumerate() {
        sent.push(frame(i as u8, len));
    }
    for i in 0..300u32 {
        sent.push(frame(i as u8, (i as usize * 7) % UD_MAX_PAYLOAD));
    }
    for f in &sent {
        send(&a, f);
    }
    for (i, want) in sent.iter().enumerate() {
        let got = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("frame {i} of {} did not arrive", sent.len()));
        assert!(
            got == *want,
            "frame {i}: got {} bytes {:02x?}, want {} bytes {:02x?}",
            got.len(),
            &got[..got.len().min(80)],
            want.len(),
            &want[..want.len().min(80)]
        );
    }
    assert_eq!(frame(0, UD_MAX_PAYLOAD).len(), UD_MAX_FRAME - 4);
    let s = b.stats();
    assert_eq!(
        (s.raw_frames, s.raw_dropped, s.raw_bad),
        (sent.len() as u64, 0, 0)
    );
    assert_eq!(a.stats().raw_sent, sent.len() as u64);
}

#[test]
fn oversized_and_empty_frames_are_refused() {
    let (a, _b) = two_devices();
    for len in [0, UD_MAX_FRAME + 1] {
        let e = a.send_raw(&vec![0u8; len]).unwrap_err();
        assert!(
            matches!(e.kind, VerbsError::InvalidArgument { .. }),
            "{len}: {e}"
        );
    }
    a.send_raw(&[0u8; UD_MAX_FRAME]).unwrap();
}

#[test]
fn without_a_handler_frames_are_dropped_and_counted() {
    let (a, b) = two_devices();
    for i in 0..20 {
        send(&a, &frame(i, 100));
    }
    let deadline = Instant::now() + WAIT;
    while b.stats().raw_dropped < 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = b.stats();
    assert_eq!((s.raw_frames, s.raw_dropped), (20, 20));
    // A handler set later sees the frames that come after it, not the dropped ones.
    let rx = collect(&b);
    send(&a, &frame(99, 5));
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), frame(99, 5));
    assert!(rx.try_recv().is_err());
    b.set_raw_handler(None);
    send(&a, &frame(1, 5));
    let deadline = Instant::now() + WAIT;
    while b.stats().raw_dropped < 21 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.stats().raw_dropped, 21);
}

#[test]
fn each_frame_reaches_the_handler_once_while_another_thread_holds_the_device() {
    // The progress thread hands frames over after releasing the device lock; a round in
    // which the lock was busy handed the previous round's frames over again (a UD receiver
    // got a datagram twice). Another thread polling the device keeps the lock busy.
    let (a, b) = two_devices();
    let rx = collect(&b);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        let (b, stop2) = (&b, stop.clone());
        s.spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                b.poll();
            }
        });
        let sent: Vec<Vec<u8>> = (0..400u32)
            .map(|i| frame(i as u8, 1 + i as usize))
            .collect();
        for f in &sent {
            send(&a, f);
            std::thread::yield_now();
        }
        for (i, want) in sent.iter().enumerate() {
            let got = rx
                .recv_timeout(WAIT)
                .unwrap_or_else(|_| panic!("frame {i} of {} did not arrive", sent.len()));
            assert!(
                got == *want,
                "frame {i}: another frame (or a copy) came instead"
            );
        }
        // Nothing more: no frame was handed over twice.
        let extra = rx.recv_timeout(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(extra.is_err(), "a frame reached the handler twice");
    });
}
