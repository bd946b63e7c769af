//! Golden byte vectors for the wire and OOB codecs, written by hand from the tables of
//! nic-behaviour.md 1.4-1.5, layout-verification.md 1.6 and section 5 ("Extra vectors"),
//! and oob-channel.md. Every vector is checked both ways: encode gives these bytes, and
//! decoding them gives the fields back. Since the driver and the emulated NIC share the
//! codec, only vectors written independently of it can catch a shared mistake.

use core::net::Ipv4Addr;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::oob::{
    AccessCheck, AccessVerdict, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus, Capabilities,
    CheckMessage, CheckOp, CheckVerdict, Hello, OobDecoder, OobError, OobMessage, Proof, Record,
    RecvTooShort, RecvWr,
};
use bluerdma_core::wire::ipv4::ipv4_checksum;
use bluerdma_core::wire::packet::udp_src_port_for;
use bluerdma_core::wire::{
    AckKind, AckVerdict, Aeth, Bth, DriverAckFrame, Ecn, FrameEnvelope, HeaderKind, LengthField,
    MacAddr, Nreth, PacketHeaders, RdmaOpcode, ReceivedAck, Reth, RocePacket, Rreth, WireError,
};

/// Parses whitespace-separated hex byte pairs; `|` is ignored (a visual separator).
fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .filter(|t| *t != "|")
        .map(|t| u8::from_str_radix(t, 16).expect("hex byte"))
        .collect()
}

const MAC_A: MacAddr = MacAddr([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0A]);
const MAC_B: MacAddr = MacAddr([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0B]);
const IP_A: Ipv4Addr = Ipv4Addr::new(17, 34, 51, 10);
const IP_B: Ipv4Addr = Ipv4Addr::new(17, 34, 51, 11);

fn driver_ack(psn: u32, verdict: AckVerdict) -> DriverAckFrame {
    DriverAckFrame {
        src_mac: MAC_A,
        dst_mac: MAC_B,
        src_ip: IP_A,
        dst_ip: IP_B,
        dqpn: Qpn::from_raw(0x0345CD),
        psn,
        verdict,
    }
}

// layout-verification.md section 5, extra vector "Driver ACK payload".
const DRIVER_ACK_PAYLOAD: &str = "
    11 00 00 00 00 03 45 cd 00 00 01 02
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff
    20 00 00 00";

// layout-verification.md section 5, extra vector "Driver NAK payload".
const DRIVER_NAK_PAYLOAD: &str = "
    11 00 00 00 00 03 45 cd 00 00 01 03
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    e0 00 01 00";

#[test]
fn driver_ack_payload_vector() {
    let expected = hex(DRIVER_ACK_PAYLOAD);
    let headers = driver_ack(0x102, AckVerdict::Ack).headers();
    let mut out = [0u8; 64];
    let n = headers.emit_udp_payload(&[], &mut out).unwrap();
    assert_eq!(out[..n], expected[..]);

    let (back, payload) = PacketHeaders::parse_udp_payload(&expected).unwrap();
    assert_eq!(back, headers);
    assert!(payload.is_empty());
    let aeth = back.aeth.unwrap();
    assert_eq!(aeth.now_bitmap, u128::MAX);
    assert!(aeth.is_send_by_driver && !aeth.is_window_slided && !aeth.is_packet_lost);
}

#[test]
fn driver_nak_payload_vector() {
    let expected = hex(DRIVER_NAK_PAYLOAD);
    let headers = driver_ack(0x103, AckVerdict::Nak { pre_psn: 0x100 }).headers();
    let mut out = [0u8; 64];
    let n = headers.emit_udp_payload(&[], &mut out).unwrap();
    assert_eq!(out[..n], expected[..]);

    let (back, _) = PacketHeaders::parse_udp_payload(&expected).unwrap();
    let aeth = back.aeth.unwrap();
    assert_eq!((aeth.pre_bitmap, aeth.now_bitmap), (0, 0));
    assert!(aeth.is_packet_lost && aeth.is_window_slided && aeth.is_send_by_driver);
    assert_eq!(aeth.pre_psn, 0x100);
    assert_eq!(back.bth.psn, 0x103);
}

/// The whole 90-byte driver ACK frame, with the IPv4 checksum worked out by hand:
/// words 4500 004c 0001 0000 4011 [0000] 1122 330a 1122 330b sum to 0x1_0DB7;
/// folded 0x0DB7 + 1 = 0x0DB8; one's complement 0xF247.
const DRIVER_ACK_FRAME: &str = "
    aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 00 00 4c 00 01 00 00 40 11 f2 47 | 11 22 33 0a | 11 22 33 0b
    12 b7 12 b7 00 38 00 00";

