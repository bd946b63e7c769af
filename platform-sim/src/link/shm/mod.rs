//! The shared-memory link: frames between cards of one host through rings in shared
//! memory, and over UDP to every other card.
//!
//! A [`ShmLink`] is a [`UdpLink`] that also announces its card on the host ([`bell`]): a
//! Unix datagram socket at `/dev/shm/bluerdma-link/net-<netns>-<uid>/<ip>:<port>.bell`.
//! When a card sends to an address whose bell answers, it creates a ring of frame slots ([`ring`],
//! one per direction, in a sealed memfd), passes it over the bell, and once the receiver
//! has acknowledged it in the ring's header, writes frames for that address straight into
//! the ring's slots: one copy in, one copy out, no system call while both cards are busy.
//! Frames to anyone else, frames larger than a slot, and frames sent before the
//! acknowledgement go over UDP as on a plain [`UdpLink`] ([`peers`] has the rules).
//!
//! A receiver that finds nothing to do raises a flag in each of its rings and waits in
//! `ppoll` on its UDP socket and its bell together; a sender that publishes frames into a
//! ring whose flag is up clears it and sends one wake message to the bell. So the wake-up
//! costs a system call only when the receiver sleeps, and one wait covers both transports
//! (a futex in the mapping would be cheaper to ring but cannot be waited on together with
//! the UDP socket).
//!
//! A card that goes away is noticed by the other side: its bell stops answering (senders
//! and receivers probe the peer's bell every [`ShmConfig::probe_every`], senders also when
//! a ring is full) or it closed its ring on the way out. Its rings are dropped and its
//! address goes back to UDP; a new card at the address gets a new ring.
//!
//! Everything read from a ring or a bell is checked: header, geometry, identity and seals
//! when a ring is taken, indices and lengths on every read. A ring that breaks the rules is
//! dropped and counted in [`LinkCounter::BadDatagrams`], as is each bad slot or message.
//! Frames through shared memory are also counted in [`LinkCounter::ShmFramesSent`] and
//! [`LinkCounter::ShmFramesReceived`].
//!
//! The wrappers ([`super::FaultyLink`], [`super::CapturingLink`]) stack on a `ShmLink`
//! like on any port: faults and capture see the frames before the transport is chosen.
//! Switching a destination from UDP to its ring (or back) may reorder the frames in flight
//! at that moment, as a path change does on a network.

pub mod bell;
mod peers;
pub mod ring;

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::bell::{bell_path, namespace_dir, Bell, BellMsg, PeerBell};
use self::peers::Outbound;
use self::ring::{Geometry, RingId, RxRing};
use super::{FrameSender, LinkCounter, LinkPort, LinkStats, UdpLink, UdpLinkConfig};

/// Where the bells live unless configured otherwise.
pub const DEFAULT_DIR: &str = "/dev/shm/bluerdma-link";
/// The environment variable that turns the shared-memory link of emulated devices off
/// (`0`, `off`, `no`, `false`) or moves its directory (an absolute path); unset or `1`
/// means on, in [`DEFAULT_DIR`].
pub const SHM_ENV: &str = "BLUERDMA_LINK_SHM";
/// Rings a receiver takes at most (one per sending card).
pub const MAX_RX_RINGS: usize = 64;
/// A busy receiver looks at its UDP socket and bell once every this many calls.
const SOCKET_CHECK_EVERY: u32 = 8;
/// A receiver called with nothing to take and no time to wait looks at its UDP socket and
/// bell if it has not for this long.
const SOCKET_CHECK_IDLE: Duration = Duration::from_micros(50);
/// Bell messages handled per call.
const BELL_BATCH: usize = 64;

/// How a [`ShmLink`] sets up and watches its rings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// The directory whose `net-<netns>-<uid>` subdirectory holds the bells.
    pub dir: PathBuf,
    /// The slots of each ring this card sends into.
    pub geometry: Geometry,
    /// How long a sender waits for room in a full ring before it drops the frame.
    pub full_wait: Duration,
    /// How long a passed ring may wait for its acknowledgement.
    pub attach_timeout: Duration,
    /// How soon an address without a bell is looked at again.
    pub retry: Duration,
    /// How often each side checks that the other still answers its bell.
    pub probe_every: Duration,
}

impl Default for ShmConfig {
    /// 512 slots of 4352 bytes (a 4096-byte payload and every header, about 2.2 MiB per
    /// direction) in [`DEFAULT_DIR`].
    fn default() -> Self {
        Self::in_dir(DEFAULT_DIR)
    }
}

