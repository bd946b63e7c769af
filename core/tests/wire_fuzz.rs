//! Property tests for the wire and OOB codecs: arbitrary bytes and truncations never panic
//! and always end in a value or an error; any valid header, packet or OOB stream survives
//! emit-then-parse unchanged, however the stream is split.

use core::net::Ipv4Addr;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::oob::{
    AccessCheck, AccessVerdict, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus, Capabilities,
    CheckMessage, CheckOp, CheckVerdict, Hello, OobDecoder, OobError, OobMessage, Proof, Record,
    RecvTooShort, RecvWr,
};
use bluerdma_core::wire::packet::WireProfile;
use bluerdma_core::wire::{
    Aeth, Bth, Ecn, EtherType, EthernetHeader, FrameEnvelope, Header, Ieth, ImmDt, Ipv4Header,
    MacAddr, Nreth, PacketHeaders, RdmaOpcode, ReceivedAck, Reth, RocePacket, Rreth, UdpHeader,
};
use proptest::prelude::*;

// ---- strategies -------------------------------------------------------------------------

fn psn() -> impl Strategy<Value = u32> {
    0u32..=0x00FF_FFFF
}

fn qpn() -> impl Strategy<Value = Qpn> {
    any::<u32>().prop_map(Qpn::from_raw)
}

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn ip() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

fn ecn() -> impl Strategy<Value = Ecn> {
    (0u8..4).prop_map(Ecn::from_bits)
}

fn bth_with(opcode: impl Strategy<Value = RdmaOpcode>) -> impl Strategy<Value = Bth> {
    (
        opcode,
        any::<[bool; 5]>(),
        0u8..4,
        0u8..16,
        any::<u16>(),
        qpn(),
        psn(),
    )
        .prop_map(|(opcode, f, pad_count, tver, msn, dqpn, psn)| Bth {
            opcode,
            solicited: f[0],
            is_retry: f[1],
            pad_count,
            tver,
            msn,
            fecn: f[2],
            becn: f[3],
            dqpn,
            ack_req: f[4],
            psn,
        })
}

fn bth() -> impl Strategy<Value = Bth> {
    bth_with(any::<u8>().prop_map(RdmaOpcode::from_raw))
}

fn reth() -> impl Strategy<Value = Reth> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, dma_len)| Reth {
        va: VirtAddr(va),
        rkey: MrKey::from_raw(rkey),
        dma_len,
    })
}

fn rreth() -> impl Strategy<Value = Rreth> {
    (any::<u64>(), any::<u32>()).prop_map(|(va, lkey)| Rreth {
        va: VirtAddr(va),
        lkey: MrKey::from_raw(lkey),
    })
}

fn aeth() -> impl Strategy<Value = Aeth> {
    (any::<u128>(), any::<u128>(), any::<[bool; 3]>(), psn()).prop_map(|(pre, now, f, pre_psn)| {
        Aeth {
            pre_bitmap: pre,
            now_bitmap: now,
            is_packet_lost: f[0],
            is_window_slided: f[1],
            is_send_by_driver: f[2],
            pre_psn,
        }
    })
}

fn ipv4() -> impl Strategy<Value = Ipv4Header> {
    (
        0u8..64,
        ecn(),
        20u16..,
        any::<u16>(),
        any::<[bool; 2]>(),
        0u16..0x2000,
        any::<u8>(),
        any::<u8>(),
        ip(),
        ip(),
    )
        .prop_map(
            |(dscp, ecn, total_len, ident, f, fragment_offset, ttl, protocol, src, dst)| {
                Ipv4Header {
                    dscp,
                    ecn,
                    total_len,
                    ident,
                    dont_fragment: f[0],
                    more_fragments: f[1],
                    fragment_offset,
                    ttl,
                    protocol,
                    src,
                    dst,
                }
            },
        )
}

fn envelope() -> impl Strategy<Value = FrameEnvelope> {
    (mac(), mac(), ip(), ip(), 0u8..64, ecn(), any::<u16>()).prop_map(
        |(src_mac, dst_mac, src_ip, dst_ip, dscp, ecn, port)| {
            let mut e = FrameEnvelope::new(src_mac, dst_mac, src_ip, dst_ip, port);
            e.dscp = dscp;
            e.ecn = ecn;
            e
        },
    )
}

