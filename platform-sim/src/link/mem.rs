//! An in-memory link: a hub that carries frames between ports of one process, routed by
//! their IPv4 destination like the UDP link ([`super::route`]), with no sockets and no
//! loss except a full receive queue. Frames between two ports arrive in the order they
//! were sent, so tests of the card model are deterministic.
//!
//! A port's [`LinkPort::sender`] is another handle on the hub that counts into the port's
//! [`LinkStats`]. The hub delivers each call's frames under one lock, so the frames of
//! concurrent calls never interleave within a call. A sender that outlives its port still
//! sends; its port's address is free again once the port is dropped.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::route::frame_dst_ipv4;
use super::{FrameSender, LinkCounter, LinkPort, LinkStats};

/// Frames a port's receive queue holds by default before the hub drops further ones.
pub const DEFAULT_QUEUE_FRAMES: usize = 4096;

/// Where the hub delivers frames for one address.
struct Attached {
    queue: SyncSender<Vec<u8>>,
    /// The receiving port's counters, for the frames its full queue refuses.
    stats: LinkStats,
}

/// The hub: cloning shares it. Attach one [`MemPort`] per card address.
#[derive(Clone, Default)]
pub struct MemHub {
    ports: Arc<Mutex<HashMap<Ipv4Addr, Attached>>>,
}

impl fmt::Debug for MemHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addrs: Vec<Ipv4Addr> = self
            .lock()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default();
        f.debug_struct("MemHub").field("ports", &addrs).finish()
    }
}

impl MemHub {
    /// A hub with no ports.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches a port for the card at `ip` with the default queue size.
    pub fn attach(&self, ip: Ipv4Addr) -> io::Result<MemPort> {
        self.attach_with_queue(ip, DEFAULT_QUEUE_FRAMES)
    }

    /// Attaches a port for the card at `ip` whose receive queue holds `queue_frames` frames.
    /// Fails with `AddrInUse` if a port is already attached at `ip`.
    pub fn attach_with_queue(&self, ip: Ipv4Addr, queue_frames: usize) -> io::Result<MemPort> {
        let mut ports = self.lock()?;
        if ports.contains_key(&ip) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a port is already attached to the memory hub at {ip}"),
            ));
        }
        let (queue, incoming) = mpsc::sync_channel(queue_frames.max(1));
        let stats = LinkStats::new();
        ports.insert(
            ip,
            Attached {
                queue,
                stats: stats.clone(),
            },
        );
        Ok(MemPort {
            hub: self.clone(),
            ip,
            incoming,
            stats,
        })
    }

    /// Delivers `frames` to the queues of their destinations, counting into `stats` (the
    /// sending port's) and into a receiver's counters the frames its full queue refuses.
    fn deliver(&self, frames: &[&[u8]], stats: &LinkStats) -> io::Result<()> {
        let ports = self.lock()?;
        for frame in frames {
            let Some(port) = frame_dst_ipv4(frame).ok().and_then(|ip| ports.get(&ip)) else {
                stats.add(LinkCounter::FramesUnroutable, 1);
                continue;
            };
            match port.queue.try_send(frame.to_vec()) {
                Ok(()) => stats.add(LinkCounter::FramesSent, 1),
                Err(TrySendError::Full(_)) => {
                    // Sent, then lost at the receiver, like a UDP receive-queue overflow.
                    stats.add(LinkCounter::FramesSent, 1);
                    port.stats.add(LinkCounter::RxQueueDrops, 1);
                }
                // The receiving port is being dropped: nobody is there any more.
                Err(TrySendError::Disconnected(_)) => stats.add(LinkCounter::FramesUnroutable, 1),
            }
        }
        Ok(())
    }

    fn lock(&self) -> io::Result<MutexGuard<'_, HashMap<Ipv4Addr, Attached>>> {
        self.ports
            .lock()
            .map_err(|_| io::Error::other("memory hub poisoned by a panic"))
    }
}

/// One card's port on a [`MemHub`]; dropping it detaches its address.
pub struct MemPort {
    hub: MemHub,
    ip: Ipv4Addr,
    incoming: Receiver<Vec<u8>>,
    stats: LinkStats,
}

