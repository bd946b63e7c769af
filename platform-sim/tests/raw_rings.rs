//! The emulated card driven through raw rings with the core's descriptors (no engine):
//! what a WRITE, a READ request, a key violation and a PSN gap do, as the hardware contract
//! says. Two cards on an in-memory link (deterministic) unless a test says otherwise.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::regs::Counter;
use bluerdma_core::wire::RdmaOpcode;
use bluerdma_sim::inproc::InProcessCard;
use bluerdma_sim::inproc::SimRegs;
use bluerdma_sim::link::{LinkPort, MemHub};
use bluerdma_sim::mem::HostDma;
use bluerdma_sim::model::NicConfig;
use bluerdma_sim::rawdrv::RawDriver;

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const MAC0: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
const MAC1: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);
const QPN0: u32 = (1 << 8) | 0xA1;
const QPN1: u32 = (2 << 8) | 0xB2;
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

struct Side<'a> {
    drv: RawDriver<SimRegs, &'a HostDma>,
}

struct Pair {
    cards: [InProcessCard; 2],
}

impl Pair {
    fn new(links: [Box<dyn LinkPort>; 2]) -> Pair {
        let [l0, l1] = links;
        let cfg = |name: &str| NicConfig {
            name: name.into(),
            ..NicConfig::default()
        };
        Pair {
            cards: [
                InProcessCard::start(cfg("blue0"), l0).unwrap(),
                InProcessCard::start(cfg("blue1"), l1).unwrap(),
            ],
        }
    }

    fn in_memory() -> Pair {
        let hub = MemHub::new();
        Pair::new([
            Box::new(hub.attach(IP0).unwrap()),
            Box::new(hub.attach(IP1).unwrap()),
        ])
    }

    /// Opens both sides, configures addresses and connects QPN0 <-> QPN1.
    fn open(&self, qp1_access: AccessFlags) -> (Side<'_>, Side<'_>) {
        let mut d0 = RawDriver::open(self.cards[0].regs.clone(), &self.cards[0].dma).unwrap();
        let mut d1 = RawDriver::open(self.cards[1].regs.clone(), &self.cards[1].dma).unwrap();
        d0.configure(MAC0, IP0).unwrap();
        d1.configure(MAC1, IP1).unwrap();
        let (q0, q1) = (Qpn::from_raw(QPN0), Qpn::from_raw(QPN1));
        d0.manage_qp(true, q0, q1, IP1, MAC1, ALL, Pmtu::Mtu4096)
            .unwrap();
        d1.manage_qp(true, q1, q0, IP0, MAC0, qp1_access, Pmtu::Mtu4096)
            .unwrap();
        (Side { drv: d0 }, Side { drv: d1 })
    }
}

/// A page-aligned buffer the test owns.
fn buffer(len: usize, fill: impl Fn(usize) -> u8) -> Vec<u8> {
    (0..len).map(fill).collect()
}

fn register(
    side: &mut Side<'_>,
    card: &InProcessCard,
    buf: &[u8],
    key: MrKey,
    access: AccessFlags,
    pgt: u32,
) {
    let mut mem = bluerdma_sim::mem::HostMemory::new(card.map.clone());
    side.drv
        .register_mr(
            &mut mem,
            key,
            VirtAddr(buf.as_ptr() as u64),
            buf.len(),
            access,
            pgt,
            PageSize::Size2M,
            1,
        )
        .unwrap();
}

fn write_req(
    op: WorkReqOpcode,
    src: &[u8],
    lkey: MrKey,
    raddr: u64,
    rkey: MrKey,
    len: u32,
    psn: u32,
) -> SendRequest {
    SendRequest {
        seg0: SendSeg0 {
            op,
            flags: SendFlags::SIGNALED,
            dqpn: Qpn::from_raw(QPN1),
            qp_type: QpType::Rc,
            psn,
            raddr: VirtAddr(raddr),
            dqp_ip: IP1,
            rkey,
            total_len: len,
            msn: 1,
        },
        seg1: SendSeg1 {
            laddr: VirtAddr(src.as_ptr() as u64),
            len,
            lkey,
            sqpn: Qpn::from_raw(QPN0),
            mac: MAC1,
            imm: 0xCAFE_F00D,
            enable_ecn: false,
            is_retry: false,
            is_last: true,
            is_first: true,
            pmtu: Pmtu::Mtu4096,
        },
    }
}

