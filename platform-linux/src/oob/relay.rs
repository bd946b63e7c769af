//! The out-of-band channel shared by several processes on one device: a daemon owns the
//! device's single transport (the [`TcpOob`](super::TcpOob) listening on the device IP) in
//! a [`RelayHub`], and each client process's engine gets a [`RelayClient`], an
//! [`OobTransport`] that talks to the hub over a byte stream (a Unix stream socket).
//! oob-channel.md: "a second process opening the same device IP must either share the
//! listener or fail with a clear error, never silently steal records"; this is the sharing.
//!
//! # Routing
//! Each client owns a set of local QPNs, given by the daemon when it adds the client
//! ([`QpOwner`]: a range of QP table indices, `index = qpn >> 8`, or any predicate). An
//! event from the real transport goes to the client that owns its local QP. Only the
//! atomics name the local QP; the other records name the *peer's* QPN, and the engine
//! finds its QP as the one whose peer QPN and peer IP they are (`peer_qp` in the engine).
//! So a client tells the hub, for each of its QPs that reaches RTR, which peer QP it is
//! connected to ([`RelayBindings::bind`]), and the hub routes those records by that
//! binding:
//!
//! | Event | Routed by |
//! |---|---|
//! | `RecvWr { from, wr }` | binding `(from, wr.qpn)`: `wr.qpn` is the announcing peer's QPN |
//! | `RecvTooShort { from, rec }` | binding `(from, rec.qpn)`: the requester's QPN |
//! | `Atomic` request | owner of `dest_qpn` (our QP, the responder) |
//! | `Atomic` reply | owner of `dest_qpn` (our QP, the requester); also a reply the transport made for a peer without ATOMICS |
//! | `Check` (access check) | binding `(from, qpn)`: the requester's QPN |
//! | `Check` (verdict) | binding `(from, qpn)`: the responder's QPN |
//! | `PeerLost { peer }` | every client |
//!
//! A record for a peer QP that no client has bound yet is held (bounded,
//! [`RelayHubConfig::max_held`]) and delivered when a client binds it, as the engine holds
//! records for a QP not yet at RTR. A record whose client is gone (removed, or its stream
//! closed), an atomic for a QPN no client owns, and a held record beyond the bound are
//! dropped, counted in [`RelayHubStats`] and logged at most 20 lines a second.
//!
//! What a client sends is checked too: every record names its sender's own QPN
//! (`qpn` of each kind), and a record or binding naming a QPN the client does not own is
//! refused (logged, counted), so that no client can speak for, or take the records of,
//! another client's QPs.
//!
//! # Capabilities
//! The hub tracks the peers its clients talk to and that events come from, asks the real
//! transport for their capabilities after work (at most once a millisecond) and every
//! [`RelayHubConfig::caps_interval`] when idle, and tells every client when they change.
//! [`RelayClient::peer_capabilities`] answers from that cache, without blocking.
//!
//! # Frames
//! Both directions carry frames: a big-endian `u32` length `n` of what follows (2 to
//! [`MAX_FRAME_LEN`]), the relay version ([`RELAY_VERSION`]), a kind byte and `n - 2`
//! bytes of body. Records travel in the core codec's encoding ([`Record::to_bytes`]),
//! after the peer's IPv4 address:
//!
//! | Kind | Direction | Body |
//! |---|---|---|
//! | 1 record | client to hub | destination IP (4), record (32, or 64 for an atomic request) |
//! | 2 bind | client to hub | local QPN (4), peer IP (4), peer QPN (4) |
//! | 3 unbind | client to hub | local QPN (4) |
//! | 0x81 event | hub to client | source IP (4), record |
//! | 0x82 peer lost | hub to client | peer IP (4) |
//! | 0x83 capabilities | hub to client | peer IP (4), known (1: 0 or 1), capabilities (4; 0 if unknown) |
//!
//! A malformed frame (another version, a length out of bounds, an unknown kind, a body of
//! the wrong size, a record the codec refuses) ends the stream: the hub logs it and drops
//! that client; a client logs it and reports the daemon lost ([`OobEvent::PeerLost`] for
//! every peer it knew, then `Disconnected` on every send). Nothing panics.
//!
//! # Driving
//! Both sides are non-blocking. The client does its I/O inside the transport's calls: a
//! send writes at once what the stream takes and queues the rest (bounded:
//! [`PlatformError::WouldBlock`] beyond), `poll` writes what is queued and reads what
//! arrived. The hub does everything in [`RelayHub::pump`], which the daemon calls from
//! its loop; an idle pump costs one `read` per client and one `poll` of the real
//! transport. A daemon that sleeps can wait on [`RelayHub::fds`] (the client streams) and
//! on the real transport's own wake-up ([`TcpOob::notifier`](super::TcpOob::notifier)).
//!
//! Streams are written with `MSG_NOSIGNAL` ([`RelayStream`]), so a closed peer is an
//! error here, never a SIGPIPE in a process that did not ask for one.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bluerdma_core::oob::{
    AtomicMessage, Capabilities, CheckMessage, OobError, Record, RecordKind, RecvTooShort, RecvWr,
    MAX_QPN, RECV_WR_LEN,
};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};

use super::log_budget::LogBudget;

/// The version byte of every frame.
pub const RELAY_VERSION: u8 = 1;
/// The largest value of a frame's length field (version, kind and body).
pub const MAX_FRAME_LEN: usize = 2 + 4 + 2 * RECV_WR_LEN;

const KIND_RECORD: u8 = 1;
const KIND_BIND: u8 = 2;
const KIND_UNBIND: u8 = 3;
const KIND_EVENT: u8 = 0x81;
const KIND_PEER_LOST: u8 = 0x82;
const KIND_CAPS: u8 = 0x83;

/// How much a stream read takes at most.
const READ_CHUNK: usize = 16 * 1024;

// ---------------------------------------------------------------------------------------
// Streams and frames
// ---------------------------------------------------------------------------------------

/// A byte stream between a [`RelayClient`] and a [`RelayHub`]. Both put it in
/// non-blocking mode; reads and writes return [`io::ErrorKind::WouldBlock`] when they
/// cannot proceed, `Ok(0)` from a read is the end of the stream.
pub trait RelayStream: Send {
    /// Switches the stream to non-blocking mode.
    fn set_nonblocking(&self) -> io::Result<()>;
    /// Reads what is there.
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes what the stream takes now, without raising SIGPIPE on a closed peer.
    fn write_some(&mut self, buf: &[u8]) -> io::Result<usize>;
}

