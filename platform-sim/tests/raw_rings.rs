//! The emulated card driven through raw rings with the core's descriptors (no engine):
//! what a WRITE, a READ request, a key violation and a PSN gap do, as the hardware contract
//! says. Two cards on an in-memory link (deterministic) unless a test says otherwise.
//!
//! Every test runs twice, once per way of attaching the driver (module `in_process` and
//! module `rtl_protocol`): in-process calls, and the RTL simulator's socket protocol against
//! served cards (JSON register lines, one DMA line per bus beat answered from the driver's
//! own memory). The last test links two served cards with the simulator's two-card link.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Counter, Reg};
use bluerdma_core::wire::RdmaOpcode;
use bluerdma_sim::inproc::{InProcessCard, SimRegs};
use bluerdma_sim::link::{LinkPort, LinkStats, MemHub};
use bluerdma_sim::mem::{AddressMap, HostDma, HostMemory};
use bluerdma_sim::model::{Nic, NicConfig, RtlStop, RtlStopPolicy};
use bluerdma_sim::rawdrv::{RawDriver, RawError};
use bluerdma_sim::rtl::eth::TWO_CARD_RETRY;
use bluerdma_sim::rtl::{CsrClient, TwoCardLink};
use bluerdma_sim::serve::{RtlAttach, ServePorts, ServedCard};

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const MAC0: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
const MAC1: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);
const QPN0: u32 = (1 << 8) | 0xA1;
const QPN1: u32 = (2 << 8) | 0xB2;
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// How the driver reaches a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attach {
    /// Calls into the card's register file; the card reads the driver's memory directly.
    InProcess,
    /// The RTL simulator's sockets, served by the model on OS-chosen ports.
    Rtl,
}

impl Attach {
    /// How long `collect_meta` waits with no new report before it returns: every DMA beat
    /// is a JSON line over TCP on the RTL path, so a 64 KiB WRITE pauses longer between
    /// reports there.
    fn quiet(self) -> Duration {
        match self {
            Attach::InProcess => Duration::from_millis(30),
            Attach::Rtl => Duration::from_millis(500),
        }
    }
}

/// One card with the driver's platform services.
// Two per test: their size does not matter.
#[allow(clippy::large_enum_variant)]
enum Card {
    InProcess(InProcessCard),
    /// `card` is declared first so it stops before the driver's connections close.
    Rtl {
        card: ServedCard,
        driver: RtlAttach,
    },
}

impl Card {
    fn start(
        attach: Attach,
        name: &str,
        link: Box<dyn LinkPort>,
        rtl_stops: RtlStopPolicy,
    ) -> Card {
        let config = NicConfig {
            name: name.into(),
            rtl_stops,
            ..NicConfig::default()
        };
        match attach {
            Attach::InProcess => Card::InProcess(InProcessCard::start(config, link).unwrap()),
            Attach::Rtl => {
                let card = ServedCard::start(config, ServePorts::ANY, link).unwrap();
                let driver = RtlAttach::connect(card.ports()).unwrap();
                Card::Rtl { card, driver }
            }
        }
    }

    fn nic(&self) -> &Nic {
        match self {
            Card::InProcess(c) => &c.nic,
            Card::Rtl { card, .. } => card.nic(),
        }
    }

    fn regs(&self) -> Regs<'_> {
        match self {
            Card::InProcess(c) => Regs::InProcess(&c.regs),
            Card::Rtl { driver, .. } => Regs::Rtl(&driver.regs),
        }
    }

    fn dma(&self) -> &HostDma {
        match self {
            Card::InProcess(c) => &c.dma,
            Card::Rtl { driver, .. } => &driver.dma,
        }
    }

    /// The driver's memory as the card reaches it.
    fn map(&self) -> &AddressMap {
        match self {
            Card::InProcess(c) => &c.map,
            Card::Rtl { driver, .. } => &driver.map,
        }
    }
}

/// The driver's register access on either path.
#[derive(Clone, Copy)]
enum Regs<'a> {
    InProcess(&'a SimRegs),
    Rtl(&'a CsrClient),
}

impl RegisterAccess for Regs<'_> {
    fn read32(&self, reg: Reg) -> u32 {
        match self {
            Regs::InProcess(r) => r.read32(reg),
            Regs::Rtl(r) => r.read32(reg),
        }
    }

    fn write32(&self, reg: Reg, value: u32) {
        match self {
            Regs::InProcess(r) => r.write32(reg, value),
            Regs::Rtl(r) => r.write32(reg, value),
        }
    }
}

struct Side<'a> {
    drv: RawDriver<Regs<'a>, &'a HostDma>,
}

