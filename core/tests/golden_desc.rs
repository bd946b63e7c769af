//! Golden tests of every descriptor codec (hardware-contract.md decision 1).
//!
//! (a) The golden vectors of layout-verification.md section 5, as literal bytes: the fields
//!     encode to exactly those bytes and the bytes decode to exactly those fields.
//! (b) Field isolation: each field set to all ones (or its largest legal value), the others
//!     zero, must set exactly the bit range written below by hand from the tables of
//!     layout-verification.md 1.1-1.5. The expected bytes are built bit by bit here, without
//!     the codec's `BitField` constants or `RawDesc::set_bits`, so a mistake shared by a
//!     codec constant and its reading of the table is caught.

use core::net::Ipv4Addr;

use bluerdma_core::addr::{DeviceAddr, VirtAddr};
use bluerdma_core::desc::cmd::{
    CmdOpcode, CmdRequest, CmdResponse, ManageQp, SetNetworkParam, SetRawPacketReceiveMeta,
    UpdateMrTable, UpdatePgt,
};
use bluerdma_core::desc::meta::{
    AckExtra, AckReport, MetaReport, PacketInfo, RdmaOpcode, ReadReqExt,
};
use bluerdma_core::desc::pgt::PgtEntry;
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx};
use bluerdma_core::desc::{AccessFlags, DescError, DescKind, MacAddr, QpType, RawDesc};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;

// ---------------------------------------------------------------------------------------
// Section 5 golden vectors, memory order byte 0 .. byte 31.

const V1_UPDATE_MR_TABLE: [u8; 32] = [
    0x80, 0xe6, 0xd5, 0x0f, 0x00, 0x00, 0x00, 0x00, 0xa5, 0xff, 0x1f, 0x00, 0x00, 0x00, 0x40, 0x00,
    0x00, 0x00, 0x60, 0x34, 0x12, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x5a, 0x00, 0x00, 0x80,
];
const V2_UPDATE_PGT: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x60, 0x45, 0x23, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x80,
];
const V3_MANAGE_QP: [u8; 32] = [
    0x0a, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x00, 0x01, 0x00, 0x00, 0xa0, 0x20, 0x07, 0xcd, 0x45, 0x03,
    0x00, 0x00, 0x00, 0x00, 0xab, 0x23, 0x01, 0x80, 0x0b, 0x33, 0x22, 0x11, 0x02, 0x00, 0x02, 0x80,
];
const V4_SET_NETWORK_PARAM: [u8; 32] = [
    0x00, 0x00, 0x0a, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x33, 0x22, 0x11,
    0x00, 0xff, 0xff, 0xff, 0x01, 0x33, 0x22, 0x11, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x03, 0x80,
];
const V5_SET_RAW_PACKET_RECEIVE_META: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x20, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x04, 0x80,
];
const V6_CMD_RESPONSE: [u8; 32] = [
    0x00, 0x00, 0x0a, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x33, 0x22, 0x11,
    0x00, 0xff, 0xff, 0xff, 0x01, 0x33, 0x22, 0x11, 0x00, 0x00, 0x00, 0x00, 0x03, 0x01, 0x03, 0x80,
];
const V7_SEND_SEG0: [u8; 32] = [
    0x10, 0xcd, 0x45, 0x03, 0x20, 0x02, 0x01, 0x00, 0x00, 0x00, 0xad, 0xde, 0x00, 0x7f, 0x00, 0x00,
    0x0b, 0x33, 0x22, 0x11, 0xa5, 0xff, 0x1f, 0x00, 0x00, 0x00, 0x01, 0x00, 0x07, 0x00, 0x01, 0xc0,
];
const V8_SEND_SEG1: [u8; 32] = [
    0x40, 0x00, 0x60, 0x34, 0x12, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0xa6, 0xfe, 0x1f, 0x00,
    0x23, 0x01, 0x0a, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0xbe, 0xba, 0xfe, 0xca, 0xab, 0xb8, 0x01, 0x80,
];
const V9_PACKET_INFO: [u8; 32] = [
    0xbe, 0xba, 0xfe, 0xca, 0xa5, 0xff, 0x1f, 0x00, 0x00, 0x00, 0xad, 0xde, 0x00, 0x7f, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0xab, 0x23, 0x01, 0x20, 0x02, 0x01, 0x00, 0x07, 0x00, 0x0b, 0x80,
];
const V10_READ_REQUEST: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0xa5, 0xff, 0x1f, 0x00, 0x00, 0x00, 0xad, 0xde, 0x00, 0x7f, 0x00, 0x00,
    0x00, 0x10, 0x00, 0x00, 0x00, 0xab, 0x23, 0x01, 0x20, 0x00, 0x02, 0x00, 0x08, 0x00, 0x0c, 0xc0,
];
const V11_READ_REQ_EXT: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa6, 0xfe, 0x1f, 0x00,
    0x00, 0x00, 0x60, 0x34, 0x12, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x80,
];
const V12_ACK: [u8; 32] = [
    0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,
    0x07, 0x00, 0xab, 0x23, 0x01, 0x00, 0x01, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x0b, 0x11, 0xc0,
];
const V13_ACK_EXTRA: [u8; 32] = [
    0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11, 0x80,
];
const V14_SIMPLE_NIC_TX: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x22, 0x80, 0x00, 0x00, 0x00, 0x00, 0x5a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80,
];
const V15_SIMPLE_NIC_RX: [u8; 32] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x5a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x81,
];
const PGT_ENTRY_0X123400000: [u8; 8] = [0x00, 0x00, 0x40, 0x23, 0x01, 0x00, 0x00, 0x00];

