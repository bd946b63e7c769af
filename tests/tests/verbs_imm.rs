//! RDMA WRITE and WRITE_WITH_IMM of every size class (0 B, 1 B, 4 KiB, 1 MiB, 16 MiB) at
//! unaligned local and remote addresses, on two emulated NICs in one process: the bytes
//! land exactly where asked and nowhere else, the requester gets an RDMA_WRITE completion,
//! and the responder gets a RECV_RDMA_WITH_IMM completion (consuming one posted receive) for
//! WRITE_WITH_IMM only.

use std::time::Duration;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::{RecvWr, SendOp, WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM};
use bluerdma_core::keys::MrKey;
use bluerdma_tests::{
    assert_bytes_eq, assert_untouched, connect_pair, fill_pattern, two_devices, two_devices_from,
    wr, Side, ALL, NEAR_WRAP,
};

const WAIT: Duration = Duration::from_secs(20);
/// Bytes past the end of the target that must stay untouched.
const GUARD: usize = 64;

/// A receive WR with no buffer: WRITE_WITH_IMM needs one posted, but writes no bytes to it.
fn empty_recv(wr_id: u64) -> RecvWr {
    RecvWr {
        wr_id,
        addr: VirtAddr(0),
        len: 0,
        lkey: MrKey::from_raw(0),
    }
}

fn no_completion(side: &Side, what: &str) {
    let mut wc = [WorkCompletion::EMPTY; 4];
    let n = side.cq.poll(&mut wc).unwrap();
    assert_eq!(n, 0, "{what}: unexpected completions {:?}", &wc[..n]);
}

/// One WRITE (`imm == None`) or WRITE_WITH_IMM of `len` bytes from local offset `off` to
/// remote offset `roff`, checked on both sides.
fn write_case(len: usize, off: usize, roff: usize, imm: Option<u32>) {
    let what = format!("{len} B at +{off} -> +{roff}, imm {imm:?}");
    let (a, b) = two_devices();
    let (sa, sb) = connect_pair(&a, &b, (100, 500), 14, 7);
    let mut src = sa.pd.alloc_mr(off + len + GUARD, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), len as u32 ^ 0xA5, 0);
    let dst = sb.pd.alloc_mr(roff + len + GUARD, ALL).unwrap();
    if imm.is_some() {
        // SAFETY: the receive has no buffer.
        unsafe { sb.qp.post_recv(&[empty_recv(900)]).unwrap() };
    }
    let op = imm.map_or(SendOp::Write, SendOp::WriteWithImm);
    // SAFETY: both MRs outlive the completions we wait for.
    unsafe { sa.qp.post_send(&[wr(7, op, &src, off, len, &dst, roff)]) }.unwrap();

    let wc = sa.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc.len(), 1, "{what}: requester completion; {:?}", a.stats());
    let w = wc[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.qp_num),
        (7, WcStatus::Success, WcOpcode::RdmaWrite, sa.qp.qpn().get()),
        "{what}: requester"
    );
    match imm {
        Some(imm) => {
            let rc = sb.cq.wait(1, WAIT).unwrap();
            assert_eq!(rc.len(), 1, "{what}: responder completion; {:?}", b.stats());
            let r = rc[0];
            assert_eq!(
                (r.wr_id, r.status, r.opcode),
                (900, WcStatus::Success, WcOpcode::RecvRdmaWithImm),
                "{what}: responder"
            );
            assert_eq!(
                (r.imm_data, r.byte_len, r.wc_flags & WC_WITH_IMM),
                (imm, len as u32, WC_WITH_IMM),
                "{what}: imm, byte_len and IBV_WC_WITH_IMM"
            );
            assert_eq!(
                (r.qp_num, r.src_qp),
                (sb.qp.qpn().get(), sa.qp.qpn().get()),
                "{what}: qp_num and src_qp"
            );
        }
        None => no_completion(&sb, &format!("{what}: a plain WRITE on the responder")),
    }
    let (s, d) = (src.bytes().unwrap(), dst.bytes().unwrap());
    assert_bytes_eq(&what, &d[roff..roff + len], &s[off..off + len]);
    assert_untouched(&format!("{what}: before the target"), &d[..roff]);
    assert_untouched(&format!("{what}: after the target"), &d[roff + len..]);
}

