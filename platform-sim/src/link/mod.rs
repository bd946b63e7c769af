//! The link between emulated NICs: Ethernet frames (destination MAC first, no FCS; layout
//! in `shared/spec/nic-behaviour.md` section 1.4) between cards addressed by IPv4.
//!
//! - [`UdpLink`] (the default): one UDP socket per card at 127.0.0.x, frames routed by their
//!   IPv4 destination and packed several to a datagram ([`udp`], [`datagram`]).
//! - [`ShmLink`]: the UDP link plus rings in shared memory to the cards of the same host,
//!   chosen by itself per destination ([`shm`]).
//! - [`MemHub`]: the same routing inside one process, for deterministic tests ([`mem`]).
//! - [`FaultyLink`]: seeded drop, duplicate, reorder and corrupt on transmit ([`fault`]).
//! - [`CapturingLink`]: a pcap record of the frames ([`pcap`]).
//!
//! The wrappers stack on any port, e.g.
//! `CapturingLink::new(FaultyLink::new(UdpLink::bind(config)?, faults)?, sink, dir)`, and all
//! layers count into the bottom port's [`LinkStats`].
//!
//! The link carries frames; it does not filter them. The receiving card applies its own
//! address filter (section 2.1).

pub mod datagram;
pub mod fault;
pub mod mem;
mod mmsg;
pub mod pcap;
pub mod route;
pub mod shm;
mod stats;
pub mod udp;

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

pub use fault::{FaultConfig, FaultConfigError, FaultDecision, FaultyLink, FAULTS_ENV};
pub use mem::{MemHub, MemPort};
pub use pcap::{CaptureDirection, CapturingLink, PcapSink, PcapWriter};
pub use shm::{ShmConfig, ShmLink, ShmPeers};
pub use stats::{LinkCounter, LinkStats, LinkStatsSnapshot};
pub use udp::{UdpLink, UdpLinkConfig};

/// A second transmit handle on a port, for a thread other than the one that receives: the
/// emulated card transmits data packets from its send-ring thread while its receive thread
/// blocks in [`LinkPort::recv_frames`] (and sends its own NAKs through the port itself).
///
/// Frames sent through one handle leave in the order of that handle's calls. Frames sent
/// at the same time through two handles interleave in whatever order the transport takes
/// them, as the frames of two queues of one NIC do on the wire. A sender may outlive its
/// port; what it does then is up to the transport (see each one).
pub trait FrameSender: Send {
    /// As [`LinkPort::send_frames`]: in order, counted in the port's [`LinkStats`], and
    /// through the same wrappers (faults, capture) as the port.
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()>;
}

impl<S: FrameSender + ?Sized> FrameSender for Box<S> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        (**self).send_frames(frames)
    }
}

/// Ends a [`LinkPort::recv_frames`] wait on its port from another thread: the inline
/// card's progress thread waits in the link, and a driver that has work for it rings this.
pub type LinkWaker = std::sync::Arc<dyn Fn() + Send + Sync>;

/// One card's port on the link.
pub trait LinkPort: Send {
    /// Transmits Ethernet frames (destination MAC first, no FCS), in order. A frame the
    /// link cannot carry (see the transport) is counted in [`LinkPort::stats`] and skipped;
    /// an error means the port itself failed. Pass every frame that is ready in one call:
    /// the UDP link packs the frames of one call into as few datagrams as it can.
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()>;
    /// Receives frames for this card, calling `on_frame` for each, waiting at most `timeout`
    /// for the first one (not at all if it is zero) and then taking only frames that have
    /// already arrived. Returns how many frames were delivered; 0 is not an error.
    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize>;
    /// The port's counters. Wrappers return their inner port's, so that one set of counters
    /// describes the whole stack.
    fn stats(&self) -> &LinkStats;
    /// Another transmit handle on this port (see [`FrameSender`]), usable from another
    /// thread while this one blocks in [`LinkPort::recv_frames`]. Fails only if the
    /// transport cannot give one (e.g. the socket cannot be duplicated).
    fn sender(&self) -> io::Result<Box<dyn FrameSender>>;
    /// A way to end this port's [`LinkPort::recv_frames`] wait early (the call returns,
    /// perhaps with no frame), if the transport has one. Wrappers return their inner
    /// port's.
    fn waker(&self) -> Option<LinkWaker> {
        None
    }
    /// For a receiver that waits outside [`LinkPort::recv_frames`] (in `ppoll` on
    /// [`LinkPort::wait_fds`], so that another thread may receive meanwhile): raises or
    /// lowers the port's sign that its receiver sleeps. While it is up, senders that can
    /// see it (the shared-memory rings) make `wait_fds` readable for each frame; while it
    /// is down they do not, and a receiver must poll. Returns, when raising, whether frames
    /// already wait (nobody will announce those). Lowering it also makes the next
    /// `recv_frames` look at every socket. Ports without such a sign return false.
    fn set_sleeping(&mut self, _sleeping: bool) -> bool {
        false
    }
    /// The descriptors that become readable when a frame (or a [`LinkPort::waker`]'s
    /// message) arrives, for a receiver that waits outside [`LinkPort::recv_frames`]; empty
    /// when the port can be waited on only there (a port that must release held frames on
    /// time, say). They live as long as the port.
    fn wait_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }
}

impl<L: LinkPort + ?Sized> LinkPort for Box<L> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        (**self).send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        (**self).recv_frames(timeout, on_frame)
    }

    fn stats(&self) -> &LinkStats {
        (**self).stats()
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        (**self).sender()
    }

    fn waker(&self) -> Option<LinkWaker> {
        (**self).waker()
    }

    fn set_sleeping(&mut self, sleeping: bool) -> bool {
        (**self).set_sleeping(sleeping)
    }

    fn wait_fds(&self) -> Vec<RawFd> {
        (**self).wait_fds()
    }
}