struct Pair {
    attach: Attach,
    cards: [Card; 2],
    /// Each card's link counters (shared with its port).
    links: [LinkStats; 2],
}

impl Pair {
    /// Two cards whose RTL stops fail the test (the policy `BLUERDMA_RTL_STOPS` names, or
    /// `rtl_stops` when given).
    fn new(
        attach: Attach,
        links: [Box<dyn LinkPort>; 2],
        rtl_stops: Option<RtlStopPolicy>,
    ) -> Pair {
        let stats = [links[0].stats().clone(), links[1].stats().clone()];
        let [l0, l1] = links;
        let policy = rtl_stops.unwrap_or_else(RtlStopPolicy::from_env);
        Pair {
            attach,
            cards: [
                Card::start(attach, "blue0", l0, policy),
                Card::start(attach, "blue1", l1, policy),
            ],
            links: stats,
        }
    }

    fn in_memory(attach: Attach) -> Pair {
        Pair::in_memory_with(attach, None)
    }

    fn in_memory_with(attach: Attach, rtl_stops: Option<RtlStopPolicy>) -> Pair {
        let hub = MemHub::new();
        Pair::new(
            attach,
            [
                Box::new(hub.attach(IP0).unwrap()),
                Box::new(hub.attach(IP1).unwrap()),
            ],
            rtl_stops,
        )
    }

    /// Two served cards joined as the simulator's two-card bench joins them: card 0
    /// listens (on an OS-chosen port), card 1 connects, frames are base64 lines.
    fn two_card_link() -> Pair {
        let listener = TwoCardLink::listen(0).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connector = TwoCardLink::connect(port, &TWO_CARD_RETRY).unwrap();
        assert!(
            listener.wait_connected(Duration::from_secs(5)),
            "the two-card link came up"
        );
        Pair::new(Attach::Rtl, [Box::new(listener), Box::new(connector)], None)
    }

    fn quiet(&self) -> Duration {
        self.attach.quiet()
    }

