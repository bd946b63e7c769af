//! The seed corpus of the fuzz targets (tests/fuzz/seeds/<target>/): valid inputs built from
//! the golden vectors of core/tests/golden_desc.rs and golden_wire.rs (copied here as bytes,
//! as those files hold them), so that every target starts from inputs its decoder accepts.
//!
//! The test checks that each seed is accepted by its target's decoder and that the committed
//! files hold exactly these bytes. `BLUERDMA_FUZZ_SEEDS=write cargo test -p bluerdma-tests
//! --test fuzz_seeds` rewrites them after a codec change. Other files in a seed directory
//! (a crash input kept as a regression seed) are left alone.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use bluerdma_core::desc::cmd::{CmdRequest, CmdResponse};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::send::SendRequest;
use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx};
use bluerdma_core::desc::RawDesc;
use bluerdma_core::oob::{Hello, OobDecoder, Record};
use bluerdma_core::wire::ud::{UdPart, DEFAULT_PKEY};
use bluerdma_core::wire::{Deth, MacAddr, ReceivedAck, RocePacket, UdFrame};
use bluerdma_linux::devices::DeviceList;
use bluerdma_sim::link::datagram::{DatagramBuilder, DatagramFrames};
use bluerdma_sim::rtl::decode as rtl;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .filter(|t| *t != "|")
        .map(|t| u8::from_str_radix(t, 16).expect("hex byte"))
        .collect()
}

// golden_desc.rs, layout-verification.md section 5.
const V1_UPDATE_MR_TABLE: &str = "80 e6 d5 0f 00 00 00 00 a5 ff 1f 00 00 00 40 00
    00 00 60 34 12 7f 00 00 00 00 00 00 5a 00 00 80";
const V2_UPDATE_PGT: &str = "00 00 00 00 00 00 00 00 0f 00 00 00 00 01 00 00
    00 60 45 23 01 00 00 00 00 00 00 00 01 00 01 80";
const V3_MANAGE_QP: &str = "0a ee dd cc bb aa 00 01 00 00 a0 20 07 cd 45 03
    00 00 00 00 ab 23 01 80 0b 33 22 11 02 00 02 80";
const V4_SET_NETWORK_PARAM: &str = "00 00 0a ee dd cc bb aa 00 00 00 00 0a 33 22 11
    00 ff ff ff 01 33 22 11 00 00 00 00 03 00 03 80";
const V5_SET_RAW_PACKET_RECEIVE_META: &str = "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 20 80 00 00 00 00 00 00 00 00 04 00 04 80";
const V6_CMD_RESPONSE: &str = "00 00 0a ee dd cc bb aa 00 00 00 00 0a 33 22 11
    00 ff ff ff 01 33 22 11 00 00 00 00 03 01 03 80";
const V7_SEND_SEG0: &str = "10 cd 45 03 20 02 01 00 00 00 ad de 00 7f 00 00
    0b 33 22 11 a5 ff 1f 00 00 00 01 00 07 00 01 c0";
const V8_SEND_SEG1: &str = "40 00 60 34 12 7f 00 00 00 00 01 00 a6 fe 1f 00
    23 01 0a ee dd cc bb aa be ba fe ca ab b8 01 80";
const V9_PACKET_INFO: &str = "be ba fe ca a5 ff 1f 00 00 00 ad de 00 7f 00 00
    00 00 01 00 00 ab 23 01 20 02 01 00 07 00 0b 80";
const V10_READ_REQUEST: &str = "00 00 00 00 a5 ff 1f 00 00 00 ad de 00 7f 00 00
    00 10 00 00 00 ab 23 01 20 00 02 00 08 00 0c c0";
const V11_READ_REQ_EXT: &str = "00 00 00 00 00 00 00 00 00 00 00 00 a6 fe 1f 00
    00 00 60 34 12 7f 00 00 00 10 00 00 00 00 0c 80";
const V12_ACK: &str = "10 32 54 76 98 ba dc fe ef cd ab 89 67 45 23 01
    07 00 ab 23 01 00 01 00 00 80 00 00 00 0b 11 c0";
const V13_ACK_EXTRA: &str = "ff 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 11 80";
const V14_SIMPLE_NIC_TX: &str = "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 22 80 00 00 00 00 5a 00 00 00 00 00 00 80";
const V15_SIMPLE_NIC_RX: &str = "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 05 00 00 00 5a 00 00 00 00 00 00 81";
const PGT_ENTRY_0X123400000: &str = "00 00 40 23 01 00 00 00";

// golden_wire.rs.
const DRIVER_ACK_FRAME: &str = "aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 00 00 4c 00 01 00 00 40 11 f2 47 | 11 22 33 0a | 11 22 33 0b
    12 b7 12 b7 00 38 00 00";
