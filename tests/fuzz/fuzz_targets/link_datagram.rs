//! The emulated link's UDP datagram (platform-sim/src/link/datagram.rs): several frames in
//! one datagram from another card. A datagram that parses is rebuilt, frame by frame, by
//! [`DatagramBuilder`] into exactly its bytes.
#![no_main]

use bluerdma_sim::link::datagram::{DatagramBuilder, DatagramFrames, MAX_UDP_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(frames) = DatagramFrames::parse(data) else {
        return;
    };
    assert!(!frames.is_empty());
    let list: Vec<&[u8]> = frames.iter().collect();
    assert_eq!(list.len(), frames.len(), "iter stopped early");
    if data.len() > MAX_UDP_PAYLOAD {
        return; // cannot come from a socket, nor be built
    }
    let mut b = DatagramBuilder::new(MAX_UDP_PAYLOAD);
    for f in &list {
        assert!(
            b.push(f),
            "a parsed frame of {} bytes does not fit again",
            f.len()
        );
    }
    assert_eq!(b.bytes(), data, "rebuilt datagram differs");
});