impl RelayStream for UnixStream {
    fn set_nonblocking(&self) -> io::Result<()> {
        UnixStream::set_nonblocking(self, true)
    }
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(self, buf)
    }
    fn write_some(&mut self, buf: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(&*self).send_with_flags(buf, libc::MSG_NOSIGNAL)
    }
}

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame's version byte is not [`RELAY_VERSION`].
    Version {
        /// The version found.
        theirs: u8,
    },
    /// The length field is below 2 or above [`MAX_FRAME_LEN`].
    Length {
        /// The length found.
        len: u32,
    },
    /// A kind this side does not take (or the other direction's).
    UnknownKind {
        /// The kind found.
        kind: u8,
    },
    /// The body does not have the size its kind needs.
    BodySize {
        /// The kind.
        kind: u8,
        /// Bytes found.
        len: usize,
    },
    /// A field is out of range (a QPN wider than 24 bits, a flag that is not 0 or 1).
    Field {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u32,
    },
    /// The codec refused the record.
    Record(OobError),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Version { theirs } => write!(
                f,
                "relay frame of version {theirs}, this driver speaks version {RELAY_VERSION}"
            ),
            FrameError::Length { len } => write!(
                f,
                "relay frame length {len} out of bounds (2 to {MAX_FRAME_LEN})"
            ),
            FrameError::UnknownKind { kind } => write!(f, "relay frame of unknown kind {kind:#x}"),
            FrameError::BodySize { kind, len } => {
                write!(f, "relay frame of kind {kind:#x} with a {len}-byte body")
            }
            FrameError::Field { what, value } => {
                write!(f, "relay frame: {what} {value:#x} out of range")
            }
            FrameError::Record(e) => write!(f, "relay frame: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Bytes read from a stream and not yet taken as frames.
#[derive(Default)]
struct InBuf {
    buf: Vec<u8>,
    start: usize,
}

/// What one read of a stream gave.
enum Fill {
    /// Bytes arrived.
    Data,
    /// Nothing now.
    Idle,
    /// The other end closed the stream.
    Eof,
}

impl InBuf {
    fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    fn fill<S: RelayStream + ?Sized>(&mut self, stream: &mut S) -> io::Result<Fill> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            return match stream.read_some(&mut chunk) {
                Ok(0) => Ok(Fill::Eof),
                Ok(n) => {
                    self.buf.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
                    Ok(Fill::Data)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Fill::Idle),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// Takes the next complete frame and decodes it with `decode(kind, body)`; `None` if
    /// no whole frame is buffered. The header is checked as soon as it is there.
    fn next<T>(
        &mut self,
        decode: impl FnOnce(u8, &[u8]) -> Result<T, FrameError>,
    ) -> Result<Option<T>, FrameError> {
        let pending = self.buf.get(self.start..).unwrap_or(&[]);
        let Some((len, rest)) = pending.split_first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*len);
        if !(2..=MAX_FRAME_LEN as u32).contains(&len) {
            return Err(FrameError::Length { len });
        }
        if let Some(&version) = rest.first() {
            if version != RELAY_VERSION {
                return Err(FrameError::Version { theirs: version });
            }
        }
        let Some(frame) = rest.get(..len as usize) else {
            return Ok(None);
        };
        let (kind, body) = match frame {
            [_version, kind, body @ ..] => (*kind, body),
            _ => return Err(FrameError::Length { len }),
        };
        let value = decode(kind, body)?;
        self.start += 4 + len as usize;
        Ok(Some(value))
    }
}

/// Bytes to write to a stream.
#[derive(Default)]
struct OutBuf {
    buf: Vec<u8>,
    pos: usize,
}

impl OutBuf {
    fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, kind: u8, body: &[u8]) {
        let len = (2 + body.len()) as u32;
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.push(RELAY_VERSION);
        self.buf.push(kind);
        self.buf.extend_from_slice(body);
    }

    /// Writes until the stream would block or nothing is left.
    fn flush<S: RelayStream + ?Sized>(&mut self, stream: &mut S) -> io::Result<()> {
        while self.pos < self.buf.len() {
            let pending = self.buf.get(self.pos..).unwrap_or(&[]);
            match stream.write_some(pending) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos >= 64 * 1024 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        Ok(())
    }
}

fn ip_at(body: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::from(be32_at(body, at))
}

fn be32_at(body: &[u8], at: usize) -> u32 {
    let b = |k: usize| body.get(at + k).copied().unwrap_or(0);
    u32::from_be_bytes([b(0), b(1), b(2), b(3)])
}

fn qpn_at(body: &[u8], at: usize, what: &'static str) -> Result<u32, FrameError> {
    match be32_at(body, at) {
        q if q <= MAX_QPN => Ok(q),
        value => Err(FrameError::Field { what, value }),
    }
}

/// An IP address and a record: the body of a record or event frame.
fn decode_record(kind: u8, body: &[u8]) -> Result<(Ipv4Addr, Record), FrameError> {
    let size = body
        .get(4..)
        .filter(|r| r.len() >= RECV_WR_LEN)
        .map(|r| 4 + RecordKind::record_len(r));
    if size != Some(body.len()) {
        return Err(FrameError::BodySize {
            kind,
            len: body.len(),
        });
    }
    let (record, _) = Record::parse(body.get(4..).unwrap_or(&[])).map_err(FrameError::Record)?;
    Ok((ip_at(body, 0), record))
}

fn push_record(out: &mut OutBuf, kind: u8, ip: Ipv4Addr, record: &Record) -> Result<(), OobError> {
    let bytes = record.to_bytes()?;
    let mut body = [0u8; 4 + 2 * RECV_WR_LEN];
    body[..4].copy_from_slice(&ip.octets());
    body[4..4 + bytes.len()].copy_from_slice(&bytes);
    out.push(kind, &body[..4 + bytes.len()]);
    Ok(())
}

fn check_size(kind: u8, body: &[u8], len: usize) -> Result<(), FrameError> {
    if body.len() == len {
        Ok(())
    } else {
        Err(FrameError::BodySize {
            kind,
            len: body.len(),
        })
    }
}

/// A frame from a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    Record {
        peer: Ipv4Addr,
        record: Record,
    },
    Bind {
        local_qpn: u32,
        peer: Ipv4Addr,
        peer_qpn: u32,
    },
    Unbind {
        local_qpn: u32,
    },
}

impl Request {
    fn decode(kind: u8, body: &[u8]) -> Result<Self, FrameError> {
        match kind {
            KIND_RECORD => {
                let (peer, record) = decode_record(kind, body)?;
                Ok(Request::Record { peer, record })
            }
            KIND_BIND => {
                check_size(kind, body, 12)?;
                Ok(Request::Bind {
                    local_qpn: qpn_at(body, 0, "local QPN")?,
                    peer: ip_at(body, 4),
                    peer_qpn: qpn_at(body, 8, "peer QPN")?,
                })
            }
            KIND_UNBIND => {
                check_size(kind, body, 4)?;
                Ok(Request::Unbind {
                    local_qpn: qpn_at(body, 0, "local QPN")?,
                })
            }
            kind => Err(FrameError::UnknownKind { kind }),
        }
    }
}

/// A frame from the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Notice {
    Event(OobEvent),
    Caps {
        peer: Ipv4Addr,
        caps: Option<Capabilities>,
    },
}

impl Notice {
    fn decode(kind: u8, body: &[u8]) -> Result<Self, FrameError> {
        match kind {
            KIND_EVENT => {
                let (from, record) = decode_record(kind, body)?;
                Ok(Notice::Event(event_of(from, record)))
            }
            KIND_PEER_LOST => {
                check_size(kind, body, 4)?;
                Ok(Notice::Event(OobEvent::PeerLost {
                    peer: ip_at(body, 0),
                }))
            }
            KIND_CAPS => {
                check_size(kind, body, 9)?;
                let caps = Capabilities::from_bits_retain(be32_at(body, 5));
                let caps = match body.get(4).copied().unwrap_or(0) {
                    0 => None,
                    1 => Some(caps),
                    other => {
                        return Err(FrameError::Field {
                            what: "capabilities flag",
                            value: other.into(),
                        })
                    }
                };
                Ok(Notice::Caps {
                    peer: ip_at(body, 0),
                    caps,
                })
            }
            kind => Err(FrameError::UnknownKind { kind }),
        }
    }

    fn push(&self, out: &mut OutBuf) -> Result<(), OobError> {
        match *self {
            Notice::Event(OobEvent::PeerLost { peer }) => {
                out.push(KIND_PEER_LOST, &peer.octets());
                Ok(())
            }
            Notice::Event(ev) => match record_of(&ev) {
                Some((from, record)) => push_record(out, KIND_EVENT, from, &record),
                None => Ok(()),
            },
            Notice::Caps { peer, caps } => {
                let mut body = [0u8; 9];
                body[..4].copy_from_slice(&peer.octets());
                body[4] = caps.is_some() as u8;
                body[5..].copy_from_slice(&caps.unwrap_or_default().bits().to_be_bytes());
                out.push(KIND_CAPS, &body);
                Ok(())
            }
        }
    }
}