const DRIVER_ACK_PAYLOAD: &str = "11 00 00 00 00 03 45 cd 00 00 01 02
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff
    20 00 00 00";
const DRIVER_NAK_PAYLOAD: &str = "11 00 00 00 00 03 45 cd 00 00 01 03
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    e0 00 01 00";
const HARDWARE_NAK_FRAME: &str = "aa bb cc dd ee 0a | aa bb cc dd ee 0b | 08 00
    45 00 00 52 00 01 00 00 40 11 f2 41 | 11 22 33 0b | 11 22 33 0a
    01 00 12 b7 00 3e 00 00
    11 00 00 03 00 01 23 ab 00 00 01 00
    ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 7f ff
    c0 00 00 80
    00 00 00 00 00 00";
const WRITE_FIRST_FRAME: &str = "aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 01 00 5a 00 01 00 00 40 11 f2 38 | 11 22 33 0a | 11 22 33 0b
    23 ab 12 b7 00 46 00 00
    06 c0 00 07 00 03 45 cd 80 00 01 02
    00 00 7f 00 de ad 00 fa | 00 1f ff a5 | 00 00 01 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00
    d0 d1 d2 d3 d4 d5";
const READ_REQUEST_FRAME: &str = "aa bb cc dd ee 0b | aa bb cc dd ee 0a | 08 00
    45 00 00 52 00 01 00 00 40 11 f2 41 | 11 22 33 0a | 11 22 33 0b
    45 cd 12 b7 00 3e 00 00
    0c 00 00 08 00 01 23 ab 80 00 02 00
    00 00 7f 00 de ad 00 00 | 00 1f ff a5 | 00 00 10 00
    00 00 7f 12 34 60 00 00 | 00 1f fe a6
    00 00 00 00 00 00 00 00 00 00 00 00 00 00";
const RECV_WR_RECORD: &str = "01 02 03 04 05 06 07 08 | 00 00 7f 12 34 60 00 40
    00 01 00 00 | 00 1f fe a6 | 00 01 23 ab | 00 00 00 00";
const RECV_TOO_SHORT_RECORD: &str = "01 02 03 04 05 06 07 08 | 00 00 00 00 00 00 00 00
    00 00 00 65 | 00 00 00 00 | 00 01 23 ab | 00 00 00 01";
const HELLO: &str = "42 52 44 4d | 00 02 | 00 00 | 00 00 00 03 | 11 22 33 0a
    00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f";
/// The proof that follows a hello (32 opaque bytes; golden_wire.rs).
const PROOF: &str = "a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5
    a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5 a5";

fn cat(parts: &[&str]) -> Vec<u8> {
    parts.iter().flat_map(|p| hex(p)).collect()
}

/// A UD SEND between the golden vectors' two devices (golden_wire.rs has no UD frame).
fn ud_frame(imm: Option<u32>) -> Vec<u8> {
    let ud = UdFrame {
        src_mac: MacAddr([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0A]),
        dst_mac: MacAddr([0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0B]),
        src_ip: Ipv4Addr::new(17, 34, 51, 10),
        dst_ip: Ipv4Addr::new(17, 34, 51, 11),
        udp_src_port: 0x23AB,
        pkey: DEFAULT_PKEY,
        solicited: imm.is_some(),
        dst_qpn: 0x0345CD,
        psn: 0x102,
        deth: Deth {
            qkey: 0x1111_1111,
            src_qpn: 0x0123AB,
        },
        imm,
        part: UdPart::Only,
    };
    let payload = [0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5];
    let mut out = vec![0u8; ud.frame_len(payload.len())];
    out[ud.header_len()..ud.header_len() + payload.len()].copy_from_slice(&payload);
    let n = ud.emit(&mut out, payload.len()).unwrap();
    out.truncate(n);
    out
}

