//! The default transport: Ethernet frames in UDP datagrams between cards on one host.
//!
//! Each card binds a UDP socket at its own IPv4 address (127.0.0.1, 127.0.0.2, ...; Linux
//! answers the whole of 127.0.0.0/8 on the loopback interface) and a port shared by every
//! card of the link (4791 by default). A frame goes to `<its IPv4 destination>:<port>`
//! (frame bytes 30..33, see [`super::route`]); frames for the same card are packed into
//! datagrams of up to ~64 KiB ([`super::datagram`]) and the datagrams of one
//! [`LinkPort::send_frames`] call leave in as few `sendmmsg` calls as possible.
//!
//! The link only ever sends to 127.0.0.0/8: a frame for any other address, a non-IPv4 frame
//! and a frame too large for one datagram are counted and dropped; a frame for a 127.x
//! address where no card listens is lost silently, like a frame on an unplugged cable. A
//! received datagram that
//! is malformed is counted and dropped whole. Like any UDP path, the link may lose datagrams
//! when a receiver falls behind; the kernel's count of those is [`LinkCounter::RxQueueDrops`].
//!
//! [`LinkPort::sender`] gives a second transmit handle on the same socket, with its own
//! datagram buffers and the port's counters. The socket stays bound, and the address taken,
//! until the port and every sender are dropped.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use super::datagram::{DatagramBuilder, DatagramFrames, MAX_UDP_PAYLOAD};
use super::mmsg::{self, OutDatagram, RecvBuffers};
use super::route::frame_dst_ipv4;
use super::{FrameSender, LinkCounter, LinkPort, LinkStats};

/// The UDP port of RoCE v2, the default port of every card on the link.
pub const DEFAULT_PORT: u16 = 4791;

/// How to open a [`UdpLink`] port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpLinkConfig {
    /// The card's own address: in 127.0.0.0/8, or any local address with `network`.
    pub ip: Ipv4Addr,
    /// Let the card use a non-loopback address and send to peers anywhere the host routes
    /// (cards in network namespaces, or on real hosts). Off by default: the link then only
    /// ever reaches 127.0.0.0/8.
    pub network: bool,
    /// The UDP port of every card on this link (0: a free port chosen by the kernel when
    /// the first card binds; give the others [`UdpLink::local_addr`]'s port).
    pub port: u16,
    /// Largest datagram sent, header included (capped at 65 507, the IPv4 limit). Frames
    /// larger than this minus 8 bytes of framing cannot be sent.
    pub max_datagram_bytes: usize,
    /// Requested `SO_SNDBUF` and `SO_RCVBUF`. The kernel caps the request at
    /// `net.core.{w,r}mem_max` unless the process may set `SO_RCVBUFFORCE` (root).
    pub socket_buffer_bytes: usize,
}

impl UdpLinkConfig {
    /// The defaults for a card at `ip`: port 4791, 64 KiB datagrams, 8 MiB socket buffers.
    pub fn new(ip: Ipv4Addr) -> Self {
        Self {
            ip,
            port: DEFAULT_PORT,
            max_datagram_bytes: MAX_UDP_PAYLOAD,
            socket_buffer_bytes: 8 << 20,
            network: false,
        }
    }

    /// The same configuration on another port.
    pub fn with_port(self, port: u16) -> Self {
        Self { port, ..self }
    }
}

/// Datagrams waiting to be sent to one card.
#[derive(Debug)]
struct Outgoing {
    dst: Ipv4Addr,
    datagram: DatagramBuilder,
}

/// One card's port on a UDP link (see the module documentation).
pub struct UdpLink {
    /// The port's own transmit handle; its socket is the one the port receives on.
    tx: UdpSender,
    rx: RecvBuffers,
}

impl fmt::Debug for UdpLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpLink")
            .field("addr", &self.local_addr())
            .field("stats", &self.tx.stats)
            .finish_non_exhaustive()
    }
}

/// A transmit handle on a UDP port: packs frames into datagrams and sends them. Every
/// handle of a port shares its socket and counters and has its own datagram buffers.
struct UdpSender {
    socket: Arc<UdpSocket>,
    config: UdpLinkConfig,
    stats: LinkStats,
    /// The datagram being filled for each destination of the current send.
    filling: Vec<Outgoing>,
    /// Full datagrams of the current send, in the order they must leave.
    full: Vec<Outgoing>,
    /// Emptied builders kept for reuse, so that steady traffic does not allocate.
    spare: Vec<DatagramBuilder>,
}

/// Receive slots per `recvmmsg`; each holds a whole datagram.
const RX_SLOTS: usize = 8;
/// One slot: larger than any UDP payload over IPv4, so no datagram is ever cut short.
const RX_SLOT_LEN: usize = 64 << 10;

