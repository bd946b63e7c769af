//! RDMA WRITE on the two-card harness: bytes intact at every size, completions in posting
//! order, unsignaled work requests, and the packets that carry them.

mod common;

use bluerdma_sim::core::engine::{WcOpcode, WcStatus};
use bluerdma_sim::core::mtu::Pmtu;
use bluerdma_sim::core::wire::RdmaOpcode;
use bluerdma_sim::pair::{FrameInfo, QpOptions};
use common::*;

/// One signaled WRITE of `len` bytes at offsets `soff`/`doff`: the completion, the bytes
/// in the target, and the zeros around it.
fn write_once(len: usize, soff: usize, doff: usize) {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, soff + len, 1);
    let dst = buffer(&mut p, &c, B, doff + len + 64);
    post(&mut p, &c, A, &[write(7, &src, soff, &dst, doff, len)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(500));
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(wc.qp_num, c.qp(A).get());
    let got = p.bytes(&dst).to_vec();
    assert!(
        got[..doff].iter().all(|&b| b == 0),
        "bytes before the target written"
    );
    assert!(
        got[doff + len..].iter().all(|&b| b == 0),
        "bytes after the target written"
    );
    assert!(
        got[doff..doff + len] == pattern(soff + len, 1)[soff..],
        "{len} bytes differ"
    );
    assert_eq!(
        p.stats(A).retransmits,
        0,
        "a clean wire needs no retransmission"
    );
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "a WRITE completes nothing at the target"
    );
}

#[test]
fn write_of_1_byte_lands_intact_and_completes() {
    write_once(1, 0, 0);
}

#[test]
fn write_of_4_kib_lands_intact_and_completes() {
    write_once(4096, 0, 0);
}

#[test]
fn write_of_1_mib_lands_intact_and_completes() {
    write_once(1 << 20, 0, 0);
}

#[test]
fn write_at_unaligned_offsets_touches_only_the_target_range() {
    write_once(10_000, 3, 4093);
}

#[test]
fn write_of_1_mib_sends_each_psn_once_in_order() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 1 << 20, 2);
    let dst = buffer(&mut p, &c, B, 1 << 20);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 1 << 20)]);
    send_wcs(&mut p, &c, A, 1, ms(500));
    let psns: Vec<u32> = p.sent_by(A).filter_map(FrameInfo::psn).collect();
    assert_eq!(
        psns,
        (0..256).collect::<Vec<u32>>(),
        "256 packets of 4 KiB, PSN 0..255"
    );
    assert!(p.sent_by(A).all(|f| !f.is_retry()));
    assert_eq!(p.stats(A).timeouts, 0);
}

#[test]
fn a_chain_of_writes_completes_in_posting_order_with_every_byte() {
    let (mut p, c) = default_pair();
    let sizes = [1usize, 4096, 10_000, 70_000, 3, 65_536, 200_000, 17];
    let total: usize = sizes.iter().sum();
    let src = filled(&mut p, &c, A, total, 3);
    let dst = buffer(&mut p, &c, B, total);
    let mut wrs = Vec::new();
    let mut off = 0;
    for (i, &n) in sizes.iter().enumerate() {
        wrs.push(write(100 + i as u64, &src, off, &dst, off, n));
        off += n;
    }
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, sizes.len(), ms(500));
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (100..108).collect::<Vec<u64>>(), "posting order");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert!(p.bytes(&dst) == &pattern(total, 3)[..]);
}

#[test]
fn unsignaled_writes_complete_silently_but_their_bytes_land_and_they_retire() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 4 * 5000, 4);
    let dst = buffer(&mut p, &c, B, 4 * 5000);
    let mut wrs = writes(0, 4, &src, &dst, 5000);
    wrs[1].signaled = false;
    wrs[2].signaled = false;
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 2, ms(500));
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 3]);
    p.run_for(ms(10)).unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "no completion for the unsignaled ones"
    );
    assert_eq!(
        p.engine(A).sq_retired(c.qp(A)).unwrap(),
        4,
        "all four left the send queue"
    );
    assert!(p.bytes(&dst) == &pattern(4 * 5000, 4)[..]);
}

#[test]
fn an_unsignaled_write_alone_retires_without_a_completion() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 100, 5);
    let dst = buffer(&mut p, &c, B, 100);
    let mut w = write(9, &src, 0, &dst, 0, 100);
    w.signaled = false;
    post(&mut p, &c, A, &[w]);
    let qp = c.qp(A);
    p.run_until(|p| p.engine(A).sq_retired(qp).unwrap() == 1, ms(100))
        .unwrap_or_else(|e| panic!("{e}"));
    p.run_for(ms(10)).unwrap();
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty());
    assert!(p.bytes(&dst) == &pattern(100, 5)[..]);
}

#[test]
fn pmtu_256_cuts_packets_at_remote_boundaries_with_consecutive_psns() {
    let o = QpOptions {
        pmtu: Pmtu::Mtu256,
        psn: [1000, 0],
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 1000, 6);
    let dst = buffer(&mut p, &c, B, 1200);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 100, 1000)]);
    send_wcs(&mut p, &c, A, 1, ms(100));
    // dst + 100 is 100 bytes into a 256-byte unit: 156, then 256 x 3, then 76.
    let pkts: Vec<(RdmaOpcode, u32, usize)> = p
        .sent_by(A)
        .filter_map(|f| match f.kind {
            bluerdma_sim::pair::FrameKind::Packet {
                opcode,
                psn,
                payload,
                ..
            } => Some((opcode, psn, payload)),
            _ => None,
        })
        .collect();
    use RdmaOpcode::*;
    assert_eq!(
        pkts,
        [
            (WriteFirst, 1000, 156),
            (WriteMiddle, 1001, 256),
            (WriteMiddle, 1002, 256),
            (WriteMiddle, 1003, 256),
            (WriteLast, 1004, 76)
        ]
    );
    assert!(p.bytes(&dst)[100..1100] == pattern(1000, 6)[..]);
    assert!(
        p.sent_by(B).any(|f| f.acks(1004)),
        "B acknowledged through PSN 1004: {:?}",
        p.sent_by(B).collect::<Vec<_>>()
    );
}

#[test]
fn a_zero_length_write_completes_and_writes_nothing() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 16, 7);
    let dst = buffer(&mut p, &c, B, 16);
    post(&mut p, &c, A, &[write(5, &src, 0, &dst, 0, 0)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(500));
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (5, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert!(p.bytes(&dst).iter().all(|&b| b == 0));
}
