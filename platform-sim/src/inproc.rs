//! Attaching a driver to an emulated card in the same process (the default, fastest way):
//! register access is a call into the card's register file, DMA buffers come from the heap,
//! and device addresses are the process's virtual addresses plus
//! [`crate::mem::DEVICE_OFFSET`].
//!
//! [`device_link`] builds the Ethernet port such a card gets as a device of the verbs API:
//! the UDP link at the device's address (with shared-memory rings to the cards of this
//! host), with seeded faults and a pcap capture stacked on it when asked for.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Direction, Reg, RegKind, RingId, RingReg};

use crate::link::{
    CaptureDirection, CapturingLink, FaultConfig, FaultyLink, LinkPort, PcapSink, ShmConfig,
    ShmLink, UdpLink, UdpLinkConfig,
};
use crate::mem::{AddressMap, HostDma, HostMemory};
use crate::model::regs::RegisterFile;
use crate::model::{InlineNic, Nic, NicConfig, Shared};

pub use bluerdma_core::regs::UNDECODED_READ;

/// Register access to an in-process card: a call, not a socket. On an inline card a
/// command doorbell runs the card's transmit side in the writer's thread before the write
/// returns, and a send-ring doorbell marks it due ([`InlineNic::ring_send`]).
#[derive(Clone)]
pub struct SimRegs {
    file: Arc<RegisterFile>,
    /// The inline card (weak: once its owner drops it, doorbells ring nothing).
    inline: Option<Weak<InlineNic>>,
}

impl SimRegs {
    /// Access to `file` (of a threaded or stepped card).
    pub fn new(file: Arc<RegisterFile>) -> Self {
        Self { file, inline: None }
    }

    /// Access to the register file of `card`, whose doorbells step it.
    pub fn inline(card: &Arc<InlineNic>) -> Self {
        Self {
            file: Arc::clone(&card.shared().regs),
            inline: Some(Arc::downgrade(card)),
        }
    }
}

impl RegisterAccess for SimRegs {
    fn read32(&self, reg: Reg) -> u32 {
        // A `Reg` is always decoded, so the error arm is unreachable in practice; it keeps
        // the hardware's answer rather than panicking.
        self.file
            .read(reg.offset() as u32)
            .unwrap_or(UNDECODED_READ)
    }

    fn write32(&self, reg: Reg, value: u32) {
        let _ = self.file.write(reg.offset() as u32, value);
        let Some(card) = &self.inline else { return };
        match reg.kind() {
            // A command, or room for the responses an inline card holds its commands back
            // for: the driver waits for the answer, the card runs now.
            RegKind::Ring(RingId::CmdRequest, RingReg::Head)
            | RegKind::Ring(RingId::CmdResponse, RingReg::Tail) => {
                if let Some(card) = card.upgrade() {
                    card.doorbell();
                }
            }
            // Work requests and simple-NIC frames: at the driver's next step.
            RegKind::Ring(id, RingReg::Head) if id.direction() == Direction::HostToCard => {
                if let Some(card) = card.upgrade() {
                    card.ring_send();
                }
            }
            _ => {}
        }
    }
}

/// An emulated card running in this process, with the platform services a driver needs.
pub struct InProcessCard {
    /// The running card.
    pub nic: Nic,
    /// Register access.
    pub regs: SimRegs,
    /// DMA buffers the card can reach.
    pub dma: HostDma,
    /// User-memory registration for the card.
    pub mem: HostMemory,
    /// The card's view of host memory.
    pub map: AddressMap,
}

impl InProcessCard {
    /// Starts a card on `link`.
    pub fn start(config: NicConfig, link: Box<dyn LinkPort>) -> io::Result<Self> {
        let map = AddressMap::new();
        let file = Arc::new(RegisterFile::new());
        let nic = Nic::spawn(
            config,
            Arc::clone(&file),
            Box::new(map.clone()),
            Box::new(map.clone()),
            link,
        )?;
        Ok(Self {
            nic,
            regs: SimRegs::new(file),
            dma: HostDma::new(map.clone()),
            mem: HostMemory::new(map.clone()),
            map,
        })
    }
}

/// An emulated card in this process that runs in its driver's threads ([`InlineNic`]), with
/// the platform services a driver needs.
pub struct InlineCard {
    /// The card.
    pub nic: Arc<InlineNic>,
    /// Register access (its doorbells step the card).
    pub regs: SimRegs,
    /// DMA buffers the card can reach.
    pub dma: HostDma,
    /// User-memory registration for the card.
    pub mem: HostMemory,
}

impl InlineCard {
    /// A card on `link`.
    pub fn start(config: NicConfig, link: Box<dyn LinkPort>) -> io::Result<Self> {
        let map = AddressMap::new();
        let file = Arc::new(RegisterFile::new());
        let nic = Arc::new(InlineNic::new(
            config,
            file,
            Box::new(map.clone()),
            Box::new(map.clone()),
            link,
        )?);
        Ok(Self {
            regs: SimRegs::inline(&nic),
            nic,
            dma: HostDma::new(map.clone()),
            mem: HostMemory::new(map),
        })
    }
}

