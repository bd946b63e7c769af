//! A whole RoCE frame as a card sends it (core/src/wire/packet.rs: Ethernet, IPv4, UDP, the
//! RDMA header area, filler, payload). A parsed frame re-emits, with its payload, to a frame
//! of the same length that parses to the same packet and payload; every byte the emitter
//! changed is one the parser ignores.
#![no_main]

use bluerdma_core::wire::RocePacket;
use bluerdma_fuzz::{check_frame_bytes, refresh_ipv4_checksum};
use libfuzzer_sys::fuzz_target;

fn parse(frame: &[u8]) -> Option<(RocePacket, Vec<u8>)> {
    let (packet, range) = RocePacket::parse_frame(frame).ok()?;
    let payload = frame.get(range).expect("payload range inside the frame");
    Some((packet, payload.to_vec()))
}

fuzz_target!(|frame: &[u8]| {
    let Some((packet, payload)) = parse(frame) else {
        return;
    };
    assert_eq!(
        packet.frame_len(payload.len()),
        frame.len(),
        "frame_len of {packet:?}"
    );
    let mut out = vec![0u8; frame.len()];
    let n = packet
        .emit_frame(&payload, &mut out)
        .unwrap_or_else(|e| panic!("parsed {packet:?} does not emit: {e}"));
    out.truncate(n);
    check_frame_bytes(
        "RoCE frame",
        frame,
        &(packet, payload),
        &out,
        parse,
        refresh_ipv4_checksum,
    );
});