#[test]
fn driver_ack_frame_vector() {
    let mut expected = hex(DRIVER_ACK_FRAME);
    expected.extend(hex(DRIVER_ACK_PAYLOAD));
    assert_eq!(expected.len(), 90);

    let frame = driver_ack(0x102, AckVerdict::Ack);
    let mut out = [0u8; 128];
    assert_eq!(frame.emit(&mut out), Ok(90));
    assert_eq!(out[..90], expected[..]);

    let got = ReceivedAck::parse(&expected).unwrap();
    assert_eq!(got.kind(), AckKind::DriverAck);
    assert_eq!(got.envelope.src_mac, MAC_A);
    assert_eq!(got.envelope.dst_ip, IP_B);
    assert_eq!(got.bth.dqpn, Qpn::from_raw(0x0345CD));
    assert_eq!(
        got.nreth, None,
        "the 90-byte form has nothing after the AETH"
    );
}

/// The card's loss NAK (nic-behaviour.md 3.4): 96 bytes, AETH then six zero bytes, UDP
/// source port = the QP's local_udp_port (0x0100 in the reference), MSN = ackMsn.
#[test]
fn hardware_nak_frame_parses() {
    // IPv4 checksum: as the ACK frame's with total length 0x52: 0x1_0DBD -> 0x0DBE -> 0xF241.
    let frame = hex("
        aa bb cc dd ee 0a | aa bb cc dd ee 0b | 08 00
        45 00 00 52 00 01 00 00 40 11 f2 41 | 11 22 33 0b | 11 22 33 0a
        01 00 12 b7 00 3e 00 00
        11 00 00 03 00 01 23 ab 00 00 01 00
        ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 7f ff
        c0 00 00 80
        00 00 00 00 00 00");
    assert_eq!(frame.len(), 96);
    let got = ReceivedAck::parse(&frame).unwrap();
    assert_eq!(got.kind(), AckKind::HardwareNak);
    assert_eq!(got.driver_verdict(), None);
    assert_eq!(got.bth.msn, 3);
    assert_eq!(got.bth.psn, 0x100);
    assert_eq!(got.aeth.pre_bitmap, u128::MAX);
    assert_eq!(got.aeth.now_bitmap, 0x7FFF);
    assert_eq!(got.aeth.pre_psn, 0x80);
    assert_eq!(got.nreth, Some(Nreth { last_retry_psn: 0 }));
    assert_eq!(got.envelope.udp_src_port, 0x0100);

    // Emitting the parsed packet gives the same 96 bytes.
    let (packet, _) = RocePacket::parse_frame(&frame).unwrap();
    let mut out = [0u8; 96];
    assert_eq!(packet.emit_frame(&[], &mut out), Ok(96));
    assert_eq!(out[..], frame[..]);

    // A frame between the two forms is neither.
    let mut odd = frame.clone();
    odd.truncate(93);
    fix_lengths(&mut odd);
    assert_eq!(
        RocePacket::parse_frame(&odd),
        Err(WireError::Truncated {
            header: HeaderKind::RdmaHeaderArea,
            needed: 6,
            available: 3
        })
    );
}

/// A WRITE_FIRST at an unaligned remote address (raddr mod 4 = 2), PMTU 256: the first
/// packet runs to the next 256-byte boundary (6 bytes), RETH.dlen is the message total,
/// two filler bytes sit between the header area and the payload.
/// IPv4: TOS 0x01 (ECT(1)), total length 90; checksum words 4501 005a 0001 0000 4011
/// 1122 330a 1122 330b sum to 0x1_0DC6 -> 0x0DC7 -> 0xF238.
const WRITE_FIRST_FRAME: &str = "
    aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 01 00 5a 00 01 00 00 40 11 f2 38 | 11 22 33 0a | 11 22 33 0b
    23 ab 12 b7 00 46 00 00
    06 c0 00 07 00 03 45 cd 80 00 01 02
    00 00 7f 00 de ad 00 fa | 00 1f ff a5 | 00 00 01 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00
    d0 d1 d2 d3 d4 d5";

fn write_first() -> RocePacket {
    let sqpn = Qpn::from_raw(0x0123AB);
    let mut envelope = FrameEnvelope::new(MAC_A, MAC_B, IP_A, IP_B, udp_src_port_for(sqpn));
    envelope.ecn = Ecn::Ect1;
    let mut bth = Bth::new(RdmaOpcode::WriteFirst, Qpn::from_raw(0x0345CD), 0x102);
    bth.solicited = true;
    bth.is_retry = true;
    bth.msn = 7;
    bth.ack_req = true;
    let mut headers = PacketHeaders::new(bth);
    headers.reth = Some(Reth {
        va: VirtAddr(0x0000_7F00_DEAD_00FA),
        rkey: MrKey::from_raw(0x001F_FFA5),
        dma_len: 0x100,
    });
    RocePacket { envelope, headers }
}

#[test]
fn write_first_unaligned_vector() {
    let expected = hex(WRITE_FIRST_FRAME);
    assert_eq!(expected.len(), 104);
    let payload = [0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5];

    let packet = write_first();
    assert_eq!(packet.frame_len(payload.len()), 104);
    let mut out = [0xEEu8; 128];
    assert_eq!(packet.emit_frame(&payload, &mut out), Ok(104));
    assert_eq!(out[..104], expected[..]);

    let (back, range) = RocePacket::parse_frame(&expected).unwrap();
    assert_eq!(back, packet);
    assert_eq!(
        range,
        98..104,
        "payload after 96 header bytes and 2 filler bytes"
    );
    assert_eq!(expected[range], payload);
    assert_eq!(back.headers.filler_len(), 2);
}

/// An RDMA READ request (fields as golden vectors 10 and 11 of layout-verification.md):
/// RETH {raddr, rkey, total_len} then RRETH {laddr, lkey}; no payload, so 96 bytes.
/// IPv4 checksum: total length 0x52 -> 0xF241 (see the hardware NAK above).
const READ_REQUEST_FRAME: &str = "
    aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 00 00 52 00 01 00 00 40 11 f2 41 | 11 22 33 0a | 11 22 33 0b
    45 cd 12 b7 00 3e 00 00
    0c 00 00 08 00 01 23 ab 80 00 02 00
    00 00 7f 00 de ad 00 00 | 00 1f ff a5 | 00 00 10 00
    00 00 7f 12 34 60 00 00 | 00 1f fe a6
    00 00 00 00 00 00 00 00 00 00 00 00 00 00";

#[test]
fn read_request_vector() {
    let expected = hex(READ_REQUEST_FRAME);
    assert_eq!(expected.len(), 96);

    let sqpn = Qpn::from_raw(0x0345CD);
    let mut bth = Bth::new(RdmaOpcode::ReadRequest, Qpn::from_raw(0x0123AB), 0x200);
    bth.msn = 8;
    bth.ack_req = true;
    let mut headers = PacketHeaders::new(bth);
    headers.reth = Some(Reth {
        va: VirtAddr(0x0000_7F00_DEAD_0000),
        rkey: MrKey::from_raw(0x001F_FFA5),
        dma_len: 0x1000,
    });
    headers.rreth = Some(Rreth {
        va: VirtAddr(0x0000_7F12_3460_0000),
        lkey: MrKey::from_raw(0x001F_FEA6),
    });
    let packet = RocePacket {
        envelope: FrameEnvelope::new(MAC_A, MAC_B, IP_A, IP_B, udp_src_port_for(sqpn)),
        headers,
    };
    let mut out = [0u8; 96];
    assert_eq!(packet.emit_frame(&[], &mut out), Ok(96));
    assert_eq!(out[..], expected[..]);
    assert_eq!(RocePacket::parse_frame(&expected), Ok((packet, 96..96)));
}

/// Rewrites the IPv4 total length, its checksum and the UDP length after a test changed
/// the frame's length, so that the parser reaches the RDMA headers.
fn fix_lengths(frame: &mut [u8]) {
    let ip_len = (frame.len() - 14) as u16;
    frame[16..18].copy_from_slice(&ip_len.to_be_bytes());
    frame[24..26].fill(0);
    let sum = ipv4_checksum(frame[14..34].try_into().unwrap());
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    frame[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
}

#[test]
fn length_fields_must_agree_and_errors_name_the_field() {
    let good = hex(WRITE_FIRST_FRAME);

    // Frame cut short: the IPv4 total length no longer matches.
    assert_eq!(
        RocePacket::parse_frame(&good[..100]),
        Err(WireError::InconsistentLength {
            field: LengthField::Ipv4TotalLength,
            found: 90,
            expected: 86
        })
    );
    // Link padding beyond the IPv4 total length is not accepted for RoCE either.
    let mut padded = good.clone();
    padded.push(0);
    assert!(matches!(
        RocePacket::parse_frame(&padded),
        Err(WireError::InconsistentLength {
            field: LengthField::Ipv4TotalLength,
            ..
        })
    ));
    // UDP length off by one.
    let mut udp = good.clone();
    udp[39] -= 1;
    assert_eq!(
        RocePacket::parse_frame(&udp),
        Err(WireError::InconsistentLength {
            field: LengthField::UdpLength,
            found: 69,
            expected: 70
        })
    );
    // The IPv4 checksum is verified.
    let mut sum = good.clone();
    sum[25] ^= 1;
    assert_eq!(
        RocePacket::parse_frame(&sum),
        Err(WireError::BadIpChecksum {
            found: 0xF239,
            computed: 0xF238
        })
    );
    // A payload one byte short of what a MIDDLE packet's RETH.dlen says.
    let mut middle = good.clone();
    middle[42] = RdmaOpcode::WriteMiddle.raw();
    middle[54 + 12..54 + 16].copy_from_slice(&7u32.to_be_bytes());
    assert_eq!(
        RocePacket::parse_frame(&middle),
        Err(WireError::InconsistentLength {
            field: LengthField::RethDmaLength,
            found: 7,
            expected: 6
        })
    );
    // Not RoCE: another destination port.
    let mut port = good.clone();
    port[37] = 0xB8;
    assert_eq!(
        RocePacket::parse_frame(&port),
        Err(WireError::NotRoce { dst_port: 4792 })
    );
    // An unknown opcode (a CNP) is refused by name.
    let mut cnp = good;
    cnp[42] = 0x80;
    assert_eq!(
        RocePacket::parse_frame(&cnp),
        Err(WireError::UnknownOpcode { raw: 0x80 })
    );
}

#[test]
fn truncation_names_the_header() {
    let good = hex(WRITE_FIRST_FRAME);
    assert_eq!(
        RocePacket::parse_frame(&good[..10]),
        Err(WireError::Truncated {
            header: HeaderKind::Ethernet,
            needed: 14,
            available: 10
        })
    );
    assert_eq!(
        RocePacket::parse_frame(&good[..30]),
        Err(WireError::Truncated {
            header: HeaderKind::Ipv4,
            needed: 20,
            available: 16
        })
    );
    // Cut inside the header area, lengths repaired so that only the area is short.
    let mut short = good[..80].to_vec();
    fix_lengths(&mut short);
    assert_eq!(
        RocePacket::parse_frame(&short),
        Err(WireError::Truncated {
            header: HeaderKind::RdmaHeaderArea,
            needed: 54,
            available: 38
        })
    );
}

/// oob-channel.md: wr_id, addr, length, lkey, the responder's QPN, four zero bytes.
const RECV_WR_RECORD: &str = "
    01 02 03 04 05 06 07 08 | 00 00 7f 12 34 60 00 40 | 00 01 00 00 | 00 1f fe a6
    00 01 23 ab | 00 00 00 00";

/// The receive-WR-too-short record (kind 1): the receiver's wr_id, zero, the SEND length
/// (101), zero, the requester's QPN, kind 1.
const RECV_TOO_SHORT_RECORD: &str = "
    01 02 03 04 05 06 07 08 | 00 00 00 00 00 00 00 00 | 00 00 00 65 | 00 00 00 00
    00 01 23 ab | 00 00 00 01";

/// An atomic request, compare-and-swap (kind 2, then its operands, kind 3): remote address,
/// rkey, sequence number 0x102, the responder's QPN 0x105, operation 1, the requester's
/// QPN; then compare, swap, the sequence number and the QPN again.
const ATOMIC_REQUEST_RECORDS: &str = "
    00 00 7f 12 34 60 00 48 | 00 1f fe a6 | 00 00 01 02 | 00 00 01 05 | 01 00 00 00
    00 01 23 ab | 00 00 00 02
    01 02 03 04 05 06 07 08 | 11 12 13 14 15 16 17 18 | 00 00 01 02 | 00 00 00 00
    00 01 23 ab | 00 00 00 03";

/// The atomic reply (kind 4): the original value, sequence number 0x102, status 0 (done),
/// the requester's QPN, zero, the responder's QPN.
const ATOMIC_REPLY_RECORD: &str = "
    0a 0b 0c 0d 0e 0f 10 11 | 00 00 01 02 | 00 00 00 00 | 00 01 23 ab | 00 00 00 00
    00 00 01 05 | 00 00 00 04";

/// The access check (kind 5): operation 1 (READ), zero, the request's first PSN, remote
/// address, length, rkey, the requester's QPN.
const ACCESS_CHECK_RECORD: &str = "
    01 00 00 00 | 00 ab cd ef | 00 00 7f 12 34 60 00 40 | 00 01 00 00 | 00 00 03 07
    00 00 01 05 | 00 00 00 05";

/// A remote invalidation (kind 5, op 3 SEND_WITH_INV): the PSN the SEND will start at,
/// address and length zero, the rkey to invalidate, the requester's QPN.
const REMOTE_INV_RECORD: &str = "
    03 00 00 00 | 00 00 00 2a | 00 00 00 00 00 00 00 00 | 00 00 00 00 | 00 00 03 c9
    00 00 01 05 | 00 00 00 05";

/// The access verdict (kind 6): zero, the request's first PSN, zero, verdict 1 (access
/// error), zero, the responder's QPN.
const ACCESS_VERDICT_RECORD: &str = "
    00 00 00 00 | 00 ab cd ef | 00 00 00 00 00 00 00 00 | 00 00 00 01 | 00 00 00 00
    00 01 23 ab | 00 00 00 06";

/// The hello: "BRDM", version 2, reserved 0, capabilities RECV_WR_RECORDS (bit 0),
/// LENGTH_ERRORS (bit 1), ATOMICS (bit 2), ACCESS_CHECKS (bit 3) and REMOTE_INVALIDATE
/// (bit 4), device IP 17.34.51.10, nonce 00..0f.
const HELLO: &str = "42 52 44 4d | 00 02 | 00 00 | 00 00 00 1f | 11 22 33 0a
    00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f";

/// A proof: 32 opaque bytes after the hello.
const PROOF: &str = "
    a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5
    a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5";

fn hello_a() -> Hello {
    Hello::new(IP_A).with_nonce([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
}

fn recv_wr() -> RecvWr {
    RecvWr {
        wr_id: 0x0102_0304_0506_0708,
        addr: 0x0000_7F12_3460_0040,
        length: 0x0001_0000,
        lkey: 0x001F_FEA6,
        qpn: 0x0123AB,
    }
}

#[test]
fn recv_wr_record_vector() {
    let expected = hex(RECV_WR_RECORD);
    assert_eq!(recv_wr().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(RecvWr::parse(&expected), Ok((recv_wr(), &[][..])));
}

fn recv_too_short() -> RecvTooShort {
    RecvTooShort {
        wr_id: 0x0102_0304_0506_0708,
        send_len: 101,
        qpn: 0x0123AB,
    }
}

#[test]
fn recv_too_short_record_vector() {
    let expected = hex(RECV_TOO_SHORT_RECORD);
    assert_eq!(recv_too_short().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::RecvTooShort(recv_too_short()), &[][..]))
    );
}

fn atomic_request() -> AtomicRequest {
    AtomicRequest {
        qpn: 0x0123AB,
        dest_qpn: 0x105,
        seq: 0x102,
        raddr: 0x0000_7F12_3460_0048,
        rkey: 0x001F_FEA6,
        op: AtomicOp::CompareSwap {
            compare: 0x0102_0304_0506_0708,
            swap: 0x1112_1314_1516_1718,
        },
    }
}

fn atomic_reply() -> AtomicReply {
    AtomicReply {
        qpn: 0x105,
        dest_qpn: 0x0123AB,
        seq: 0x102,
        status: AtomicStatus::Done,
        value: 0x0A0B_0C0D_0E0F_1011,
    }
}

#[test]
fn atomic_record_vectors() {
    let expected = hex(ATOMIC_REQUEST_RECORDS);
    assert_eq!(atomic_request().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::AtomicRequest(atomic_request()), &[][..]))
    );
    let expected = hex(ATOMIC_REPLY_RECORD);
    assert_eq!(atomic_reply().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::AtomicReply(atomic_reply()), &[][..]))
    );
}