impl ShmConfig {
    /// The defaults with the bells under `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            geometry: Geometry {
                slots: 512,
                slot_len: 4352,
            },
            full_wait: Duration::from_millis(2),
            attach_timeout: Duration::from_secs(1),
            retry: Duration::from_secs(1),
            probe_every: Duration::from_secs(1),
        }
    }

    /// What [`SHM_ENV`] asks for: `None` if it turns the link off, else the defaults in the
    /// directory it names (or [`DEFAULT_DIR`]). An unreadable value is ignored with a
    /// warning.
    pub fn from_env() -> Option<Self> {
        let value = std::env::var(SHM_ENV).unwrap_or_default();
        match value.trim() {
            "" | "1" | "on" | "yes" | "true" => Some(Self::default()),
            "0" | "off" | "no" | "false" => None,
            dir if dir.starts_with('/') => Some(Self::in_dir(dir)),
            other => {
                log::warn!("{SHM_ENV}={other}: not 0, 1 or a directory; shared memory stays on");
                Some(Self::default())
            }
        }
    }
}

/// The cards a [`ShmLink`] exchanges frames with through shared memory now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmPeers {
    /// Cards whose rings this card writes into.
    pub sending: Vec<Ipv4Addr>,
    /// Cards whose rings this card reads.
    pub receiving: Vec<Ipv4Addr>,
}

/// One card's port: UDP, with rings to the cards of this host (see the module docs).
pub struct ShmLink {
    udp: UdpLink,
    tx: ShmSender,
    rx: Receiver,
}

impl fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmLink")
            .field("udp", &self.udp)
            .field("bell", &self.rx.bell)
            .finish_non_exhaustive()
    }
}

impl ShmLink {
    /// Binds the UDP port, then the bell.
    pub fn bind(udp: UdpLinkConfig, cfg: ShmConfig) -> io::Result<Self> {
        Self::over(UdpLink::bind(udp)?, cfg).map_err(|(_, e)| e)
    }

    /// Adds the bell to a bound UDP port; on failure the port comes back with the error,
    /// to be used as it is.
    pub fn over(udp: UdpLink, cfg: ShmConfig) -> Result<Self, (Box<UdpLink>, io::Error)> {
        match Self::setup(&udp, &cfg) {
            Ok((bell, dir)) => {
                let addr = udp.local_addr();
                let stats = udp.stats().clone();
                let out = Outbound::new(
                    *addr.ip(),
                    addr.port(),
                    udp.config().network,
                    dir.clone(),
                    cfg.clone(),
                    stats.clone(),
                );
                let tx = match udp.sender() {
                    Ok(sender) => ShmSender::new(Arc::new(Mutex::new(out)), sender, stats),
                    Err(e) => return Err((Box::new(udp), e)),
                };
                let rx = Receiver::new(bell, *addr.ip(), addr.port(), dir, &cfg);
                Ok(Self { udp, tx, rx })
            }
            Err(e) => Err((Box::new(udp), e)),
        }
    }

    fn setup(udp: &UdpLink, cfg: &ShmConfig) -> io::Result<(Bell, PathBuf)> {
        cfg.geometry.check()?;
        let dir = namespace_dir(&cfg.dir)?;
        let addr = udp.local_addr();
        let bell = Bell::bind(&bell_path(&dir, *addr.ip(), addr.port()))?;
        Ok((bell, dir))
    }

    /// The UDP port underneath.
    pub fn udp(&self) -> &UdpLink {
        &self.udp
    }

    /// The socket file that announces this card.
    pub fn bell_path(&self) -> &Path {
        self.rx.bell.path()
    }

    /// The cards reached through shared memory now.
    pub fn peers(&self) -> ShmPeers {
        ShmPeers {
            sending: self.tx.out.lock().map(|o| o.active()).unwrap_or_default(),
            receiving: self.rx.rings.iter().map(|r| r.ring.id().src).collect(),
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        log::info!(
            "link {}: closed: {:?}",
            self.udp.local_addr(),
            self.udp.stats().snapshot()
        );
    }
}

/// A transmit handle: rings for the cards that have one, UDP for the rest.
struct ShmSender {
    out: Arc<Mutex<Outbound>>,
    udp: Box<dyn FrameSender>,
    /// Indices of the frames of the current send that go over UDP.
    udp_frames: Vec<usize>,
    stats: LinkStats,
}

impl ShmSender {
    fn new(out: Arc<Mutex<Outbound>>, udp: Box<dyn FrameSender>, stats: LinkStats) -> Self {
        Self {
            out,
            udp,
            udp_frames: Vec::new(),
            stats,
        }
    }
}

impl FrameSender for ShmSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.udp_frames.clear();
        self.out
            .lock()
            .map_err(|_| io::Error::other("shared-memory link poisoned by a panic"))?
            .send(frames, &mut self.udp_frames);
        match self.udp_frames.len() {
            0 => Ok(()),
            n if n == frames.len() => self.udp.send_frames(frames),
            _ => {
                let rest: Vec<&[u8]> = self.udp_frames.iter().map(|&i| frames[i]).collect();
                self.udp.send_frames(&rest)
            }
        }
    }
}