/// The event a record from `from` is.
fn event_of(from: Ipv4Addr, record: Record) -> OobEvent {
    match record {
        Record::RecvWr(wr) => OobEvent::RecvWr { from, wr },
        Record::RecvTooShort(rec) => OobEvent::RecvTooShort { from, rec },
        Record::AtomicRequest(r) => OobEvent::Atomic {
            from,
            msg: AtomicMessage::Request(r),
        },
        Record::AtomicReply(r) => OobEvent::Atomic {
            from,
            msg: AtomicMessage::Reply(r),
        },
        Record::AccessCheck(c) => OobEvent::Check {
            from,
            msg: CheckMessage::Check(c),
        },
        Record::AccessVerdict(v) => OobEvent::Check {
            from,
            msg: CheckMessage::Verdict(v),
        },
    }
}

/// The source and record of an event (`None`: a lost peer).
fn record_of(ev: &OobEvent) -> Option<(Ipv4Addr, Record)> {
    Some(match *ev {
        OobEvent::RecvWr { from, wr } => (from, Record::RecvWr(wr)),
        OobEvent::RecvTooShort { from, rec } => (from, Record::RecvTooShort(rec)),
        OobEvent::Atomic { from, msg } => (
            from,
            match msg {
                AtomicMessage::Request(r) => Record::AtomicRequest(r),
                AtomicMessage::Reply(r) => Record::AtomicReply(r),
            },
        ),
        OobEvent::Check { from, msg } => (
            from,
            match msg {
                CheckMessage::Check(c) => Record::AccessCheck(c),
                CheckMessage::Verdict(v) => Record::AccessVerdict(v),
            },
        ),
        OobEvent::PeerLost { .. } => return None,
    })
}

/// The sender's own QPN, which every record names.
fn own_qpn(record: &Record) -> u32 {
    match record {
        Record::RecvWr(wr) => wr.qpn,
        Record::RecvTooShort(r) => r.qpn,
        Record::AtomicRequest(r) => r.qpn,
        Record::AtomicReply(r) => r.qpn,
        Record::AccessCheck(c) => c.qpn,
        Record::AccessVerdict(v) => v.qpn,
    }
}

/// Where an event from the real transport goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// To the owner of this local QPN.
    Local(u32),
    /// To the client that bound this peer QP (peer IP, peer QPN).
    Peer(Ipv4Addr, u32),
    /// To every client.
    All,
}

fn route_of(ev: &OobEvent) -> Route {
    match *ev {
        OobEvent::RecvWr { from, wr } => Route::Peer(from, wr.qpn),
        OobEvent::RecvTooShort { from, rec } => Route::Peer(from, rec.qpn),
        OobEvent::Atomic { msg, .. } => Route::Local(match msg {
            AtomicMessage::Request(r) => r.dest_qpn,
            AtomicMessage::Reply(r) => r.dest_qpn,
        }),
        OobEvent::Check { from, msg } => Route::Peer(
            from,
            match msg {
                CheckMessage::Check(c) => c.qpn,
                CheckMessage::Verdict(v) => v.qpn,
            },
        ),
        OobEvent::PeerLost { .. } => Route::All,
    }
}

fn describe(ev: &OobEvent) -> &'static str {
    match ev {
        OobEvent::RecvWr { .. } => "receive WR",
        OobEvent::RecvTooShort { .. } => "receive-WR-too-short record",
        OobEvent::Atomic {
            msg: AtomicMessage::Request(_),
            ..
        } => "atomic request",
        OobEvent::Atomic { .. } => "atomic reply",
        OobEvent::Check {
            msg: CheckMessage::Check(_),
            ..
        } => "access check",
        OobEvent::Check { .. } => "access verdict",
        OobEvent::PeerLost { .. } => "peer lost",
    }
}

// ---------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------

/// The bounds of a [`RelayClient`].
#[derive(Clone, Copy, Debug)]
pub struct RelayClientConfig {
    /// Bytes of frames queued for the hub and not yet written; a send beyond returns
    /// [`PlatformError::WouldBlock`]. Bindings are never refused (one per QP at most).
    pub max_queued_bytes: usize,
    /// Events decoded and not yet polled; reading from the hub pauses beyond.
    pub max_events: usize,
}

impl Default for RelayClientConfig {
    /// 1 MiB of frames (about 24,000 records), 65536 events.
    fn default() -> Self {
        RelayClientConfig {
            max_queued_bytes: 1 << 20,
            max_events: 65536,
        }
    }
}

/// Counters of a [`RelayClient`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayClientStats {
    /// Records queued for the hub.
    pub records_sent: u64,
    /// Bindings and unbindings queued for the hub.
    pub bindings_sent: u64,
    /// Events that arrived from the hub (lost peers included).
    pub events_received: u64,
    /// Capability updates that arrived from the hub.
    pub caps_received: u64,
    /// Sends refused with `WouldBlock`.
    pub would_block: u64,
    /// The hub is gone (its stream closed, broke or sent a malformed frame).
    pub daemon_lost: bool,
}

/// Pending bindings, shared by a client and its [`RelayBindings`] handles.
#[derive(Default)]
struct BindShared {
    dirty: AtomicBool,
    /// Local QPN to (peer IP, peer QPN), or `None` to unbind; the latest per QPN.
    changes: Mutex<HashMap<u32, Option<(Ipv4Addr, u32)>>>,
}

/// Tells the hub which peer QP each of a client's QPs is connected to (see the module
/// docs, *Routing*). Cloned from [`RelayClient::bindings`] before the client is handed to
/// an engine; the verbs layer calls [`RelayBindings::bind`] when a QP reaches RTR and
/// [`RelayBindings::unbind`] when it is reset or destroyed. The change goes to the hub on
/// the client's next `send` or `poll`.
#[derive(Clone, Default)]
pub struct RelayBindings(Arc<BindShared>);

impl fmt::Debug for RelayBindings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RelayBindings")
    }
}

impl RelayBindings {
    /// Records from `peer`'s QP `peer_qpn` go to this client's QP `local_qpn` from now on.
    /// A QPN wider than 24 bits is refused (`Os(EINVAL)`).
    pub fn bind(&self, local_qpn: u32, peer: Ipv4Addr, peer_qpn: u32) -> Result<(), PlatformError> {
        if local_qpn > MAX_QPN || peer_qpn > MAX_QPN {
            return Err(PlatformError::Os(libc::EINVAL));
        }
        self.change(local_qpn, Some((peer, peer_qpn)));
        Ok(())
    }

    /// QP `local_qpn` no longer takes the records of its peer QP.
    pub fn unbind(&self, local_qpn: u32) -> Result<(), PlatformError> {
        if local_qpn > MAX_QPN {
            return Err(PlatformError::Os(libc::EINVAL));
        }
        self.change(local_qpn, None);
        Ok(())
    }

    fn change(&self, local_qpn: u32, to: Option<(Ipv4Addr, u32)>) {
        let mut changes = self
            .0
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        changes.insert(local_qpn, to);
        self.0.dirty.store(true, Ordering::Release);
    }

    fn take(&self) -> Option<HashMap<u32, Option<(Ipv4Addr, u32)>>> {
        if !self.0.dirty.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut changes = self
            .0
            .changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(std::mem::take(&mut *changes))
    }
}

/// A client process's out-of-band transport: every call becomes a frame to the daemon's
/// [`RelayHub`], which owns the device's real transport (see the module docs).
pub struct RelayClient<S: RelayStream = UnixStream> {
    stream: S,
    cfg: RelayClientConfig,
    out: OutBuf,
    inb: InBuf,
    events: VecDeque<OobEvent>,
    caps: HashMap<Ipv4Addr, Capabilities>,
    /// Every peer this client sent to, heard from or bound: told lost with the daemon.
    peers: Vec<Ipv4Addr>,
    bindings: RelayBindings,
    lost: bool,
    stats: RelayClientStats,
}

impl<S: RelayStream> fmt::Debug for RelayClient<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayClient")
            .field("stats", &self.stats)
            .finish()
    }
}