fn access_check() -> AccessCheck {
    AccessCheck {
        op: CheckOp::Read,
        psn: 0xAB_CDEF,
        addr: 0x0000_7F12_3460_0040,
        len: 0x0001_0000,
        rkey: 0x307,
        qpn: 0x105,
    }
}

fn access_verdict() -> AccessVerdict {
    AccessVerdict {
        psn: 0xAB_CDEF,
        verdict: CheckVerdict::AccessError,
        qpn: 0x0123AB,
    }
}

#[test]
fn access_check_vectors() {
    let expected = hex(ACCESS_CHECK_RECORD);
    assert_eq!(access_check().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::AccessCheck(access_check()), &[][..]))
    );
    let inv = AccessCheck {
        op: CheckOp::SendInv,
        psn: 0x2a,
        addr: 0,
        len: 0,
        rkey: 0x3c9,
        qpn: 0x105,
    };
    let expected = hex(REMOTE_INV_RECORD);
    assert_eq!(inv.to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::AccessCheck(inv), &[][..]))
    );
    let expected = hex(ACCESS_VERDICT_RECORD);
    assert_eq!(access_verdict().to_bytes().unwrap()[..], expected[..]);
    assert_eq!(
        Record::parse(&expected),
        Ok((Record::AccessVerdict(access_verdict()), &[][..]))
    );
}

