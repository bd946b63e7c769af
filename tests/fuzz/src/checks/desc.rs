//! The descriptor targets: what the card writes to the driver's rings and what the
//! emulated card reads from them (core/src/desc).

use super::{check_desc_bits, descs};
use bluerdma_core::desc::cmd::{CmdRequest, CmdResponse};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::pgt;
use bluerdma_core::desc::send::{SendRequest, SendSeg0, SendSeg1};
use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_SLOTS};
use bluerdma_core::desc::RawDesc;

/// Command ring descriptors (core/src/desc/cmd.rs, pgt.rs): 32 bytes as a request (what the
/// emulated card reads from the driver) and as a response (what the driver reads from the
/// card), then the PGT staging rules and entries of an UpdatePGT with the bytes after it.
pub fn desc_cmd(data: &[u8]) {
    let Some([d]) = descs::<1>(data) else {
        return;
    };
    if let Ok((req, user_data)) = CmdRequest::decode(&d) {
        let _ = req.validate();
        check_desc_bits(
            "command request",
            &[d],
            &(req, user_data),
            &[req.encode(user_data)],
            |x| CmdRequest::decode(&x[0]).ok(),
        );
        if let CmdRequest::UpdatePgt(u) = req {
            let _ = u.check_staging();
            let rest = &data[32..];
            match pgt::staged_entries(rest, u.entry_count) {
                Ok(entries) => {
                    let n = entries.count();
                    assert_eq!(n, u.entry_count as usize, "staged entries");
                }
                Err(_) => assert!(
                    rest.len() < u.entry_count as usize * 8,
                    "staged entries refused"
                ),
            }
        }
    }
    if let Ok(resp) = CmdResponse::decode(&d) {
        check_desc_bits("command response", &[d], &resp, &[resp.encode()], |x| {
            CmdResponse::decode(&x[0]).ok()
        });
    }
}

/// Send ring descriptors (core/src/desc/send.rs): Seg0 and Seg1 as the emulated card reads
/// them from the driver's send ring.
pub fn desc_send(data: &[u8]) {
    let Some([a, b]) = descs::<2>(data) else {
        if let Some([a]) = descs::<1>(data) {
            let _ = SendSeg0::decode(&a);
            let _ = SendSeg1::decode(&a);
        }
        return;
    };
    let Ok(req) = SendRequest::decode(&a, &b) else {
        return;
    };
    let [e0, e1] = req.encode();
    let (mut s0, mut s1) = (RawDesc::ZERO, RawDesc::ZERO);
    req.encode_into(&mut s0, &mut s1);
    assert_eq!([s0, s1], [e0, e1], "encode_into differs from encode");
    check_desc_bits("send request", &[a, b], &req, &[e0, e1], |x| {
        SendRequest::decode(&x[0], &x[1]).ok()
    });
}

/// Meta-report descriptors (core/src/desc/meta.rs), what the driver reads from the card
/// about every received packet and ACK: one descriptor (32-63 bytes of input) or a pair
/// (64 bytes and more).
pub fn desc_meta(data: &[u8]) {
    let (input, report) = match (descs::<2>(data), descs::<1>(data)) {
        (Some([a, b]), _) => (vec![a, b], MetaReport::decode(&a, Some(&b))),
        (None, Some([a])) => (vec![a], MetaReport::decode(&a, None)),
        _ => return,
    };
    let Ok(report) = report else {
        return;
    };
    let encoded: Vec<_> = match report.encode() {
        (first, Some(second)) => vec![first, second],
        (first, None) => vec![first],
    };
    check_desc_bits("meta report", &input, &report, &encoded, |x| {
        MetaReport::decode(&x[0], x.get(1)).ok()
    });
}

/// Simple-NIC descriptors (core/src/desc/simple_nic.rs): a TX descriptor as the emulated
/// card reads it and an RX descriptor as the driver reads it from the card.
pub fn desc_simple_nic(data: &[u8]) {
    let Some([d]) = descs::<1>(data) else {
        return;
    };
    let tx = SimpleNicTx::decode(&d);
    check_desc_bits("simple-NIC TX", &[d], &tx, &[tx.encode()], |x| {
        Some(SimpleNicTx::decode(&x[0]))
    });
    if let Ok(rx) = SimpleNicRx::decode(&d) {
        assert!(
            rx.slot_idx < RX_SLOTS,
            "slot {} out of the buffer",
            rx.slot_idx
        );
        check_desc_bits("simple-NIC RX", &[d], &rx, &[rx.encode()], |x| {
            SimpleNicRx::decode(&x[0]).ok()
        });
    }
}