/// Every opcode the card's profile has a frame layout for.
fn card_opcode() -> impl Strategy<Value = RdmaOpcode> {
    (0u8..0x18)
        .prop_map(RdmaOpcode::from_raw)
        .prop_filter("has a card layout", |op| {
            WireProfile::Card.ext_headers(*op).is_ok()
        })
}

/// A valid packet with a payload consistent with its headers.
fn valid_packet() -> impl Strategy<Value = (RocePacket, Vec<u8>)> {
    (
        envelope(),
        bth_with(card_opcode()),
        reth(),
        rreth(),
        any::<u32>(),
        aeth(),
        proptest::option::of(psn().prop_map(|p| Nreth { last_retry_psn: p })),
        proptest::collection::vec(any::<u8>(), 0..300),
        0u32..100_000,
    )
        .prop_map(
            |(envelope, bth, mut reth, rreth, imm, aeth, nreth, payload, extra)| {
                let want = WireProfile::Card.ext_headers(bth.opcode).unwrap();
                let mut headers = PacketHeaders::new(bth);
                let mut payload = payload;
                if bth.opcode.has_payload() {
                    // dlen: the payload length, or more on a FIRST packet.
                    let len = payload.len() as u32;
                    reth.dma_len = if bth.opcode.is_first() && len != 0 {
                        len + extra
                    } else {
                        len
                    };
                } else {
                    payload.clear();
                }
                headers.reth = want.reth.then_some(reth);
                headers.rreth = want.rreth.then_some(rreth);
                headers.imm = want.imm.then_some(ImmDt(imm));
                headers.ieth = want.ieth.then_some(Ieth {
                    rkey: MrKey::from_raw(imm),
                });
                headers.aeth = want.aeth.then_some(aeth);
                headers.nreth = if want.aeth { nreth } else { None };
                (RocePacket { envelope, headers }, payload)
            },
        )
}

fn recv_wr() -> impl Strategy<Value = RecvWr> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        0u32..=0x00FF_FFFF,
    )
        .prop_map(|(wr_id, addr, length, lkey, qpn)| RecvWr {
            wr_id,
            addr,
            length,
            lkey,
            qpn,
        })
}

fn recv_too_short() -> impl Strategy<Value = RecvTooShort> {
    (any::<u64>(), any::<u32>(), 0u32..=0x00FF_FFFF).prop_map(|(wr_id, send_len, qpn)| {
        RecvTooShort {
            wr_id,
            send_len,
            qpn,
        }
    })
}

fn atomic_request() -> impl Strategy<Value = AtomicRequest> {
    let qpn = 0u32..=0x00FF_FFFF;
    let op = prop_oneof![
        any::<u64>().prop_map(|add| AtomicOp::FetchAdd { add }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(compare, swap)| AtomicOp::CompareSwap { compare, swap }),
    ];
    (
        qpn.clone(),
        qpn,
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        op,
    )
        .prop_map(|(qpn, dest_qpn, seq, raddr, rkey, op)| AtomicRequest {
            qpn,
            dest_qpn,
            seq,
            raddr,
            rkey,
            op,
        })
}

fn atomic_reply() -> impl Strategy<Value = AtomicReply> {
    let qpn = 0u32..=0x00FF_FFFF;
    (qpn.clone(), qpn, any::<u32>(), 0u32..6, any::<u64>()).prop_map(
        |(qpn, dest_qpn, seq, status, value)| {
            let status = AtomicStatus::from_raw(status);
            AtomicReply {
                qpn,
                dest_qpn,
                seq,
                status,
                value: if status == AtomicStatus::Done {
                    value
                } else {
                    0
                },
            }
        },
    )
}

fn access_check() -> impl Strategy<Value = AccessCheck> {
    let op = prop_oneof![
        Just(CheckOp::Write),
        Just(CheckOp::Read),
        Just(CheckOp::Send)
    ];
    (
        op,
        0u32..=0x00FF_FFFF,
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        0u32..=0x00FF_FFFF,
    )
        .prop_map(|(op, psn, addr, len, rkey, qpn)| AccessCheck {
            op,
            psn,
            addr,
            len,
            rkey,
            qpn,
        })
}

fn access_verdict() -> impl Strategy<Value = AccessVerdict> {
    let verdict = prop_oneof![
        Just(CheckVerdict::Accepted),
        Just(CheckVerdict::AccessError),
        Just(CheckVerdict::OperationError)
    ];
    (0u32..=0x00FF_FFFF, verdict, 0u32..=0x00FF_FFFF)
        .prop_map(|(psn, verdict, qpn)| AccessVerdict { psn, verdict, qpn })
}