fn qpn(raw: u32) -> Qpn {
    Qpn::from_raw(raw)
}
fn key(raw: u32) -> MrKey {
    MrKey::from_raw(raw)
}
fn ip(raw: u32) -> Ipv4Addr {
    Ipv4Addr::from(raw)
}
fn mac(raw: u64) -> MacAddr {
    MacAddr::from_bits(raw)
}

// ---------------------------------------------------------------------------------------
// (a) golden vectors

fn v1_fields() -> UpdateMrTable {
    UpdateMrTable {
        mr_base_va: VirtAddr(0x0000_7F12_3460_0000),
        mr_length: 0x0040_0000,
        mr_key: key(0x001F_FFA5),
        pd: 0,
        acc_flags: AccessFlags::from_bits_retain(0x0F),
        pgt_offset: 0x1ABCD,
    }
}
fn v3_fields() -> ManageQp {
    ManageQp {
        is_valid: true,
        is_error: false,
        pd: 0,
        qpn: qpn(0x0123AB),
        peer_qpn: qpn(0x0345CD),
        rq_access_flags: AccessFlags::from_bits_retain(0x07),
        qp_type: QpType::Rc,
        pmtu: Pmtu::Mtu4096,
        local_udp_port: 0x0100,
        peer_mac: mac(0xAABB_CCDD_EE0A),
        peer_ip: Ipv4Addr::new(0x11, 0x22, 0x33, 0x0B),
    }
}
fn v4_fields() -> SetNetworkParam {
    SetNetworkParam {
        mac: mac(0xAABB_CCDD_EE0A),
        ip: ip(0x1122_330A),
        netmask: Ipv4Addr::new(255, 255, 255, 0),
        gateway: ip(0x1122_3301),
    }
}

fn assert_cmd_golden(req: CmdRequest, user_data: u8, bytes: [u8; 32]) {
    assert_eq!(req.encode(user_data), RawDesc(bytes), "encode {req:?}");
    assert_eq!(
        CmdRequest::decode(&RawDesc(bytes)),
        Ok((req, user_data)),
        "decode {bytes:02x?}"
    );
}

#[test]
fn golden_1_update_mr_table() {
    assert_cmd_golden(v1_fields().into(), 0x5A, V1_UPDATE_MR_TABLE);
    assert_eq!(
        RawDesc(V1_UPDATE_MR_TABLE).words(),
        [
            0x0000_0000_0fd5_e680,
            0x0040_0000_001f_ffa5,
            0x0000_7f12_3460_0000,
            0x8000_005a_0000_0000
        ]
    );
}

#[test]
fn golden_1_with_pd_puts_a_le_u32_in_bytes_4_to_7() {
    let req = UpdateMrTable {
        pd: 0x0403_0201,
        ..v1_fields()
    };
    let mut bytes = V1_UPDATE_MR_TABLE;
    bytes[4..8].copy_from_slice(&[1, 2, 3, 4]);
    assert_cmd_golden(req.into(), 0x5A, bytes);
}

#[test]
fn golden_2_update_pgt() {
    let req = UpdatePgt {
        dma_addr: DeviceAddr(0x0000_0001_2345_6000),
        start_index: 0x100,
        entry_count: 16,
    };
    assert_cmd_golden(req.into(), 0x01, V2_UPDATE_PGT);
}

#[test]
fn golden_3_manage_qp() {
    assert_cmd_golden(v3_fields().into(), 0x02, V3_MANAGE_QP);
    assert_eq!(
        v3_fields().peer_mac.octets(),
        [0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0A]
    );
}

#[test]
fn golden_4_set_network_param() {
    assert_cmd_golden(v4_fields().into(), 0x03, V4_SET_NETWORK_PARAM);
}

#[test]
fn golden_5_set_raw_packet_receive_meta() {
    let req = SetRawPacketReceiveMeta {
        write_base_addr: DeviceAddr(0x8020_0000),
    };
    assert_cmd_golden(req.into(), 0x04, V5_SET_RAW_PACKET_RECEIVE_META);
}

#[test]
fn golden_6_command_response_echoes_the_request() {
    let resp = CmdResponse::echo(&RawDesc(V4_SET_NETWORK_PARAM));
    assert_eq!(resp.encode(), RawDesc(V6_CMD_RESPONSE));
    let mut echo = [0u8; 28];
    echo.copy_from_slice(&V4_SET_NETWORK_PARAM[..28]);
    assert_eq!(
        CmdResponse::decode(&RawDesc(V6_CMD_RESPONSE)),
        Ok(CmdResponse {
            op: CmdOpcode::SetNetworkParam,
            user_data: 0x03,
            is_success: true,
            echo,
        })
    );
}

fn v7_seg0() -> SendSeg0 {
    SendSeg0 {
        op: WorkReqOpcode::WriteWithImm,
        flags: SendFlags::SIGNALED,
        dqpn: qpn(0x0345CD),
        qp_type: QpType::Rc,
        psn: 0x000102,
        raddr: VirtAddr(0x0000_7F00_DEAD_0000),
        dqp_ip: ip(0x1122_330B),
        rkey: key(0x001F_FFA5),
        total_len: 0x10000,
        msn: 7,
    }
}
fn v8_seg1() -> SendSeg1 {
    SendSeg1 {
        laddr: VirtAddr(0x0000_7F12_3460_0040),
        len: 0x10000,
        lkey: key(0x001F_FEA6),
        sqpn: qpn(0x0123AB),
        mac: mac(0xAABB_CCDD_EE0A),
        imm: 0xCAFE_BABE,
        enable_ecn: false,
        is_retry: false,
        is_last: true,
        is_first: true,
        pmtu: Pmtu::Mtu4096,
    }
}