/// How [`device_link`] builds a device's link.
#[derive(Clone, Debug, Default)]
pub struct DeviceLinkOptions {
    /// The UDP port of every card on the link (`None`: 4791).
    pub port: Option<u16>,
    /// Seeded faults on transmit.
    pub faults: Option<FaultConfig>,
    /// Capture both directions into this pcap file (unbuffered: a process that exits
    /// without closing the device still leaves every frame in it).
    pub capture: Option<PathBuf>,
    /// Rings in shared memory to the cards of this host ([`ShmLink`]); `None`: UDP only.
    /// [`ShmConfig::from_env`] gives what devices use.
    pub shm: Option<ShmConfig>,
}

/// Why [`device_link`] failed; the text names the address or file.
#[derive(Debug)]
pub enum DeviceLinkError {
    /// The UDP socket could not be bound.
    Bind {
        /// The address.
        ip: Ipv4Addr,
        /// The port.
        port: u16,
        /// The OS error.
        source: io::Error,
    },
    /// The fault configuration is unusable.
    Faults(String),
    /// The capture file could not be created.
    Capture {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl DeviceLinkError {
    /// The OS error number behind the failure (EINVAL for a bad fault configuration).
    pub fn errno(&self) -> i32 {
        match self {
            DeviceLinkError::Bind { source, .. } | DeviceLinkError::Capture { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            DeviceLinkError::Faults(_) => libc::EINVAL,
        }
    }
}

impl fmt::Display for DeviceLinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceLinkError::Bind { ip, port, source } => {
                write!(f, "the emulated card's UDP link on {ip}:{port}: {source}")?;
                match source.raw_os_error() {
                    Some(libc::EADDRINUSE) => write!(
                        f,
                        " (another process has this device open; `ss -uanp | grep {port}` \
                         names it)"
                    ),
                    Some(libc::EADDRNOTAVAIL) => {
                        write!(f, " ({ip} is not an address of this host)")
                    }
                    _ => Ok(()),
                }
            }
            DeviceLinkError::Faults(e) => write!(f, "link faults: {e}"),
            DeviceLinkError::Capture { path, source } => {
                write!(f, "capture file {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for DeviceLinkError {}

/// The Ethernet port of an emulated device at `ip`: the UDP link (reaching peers over the
/// host's network when `ip` is not a loopback address) with rings to the cards of this host
/// when `opts.shm` asks for them, then the faults, then the capture.
pub fn device_link(
    ip: Ipv4Addr,
    opts: &DeviceLinkOptions,
) -> Result<Box<dyn LinkPort>, DeviceLinkError> {
    let mut cfg = UdpLinkConfig {
        network: !ip.is_loopback(),
        ..UdpLinkConfig::new(ip)
    };
    if let Some(port) = opts.port {
        cfg.port = port;
    }
    let port = cfg.port;
    let udp = UdpLink::bind(cfg).map_err(|source| DeviceLinkError::Bind { ip, port, source })?;
    let udp: Box<dyn LinkPort> = match opts.shm.clone() {
        Some(shm) => match ShmLink::over(udp, shm) {
            Ok(link) => Box::new(link),
            Err((udp, e)) => {
                log::warn!("{ip}: no shared-memory link ({e}); UDP only");
                udp
            }
        },
        None => Box::new(udp),
    };
    let link: Box<dyn LinkPort> = match opts.faults {
        Some(f) => {
            Box::new(FaultyLink::new(udp, f).map_err(|e| DeviceLinkError::Faults(e.to_string()))?)
        }
        None => Box::new(udp),
    };
    let Some(path) = &opts.capture else {
        return Ok(link);
    };
    let sink = std::fs::File::create(path)
        .and_then(PcapSink::new)
        .map_err(|source| DeviceLinkError::Capture {
            path: path.clone(),
            source,
        })?;
    log::info!("{ip}: capturing to {}", path.display());
    Ok(Box::new(CapturingLink::new(
        link,
        sink,
        CaptureDirection::Both,
    )))
}

/// A card's counters and its non-zero register counters, as one line of text; then the
/// RTL stop the card froze at, if it did.
pub fn card_counters(card: &Shared) -> String {
    let mut s = card.stats.snapshot().to_string();
    for counter in bluerdma_core::regs::Counter::ALL {
        let v = card.regs.counter(counter);
        if v != 0 {
            s.push_str(&format!(" {counter:?}={v}"));
        }
    }
    if let Some(stop) = card.rtl_stop() {
        s.push_str(&format!("; RTL stop: {stop}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_address_names_the_port_and_the_remedy() {
        let ip = Ipv4Addr::new(127, 0, 3, 9);
        let opts = DeviceLinkOptions {
            port: Some(0),
            ..DeviceLinkOptions::default()
        };
        let first = device_link(ip, &opts).unwrap();
        let port = first.stats().snapshot().frames_sent; // keep `first` alive
        assert_eq!(port, 0);
        let taken = UdpLink::bind(UdpLinkConfig::new(ip).with_port(0)).unwrap();
        let taken_port = taken.local_addr().port();
        let err = device_link(
            ip,
            &DeviceLinkOptions {
                port: Some(taken_port),
                ..DeviceLinkOptions::default()
            },
        )
        .err()
        .unwrap();
        assert_eq!(err.errno(), libc::EADDRINUSE);
        let text = err.to_string();
        assert!(text.contains(&format!("127.0.3.9:{taken_port}")), "{text}");
        assert!(text.contains("another process"), "{text}");
        let err = device_link(
            ip,
            &DeviceLinkOptions {
                port: Some(0),
                capture: Some("/no/such/dir/x.pcap".into()),
                ..DeviceLinkOptions::default()
            },
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("/no/such/dir/x.pcap"), "{err}");
    }
}