fn packets(reports: &[MetaReport]) -> Vec<(RdmaOpcode, u32)> {
    reports
        .iter()
        .filter_map(|r| match r {
            MetaReport::Packet(p) => Some((p.opcode, p.psn)),
            _ => None,
        })
        .collect()
}

const QUIET: Duration = Duration::from_millis(30);
const MAX: Duration = Duration::from_secs(3);

#[test]
fn write_lands_in_the_peers_memory_with_the_reports_the_contract_describes() {
    let pair = Pair::in_memory();
    let (mut s0, mut s1) = pair.open(ALL);
    let len = 64 * 1024 + 100;
    let src = buffer(len, |i| (i * 7 + 3) as u8);
    let dst = vec![0u8; len + 4096];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    // Unaligned remote start: 100 bytes into the buffer.
    let raddr = dst.as_ptr() as u64 + 100;
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            rkey,
            len as u32,
            0x10,
        )])
        .unwrap();
    let reports = s1.drv.collect_meta(QUIET, MAX);
    assert_eq!(&dst[100..100 + len], &src[..], "payload arrived intact");
    assert!(
        dst[..100].iter().all(|b| *b == 0),
        "nothing written before the range"
    );
    assert!(
        dst[100 + len..].iter().all(|b| *b == 0),
        "nothing written after the range"
    );
    // Packets split at 4 KiB-aligned remote addresses: an unaligned start adds one packet.
    let n = ((raddr + len as u64 - 1) / 4096 - raddr / 4096 + 1) as u32;
    let pk = packets(&reports);
    assert_eq!(
        pk,
        vec![
            (RdmaOpcode::WriteFirst, 0x10),
            (RdmaOpcode::WriteLast, 0x10 + n - 1)
        ],
        "FIRST and LAST are reported, MIDDLE is not: {reports:?}"
    );
    // The quiet timer reports the receive window; its last report holds every PSN.
    let ack = reports
        .iter()
        .rev()
        .find_map(|r| match r {
            MetaReport::Ack(a) if a.is_send_by_local_hw => Some(*a),
            _ => None,
        })
        .expect("a quiet-timer report");
    for psn in 0x10..0x10 + n {
        let bit = psn.wrapping_sub(ack.psn_now.wrapping_sub(112)) & 0xFF_FFFF;
        assert!(
            bit < 128 && ack.now_bitmap >> bit & 1 == 1,
            "psn {psn:#x} in the bitmap"
        );
    }
    assert_eq!(ack.qpn.get(), QPN1);
    let stats = pair.cards[1].nic.stats().snapshot();
    assert_eq!(stats.rx_payload_bytes, len as u64, "{stats}");
    assert_eq!(stats.naks_sent, 0);
}

#[test]
fn rkey_violation_writes_nothing_and_bumps_the_right_counter() {
    let pair = Pair::in_memory();
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(8192, |i| i as u8 | 1);
    let dst = vec![0u8; 8192];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let bad_key = MrKey::new(2, 0x23).unwrap();
    let raddr = dst.as_ptr() as u64;
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            bad_key,
            8192,
            0,
        )])
        .unwrap();
    let reports = s1.drv.collect_meta(QUIET, MAX);
    assert!(
        reports.is_empty(),
        "no report for a dropped packet: {reports:?}"
    );
    assert!(dst.iter().all(|b| *b == 0), "not one byte written");
    let regs = pair.cards[1].nic.regs();
    let n = (raddr + 8191) / 4096 - raddr / 4096 + 1;
    assert_eq!(
        regs.counter(Counter::InvalidMrKey) as u64,
        n,
        "every packet counted"
    );
    assert_eq!(regs.counter(Counter::MemOutOfBounds), 0);

    // Out of bounds: one byte past the MR.
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr + 1,
            rkey,
            8192,
            2,
        )])
        .unwrap();
    let reports = s1.drv.collect_meta(QUIET, MAX);
    assert!(packets(&reports)
        .iter()
        .all(|(op, _)| *op != RdmaOpcode::WriteLast));
    assert!(regs.counter(Counter::MemOutOfBounds) >= 1);
    assert_eq!(dst[8191], 0, "the last byte of the MR is untouched");
}

#[test]
fn qp_without_remote_write_refuses_writes() {
    let pair = Pair::in_memory();
    let (mut s0, mut s1) = pair.open(AccessFlags::LOCAL_WRITE);
    let src = buffer(100, |_| 9);
    let dst = vec![0u8; 100];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            dst.as_ptr() as u64,
            rkey,
            100,
            0,
        )])
        .unwrap();
    s1.drv.collect_meta(QUIET, MAX);
    assert_eq!(
        pair.cards[1].nic.regs().counter(Counter::InvalidQpAccess),
        1
    );
    assert!(dst.iter().all(|b| *b == 0));
}

