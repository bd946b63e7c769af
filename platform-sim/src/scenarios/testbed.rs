//! Two emulated cards in this process on the UDP link, each driven through its raw rings:
//! blue0 at 127.0.0.1 and blue1 at 127.0.0.2, both on one UDP port (4791 unless told
//! otherwise). The scenarios of `cargo xtask sim`, the `sim_*` tests and the raw-WRITE
//! bench all stand on it.
//!
//! Each card's link is built bottom-up from the [`TestbedConfig`]: the [`UdpLink`]; a
//! transmit capture into the shared pcap sink, so the file holds every frame once, as it
//! went on the wire; fault injection; and, if asked, a record of the frames the card
//! received ([`Testbed::received_frames`]).
//!
//! The testbed hands out fresh QP indices, MR keys and page-table ranges, so that the
//! scenarios of one run share the two cards without seeing each other's state, and it owns
//! every registered buffer until the cards have stopped (a late packet can never write into
//! freed memory).

use std::fmt;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType};
use bluerdma_core::keys::{MrKey, Qpn, MR_TABLE_LEN, PGT_LEN, QP_TABLE_LEN};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::regs::{Counter, RingId, RingReg};

use crate::inproc::{InProcessCard, SimRegs};
use crate::link::{
    CaptureDirection, CapturingLink, FaultConfig, FaultConfigError, FaultyLink, LinkPort,
    LinkStats, LinkStatsSnapshot, PcapSink, UdpLink, UdpLinkConfig,
};
use crate::mem::{HostDma, HostMemory};
use crate::model::{NicConfig, NicStatsSnapshot, RtlStopPolicy};
use crate::rawdrv::{RawDriver, RawError};

/// The cards' IPv4 addresses: blue0, blue1.
pub const CARD_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)];
/// The cards' MAC addresses (locally administered).
pub const CARD_MACS: [MacAddr; 2] = [
    MacAddr([0x02, 0, 0, 0, 0, 1]),
    MacAddr([0x02, 0, 0, 0, 0, 2]),
];
/// The cards' names.
pub const CARD_NAMES: [&str; 2] = ["blue0", "blue1"];
/// Every access right a QP or MR can grant.
pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// The raw-ring driver of one testbed card.
pub type Driver = RawDriver<SimRegs, HostDma>;

/// How to build a [`Testbed`].
#[derive(Clone, Debug)]
pub struct TestbedConfig {
    /// The UDP port of both cards; 0 takes a free port (tests, benches).
    pub port: u16,
    /// Fault injection on each card's transmit side (blue0, blue1).
    pub faults: [Option<FaultConfig>; 2],
    /// Where to record every frame put on the wire (after fault injection).
    pub capture: Option<PcapSink>,
    /// Keep every frame each card receives, for [`Testbed::received_frames`].
    pub record_received: bool,
    /// The cards freeze at RTL stops either way; unless this is set, a stop nobody
    /// reported ([`Testbed::take_rtl_stops`]) makes dropping the testbed panic with it
    /// (`BLUERDMA_RTL_STOPS=continue` lets the cards carry on instead).
    pub allow_rtl_stops: bool,
}

impl TestbedConfig {
    /// Two clean cards on `port`, nothing recorded.
    pub fn new(port: u16) -> Self {
        Self {
            port,
            faults: [None, None],
            capture: None,
            record_received: false,
            allow_rtl_stops: false,
        }
    }
}

/// Why a testbed could not be built or driven.
#[derive(Debug)]
pub enum TestbedError {
    /// The link (a socket) failed.
    Link(io::Error),
    /// A fault configuration was refused.
    Faults(FaultConfigError),
    /// The raw-ring driver failed (a command, a full ring).
    Driver(RawError),
    /// A table of the card has no free entry left for this testbed.
    Exhausted(&'static str),
}

impl fmt::Display for TestbedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestbedError::Link(e) => write!(f, "link: {e}"),
            TestbedError::Faults(e) => write!(f, "fault configuration: {e}"),
            TestbedError::Driver(e) => write!(f, "raw driver: {e}"),
            TestbedError::Exhausted(what) => write!(f, "no free {what} left"),
        }
    }
}

impl std::error::Error for TestbedError {}

