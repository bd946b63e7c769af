//! Fuzz-style property tests of the descriptor codecs.
//!
//! - Random 32-byte descriptors (and random pairs) into every decoder: no panic, and when
//!   decoding succeeds, re-encoding reproduces every meaningful bit of the input (the bits
//!   listed below per descriptor, from layout-verification.md 1.1-1.5) and sets nothing
//!   outside them but the header bits the encoder always writes.
//! - Random typed values round-trip encode -> decode.

use core::net::Ipv4Addr;

use bluerdma_core::addr::{DeviceAddr, VirtAddr};
use bluerdma_core::desc::cmd::{
    CmdOpcode, CmdRequest, CmdResponse, ManageQp, SetNetworkParam, SetRawPacketReceiveMeta,
    UpdateMrTable, UpdatePgt,
};
use bluerdma_core::desc::meta::{
    AckExtra, AckReport, MetaReport, PacketInfo, RdmaOpcode, ReadReqExt,
};
use bluerdma_core::desc::pgt::{self, PgtEntry};
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_SLOTS};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType, RawDesc};
use bluerdma_core::keys::{MrKey, Qpn, PGT_LEN};
use bluerdma_core::mtu::Pmtu;
use proptest::prelude::*;

/// `(lo, width)` bit ranges.
type Ranges = &'static [(u32, u32)];

fn mask_of(ranges: Ranges) -> [u8; 32] {
    let mut m = [0u8; 32];
    for &(lo, width) in ranges {
        for n in lo..lo + width {
            m[(n / 8) as usize] |= 1 << (n % 8);
        }
    }
    m
}

/// `a` and `b` agree on the bits of `mask`.
fn agree(a: &RawDesc, b: &RawDesc, mask: &[u8; 32]) -> bool {
    a.0.iter()
        .zip(b.0.iter())
        .zip(mask.iter())
        .all(|((x, y), m)| x & m == y & m)
}

/// `d` has no bit set outside `allowed`.
fn only(d: &RawDesc, allowed: &[u8; 32]) -> bool {
    d.0.iter().zip(allowed.iter()).all(|(x, m)| x & !m == 0)
}

const VALID: (u32, u32) = (255, 1);
const HAS_NEXT: (u32, u32) = (254, 1);
const EXT: (u32, u32) = (248, 1);

// Meaningful bits per descriptor (fields + the op code bits the decoder reads).
const UPDATE_MR_TABLE: Ranges = &[
    (7, 17),
    (24, 8),
    (32, 32),
    (64, 32),
    (96, 32),
    (128, 64),
    (224, 8),
    (240, 3),
];
const UPDATE_PGT: Ranges = &[(64, 32), (96, 32), (128, 64), (224, 8), (240, 3)];
const MANAGE_QP: Ranges = &[
    (0, 48),
    (48, 16),
    (85, 3),
    (92, 4),
    (96, 8),
    (104, 24),
    (128, 32), // pd: this project's extension in reserved bits
    (160, 24),
    (190, 1),
    (191, 1),
    (192, 32),
    (224, 8),
    (240, 3),
];
const SET_NETWORK_PARAM: Ranges = &[(16, 48), (96, 32), (128, 32), (160, 32), (224, 8), (240, 3)];
const SET_RAW_PACKET_RECEIVE_META: Ranges = &[(128, 64), (224, 8), (240, 3)];
const CMD_RESPONSE: Ranges = &[(0, 128), (128, 96), (224, 8), (232, 1), (240, 8), HAS_NEXT];
const SEG0: Ranges = &[
    (3, 5),
    (8, 24),
    (36, 4),
    (40, 24),
    (64, 64),
    (128, 32),
    (160, 32),
    (192, 32),
    (224, 16),
    (240, 4),
    HAS_NEXT,
];
const SEG1: Ranges = &[
    (0, 64),
    (64, 32),
    (96, 32),
    (128, 16),
    (144, 48),
    (192, 32),
    (224, 8),
    (233, 1),
    (234, 1),
    (235, 1),
    (236, 1),
    (237, 3),
    HAS_NEXT,
];
const PACKET_INFO: Ranges = &[
    (0, 32),
    (32, 32),
    (64, 64),
    (128, 32),
    (168, 24),
    (196, 1),
    (197, 1),
    (198, 1),
    (199, 1),
    (200, 24),
    (224, 16),
    (240, 8),
    HAS_NEXT,
];
const READ_REQ_EXT: Ranges = &[(96, 32), (128, 64), (192, 32), (240, 8), HAS_NEXT];
const ACK: Ranges = &[
    (0, 128),
    (128, 16),
    (144, 24),
    (168, 24),
    (200, 24),
    (232, 1),
    (233, 1),
    (234, 1),
    (235, 1),
    (240, 8),
    HAS_NEXT,
];
const ACK_EXTRA: Ranges = &[(0, 128), (240, 8), HAS_NEXT];
const SIMPLE_NIC_TX: Ranges = &[(128, 64), (192, 32)];
const SIMPLE_NIC_RX: Ranges = &[(160, 32), (192, 32), (240, 8)];