impl RelayClient<UnixStream> {
    /// Connects to the daemon's relay socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> io::Result<Self> {
        Self::new(UnixStream::connect(path)?, RelayClientConfig::default())
    }
}

impl<S: RelayStream> RelayClient<S> {
    /// A client over `stream`, connected to a hub (it is switched to non-blocking mode).
    pub fn new(stream: S, cfg: RelayClientConfig) -> io::Result<Self> {
        stream.set_nonblocking()?;
        Ok(RelayClient {
            stream,
            cfg,
            out: OutBuf::default(),
            inb: InBuf::default(),
            events: VecDeque::new(),
            caps: HashMap::new(),
            peers: Vec::new(),
            bindings: RelayBindings::default(),
            lost: false,
            stats: RelayClientStats::default(),
        })
    }

    /// The handle that binds this client's QPs to their peers (see [`RelayBindings`]).
    pub fn bindings(&self) -> RelayBindings {
        self.bindings.clone()
    }

    /// [`RelayBindings::bind`] on this client's handle.
    pub fn bind(&self, local_qpn: u32, peer: Ipv4Addr, peer_qpn: u32) -> Result<(), PlatformError> {
        self.bindings.bind(local_qpn, peer, peer_qpn)
    }

    /// [`RelayBindings::unbind`] on this client's handle.
    pub fn unbind(&self, local_qpn: u32) -> Result<(), PlatformError> {
        self.bindings.unbind(local_qpn)
    }

    /// The counters now.
    pub fn stats(&self) -> RelayClientStats {
        self.stats
    }

    /// Whether the daemon is gone (every later send fails with `Disconnected`).
    pub fn daemon_lost(&self) -> bool {
        self.lost
    }

    /// Bytes queued for the hub and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.out.len()
    }

    fn note_peer(&mut self, peer: Ipv4Addr) {
        if !self.peers.contains(&peer) {
            self.peers.push(peer);
        }
    }

    /// The daemon is gone: every known peer is reported lost, once.
    fn lose(&mut self, why: fmt::Arguments<'_>) {
        if self.lost {
            return;
        }
        log::error!(
            "OOB relay: {why}; the daemon is lost, the out-of-band channel fails for {} peer(s)",
            self.peers.len()
        );
        self.lost = true;
        self.stats.daemon_lost = true;
        self.caps.clear();
        self.out = OutBuf::default();
        self.inb = InBuf::default();
        let lost = self.peers.iter().map(|&peer| OobEvent::PeerLost { peer });
        self.events.extend(lost);
    }

    /// Queues the bindings changed since the last call.
    fn queue_bindings(&mut self) {
        let Some(changes) = self.bindings.take() else {
            return;
        };
        for (local_qpn, to) in changes {
            match to {
                Some((peer, peer_qpn)) => {
                    let mut body = [0u8; 12];
                    body[..4].copy_from_slice(&local_qpn.to_be_bytes());
                    body[4..8].copy_from_slice(&peer.octets());
                    body[8..].copy_from_slice(&peer_qpn.to_be_bytes());
                    self.out.push(KIND_BIND, &body);
                    self.note_peer(peer);
                }
                None => self.out.push(KIND_UNBIND, &local_qpn.to_be_bytes()),
            }
            self.stats.bindings_sent += 1;
        }
    }

    /// Queues pending bindings and writes what the stream takes.
    fn flush(&mut self) {
        if self.lost {
            return;
        }
        self.queue_bindings();
        if !self.out.is_empty() {
            if let Err(e) = self.out.flush(&mut self.stream) {
                self.lose(format_args!("writing to the daemon: {e}"));
            }
        }
    }

    /// Reads what arrived and decodes it into events and capabilities.
    fn read(&mut self) {
        if self.lost || self.events.len() >= self.cfg.max_events {
            return;
        }
        match self.inb.fill(&mut self.stream) {
            Ok(Fill::Data) => {}
            Ok(Fill::Idle) => return,
            Ok(Fill::Eof) => {
                if self.inb.buffered() > 0 {
                    let n = self.inb.buffered();
                    return self.lose(format_args!(
                        "the daemon closed the relay inside a frame ({n} bytes left)"
                    ));
                }
                return self.lose(format_args!("the daemon closed the relay"));
            }
            Err(e) => return self.lose(format_args!("reading from the daemon: {e}")),
        }
        loop {
            match self.inb.next(Notice::decode) {
                Ok(None) => break,
                Ok(Some(Notice::Event(ev))) => {
                    self.stats.events_received += 1;
                    match ev {
                        OobEvent::PeerLost { peer } => {
                            self.caps.remove(&peer);
                        }
                        _ => {
                            if let Some((from, _)) = record_of(&ev) {
                                self.note_peer(from);
                            }
                        }
                    }
                    self.events.push_back(ev);
                }
                Ok(Some(Notice::Caps { peer, caps })) => {
                    self.stats.caps_received += 1;
                    match caps {
                        Some(c) => {
                            self.caps.insert(peer, c);
                        }
                        None => {
                            self.caps.remove(&peer);
                        }
                    }
                }
                Err(e) => return self.lose(format_args!("malformed frame from the daemon: {e}")),
            }
        }
    }

    fn queue(&mut self, peer: Ipv4Addr, record: &Record) -> Result<(), PlatformError> {
        if self.lost {
            return Err(PlatformError::Disconnected { peer });
        }
        let len = record
            .to_bytes()
            .map_err(|_| PlatformError::Os(libc::EINVAL))?
            .len();
        // The length field, version and kind, the IP, the record.
        let frame = 4 + 2 + 4 + len;
        if self.out.len() + frame > self.cfg.max_queued_bytes {
            self.flush();
            if self.lost {
                return Err(PlatformError::Disconnected { peer });
            }
            if self.out.len() + frame > self.cfg.max_queued_bytes {
                self.stats.would_block += 1;
                return Err(PlatformError::WouldBlock);
            }
        }
        // Bindings made before this send go first.
        self.queue_bindings();
        push_record(&mut self.out, KIND_RECORD, peer, record)
            .map_err(|_| PlatformError::Os(libc::EINVAL))?;
        self.stats.records_sent += 1;
        self.note_peer(peer);
        self.flush();
        Ok(())
    }
}

impl<S: RelayStream + AsRawFd> AsRawFd for RelayClient<S> {
    /// The stream to the daemon: readable when events may have arrived.
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl<S: RelayStream> OobTransport for RelayClient<S> {
    /// Queues `wr` for `peer` through the daemon. `WouldBlock` when
    /// [`RelayClientConfig::max_queued_bytes`] are waiting for the daemon, `Disconnected`
    /// once the daemon is lost.
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        self.queue(peer, &Record::RecvWr(*wr))
    }

    /// As [`RelayClient::send`]; the daemon's transport decides whether `peer` takes it.
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        self.queue(peer, &Record::RecvTooShort(*rec))
    }

    /// As [`RelayClient::send`]; a request for a peer without ATOMICS comes back as a reply
    /// of status unsupported, made by the daemon's transport.
    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        let record = match *msg {
            AtomicMessage::Request(r) => Record::AtomicRequest(r),
            AtomicMessage::Reply(r) => Record::AtomicReply(r),
        };
        self.queue(peer, &record)
    }

    /// As [`RelayClient::send`]. A daemon transport without access checks drops it (the
    /// hub counts it in [`RelayHubStats::send_errors`]): the check goes unanswered, as
    /// with a peer that lacks ACCESS_CHECKS.
    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        let record = match *msg {
            CheckMessage::Check(c) => Record::AccessCheck(c),
            CheckMessage::Verdict(v) => Record::AccessVerdict(v),
        };
        self.queue(peer, &record)
    }

    /// The capabilities the daemon last reported for `peer` (`None` while unknown, and
    /// once the daemon is lost).
    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<Capabilities> {
        self.caps.get(&peer).copied()
    }

    fn poll(&mut self) -> Option<OobEvent> {
        if self.bindings.0.dirty.load(Ordering::Relaxed) {
            self.flush();
        }
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        if self.lost {
            return None;
        }
        self.flush();
        self.read();
        self.events.pop_front()
    }

    fn bind(
        &mut self,
        local: bluerdma_core::keys::Qpn,
        peer: Ipv4Addr,
        peer_qpn: bluerdma_core::keys::Qpn,
    ) {
        if let Err(e) = RelayClient::bind(self, local.get(), peer, peer_qpn.get()) {
            log::warn!(
                "relay: binding QP {:#x} to {peer} QP {:#x}: {e:?}",
                local.get(),
                peer_qpn.get()
            );
        }
    }

    fn unbind(&mut self, local: bluerdma_core::keys::Qpn) {
        if let Err(e) = RelayClient::unbind(self, local.get()) {
            log::warn!("relay: unbinding QP {:#x}: {e:?}", local.get());
        }
    }
}

