//! An in-process out-of-band channel: devices in one process exchange receive WRs (and
//! receive-WR-too-short records and atomics) through a shared hub, with the same semantics as the TCP
//! channel (records in order per pair of devices, `from` = the sending device's IP; every
//! endpoint has all of this driver's capabilities). For tests and single-process setups.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use bluerdma_core::oob::{AtomicMessage, CheckMessage, RecvTooShort, RecvWr};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};

/// The shared hub.
#[derive(Clone, Default)]
pub struct OobHub {
    inboxes: Arc<Mutex<HashMap<Ipv4Addr, VecDeque<OobEvent>>>>,
}

impl OobHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// The channel endpoint of the device at `ip`.
    pub fn attach(&self, ip: Ipv4Addr) -> HubOob {
        if let Ok(mut m) = self.inboxes.lock() {
            m.entry(ip).or_default();
        }
        HubOob {
            hub: self.clone(),
            ip,
        }
    }

    /// Tells `to` that the device at `lost` is gone (as a broken TCP connection would).
    pub fn disconnect(&self, lost: Ipv4Addr, to: Ipv4Addr) {
        if let Ok(mut m) = self.inboxes.lock() {
            m.entry(to)
                .or_default()
                .push_back(OobEvent::PeerLost { peer: lost });
        }
    }
}

/// One device's endpoint on an [`OobHub`].
pub struct HubOob {
    hub: OobHub,
    ip: Ipv4Addr,
}

impl HubOob {
    /// Appends `event` to `peer`'s inbox.
    fn deliver(&self, peer: Ipv4Addr, event: OobEvent) -> Result<(), PlatformError> {
        let mut m = self
            .hub
            .inboxes
            .lock()
            .map_err(|_| PlatformError::Disconnected { peer })?;
        let inbox = m
            .get_mut(&peer)
            .ok_or(PlatformError::Disconnected { peer })?;
        inbox.push_back(event);
        Ok(())
    }
}

impl OobTransport for HubOob {
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        let from = self.ip;
        self.deliver(peer, OobEvent::RecvWr { from, wr: *wr })
    }

    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        let from = self.ip;
        self.deliver(peer, OobEvent::RecvTooShort { from, rec: *rec })
    }

    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        let from = self.ip;
        self.deliver(peer, OobEvent::Atomic { from, msg: *msg })
    }

    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        let from = self.ip;
        self.deliver(peer, OobEvent::Check { from, msg: *msg })
    }

    /// Every endpoint of the hub has all of this driver's capabilities.
    fn peer_capabilities(&self, _peer: Ipv4Addr) -> Option<bluerdma_core::oob::Capabilities> {
        Some(bluerdma_core::oob::Capabilities::OURS)
    }

    fn poll(&mut self) -> Option<OobEvent> {
        self.hub.inboxes.lock().ok()?.get_mut(&self.ip)?.pop_front()
    }
}

/// Any out-of-band transport, boxed, so a device can be opened with the TCP channel, the
/// in-process hub or none.
pub struct DynOob(pub Box<dyn OobTransport + Send>);

impl OobTransport for DynOob {
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        self.0.send(peer, wr)
    }
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        self.0.send_too_short(peer, rec)
    }
    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        self.0.send_atomic(peer, msg)
    }
    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        self.0.send_check(peer, msg)
    }
    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<bluerdma_core::oob::Capabilities> {
        self.0.peer_capabilities(peer)
    }
    fn poll(&mut self) -> Option<OobEvent> {
        self.0.poll()
    }
    fn bind(
        &mut self,
        local: bluerdma_core::keys::Qpn,
        peer: Ipv4Addr,
        peer_qpn: bluerdma_core::keys::Qpn,
    ) {
        self.0.bind(local, peer, peer_qpn)
    }
    fn unbind(&mut self, local: bluerdma_core::keys::Qpn) {
        self.0.unbind(local)
    }
}
