//! Opening a device of the list on its backend: the backend's platform
//! ([`crate::backend`]), the entry's timer options, and the out-of-band channel over TCP
//! (on every backend: SEND/RECV work on the card too).
//!
//! The channel listens on the device's IP, or on the entry's `oob=IP[:PORT]` when the
//! card's IP is not an address of this host. The engine names peers by their device (RoCE)
//! IPs; a channel on another address is reached through the map of [`MappedOob`]: every
//! entry of this host's list with an `oob=` address, and `BLUERDMA_OOB_PEERS` for remote
//! peers.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bluerdma_core::oob::{AtomicMessage, CheckMessage, RecvTooShort, RecvWr};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};

use super::{BackendSpec, DeviceEntry, DeviceList, Settings};
use crate::backend::{Backend, OpenError};
use crate::oob::{OobNotifier, TcpOob, TcpOobConfig, TcpOobError};
use crate::verbs::{Context, DeviceSpec};

/// Opens `entry` (a device of `list`) as `spec` describes it (its name, capacities and
/// PSN start; [`DeviceEntry::spec`] gives the defaults).
pub fn open(
    list: &DeviceList,
    entry: &DeviceEntry,
    spec: DeviceSpec,
    settings: &Settings,
) -> Result<Context, OpenError> {
    #[cfg(feature = "emulator")]
    if crate::shared::wanted(entry) {
        return crate::shared::open(entry, spec, settings);
    }
    let mut backend = open_backend(entry, &spec, settings)?;
    let o = &entry.options;
    let t = &mut backend.tuning;
    t.command_timeout = o.command_timeout.unwrap_or(t.command_timeout);
    t.ack_timeout_min = o.ack_timeout_min.unwrap_or(t.ack_timeout_min);
    t.send_window = o.send_window.unwrap_or(t.send_window);
    let (oob, notifier) = open_oob(list, entry, &spec, settings)?;
    log::info!(
        "{}: {} at {} ({:?})",
        spec.name,
        backend.kind,
        spec.ip,
        backend.tuning
    );
    let ctx = Context::open_backend(spec, backend, Some(oob))?;
    // Records from peers (an atomic request above all) wake the progress thread.
    notifier.set(ctx.waker());
    Ok(ctx)
}

pub(crate) fn open_backend(
    entry: &DeviceEntry,
    spec: &DeviceSpec,
    settings: &Settings,
) -> Result<Backend, OpenError> {
    match &entry.backend {
        BackendSpec::Emulated => emulated(spec, settings),
        #[cfg(feature = "rtl")]
        BackendSpec::Rtl(cfg) => crate::backend::rtl::open(&spec.name, cfg),
        #[cfg(not(feature = "rtl"))]
        BackendSpec::Rtl(_) => Err(OpenError::new(
            &spec.name,
            libc::EOPNOTSUPP,
            "+rtl devices need the `rtl` feature of bluerdma-linux, which this build lacks",
        )),
        BackendSpec::Pci(cfg) => crate::backend::pci::open(&spec.name, cfg),
    }
}

#[cfg(feature = "emulator")]
fn emulated(spec: &DeviceSpec, settings: &Settings) -> Result<Backend, OpenError> {
    let faults = settings
        .link_faults
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| {
            OpenError::new(
                &spec.name,
                libc::EINVAL,
                format!("{}: {e}", super::discover::FAULTS_ENV),
            )
        })?;
    let opts = bluerdma_sim::inproc::DeviceLinkOptions {
        port: None,
        faults,
        capture: settings
            .pcap_dir
            .as_ref()
            .map(|d| d.join(format!("{}.pcap", spec.name))),
        shm: bluerdma_sim::link::ShmConfig::from_env(),
    };
    crate::backend::emulated::open_on_udp(spec, &opts)
}

#[cfg(not(feature = "emulator"))]
fn emulated(spec: &DeviceSpec, _: &Settings) -> Result<Backend, OpenError> {
    Err(OpenError::new(
        &spec.name,
        libc::EOPNOTSUPP,
        "a device without a backend is the emulated card, and this build of bluerdma-linux \
         has no emulator (feature `emulator`): give the device `+pci` or `+rtl`",
    ))
}

