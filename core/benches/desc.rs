//! Encode/decode cost of the descriptor codecs (goal: <= 5 ns per descriptor).
//!
//! Each iteration codes a batch of `BATCH` requests into (or out of) a ring-sized slice, as
//! the post and poll paths do; the throughput is set to the number of 32-byte descriptors,
//! so criterion's "thrpt" is descriptors per second and time / descriptors is ns each.
//!
//! Decoders are measured the way a consumer uses them: every field of the result is read
//! (folded into a checksum). Passing the whole 80-byte result to `black_box` instead measures
//! mostly the copy of a value just written field by field (store-forwarding stalls), about
//! 10 ns, which no real consumer pays.
//!
//! Run briefly: `cargo bench -p bluerdma-core --bench desc -- --warm-up-time 1 --measurement-time 2`

use core::net::Ipv4Addr;
use std::hint::black_box;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::cmd::CmdRequest;
use bluerdma_core::desc::cmd::ManageQp;
use bluerdma_core::desc::meta::{AckExtra, AckReport, MetaReport, PacketInfo, RdmaOpcode};
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType, RawDesc};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BATCH: usize = 64;

fn send_request(i: u32) -> SendRequest {
    SendRequest {
        seg0: SendSeg0 {
            op: WorkReqOpcode::WriteWithImm,
            flags: SendFlags::SIGNALED,
            dqpn: Qpn::from_raw(0x0345CD),
            qp_type: QpType::Rc,
            psn: (0x102 + 16 * i) & 0xFF_FFFF,
            raddr: VirtAddr(0x7F00_DEAD_0000 + u64::from(i) * 0x1_0000),
            dqp_ip: Ipv4Addr::new(17, 34, 51, 11),
            rkey: MrKey::from_raw(0x001F_FFA5),
            total_len: 0x10_0000,
            msn: i as u16,
        },
        seg1: SendSeg1 {
            laddr: VirtAddr(0x7F12_3460_0040 + u64::from(i) * 0x1_0000),
            len: 0x1_0000,
            lkey: MrKey::from_raw(0x001F_FEA6),
            sqpn: Qpn::from_raw(0x0123AB),
            mac: MacAddr::from_bits(0xAABB_CCDD_EE0A),
            imm: 0xCAFE_BABE ^ i,
            enable_ecn: false,
            is_retry: false,
            is_last: i % 16 == 15,
            is_first: i % 16 == 0,
            pmtu: Pmtu::Mtu4096,
        },
    }
}

fn manage_qp(i: u32) -> CmdRequest {
    CmdRequest::ManageQp(ManageQp {
        is_valid: true,
        is_error: false,
        pd: 0,
        qpn: Qpn::from_raw((i + 1) << 8 | 0xAB),
        peer_qpn: Qpn::from_raw(0x0345CD),
        rq_access_flags: AccessFlags::from_bits_retain(7),
        qp_type: QpType::Rc,
        pmtu: Pmtu::Mtu4096,
        local_udp_port: 0x100,
        peer_mac: MacAddr::from_bits(0xAABB_CCDD_EE0A),
        peer_ip: Ipv4Addr::new(17, 34, 51, 11),
    })
}

fn packet(i: u32) -> MetaReport {
    MetaReport::Packet(PacketInfo {
        opcode: RdmaOpcode::WriteOnlyWithImm,
        psn: 0x102 + i,
        msn: i as u16,
        dqpn: Qpn::from_raw(0x0123AB),
        raddr: VirtAddr(0x7F00_DEAD_0000),
        rkey: MrKey::from_raw(0x001F_FFA5),
        total_len: 0x1_0000,
        imm_data: 0xCAFE_BABE,
        is_retry: false,
        ack_req: true,
        solicited: false,
        ecn_marked: false,
    })
}

fn nak(i: u32) -> MetaReport {
    MetaReport::Nak(
        AckReport {
            now_bitmap: 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210 ^ u128::from(i),
            msn: 7,
            qpn: Qpn::from_raw(0x0123AB),
            psn_now: 0x100 + i,
            psn_before_slide: 0x80,
            is_packet_lost: true,
            is_window_slided: true,
            is_send_by_driver: false,
            is_send_by_local_hw: true,
        },
        AckExtra {
            pre_bitmap: u128::from(i) << 64 | 0xFF,
        },
    )
}