impl UdpLink {
    /// Opens the port: binds `config.ip:config.port` with large socket buffers.
    ///
    /// Fails with `InvalidInput` if the address is not in 127.0.0.0/8 (unless
    /// `config.network`), and with the socket error (e.g. `AddrInUse`) if the bind fails.
    pub fn bind(config: UdpLinkConfig) -> io::Result<Self> {
        if !config.ip.is_loopback() && !config.network {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "UDP link address {} is not in 127.0.0.0/8 (set UdpLinkConfig::network to \
                     use the network)",
                    config.ip
                ),
            ));
        }
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        let buffer = config.socket_buffer_bytes;
        if force_recv_buffer(&socket, buffer).is_err() {
            socket.set_recv_buffer_size(buffer)?;
        }
        socket.set_send_buffer_size(buffer)?;
        enable_rxq_ovfl(&socket)?;
        socket.bind(&SocketAddrV4::new(config.ip, config.port).into())?;
        // Port 0 asks the kernel for a free port; the link's port is the one it gave.
        let port = socket
            .local_addr()?
            .as_socket_ipv4()
            .map_or(config.port, |a| a.port());
        Ok(Self {
            tx: UdpSender::new(
                Arc::new(socket.into()),
                UdpLinkConfig { port, ..config },
                LinkStats::new(),
            ),
            rx: RecvBuffers::new(RX_SLOTS, RX_SLOT_LEN),
        })
    }

    /// The address the port is bound to.
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.tx.config.ip, self.tx.config.port)
    }

    /// The configuration the port was opened with.
    pub fn config(&self) -> &UdpLinkConfig {
        &self.tx.config
    }

    /// The receive buffer the kernel granted (`SO_RCVBUF` as read back).
    pub fn recv_buffer_bytes(&self) -> io::Result<usize> {
        socket2::SockRef::from(&*self.tx.socket).recv_buffer_size()
    }
}

impl AsFd for UdpLink {
    /// The socket the port receives on (for a transport that waits on it with others).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tx.socket.as_fd()
    }
}

/// Waits up to `timeout` (with nanosecond resolution) for `fd` to become readable.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd and a timespec on this stack frame; no signal mask.
    let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::Interrupted => Ok(false),
            _ => Err(err),
        };
    }
    Ok(n > 0)
}

