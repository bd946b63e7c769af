//! Serve mode: the emulated card behind the RTL simulator's sockets
//! (`shared/spec/rtl-sim-protocol.md`, corrected by `shared/spec/nic-behaviour.md` section 8),
//! and the driver side that attaches to it (or to the real simulator).
//!
//! - [`ServedCard`] runs the model with its register file behind a
//!   [`CsrServer`] (JSON register lines) and its bus master behind a [`DmaServer`] (one
//!   JSON line per bus beat). The transmit thread uses DMA channel 0 ([`TX_DMA_CHANNEL`]),
//!   the receive thread channel 1 ([`RX_DMA_CHANNEL`]); both share the one driver
//!   connection, each access whole (section 8.3: all channels share one connection).
//! - [`RtlAttach`] is the driver side: a [`CsrClient`] for the registers and a
//!   [`DmaClient`] that answers the card's beats from the driver's own [`AddressMap`], into
//!   which [`HostDma`] allocates and [`HostMemory`] pins. It is what a driver built for the
//!   real simulator uses, so a test over `ServedCard` + `RtlAttach` runs the whole protocol
//!   path without the RTL.
//! - [`LoopbackLink`] is the loopback bench's Ethernet (every frame sent comes back), the
//!   default link of the command-line serve mode; the two-card and soft-switch links are
//!   [`crate::rtl::TwoCardLink`] and [`crate::rtl::SoftSwitchLink`].
//!
//! The model only touches host memory when the driver gives it work (a doorbell, a frame
//! for a configured card), and it needs the driver's DMA connection then. An access made
//! while no driver is connected waits for one up to [`DmaServerConfig::driver_wait`], then
//! fails: the model counts a DMA fault (`NicStats::dma_faults`), logs it and keeps running.
//!
//! From the command line (`src/bin/bluerdma-sim.rs`):
//!
//! ```text
//! bluerdma-sim serve [--inst N] [--csr-port P] [--dma-port P] [--link SPEC] ...
//! ```
//!
//! serves instance N (default 1) on the simulator's ports (CSR 7700 + N, DMA 7002 + N), so
//! a driver built for the RTL simulator talks to the model unchanged; `--link` is
//! `loopback` (default, the one-card bench), `two-card-listen[:PORT]` (card 1),
//! `two-card-connect[:PORT]` (card 2), `soft-switch[:PORT]` or `udp:IP[:PORT]`.
//! `bluerdma-sim help` lists every option.

use std::fmt;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use bluerdma_core::regs::UndecodedAccess;

use crate::link::mem::DEFAULT_QUEUE_FRAMES;
use crate::link::{FrameSender, LinkCounter, LinkPort, LinkStats};
use crate::mem::{AddressMap, HostDma, HostMemory};
use crate::model::regs::RegisterFile;
use crate::model::{Nic, NicConfig};
use crate::rtl::csr::csr_port;
use crate::rtl::dma::dma_port;
use crate::rtl::{
    CsrClient, CsrClientConfig, CsrServer, CsrServerStats, CsrTarget, DmaChannel, DmaClient,
    DmaClientConfig, DmaServer, DmaServerConfig,
};

/// The DMA channel of the model's transmit thread (command, send and simple-NIC TX rings:
/// channel 0 carries the rings in the RTL).
pub const TX_DMA_CHANNEL: DmaChannel = DmaChannel::ZERO;

/// The DMA channel of the model's receive thread (payload writes, reports, simple-NIC RX).
/// The RTL spreads these over all four channels; the channel is only a label on a write,
/// and keeping the two threads apart keeps their read request ids in separate sequences.
pub const RX_DMA_CHANNEL: DmaChannel = match DmaChannel::new(1) {
    Some(c) => c,
    None => panic!("channel 1 exists"),
};

/// The two TCP ports of a served card on 127.0.0.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServePorts {
    /// The register channel.
    pub csr: u16,
    /// The DMA channel.
    pub dma: u16,
}

impl ServePorts {
    /// Ports the OS chooses (0): for tests, which read the bound ones back from
    /// [`ServedCard::ports`].
    pub const ANY: ServePorts = ServePorts { csr: 0, dma: 0 };

    /// The simulator's ports for instance `inst`: CSR 7700 + inst, DMA 7002 + inst (the
    /// one-card loopback bench is instance 1: 7701 and 7003).
    pub const fn for_instance(inst: u8) -> Self {
        ServePorts {
            csr: csr_port(inst),
            dma: dma_port(inst),
        }
    }
}

impl fmt::Display for ServePorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CSR 127.0.0.1:{}, DMA 127.0.0.1:{}", self.csr, self.dma)
    }
}