/// Checks that `encoded` reproduces `input` on `meaningful` and sets nothing else but
/// `always` (header bits every encoder writes).
fn assert_reencodes(
    what: &str,
    input: &RawDesc,
    encoded: &RawDesc,
    meaningful: Ranges,
    always: Ranges,
) -> Result<(), TestCaseError> {
    let m = mask_of(meaningful);
    prop_assert!(
        agree(input, encoded, &m),
        "{what}: input {input:?} re-encoded {encoded:?}"
    );
    let mut allowed = m;
    for (a, b) in allowed.iter_mut().zip(mask_of(always)) {
        *a |= b;
    }
    prop_assert!(only(encoded, &allowed), "{what}: stray bits in {encoded:?}");
    Ok(())
}

fn desc() -> impl Strategy<Value = RawDesc> {
    any::<[u8; 32]>().prop_map(RawDesc)
}

/// A random descriptor with its op code and has_next chosen from plausible values, so that
/// decoders get past their first checks often.
fn desc_with(op: impl Strategy<Value = u8>, has_next: bool) -> impl Strategy<Value = RawDesc> {
    (any::<[u8; 32]>(), op).prop_map(move |(b, op)| {
        let mut d = RawDesc(b);
        d.set_op_code(op);
        d.set_has_next(has_next);
        d
    })
}