#[test]
fn write_with_imm_of_0_bytes_delivers_only_the_imm() {
    write_case(0, 3, 5, Some(0xDEAD_BEEF));
}

#[test]
fn write_with_imm_of_1_byte() {
    write_case(1, 1, 7, Some(1));
}

#[test]
fn write_with_imm_of_4_kib() {
    write_case(4096, 5, 3, Some(0x0102_0304));
}

#[test]
fn write_with_imm_of_1_mib() {
    write_case(1 << 20, 7, 4093, Some(u32::MAX));
}

#[test]
fn write_with_imm_of_16_mib() {
    write_case(16 << 20, 2049, 1, Some(0x8000_0001));
}

#[test]
fn write_of_1_byte_unaligned() {
    write_case(1, 4095, 4093, None);
}

#[test]
fn write_of_4_kib_unaligned() {
    write_case(4096, 1, 2, None);
}

#[test]
fn write_of_1_mib_unaligned() {
    write_case(1 << 20, 3, 65_535, None);
}

#[test]
fn write_of_16_mib_unaligned() {
    write_case(16 << 20, 9, 6, None);
}

/// Each WRITE_WITH_IMM consumes the oldest posted receive; a plain WRITE between them
/// consumes none, and the responder's completions follow the requester's posting order.
#[test]
fn each_write_with_imm_consumes_one_receive_in_order() {
    // The devices start every connection 16 PSNs before the 24-bit wrap.
    let (a, b) = two_devices_from(NEAR_WRAP);
    let (sa, sb) = connect_pair(&a, &b, (0xFF_FFF0, 7), 14, 7);
    let mut src = sa.pd.alloc_mr(64 << 10, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), 3, 0);
    let dst = sb.pd.alloc_mr(64 << 10, ALL).unwrap();
    let recvs: Vec<RecvWr> = (0..4).map(|k| empty_recv(200 + k)).collect();
    // SAFETY: the receives have no buffer.
    unsafe { sb.qp.post_recv(&recvs).unwrap() };
    let ops = [
        SendOp::WriteWithImm(10),
        SendOp::Write,
        SendOp::WriteWithImm(11),
        SendOp::WriteWithImm(12),
    ];
    // Starting 16 PSNs before the 24-bit wrap, these 16 KiB writes cross it.
    let wrs: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(k, &op)| {
            let at = k * (16 << 10);
            wr(k as u64, op, &src, at + 1, (16 << 10) - 3, &dst, at + 2)
        })
        .collect();
    // SAFETY: the MRs outlive the completions.
    unsafe { sa.qp.post_send(&wrs).unwrap() };
    let wc = sa.cq.wait(4, WAIT).unwrap();
    let ids: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        (0..4).map(|k| (k, WcStatus::Success)).collect::<Vec<_>>()
    );
    let rc = sb.cq.wait(3, WAIT).unwrap();
    let got: Vec<_> = rc.iter().map(|r| (r.wr_id, r.imm_data, r.opcode)).collect();
    assert_eq!(
        got,
        [
            (200, 10, WcOpcode::RecvRdmaWithImm),
            (201, 11, WcOpcode::RecvRdmaWithImm),
            (202, 12, WcOpcode::RecvRdmaWithImm),
        ]
    );
    no_completion(&sb, "the fourth receive stays posted");
    for k in 0..4 {
        let at = k * (16 << 10);
        let len = (16 << 10) - 3;
        assert_bytes_eq(
            &format!("WR {k}"),
            &dst.bytes().unwrap()[at + 2..at + 2 + len],
            &src.bytes().unwrap()[at + 1..at + 1 + len],
        );
    }
}
