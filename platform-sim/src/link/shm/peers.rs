//! The sending side of the shared-memory link: for each destination card, whether frames
//! to it go into a ring or over UDP, and the rings themselves.
//!
//! A destination starts unknown. Its first frame looks for its bell ([`super::bell`]):
//! none means a card elsewhere (another host, namespace or mount of `/dev/shm`), or no card
//! at all, and its frames go over UDP; the bell is looked for again after
//! [`ShmConfig::retry`]. A bell means a card on this host: a ring is created and passed to
//! it, and frames keep going over UDP until the card acknowledges the ring (in its header),
//! then into the ring. A ring the card has not acknowledged after
//! [`ShmConfig::attach_timeout`], a card that no longer answers its bell or has let the
//! ring go (both checked every [`ShmConfig::probe_every`] and whenever its ring is full),
//! and a ring whose tail is impossible all send the destination back to UDP.
//!
//! A full ring is waited on for up to [`ShmConfig::full_wait`] (the receiver is woken
//! first); frames that still find no room are counted as sent and dropped at the receiver
//! (its [`LinkCounter::RxQueueDrops`]), like a UDP receive queue that overflows.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Instant;

use super::bell::{bell_path, BellMsg, PeerBell};
use super::ring::{RingId, TxRing};
use super::ShmConfig;
use crate::link::{LinkCounter, LinkStats};

/// How frames reach one destination.
enum Peer {
    /// Over UDP; the bell is looked for again at `retry_at`.
    Absent { retry_at: Instant },
    /// A ring was passed at `since` and not yet acknowledged: still over UDP.
    Pending { tx: TxPeer, since: Instant },
    /// Into the ring.
    Active(TxPeer),
}

/// A ring to one card and the way to ring that card's bell.
struct TxPeer {
    ring: TxRing,
    bell: PeerBell,
    next_probe: Instant,
    /// The ring stayed full during this send: the rest of it is dropped without waiting.
    stalled: bool,
}

/// What happened to a frame offered to a ring.
enum Pushed {
    /// Written (published with the batch).
    Written,
    /// Counted as lost to a full ring.
    Dropped,
    /// The card has gone or its ring is broken: the destination is back on UDP.
    Gone,
}

/// Every destination's state, shared by all transmit handles of a port.
pub(super) struct Outbound {
    me: Ipv4Addr,
    port: u16,
    /// Whether the card reaches addresses outside 127.0.0.0/8 (as its UDP link).
    network: bool,
    dir: PathBuf,
    cfg: ShmConfig,
    stats: LinkStats,
    peers: HashMap<Ipv4Addr, Peer>,
    /// Destinations written to during the current send.
    touched: Vec<Ipv4Addr>,
    rings_made: u64,
}

impl Outbound {
    pub(super) fn new(
        me: Ipv4Addr,
        port: u16,
        network: bool,
        dir: PathBuf,
        cfg: ShmConfig,
        stats: LinkStats,
    ) -> Self {
        Self {
            me,
            port,
            network,
            dir,
            cfg,
            stats,
            peers: HashMap::new(),
            touched: Vec::new(),
            rings_made: 0,
        }
    }

    /// The destinations whose frames go into a ring now.
    pub(super) fn active(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self
            .peers
            .iter()
            .filter(|(_, p)| matches!(p, Peer::Active(_)))
            .map(|(ip, _)| *ip)
            .collect();
        v.sort();
        v
    }