/// The card's register file as the CSR server sees it: BAR0 offsets as they arrive; an
/// offset the RTL does not decode is reported back, and the server answers a read of it
/// with 0xAAAAAAAA (the register file also counts it, see [`RegisterFile::undecoded`]).
impl CsrTarget for RegisterFile {
    fn csr_read(&self, offset: u32) -> Result<u32, UndecodedAccess> {
        self.read(offset)
    }

    fn csr_write(&self, offset: u32, value: u32) -> Result<(), UndecodedAccess> {
        self.write(offset, value)
    }
}

/// An emulated card serving the RTL simulator's protocol. Dropping it stops the servers and
/// the model's threads and frees both ports.
pub struct ServedCard {
    nic: Nic,
    /// `Some` until drop.
    csr: Option<CsrServer>,
    /// `Some` until drop.
    dma: Option<DmaServer>,
    ports: ServePorts,
}

impl fmt::Debug for ServedCard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServedCard")
            .field("name", &self.nic.shared().config.name)
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

impl ServedCard {
    /// Starts a card on `link` serving `ports` (0 picks a free port), with the simulator's
    /// DMA defaults: 32-byte beats, 10 s for a read reply, 10 s for a driver to connect.
    pub fn start(
        config: NicConfig,
        ports: ServePorts,
        link: Box<dyn LinkPort>,
    ) -> io::Result<Self> {
        let dma = DmaServerConfig {
            port: ports.dma,
            ..DmaServerConfig::default()
        };
        Self::start_with(config, ports.csr, dma, link)
    }

    /// Starts a card on `link` whose CSR server listens on `csr_port` and whose DMA server
    /// is configured by `dma` (bus width, reply and driver waits).
    pub fn start_with(
        config: NicConfig,
        csr_port: u16,
        dma: DmaServerConfig,
        link: Box<dyn LinkPort>,
    ) -> io::Result<Self> {
        let file = Arc::new(RegisterFile::new());
        let dma = DmaServer::bind(dma)?;
        // A driver whose DMA connection ends: what the card fetched for it is dropped (its
        // memory is gone). The rings are reset when its CSR connection ends, which the
        // server handles before it serves the next driver's writes (a reset on the DMA
        // side could land after the next driver had programmed the rings: its DMA
        // connection can be accepted after its first CSR writes).
        let card = Arc::clone(&file);
        dma.on_driver_gone(move || card.driver_gone());
        let csr = CsrServer::bind(csr_port, Arc::clone(&file) as Arc<dyn CsrTarget>)?;
        let rings = Arc::clone(&file);
        csr.on_client_gone(move || {
            rings.reset_rings();
            log::info!("the driver went away: the card's rings are reset");
        });
        let ports = ServePorts {
            csr: csr.local_addr().port(),
            dma: dma.local_addr().port(),
        };
        // Registers written before the threads start are kept; the transmit thread looks
        // at the rings first thing.
        let nic = Nic::spawn(
            config,
            file,
            Box::new(dma.channel(TX_DMA_CHANNEL)),
            Box::new(dma.channel(RX_DMA_CHANNEL)),
            link,
        )?;
        log::info!("{}: serving {ports}", nic.shared().config.name);
        Ok(ServedCard {
            nic,
            csr: Some(csr),
            dma: Some(dma),
            ports,
        })
    }

    /// The running model (counters, register file, state).
    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// The ports the servers listen on.
    pub fn ports(&self) -> ServePorts {
        self.ports
    }

    /// The CSR server's counters.
    pub fn csr_stats(&self) -> CsrServerStats {
        self.csr.as_ref().map(CsrServer::stats).unwrap_or_default()
    }

    /// The DMA server's counters.
    pub fn dma_stats(&self) -> crate::rtl::dma::DmaServerStats {
        self.dma.as_ref().map(DmaServer::stats).unwrap_or_default()
    }

    /// Waits up to `timeout` for a driver's DMA connection; returns whether one is held.
    pub fn wait_for_driver(&self, timeout: Duration) -> bool {
        self.dma
            .as_ref()
            .is_some_and(|d| d.wait_for_driver(timeout))
    }
}

impl Drop for ServedCard {
    fn drop(&mut self) {
        // Registers first (no new doorbells), then DMA: stopping the server fails at once
        // any access still waiting for a driver, so the model's threads see the stop flag
        // promptly instead of after the driver wait.
        if let Some(csr) = self.csr.take() {
            csr.shutdown();
        }
        if let Some(dma) = self.dma.take() {
            dma.shutdown();
        }
        self.nic.stop();
    }
}