#[test]
fn golden_7_8_send_request() {
    let req = SendRequest {
        seg0: v7_seg0(),
        seg1: v8_seg1(),
    };
    assert_eq!(req.encode(), [RawDesc(V7_SEND_SEG0), RawDesc(V8_SEND_SEG1)]);
    let (mut a, mut b) = (RawDesc([0xFF; 32]), RawDesc([0xFF; 32]));
    req.encode_into(&mut a, &mut b);
    assert_eq!((a, b), (RawDesc(V7_SEND_SEG0), RawDesc(V8_SEND_SEG1)));
    assert_eq!(
        SendRequest::decode(&RawDesc(V7_SEND_SEG0), &RawDesc(V8_SEND_SEG1)),
        Ok(req)
    );
    assert_eq!(
        RawDesc(V7_SEND_SEG0).words(),
        [
            0x0001_0220_0345_cd10,
            0x0000_7f00_dead_0000,
            0x001f_ffa5_1122_330b,
            0xc001_0007_0001_0000
        ]
    );
}

fn v9_packet() -> PacketInfo {
    PacketInfo {
        opcode: RdmaOpcode::WriteOnlyWithImm,
        psn: 0x102,
        msn: 7,
        dqpn: qpn(0x0123AB),
        raddr: VirtAddr(0x0000_7F00_DEAD_0000),
        rkey: key(0x001F_FFA5),
        total_len: 0x10000,
        imm_data: 0xCAFE_BABE,
        is_retry: false,
        ack_req: true,
        solicited: false,
        ecn_marked: false,
    }
}

#[test]
fn golden_9_packet_basic_info() {
    let report = MetaReport::Packet(v9_packet());
    assert_eq!(report.encode(), (RawDesc(V9_PACKET_INFO), None));
    assert_eq!(
        MetaReport::decode(&RawDesc(V9_PACKET_INFO), None),
        Ok(report)
    );
}

#[test]
fn golden_10_11_read_request() {
    let report = MetaReport::ReadRequest(
        PacketInfo {
            opcode: RdmaOpcode::ReadRequest,
            psn: 0x200,
            msn: 8,
            total_len: 0x1000,
            imm_data: 0,
            ..v9_packet()
        },
        ReadReqExt {
            lkey: key(0x001F_FEA6),
            laddr: VirtAddr(0x0000_7F12_3460_0000),
            total_len: 0x1000,
        },
    );
    assert_eq!(
        report.encode(),
        (RawDesc(V10_READ_REQUEST), Some(RawDesc(V11_READ_REQ_EXT)))
    );
    assert_eq!(
        MetaReport::decode(&RawDesc(V10_READ_REQUEST), Some(&RawDesc(V11_READ_REQ_EXT))),
        Ok(report)
    );
}

#[test]
fn golden_12_13_nak_from_local_hw() {
    let report = MetaReport::Nak(
        AckReport {
            now_bitmap: 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210,
            msn: 7,
            qpn: qpn(0x0123AB),
            psn_now: 0x100,
            psn_before_slide: 0x80,
            is_packet_lost: true,
            is_window_slided: true,
            is_send_by_driver: false,
            is_send_by_local_hw: true,
        },
        AckExtra {
            pre_bitmap: 0xFFFF_FFFF_FFFF_FFFF_0000_0000_0000_00FF,
        },
    );
    assert_eq!(
        report.encode(),
        (RawDesc(V12_ACK), Some(RawDesc(V13_ACK_EXTRA)))
    );
    assert_eq!(
        MetaReport::decode(&RawDesc(V12_ACK), Some(&RawDesc(V13_ACK_EXTRA))),
        Ok(report)
    );
    assert_eq!(
        RawDesc(V12_ACK).words(),
        [
            0xfedc_ba98_7654_3210,
            0x0123_4567_89ab_cdef,
            0x0001_0001_23ab_0007,
            0xc011_0b00_0000_8000
        ]
    );
}

#[test]
fn golden_14_simple_nic_tx() {
    let tx = SimpleNicTx {
        addr: DeviceAddr(0x8022_0000),
        len: 90,
    };
    assert_eq!(tx.encode(), RawDesc(V14_SIMPLE_NIC_TX));
    assert_eq!(SimpleNicTx::decode(&RawDesc(V14_SIMPLE_NIC_TX)), tx);
}

#[test]
fn golden_15_simple_nic_rx_as_written_by_the_rtl() {
    let rx = SimpleNicRx {
        slot_idx: 5,
        len: 90,
    };
    assert_eq!(rx.encode(), RawDesc(V15_SIMPLE_NIC_RX));
    assert_eq!(SimpleNicRx::decode(&RawDesc(V15_SIMPLE_NIC_RX)), Ok(rx));
}

#[test]
fn golden_pgt_entry() {
    let e = PgtEntry(DeviceAddr(0x0000_0001_2340_0000));
    assert_eq!(e.encode(), PGT_ENTRY_0X123400000);
    assert_eq!(PgtEntry::decode(PGT_ENTRY_0X123400000), e);
    assert_eq!(e.rtl_page_number(), 0x91A);
}

// ---------------------------------------------------------------------------------------
// (b) field isolation

/// `(lo, width, value)`: bits `lo .. lo + width` hold `value` (width <= 128).
type Bits = &'static [(u32, u32, u128)];

