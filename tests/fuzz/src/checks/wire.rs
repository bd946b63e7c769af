//! The wire targets: frames from a peer card or driver (core/src/wire).

use std::fmt::Debug;

use bluerdma_core::wire::ipv4::ipv4_checksum;
use bluerdma_core::wire::ud::{icrc, ICRC_LEN};
use bluerdma_core::wire::{
    AckKind, Aeth, Bth, Deth, DriverAckFrame, EthernetHeader, Header, Ieth, ImmDt, Ipv4Header,
    Nreth, PacketHeaders, ReceivedAck, Reth, RocePacket, Rreth, UdFrame, UdpHeader,
};

use super::{check_frame_bytes, refresh_ipv4_checksum};

fn check_header<H: Header + PartialEq + Debug>(bytes: &[u8], refresh: fn(&mut [u8])) {
    let Ok((h, rest)) = H::parse(bytes) else {
        return;
    };
    let kind = H::KIND;
    let mut out = bytes.to_vec();
    let n = h
        .emit(&mut out)
        .unwrap_or_else(|e| panic!("{kind}: parsed {h:?} does not emit: {e}"));
    assert_eq!(n, H::LEN, "{kind}: emitted length");
    let parse = |b: &[u8]| H::parse(b).ok().map(|(h, rest)| (h, rest.to_vec()));
    let want = Some((h, rest.to_vec()));
    assert_eq!(parse(&out), want, "{kind}: {out:02x?} parses differently");
    for i in 0..H::LEN {
        if out[i] == bytes[i] {
            continue;
        }
        let mut t = bytes.to_vec();
        t[i] = out[i];
        refresh(&mut t);
        assert_eq!(
            parse(&t),
            want,
            "{kind}: byte {i} is read by the parser but not re-emitted (input {bytes:02x?})"
        );
    }
}

fn no_checksum(_: &mut [u8]) {}

fn ipv4_refresh(b: &mut [u8]) {
    let mut h = [0u8; 20];
    h.copy_from_slice(&b[..20]);
    b[10..12].copy_from_slice(&ipv4_checksum(&h).to_be_bytes());
}

/// Every wire header on its own (core/src/wire): the first byte picks Ethernet, IPv4, UDP,
/// BTH, RETH, RRETH, ImmDt, IETH, AETH, NRETH or DETH, the rest is parsed as that header.
/// A parsed header emits, the emitted bytes parse to the same header with the same bytes
/// after it, and every byte the emitter changed is one the parser ignores.
pub fn wire_headers(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 11 {
        0 => check_header::<EthernetHeader>(bytes, no_checksum),
        1 => check_header::<Ipv4Header>(bytes, ipv4_refresh),
        2 => check_header::<UdpHeader>(bytes, no_checksum),
        3 => check_header::<Bth>(bytes, no_checksum),
        4 => check_header::<Reth>(bytes, no_checksum),
        5 => check_header::<Rreth>(bytes, no_checksum),
        6 => check_header::<ImmDt>(bytes, no_checksum),
        7 => check_header::<Ieth>(bytes, no_checksum),
        8 => check_header::<Aeth>(bytes, no_checksum),
        9 => check_header::<Nreth>(bytes, no_checksum),
        _ => check_header::<Deth>(bytes, no_checksum),
    }
}

fn parse_roce(frame: &[u8]) -> Option<(RocePacket, Vec<u8>)> {
    let (packet, range) = RocePacket::parse_frame(frame).ok()?;
    let payload = frame.get(range).expect("payload range inside the frame");
    Some((packet, payload.to_vec()))
}

/// A whole RoCE frame as a card sends it (core/src/wire/packet.rs: Ethernet, IPv4, UDP, the
/// RDMA header area, filler, payload). A parsed frame re-emits, with its payload, to a frame
/// of the same length that parses to the same packet and payload; every byte the emitter
/// changed is one the parser ignores.
pub fn wire_frame(frame: &[u8]) {
    let Some((packet, payload)) = parse_roce(frame) else {
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
        parse_roce,
        refresh_ipv4_checksum,
    );
}

/// An ACK or NAK frame as the driver receives it (core/src/wire/ack.rs): the 90-byte
/// driver form or the card's 96-byte NAK. A parsed frame re-emits byte for byte (but for
/// bytes the parser ignores), and a driver's ACK/NAK rebuilt from what was read
/// ([`DriverAckFrame`]) parses to the same kind and verdict.
pub fn wire_ack(frame: &[u8]) {
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
}

fn parse_ud(frame: &[u8]) -> Option<(UdFrame, Vec<u8>)> {
    let (ud, range) = UdFrame::parse(frame).ok()?;
    let payload = frame.get(range).expect("payload range inside the frame");
    Some((ud, payload.to_vec()))
}

fn refresh_ud(frame: &mut [u8]) {
    refresh_ipv4_checksum(frame);
    if let Some(end) = frame.len().checked_sub(ICRC_LEN).filter(|&e| e >= 14) {
        let crc = icrc(&frame[14..end]);
        frame[end..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A UD frame as the driver reads it from the simple-NIC RX ring (core/src/wire/ud.rs). A
/// parsed frame re-emits around its payload to a frame that parses to the same headers and
/// payload; without pad bytes it has the input's length and every byte the emitter changed
/// is one the parser ignores (the IPv4 checksum and the ICRC recomputed after a change).
pub fn wire_ud(frame: &[u8]) {
    let Some((ud, payload)) = parse_ud(frame) else {
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
        assert_eq!(parse_ud(&out), Some((ud, payload)), "re-emitted {out:02x?}");
        return;
    }
    check_frame_bytes(
        "UD frame",
        frame,
        &(ud, payload),
        &out,
        parse_ud,
        refresh_ud,
    );
}