    /// Opens both sides, configures addresses and connects QPN0 <-> QPN1.
    fn open(&self, qp1_access: AccessFlags) -> (Side<'_>, Side<'_>) {
        let mut d0 = RawDriver::open(self.cards[0].regs(), self.cards[0].dma()).unwrap();
        let mut d1 = RawDriver::open(self.cards[1].regs(), self.cards[1].dma()).unwrap();
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
    card: &Card,
    buf: &[u8],
    key: MrKey,
    access: AccessFlags,
    pgt: u32,
) {
    let mut mem = HostMemory::new(card.map().clone());
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

const MAX: Duration = Duration::from_secs(3);

fn write_lands_in_the_peers_memory_with_the_reports_the_contract_describes(pair: &Pair) {
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
    // Until the LAST packet's report and the quiet-timer report are in: on the RTL path
    // every DMA beat is a line over TCP, and a loaded machine can pause longer than any
    // fixed quiet period between two reports.
    let mut reports = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        reports.extend(s1.drv.collect_meta(pair.quiet(), MAX));
        let last = packets(&reports)
            .iter()
            .any(|(op, _)| *op == RdmaOpcode::WriteLast);
        let quiet = reports
            .iter()
            .any(|r| matches!(r, MetaReport::Ack(a) if a.is_send_by_local_hw));
        if last && quiet || std::time::Instant::now() > deadline {
            break;
        }
    }
    let differs = dst[100..100 + len]
        .iter()
        .zip(&src)
        .position(|(d, s)| d != s);
    assert_eq!(
        differs, None,
        "payload arrived intact (first differing byte)"
    );
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
    let stats = pair.cards[1].nic().stats().snapshot();
    assert_eq!(stats.rx_payload_bytes, len as u64, "{stats}");
    assert_eq!(stats.naks_sent, 0);
    if let Card::Rtl { driver, .. } = &pair.cards[1] {
        // Every payload byte crossed the DMA socket as 32-byte beats.
        let beats = driver.dma_client.stats();
        assert!(
            beats.bytes_written >= len as u64 && beats.write_beats >= (len / 32) as u64,
            "{beats:?}"
        );
        assert_eq!(beats.faults, 0, "{beats:?}");
    }
}

fn rkey_violation_writes_nothing_and_bumps_the_right_counter(pair: &Pair) {
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
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
    assert!(
        reports.is_empty(),
        "no report for a dropped packet: {reports:?}"
    );
    assert!(dst.iter().all(|b| *b == 0), "not one byte written");
    let regs = pair.cards[1].nic().regs();
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
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
    assert!(packets(&reports)
        .iter()
        .all(|(op, _)| *op != RdmaOpcode::WriteLast));
    assert!(regs.counter(Counter::MemOutOfBounds) >= 1);
    assert_eq!(dst[8191], 0, "the last byte of the MR is untouched");
}

fn qp_without_remote_write_refuses_writes(pair: &Pair) {
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
    s1.drv.collect_meta(pair.quiet(), MAX);
    assert_eq!(
        pair.cards[1].nic().regs().counter(Counter::InvalidQpAccess),
        1
    );
    assert!(dst.iter().all(|b| *b == 0));
}

fn read_request_is_reported_with_its_extension_descriptor(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let sink = vec![0u8; 4096];
    let lkey = MrKey::new(1, 0x11).unwrap();
    register(&mut s0, &pair.cards[0], &sink, lkey, ALL, 0);
    let raddr = 0x7000_1234_5000u64;
    let rkey = MrKey::new(9, 0x99).unwrap();
    let mut req = write_req(WorkReqOpcode::Read, &sink, lkey, raddr, rkey, 4096, 0x42);
    req.seg1.len = 4096;
    s0.drv.post_send(&[req]).unwrap();
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
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

fn psn_gap_produces_the_nak_packet_and_the_local_report(pair: &Pair) {
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
    let local = s1.drv.collect_meta(pair.quiet(), MAX);
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
    let remote = s0.drv.collect_meta(pair.quiet(), MAX);
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
    assert_eq!(pair.cards[1].nic().stats().snapshot().naks_sent, 1);
}

fn undecoded_register_access_is_rejected_loudly(pair: &Pair) {
    let regs = pair.cards[0].nic().regs();
    assert!(regs.write(0x180, 1).is_err());
    assert!(regs.read(0x040).is_err());
    assert_eq!(regs.undecoded().0, 2);
    // The RTL's simulation ends there: the card froze and names the access.
    let shared = pair.cards[0].nic().shared();
    assert_eq!(
        shared.take_rtl_stop(),
        Some(RtlStop::UndecodedRegister {
            offset: 0x040,
            is_write: false
        })
    );
    assert!(shared.frozen());
    assert_eq!(shared.stats.snapshot().rtl_stops, 1);
}

fn unknown_command_stops_the_card_and_the_next_command_times_out(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    let mut d = bluerdma_core::desc::RawDesc::ZERO;
    d.0[30] = 5; // UpdateErrorPsnRecoverPoint: declared, never answered
    d.0[31] = 0x80;
    s0.drv.push_command(&d).unwrap();
    // The RTL's simulation ends at it: the card answers nothing more, and the driver's
    // wait ends in a timeout rather than a hang.
    s0.drv.command_timeout = Duration::from_millis(300);
    let e = s0.drv.configure(MAC0, IP0).unwrap_err();
    assert!(
        matches!(
            e,
            RawError::CommandTimeout {
                op: "SetNetworkParam"
            }
        ),
        "{e}"
    );
    let shared = pair.cards[0].nic().shared();
    assert_eq!(shared.stats.snapshot().command_errors, 1);
    assert_eq!(
        shared.take_rtl_stop(),
        Some(RtlStop::UnknownCommand { op: 5 })
    );
}

/// Waits (at most `MAX`) until card `i` of `pair` froze at an RTL stop; takes it.
fn frozen_at(pair: &Pair, i: usize) -> RtlStop {
    let shared = pair.cards[i].nic().shared();
    let deadline = std::time::Instant::now() + MAX;
    while !shared.frozen() {
        assert!(
            std::time::Instant::now() < deadline,
            "card {i} did not freeze"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    shared
        .take_rtl_stop()
        .expect("a frozen card names its stop")
}

fn a_wqe_whose_lkey_has_no_valid_mr_entry_freezes_the_sender(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(4096, |i| i as u8);
    let dst = vec![0u8; 4096];
    let (lkey, rkey) = (MrKey::new(3, 0x33).unwrap(), MrKey::new(2, 0x22).unwrap());
    // The sink is registered on card 1; the source's lkey was never registered on card 0.
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let raddr = dst.as_ptr() as u64;
    s0.drv
        .post_send(&[
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 0),
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 1),
        ])
        .unwrap();
    assert_eq!(
        frozen_at(pair, 0),
        RtlStop::InvalidLkey {
            lkey: lkey.get(),
            sqpn: QPN0
        }
    );
    let stats = pair.cards[0].nic().stats().snapshot();
    assert_eq!(
        (stats.wqes, stats.tx_packets, stats.rtl_stops),
        (1, 0, 1),
        "the card stopped at the first WQE: {stats}"
    );
    // A frozen card answers no command either.
    s0.drv.command_timeout = Duration::from_millis(300);
    assert!(matches!(
        s0.drv.configure(MAC0, IP0),
        Err(RawError::CommandTimeout { .. })
    ));
    assert!(dst.iter().all(|b| *b == 0), "nothing reached the peer");
}

fn a_payloadless_wqe_that_is_not_first_and_last_freezes_the_sender(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    let src = buffer(64, |i| i as u8);
    let key = MrKey::new(1, 0x11).unwrap();
    let mut req = write_req(WorkReqOpcode::Read, &src, key, 0x1000, key, 64, 5);
    req.seg1.is_last = false;
    s0.drv.post_send(&[req]).unwrap();
    assert_eq!(frozen_at(pair, 0), RtlStop::PayloadlessNotWhole { op: 4 });
}

fn an_update_pgt_that_breaks_the_staging_rules_freezes_the_card(pair: &Pair) {
    let (mut s0, _s1) = pair.open(ALL);
    s0.drv.command_timeout = Duration::from_millis(300);
    // 8 bytes past a 512-byte boundary: the RTL ends its simulation (nic-behaviour.md 5.2).
    let e = s0
        .drv
        .command(bluerdma_core::desc::cmd::CmdRequest::UpdatePgt(
            bluerdma_core::desc::cmd::UpdatePgt {
                dma_addr: bluerdma_core::addr::DeviceAddr(0x1008),
                start_index: 0,
                entry_count: 1,
            },
        ))
        .unwrap_err();
    assert!(
        matches!(e, RawError::CommandTimeout { op: "UpdatePgt" }),
        "{e}"
    );
    let stop = frozen_at(pair, 0);
    assert!(
        matches!(&stop, RtlStop::UpdatePgt { reason } if reason.contains("512")),
        "{stop}"
    );
}

#[test]
fn a_threaded_card_that_froze_fails_its_owner_when_dropped_unless_the_stop_was_taken() {
    let start = |name: &str| {
        let hub = MemHub::new();
        let config = NicConfig {
            name: name.into(),
            rtl_stops: RtlStopPolicy::Fail,
            ..NicConfig::default()
        };
        InProcessCard::start(config, Box::new(hub.attach(IP0).unwrap())).unwrap()
    };
    let card = start("blue9");
    assert!(card.nic.regs().write(0x180, 1).is_err());
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(card)));
    let panic = dropped.expect_err("dropping a card that froze under `fail` panics");
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("blue9") && text.contains("undecoded_register"),
        "{text}"
    );
    // A stop its owner took (and reported) does not panic again.
    let card = start("blue8");
    assert!(card.nic.regs().read(0x040).is_err());
    assert!(card.nic.shared().take_rtl_stop().is_some());
    drop(card);
}