impl UdpSender {
    fn new(socket: Arc<UdpSocket>, config: UdpLinkConfig, stats: LinkStats) -> Self {
        Self {
            socket,
            config,
            stats,
            filling: Vec::new(),
            full: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Adds `frame` to the datagram for its destination, moving that datagram to `full`
    /// first if the frame does not fit in it.
    fn pack(&mut self, frame: &[u8]) {
        let dst = match frame_dst_ipv4(frame) {
            Ok(ip) if ip.is_loopback() => ip,
            Ok(ip)
                if self.config.network
                    && !ip.is_unspecified()
                    && !ip.is_multicast()
                    && !ip.is_broadcast() =>
            {
                ip
            }
            Ok(ip) => {
                log::debug!(
                    "link {}: frame for {ip} is not for 127.0.0.0/8; dropped",
                    self.config.ip
                );
                self.stats.add(LinkCounter::FramesUnroutable, 1);
                return;
            }
            Err(e) => {
                log::debug!("link {}: unroutable frame ({e:?}); dropped", self.config.ip);
                self.stats.add(LinkCounter::FramesUnroutable, 1);
                return;
            }
        };
        let slot = match self.filling.iter().position(|o| o.dst == dst) {
            Some(slot) => slot,
            None => {
                let datagram = self.take_builder();
                self.filling.push(Outgoing { dst, datagram });
                self.filling.len() - 1
            }
        };
        let outgoing = &mut self.filling[slot];
        if outgoing.datagram.push(frame) {
            return;
        }
        if !outgoing.datagram.fits_alone(frame.len()) {
            log::debug!(
                "link {}: frame of {} bytes exceeds a datagram; dropped",
                self.config.ip,
                frame.len()
            );
            self.stats.add(LinkCounter::FramesOversize, 1);
            return;
        }
        let mut fresh = self.take_builder();
        // A frame that fits alone always fits in an empty datagram.
        fresh.push(frame);
        let full = std::mem::replace(&mut self.filling[slot].datagram, fresh);
        self.full.push(Outgoing {
            dst,
            datagram: full,
        });
    }

    fn take_builder(&mut self) -> DatagramBuilder {
        self.spare
            .pop()
            .unwrap_or_else(|| DatagramBuilder::new(self.config.max_datagram_bytes))
    }

    /// Sends every datagram in `full`, then recycles their builders.
    fn flush(&mut self) -> io::Result<()> {
        let port = self.config.port;
        let mut next = 0;
        let mut result = Ok(());
        while let Some(batch) = self.full.get(next..).filter(|b| !b.is_empty()) {
            let out = batch.iter().map(|o| OutDatagram {
                dst: SocketAddrV4::new(o.dst, port),
                bytes: o.datagram.bytes(),
            });
            match mmsg::send_batch(self.socket.as_fd(), out) {
                Ok(sent) => {
                    let frames: usize = batch.iter().take(sent).map(|o| o.datagram.count()).sum();
                    self.stats.add(LinkCounter::DatagramsSent, sent as u64);
                    self.stats.add(LinkCounter::FramesSent, frames as u64);
                    next += sent.max(1);
                }
                Err(e) if is_peer_gone(&e) => {
                    // The socket reports an ICMP error drawn by an earlier datagram; count
                    // this one as lost, like a frame on a cable with nobody at the far end.
                    if let Some(o) = batch.first() {
                        log::debug!(
                            "link {}: send to {} failed ({e}); {} frames lost",
                            self.config.ip,
                            o.dst,
                            o.datagram.count()
                        );
                        self.stats
                            .add(LinkCounter::FramesUnroutable, o.datagram.count() as u64);
                    }
                    next += 1;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        for mut o in self.full.drain(..) {
            o.datagram.clear();
            self.spare.push(o.datagram);
        }
        result
    }
}

impl FrameSender for UdpSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        for frame in frames {
            self.pack(frame);
        }
        // Everything still filling leaves now, in the order the destinations first appeared.
        let filling = std::mem::take(&mut self.filling);
        for o in filling {
            if o.datagram.count() > 0 {
                self.full.push(o);
            } else {
                self.spare.push(o.datagram);
            }
        }
        self.flush()
    }
}

impl LinkPort for UdpLink {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.tx.send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // Wait with ppoll, not the socket's read timeout: SO_RCVTIMEO counts in scheduler
        // ticks (4 ms here), which turned the card's 10 us quiet timer into 8 ms and made
        // every multi-packet message wait that long for its acknowledgement.
        if !timeout.is_zero() && !wait_readable(self.tx.socket.as_fd(), timeout)? {
            return Ok(0);
        }
        let queue_drops = mmsg::recv_batch(self.tx.socket.as_fd(), &mut self.rx, false)?;
        let (ip, stats) = (self.tx.config.ip, &self.tx.stats);
        if let Some(drops) = queue_drops {
            stats.raise_to(LinkCounter::RxQueueDrops, u64::from(drops));
        }
        let mut delivered = 0;
        for datagram in self.rx.datagrams() {
            if datagram == Ok(&[][..]) {
                // An empty datagram carries no frame: a waker's (see `waker`), or nothing.
                continue;
            }
            let parsed = datagram
                .map_err(|len| format!("datagram of {len} bytes cut short"))
                .and_then(|bytes| DatagramFrames::parse(bytes).map_err(|e| e.to_string()));
            match parsed {
                Ok(frames) => {
                    stats.add(LinkCounter::DatagramsReceived, 1);
                    for frame in frames.iter() {
                        on_frame(frame);
                        delivered += 1;
                    }
                }
                Err(e) => {
                    log::debug!("link {ip}: bad datagram dropped: {e}");
                    stats.add(LinkCounter::BadDatagrams, 1);
                }
            }
        }
        stats.add(LinkCounter::FramesReceived, delivered as u64);
        Ok(delivered)
    }

    fn stats(&self) -> &LinkStats {
        &self.tx.stats
    }

    fn wait_fds(&self) -> Vec<std::os::fd::RawFd> {
        vec![self.tx.socket.as_raw_fd()]
    }

    /// An empty datagram to the port's own address (received as nothing).
    fn waker(&self) -> Option<super::LinkWaker> {
        let socket = Arc::clone(&self.tx.socket);
        let me = self.local_addr();
        Some(Arc::new(move || {
            let _ = socket.send_to(&[], me);
        }))
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(UdpSender::new(
            Arc::clone(&self.tx.socket),
            self.tx.config,
            self.tx.stats.clone(),
        )))
    }
}

/// Errors a datagram socket reports for an earlier datagram that found nobody listening.
fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// Sets `SO_RCVBUFFORCE`, which may exceed `net.core.rmem_max` but needs `CAP_NET_ADMIN`.
fn force_recv_buffer(socket: &Socket, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    setsockopt_int(socket, libc::SO_RCVBUFFORCE, value)
}

/// Asks the kernel to report its count of receive-queue drops with every datagram.
fn enable_rxq_ovfl(socket: &Socket) -> io::Result<()> {
    setsockopt_int(socket, libc::SO_RXQ_OVFL, 1)
}

fn setsockopt_int(socket: &Socket, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the fd is a live socket owned by `socket`; the option value is a c_int on
    // this stack frame whose size is passed alongside it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