// ---------------------------------------------------------------------------------------
// The hub
// ---------------------------------------------------------------------------------------

/// Which local QPNs a client owns: the events for them go to it, and it may send and bind
/// only for them.
pub enum QpOwner {
    /// The QPNs whose QP table index (`qpn >> 8`) lies in the range.
    Indices(Range<u32>),
    /// The QPNs for which the function says `true`.
    Predicate(Box<dyn Fn(u32) -> bool + Send>),
}

impl QpOwner {
    /// Whether `qpn` is one of the client's.
    pub fn owns(&self, qpn: u32) -> bool {
        match self {
            QpOwner::Indices(r) => qpn <= MAX_QPN && r.contains(&(qpn >> 8)),
            QpOwner::Predicate(f) => f(qpn),
        }
    }
}

impl From<Range<u32>> for QpOwner {
    fn from(indices: Range<u32>) -> Self {
        QpOwner::Indices(indices)
    }
}

impl fmt::Debug for QpOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpOwner::Indices(r) => write!(f, "QP indices {r:?}"),
            QpOwner::Predicate(_) => f.write_str("QPNs of a predicate"),
        }
    }
}

/// A client of a [`RelayHub`], from [`RelayHub::add_client`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "relay client {}", self.0)
    }
}

/// The bounds of a [`RelayHub`].
#[derive(Clone, Copy, Debug)]
pub struct RelayHubConfig {
    /// Bytes of frames written to a client's stream and not yet taken by it. A client
    /// beyond has stopped reading: it is dropped (with an error log), so that it cannot
    /// hold up the others or grow the daemon.
    pub max_backlog_bytes: usize,
    /// Records held for peer QPs that no client has bound yet; more are dropped.
    pub max_held: usize,
    /// Bindings of removed clients remembered, so that their records are dropped rather
    /// than held; the oldest are forgotten beyond.
    pub max_tombstones: usize,
    /// Peers whose capabilities the hub tracks.
    pub max_peers: usize,
    /// Frames taken from one client in one pump.
    pub frames_per_pump: usize,
    /// Events taken from the real transport in one pump.
    pub events_per_pump: usize,
    /// How often an idle hub asks the real transport for its peers' capabilities.
    pub caps_interval: Duration,
}

impl Default for RelayHubConfig {
    /// 8 MiB of backlog per client, 4096 held records, 4096 tombstones, 1024 peers, 1024
    /// frames per client and 4096 events per pump, capabilities every 20 ms when idle.
    fn default() -> Self {
        RelayHubConfig {
            max_backlog_bytes: 8 << 20,
            max_held: 4096,
            max_tombstones: 4096,
            max_peers: 1024,
            frames_per_pump: 1024,
            events_per_pump: 4096,
            caps_interval: Duration::from_millis(20),
        }
    }
}

/// Counters of a [`RelayHub`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayHubStats {
    /// Gauge: clients now.
    pub clients: u64,
    /// Clients added.
    pub clients_added: u64,
    /// Clients removed by [`RelayHub::remove_client`].
    pub clients_removed: u64,
    /// Clients dropped by the hub: stream closed or broken, malformed frame, backlog full.
    pub clients_lost: u64,
    /// Malformed frames from clients (each dropped its client).
    pub protocol_errors: u64,
    /// Clients dropped because they stopped reading (backlog full).
    pub clients_overrun: u64,
    /// Records from clients handed to the real transport.
    pub records_forwarded: u64,
    /// Times the real transport said `WouldBlock` (the record waits and is retried).
    pub would_block: u64,
    /// Records the real transport refused otherwise (dropped, logged).
    pub send_errors: u64,
    /// Records from a client for a QPN it does not own (refused).
    pub sends_refused: u64,
    /// Bindings and unbindings taken.
    pub binds: u64,
    /// Bindings and unbindings for a QPN the client does not own (refused).
    pub binds_refused: u64,
    /// Events that went to the client of their QP.
    pub events_routed: u64,
    /// Events that went to every client (lost peers).
    pub events_broadcast: u64,
    /// Events held for a peer QP no client had bound (delivered when one binds it).
    pub events_held: u64,
    /// Held events dropped: the holding space was full, or their peer was lost.
    pub events_held_dropped: u64,
    /// Events dropped because no client owns their QP, or its client is gone.
    pub events_unowned: u64,
    /// Events the hub could not encode (a QPN wider than 24 bits from the transport).
    pub events_malformed: u64,
    /// Capability changes told to the clients.
    pub caps_updates: u64,
}

impl fmt::Display for RelayHubStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "clients={} added={} removed={} lost={} protocol_errors={} overrun={} \
             forwarded={} would_block={} send_errors={} sends_refused={} binds={} \
             binds_refused={} routed={} broadcast={} held={} held_dropped={} unowned={} \
             malformed={} caps_updates={}",
            self.clients,
            self.clients_added,
            self.clients_removed,
            self.clients_lost,
            self.protocol_errors,
            self.clients_overrun,
            self.records_forwarded,
            self.would_block,
            self.send_errors,
            self.sends_refused,
            self.binds,
            self.binds_refused,
            self.events_routed,
            self.events_broadcast,
            self.events_held,
            self.events_held_dropped,
            self.events_unowned,
            self.events_malformed,
            self.caps_updates
        )
    }
}

/// Who takes the records of a peer QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// This client's QP.
    Client(ClientId, u32),
    /// A client that is gone: its records are dropped.
    Gone,
}

/// A peer QP: the peer's IP and QPN.
type PeerQp = (Ipv4Addr, u32);

struct HubClient<S> {
    id: ClientId,
    stream: S,
    owner: QpOwner,
    inb: InBuf,
    out: OutBuf,
    /// Decoded frames not yet carried out (the first waits if the transport blocked).
    pending: VecDeque<Request>,
    /// Dropped by the hub, to be reaped at the end of the pump.
    gone: bool,
}

/// The daemon's side: owns the device's real out-of-band transport and serves the
/// [`RelayClient`]s of the processes that share the device (see the module docs).
pub struct RelayHub<S: RelayStream = UnixStream> {
    real: Box<dyn OobTransport + Send>,
    cfg: RelayHubConfig,
    clients: Vec<HubClient<S>>,
    next_id: u64,
    bound: HashMap<PeerQp, Bound>,
    by_local: HashMap<(ClientId, u32), PeerQp>,
    tombstones: VecDeque<PeerQp>,
    held: VecDeque<OobEvent>,
    /// Tracked peers and the capabilities last told to the clients.
    peers: HashMap<Ipv4Addr, Option<Capabilities>>,
    caps_checked: Instant,
    gone: Vec<ClientId>,
    stats: RelayHubStats,
    drop_log: LogBudget,
    client_log: LogBudget,
}

impl<S: RelayStream> fmt::Debug for RelayHub<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayHub")
            .field("stats", &self.stats)
            .finish()
    }
}

/// The real transport refused a record with `WouldBlock`: it waits.
struct Blocked;