#[test]
fn a_card_that_carries_on_past_rtl_stops_skips_an_unknown_command() {
    for attach in [Attach::InProcess, Attach::Rtl] {
        let pair = Pair::in_memory_with(attach, Some(RtlStopPolicy::Continue));
        let (mut s0, _s1) = pair.open(ALL);
        let mut d = bluerdma_core::desc::RawDesc::ZERO;
        d.0[30] = 5;
        d.0[31] = 0x80;
        s0.drv.push_command(&d).unwrap();
        // The next good command still completes: the card skipped the unknown one (as
        // the synthesised hardware would, inferred), and counted it.
        s0.drv.configure(MAC0, IP0).unwrap();
        let stats = pair.cards[0].nic().stats().snapshot();
        assert_eq!(
            (stats.command_errors, stats.rtl_stops),
            (1, 1),
            "{attach:?}"
        );
        assert!(!pair.cards[0].nic().shared().frozen());
    }
}

/// Runs each named test body once per attach path, on two cards joined by a memory hub:
/// `in_process::<name>` and `rtl_protocol::<name>`.
macro_rules! on_both_attaches {
    ($($body:ident),* $(,)?) => {
        mod in_process {
            $(
                #[test]
                fn $body() {
                    super::$body(&super::Pair::in_memory(super::Attach::InProcess));
                }
            )*
        }
        mod rtl_protocol {
            $(
                #[test]
                fn $body() {
                    super::$body(&super::Pair::in_memory(super::Attach::Rtl));
                }
            )*
        }
    };
}