fn record() -> impl Strategy<Value = Record> {
    prop_oneof![
        recv_wr().prop_map(Record::RecvWr),
        recv_too_short().prop_map(Record::RecvTooShort),
        atomic_request().prop_map(Record::AtomicRequest),
        atomic_reply().prop_map(Record::AtomicReply),
        access_check().prop_map(Record::AccessCheck),
        access_verdict().prop_map(Record::AccessVerdict),
    ]
}

fn message_of(r: &Record) -> OobMessage {
    match *r {
        Record::RecvWr(wr) => OobMessage::RecvWr(wr),
        Record::RecvTooShort(t) => OobMessage::RecvTooShort(t),
        Record::AtomicRequest(q) => OobMessage::AtomicRequest(q),
        Record::AtomicReply(a) => OobMessage::AtomicReply(a),
        Record::AccessCheck(c) => OobMessage::Check(CheckMessage::Check(c)),
        Record::AccessVerdict(v) => OobMessage::Check(CheckMessage::Verdict(v)),
    }
}

fn hello() -> impl Strategy<Value = Hello> {
    (any::<u32>(), ip(), any::<[u8; 16]>()).prop_map(|(caps, device_ip, nonce)| Hello {
        capabilities: Capabilities::from_bits_retain(caps),
        device_ip,
        nonce,
    })
}

// ---- helpers ----------------------------------------------------------------------------

/// Parses `bytes` as `H` (a header without a length field); if that succeeds, emitting
/// and parsing again gives the same header (parse is a projection onto valid headers).
fn parse_is_stable<H: Header + PartialEq + core::fmt::Debug>(bytes: &[u8]) {
    if let Ok((h, _)) = H::parse(bytes) {
        let mut out = [0u8; 64];
        let n = h.emit(&mut out).expect("a parsed header emits");
        assert_eq!(n, H::LEN);
        let (again, _) = H::parse(&out[..n]).expect("an emitted header parses");
        assert_eq!(again, h);
    }
}

fn round_trip<H: Header + PartialEq + core::fmt::Debug>(h: &H) {
    let mut out = vec![0u8; 70_000];
    let n = h.emit(&mut out).expect("valid header emits");
    assert_eq!(n, H::LEN);
    let (back, _) = H::parse(&out).expect("emitted header parses");
    assert_eq!(&back, h);
    // Every shorter buffer is refused, both ways.
    for cut in 0..H::LEN {
        assert!(H::parse(&out[..cut]).is_err());
        assert!(h.emit(&mut vec![0u8; cut]).is_err());
    }
}

// ---- properties -------------------------------------------------------------------------