impl From<io::Error> for TestbedError {
    fn from(e: io::Error) -> Self {
        TestbedError::Link(e)
    }
}

impl From<RawError> for TestbedError {
    fn from(e: RawError) -> Self {
        TestbedError::Driver(e)
    }
}

impl From<FaultConfigError> for TestbedError {
    fn from(e: FaultConfigError) -> Self {
        TestbedError::Faults(e)
    }
}

/// A registered buffer: `len` bytes at `va` on card `side`, reachable with `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// The card (0 = blue0, 1 = blue1).
    pub side: usize,
    /// The MR key (lkey on its own card, rkey for the peer).
    pub key: MrKey,
    /// Virtual address of the first byte.
    pub va: u64,
    /// Length in bytes.
    pub len: usize,
    /// Index of the buffer in the testbed.
    slot: usize,
    /// Where the registered bytes start in it (the first page boundary).
    skip: usize,
}

/// Registered buffers start on a page boundary.
const BUFFER_ALIGN: usize = 4096;

impl Mr {
    /// The virtual address `offset` bytes into the buffer.
    pub fn at(&self, offset: usize) -> u64 {
        self.va + offset as u64
    }
}

/// A connected RC QP pair: `qpn[0]` on blue0 talks to `qpn[1]` on blue1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpPair {
    /// The QPN on each card.
    pub qpn: [Qpn; 2],
    /// The path MTU of both ends.
    pub pmtu: Pmtu,
}

impl QpPair {
    /// One work request (Seg0 + Seg1) from blue0 to blue1: `len` bytes from `laddr`
    /// (`lkey`) to `raddr` (`rkey`), first PSN `psn`, the whole message in one chunk.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &self,
        op: WorkReqOpcode,
        laddr: u64,
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
                dqpn: self.qpn[1],
                qp_type: QpType::Rc,
                psn,
                raddr: VirtAddr(raddr),
                dqp_ip: CARD_IPS[1],
                rkey,
                total_len: len,
                msn: 1,
            },
            seg1: SendSeg1 {
                laddr: VirtAddr(laddr),
                len,
                lkey,
                sqpn: self.qpn[0],
                mac: CARD_MACS[1],
                imm: 0,
                enable_ecn: false,
                is_retry: false,
                is_last: true,
                is_first: true,
                pmtu: self.pmtu,
            },
        }
    }

    /// A WRITE of `len` bytes from `src + src_off` to `dst + dst_off` starting at `psn`.
    pub fn write(
        &self,
        src: &Mr,
        src_off: usize,
        dst: &Mr,
        dst_off: usize,
        len: usize,
        psn: u32,
    ) -> SendRequest {
        self.request(
            WorkReqOpcode::Write,
            src.at(src_off),
            src.key,
            dst.at(dst_off),
            dst.key,
            len as u32,
            psn,
        )
    }
}

/// A byte sink shared with a [`PcapSink`], read back after the run.
#[derive(Clone, Default)]
struct MemorySink(Arc<Mutex<Vec<u8>>>);