/// (target, seed name, bytes) for every seed.
fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let write_first = hex(WRITE_FIRST_FRAME);
    let read_request = hex(READ_REQUEST_FRAME);
    let hw_nak = hex(HARDWARE_NAK_FRAME);
    let driver_ack = cat(&[DRIVER_ACK_FRAME, DRIVER_ACK_PAYLOAD]);
    let driver_nak = cat(&[DRIVER_ACK_FRAME, DRIVER_NAK_PAYLOAD]);
    let ud = ud_frame(None);
    let ud_imm = ud_frame(Some(0xCAFE_BABE));
    let header = |selector: u8, bytes: &[u8]| [&[selector][..], bytes].concat();
    let mut datagram = DatagramBuilder::new(4096);
    assert!(datagram.push(&write_first) && datagram.push(&driver_ack));
    let mut pgt = hex(V2_UPDATE_PGT);
    for _ in 0..16 {
        pgt.extend(hex(PGT_ENTRY_0X123400000));
    }
    let stream = cat(&[
        HELLO,
        PROOF,
        RECV_WR_RECORD,
        RECV_TOO_SHORT_RECORD,
        RECV_WR_RECORD,
    ]);
    let records = cat(&[RECV_WR_RECORD, RECV_TOO_SHORT_RECORD]);
    let mem_write = format!(
        r#"{{"type": "mem_write", "channel_id": 0, "address": 4096, "data": {:?}, "length": 32}}"#,
        hex(V7_SEND_SEG0)
    );
    let mem_read = r#"{"type": "mem_read", "channel_id": 2, "address": 4099, "length": 29, "start_byte_index": 3, "is_first": true, "is_last": false, "request_id": "req_2_7"}"#;
    let read_reply = rtl::dma_read_reply_line(&rtl::DmaReadReply {
        channel_id: 2,
        request_id: "req_2_7".into(),
        data: hex(V9_PACKET_INFO),
    });
    let mut lines = vec![255u8, 3, 16];
    lines.extend(rtl::encode_frame_line(&write_first).bytes());
    lines.extend(rtl::encode_frame_line(&driver_ack).bytes());
    lines.extend(rtl::csr_line(false, 0x104, 0xDEAD_BEEF).bytes());
    let devices_file = "# name  ip          mac (optional)\nblue0   17.34.51.10 02:bd:bd:00:00:00\nblue1   17.34.51.11\n";
    vec![
        ("desc_cmd", "v1_update_mr_table", hex(V1_UPDATE_MR_TABLE)),
        ("desc_cmd", "v2_update_pgt_with_entries", pgt),
        ("desc_cmd", "v3_manage_qp", hex(V3_MANAGE_QP)),
        (
            "desc_cmd",
            "v4_set_network_param",
            hex(V4_SET_NETWORK_PARAM),
        ),
        (
            "desc_cmd",
            "v5_set_raw_packet_receive_meta",
            hex(V5_SET_RAW_PACKET_RECEIVE_META),
        ),
        ("desc_cmd", "v6_cmd_response", hex(V6_CMD_RESPONSE)),
        (
            "desc_send",
            "v7_v8_send_request",
            cat(&[V7_SEND_SEG0, V8_SEND_SEG1]),
        ),
        ("desc_meta", "v9_packet_info", hex(V9_PACKET_INFO)),
        (
            "desc_meta",
            "v10_v11_read_request",
            cat(&[V10_READ_REQUEST, V11_READ_REQ_EXT]),
        ),
        ("desc_meta", "v12_v13_nak", cat(&[V12_ACK, V13_ACK_EXTRA])),
        ("desc_simple_nic", "v14_tx", hex(V14_SIMPLE_NIC_TX)),
        ("desc_simple_nic", "v15_rx", hex(V15_SIMPLE_NIC_RX)),
        ("wire_headers", "ethernet", header(0, &write_first[..14])),
        ("wire_headers", "ipv4", header(1, &write_first[14..])),
        ("wire_headers", "udp", header(2, &write_first[34..])),
        ("wire_headers", "bth", header(3, &write_first[42..54])),
        ("wire_headers", "reth", header(4, &write_first[54..70])),
        ("wire_headers", "rreth", header(5, &read_request[70..82])),
        (
            "wire_headers",
            "immdt",
            header(6, &hex(V8_SEND_SEG1)[24..28]),
        ),
        (
            "wire_headers",
            "ieth",
            header(7, &hex(V8_SEND_SEG1)[24..28]),
        ),
        ("wire_headers", "aeth", header(8, &driver_ack[54..90])),
        ("wire_headers", "nreth", header(9, &hw_nak[90..94])),
        ("wire_headers", "deth", header(10, &ud[54..62])),
        ("wire_frame", "write_first_unaligned", write_first.clone()),
        ("wire_frame", "read_request", read_request),
        ("wire_frame", "hardware_nak", hw_nak.clone()),
        ("wire_frame", "driver_ack", driver_ack.clone()),
        ("wire_ack", "driver_ack", driver_ack),
        ("wire_ack", "driver_nak", driver_nak),
        ("wire_ack", "hardware_nak", hw_nak),
        ("wire_ud", "send_only", ud),
        ("wire_ud", "send_only_with_imm", ud_imm),
        ("oob_hello", "hello", hex(HELLO)),
        ("oob_record", "recv_wr", hex(RECV_WR_RECORD)),
        ("oob_record", "recv_too_short", hex(RECV_TOO_SHORT_RECORD)),
        (
            "oob_stream",
            "hello_and_records",
            [&[0x10, 7][..], &stream].concat(),
        ),
        (
            "oob_stream",
            "records_without_hello",
            [&[0x21, 9][..], &records].concat(),
        ),
        ("link_datagram", "write_and_ack", datagram.bytes().to_vec()),
        (
            "rtl_csr",
            "read_reply",
            rtl::csr_line(false, 0x104, 0xDEAD_BEEF).into_bytes(),
        ),
        ("rtl_csr", "write", rtl::csr_line(true, 8, 1).into_bytes()),
        (
            "rtl_csr",
            "compact_read",
            br#"{"is_write":false,"addr":8}"#.to_vec(),
        ),
        ("rtl_dma", "mem_write", mem_write.into_bytes()),
        ("rtl_dma", "mem_read", mem_read.as_bytes().to_vec()),
        ("rtl_dma", "mem_read_response", read_reply.into_bytes()),
        ("rtl_lines", "frames_and_csr", lines),
        ("devices", "file", devices_file.as_bytes().to_vec()),
        (
            "devices",
            "inline",
            b"blue0=127.0.0.1, blue1=127.0.0.2@02:bd:bd:00:00:01".to_vec(),
        ),
    ]
}