#[test]
fn hello_vector() {
    let expected = hex(HELLO);
    let hello = hello_a();
    assert_eq!(
        hello.capabilities,
        Capabilities::RECV_WR_RECORDS
            | Capabilities::LENGTH_ERRORS
            | Capabilities::ATOMICS
            | Capabilities::ACCESS_CHECKS
            | Capabilities::REMOTE_INVALIDATE
    );
    assert_eq!(hello.to_bytes()[..], expected[..]);
    assert_eq!(Hello::parse(&expected), Ok((hello, &[][..])));
}

#[test]
fn decoder_reads_the_literal_stream() {
    let mut stream = hex(HELLO);
    stream.extend(hex(PROOF));
    stream.extend(hex(RECV_WR_RECORD));
    stream.extend(hex(RECV_TOO_SHORT_RECORD));
    stream.extend(hex(ATOMIC_REQUEST_RECORDS));
    stream.extend(hex(ATOMIC_REPLY_RECORD));
    stream.extend(hex(ACCESS_CHECK_RECORD));
    stream.extend(hex(ACCESS_VERDICT_RECORD));
    stream.extend(hex(RECV_WR_RECORD));
    let mut dec = OobDecoder::new();
    let mut input = &stream[..];
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::Hello(hello_a())))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::Proof(Proof([0xa5; 32]))))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::RecvWr(recv_wr())))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::RecvTooShort(recv_too_short())))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::AtomicRequest(atomic_request())))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::AtomicReply(atomic_reply())))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::Check(CheckMessage::Check(access_check()))))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::Check(CheckMessage::Verdict(
            access_verdict()
        ))))
    );
    assert_eq!(
        dec.decode(&mut input),
        Ok(Some(OobMessage::RecvWr(recv_wr())))
    );
    assert_eq!(dec.decode(&mut input), Ok(None));
    assert_eq!(dec.finish(), Ok(()));

    // A reference driver's connection (records, no hello) is garbage to a new decoder.
    let records = hex(RECV_WR_RECORD);
    let mut input = &records[..];
    assert_eq!(
        OobDecoder::new().decode(&mut input),
        Err(OobError::BadMagic {
            found: [0x01, 0x02, 0x03, 0x04]
        })
    );
}

#[test]
fn driver_nak_frame_round_trips() {
    let frame = driver_ack(0x103, AckVerdict::Nak { pre_psn: 0x100 });
    let mut out = [0u8; 90];
    assert_eq!(frame.emit(&mut out), Ok(90));
    assert_eq!(out[42..], hex(DRIVER_NAK_PAYLOAD)[..]);
    let got = ReceivedAck::parse(&out).unwrap();
    assert_eq!(got.kind(), AckKind::DriverNak);
    assert_eq!(
        got.driver_verdict(),
        Some(AckVerdict::Nak { pre_psn: 0x100 })
    );
    assert_eq!(
        got.aeth,
        Aeth {
            pre_bitmap: 0,
            now_bitmap: 0,
            is_packet_lost: true,
            is_window_slided: true,
            is_send_by_driver: true,
            pre_psn: 0x100,
        }
    );

    // A data frame is not an ACK.
    let data = hex(READ_REQUEST_FRAME);
    assert_eq!(
        ReceivedAck::parse(&data),
        Err(WireError::NotAck {
            opcode: RdmaOpcode::ReadRequest
        })
    );
}
