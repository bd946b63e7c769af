//! A UD frame as the driver reads it from the simple-NIC RX ring (core/src/wire/ud.rs). A
//! parsed frame re-emits around its payload to a frame that parses to the same headers and
//! payload; without pad bytes it has the input's length and every byte the emitter changed
//! is one the parser ignores (the IPv4 checksum and the ICRC recomputed after a change).
#![no_main]

use bluerdma_core::wire::ud::{icrc, ICRC_LEN};
use bluerdma_core::wire::UdFrame;
use bluerdma_fuzz::{check_frame_bytes, refresh_ipv4_checksum};
use libfuzzer_sys::fuzz_target;

fn parse(frame: &[u8]) -> Option<(UdFrame, Vec<u8>)> {
    let (ud, range) = UdFrame::parse(frame).ok()?;
    let payload = frame.get(range).expect("payload range inside the frame");
    Some((ud, payload.to_vec()))
}

fn refresh(frame: &mut [u8]) {
    refresh_ipv4_checksum(frame);
    if let Some(end) = frame.len().checked_sub(ICRC_LEN).filter(|&e| e >= 14) {
        let crc = icrc(&frame[14..end]);
        frame[end..].copy_from_slice(&crc.to_le_bytes());
    }
}

fuzz_target!(|frame: &[u8]| {
    let Some((ud, payload)) = parse(frame) else {
        return;
    };
    let len = ud.frame_len(payload.len());
    let mut out = vec![0u8; len];
    out[ud.header_len()..ud.header_len() + payload.len()].copy_from_slice(&payload);
    let n = ud
        .emit(&mut out, payload.len())
        .unwrap_or_else(|e| panic!("parsed {ud:?} does not emit: {e}"));
    assert_eq!(n, len);
    let pad = usize::from((frame.get(43).copied().unwrap_or(0) >> 4) & 3);
    if pad != 0 {
        // PadCnt is 0 on emit: the frame is shorter, the datagram the same.
        assert_eq!(parse(&out), Some((ud, payload)), "re-emitted {out:02x?}");
        return;
    }
    check_frame_bytes("UD frame", frame, &(ud, payload), &out, parse, refresh);
});