proptest! {
    #[test]
    fn header_parsers_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        parse_is_stable::<EthernetHeader>(&bytes);
        parse_is_stable::<Bth>(&bytes);
        parse_is_stable::<Reth>(&bytes);
        parse_is_stable::<Rreth>(&bytes);
        parse_is_stable::<ImmDt>(&bytes);
        parse_is_stable::<Ieth>(&bytes);
        parse_is_stable::<Aeth>(&bytes);
        parse_is_stable::<Nreth>(&bytes);
        let _ = Ipv4Header::parse(&bytes);
        let _ = UdpHeader::parse(&bytes);
    }

    #[test]
    fn frame_parsers_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = RocePacket::parse_frame(&bytes);
        let _ = PacketHeaders::parse_udp_payload(&bytes);
        let _ = ReceivedAck::parse(&bytes);
        if let Ok((_, range)) = RocePacket::parse_frame(&bytes) {
            prop_assert!(range.end <= bytes.len());
        }
    }

    #[test]
    fn whatever_parses_re_emits(
        opcode in card_opcode(),
        mut bytes in proptest::collection::vec(any::<u8>(), 0..160),
        dlen_small in any::<bool>(),
    ) {
        // Steer the random bytes into the deep paths: a card opcode, and often a small
        // RETH.dlen so that payload rules are reached.
        if let Some(b) = bytes.first_mut() {
            *b = opcode.raw();
        }
        if dlen_small && bytes.len() >= 28 {
            // RETH.va's low byte is at 19: the payload is what follows area and filler.
            let filler = (bytes[19] % 4) as usize;
            let len = bytes.len().saturating_sub(54 + filler) as u32;
            bytes[24..28].copy_from_slice(&len.to_be_bytes());
        }
        if let Ok((headers, range)) = PacketHeaders::parse_udp_payload(&bytes) {
            let payload = &bytes[range];
            let mut out = vec![0u8; 512];
            let n = headers.emit_udp_payload(payload, &mut out).expect("parsed headers emit");
            let (again, range2) = PacketHeaders::parse_udp_payload(&out[..n]).unwrap();
            prop_assert_eq!(again, headers);
            prop_assert_eq!(&out[range2], payload);
        }
    }

    #[test]
    fn headers_round_trip(
        b in bth(),
        r in reth(),
        rr in rreth(),
        a in aeth(),
        ip4 in ipv4(),
        e in (mac(), mac(), any::<u16>()),
        udp in (any::<u16>(), any::<u16>(), 8u16..),
        imm in any::<u32>(),
        n in psn(),
    ) {
        round_trip(&b);
        round_trip(&r);
        round_trip(&rr);
        round_trip(&a);
        round_trip(&ip4);
        round_trip(&EthernetHeader { dst: e.0, src: e.1, ethertype: EtherType::from_raw(e.2) });
        round_trip(&UdpHeader { src_port: udp.0, dst_port: udp.1, length: udp.2 });
        round_trip(&ImmDt(imm));
        round_trip(&Ieth { rkey: MrKey::from_raw(imm) });
        round_trip(&Nreth { last_retry_psn: n });
    }

    #[test]
    fn packets_round_trip((packet, payload) in valid_packet()) {
        let mut out = vec![0u8; 2048];
        let n = packet.emit_frame(&payload, &mut out).expect("valid packet emits");
        prop_assert_eq!(n, packet.frame_len(payload.len()));
        let (back, range) = RocePacket::parse_frame(&out[..n]).expect("emitted frame parses");
        prop_assert_eq!(back, packet);
        prop_assert_eq!(&out[range], &payload[..]);
        // Too small a buffer is refused without panicking.
        prop_assert!(packet.emit_frame(&payload, &mut out[..n - 1]).is_err());
    }

    #[test]
    fn truncated_and_flipped_frames_never_panic(
        (packet, payload) in valid_packet(),
        cut in any::<prop::sample::Index>(),
        flip in any::<(prop::sample::Index, u8)>(),
    ) {
        let mut out = vec![0u8; 2048];
        let n = packet.emit_frame(&payload, &mut out).unwrap();
        let frame = &out[..n];
        let cut = cut.index(n);
        // Every strict prefix is an error: the IPv4 total length no longer matches.
        prop_assert!(RocePacket::parse_frame(&frame[..cut]).is_err());
        let mut flipped = frame.to_vec();
        let at = flip.0.index(n);
        flipped[at] ^= flip.1 | 1;
        if let Ok((_, range)) = RocePacket::parse_frame(&flipped) {
            prop_assert!(range.end <= n);
        }
    }

    #[test]
    fn oob_decoder_takes_any_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        hello_first in any::<bool>(),
    ) {
        let mut dec = if hello_first { OobDecoder::new() } else { OobDecoder::without_hello() };
        let mut input = &bytes[..];
        // Each call either yields a message (consuming 32 bytes), asks for more
        // (consuming everything) or fails for good: bounded by the input length.
        for _ in 0..=bytes.len() {
            match dec.decode(&mut input) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    prop_assert!(input.is_empty());
                    break;
                }
                Err(e) => {
                    prop_assert_eq!(dec.decode(&mut input), Err(e));
                    prop_assert_eq!(dec.finish(), Err(e));
                    break;
                }
            }
        }
        prop_assert!(input.is_empty() || dec.error().is_some());
    }

    #[test]
    fn oob_messages_round_trip(
        wr in recv_wr(),
        short in recv_too_short(),
        h in hello(),
        garbage in any::<[u8; 32]>(),
    ) {
        let bytes = wr.to_bytes().unwrap();
        prop_assert_eq!(RecvWr::parse(&bytes), Ok((wr, &[][..])));
        prop_assert_eq!(Record::parse(&bytes), Ok((Record::RecvWr(wr), &[][..])));
        let bytes = short.to_bytes().unwrap();
        prop_assert_eq!(RecvTooShort::parse(&bytes), Ok((short, &[][..])));
        prop_assert_eq!(Record::parse(&bytes), Ok((Record::RecvTooShort(short), &[][..])));
        let hb = h.to_bytes();
        prop_assert_eq!(Hello::parse(&hb), Ok((h, &[][..])));
        let _ = RecvWr::parse(&garbage);
        let _ = RecvTooShort::parse(&garbage);
        let _ = Hello::parse(&garbage);
        // Whatever decodes encodes back to the same bytes (parse is exact, no field lost).
        if let Ok((r, _)) = Record::parse(&garbage) {
            prop_assert_eq!(&r.to_bytes().unwrap()[..], &garbage[..]);
        }
    }

    /// A record with any kind code: 0, 1, 4, 5 and 6 decode (when their other fields are valid),
    /// 2 (an atomic request) waits for its operands, 3 (operands alone) and any other kind
    /// fail the decoder for good.
    #[test]
    fn oob_records_of_any_kind(
        mut bytes in any::<[u8; 32]>(),
        kind in prop_oneof![0u32..8, any::<u32>()],
    ) {
        bytes[24] = 0;
        bytes[28..].copy_from_slice(&kind.to_be_bytes());
        let mut dec = OobDecoder::without_hello();
        let mut input = &bytes[..];
        let got = dec.decode(&mut input);
        match kind {
            0 => prop_assert!(matches!(got, Ok(Some(OobMessage::RecvWr(_))))),
            1 => {
                let zero_fields_ok = bytes[8..16] == [0; 8] && bytes[20..24] == [0; 4];
                let decoded = matches!(got, Ok(Some(OobMessage::RecvTooShort(_))));
                prop_assert_eq!(decoded, zero_fields_ok);
            }
            2 => {
                prop_assert_eq!(got, Ok(None));
                let truncated = matches!(dec.finish(), Err(OobError::Truncated { needed: 64, .. }));
                prop_assert!(truncated, "an atomic request without operands is truncated");
            }
            3 => {
                let stray = matches!(got, Err(OobError::AtomicPair { .. }));
                prop_assert!(stray, "operands alone: {:?}", got);
            }
            4 => {
                let status_ok = bytes[12..16] == [0; 4] || bytes[..8] == [0; 8];
                let zero_fields_ok = bytes[16] == 0 && bytes[20..24] == [0; 4] && status_ok;
                let decoded = matches!(got, Ok(Some(OobMessage::AtomicReply(_))));
                prop_assert_eq!(decoded, zero_fields_ok);
            }
            5 => {
                let psn = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                let ok = bytes[0] <= 2 && bytes[1..4] == [0; 3] && psn <= 0x00FF_FFFF;
                let decoded = matches!(got, Ok(Some(OobMessage::Check(CheckMessage::Check(_)))));
                prop_assert_eq!(decoded, ok);
            }
            6 => {
                let psn = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                let verdict = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
                let ok = bytes[..4] == [0; 4]
                    && psn <= 0x00FF_FFFF
                    && bytes[8..16] == [0; 8]
                    && bytes[20..24] == [0; 4]
                    && verdict <= 2;
                let decoded = matches!(got, Ok(Some(OobMessage::Check(CheckMessage::Verdict(_)))));
                prop_assert_eq!(decoded, ok);
            }
            _ => {
                prop_assert_eq!(got, Err(OobError::UnknownRecordKind { kind }));
                prop_assert_eq!(dec.finish(), Err(OobError::UnknownRecordKind { kind }));
            }
        }
    }

    #[test]
    fn any_split_of_a_stream_gives_the_same_messages(
        h in hello(),
        proof in any::<[u8; 32]>(),
        records in proptest::collection::vec(record(), 0..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut stream = h.to_bytes().to_vec();
        stream.extend_from_slice(&proof);
        for r in &records {
            stream.extend_from_slice(&r.to_bytes().unwrap());
        }
        let mut expected = vec![OobMessage::Hello(h), OobMessage::Proof(Proof(proof))];
        expected.extend(records.iter().map(message_of));

        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();

        let mut dec = OobDecoder::new();
        let mut got = Vec::new();
        for w in points.windows(2) {
            let mut input = &stream[w[0]..w[1]];
            while let Some(m) = dec.decode(&mut input).expect("valid stream") {
                got.push(m);
            }
            prop_assert!(input.is_empty());
        }
        prop_assert_eq!(got, expected);
        prop_assert_eq!(dec.finish(), Ok(()));
    }
}