#[test]
fn read_request_is_reported_with_its_extension_descriptor() {
    let pair = Pair::in_memory();
    let (mut s0, mut s1) = pair.open(ALL);
    let sink = vec![0u8; 4096];
    let lkey = MrKey::new(1, 0x11).unwrap();
    register(&mut s0, &pair.cards[0], &sink, lkey, ALL, 0);
    let raddr = 0x7000_1234_5000u64;
    let rkey = MrKey::new(9, 0x99).unwrap();
    let mut req = write_req(WorkReqOpcode::Read, &sink, lkey, raddr, rkey, 4096, 0x42);
    req.seg1.len = 4096;
    s0.drv.post_send(&[req]).unwrap();
    let reports = s1.drv.collect_meta(QUIET, MAX);
    let (info, ext) = reports
        .iter()
        .find_map(|r| match r {
            MetaReport::ReadRequest(i, e) => Some((*i, *e)),
            _ => None,
        })
        .expect("a READ request report");
    assert_eq!(info.opcode, RdmaOpcode::ReadRequest);
    assert_eq!(info.psn, 0x42);
    assert_eq!(info.raddr.0, raddr);
    assert_eq!(
        info.rkey, rkey,
        "the card does not check a READ's rkey (12a)"
    );
    assert_eq!(info.total_len, 4096);
    assert_eq!(ext.laddr.0, sink.as_ptr() as u64);
    assert_eq!(ext.lkey, lkey);
    assert_eq!(ext.total_len, 4096);
}

#[test]
fn psn_gap_produces_the_nak_packet_and_the_local_report() {
    let pair = Pair::in_memory();
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(4096, |i| i as u8);
    let dst = vec![0u8; 4096];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let raddr = dst.as_ptr() as u64;
    // PSN 0 arrives, then PSN 200: PSNs 1..199 were lost and slide out of the window.
    s0.drv
        .post_send(&[
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 0),
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 200),
        ])
        .unwrap();
    let local = s1.drv.collect_meta(QUIET, MAX);
    let (nak, extra) = local
        .iter()
        .find_map(|r| match r {
            MetaReport::Nak(a, e) => Some((*a, *e)),
            _ => None,
        })
        .expect("a local NAK report");
    assert!(nak.is_send_by_local_hw && nak.is_packet_lost && nak.is_window_slided);
    assert_eq!(
        nak.psn_now,
        200 & !0xF,
        "psn_now is the newest stride's first PSN"
    );
    assert_eq!(nak.qpn.get(), QPN1);
    assert_eq!(nak.msn, 0, "first NAK of this QP");
    assert_ne!(extra.pre_bitmap, 0);
    // The NAK packet went to the requester, whose card reports it (NakRemoteHw).
    let remote = s0.drv.collect_meta(QUIET, MAX);
    let (rnak, _) = remote
        .iter()
        .find_map(|r| match r {
            MetaReport::Nak(a, e) => Some((*a, *e)),
            _ => None,
        })
        .expect("the requester sees the NAK");
    assert!(!rnak.is_send_by_local_hw && !rnak.is_send_by_driver && rnak.is_packet_lost);
    assert_eq!(
        rnak.qpn.get(),
        QPN0,
        "addressed to the peer QP from the QP context"
    );
    assert_eq!(rnak.psn_now, nak.psn_now);
    assert_eq!(pair.cards[1].nic.stats().snapshot().naks_sent, 1);
}

#[test]
fn undecoded_register_access_is_rejected_loudly() {
    let pair = Pair::in_memory();
    let regs = pair.cards[0].nic.regs();
    assert!(regs.write(0x180, 1).is_err());
    assert!(regs.read(0x040).is_err());
    assert_eq!(regs.undecoded().0, 2);
}

#[test]
fn unknown_command_gets_no_response_and_is_counted() {
    let pair = Pair::in_memory();
    let (mut s0, _s1) = pair.open(ALL);
    let mut d = bluerdma_core::desc::RawDesc::ZERO;
    d.0[30] = 5; // UpdateErrorPsnRecoverPoint: declared, never answered
    d.0[31] = 0x80;
    s0.drv.push_command(&d).unwrap();
    // The next good command still completes: the card skipped the unknown one.
    s0.drv.configure(MAC0, IP0).unwrap();
    assert_eq!(pair.cards[0].nic.stats().snapshot().command_errors, 1);
}