fn desc(bytes: &[u8], i: usize) -> RawDesc {
    let mut d = RawDesc::ZERO;
    d.0.copy_from_slice(&bytes[i * 32..i * 32 + 32]);
    d
}

/// Whether `target`'s decoder accepts `b` (the fuzz target's input format).
fn accepted(target: &str, b: &[u8]) -> bool {
    match target {
        "desc_cmd" => {
            CmdRequest::decode(&desc(b, 0)).is_ok() || CmdResponse::decode(&desc(b, 0)).is_ok()
        }
        "desc_send" => SendRequest::decode(&desc(b, 0), &desc(b, 1)).is_ok(),
        "desc_meta" => {
            let second = (b.len() >= 64).then(|| desc(b, 1));
            MetaReport::decode(&desc(b, 0), second.as_ref()).is_ok()
        }
        "desc_simple_nic" => {
            let _ = SimpleNicTx::decode(&desc(b, 0));
            SimpleNicRx::decode(&desc(b, 0)).is_ok()
        }
        "wire_headers" => !b.is_empty(),
        "wire_frame" => RocePacket::parse_frame(b).is_ok(),
        "wire_ack" => ReceivedAck::parse(b).is_ok(),
        "wire_ud" => UdFrame::parse(b).is_ok(),
        "oob_hello" => Hello::parse(b).is_ok(),
        "oob_record" => Record::parse(b).is_ok(),
        "oob_stream" => {
            let mut dec = if b[0] & 1 == 0 {
                OobDecoder::new()
            } else {
                OobDecoder::without_hello()
            };
            let mut input = &b[2..];
            while let Ok(Some(_)) = dec.decode(&mut input) {}
            dec.error().is_none() && dec.finish().is_ok()
        }
        "link_datagram" => DatagramFrames::parse(b).is_ok(),
        "rtl_csr" => rtl::csr_request(b).is_ok(),
        "rtl_dma" => rtl::dma_request(b).is_ok() || rtl::dma_read_reply(b).is_ok(),
        "rtl_lines" => rtl::read_lines(&b[3..], 1 << 16)
            .unwrap()
            .iter()
            .any(|l| matches!(l, rtl::LineItem::Text(t) if rtl::frame_line(t).is_ok())),
        "devices" => {
            let text = std::str::from_utf8(b).unwrap();
            DeviceList::parse_file(text, "seed").is_ok() || DeviceList::parse_inline(text).is_ok()
        }
        other => panic!("no fuzz target `{other}`"),
    }
}

fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target)
}

#[test]
fn every_seed_is_an_input_its_decoder_accepts() {
    for (target, name, bytes) in seeds() {
        assert!(accepted(target, &bytes), "{target}/{name} is refused");
    }
}

#[test]
fn every_fuzz_target_has_seeds() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml"))
            .unwrap();
    let targets: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "bluerdma-fuzz")
        .collect();
    assert!(
        targets.len() >= 16,
        "targets in tests/fuzz/Cargo.toml: {targets:?}"
    );
    let seeds = seeds();
    for t in targets {
        assert!(
            seeds.iter().any(|(target, ..)| *target == t),
            "fuzz target `{t}` has no seed"
        );
    }
}

#[test]
fn committed_seed_files_hold_these_bytes() {
    let write = std::env::var("BLUERDMA_FUZZ_SEEDS").is_ok_and(|v| v == "write");
    for (target, name, bytes) in seeds() {
        let path = seed_dir(target).join(name);
        if write {
            std::fs::create_dir_all(seed_dir(target)).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (BLUERDMA_FUZZ_SEEDS=write cargo test -p bluerdma-tests --test fuzz_seeds)",
                path.display()
            )
        });
        assert!(
            committed == bytes,
            "{} is stale (BLUERDMA_FUZZ_SEEDS=write cargo test -p bluerdma-tests --test fuzz_seeds)",
            path.display()
        );
    }
}