impl fmt::Debug for MemPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPort")
            .field("ip", &self.ip)
            .finish_non_exhaustive()
    }
}

impl MemPort {
    /// The address this port receives for.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
}

/// A second transmit handle on a [`MemPort`].
struct MemSender {
    hub: MemHub,
    /// The port's counters.
    stats: LinkStats,
}

impl FrameSender for MemSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.hub.deliver(frames, &self.stats)
    }
}

/// Waits up to `timeout` for the first frame of `incoming`, then takes the ones already
/// queued (Empty and Disconnected both end the batch; a queue whose sender is held by the
/// port itself never disconnects, and a disconnect is treated like a timeout); counts them
/// in `stats` and returns how many `on_frame` saw.
pub(crate) fn recv_queued(
    incoming: &Receiver<Vec<u8>>,
    timeout: Duration,
    on_frame: &mut dyn FnMut(&[u8]),
    stats: &LinkStats,
) -> usize {
    let first = match incoming.recv_timeout(timeout) {
        Ok(frame) => frame,
        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return 0,
    };
    on_frame(&first);
    let mut delivered = 1;
    while let Ok(frame) = incoming.try_recv() {
        on_frame(&frame);
        delivered += 1;
    }
    stats.add(LinkCounter::FramesReceived, delivered as u64);
    delivered
}

impl LinkPort for MemPort {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.hub.deliver(frames, &self.stats)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // The hub holds a sender for this port until the port is dropped.
        Ok(recv_queued(&self.incoming, timeout, on_frame, &self.stats))
    }

    fn stats(&self) -> &LinkStats {
        &self.stats
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(MemSender {
            hub: self.hub.clone(),
            stats: self.stats.clone(),
        }))
    }
}

impl Drop for MemPort {
    fn drop(&mut self) {
        if let Ok(mut ports) = self.hub.lock() {
            ports.remove(&self.ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_to(dst: [u8; 4], tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 96];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[30..34].copy_from_slice(&dst);
        f[95] = tag;
        f
    }

    fn recv_all(port: &mut MemPort) -> Vec<u8> {
        let mut tags = Vec::new();
        port.recv_frames(Duration::ZERO, &mut |f| tags.push(f[95]))
            .unwrap();
        tags
    }

    #[test]
    fn routes_by_destination_ip_in_order() {
        let hub = MemHub::new();
        let mut a = hub.attach(Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        let mut b = hub.attach(Ipv4Addr::new(10, 0, 0, 2)).unwrap();
        let frames = [
            frame_to([10, 0, 0, 2], 1),
            frame_to([10, 0, 0, 1], 2),
            frame_to([10, 0, 0, 2], 3),
            frame_to([10, 0, 0, 9], 4),
        ];
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        a.send_frames(&refs).unwrap();
        assert_eq!(recv_all(&mut b), [1, 3]);
        assert_eq!(recv_all(&mut a), [2]);
        let s = a.stats().snapshot();
        assert_eq!(
            (s.frames_sent, s.frames_unroutable, s.frames_received),
            (3, 1, 1)
        );
        assert_eq!(b.stats().snapshot().frames_received, 2);
    }

    #[test]
    fn full_queue_drops_are_counted_at_the_receiver_and_detach_frees_the_address() {
        let hub = MemHub::new();
        let ip_b = Ipv4Addr::new(10, 0, 0, 2);
        let mut a = hub.attach(Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        let mut b = hub.attach_with_queue(ip_b, 2).unwrap();
        assert_eq!(
            hub.attach(ip_b).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let frames: Vec<Vec<u8>> = (0..5).map(|t| frame_to([10, 0, 0, 2], t)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        a.send_frames(&refs).unwrap();
        assert_eq!(recv_all(&mut b), [0, 1]);
        assert_eq!(b.stats().snapshot().rx_queue_drops, 3);
        drop(b);
        a.send_frames(&refs[..1]).unwrap();
        assert_eq!(a.stats().snapshot().frames_unroutable, 1);
        assert!(hub.attach(ip_b).is_ok());
    }
}