/// The 32 bytes with every listed range written bit by bit (later ranges overwrite
/// earlier ones).
fn bytes_of(parts: &[Bits]) -> [u8; 32] {
    let mut b = [0u8; 32];
    for part in parts {
        for &(lo, width, value) in part.iter() {
            for k in 0..width {
                let n = (lo + k) as usize;
                if (value >> k) & 1 == 1 {
                    b[n / 8] |= 1 << (n % 8);
                } else {
                    b[n / 8] &= !(1 << (n % 8));
                }
            }
        }
    }
    b
}

/// Encoder of a codec under test: one descriptor, or the first and second of a pair.
type Encode<T> = fn(&T) -> (RawDesc, Option<RawDesc>);
/// Decoder of a codec under test.
type Decode<T> = fn(&RawDesc, Option<&RawDesc>) -> Result<T, DescError>;

/// A one- or two-descriptor codec under test.
struct Codec<T> {
    name: &'static str,
    /// Header and always-present bits of the first / second descriptor.
    first_base: Bits,
    second_base: Option<Bits>,
    encode: Encode<T>,
    decode: Decode<T>,
}

/// One field: its value in a struct whose other fields are zero, and the bits that value
/// occupies in the first and second descriptor.
struct Case<T> {
    field: &'static str,
    value: T,
    first: Bits,
    second: Bits,
}

fn check<T: PartialEq + core::fmt::Debug>(codec: &Codec<T>, zero: T, cases: Vec<Case<T>>) {
    let all = core::iter::once(Case {
        field: "(all zero)",
        value: zero,
        first: &[],
        second: &[],
    })
    .chain(cases);
    for case in all {
        let what = format!("{}.{}", codec.name, case.field);
        let first = RawDesc(bytes_of(&[codec.first_base, case.first]));
        let second = codec
            .second_base
            .map(|base| RawDesc(bytes_of(&[base, case.second])));
        assert!(
            codec.second_base.is_some() || case.second.is_empty(),
            "{what}: test table error"
        );
        assert_eq!(
            (codec.encode)(&case.value),
            (first, second),
            "encode {what}"
        );
        assert_eq!(
            (codec.decode)(&first, second.as_ref()),
            Ok(case.value),
            "decode {what}"
        );
    }
}

const ONES_8: u128 = 0xFF;
const ONES_16: u128 = 0xFFFF;
const ONES_24: u128 = 0xFF_FFFF;
const ONES_32: u128 = 0xFFFF_FFFF;
const ONES_48: u128 = 0xFFFF_FFFF_FFFF;
const ONES_64: u128 = u64::MAX as u128;

fn cmd_codec(name: &'static str, first_base: Bits) -> Codec<CmdRequest> {
    Codec {
        name,
        first_base,
        second_base: None,
        encode: |c| (c.encode(0), None),
        decode: |d, _| CmdRequest::decode(d).map(|(c, _)| c),
    }
}

fn case<T>(field: &'static str, value: T, first: Bits) -> Case<T> {
    Case {
        field,
        value,
        first,
        second: &[],
    }
}

#[test]
fn isolation_update_mr_table() {
    let zero = UpdateMrTable {
        mr_base_va: VirtAddr(0),
        mr_length: 0,
        mr_key: key(0),
        pd: 0,
        acc_flags: AccessFlags::empty(),
        pgt_offset: 0,
    };
    let c = |f: &dyn Fn(&mut UpdateMrTable)| {
        let mut v = zero;
        f(&mut v);
        CmdRequest::from(v)
    };
    check(
        &cmd_codec("UpdateMrTable", &[(240, 8, 0), (254, 1, 0), (255, 1, 1)]),
        zero.into(),
        vec![
            case(
                "pgt_offset",
                c(&|v| v.pgt_offset = 0x1FFFF),
                &[(7, 17, 0x1FFFF)],
            ),
            case(
                "acc_flags",
                c(&|v| v.acc_flags = AccessFlags::all()),
                &[(24, 8, ONES_8)],
            ),
            case("pd", c(&|v| v.pd = u32::MAX), &[(32, 32, ONES_32)]),
            case(
                "mr_key",
                c(&|v| v.mr_key = key(u32::MAX)),
                &[(64, 32, ONES_32)],
            ),
            case(
                "mr_length",
                c(&|v| v.mr_length = u32::MAX),
                &[(96, 32, ONES_32)],
            ),
            case(
                "mr_base_va",
                c(&|v| v.mr_base_va = VirtAddr(u64::MAX)),
                &[(128, 64, ONES_64)],
            ),
        ],
    );
}

#[test]
fn isolation_update_pgt() {
    let zero = UpdatePgt {
        dma_addr: DeviceAddr(0),
        start_index: 0,
        entry_count: 1,
    };
    let c = |f: &dyn Fn(&mut UpdatePgt)| {
        let mut v = zero;
        f(&mut v);
        CmdRequest::from(v)
    };
    check(
        &cmd_codec("UpdatePgt", &[(240, 8, 1), (254, 1, 0), (255, 1, 1)]),
        zero.into(),
        vec![
            // The largest count the card takes: 64 entries, zero_based 63.
            case(
                "zero_based_entry_count",
                c(&|v| v.entry_count = 64),
                &[(64, 32, 63)],
            ),
            case(
                "start_index",
                c(&|v| v.start_index = u32::MAX),
                &[(96, 32, ONES_32)],
            ),
            case(
                "dma_addr",
                c(&|v| v.dma_addr = DeviceAddr(u64::MAX)),
                &[(128, 64, ONES_64)],
            ),
        ],
    );
}