/// The driver's side of the RTL protocol: register access over the CSR socket and host
/// memory served to the card over the DMA socket. Works against a [`ServedCard`] or the real
/// simulator. Dropping it closes both connections.
pub struct RtlAttach {
    /// Register access.
    pub regs: CsrClient,
    /// DMA buffers, allocated in [`RtlAttach::map`].
    pub dma: HostDma,
    /// User-memory registration, pinned into [`RtlAttach::map`].
    pub mem: HostMemory,
    /// The driver's memory as the card may reach it: the DMA client answers every beat
    /// from this map (a beat outside it is a counted fault, answered with zeros).
    pub map: AddressMap,
    /// The thread that answers the card's DMA beats.
    pub dma_client: DmaClient,
}

impl fmt::Debug for RtlAttach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RtlAttach")
            .field("regs", &self.regs)
            .field("dma_client", &self.dma_client)
            .finish_non_exhaustive()
    }
}

impl RtlAttach {
    /// Connects to the card (or simulator) on `ports`, retrying while it is not listening
    /// yet as a driver of the simulator does (100 ms doubling to 2 s, giving up after
    /// 300 s).
    pub fn connect(ports: ServePorts) -> io::Result<Self> {
        let csr = CsrClientConfig {
            port: ports.csr,
            ..CsrClientConfig::default()
        };
        let dma = DmaClientConfig {
            port: ports.dma,
            ..DmaClientConfig::default()
        };
        Self::connect_with(&csr, &dma)
    }

    /// Connects with explicit client configurations (retry policy, reply timeout).
    pub fn connect_with(csr: &CsrClientConfig, dma: &DmaClientConfig) -> io::Result<Self> {
        let map = AddressMap::new();
        // DMA first: the card may need memory as soon as the first doorbell lands.
        let dma_client = DmaClient::connect(dma, map.clone())?;
        let regs = CsrClient::connect(csr)?;
        Ok(RtlAttach {
            regs,
            dma: HostDma::new(map.clone()),
            mem: HostMemory::new(map.clone()),
            map,
            dma_client,
        })
    }
}

/// The loopback bench's Ethernet: every frame sent is received by the same port, whatever
/// its addresses (`nic-behaviour.md` 8.1, "TX frames re-injected into RX"). A full receive
/// queue drops the frame and counts it ([`LinkCounter::RxQueueDrops`]).
pub struct LoopbackLink {
    sender: LoopbackSender,
    incoming: Receiver<Vec<u8>>,
}

impl fmt::Debug for LoopbackLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackLink")
            .field("stats", &self.sender.stats.snapshot())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct LoopbackSender {
    queue: SyncSender<Vec<u8>>,
    stats: LinkStats,
}

impl FrameSender for LoopbackSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        for frame in frames {
            match self.queue.try_send(frame.to_vec()) {
                Ok(()) => self.stats.add(LinkCounter::FramesSent, 1),
                Err(TrySendError::Full(_)) => {
                    self.stats.add(LinkCounter::FramesSent, 1);
                    self.stats.add(LinkCounter::RxQueueDrops, 1);
                }
                // The port is gone; nobody receives any more.
                Err(TrySendError::Disconnected(_)) => {
                    self.stats.add(LinkCounter::FramesUnroutable, 1)
                }
            }
        }
        Ok(())
    }
}

impl LoopbackLink {
    /// A loopback port whose receive queue holds the memory hub's default number of frames.
    pub fn new() -> Self {
        let (queue, incoming) = mpsc::sync_channel(DEFAULT_QUEUE_FRAMES);
        LoopbackLink {
            sender: LoopbackSender {
                queue,
                stats: LinkStats::new(),
            },
            incoming,
        }
    }
}

impl Default for LoopbackLink {
    fn default() -> Self {
        Self::new()
    }
}