/// A ring this card reads, and the bell of the card that writes it.
struct RxPeer {
    ring: RxRing,
    bell: PeerBell,
    /// The sender's drop count when last read.
    dropped_seen: u64,
}

/// The receiving side: the bell and the rings passed to it.
struct Receiver {
    bell: Bell,
    me: Ipv4Addr,
    port: u16,
    dir: PathBuf,
    probe_every: Duration,
    rings: Vec<RxPeer>,
    /// Where each frame is copied out of its slot (as long as the longest frame of any
    /// ring taken; grown when a ring is taken, never per frame).
    scratch: Vec<u8>,
    msg: [u8; 64],
    fds: Vec<OwnedFd>,
    calls_since_sockets: u32,
    /// When the sockets were last looked at.
    sockets_checked: Instant,
    next_probe: Instant,
}

impl Receiver {
    fn new(bell: Bell, me: Ipv4Addr, port: u16, dir: PathBuf, cfg: &ShmConfig) -> Self {
        Self {
            bell,
            me,
            port,
            dir,
            probe_every: cfg.probe_every,
            rings: Vec::new(),
            scratch: Vec::new(),
            msg: [0; 64],
            fds: Vec::new(),
            calls_since_sockets: 0,
            sockets_checked: Instant::now(),
            next_probe: Instant::now() + cfg.probe_every,
        }
    }

    fn recv(
        &mut self,
        udp: &mut UdpLink,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let stats = udp.stats().clone();
        let mut n = self.poll_rings(&stats, on_frame);
        self.calls_since_sockets += 1;
        if n > 0 || timeout.is_zero() {
            // A caller that spins (a driver polling its CQ) looks at the sockets now and
            // then, not at every call: a system call each time would be most of its cost.
            let idle_check = n == 0 && self.sockets_checked.elapsed() >= SOCKET_CHECK_IDLE;
            if idle_check || self.calls_since_sockets >= SOCKET_CHECK_EVERY {
                n += self.poll_sockets(udp, Duration::ZERO, &stats, on_frame)?;
            }
        } else {
            // Raise the flags, then look once more: a frame published before a flag went
            // up is seen here, one published after it rings the bell.
            let waiting = self
                .rings
                .iter()
                .fold(false, |w, r| r.ring.set_sleeping(true) | w);
            if !waiting {
                n += self.poll_sockets(udp, timeout, &stats, on_frame)?;
            }
            for r in &self.rings {
                r.ring.set_sleeping(false);
            }
            n += self.poll_rings(&stats, on_frame);
        }
        self.probe_writers();
        Ok(n)
    }

    /// Everything the rings hold now.
    fn poll_rings(&mut self, stats: &LinkStats, on_frame: &mut dyn FnMut(&[u8])) -> usize {
        let mut delivered = 0;
        let mut i = 0;
        while i < self.rings.len() {
            let r = &mut self.rings[i];
            // Read before the frames: a ring closed after this read is drained next time.
            let closed = r.ring.closed();
            match r.ring.pop(u64::MAX, &mut self.scratch, on_frame) {
                Ok((n, bad)) => {
                    delivered += n;
                    stats.add(LinkCounter::BadDatagrams, bad);
                    let dropped = r.ring.dropped();
                    if dropped > r.dropped_seen {
                        stats.add(LinkCounter::RxQueueDrops, dropped - r.dropped_seen);
                        r.dropped_seen = dropped;
                    }
                    if closed && r.ring.pending().is_ok_and(|p| p == 0) {
                        log::debug!("link {}: {} closed its ring", self.me, r.ring.id().src);
                        self.rings.swap_remove(i);
                        continue;
                    }
                }
                Err(e) => {
                    log::warn!(
                        "link {}: ring from {} dropped: {e}",
                        self.me,
                        r.ring.id().src
                    );
                    stats.add(LinkCounter::BadDatagrams, 1);
                    self.rings.swap_remove(i);
                    continue;
                }
            }
            i += 1;
        }
        if delivered > 0 {
            stats.add(LinkCounter::FramesReceived, delivered as u64);
            stats.add(LinkCounter::ShmFramesReceived, delivered as u64);
        }
        delivered
    }

    /// Waits up to `timeout` for the UDP socket or the bell, then takes what they hold.
    fn poll_sockets(
        &mut self,
        udp: &mut UdpLink,
        timeout: Duration,
        stats: &LinkStats,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        self.calls_since_sockets = 0;
        self.sockets_checked = Instant::now();
        let (udp_ready, bell_ready) = wait_either(udp.as_fd(), self.bell.as_fd(), timeout)?;
        let mut n = 0;
        if udp_ready {
            n += udp.recv_frames(Duration::ZERO, on_frame)?;
        }
        if bell_ready {
            self.drain_bell(stats);
            n += self.poll_rings(stats, on_frame);
        }
        Ok(n)
    }