#[test]
fn isolation_manage_qp() {
    let zero = ManageQp {
        is_valid: false,
        is_error: false,
        pd: 0,
        qpn: qpn(0),
        peer_qpn: qpn(0),
        rq_access_flags: AccessFlags::empty(),
        qp_type: QpType::from_ibv(0),
        pmtu: Pmtu::Mtu256,
        local_udp_port: 0,
        peer_mac: mac(0),
        peer_ip: Ipv4Addr::UNSPECIFIED,
    };
    let c = |f: &dyn Fn(&mut ManageQp)| {
        let mut v = zero;
        f(&mut v);
        CmdRequest::from(v)
    };
    // pmtu cannot be zero: Mtu256 (1) is in the base, at bit 85.
    check(
        &cmd_codec(
            "ManageQp",
            &[(240, 8, 2), (254, 1, 0), (255, 1, 1), (85, 3, 1)],
        ),
        zero.into(),
        vec![
            case(
                "peer_mac_addr",
                c(&|v| v.peer_mac = MacAddr::BROADCAST),
                &[(0, 48, ONES_48)],
            ),
            case(
                "local_udp_port",
                c(&|v| v.local_udp_port = u16::MAX),
                &[(48, 16, ONES_16)],
            ),
            case("pmtu", c(&|v| v.pmtu = Pmtu::Mtu4096), &[(85, 3, 5)]),
            case(
                "qp_type",
                c(&|v| v.qp_type = QpType::from_ibv(15)),
                &[(92, 4, 0xF)],
            ),
            case(
                "rq_access_flags",
                c(&|v| v.rq_access_flags = AccessFlags::all()),
                &[(96, 8, ONES_8)],
            ),
            case(
                "pd (project extension)",
                c(&|v| v.pd = u32::MAX),
                &[(128, 32, 0xFFFF_FFFF)],
            ),
            case(
                "peer_qpn",
                c(&|v| v.peer_qpn = qpn(0xFF_FFFF)),
                &[(104, 24, ONES_24)],
            ),
            case("qpn", c(&|v| v.qpn = qpn(0xFF_FFFF)), &[(160, 24, ONES_24)]),
            case("is_error", c(&|v| v.is_error = true), &[(190, 1, 1)]),
            case("is_valid", c(&|v| v.is_valid = true), &[(191, 1, 1)]),
            case(
                "ip_addr",
                c(&|v| v.peer_ip = Ipv4Addr::BROADCAST),
                &[(192, 32, ONES_32)],
            ),
        ],
    );
}

#[test]
fn isolation_set_network_param() {
    let zero = SetNetworkParam {
        mac: mac(0),
        ip: Ipv4Addr::UNSPECIFIED,
        netmask: Ipv4Addr::UNSPECIFIED,
        gateway: Ipv4Addr::UNSPECIFIED,
    };
    let c = |f: &dyn Fn(&mut SetNetworkParam)| {
        let mut v = zero;
        f(&mut v);
        CmdRequest::from(v)
    };
    check(
        &cmd_codec("SetNetworkParam", &[(240, 8, 3), (254, 1, 0), (255, 1, 1)]),
        zero.into(),
        vec![
            case(
                "mac_addr",
                c(&|v| v.mac = MacAddr::BROADCAST),
                &[(16, 48, ONES_48)],
            ),
            case(
                "ip_addr",
                c(&|v| v.ip = Ipv4Addr::BROADCAST),
                &[(96, 32, ONES_32)],
            ),
            case(
                "netmask",
                c(&|v| v.netmask = Ipv4Addr::BROADCAST),
                &[(128, 32, ONES_32)],
            ),
            case(
                "gateway",
                c(&|v| v.gateway = Ipv4Addr::BROADCAST),
                &[(160, 32, ONES_32)],
            ),
        ],
    );
}

#[test]
fn isolation_set_raw_packet_receive_meta() {
    let v = |a| {
        CmdRequest::from(SetRawPacketReceiveMeta {
            write_base_addr: DeviceAddr(a),
        })
    };
    check(
        &cmd_codec(
            "SetRawPacketReceiveMeta",
            &[(240, 8, 4), (254, 1, 0), (255, 1, 1)],
        ),
        v(0),
        vec![case("write_base_addr", v(u64::MAX), &[(128, 64, ONES_64)])],
    );
}

#[test]
fn isolation_command_user_data_and_response_header() {
    let req = CmdRequest::from(SetRawPacketReceiveMeta {
        write_base_addr: DeviceAddr(0),
    });
    assert_eq!(
        req.encode(0xFF),
        RawDesc(bytes_of(&[&[(240, 8, 4), (255, 1, 1), (224, 8, ONES_8)]]))
    );
    let resp = |f: &dyn Fn(&mut CmdResponse)| {
        let mut r = CmdResponse {
            op: CmdOpcode::UpdateMrTable,
            user_data: 0,
            is_success: false,
            echo: [0; 28],
        };
        f(&mut r);
        r
    };
    let codec = Codec {
        name: "CmdResponse",
        first_base: &[(240, 8, 0), (254, 1, 0), (255, 1, 1)],
        second_base: None,
        encode: |r: &CmdResponse| (r.encode(), None),
        decode: |d, _| CmdResponse::decode(d),
    };
    check(
        &codec,
        resp(&|_| {}),
        vec![
            case(
                "echo",
                resp(&|r| r.echo = [0xFF; 28]),
                &[(0, 128, u128::MAX), (128, 96, u128::MAX)],
            ),
            case(
                "user_data",
                resp(&|r| r.user_data = 0xFF),
                &[(224, 8, ONES_8)],
            ),
            case("is_success", resp(&|r| r.is_success = true), &[(232, 1, 1)]),
            case(
                "op_code",
                resp(&|r| r.op = CmdOpcode::Unknown(0xFF)),
                &[(240, 8, ONES_8)],
            ),
        ],
    );
}