/// The device's out-of-band channel, and the handle that tells it whom to wake when
/// records arrive.
pub(crate) fn open_oob(
    list: &DeviceList,
    entry: &DeviceEntry,
    spec: &DeviceSpec,
    settings: &Settings,
) -> Result<(Box<dyn OobTransport + Send>, OobNotifier), OpenError> {
    let bind = entry.options.oob;
    let mut cfg = TcpOobConfig::new(bind.map_or(spec.ip, |b| b.ip));
    cfg.port = bind.and_then(|b| b.port).unwrap_or(settings.oob_port);
    if let Some(path) = &spec.oob_key {
        cfg.key = crate::oob::OobKey::File(path.clone());
    }
    let tcp = TcpOob::bind(cfg).map_err(|e| {
        let errno = match &e {
            TcpOobError::Key(_) => libc::EACCES,
            TcpOobError::Listen { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            TcpOobError::Setup(source) => source.raw_os_error().unwrap_or(libc::EIO),
        };
        let hint = if errno == libc::EADDRNOTAVAIL && bind.is_none() {
            "; if the card's IP is not an address of this host, give the device a host \
             address for the channel: `;oob=HOST_IP`"
        } else {
            ""
        };
        OpenError::new(&spec.name, errno, format!("{e}{hint}"))
    })?;
    let mut map: Vec<(Ipv4Addr, Ipv4Addr)> = list
        .entries()
        .iter()
        .filter_map(|e| Some((e.ip, e.options.oob?.ip)))
        .collect();
    map.extend(settings.oob_peers.iter().copied());
    let notifier = tcp.notifier();
    if map.iter().all(|(dev, oob)| dev == oob) {
        return Ok((Box::new(tcp), notifier));
    }
    Ok((Box::new(MappedOob::new(tcp, &map)), notifier))
}

/// An out-of-band channel whose peers' channels listen on other addresses than their
/// device IPs: the engine's device IPs are mapped to channel addresses on the way out and
/// back on the way in.
pub struct MappedOob<T> {
    inner: T,
    to_oob: HashMap<Ipv4Addr, Ipv4Addr>,
    to_device: HashMap<Ipv4Addr, Ipv4Addr>,
}

impl<T: OobTransport> MappedOob<T> {
    /// `inner` with `map` of (device IP, channel address) pairs.
    pub fn new(inner: T, map: &[(Ipv4Addr, Ipv4Addr)]) -> Self {
        MappedOob {
            inner,
            to_oob: map.iter().copied().collect(),
            to_device: map.iter().map(|&(d, o)| (o, d)).collect(),
        }
    }

    fn out(&self, device: Ipv4Addr) -> Ipv4Addr {
        self.to_oob.get(&device).copied().unwrap_or(device)
    }

    fn back(&self, oob: Ipv4Addr) -> Ipv4Addr {
        self.to_device.get(&oob).copied().unwrap_or(oob)
    }

    fn error(&self, e: PlatformError) -> PlatformError {
        match e {
            PlatformError::Disconnected { peer } => PlatformError::Disconnected {
                peer: self.back(peer),
            },
            other => other,
        }
    }
}

impl<T: OobTransport> OobTransport for MappedOob<T> {
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        let to = self.out(peer);
        self.inner.send(to, wr).map_err(|e| self.error(e))
    }

    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        let to = self.out(peer);
        self.inner
            .send_too_short(to, rec)
            .map_err(|e| self.error(e))
    }

    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        let to = self.out(peer);
        self.inner.send_atomic(to, msg).map_err(|e| self.error(e))
    }

    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        let to = self.out(peer);
        self.inner.send_check(to, msg).map_err(|e| self.error(e))
    }

    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<bluerdma_core::oob::Capabilities> {
        self.inner.peer_capabilities(self.out(peer))
    }

    fn poll(&mut self) -> Option<OobEvent> {
        Some(match self.inner.poll()? {
            OobEvent::RecvWr { from, wr } => OobEvent::RecvWr {
                from: self.back(from),
                wr,
            },
            OobEvent::RecvTooShort { from, rec } => OobEvent::RecvTooShort {
                from: self.back(from),
                rec,
            },
            OobEvent::Atomic { from, msg } => OobEvent::Atomic {
                from: self.back(from),
                msg,
            },
            OobEvent::Check { from, msg } => OobEvent::Check {
                from: self.back(from),
                msg,
            },
            OobEvent::PeerLost { peer } => OobEvent::PeerLost {
                peer: self.back(peer),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob_hub::OobHub;

    #[test]
    fn peers_are_named_by_device_ip_on_both_sides_of_the_map() {
        // Two cards at 17.34.51.10/11 whose channels run on 127.0.6.1/2.
        let (card_a, card_b) = (Ipv4Addr::new(17, 34, 51, 10), Ipv4Addr::new(17, 34, 51, 11));
        let (oob_a, oob_b) = (Ipv4Addr::new(127, 0, 6, 1), Ipv4Addr::new(127, 0, 6, 2));
        let map = [(card_a, oob_a), (card_b, oob_b)];
        let hub = OobHub::new();
        let mut a = MappedOob::new(hub.attach(oob_a), &map);
        let mut b = MappedOob::new(hub.attach(oob_b), &map);
        let wr = RecvWr {
            qpn: 0x105,
            ..RecvWr::default()
        };
        a.send(card_b, &wr).unwrap();
        assert_eq!(b.poll(), Some(OobEvent::RecvWr { from: card_a, wr }));
        hub.disconnect(oob_a, oob_b);
        assert_eq!(b.poll(), Some(OobEvent::PeerLost { peer: card_a }));
        // A peer outside the map keeps its address.
        let other = Ipv4Addr::new(127, 0, 6, 3);
        assert_eq!(
            a.send(other, &wr),
            Err(PlatformError::Disconnected { peer: other })
        );
    }
}