    fn drain_bell(&mut self, stats: &LinkStats) {
        for _ in 0..BELL_BATCH {
            let len = match self.bell.recv(&mut self.msg, &mut self.fds) {
                Ok(Some(len)) => len,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("link {}: bell: {e}", self.me);
                    return;
                }
            };
            let bytes = self.msg.get(..len).unwrap_or(&[]);
            match BellMsg::parse(bytes, self.fds.len()) {
                Ok(BellMsg::Wake | BellMsg::Probe) => {}
                Ok(BellMsg::Attach { src, nonce }) => {
                    if let Some(fd) = self.fds.pop() {
                        if let Err(e) = self.attach(src, nonce, fd) {
                            log::warn!("link {}: ring from {src} refused: {e}", self.me);
                            stats.add(LinkCounter::BadDatagrams, 1);
                        }
                    }
                }
                Err(e) => {
                    log::debug!("link {}: bell message dropped: {e}", self.me);
                    stats.add(LinkCounter::BadDatagrams, 1);
                }
            }
            self.fds.clear();
        }
    }

    /// Takes the ring `src` passed, replacing an earlier one from the same card.
    fn attach(&mut self, src: Ipv4Addr, nonce: u64, fd: OwnedFd) -> io::Result<()> {
        let id = RingId {
            src,
            dst: self.me,
            port: self.port,
            nonce,
        };
        let ring = RxRing::open(fd, &id)?;
        let bell = PeerBell::connect(&bell_path(&self.dir, src, self.port))?;
        self.rings.retain(|r| r.ring.id().src != src);
        if self.rings.len() >= MAX_RX_RINGS {
            return Err(io::Error::other(format!(
                "already reading {MAX_RX_RINGS} rings"
            )));
        }
        let max_frame = ring.geometry().max_frame();
        if self.scratch.len() < max_frame {
            self.scratch.resize(max_frame, 0);
        }
        ring.acknowledge();
        log::debug!(
            "link {}: frames from {src} come through shared memory",
            self.me
        );
        self.rings.push(RxPeer {
            ring,
            bell,
            dropped_seen: 0,
        });
        Ok(())
    }

    /// Drops the rings of cards that no longer answer their bell (checked every
    /// `probe_every`).
    fn probe_writers(&mut self) {
        if self.rings.is_empty() {
            return;
        }
        let now = Instant::now();
        if now < self.next_probe {
            return;
        }
        self.next_probe = now + self.probe_every;
        let me = self.me;
        self.rings.retain(|r| {
            let alive = r.bell.send(BellMsg::Probe, None).is_ok();
            if !alive {
                log::debug!(
                    "link {me}: {} has gone; its ring is dropped",
                    r.ring.id().src
                );
            }
            alive
        });
    }
}

/// Waits up to `timeout` for either descriptor to become readable; which ones are.
fn wait_either(
    a: std::os::fd::BorrowedFd<'_>,
    b: std::os::fd::BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<(bool, bool)> {
    let mut fds = [a, b].map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: two valid pollfds and a timespec on this stack frame; no signal mask.
    let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::Interrupted => Ok((false, false)),
            _ => Err(err),
        };
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}

impl LinkPort for ShmLink {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.tx.send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        self.rx.recv(&mut self.udp, timeout, on_frame)
    }

    fn stats(&self) -> &LinkStats {
        self.udp.stats()
    }

    fn set_sleeping(&mut self, sleeping: bool) -> bool {
        let rx = &mut self.rx;
        if !sleeping {
            // Whoever receives next looks at the sockets (a bell message may be waiting).
            let now = Instant::now();
            rx.sockets_checked = now.checked_sub(SOCKET_CHECK_IDLE).unwrap_or(now);
            rx.calls_since_sockets = SOCKET_CHECK_EVERY;
        }
        rx.rings
            .iter()
            .fold(false, |w, r| r.ring.set_sleeping(sleeping) | w)
    }

    fn wait_fds(&self) -> Vec<std::os::fd::RawFd> {
        vec![
            self.udp.as_fd().as_raw_fd(),
            self.rx.bell.as_fd().as_raw_fd(),
        ]
    }

    /// A wake message to this card's own bell: the `ppoll` of a waiting receive returns.
    fn waker(&self) -> Option<super::LinkWaker> {
        let bell = match PeerBell::connect(self.rx.bell.path()) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("link {}: no waker on its own bell: {e}", self.rx.me);
                return None;
            }
        };
        Some(Arc::new(move || {
            // A full bell queue already wakes the receiver.
            let _ = bell.send(BellMsg::Wake, None);
        }))
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(ShmSender::new(
            Arc::clone(&self.tx.out),
            self.udp.sender()?,
            self.tx.stats.clone(),
        )))
    }
}