#[test]
fn isolation_send_seg0() {
    let zero = SendSeg0 {
        op: WorkReqOpcode::Write,
        flags: SendFlags::empty(),
        dqpn: qpn(0),
        qp_type: QpType::from_ibv(0),
        psn: 0,
        raddr: VirtAddr(0),
        dqp_ip: Ipv4Addr::UNSPECIFIED,
        rkey: key(0),
        total_len: 0,
        msn: 0,
    };
    let c = |f: &dyn Fn(&mut SendSeg0)| {
        let mut v = zero;
        f(&mut v);
        v
    };
    let codec = Codec {
        name: "SendSeg0",
        first_base: &[(240, 8, 0), (254, 1, 1), (255, 1, 1)],
        second_base: None,
        encode: |s: &SendSeg0| (s.encode(), None),
        decode: |d, _| SendSeg0::decode(d),
    };
    check(
        &codec,
        zero,
        vec![
            case("flags", c(&|v| v.flags = SendFlags::all()), &[(3, 5, 0x1F)]),
            case("dqpn", c(&|v| v.dqpn = qpn(0xFF_FFFF)), &[(8, 24, ONES_24)]),
            case(
                "qp_type",
                c(&|v| v.qp_type = QpType::from_ibv(15)),
                &[(36, 4, 0xF)],
            ),
            case("psn", c(&|v| v.psn = 0xFF_FFFF), &[(40, 24, ONES_24)]),
            case(
                "raddr",
                c(&|v| v.raddr = VirtAddr(u64::MAX)),
                &[(64, 64, ONES_64)],
            ),
            case(
                "dqp_ip",
                c(&|v| v.dqp_ip = Ipv4Addr::BROADCAST),
                &[(128, 32, ONES_32)],
            ),
            case(
                "rkey",
                c(&|v| v.rkey = key(u32::MAX)),
                &[(160, 32, ONES_32)],
            ),
            case(
                "total_len",
                c(&|v| v.total_len = u32::MAX),
                &[(192, 32, ONES_32)],
            ),
            case("msn", c(&|v| v.msn = u16::MAX), &[(224, 16, ONES_16)]),
            case(
                "op_code",
                c(&|v| v.op = WorkReqOpcode::AtomicWrite),
                &[(240, 8, 0xF)],
            ),
        ],
    );
}

#[test]
fn isolation_send_seg1() {
    let zero = SendSeg1 {
        laddr: VirtAddr(0),
        len: 0,
        lkey: key(0),
        sqpn: qpn(0),
        mac: mac(0),
        imm: 0,
        enable_ecn: false,
        is_retry: false,
        is_last: false,
        is_first: false,
        pmtu: Pmtu::Mtu256,
    };
    let c = |f: &dyn Fn(&mut SendSeg1)| {
        let mut v = zero;
        f(&mut v);
        v
    };
    let codec = Codec {
        name: "SendSeg1",
        first_base: &[(240, 8, 0), (254, 1, 0), (255, 1, 1), (237, 3, 1)],
        second_base: None,
        encode: |s: &SendSeg1| (s.encode(WorkReqOpcode::Write), None),
        decode: |d, _| SendSeg1::decode(d),
    };
    check(
        &codec,
        zero,
        vec![
            case(
                "laddr",
                c(&|v| v.laddr = VirtAddr(u64::MAX)),
                &[(0, 64, ONES_64)],
            ),
            case("len", c(&|v| v.len = u32::MAX), &[(64, 32, ONES_32)]),
            case("lkey", c(&|v| v.lkey = key(u32::MAX)), &[(96, 32, ONES_32)]),
            case(
                "sqpn (high 16 at 128, low 8 at 224)",
                c(&|v| v.sqpn = qpn(0xFF_FFFF)),
                &[(128, 16, ONES_16), (224, 8, ONES_8)],
            ),
            case(
                "sqpn_high_16bits",
                c(&|v| v.sqpn = qpn(0xFF_FF00)),
                &[(128, 16, ONES_16)],
            ),
            case(
                "sqpn_low_8bits",
                c(&|v| v.sqpn = qpn(0xFF)),
                &[(224, 8, ONES_8)],
            ),
            case(
                "mac_addr",
                c(&|v| v.mac = MacAddr::BROADCAST),
                &[(144, 48, ONES_48)],
            ),
            case("imm", c(&|v| v.imm = u32::MAX), &[(192, 32, ONES_32)]),
            case("enable_ecn", c(&|v| v.enable_ecn = true), &[(233, 1, 1)]),
            case("is_retry", c(&|v| v.is_retry = true), &[(234, 1, 1)]),
            case("is_last", c(&|v| v.is_last = true), &[(235, 1, 1)]),
            case("is_first", c(&|v| v.is_first = true), &[(236, 1, 1)]),
            case("pmtu", c(&|v| v.pmtu = Pmtu::Mtu4096), &[(237, 3, 5)]),
        ],
    );
    // Seg1 carries the request's op code (Seg0's); the RTL ignores it.
    assert_eq!(
        zero.encode(WorkReqOpcode::ReadResp),
        RawDesc(bytes_of(&[&[(240, 8, 12), (255, 1, 1), (237, 3, 1)]]))
    );
}

