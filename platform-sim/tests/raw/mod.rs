//! What the raw-ring tests share (raw_rings, raw_rtl_stops): two emulated cards on an
//! in-memory link (or the RTL simulator's two-card link), each reached either in-process or
//! over the RTL simulator's socket protocol ([`Attach`]), the raw-ring driver on each, and
//! the descriptors the tests post.
#![allow(dead_code)]

pub use std::net::Ipv4Addr;
pub use std::time::Duration;

pub use bluerdma_core::addr::{PageSize, VirtAddr};
pub use bluerdma_core::desc::meta::MetaReport;
pub use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
pub use bluerdma_core::desc::{AccessFlags, MacAddr, QpType};
pub use bluerdma_core::keys::{MrKey, Qpn};
pub use bluerdma_core::mtu::Pmtu;
pub use bluerdma_core::platform::RegisterAccess;
pub use bluerdma_core::regs::Reg;
pub use bluerdma_core::wire::RdmaOpcode;
pub use bluerdma_sim::inproc::{InProcessCard, SimRegs};
pub use bluerdma_sim::link::{LinkPort, LinkStats, MemHub};
pub use bluerdma_sim::mem::{AddressMap, HostDma, HostMemory};
pub use bluerdma_sim::model::{Nic, NicConfig, RtlStopPolicy};
pub use bluerdma_sim::rawdrv::RawDriver;
pub use bluerdma_sim::rtl::eth::TWO_CARD_RETRY;
pub use bluerdma_sim::rtl::{CsrClient, TwoCardLink};
pub use bluerdma_sim::serve::{RtlAttach, ServePorts, ServedCard};

pub const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
pub const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
pub const MAC0: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
pub const MAC1: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);
pub const QPN0: u32 = (1 << 8) | 0xA1;
pub const QPN1: u32 = (2 << 8) | 0xB2;
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// How the driver reaches a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Calls into the card's register file; the card reads the driver's memory directly.
    InProcess,
    /// The RTL simulator's sockets, served by the model on OS-chosen ports.
    Rtl,
}

impl Attach {
    /// How long `collect_meta` waits with no new report before it returns: every DMA beat
    /// is a JSON line over TCP on the RTL path, so a 64 KiB WRITE pauses longer between
    /// reports there.
    pub fn quiet(self) -> Duration {
        match self {
            Attach::InProcess => Duration::from_millis(30),
            Attach::Rtl => Duration::from_millis(500),
        }
    }
}

/// One card with the driver's platform services.
// Two per test: their size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Card {
    InProcess(InProcessCard),
    /// `card` is declared first so it stops before the driver's connections close.
    Rtl {
        card: ServedCard,
        driver: RtlAttach,
    },
}

impl Card {
    pub fn start(
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

    pub fn nic(&self) -> &Nic {
        match self {
            Card::InProcess(c) => &c.nic,
            Card::Rtl { card, .. } => card.nic(),
        }
    }

    pub fn regs(&self) -> Regs<'_> {
        match self {
            Card::InProcess(c) => Regs::InProcess(&c.regs),
            Card::Rtl { driver, .. } => Regs::Rtl(&driver.regs),
        }
    }

    pub fn dma(&self) -> &HostDma {
        match self {
            Card::InProcess(c) => &c.dma,
            Card::Rtl { driver, .. } => &driver.dma,
        }
    }

    /// The driver's memory as the card reaches it.
    pub fn map(&self) -> &AddressMap {
        match self {
            Card::InProcess(c) => &c.map,
            Card::Rtl { driver, .. } => &driver.map,
        }
    }
}

/// The driver's register access on either path.
#[derive(Clone, Copy)]
pub enum Regs<'a> {
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

pub struct Side<'a> {
    pub drv: RawDriver<Regs<'a>, &'a HostDma>,
}

pub struct Pair {
    pub attach: Attach,
    pub cards: [Card; 2],
    /// Each card's link counters (shared with its port).
    pub links: [LinkStats; 2],
}

impl Pair {
    /// Two cards whose RTL stops fail the test (the policy `BLUERDMA_RTL_STOPS` names, or
    /// `rtl_stops` when given).
    pub fn new(
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

    pub fn in_memory(attach: Attach) -> Pair {
        Pair::in_memory_with(attach, None)
    }

    pub fn in_memory_with(attach: Attach, rtl_stops: Option<RtlStopPolicy>) -> Pair {
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
    pub fn two_card_link() -> Pair {
        let listener = TwoCardLink::listen(0).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connector = TwoCardLink::connect(port, &TWO_CARD_RETRY).unwrap();
        assert!(
            listener.wait_connected(Duration::from_secs(5)),
            "the two-card link came up"
        );
        Pair::new(Attach::Rtl, [Box::new(listener), Box::new(connector)], None)
    }

    pub fn quiet(&self) -> Duration {
        self.attach.quiet()
    }

    /// Opens both sides, configures addresses and connects QPN0 <-> QPN1.
    pub fn open(&self, qp1_access: AccessFlags) -> (Side<'_>, Side<'_>) {
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
pub fn buffer(len: usize, fill: impl Fn(usize) -> u8) -> Vec<u8> {
    (0..len).map(fill).collect()
}

pub fn register(
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

pub fn write_req(
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

pub fn packets(reports: &[MetaReport]) -> Vec<(RdmaOpcode, u32)> {
    reports
        .iter()
        .filter_map(|r| match r {
            MetaReport::Packet(p) => Some((p.opcode, p.psn)),
            _ => None,
        })
        .collect()
}

pub const MAX: Duration = Duration::from_secs(3);

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

pub(crate) use on_both_attaches;