/// UpdatePGT decodes only with a zero_based_entry_count below 64: clear bits 70..95.
fn small_pgt_count(d: impl Strategy<Value = RawDesc>) -> impl Strategy<Value = RawDesc> {
    d.prop_map(|mut d| {
        d.set_bits(70, 26, 0);
        d
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn cmd_request_decode(
        d in prop_oneof![desc(), desc_with(0u8..16, false), small_pgt_count(desc_with(Just(1u8), false))]
    ) {
        if let Ok((req, user_data)) = CmdRequest::decode(&d) {
            let meaningful = match req {
                CmdRequest::UpdateMrTable(_) => UPDATE_MR_TABLE,
                CmdRequest::UpdatePgt(_) => UPDATE_PGT,
                CmdRequest::ManageQp(_) => MANAGE_QP,
                CmdRequest::SetNetworkParam(_) => SET_NETWORK_PARAM,
                CmdRequest::SetRawPacketReceiveMeta(_) => SET_RAW_PACKET_RECEIVE_META,
            };
            prop_assert!(!d.has_next());
            prop_assert_eq!(CmdOpcode::decode_rtl(d.op_code()), req.opcode());
            let e = req.encode(user_data);
            assert_reencodes("cmd request", &d, &e, meaningful, &[VALID])?;
        }
    }

    #[test]
    fn cmd_response_decode(d in desc()) {
        if let Ok(resp) = CmdResponse::decode(&d) {
            assert_reencodes("cmd response", &d, &resp.encode(), CMD_RESPONSE, &[VALID])?;
        } else {
            prop_assert!(d.has_next());
        }
    }

    #[test]
    fn send_pair_decode(
        (a, b) in prop_oneof![
            (desc(), desc()),
            (desc_with(any::<u8>(), true), desc_with(any::<u8>(), false)),
        ]
    ) {
        if let Ok(req) = SendRequest::decode(&a, &b) {
            let [e0, e1] = req.encode();
            assert_reencodes("seg0", &a, &e0, SEG0, &[VALID])?;
            // Seg1's op byte is ignored on decode and written as Seg0's.
            assert_reencodes("seg1", &b, &e1, SEG1, &[VALID, (240, 4)])?;
            prop_assert_eq!(e1.op_code(), e0.op_code());
            let (mut s0, mut s1) = (RawDesc::ZERO, RawDesc::ZERO);
            req.encode_into(&mut s0, &mut s1);
            prop_assert_eq!([s0, s1], [e0, e1]);
        } else {
            prop_assert!(!a.has_next() || b.has_next() || Pmtu::from_ibv(b.get_bits(237, 3) as u8).is_none());
        }
    }

    #[test]
    fn meta_report_decode(
        first in prop_oneof![
            desc(),
            desc_with(0u8..0x18, false),
            desc_with(prop_oneof![Just(0x0Cu8), Just(0x11u8)], true),
        ],
        second in prop_oneof![desc(), desc_with(any::<u8>(), false)],
        same_op in any::<bool>(),
        follow_has_next in prop::bool::weighted(0.8),
        give_second in any::<bool>(),
    ) {
        // Mostly well-formed pairs (second given iff has_next, same op code), some not.
        let mut second = second;
        if same_op {
            second.set_op_code(first.op_code());
        }
        let give_second = if follow_has_next { first.has_next() } else { give_second };
        let second = give_second.then_some(&second);
        if let Ok(report) = MetaReport::decode(&first, second) {
            let (e0, e1) = report.encode();
            prop_assert_eq!(e1.is_some(), second.is_some());
            let (first_bits, second_bits) = match report {
                MetaReport::Packet(_) => (PACKET_INFO, None),
                MetaReport::ReadRequest(..) => (PACKET_INFO, Some(READ_REQ_EXT)),
                MetaReport::Ack(_) => (ACK, None),
                MetaReport::Nak(..) => (ACK, Some(ACK_EXTRA)),
            };
            assert_reencodes("meta first", &first, &e0, first_bits, &[VALID])?;
            if let (Some(s), Some(e1), Some(bits)) = (second, e1, second_bits) {
                assert_reencodes("meta second", s, &e1, bits, &[VALID])?;
            }
        }
    }

    #[test]
    fn simple_nic_decode(
        d in prop_oneof![
            desc(),
            desc_with(Just(0u8), false),
            desc_with(Just(0u8), false).prop_map(|mut d| {
                d.set_bits(170, 22, 0); // slot_idx < 1024
                d
            }),
        ]
    ) {
        let tx = SimpleNicTx::decode(&d);
        assert_reencodes("simple-NIC TX", &d, &tx.encode(), SIMPLE_NIC_TX, &[VALID])?;
        match SimpleNicRx::decode(&d) {
            Ok(rx) => {
                prop_assert!(rx.slot_idx < RX_SLOTS);
                assert_reencodes("simple-NIC RX", &d, &rx.encode(), SIMPLE_NIC_RX, &[VALID, EXT])?;
            }
            Err(_) => prop_assert!(d.op_code() != 0 || d.get_bits(160, 32) >= u64::from(RX_SLOTS)),
        }
    }

    #[test]
    fn small_slot_indices_decode(slot in 0u32..RX_SLOTS, len in any::<u32>(), ext in any::<bool>()) {
        let mut d = SimpleNicRx { slot_idx: slot, len }.encode();
        d.set_is_extended_op_code(ext);
        prop_assert_eq!(SimpleNicRx::decode(&d), Ok(SimpleNicRx { slot_idx: slot, len }));
    }

    #[test]
    fn pgt_entries_and_staging_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        count in prop_oneof![any::<u32>(), 0u32..80],
        addr in prop_oneof![any::<u64>(), any::<u64>().prop_map(|a| a & !0x1FF)],
        start in prop_oneof![any::<u32>(), 0..PGT_LEN],
        n in 0usize..20,
    ) {
        if let Ok(entries) = pgt::staged_entries(&bytes, count) {
            for (i, e) in entries.enumerate() {
                let raw: [u8; 8] = bytes[i * 8..i * 8 + 8].try_into().unwrap();
                prop_assert_eq!(e.encode(), raw);
            }
        }
        let _ = pgt::check_staging(DeviceAddr(addr), count);
        let entries: Vec<DeviceAddr> = (0..n as u64).map(|i| DeviceAddr(addr ^ i)).collect();
        let mut buf = bytes.clone();
        if let Ok(cmd) = pgt::stage_pgt_update(&mut buf, DeviceAddr(addr), start, &entries) {
            prop_assert_eq!(cmd.check_staging(), Ok(()));
            prop_assert_eq!(CmdRequest::UpdatePgt(cmd).validate(), Ok(()));
            let back: Vec<PgtEntry> = pgt::staged_entries(&buf, cmd.entry_count).unwrap().collect();
            prop_assert_eq!(back, entries.iter().map(|&a| PgtEntry(a)).collect::<Vec<_>>());
        } else {
            prop_assert_eq!(&buf, &bytes, "nothing written on error");
        }
    }

    #[test]
    fn bit_helpers_match_a_bitwise_model(
        d in desc(), lo in 0u32..256, width in 1u32..=64, value in any::<u64>(),
    ) {
        let slow = |d: &RawDesc| {
            (0..width).filter(|k| lo + k < 256).fold(0u64, |v, k| {
                let n = lo + k;
                v | (u64::from(d.0[(n / 8) as usize] >> (n % 8) & 1) << k)
            })
        };
        prop_assert_eq!(d.get_bits(lo, width), slow(&d));
        let mut e = d;
        e.set_bits(lo, width, value);
        let kept = 256u32.saturating_sub(lo).min(width);
        let wanted = if kept == 64 { value } else { value & ((1 << kept) - 1) };
        prop_assert_eq!(e.get_bits(lo, width), wanted);
        for n in 0..256 {
            if n < lo || n >= lo + width {
                prop_assert_eq!(e.bit(n), d.bit(n), "bit {} outside the range changed", n);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Typed values round-trip.

fn qpn() -> impl Strategy<Value = Qpn> {
    (0u32..=0xFF_FFFF).prop_map(Qpn::from_raw)
}
fn mr_key() -> impl Strategy<Value = MrKey> {
    any::<u32>().prop_map(MrKey::from_raw)
}
fn pmtu() -> impl Strategy<Value = Pmtu> {
    (1u8..=5).prop_map(|v| Pmtu::from_ibv(v).unwrap())
}
fn qp_type() -> impl Strategy<Value = QpType> {
    (0u32..16).prop_map(QpType::from_ibv)
}
fn mac() -> impl Strategy<Value = MacAddr> {
    (0u64..1 << 48).prop_map(MacAddr::from_bits)
}
fn ip() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}
fn access() -> impl Strategy<Value = AccessFlags> {
    any::<u8>().prop_map(AccessFlags::from_bits_retain)
}
fn psn() -> impl Strategy<Value = u32> {
    0u32..1 << 24
}
fn va() -> impl Strategy<Value = VirtAddr> {
    any::<u64>().prop_map(VirtAddr)
}
fn dev() -> impl Strategy<Value = DeviceAddr> {
    any::<u64>().prop_map(DeviceAddr)
}

fn cmd_request() -> impl Strategy<Value = CmdRequest> {
    prop_oneof![
        (
            va(),
            any::<u32>(),
            mr_key(),
            any::<u32>(),
            access(),
            0u32..1 << 17
        )
            .prop_map(
                |(mr_base_va, mr_length, mr_key, pd, acc_flags, pgt_offset)| {
                    CmdRequest::from(UpdateMrTable {
                        mr_base_va,
                        mr_length,
                        mr_key,
                        pd,
                        acc_flags,
                        pgt_offset,
                    })
                }
            ),
        (dev(), any::<u32>(), 1u32..=64).prop_map(|(dma_addr, start_index, entry_count)| {
            CmdRequest::from(UpdatePgt {
                dma_addr,
                start_index,
                entry_count,
            })
        }),
        (
            any::<(bool, bool, u32)>(),
            qpn(),
            qpn(),
            access(),
            qp_type(),
            pmtu(),
            any::<u16>(),
            mac(),
            ip()
        )
            .prop_map(
                |(
                    (is_valid, is_error, pd),
                    qpn,
                    peer_qpn,
                    rq_access_flags,
                    qp_type,
                    pmtu,
                    local_udp_port,
                    peer_mac,
                    peer_ip,
                )| {
                    CmdRequest::from(ManageQp {
                        is_valid,
                        is_error,
                        pd,
                        qpn,
                        peer_qpn,
                        rq_access_flags,
                        qp_type,
                        pmtu,
                        local_udp_port,
                        peer_mac,
                        peer_ip,
                    })
                }
            ),
        (mac(), ip(), ip(), ip()).prop_map(|(mac, ip, netmask, gateway)| {
            CmdRequest::from(SetNetworkParam {
                mac,
                ip,
                netmask,
                gateway,
            })
        }),
        dev().prop_map(|write_base_addr| CmdRequest::from(SetRawPacketReceiveMeta {
            write_base_addr
        })),
    ]
}

fn send_request() -> impl Strategy<Value = SendRequest> {
    let seg0 = (
        (0u8..16).prop_map(WorkReqOpcode::from_raw),
        (0u8..32).prop_map(SendFlags::from_bits_retain),
        qpn(),
        qp_type(),
        psn(),
        va(),
        ip(),
        mr_key(),
        any::<u32>(),
        any::<u16>(),
    )
        .prop_map(
            |(op, flags, dqpn, qp_type, psn, raddr, dqp_ip, rkey, total_len, msn)| SendSeg0 {
                op,
                flags,
                dqpn,
                qp_type,
                psn,
                raddr,
                dqp_ip,
                rkey,
                total_len,
                msn,
            },
        );
    let seg1 = (
        va(),
        any::<u32>(),
        mr_key(),
        qpn(),
        mac(),
        any::<u32>(),
        any::<[bool; 4]>(),
        pmtu(),
    )
        .prop_map(
            |(
                laddr,
                len,
                lkey,
                sqpn,
                mac,
                imm,
                [enable_ecn, is_retry, is_last, is_first],
                pmtu,
            )| {
                SendSeg1 {
                    laddr,
                    len,
                    lkey,
                    sqpn,
                    mac,
                    imm,
                    enable_ecn,
                    is_retry,
                    is_last,
                    is_first,
                    pmtu,
                }
            },
        );
    (seg0, seg1).prop_map(|(seg0, seg1)| SendRequest { seg0, seg1 })
}

fn packet_info(opcode: impl Strategy<Value = u8>) -> impl Strategy<Value = PacketInfo> {
    (
        opcode.prop_map(RdmaOpcode::from_raw),
        psn(),
        any::<u16>(),
        qpn(),
        va(),
        mr_key(),
        any::<u32>(),
        any::<u32>(),
        any::<[bool; 4]>(),
    )
        .prop_map(
            |(
                opcode,
                psn,
                msn,
                dqpn,
                raddr,
                rkey,
                total_len,
                imm_data,
                [is_retry, ack_req, solicited, ecn_marked],
            )| PacketInfo {
                opcode,
                psn,
                msn,
                dqpn,
                raddr,
                rkey,
                total_len,
                imm_data,
                is_retry,
                ack_req,
                solicited,
                ecn_marked,
            },
        )
}

fn ack_report() -> impl Strategy<Value = AckReport> {
    (
        any::<u128>(),
        any::<u16>(),
        qpn(),
        psn(),
        psn(),
        any::<[bool; 4]>(),
    )
        .prop_map(
            |(now_bitmap, msn, qpn, psn_now, psn_before_slide, flags)| AckReport {
                now_bitmap,
                msn,
                qpn,
                psn_now,
                psn_before_slide,
                is_packet_lost: flags[0],
                is_window_slided: flags[1],
                is_send_by_driver: flags[2],
                is_send_by_local_hw: flags[3],
            },
        )
}

fn meta_report() -> impl Strategy<Value = MetaReport> {
    let data_op = (0u8..=0x10).prop_filter("not a READ request", |&op| op != 0x0C);
    prop_oneof![
        packet_info(data_op).prop_map(MetaReport::Packet),
        (packet_info(Just(0x0C)), mr_key(), va(), any::<u32>()).prop_map(
            |(p, lkey, laddr, total_len)| MetaReport::ReadRequest(
                p,
                ReadReqExt {
                    lkey,
                    laddr,
                    total_len
                }
            )
        ),
        ack_report().prop_map(MetaReport::Ack),
        (ack_report(), any::<u128>())
            .prop_map(|(a, pre_bitmap)| MetaReport::Nak(a, AckExtra { pre_bitmap })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn cmd_request_round_trips(req in cmd_request(), user_data in any::<u8>()) {
        let d = req.encode(user_data);
        prop_assert_eq!(CmdRequest::decode(&d), Ok((req, user_data)));
        let resp = CmdResponse::echo(&d);
        prop_assert_eq!(resp.user_data, user_data);
        prop_assert_eq!(resp.op, req.opcode());
        prop_assert_eq!(CmdResponse::decode(&resp.encode()), Ok(resp));
    }

    #[test]
    fn send_request_round_trips(req in send_request()) {
        let [a, b] = req.encode();
        prop_assert!(a.valid() && a.has_next() && b.valid() && !b.has_next());
        prop_assert_eq!(SendRequest::decode(&a, &b), Ok(req));
    }

    #[test]
    fn meta_report_round_trips(report in meta_report()) {
        let (a, b) = report.encode();
        prop_assert!(a.valid());
        prop_assert_eq!(a.has_next(), b.is_some());
        prop_assert_eq!(MetaReport::decode(&a, b.as_ref()), Ok(report));
    }

    #[test]
    fn simple_nic_round_trips(addr in dev(), len in any::<u32>(), slot_idx in 0..RX_SLOTS) {
        let tx = SimpleNicTx { addr, len };
        prop_assert_eq!(SimpleNicTx::decode(&tx.encode()), tx);
        let rx = SimpleNicRx { slot_idx, len };
        prop_assert_eq!(SimpleNicRx::decode(&rx.encode()), Ok(rx));
    }

    #[test]
    fn pgt_entry_round_trips(raw in any::<[u8; 8]>()) {
        prop_assert_eq!(PgtEntry::decode(raw).encode(), raw);
    }
}