impl LinkPort for LoopbackLink {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.sender.send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // The port holds a sender itself, so the queue never disconnects.
        Ok(crate::link::mem::recv_queued(
            &self.incoming,
            timeout,
            on_frame,
            &self.sender.stats,
        ))
    }

    fn stats(&self) -> &LinkStats {
        &self.sender.stats
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(self.sender.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use bluerdma_core::platform::RegisterAccess;
    use bluerdma_core::regs::{Reg, RingId, RingReg, DECODED_CHANNELS};

    use super::*;
    use crate::link::MemHub;
    use crate::rtl::RetryPolicy;

    fn card(dma: DmaServerConfig) -> ServedCard {
        let link = MemHub::new()
            .attach(std::net::Ipv4Addr::new(127, 0, 0, 1))
            .unwrap();
        ServedCard::start_with(NicConfig::default(), 0, dma, Box::new(link)).unwrap()
    }

    fn quick_dma() -> DmaServerConfig {
        DmaServerConfig {
            port: 0,
            reply_timeout: Duration::from_secs(5),
            driver_wait: Duration::from_millis(100),
            ..DmaServerConfig::default()
        }
    }

    fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn reg(id: RingId, r: RingReg) -> Reg {
        id.reg(r, DECODED_CHANNELS).unwrap()
    }

    #[test]
    fn registers_are_served_over_the_csr_socket_and_undecoded_reads_get_aaaaaaaa() {
        let card = card(quick_dma());
        let mut s = TcpStream::connect(("127.0.0.1", card.ports().csr)).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        // 0x100 is the command request ring's base low; 0x40 is send ring 1 (not decoded).
        s.write_all(b"{\"is_write\": true, \"addr\": 256, \"value\": 4096}\n")
            .unwrap();
        s.write_all(b"{\"is_write\": false, \"addr\": 256, \"value\": 0}\n")
            .unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(
            line,
            "{\"is_write\": false, \"addr\": 256, \"value\": 4096}\n"
        );
        assert_eq!(card.nic().regs().ring_base(RingId::CmdRequest), 4096);
        s.write_all(b"{\"is_write\": false, \"addr\": 64}\n")
            .unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(
            line,
            "{\"is_write\": false, \"addr\": 64, \"value\": 2863311530}\n"
        );
        let (undecoded, last) = card.nic().regs().undecoded();
        assert_eq!(undecoded, 1, "the model counts the undecoded read");
        assert_eq!(
            last,
            Some(UndecodedAccess {
                offset: 64,
                is_write: false
            })
        );
        assert_eq!(card.csr_stats().undecoded_accesses, 1);
        // The RTL's simulation ends at such a read: the card froze, naming it (taken here,
        // so dropping the card does not fail the test for it).
        assert_eq!(
            card.nic().shared().take_rtl_stop(),
            Some(crate::model::RtlStop::UndecodedRegister {
                offset: 64,
                is_write: false
            })
        );
        assert!(card.nic().shared().frozen());
    }

    #[test]
    fn without_a_dma_driver_the_model_counts_faults_keeps_serving_and_stops_promptly() {
        let card = card(quick_dma());
        let regs = CsrClient::connect(&CsrClientConfig {
            port: card.ports().csr,
            retry: RetryPolicy::fixed(Duration::from_millis(10), Duration::from_secs(2)),
            reply_timeout: Duration::from_secs(5),
        })
        .unwrap();
        // A doorbell on the command ring: the model must fetch, and nobody answers DMA.
        let ring = RingId::CmdRequest;
        regs.write32(reg(ring, RingReg::BaseLo), 0x1000);
        regs.write32(reg(ring, RingReg::Head), 1);
        eventually("a DMA fault", || {
            card.nic().stats().snapshot().dma_faults >= 1
        });
        assert!(card.dma_stats().errors >= 1);
        assert_eq!(
            regs.try_read32(reg(ring, RingReg::Head)),
            Ok(1),
            "the CSR channel still answers"
        );
        // The model retries the fetch and waits for a driver each time; drop must not wait.
        let started = Instant::now();
        drop(card);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "drop took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn drop_frees_both_ports_and_ends_the_drivers_connections() {
        let card = card(DmaServerConfig {
            driver_wait: Duration::from_secs(60),
            ..quick_dma()
        });
        let ports = card.ports();
        assert_ne!(ports.csr, 0);
        assert_ne!(ports.dma, 0);
        let driver = RtlAttach::connect(ports).unwrap();
        assert!(card.wait_for_driver(Duration::from_secs(5)));
        let head = reg(RingId::Send(0), RingReg::Head);
        driver.regs.write32(head, 3);
        assert_eq!(driver.regs.try_read32(head), Ok(3));
        drop(card);
        eventually("the DMA client to see the end", || {
            !driver.dma_client.stats().running
        });
        assert!(driver.regs.try_read32(head).is_err());
        // Both ports can be served again at once.
        let again = ServedCard::start_with(
            NicConfig::default(),
            ports.csr,
            DmaServerConfig {
                port: ports.dma,
                ..quick_dma()
            },
            Box::new(LoopbackLink::new()),
        )
        .unwrap();
        assert_eq!(again.ports(), ports);
    }

    #[test]
    fn loopback_link_returns_every_frame_to_its_port_and_sender() {
        let mut link = LoopbackLink::new();
        let mut sender = link.sender().unwrap();
        link.send_frames(&[&[1, 2, 3], &[4]]).unwrap();
        sender.send_frames(&[&[5; 60]]).unwrap();
        let mut got = Vec::new();
        let n = link
            .recv_frames(Duration::from_millis(100), &mut |f| got.push(f.to_vec()))
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(got, vec![vec![1, 2, 3], vec![4], vec![5; 60]]);
        let s = link.stats().snapshot();
        assert_eq!((s.frames_sent, s.frames_received), (3, 3));
        assert_eq!(
            link.recv_frames(Duration::ZERO, &mut |_| panic!("no frame"))
                .unwrap(),
            0
        );
    }
}