impl<S: RelayStream> RelayHub<S> {
    /// A hub without clients over the device's transport.
    pub fn new(real: Box<dyn OobTransport + Send>, cfg: RelayHubConfig) -> Self {
        let now = Instant::now();
        RelayHub {
            real,
            cfg,
            clients: Vec::new(),
            next_id: 1,
            bound: HashMap::new(),
            by_local: HashMap::new(),
            tombstones: VecDeque::new(),
            held: VecDeque::new(),
            peers: HashMap::new(),
            caps_checked: now,
            gone: Vec::new(),
            stats: RelayHubStats::default(),
            drop_log: LogBudget::new(now),
            client_log: LogBudget::new(now),
        }
    }

    /// Serves a client connected over `stream` (switched to non-blocking mode) that owns
    /// the QPNs of `owner`. It is told the capabilities known now.
    pub fn add_client(&mut self, stream: S, owner: impl Into<QpOwner>) -> io::Result<ClientId> {
        stream.set_nonblocking()?;
        let id = ClientId(self.next_id);
        self.next_id += 1;
        let mut out = OutBuf::default();
        for (&peer, &caps) in &self.peers {
            if caps.is_some() {
                let _ = Notice::Caps { peer, caps }.push(&mut out);
            }
        }
        let owner = owner.into();
        log::info!("OOB relay: {id} added, owning {owner:?}");
        self.clients.push(HubClient {
            id,
            stream,
            owner,
            inb: InBuf::default(),
            out,
            pending: VecDeque::new(),
            gone: false,
        });
        self.stats.clients_added += 1;
        self.stats.clients = self.clients.len() as u64;
        Ok(id)
    }

    /// Stops serving `id` and closes its stream; its later records are dropped (counted
    /// in [`RelayHubStats::events_unowned`]). `false` if there is no such client.
    pub fn remove_client(&mut self, id: ClientId) -> bool {
        let Some(k) = self.clients.iter().position(|c| c.id == id) else {
            return false;
        };
        self.clients.remove(k);
        self.forget(id);
        self.stats.clients_removed += 1;
        self.stats.clients = self.clients.len() as u64;
        log::info!("OOB relay: {id} removed");
        true
    }

    /// The clients the hub dropped by itself (stream closed or broken, malformed frame,
    /// backlog full) since the last call, so that the daemon can free what they held.
    pub fn take_gone(&mut self) -> Vec<ClientId> {
        std::mem::take(&mut self.gone)
    }

    /// The clients served now.
    pub fn clients(&self) -> Vec<ClientId> {
        self.clients.iter().map(|c| c.id).collect()
    }

    /// The counters now.
    pub fn stats(&self) -> RelayHubStats {
        self.stats
    }

    /// The real transport.
    pub fn transport_mut(&mut self) -> &mut (dyn OobTransport + Send) {
        &mut *self.real
    }

    /// One round of work: carries out the clients' frames on the real transport, routes
    /// the transport's events to their clients, tells capability changes, writes to the
    /// clients and drops the clients that are gone. `true` if anything happened; an idle
    /// pump is one read per client and one poll of the transport.
    pub fn pump(&mut self) -> bool {
        let now = Instant::now();
        let mut work = false;
        for k in 0..self.clients.len() {
            work |= self.serve(k, now);
        }
        for _ in 0..self.cfg.events_per_pump {
            let Some(ev) = self.real.poll() else {
                break;
            };
            work = true;
            self.route(ev, now);
        }
        let since = now.saturating_duration_since(self.caps_checked);
        if (work && since >= Duration::from_millis(1)) || since >= self.cfg.caps_interval {
            self.caps_checked = now;
            work |= self.refresh_caps();
        }
        for k in 0..self.clients.len() {
            work |= self.write(k);
        }
        self.reap();
        work
    }

    /// Reads client `k`'s frames and carries them out until the transport blocks.
    fn serve(&mut self, k: usize, now: Instant) -> bool {
        let mut work = false;
        let Some(c) = self.clients.get_mut(k) else {
            return false;
        };
        if c.gone {
            return false;
        }
        if c.pending.is_empty() {
            if c.inb.buffered() < 4 * READ_CHUNK {
                match c.inb.fill(&mut c.stream) {
                    Ok(Fill::Data) => work = true,
                    Ok(Fill::Idle) => {}
                    Ok(Fill::Eof) => {
                        let (id, left) = (c.id, c.inb.buffered());
                        c.gone = true;
                        self.stats.clients_lost += 1;
                        if left > 0 {
                            log::warn!("OOB relay: {id} closed its stream inside a frame ({left} bytes left)");
                        } else {
                            log::info!("OOB relay: {id} closed its stream");
                        }
                        return true;
                    }
                    Err(e) => {
                        let id = c.id;
                        c.gone = true;
                        self.stats.clients_lost += 1;
                        log::warn!("OOB relay: reading from {id}: {e}; client dropped");
                        return true;
                    }
                }
            }
            while c.pending.len() < self.cfg.frames_per_pump.max(1) {
                match c.inb.next(Request::decode) {
                    Ok(Some(req)) => c.pending.push_back(req),
                    Ok(None) => break,
                    Err(e) => {
                        let id = c.id;
                        c.gone = true;
                        self.stats.protocol_errors += 1;
                        self.stats.clients_lost += 1;
                        log::error!("OOB relay: {id} sent a malformed frame: {e}; client dropped");
                        // What it sent before the bad frame is still carried out.
                        break;
                    }
                }
            }
        }
        while let Some(req) = self.clients.get_mut(k).and_then(|c| c.pending.pop_front()) {
            work = true;
            if self.execute(k, req, now).is_err() {
                if let Some(c) = self.clients.get_mut(k) {
                    c.pending.push_front(req);
                }
                break;
            }
        }
        work
    }