impl Write for MemorySink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("receive record poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A card's record of the frames it received (a pcap stream in memory).
struct ReceiveRecord {
    sink: PcapSink,
    bytes: MemorySink,
}

/// The two cards, their drivers and everything registered on them.
pub struct Testbed {
    // Fields drop in this order: the cards stop before the drivers free their buffers and
    // before the registered buffers are freed.
    cards: [InProcessCard; 2],
    drivers: [Driver; 2],
    memory: [HostMemory; 2],
    link_stats: [LinkStats; 2],
    received: Option<[ReceiveRecord; 2]>,
    /// Registered buffers; an inner Vec is never resized, so its bytes never move.
    buffers: Vec<Vec<u8>>,
    port: u16,
    next_qp: u32,
    next_mr: [u32; 2],
    next_pgt: [u32; 2],
}

impl Testbed {
    /// Binds both cards' ports, starts the cards and sets their addresses.
    pub fn start(config: TestbedConfig) -> Result<Testbed, TestbedError> {
        let [udp0, udp1] = bind_pair(config.port)?;
        let port = udp0.local_addr().port();
        let link_stats = [udp0.stats().clone(), udp1.stats().clone()];
        let (card0, record0) = start_card(0, udp0, &config)?;
        let (card1, record1) = start_card(1, udp1, &config)?;
        let cards = [card0, card1];
        let received = record0.zip(record1).map(|(a, b)| [a, b]);
        let open = |side: usize| -> Result<Driver, TestbedError> {
            let card = &cards[side];
            let mut driver = RawDriver::open(card.regs.clone(), HostDma::new(card.map.clone()))?;
            driver.configure(CARD_MACS[side], CARD_IPS[side])?;
            Ok(driver)
        };
        let drivers = [open(0)?, open(1)?];
        let memory = [
            HostMemory::new(cards[0].map.clone()),
            HostMemory::new(cards[1].map.clone()),
        ];
        Ok(Testbed {
            cards,
            drivers,
            memory,
            link_stats,
            received,
            buffers: Vec::new(),
            port,
            next_qp: 1,
            next_mr: [1, 1],
            next_pgt: [0, 0],
        })
    }

    /// The UDP port both cards are bound to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Card `side` (0 = blue0, 1 = blue1).
    pub fn card(&self, side: usize) -> &InProcessCard {
        &self.cards[side]
    }

    /// The raw-ring driver of card `side`.
    pub fn driver(&mut self, side: usize) -> &mut Driver {
        &mut self.drivers[side]
    }

    /// The counters of card `side`'s link port (faults and capture included).
    pub fn link_stats(&self, side: usize) -> LinkStatsSnapshot {
        self.link_stats[side].snapshot()
    }

    /// The emulated card's own counters.
    pub fn nic_stats(&self, side: usize) -> NicStatsSnapshot {
        self.cards[side].nic.stats().snapshot()
    }

    /// The RTL stops the cards reached, one line each naming the card (taken: the caller
    /// reports them, so dropping the testbed does not panic for them).
    pub fn take_rtl_stops(&self) -> Vec<String> {
        self.cards
            .iter()
            .zip(CARD_NAMES)
            .filter_map(|(c, name)| {
                c.nic
                    .shared()
                    .take_rtl_stop()
                    .map(|stop| format!("{name} froze at an RTL stop: {stop}"))
            })
            .collect()
    }

    /// A counter register of card `side`.
    pub fn counter(&self, side: usize, counter: Counter) -> u32 {
        self.cards[side].nic.regs().counter(counter)
    }

    /// Connects a fresh QP index on each card: blue0's end may do anything, blue1's has
    /// `access` (its receive-queue rights). Both use `pmtu`.
    pub fn connect(&mut self, access: AccessFlags, pmtu: Pmtu) -> Result<QpPair, TestbedError> {
        let index = self.next_qp;
        if index >= QP_TABLE_LEN {
            return Err(TestbedError::Exhausted("QP index"));
        }
        self.next_qp += 1;
        // Different key bytes on the two ends, so that a packet addressed with the wrong
        // end's QPN fails the card's key check.
        let key = |salt: u8| (index as u8).wrapping_mul(29) ^ salt;
        let qpn = [
            Qpn::new(index, key(0xA5)).ok_or(TestbedError::Exhausted("QP index"))?,
            Qpn::new(index, key(0x5A)).ok_or(TestbedError::Exhausted("QP index"))?,
        ];
        self.drivers[0].manage_qp(
            true,
            qpn[0],
            qpn[1],
            CARD_IPS[1],
            CARD_MACS[1],
            ALL_ACCESS,
            pmtu,
        )?;
        self.drivers[1].manage_qp(
            true,
            qpn[1],
            qpn[0],
            CARD_IPS[0],
            CARD_MACS[0],
            access,
            pmtu,
        )?;
        Ok(QpPair { qpn, pmtu })
    }

    /// Allocates `len` bytes (at least one) on card `side`, fills byte i with `fill(i)` and
    /// registers the whole buffer with `access` under a fresh MR key.
    pub fn register(
        &mut self,
        side: usize,
        len: usize,
        access: AccessFlags,
        fill: impl Fn(usize) -> u8,
    ) -> Result<Mr, TestbedError> {
        // A zero-length registration would deregister the entry (mr_length 0).
        let len = len.max(1);
        let index = self.next_mr[side];
        if index >= MR_TABLE_LEN {
            return Err(TestbedError::Exhausted("MR index"));
        }
        let key = MrKey::new(index, (index as u8).wrapping_mul(37) ^ 0x11)
            .ok_or(TestbedError::Exhausted("MR index"))?;
        // Page-aligned, so that a run's packets do not depend on where the heap put the
        // buffer: a WRITE splits at PMTU boundaries of its address, and the same traffic
        // into a buffer 16-byte aligned one run and 1 KiB aligned the next gave 544
        // packets instead of 512 (and other fault decisions for the same seed).
        let mut buffer = vec![0u8; len + BUFFER_ALIGN - 1];
        let skip = buffer.as_ptr().align_offset(BUFFER_ALIGN);
        for (i, b) in buffer[skip..skip + len].iter_mut().enumerate() {
            *b = fill(i);
        }
        let va = buffer.as_ptr() as u64 + skip as u64;
        let page = PageSize::Size2M;
        let pages = page.pages_spanned(va, len as u64) as u32;
        let pgt = self.next_pgt[side];
        if pgt.saturating_add(pages) > PGT_LEN {
            return Err(TestbedError::Exhausted("page-table entry"));
        }
        // The buffer is owned by the testbed before the card can reach it.
        self.buffers.push(buffer);
        let slot = self.buffers.len() - 1;
        self.drivers[side].register_mr(
            &mut self.memory[side],
            key,
            VirtAddr(va),
            len,
            access,
            pgt,
            page,
            1,
        )?;
        self.next_mr[side] += 1;
        self.next_pgt[side] += pages;
        Ok(Mr {
            side,
            key,
            va,
            len,
            slot,
            skip,
        })
    }

    /// The bytes of a registered buffer. Read them once the card has reported the writes
    /// that matter (the card writes the payload before the report: nic-behaviour.md 2.6).
    pub fn bytes(&self, mr: &Mr) -> &[u8] {
        &self.buffers[mr.slot][mr.skip..mr.skip + mr.len]
    }

    /// Posts work requests on card `side`'s send ring, waiting up to a second for room.
    pub fn post(&mut self, side: usize, requests: &[SendRequest]) -> Result<(), TestbedError> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.drivers[side].post_send(requests) {
                Err(RawError::Full) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_micros(50))
                }
                other => return Ok(other?),
            }
        }
    }

    /// Meta reports of card `side`, collected until `done` holds for all of them so far and
    /// then for `quiet` more (later reports, e.g. of the quiet timer), or until `max`.
    pub fn reports_until(
        &mut self,
        side: usize,
        quiet: Duration,
        max: Duration,
        done: impl Fn(&[MetaReport]) -> bool,
    ) -> Vec<MetaReport> {
        let deadline = Instant::now() + max;
        let mut out = Vec::new();
        while !done(&out) && Instant::now() < deadline {
            out.extend(
                self.drivers[side]
                    .collect_meta(Duration::from_millis(2), Duration::from_millis(20)),
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        out.extend(self.drivers[side].collect_meta(quiet, left.max(quiet)));
        out
    }

    /// Discards the meta reports waiting on both cards.
    pub fn drain_reports(&mut self) {
        for driver in &mut self.drivers {
            driver.collect_meta(Duration::ZERO, Duration::ZERO);
        }
    }

    /// Waits until the traffic has settled: both send rings consumed, every frame either
    /// card put on the link received by the other, and no counter moving for `calm`.
    /// Returns false if that did not happen within `max` (frames lost below the fault
    /// injector, e.g. by a full socket buffer).
    pub fn settle(&self, calm: Duration, max: Duration) -> bool {
        let start = Instant::now();
        let mut last = self.activity();
        let mut since = Instant::now();
        loop {
            thread::sleep(Duration::from_micros(500));
            let now = self.activity();
            if now != last {
                last = now;
                since = Instant::now();
            }
            let delivered = (0..2).all(|side| {
                let regs = self.cards[side].nic.regs();
                let send = RingId::Send(0);
                let sent = self.link_stats[side].snapshot().frames_sent;
                let received = self.link_stats[1 - side].snapshot().frames_received;
                regs.ring(send, RingReg::Head) == regs.ring(send, RingReg::Tail) && received >= sent
            });
            if delivered && since.elapsed() >= calm {
                return true;
            }
            if start.elapsed() >= max {
                return false;
            }
        }
    }

    /// Every counter that moves while frames are in flight.
    fn activity(&self) -> [u64; 6] {
        let (l0, l1) = (self.link_stats(0), self.link_stats(1));
        let (n0, n1) = (self.nic_stats(0), self.nic_stats(1));
        [
            l0.frames_sent,
            l1.frames_sent,
            l0.frames_received,
            l1.frames_received,
            n0.tx_packets,
            n1.rx_frames,
        ]
    }

    /// The frames card `side` received so far (addressed to its IP), in arrival order;
    /// `None` unless the testbed was built with [`TestbedConfig::record_received`].
    pub fn received_frames(&self, side: usize) -> Option<Vec<Vec<u8>>> {
        let record = &self.received.as_ref()?[side];
        record.sink.flush().ok()?;
        let bytes = record.bytes.0.lock().ok()?;
        let ip = CARD_IPS[side].octets();
        Some(
            pcap_frames(&bytes)
                .into_iter()
                .filter(|f| f.get(30..34) == Some(&ip[..]))
                .map(<[u8]>::to_vec)
                .collect(),
        )
    }
}

/// Starts card `side` on `udp` with the layers `config` asks for (see the module
/// documentation), and its record of received frames if asked.
fn start_card(
    side: usize,
    udp: UdpLink,
    config: &TestbedConfig,
) -> Result<(InProcessCard, Option<ReceiveRecord>), TestbedError> {
    let mut link: Box<dyn LinkPort> = Box::new(udp);
    if let Some(sink) = &config.capture {
        link = Box::new(CapturingLink::new(
            link,
            sink.clone(),
            CaptureDirection::Transmit,
        ));
    }
    if let Some(faults) = config.faults[side].filter(FaultConfig::is_active) {
        link = Box::new(FaultyLink::new(link, faults)?);
    }
    let mut record = None;
    if config.record_received {
        let bytes = MemorySink::default();
        let sink = PcapSink::new(bytes.clone())?;
        link = Box::new(CapturingLink::new(
            link,
            sink.clone(),
            CaptureDirection::Both,
        ));
        record = Some(ReceiveRecord { sink, bytes });
    }
    let rtl_stops = match (config.allow_rtl_stops, RtlStopPolicy::from_env()) {
        (_, RtlStopPolicy::Continue) => RtlStopPolicy::Continue,
        (true, _) => RtlStopPolicy::Freeze,
        (false, _) => RtlStopPolicy::Fail,
    };
    let nic = NicConfig {
        name: CARD_NAMES[side].into(),
        rtl_stops,
        ..NicConfig::default()
    };
    Ok((InProcessCard::start(nic, link)?, record))
}

/// Binds blue0's and blue1's ports on `port` (0: one free port for both, retried if
/// blue1's address happens to have it taken).
fn bind_pair(port: u16) -> io::Result<[UdpLink; 2]> {
    let bind =
        |side: usize, port: u16| UdpLink::bind(UdpLinkConfig::new(CARD_IPS[side]).with_port(port));
    if port != 0 {
        let named = |side: usize| {
            bind(side, port).map_err(|e| {
                let hint = if e.kind() == io::ErrorKind::AddrInUse {
                    " (another sim running? choose another port)"
                } else {
                    ""
                };
                io::Error::new(
                    e.kind(),
                    format!("cannot bind {}:{port}: {e}{hint}", CARD_IPS[side]),
                )
            })
        };
        return Ok([named(0)?, named(1)?]);
    }
    let mut last = None;
    for _ in 0..32 {
        let first = bind(0, 0)?;
        match bind(1, first.local_addr().port()) {
            Ok(second) => return Ok([first, second]),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free UDP port pair")))
}

/// The frames of a classic pcap stream as [`crate::link::PcapWriter`] writes it (native
/// byte order); stops at the first truncated record.
pub fn pcap_frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut at = 24;
    while let Some(header) = bytes.get(at..at + 16) {
        let incl = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]) as usize;
        let Some(frame) = bytes.get(at + 16..at + 16 + incl) else {
            break;
        };
        frames.push(frame);
        at += 16 + incl;
    }
    frames
}