on_both_attaches!(
    write_lands_in_the_peers_memory_with_the_reports_the_contract_describes,
    rkey_violation_writes_nothing_and_bumps_the_right_counter,
    qp_without_remote_write_refuses_writes,
    read_request_is_reported_with_its_extension_descriptor,
    psn_gap_produces_the_nak_packet_and_the_local_report,
    undecoded_register_access_is_rejected_loudly,
    unknown_command_stops_the_card_and_the_next_command_times_out,
    a_wqe_whose_lkey_has_no_valid_mr_entry_freezes_the_sender,
    a_payloadless_wqe_that_is_not_first_and_last_freezes_the_sender,
    an_update_pgt_that_breaks_the_staging_rules_freezes_the_card,
);

#[test]
fn served_cards_carry_a_write_and_a_nak_over_the_simulators_two_card_link() {
    let pair = Pair::two_card_link();
    write_lands_in_the_peers_memory_with_the_reports_the_contract_describes(&pair);
    let [sent, received] = [pair.links[0].snapshot(), pair.links[1].snapshot()];
    assert!(sent.frames_sent >= 17, "the WRITE's packets: {sent:?}");
    assert_eq!(
        received.frames_received, sent.frames_sent,
        "every base64 line arrived"
    );
    assert_eq!(
        sent.frames_unroutable, 0,
        "none sent before the link was up"
    );
    drop(pair);

    // The NAK travels back from card 1 to card 0: both directions of the link.
    let pair = Pair::two_card_link();
    psn_gap_produces_the_nak_packet_and_the_local_report(&pair);
    let [s0, s1] = [pair.links[0].snapshot(), pair.links[1].snapshot()];
    assert_eq!(s1.frames_sent, 1, "card 1 sent the NAK and nothing else");
    assert_eq!(s0.frames_received, 1);
    assert_eq!(s1.frames_received, s0.frames_sent);
}

/// The `bluerdma-sim serve` command: a driver attached over the simulator's sockets writes
/// through the loopback bench's link into its own memory, and SIGTERM stops the card
/// cleanly.
#[test]
fn serve_command_runs_a_card_a_simulator_driver_can_use() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Child, Command, Stdio};

    /// Kills the server if the test fails before it is stopped.
    struct Server(Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_bluerdma-sim"))
            .args([
                "serve",
                "--csr-port",
                "0",
                "--dma-port",
                "0",
                "--log",
                "warn",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(server.0.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    let port = |label: &str| -> u16 {
        let at = ready
            .find(label)
            .unwrap_or_else(|| panic!("{label} in {ready:?}"));
        let digits: String = ready[at + label.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    let ports = ServePorts {
        csr: port("CSR 127.0.0.1:"),
        dma: port("DMA 127.0.0.1:"),
    };
    {
        let driver = RtlAttach::connect(ports).unwrap();
        let mut drv = RawDriver::open(Regs::Rtl(&driver.regs), &driver.dma).unwrap();
        drv.configure(MAC0, IP0).unwrap();
        let q0 = Qpn::from_raw(QPN0);
        drv.manage_qp(true, q0, q0, IP0, MAC0, ALL, Pmtu::Mtu4096)
            .unwrap();
        let src = buffer(5000, |i| (i * 13) as u8);
        let dst = vec![0u8; 5000];
        let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
        for (buf, key, pgt) in [(&src, lkey, 0), (&dst, rkey, 1)] {
            let mut mem = HostMemory::new(driver.map.clone());
            drv.register_mr(
                &mut mem,
                key,
                VirtAddr(buf.as_ptr() as u64),
                buf.len(),
                ALL,
                pgt,
                PageSize::Size2M,
                1,
            )
            .unwrap();
        }
        let mut req = write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            dst.as_ptr() as u64,
            rkey,
            5000,
            0,
        );
        req.seg0.dqpn = q0;
        req.seg0.dqp_ip = IP0;
        req.seg1.mac = MAC0;
        drv.post_send(&[req]).unwrap();
        let reports = drv.collect_meta(Attach::Rtl.quiet(), MAX);
        assert_eq!(dst, src, "the WRITE came back through the loopback link");
        // One packet per 4 KiB page of the destination touched.
        let raddr = dst.as_ptr() as u64;
        let last_psn = ((raddr + 4999) / 4096 - raddr / 4096) as u32;
        assert!(
            packets(&reports).contains(&(RdmaOpcode::WriteLast, last_psn)),
            "{reports:?}"
        );
    }
    // SAFETY: kill(2) on our own child's pid has no memory effects.
    let sent = unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM delivered");
    let status = server.0.wait().unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    // configure (2), ManageQp, and UpdatePgt + UpdateMrTable per MR (4).
    assert!(
        rest.contains(" commands=7 ") && rest.contains(" rx_payload_bytes=5000 "),
        "final counters: {rest}"
    );
}