    /// Writes the frames that have a ring into it, publishing each ring once at the end and
    /// ringing the bells of receivers that sleep; the indices of the others (for UDP) are
    /// pushed to `udp`.
    ///
    /// Consecutive frames to one destination (a message's packets) are one run: its peer
    /// is looked up and checked once for the whole run, not per frame.
    pub(super) fn send(&mut self, frames: &[&[u8]], udp: &mut Vec<usize>) {
        let now = Instant::now();
        let mut written = 0u64;
        let mut i = 0;
        while i < frames.len() {
            let dst = self.ring_dst(frames[i]);
            let run_len = 1 + frames[i + 1..]
                .iter()
                .take_while(|f| self.ring_dst(f) == dst)
                .count();
            let run = i..i + run_len;
            i += run_len;
            let Some(dst) = dst else {
                // The UDP link counts what it cannot route.
                udp.extend(run);
                continue;
            };
            if !self.ready(dst, now) {
                udp.extend(run);
                continue;
            }
            let Some(Peer::Active(tx)) = self.peers.get_mut(&dst) else {
                udp.extend(run);
                continue;
            };
            let mut wrote_here = 0u64;
            let mut gone = false;
            for k in run {
                let frame = frames[k];
                if gone || frame.len() > tx.ring.max_frame() {
                    udp.push(k);
                    continue;
                }
                match push(tx, frame, &self.cfg, &self.stats) {
                    Pushed::Written => wrote_here += 1,
                    Pushed::Dropped => {}
                    Pushed::Gone => {
                        gone = true;
                        udp.push(k);
                    }
                }
            }
            written += wrote_here;
            if gone {
                self.gone(dst, now);
            } else if wrote_here > 0 && !self.touched.contains(&dst) {
                self.touched.push(dst);
            }
        }
        self.stats.add(LinkCounter::FramesSent, written);
        self.stats.add(LinkCounter::ShmFramesSent, written);
        let touched = std::mem::take(&mut self.touched);
        for dst in &touched {
            if let Some(Peer::Active(tx)) = self.peers.get_mut(dst) {
                tx.stalled = false;
                if tx.ring.publish() && tx.bell.send(BellMsg::Wake, None).is_err() {
                    // Frames already in the ring are lost with the card, as on a cable.
                    self.gone(*dst, now);
                }
            }
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// The destination of `frame` if a ring could carry it: a card address this link
    /// reaches (loopback, or any when it has a network).
    fn ring_dst(&self, frame: &[u8]) -> Option<Ipv4Addr> {
        crate::link::route::frame_dst_ipv4(frame)
            .ok()
            .filter(|ip| ip.is_loopback() || self.network)
    }

    /// Whether frames to `dst` go into a ring now (setting one up when it is due).
    fn ready(&mut self, dst: Ipv4Addr, now: Instant) -> bool {
        enum Next {
            Keep,
            Attach,
            Activate,
            Expire,
            Gone,
        }
        let next = match self.peers.get_mut(&dst) {
            None => Next::Attach,
            Some(Peer::Absent { retry_at }) if now >= *retry_at => Next::Attach,
            Some(Peer::Absent { .. }) => Next::Keep,
            Some(Peer::Pending { tx, .. }) if tx.ring.attached() => Next::Activate,
            Some(Peer::Pending { since, .. })
                if now.duration_since(*since) > self.cfg.attach_timeout =>
            {
                Next::Expire
            }
            Some(Peer::Pending { .. }) => Next::Keep,
            Some(Peer::Active(tx)) if now >= tx.next_probe => {
                tx.next_probe = now + self.cfg.probe_every;
                match tx.bell.send(BellMsg::Probe, None) {
                    Ok(()) if tx.ring.attached() => Next::Keep,
                    _ => Next::Gone,
                }
            }
            Some(Peer::Active(_)) => Next::Keep,
        };
        match next {
            Next::Keep => {}
            Next::Attach => {
                let peer = self.attach(dst, now);
                self.peers.insert(dst, peer);
            }
            Next::Activate => {
                log::debug!("link {}: frames to {dst} go through shared memory", self.me);
                if let Some(Peer::Pending { tx, .. }) = self.peers.remove(&dst) {
                    self.peers.insert(dst, Peer::Active(tx));
                }
            }
            Next::Expire => {
                log::debug!("link {}: {dst} did not take a ring; UDP", self.me);
                let retry_at = now + self.cfg.retry;
                self.peers.insert(dst, Peer::Absent { retry_at });
            }
            Next::Gone => self.gone(dst, now),
        }
        matches!(self.peers.get(&dst), Some(Peer::Active(_)))
    }

    /// Looks for `dst`'s bell and, if a card listens there, passes it a new ring.
    fn attach(&mut self, dst: Ipv4Addr, now: Instant) -> Peer {
        let absent = Peer::Absent {
            retry_at: now + self.cfg.retry,
        };
        let Ok(bell) = PeerBell::connect(&bell_path(&self.dir, dst, self.port)) else {
            return absent;
        };
        self.rings_made += 1;
        let id = RingId {
            src: self.me,
            dst,
            port: self.port,
            nonce: nonce(self.rings_made),
        };
        let ring = match TxRing::create(id, self.cfg.geometry) {
            Ok(ring) => ring,
            Err(e) => {
                log::warn!("link {}: no shared-memory ring to {dst}: {e}", self.me);
                return absent;
            }
        };
        let msg = BellMsg::Attach {
            src: self.me,
            nonce: id.nonce,
        };
        if let Err(e) = bell.send(msg, Some(ring.fd().as_fd())) {
            log::debug!("link {}: {dst}'s bell did not take a ring: {e}", self.me);
            return absent;
        }
        Peer::Pending {
            tx: TxPeer {
                ring,
                bell,
                next_probe: now + self.cfg.probe_every,
                stalled: false,
            },
            since: now,
        }
    }

    /// `dst`'s card has gone or broke its ring: UDP, and a new ring as soon as a card
    /// answers at its address again.
    fn gone(&mut self, dst: Ipv4Addr, now: Instant) {
        log::debug!("link {}: {dst} left the shared memory; UDP", self.me);
        self.peers.insert(dst, Peer::Absent { retry_at: now });
    }
}

/// Writes `frame` into `tx`'s ring, waiting for room if it is full.
fn push(tx: &mut TxPeer, frame: &[u8], cfg: &ShmConfig, stats: &LinkStats) -> Pushed {
    let drop_one = |tx: &TxPeer| {
        tx.ring.add_dropped(1);
        stats.add(LinkCounter::FramesSent, 1);
        Pushed::Dropped
    };
    match tx.ring.has_room() {
        Err(e) => {
            log::warn!("link: ring {:?} dropped: {e}", tx.ring.id());
            return Pushed::Gone;
        }
        Ok(false) if tx.stalled => return drop_one(tx),
        Ok(false) => {
            // Show the receiver what is there, wake it if it sleeps, and make sure it lives.
            if tx.ring.publish() && tx.bell.send(BellMsg::Wake, None).is_err() {
                return Pushed::Gone;
            }
            if tx.bell.send(BellMsg::Probe, None).is_err() || !tx.ring.attached() {
                return Pushed::Gone;
            }
            let deadline = Instant::now() + cfg.full_wait;
            let mut spins = 0u32;
            loop {
                match tx.ring.has_room() {
                    Ok(false) => {}
                    Ok(true) => break,
                    Err(_) => return Pushed::Gone,
                }
                if Instant::now() >= deadline {
                    tx.stalled = true;
                    return drop_one(tx);
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        Ok(true) => {}
    }
    if tx.ring.push(frame) {
        Pushed::Written
    } else {
        // The caller checked the length; an empty frame is the only other refusal.
        drop_one(tx)
    }
}

/// A nonce that differs between the rings of one process and between processes.
fn nonce(count: u64) -> u64 {
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = time ^ (u64::from(std::process::id()) << 32) ^ count.wrapping_mul(0x9E37_79B9);
    // SplitMix64's output function spreads the bits.
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}