/// Reads every field of a send request.
#[inline(always)]
fn digest_send(r: &SendRequest) -> u64 {
    let (a, b) = (&r.seg0, &r.seg1);
    u64::from(a.op.raw())
        ^ u64::from(a.flags.bits()) << 1
        ^ u64::from(a.dqpn.get()) << 2
        ^ u64::from(a.qp_type.to_ibv()) << 3
        ^ u64::from(a.psn) << 4
        ^ a.raddr.get()
        ^ u64::from(u32::from(a.dqp_ip)) << 5
        ^ u64::from(a.rkey.get()) << 6
        ^ u64::from(a.total_len) << 7
        ^ u64::from(a.msn) << 8
        ^ b.laddr.get() << 1
        ^ u64::from(b.len) << 9
        ^ u64::from(b.lkey.get()) << 10
        ^ u64::from(b.sqpn.get()) << 11
        ^ b.mac.to_bits() << 12
        ^ u64::from(b.imm) << 13
        ^ u64::from(b.enable_ecn) << 14
        ^ u64::from(b.is_retry) << 15
        ^ u64::from(b.is_last) << 16
        ^ u64::from(b.is_first) << 17
        ^ u64::from(b.pmtu.to_ibv()) << 18
}

/// Reads every field of a command request.
#[inline(always)]
fn digest_cmd(r: &CmdRequest) -> u64 {
    match r {
        CmdRequest::ManageQp(q) => {
            u64::from(q.is_valid)
                ^ u64::from(q.is_error) << 1
                ^ u64::from(q.qpn.get()) << 2
                ^ u64::from(q.peer_qpn.get()) << 3
                ^ u64::from(q.rq_access_flags.bits()) << 4
                ^ u64::from(q.qp_type.to_ibv()) << 5
                ^ u64::from(q.pmtu.to_ibv()) << 6
                ^ u64::from(q.local_udp_port) << 7
                ^ q.peer_mac.to_bits() << 8
                ^ u64::from(u32::from(q.peer_ip)) << 9
        }
        other => u64::from(other.opcode().raw()),
    }
}

/// Reads every field of a meta report.
#[inline(always)]
fn digest_meta(r: &MetaReport) -> u64 {
    let packet = |p: &PacketInfo| {
        u64::from(p.opcode.raw())
            ^ u64::from(p.psn) << 1
            ^ u64::from(p.msn) << 3
            ^ u64::from(p.dqpn.get()) << 5
            ^ p.raddr.get()
            ^ u64::from(p.rkey.get()) << 7
            ^ u64::from(p.total_len) << 9
            ^ u64::from(p.imm_data) << 11
            ^ u64::from(p.is_retry) << 13
            ^ u64::from(p.ack_req) << 14
            ^ u64::from(p.solicited) << 15
            ^ u64::from(p.ecn_marked) << 16
    };
    let ack = |a: &AckReport| {
        (a.now_bitmap as u64)
            ^ (a.now_bitmap >> 64) as u64
            ^ u64::from(a.msn) << 1
            ^ u64::from(a.qpn.get()) << 2
            ^ u64::from(a.psn_now) << 3
            ^ u64::from(a.psn_before_slide) << 4
            ^ u64::from(a.is_packet_lost) << 5
            ^ u64::from(a.is_window_slided) << 6
            ^ u64::from(a.is_send_by_driver) << 7
            ^ u64::from(a.is_send_by_local_hw) << 8
    };
    match r {
        MetaReport::Packet(p) => packet(p),
        MetaReport::ReadRequest(p, e) => {
            packet(p) ^ e.laddr.get() ^ u64::from(e.lkey.get()) ^ u64::from(e.total_len)
        }
        MetaReport::Ack(a) => ack(a),
        MetaReport::Nak(a, e) => ack(a) ^ (e.pre_bitmap as u64) ^ (e.pre_bitmap >> 64) as u64,
    }
}