fn zero_packet(opcode: RdmaOpcode) -> PacketInfo {
    PacketInfo {
        opcode,
        psn: 0,
        msn: 0,
        dqpn: qpn(0),
        raddr: VirtAddr(0),
        rkey: key(0),
        total_len: 0,
        imm_data: 0,
        is_retry: false,
        ack_req: false,
        solicited: false,
        ecn_marked: false,
    }
}

fn meta_codec(
    name: &'static str,
    first_base: Bits,
    second_base: Option<Bits>,
) -> Codec<MetaReport> {
    Codec {
        name,
        first_base,
        second_base,
        encode: |m| m.encode(),
        decode: MetaReport::decode,
    }
}

#[test]
fn isolation_packet_basic_info() {
    let zero = zero_packet(RdmaOpcode::WriteOnly);
    let c = |f: &dyn Fn(&mut PacketInfo)| {
        let mut v = zero;
        f(&mut v);
        MetaReport::Packet(v)
    };
    check(
        &meta_codec(
            "PacketBasicInfo",
            &[(240, 8, 0x0A), (254, 1, 0), (255, 1, 1)],
            None,
        ),
        MetaReport::Packet(zero),
        vec![
            case(
                "imm_data",
                c(&|v| v.imm_data = u32::MAX),
                &[(0, 32, ONES_32)],
            ),
            case("rkey", c(&|v| v.rkey = key(u32::MAX)), &[(32, 32, ONES_32)]),
            case(
                "raddr",
                c(&|v| v.raddr = VirtAddr(u64::MAX)),
                &[(64, 64, ONES_64)],
            ),
            case(
                "total_len",
                c(&|v| v.total_len = u32::MAX),
                &[(128, 32, ONES_32)],
            ),
            case(
                "dqpn",
                c(&|v| v.dqpn = qpn(0xFF_FFFF)),
                &[(168, 24, ONES_24)],
            ),
            case("is_retry", c(&|v| v.is_retry = true), &[(196, 1, 1)]),
            case("ack_req", c(&|v| v.ack_req = true), &[(197, 1, 1)]),
            case("solicited", c(&|v| v.solicited = true), &[(198, 1, 1)]),
            case("ecn_marked", c(&|v| v.ecn_marked = true), &[(199, 1, 1)]),
            case("psn", c(&|v| v.psn = 0xFF_FFFF), &[(200, 24, ONES_24)]),
            case("msn", c(&|v| v.msn = u16::MAX), &[(224, 16, ONES_16)]),
            case(
                "op_code",
                c(&|v| v.opcode = RdmaOpcode::ReadResponseOnly),
                &[(240, 8, 0x10)],
            ),
        ],
    );
}

#[test]
fn isolation_read_req_extend_info() {
    let zero = ReadReqExt {
        lkey: key(0),
        laddr: VirtAddr(0),
        total_len: 0,
    };
    let c = |f: &dyn Fn(&mut ReadReqExt)| {
        let mut v = zero;
        f(&mut v);
        MetaReport::ReadRequest(zero_packet(RdmaOpcode::ReadRequest), v)
    };
    let second = |field, value, bits| Case {
        field,
        value,
        first: &[],
        second: bits,
    };
    check(
        &meta_codec(
            "ReadReqExtendInfo",
            &[(240, 8, 0x0C), (254, 1, 1), (255, 1, 1)],
            Some(&[(240, 8, 0x0C), (254, 1, 0), (255, 1, 1)]),
        ),
        c(&|_| {}),
        vec![
            second("lkey", c(&|v| v.lkey = key(u32::MAX)), &[(96, 32, ONES_32)]),
            second(
                "laddr",
                c(&|v| v.laddr = VirtAddr(u64::MAX)),
                &[(128, 64, ONES_64)],
            ),
            second(
                "total_len",
                c(&|v| v.total_len = u32::MAX),
                &[(192, 32, ONES_32)],
            ),
        ],
    );
}

fn zero_ack() -> AckReport {
    AckReport {
        now_bitmap: 0,
        msn: 0,
        qpn: qpn(0),
        psn_now: 0,
        psn_before_slide: 0,
        is_packet_lost: false,
        is_window_slided: false,
        is_send_by_driver: false,
        is_send_by_local_hw: false,
    }
}

#[test]
fn isolation_ack() {
    let c = |f: &dyn Fn(&mut AckReport)| {
        let mut v = zero_ack();
        f(&mut v);
        MetaReport::Ack(v)
    };
    check(
        &meta_codec("Ack", &[(240, 8, 0x11), (254, 1, 0), (255, 1, 1)], None),
        MetaReport::Ack(zero_ack()),
        vec![
            case(
                "now_bitmap",
                c(&|v| v.now_bitmap = u128::MAX),
                &[(0, 128, u128::MAX)],
            ),
            case("now_bitmap bit 0", c(&|v| v.now_bitmap = 1), &[(0, 1, 1)]),
            case(
                "now_bitmap bit 127",
                c(&|v| v.now_bitmap = 1 << 127),
                &[(127, 1, 1)],
            ),
            case("msn", c(&|v| v.msn = u16::MAX), &[(128, 16, ONES_16)]),
            case("qpn", c(&|v| v.qpn = qpn(0xFF_FFFF)), &[(144, 24, ONES_24)]),
            case(
                "psn_now",
                c(&|v| v.psn_now = 0xFF_FFFF),
                &[(168, 24, ONES_24)],
            ),
            case(
                "psn_before_slide",
                c(&|v| v.psn_before_slide = 0xFF_FFFF),
                &[(200, 24, ONES_24)],
            ),
            case(
                "is_packet_lost",
                c(&|v| v.is_packet_lost = true),
                &[(232, 1, 1)],
            ),
            case(
                "is_window_slided",
                c(&|v| v.is_window_slided = true),
                &[(233, 1, 1)],
            ),
            case(
                "is_send_by_driver",
                c(&|v| v.is_send_by_driver = true),
                &[(234, 1, 1)],
            ),
            case(
                "is_send_by_local_hw",
                c(&|v| v.is_send_by_local_hw = true),
                &[(235, 1, 1)],
            ),
        ],
    );
}

