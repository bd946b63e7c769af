//! An ACK or NAK frame as the driver receives it (core/src/wire/ack.rs): the 90-byte
//! driver form or the card's 96-byte NAK. A parsed frame re-emits byte for byte (but for
//! bytes the parser ignores), and a driver's ACK/NAK rebuilt from what was read
//! ([`DriverAckFrame`]) parses to the same kind and verdict.
#![no_main]

use bluerdma_core::wire::{AckKind, DriverAckFrame, PacketHeaders, ReceivedAck, RocePacket};
use bluerdma_fuzz::{check_frame_bytes, refresh_ipv4_checksum};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let Ok(ack) = ReceivedAck::parse(frame) else {
        return;
    };
    let mut headers = PacketHeaders::new(ack.bth);
    headers.aeth = Some(ack.aeth);
    headers.nreth = ack.nreth;
    let packet = RocePacket {
        envelope: ack.envelope,
        headers,
    };
    let mut out = vec![0u8; 128];
    let n = packet
        .emit_frame(&[], &mut out)
        .unwrap_or_else(|e| panic!("parsed {ack:?} does not emit: {e}"));
    out.truncate(n);
    check_frame_bytes(
        "ACK frame",
        frame,
        &ack,
        &out,
        |f| ReceivedAck::parse(f).ok(),
        refresh_ipv4_checksum,
    );

    if let Some(verdict) = ack.driver_verdict() {
        let rebuilt = DriverAckFrame {
            src_mac: ack.envelope.src_mac,
            dst_mac: ack.envelope.dst_mac,
            src_ip: ack.envelope.src_ip,
            dst_ip: ack.envelope.dst_ip,
            dqpn: ack.bth.dqpn,
            psn: ack.bth.psn,
            verdict,
        };
        let mut out = [0u8; 128];
        let n = rebuilt
            .emit(&mut out)
            .unwrap_or_else(|e| panic!("{rebuilt:?} does not emit: {e}"));
        let back = ReceivedAck::parse(&out[..n]).expect("a driver ACK frame parses");
        assert_eq!(
            back.driver_verdict(),
            Some(verdict),
            "verdict of {rebuilt:?}"
        );
        assert_eq!(back.kind(), ack.kind());
        assert!(matches!(
            back.kind(),
            AckKind::DriverAck | AckKind::DriverNak
        ));
        assert_eq!((back.bth.dqpn, back.bth.psn), (ack.bth.dqpn, ack.bth.psn));
    }
});