    /// Carries out one frame of client `k`.
    fn execute(&mut self, k: usize, req: Request, now: Instant) -> Result<(), Blocked> {
        let Some(c) = self.clients.get(k) else {
            return Ok(());
        };
        let id = c.id;
        match req {
            Request::Record { peer, record } => {
                let own = own_qpn(&record);
                let ev = event_of(peer, record);
                if !c.owner.owns(own) {
                    self.stats.sends_refused += 1;
                    if let Some(skipped) = self.client_log.take(now) {
                        log::error!(
                            "OOB relay: {id} sent a {} to {peer} from QP {own:#x}, which it does not own; refused{skipped}",
                            describe(&ev)
                        );
                    }
                    return Ok(());
                }
                self.note_peer(peer, now);
                let sent = match record {
                    Record::RecvWr(wr) => self.real.send(peer, &wr),
                    Record::RecvTooShort(r) => self.real.send_too_short(peer, &r),
                    Record::AtomicRequest(r) => {
                        self.real.send_atomic(peer, &AtomicMessage::Request(r))
                    }
                    Record::AtomicReply(r) => self.real.send_atomic(peer, &AtomicMessage::Reply(r)),
                    Record::AccessCheck(c) => self.real.send_check(peer, &CheckMessage::Check(c)),
                    Record::AccessVerdict(v) => {
                        self.real.send_check(peer, &CheckMessage::Verdict(v))
                    }
                };
                match sent {
                    Ok(()) => self.stats.records_forwarded += 1,
                    Err(PlatformError::WouldBlock) => {
                        self.stats.would_block += 1;
                        return Err(Blocked);
                    }
                    Err(e) => {
                        self.stats.send_errors += 1;
                        if let Some(skipped) = self.client_log.take(now) {
                            log::warn!(
                                "OOB relay: {id}'s {} to {peer} (QP {own:#x}): {e}; dropped{skipped}",
                                describe(&ev)
                            );
                        }
                    }
                }
            }
            Request::Bind {
                local_qpn,
                peer,
                peer_qpn,
            } => {
                if !c.owner.owns(local_qpn) {
                    return self.refuse_bind(id, local_qpn, now);
                }
                self.stats.binds += 1;
                self.bind(k, id, local_qpn, (peer, peer_qpn), now);
            }
            Request::Unbind { local_qpn } => {
                if !c.owner.owns(local_qpn) {
                    return self.refuse_bind(id, local_qpn, now);
                }
                self.stats.binds += 1;
                if let Some(key) = self.by_local.remove(&(id, local_qpn)) {
                    if self.bound.get(&key) == Some(&Bound::Client(id, local_qpn)) {
                        self.bound.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }

    fn refuse_bind(&mut self, id: ClientId, qpn: u32, now: Instant) -> Result<(), Blocked> {
        self.stats.binds_refused += 1;
        if let Some(skipped) = self.client_log.take(now) {
            log::error!(
                "OOB relay: {id} bound QP {qpn:#x}, which it does not own; refused{skipped}"
            );
        }
        Ok(())
    }

    /// Client `k`'s QP `local_qpn` takes the records of peer QP `key` from now on, and
    /// those held for it.
    fn bind(&mut self, k: usize, id: ClientId, local_qpn: u32, key: PeerQp, now: Instant) {
        if let Some(old) = self.by_local.insert((id, local_qpn), key) {
            if old != key && self.bound.get(&old) == Some(&Bound::Client(id, local_qpn)) {
                self.bound.remove(&old);
            }
        }
        match self.bound.insert(key, Bound::Client(id, local_qpn)) {
            Some(Bound::Client(other, other_qpn)) if (other, other_qpn) != (id, local_qpn) => {
                log::warn!(
                    "OOB relay: peer QP {:#x} at {} was bound to {other} QP {other_qpn:#x}, now to {id} QP {local_qpn:#x}",
                    key.1,
                    key.0
                );
                self.by_local.remove(&(other, other_qpn));
            }
            Some(Bound::Gone) => self.tombstones.retain(|t| *t != key),
            _ => {}
        }
        self.note_peer(key.0, now);
        if self
            .held
            .iter()
            .any(|ev| route_of(ev) == Route::Peer(key.0, key.1))
        {
            let mut mine = Vec::new();
            self.held.retain(|ev| {
                let hit = route_of(ev) == Route::Peer(key.0, key.1);
                if hit {
                    mine.push(*ev);
                }
                !hit
            });
            for ev in mine {
                self.stats.events_routed += 1;
                self.deliver(k, &Notice::Event(ev));
            }
        }
    }

    /// Sends an event from the real transport where it belongs.
    fn route(&mut self, ev: OobEvent, now: Instant) {
        match route_of(&ev) {
            Route::All => {
                self.stats.events_broadcast += 1;
                if let OobEvent::PeerLost { peer } = ev {
                    self.drop_held_from(peer, now);
                }
                for k in 0..self.clients.len() {
                    self.deliver(k, &Notice::Event(ev));
                }
            }
            Route::Local(qpn) => {
                if let Some((from, _)) = record_of(&ev) {
                    self.note_peer(from, now);
                }
                match self
                    .clients
                    .iter()
                    .position(|c| !c.gone && c.owner.owns(qpn))
                {
                    Some(k) => {
                        self.stats.events_routed += 1;
                        self.deliver(k, &Notice::Event(ev));
                    }
                    None => self.drop_unowned(&ev, qpn, "no client owns that QP", now),
                }
            }
            Route::Peer(from, peer_qpn) => {
                self.note_peer(from, now);
                match self.bound.get(&(from, peer_qpn)).copied() {
                    Some(Bound::Client(id, qpn)) => {
                        match self.clients.iter().position(|c| c.id == id && !c.gone) {
                            Some(k) => {
                                self.stats.events_routed += 1;
                                self.deliver(k, &Notice::Event(ev));
                            }
                            None => self.drop_unowned(&ev, qpn, "its client is gone", now),
                        }
                    }
                    Some(Bound::Gone) => {
                        self.drop_unowned(&ev, peer_qpn, "the client of that peer QP is gone", now)
                    }
                    None if self.held.len() < self.cfg.max_held => {
                        self.stats.events_held += 1;
                        self.held.push_back(ev);
                    }
                    None => {
                        self.stats.events_held_dropped += 1;
                        if let Some(skipped) = self.drop_log.take(now) {
                            log::error!(
                                "OOB relay: {} from {from} for peer QP {peer_qpn:#x} dropped: no client bound that peer QP and {} records already wait{skipped}",
                                describe(&ev),
                                self.held.len()
                            );
                        }
                    }
                }
            }
        }
    }

    fn drop_unowned(&mut self, ev: &OobEvent, qpn: u32, why: &str, now: Instant) {
        self.stats.events_unowned += 1;
        if let Some(skipped) = self.drop_log.take(now) {
            let from = record_of(ev).map_or(Ipv4Addr::UNSPECIFIED, |(f, _)| f);
            log::warn!(
                "OOB relay: {} from {from} for QP {qpn:#x} dropped: {why}{skipped}",
                describe(ev)
            );
        }
    }

    /// `peer` is lost: the records it sent for peer QPs nobody bound go with it.
    fn drop_held_from(&mut self, peer: Ipv4Addr, now: Instant) {
        let before = self.held.len();
        self.held
            .retain(|ev| !matches!(route_of(ev), Route::Peer(from, _) if from == peer));
        let dropped = before - self.held.len();
        if dropped > 0 {
            self.stats.events_held_dropped += dropped as u64;
            if let Some(skipped) = self.drop_log.take(now) {
                log::warn!(
                    "OOB relay: {peer} is lost: {dropped} of its records for peer QPs no client bound dropped{skipped}"
                );
            }
        }
    }

    /// Queues `notice` for client `k`; a client whose backlog overflows is dropped.
    fn deliver(&mut self, k: usize, notice: &Notice) {
        let Some(c) = self.clients.get_mut(k) else {
            return;
        };
        if c.gone {
            return;
        }
        if let Err(e) = notice.push(&mut c.out) {
            self.stats.events_malformed += 1;
            log::error!(
                "OOB relay: an event for {} cannot be encoded: {e}; dropped",
                c.id
            );
            return;
        }
        if c.out.len() > self.cfg.max_backlog_bytes {
            c.gone = true;
            self.stats.clients_overrun += 1;
            self.stats.clients_lost += 1;
            log::error!(
                "OOB relay: {} does not read its events ({} bytes wait); client dropped",
                c.id,
                c.out.len()
            );
        }
    }

    /// Writes what is queued for client `k`.
    fn write(&mut self, k: usize) -> bool {
        let Some(c) = self.clients.get_mut(k) else {
            return false;
        };
        if c.gone || c.out.is_empty() {
            return false;
        }
        let before = c.out.len();
        if let Err(e) = c.out.flush(&mut c.stream) {
            c.gone = true;
            self.stats.clients_lost += 1;
            log::warn!("OOB relay: writing to {}: {e}; client dropped", c.id);
            return true;
        }
        c.out.len() != before
    }

    /// Tracks `peer`'s capabilities from now on.
    fn note_peer(&mut self, peer: Ipv4Addr, now: Instant) {
        if self.peers.contains_key(&peer) {
            return;
        }
        if self.peers.len() >= self.cfg.max_peers {
            if let Some(skipped) = self.drop_log.take(now) {
                log::warn!(
                    "OOB relay: {} peers tracked; the capabilities of {peer} are not told to the clients{skipped}",
                    self.peers.len()
                );
            }
            return;
        }
        self.peers.insert(peer, None);
    }

    /// Asks the transport for every tracked peer's capabilities and tells the clients
    /// those that changed; `true` if any did.
    fn refresh_caps(&mut self) -> bool {
        let mut changed = Vec::new();
        for (&peer, last) in self.peers.iter_mut() {
            let now = self.real.peer_capabilities(peer);
            if now != *last {
                *last = now;
                changed.push(Notice::Caps { peer, caps: now });
            }
        }
        for notice in &changed {
            self.stats.caps_updates += 1;
            for k in 0..self.clients.len() {
                self.deliver(k, notice);
            }
        }
        !changed.is_empty()
    }

    /// Drops the clients marked gone.
    fn reap(&mut self) {
        if !self.clients.iter().any(|c| c.gone) {
            return;
        }
        let mut k = 0;
        while k < self.clients.len() {
            if self.clients.get(k).is_some_and(|c| c.gone) {
                let c = self.clients.remove(k);
                self.forget(c.id);
                self.gone.push(c.id);
            } else {
                k += 1;
            }
        }
        self.stats.clients = self.clients.len() as u64;
    }

    /// Client `id` is gone: its bindings become tombstones, so that records for them are
    /// dropped (not held for a later binding).
    fn forget(&mut self, id: ClientId) {
        let mine: Vec<(u32, PeerQp)> = self
            .by_local
            .iter()
            .filter(|((c, _), _)| *c == id)
            .map(|(&(_, local), &key)| (local, key))
            .collect();
        for (local, key) in mine {
            self.by_local.remove(&(id, local));
            if self.bound.get(&key) == Some(&Bound::Client(id, local)) {
                self.bound.insert(key, Bound::Gone);
                self.tombstones.push_back(key);
            }
        }
        while self.tombstones.len() > self.cfg.max_tombstones {
            if let Some(old) = self.tombstones.pop_front() {
                if self.bound.get(&old) == Some(&Bound::Gone) {
                    self.bound.remove(&old);
                }
            }
        }
    }
}

impl<S: RelayStream + AsRawFd> RelayHub<S> {
    /// The client streams to wait on, and for each whether the hub has bytes to write
    /// (wait for writability too). With the real transport's own wake-up, a daemon can
    /// sleep in `poll(2)` instead of calling [`RelayHub::pump`] in a loop.
    pub fn fds(&self) -> Vec<(RawFd, bool)> {
        self.clients
            .iter()
            .filter(|c| !c.gone)
            .map(|c| (c.stream.as_raw_fd(), !c.out.is_empty()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bluerdma_core::oob::{AccessCheck, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus};

    fn frames(out: &OutBuf) -> InBuf {
        InBuf {
            buf: out.buf.clone(),
            start: out.pos,
        }
    }

    fn records() -> Vec<Record> {
        let req = AtomicRequest {
            qpn: 0x105,
            dest_qpn: 0x20a,
            seq: 7,
            raddr: 0x1000,
            rkey: 0x300,
            op: AtomicOp::CompareSwap {
                compare: 1,
                swap: 2,
            },
        };
        vec![
            Record::RecvWr(RecvWr {
                wr_id: 1,
                addr: 2,
                length: 3,
                lkey: 4,
                qpn: 0x105,
            }),
            Record::RecvTooShort(RecvTooShort {
                wr_id: 9,
                send_len: 100,
                qpn: 0x105,
            }),
            Record::AtomicRequest(req),
            Record::AtomicReply(AtomicReply::refusal(&req, AtomicStatus::Unsupported)),
            Record::AccessCheck(AccessCheck {
                psn: 5,
                addr: 0x2000,
                len: 64,
                rkey: 0x400,
                qpn: 0x105,
                ..AccessCheck::default()
            }),
        ]
    }

    #[test]
    fn every_oob_record_and_notice_survives_a_frame() {
        let ip = Ipv4Addr::new(10, 0, 0, 2);
        let mut out = OutBuf::default();
        for r in records() {
            push_record(&mut out, KIND_RECORD, ip, &r).unwrap();
        }
        let mut inb = frames(&out);
        for r in records() {
            let got = inb.next(Request::decode).unwrap();
            assert_eq!(
                got,
                Some(Request::Record {
                    peer: ip,
                    record: r
                })
            );
        }
        assert_eq!(inb.next(Request::decode).unwrap(), None);

        let mut out = OutBuf::default();
        let notices: Vec<Notice> = records()
            .into_iter()
            .map(|r| Notice::Event(event_of(ip, r)))
            .chain([
                Notice::Event(OobEvent::PeerLost { peer: ip }),
                Notice::Caps {
                    peer: ip,
                    caps: Some(Capabilities::OURS),
                },
                Notice::Caps {
                    peer: ip,
                    caps: None,
                },
            ])
            .collect();
        for n in &notices {
            n.push(&mut out).unwrap();
        }
        let mut inb = frames(&out);
        for n in notices {
            assert_eq!(inb.next(Notice::decode).unwrap(), Some(n));
        }
    }

    #[test]
    fn a_frame_split_anywhere_waits_for_its_end() {
        let mut out = OutBuf::default();
        push_record(&mut out, KIND_RECORD, Ipv4Addr::LOCALHOST, &records()[2]).unwrap();
        let whole = out.buf.clone();
        for cut in 0..whole.len() {
            let mut inb = InBuf {
                buf: whole[..cut].to_vec(),
                start: 0,
            };
            assert_eq!(inb.next(Request::decode).unwrap(), None, "cut at {cut}");
            inb.buf.extend_from_slice(&whole[cut..]);
            assert!(inb.next(Request::decode).unwrap().is_some());
        }
    }

    #[test]
    fn malformed_oob_relay_frames_are_named() {
        let ip = [127, 0, 0, 1];
        let record = records()[0].to_bytes().unwrap();
        let frame = |len: u32, version: u8, kind: u8, body: &[u8]| {
            let mut f = len.to_be_bytes().to_vec();
            f.extend_from_slice(&[version, kind]);
            f.extend_from_slice(body);
            f
        };
        let mut good_body = ip.to_vec();
        good_body.extend_from_slice(&record);
        let mut bad_kind = good_body.clone();
        bad_kind[4 + 28..].copy_from_slice(&9u32.to_be_bytes());
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (frame(0, 1, 1, &[]), FrameError::Length { len: 0 }),
            (frame(1000, 1, 1, &[]), FrameError::Length { len: 1000 }),
            (
                frame(38, 2, 1, &good_body),
                FrameError::Version { theirs: 2 },
            ),
            (
                frame(38, 1, 0x81, &good_body),
                FrameError::UnknownKind { kind: 0x81 },
            ),
            (
                frame(10, 1, 1, &good_body[..8]),
                FrameError::BodySize { kind: 1, len: 8 },
            ),
            (
                frame(38, 1, 1, &bad_kind),
                FrameError::Record(OobError::UnknownRecordKind { kind: 9 }),
            ),
            (
                frame(14, 1, KIND_BIND, &[1, 0, 0, 0, 127, 0, 0, 1, 0, 0, 0, 1]),
                FrameError::Field {
                    what: "local QPN",
                    value: 0x0100_0000,
                },
            ),
        ];
        for (bytes, want) in cases {
            let mut inb = InBuf {
                buf: bytes,
                start: 0,
            };
            assert_eq!(inb.next(Request::decode), Err(want));
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn each_oob_event_routes_by_the_field_that_names_our_qp() {
        let from = Ipv4Addr::new(10, 0, 0, 2);
        let r = records();
        let route = |rec: Record| route_of(&event_of(from, rec));
        // Peer-named records: the peer's QPN at the source.
        assert_eq!(route(r[0]), Route::Peer(from, 0x105));
        assert_eq!(route(r[1]), Route::Peer(from, 0x105));
        assert_eq!(route(r[4]), Route::Peer(from, 0x105));
        // Atomics name our QP: the request's destination, the reply's destination.
        assert_eq!(route(r[2]), Route::Local(0x20a));
        assert_eq!(route(r[3]), Route::Local(0x105));
        assert_eq!(route_of(&OobEvent::PeerLost { peer: from }), Route::All);
    }

    #[test]
    fn owners_by_index_range() {
        let owner = QpOwner::from(1..4);
        assert!(owner.owns(0x105) && owner.owns(0x3ff));
        assert!(!owner.owns(0x0ff) && !owner.owns(0x400) && !owner.owns(0x100_0105));
    }
}