#[test]
fn isolation_ack_extra() {
    let nak = |pre_bitmap| MetaReport::Nak(zero_ack(), AckExtra { pre_bitmap });
    check(
        &meta_codec(
            "AckExtra",
            &[(240, 8, 0x11), (254, 1, 1), (255, 1, 1)],
            Some(&[(240, 8, 0x11), (254, 1, 0), (255, 1, 1)]),
        ),
        nak(0),
        vec![
            Case {
                field: "pre_bitmap",
                value: nak(u128::MAX),
                first: &[],
                second: &[(0, 128, u128::MAX)],
            },
            Case {
                field: "pre_bitmap bit 64",
                value: nak(1 << 64),
                first: &[],
                second: &[(64, 1, 1)],
            },
        ],
    );
}

#[test]
fn isolation_simple_nic() {
    let tx = Codec {
        name: "SimpleNicTx",
        first_base: &[(240, 8, 0), (248, 1, 0), (254, 1, 0), (255, 1, 1)],
        second_base: None,
        encode: |t: &SimpleNicTx| (t.encode(), None),
        decode: |d, _| Ok(SimpleNicTx::decode(d)),
    };
    let t = |addr, len| SimpleNicTx {
        addr: DeviceAddr(addr),
        len,
    };
    check(
        &tx,
        t(0, 0),
        vec![
            case("addr", t(u64::MAX, 0), &[(128, 64, ONES_64)]),
            case("len", t(0, u32::MAX), &[(192, 32, ONES_32)]),
        ],
    );
    let rx = Codec {
        name: "SimpleNicRx",
        first_base: &[(240, 8, 0), (248, 1, 1), (254, 1, 0), (255, 1, 1)],
        second_base: None,
        encode: |r: &SimpleNicRx| (r.encode(), None),
        decode: |d, _| SimpleNicRx::decode(d),
    };
    let r = |slot_idx, len| SimpleNicRx { slot_idx, len };
    check(
        &rx,
        r(0, 0),
        vec![
            // slot_idx is a 32-bit field; the card's slots end at 1023.
            case("slot_idx", r(1023, 0), &[(160, 32, 0x3FF)]),
            case("len", r(0, u32::MAX), &[(192, 32, ONES_32)]),
        ],
    );
    assert_eq!(
        SimpleNicRx::decode(&RawDesc(bytes_of(&[&[(160, 32, ONES_32), (255, 1, 1)]]))),
        Err(DescError::InvalidField {
            desc: DescKind::SimpleNicRx,
            field: "slot_idx",
            raw: 0xFFFF_FFFF
        })
    );
}

// ---------------------------------------------------------------------------------------
// Decode rules and errors, on golden-derived inputs.

#[test]
fn invalid_pmtu_in_manage_qp_is_named() {
    let mut b = V3_MANAGE_QP;
    b[10] |= 0xE0; // bits 85..87 = 7
    assert_eq!(
        CmdRequest::decode(&RawDesc(b)),
        Err(DescError::InvalidField {
            desc: DescKind::ManageQp,
            field: "pmtu",
            raw: 7
        })
    );
}

#[test]
fn reserved_bits_are_ignored_like_the_rtl_does() {
    // ManageQp reserved bits: 64..84, 88..91, 184..189, 233..239, 249..253. (128..159 are
    // reserved in the RTL too, but carry this project's pd extension.)
    let noise = bytes_of(&[&[
        (64, 21, u128::MAX),
        (88, 4, u128::MAX),
        (184, 6, u128::MAX),
        (233, 7, u128::MAX),
        (249, 5, u128::MAX),
    ]]);
    let mut b = V3_MANAGE_QP;
    for (x, n) in b.iter_mut().zip(noise) {
        *x |= n;
    }
    assert_eq!(
        CmdRequest::decode(&RawDesc(b)),
        Ok((v3_fields().into(), 0x02))
    );
}

#[test]
fn op_code_aliases_and_seg1_op_code_follow_the_rtl() {
    // Command op 8 executes as UpdateMrTable (low 3 bits).
    let mut b = V1_UPDATE_MR_TABLE;
    b[30] = 0x08;
    assert_eq!(
        CmdRequest::decode(&RawDesc(b)),
        Ok((v1_fields().into(), 0x5A))
    );
    // Send: op from Seg0's low 4 bits; Seg1's op byte is ignored.
    let (mut s0, mut s1) = (V7_SEND_SEG0, V8_SEND_SEG1);
    s0[30] = 0x11;
    s1[30] = 0x09;
    assert_eq!(
        SendRequest::decode(&RawDesc(s0), &RawDesc(s1)).map(|r| r.seg0.op),
        Ok(WorkReqOpcode::WriteWithImm)
    );
}