fn bench_send(c: &mut Criterion) {
    let reqs: Vec<SendRequest> = (0..BATCH as u32).map(send_request).collect();
    let mut ring = vec![RawDesc::ZERO; 2 * BATCH];
    let mut g = c.benchmark_group("send");
    g.throughput(Throughput::Elements(2 * BATCH as u64));
    g.bench_function("encode Seg0+Seg1", |b| {
        b.iter(|| {
            for (req, slots) in black_box(&reqs).iter().zip(ring.chunks_exact_mut(2)) {
                let [s0, s1] = slots else { unreachable!() };
                req.encode_into(s0, s1);
            }
            black_box(&mut ring);
        })
    });
    g.bench_function("encode Seg0+Seg1 (by value)", |b| {
        b.iter(|| {
            for (req, slots) in black_box(&reqs).iter().zip(ring.chunks_exact_mut(2)) {
                slots.copy_from_slice(&req.encode());
            }
            black_box(&mut ring);
        })
    });
    let encoded: Vec<RawDesc> = reqs.iter().flat_map(|r| r.encode()).collect();
    g.bench_function("decode Seg0+Seg1", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for pair in black_box(&encoded).chunks_exact(2) {
                if let Ok(r) = SendRequest::decode(&pair[0], &pair[1]) {
                    sum = sum.wrapping_add(digest_send(&r));
                }
            }
            black_box(sum)
        })
    });
    g.finish();
}

fn bench_cmd(c: &mut Criterion) {
    let reqs: Vec<CmdRequest> = (0..BATCH as u32).map(manage_qp).collect();
    let mut ring = vec![RawDesc::ZERO; BATCH];
    let mut g = c.benchmark_group("cmd");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("encode ManageQp", |b| {
        b.iter(|| {
            for (i, (req, slot)) in black_box(&reqs).iter().zip(ring.iter_mut()).enumerate() {
                *slot = req.encode(i as u8);
            }
            black_box(&mut ring);
        })
    });
    let encoded: Vec<RawDesc> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| r.encode(i as u8))
        .collect();
    g.bench_function("decode ManageQp", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for d in black_box(&encoded) {
                if let Ok((r, user_data)) = CmdRequest::decode(d) {
                    sum = sum.wrapping_add(digest_cmd(&r) ^ u64::from(user_data));
                }
            }
            black_box(sum)
        })
    });
    g.finish();
}

fn bench_meta(c: &mut Criterion) {
    for (name, reports, descs_per_report) in [
        (
            "PacketInfo",
            (0..BATCH as u32).map(packet).collect::<Vec<_>>(),
            1,
        ),
        (
            "Nak (Ack+AckExtra)",
            (0..BATCH as u32).map(nak).collect(),
            2,
        ),
    ] {
        let mut g = c.benchmark_group("meta");
        g.throughput(Throughput::Elements((BATCH * descs_per_report) as u64));
        let mut ring = vec![RawDesc::ZERO; 2 * BATCH];
        g.bench_function(format!("encode {name}"), |b| {
            b.iter(|| {
                for (r, slots) in black_box(&reports).iter().zip(ring.chunks_exact_mut(2)) {
                    let (first, second) = r.encode();
                    slots[0] = first;
                    if let Some(second) = second {
                        slots[1] = second;
                    }
                }
                black_box(&mut ring);
            })
        });
        let encoded: Vec<(RawDesc, Option<RawDesc>)> = reports.iter().map(|r| r.encode()).collect();
        g.bench_function(format!("decode {name}"), |b| {
            b.iter(|| {
                let mut sum = 0u64;
                for (first, second) in black_box(&encoded) {
                    if let Ok(r) = MetaReport::decode(first, second.as_ref()) {
                        sum = sum.wrapping_add(digest_meta(&r));
                    }
                }
                black_box(sum)
            })
        });
        g.finish();
    }
}

/// The floor for any encoder or decoder: copying `BATCH` ready-made 32-byte descriptors into
/// a ring-sized slice, measured in the same run so the codec figures can be read as ratios.
fn bench_baseline(c: &mut Criterion) {
    let src: Vec<RawDesc> = (0..BATCH).map(|i| RawDesc([i as u8; 32])).collect();
    let mut ring = vec![RawDesc::ZERO; BATCH];
    let mut g = c.benchmark_group("baseline");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("memcpy 32 B", |b| {
        b.iter(|| {
            for (slot, d) in ring.iter_mut().zip(black_box(&src)) {
                *slot = *d;
            }
            black_box(&mut ring);
        })
    });
    g.finish();
}

criterion_group!(benches, bench_baseline, bench_send, bench_cmd, bench_meta);
criterion_main!(benches);
