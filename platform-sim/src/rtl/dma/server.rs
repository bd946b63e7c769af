//! The card side of the DMA channel (serve mode): the emulated NIC's [`DmaPort`] spoken as
//! the simulator's per-beat messages to a driver connected over TCP.

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bluerdma_core::addr::DeviceAddr;

use super::{
    beats, dma_port, request_id, BusWidth, DmaBeat, DmaChannel, MemReadMsg, MemWriteMsg, ReadReply,
};
use crate::mem::{DmaFault, DmaPort};
use crate::rtl::line::{excerpt, trim, Line, LineReader};
use crate::rtl::listener::{accept_loop, bind_loopback};

/// Read beats sent ahead of their replies. Bounds what either side buffers, so a large read
/// cannot fill both sockets and deadlock.
const READ_WINDOW: usize = 16;

/// How a [`DmaServer`] listens and waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaServerConfig {
    /// TCP port on 127.0.0.1 ([`dma_port`] of the instance; 0 picks a free port).
    pub port: u16,
    /// The data bus width, which sets the beat size.
    pub bus: BusWidth,
    /// How long an access waits for each read reply before the connection is declared broken.
    pub reply_timeout: Duration,
    /// How long an access waits for a driver to connect before it fails.
    pub driver_wait: Duration,
}

impl DmaServerConfig {
    /// The defaults for simulator instance `inst`.
    pub fn for_instance(inst: u8) -> Self {
        DmaServerConfig {
            port: dma_port(inst),
            bus: BusWidth::Bits256,
            reply_timeout: Duration::from_secs(10),
            driver_wait: Duration::from_secs(10),
        }
    }
}

impl Default for DmaServerConfig {
    /// The one-card loopback bench (instance 1, port 7003).
    fn default() -> Self {
        Self::for_instance(1)
    }
}

/// Why a DMA access through a [`DmaServer`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmaLinkError {
    /// No driver connected within the configured wait.
    NoDriver {
        /// How long the access waited.
        waited: Duration,
    },
    /// `addr + len` does not fit in 64 bits.
    AddressOverflow {
        /// The access's device address.
        addr: u64,
        /// Its length.
        len: usize,
    },
    /// The socket failed.
    Io {
        /// The OS error kind.
        kind: io::ErrorKind,
        /// The error as printed.
        message: String,
    },
    /// The driver closed the connection.
    Closed,
    /// No reply to a read beat within the configured time.
    ReplyTimeout {
        /// The beat's request id.
        request_id: String,
        /// How long the access waited for it.
        waited: Duration,
    },
    /// A reply that is not the one expected next (wrong channel or request id, bad JSON).
    UnexpectedReply {
        /// The request id expected.
        expected: String,
        /// The reply line (shortened).
        got: String,
    },
    /// A reply whose data length differs from the beat's.
    WrongLength {
        /// The beat's request id.
        request_id: String,
        /// Bytes requested.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
}

impl DmaLinkError {
    fn io(e: &io::Error) -> Self {
        DmaLinkError::Io {
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// Whether the connection is out of step after this error, so it is dropped (the driver
    /// may then connect again).
    pub fn breaks_connection(&self) -> bool {
        !matches!(
            self,
            DmaLinkError::NoDriver { .. } | DmaLinkError::AddressOverflow { .. }
        )
    }
}

impl fmt::Display for DmaLinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaLinkError::NoDriver { waited } => {
                write!(f, "no driver connected to the DMA port within {waited:?}")
            }
            DmaLinkError::AddressOverflow { addr, len } => {
                write!(f, "DMA of {len} bytes at {addr:#x} wraps the address space")
            }
            DmaLinkError::Io { message, .. } => write!(f, "DMA socket error: {message}"),
            DmaLinkError::Closed => f.write_str("the driver closed the DMA connection"),
            DmaLinkError::ReplyTimeout { request_id, waited } => {
                write!(f, "no reply to {request_id} within {waited:?}")
            }
            DmaLinkError::UnexpectedReply { expected, got } => {
                write!(f, "expected the reply to {expected}, got {got:?}")
            }
            DmaLinkError::WrongLength {
                request_id,
                expected,
                got,
            } => write!(
                f,
                "reply to {request_id} carries {got} bytes instead of {expected}"
            ),
        }
    }
}

impl std::error::Error for DmaLinkError {}

/// What a [`DmaServer`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaServerStats {
    /// `mem_read` beats answered.
    pub read_beats: u64,
    /// `mem_write` beats sent.
    pub write_beats: u64,
    /// Accesses that failed.
    pub errors: u64,
    /// Driver connections taken.
    pub clients_accepted: u64,
    /// Connections closed at once because a live driver was already connected.
    pub clients_refused: u64,
    /// Whether a driver connection is held now (it may have died unnoticed since the last
    /// access).
    pub driver_connected: bool,
}

struct Connection {
    peer: SocketAddr,
    writer: BufWriter<TcpStream>,
    reader: LineReader<TcpStream>,
}

impl Connection {
    fn new(stream: TcpStream, reply_timeout: Duration) -> io::Result<Self> {
        stream.set_read_timeout(Some(reply_timeout))?;
        Ok(Connection {
            peer: stream.peer_addr()?,
            reader: LineReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
        })
    }

    /// Whether the driver is still there: an idle connection has nothing to read, so
    /// end-of-stream or an error means it is gone.
    fn is_alive(&self) -> bool {
        let stream = self.writer.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let alive = match stream.peek(&mut [0u8; 1]) {
            Ok(n) => n > 0,
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        alive && stream.set_nonblocking(false).is_ok()
    }

    fn send(&mut self, message: &impl serde::Serialize) -> Result<(), DmaLinkError> {
        serde_json::to_writer(&mut self.writer, message)
            .map_err(|e| DmaLinkError::io(&io::Error::from(e)))?;
        self.writer
            .write_all(b"\n")
            .map_err(|e| DmaLinkError::io(&e))
    }

    fn flush(&mut self) -> Result<(), DmaLinkError> {
        self.writer.flush().map_err(|e| DmaLinkError::io(&e))
    }

    /// Receives the reply to `beat` (request `id`) into `buf`.
    fn receive(
        &mut self,
        channel: DmaChannel,
        id: &str,
        beat: &DmaBeat,
        buf: &mut [u8],
        started: Instant,
    ) -> Result<(), DmaLinkError> {
        let line = loop {
            match self.reader.next_line() {
                Ok(Some(Line::Text(t))) if trim(t).is_empty() => continue,
                Ok(Some(Line::Text(t))) => break trim(t),
                Ok(Some(Line::TooLong(n))) => {
                    return Err(DmaLinkError::UnexpectedReply {
                        expected: id.to_owned(),
                        got: format!("a line of {n} bytes"),
                    })
                }
                Ok(None) => return Err(DmaLinkError::Closed),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(DmaLinkError::ReplyTimeout {
                        request_id: id.to_owned(),
                        waited: started.elapsed(),
                    })
                }
                Err(e) => return Err(DmaLinkError::io(&e)),
            }
        };
        let unexpected = || DmaLinkError::UnexpectedReply {
            expected: id.to_owned(),
            got: excerpt(line),
        };
        let reply: ReadReply = serde_json::from_slice(line).map_err(|_| unexpected())?;
        if reply.channel_id != u32::from(channel.id()) || reply.request_id != id {
            return Err(unexpected());
        }
        let target = buf
            .get_mut(beat.offset..beat.offset + beat.length)
            .ok_or_else(unexpected)?;
        if reply.data.len() != target.len() {
            return Err(DmaLinkError::WrongLength {
                request_id: id.to_owned(),
                expected: target.len(),
                got: reply.data.len(),
            });
        }
        target.copy_from_slice(&reply.data);
        Ok(())
    }
}

struct State {
    conn: Option<Connection>,
    /// Read beats issued per channel over the server's life: the `n` of `req_<ch>_<n>`.
    next_read: [u64; DmaChannel::COUNT as usize],
}

#[derive(Default)]
struct Counters {
    read_beats: AtomicU64,
    write_beats: AtomicU64,
    errors: AtomicU64,
    clients_accepted: AtomicU64,
    clients_refused: AtomicU64,
}

struct Shared {
    config: DmaServerConfig,
    state: Mutex<State>,
    connected: Condvar,
    stop: AtomicBool,
    counters: Counters,
    /// Called when the driver's connection ends ([`DmaServer::on_driver_gone`]).
    on_gone: Mutex<Option<DriverGone>>,
}

/// What the card does when its driver goes away.
type DriverGone = Box<dyn Fn() + Send + Sync>;

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock at worst leaves a connection out of step, which the
        // next access detects.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a new driver connection unless a live one is held.
    fn offer(&self, stream: TcpStream) {
        let mut state = self.state();
        if state.conn.as_ref().is_some_and(Connection::is_alive) {
            self.counters
                .clients_refused
                .fetch_add(1, Ordering::Relaxed);
            log::warn!("DMA server: refusing a second driver connection");
            return;
        }
        match Connection::new(stream, self.config.reply_timeout) {
            Ok(conn) => {
                log::info!("DMA server: driver connected from {}", conn.peer);
                state.conn = Some(conn);
                self.counters
                    .clients_accepted
                    .fetch_add(1, Ordering::Relaxed);
                self.connected.notify_all();
            }
            Err(e) => log::warn!("DMA server: dropping a driver connection: {e}"),
        }
    }

    /// Runs `op` on the driver connection, waiting for one if needed, and drops the
    /// connection if `op` leaves it out of step.
    fn with_connection(
        &self,
        op: impl FnOnce(
            &mut Connection,
            &mut [u64; DmaChannel::COUNT as usize],
        ) -> Result<(), DmaLinkError>,
    ) -> Result<(), DmaLinkError> {
        let started = Instant::now();
        let mut state = self.state();
        while state.conn.is_none() {
            let waited = started.elapsed();
            let left = self.config.driver_wait.saturating_sub(waited);
            if left.is_zero() || self.stop.load(Ordering::Acquire) {
                return Err(DmaLinkError::NoDriver { waited });
            }
            state = self
                .connected
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let State { conn, next_read } = &mut *state;
        let Some(c) = conn.as_mut() else {
            return Err(DmaLinkError::Closed);
        };
        let result = op(c, next_read);
        if let Err(e) = &result {
            if e.breaks_connection() {
                if *e == DmaLinkError::Closed {
                    // A driver that exits closes its connection: not an error of the card.
                    log::info!("DMA server: the driver closed its connection");
                } else {
                    log::error!("DMA server: dropping the driver connection: {e}");
                }
                if let Some(c) = conn.take() {
                    let _ = c.writer.get_ref().shutdown(Shutdown::Both);
                }
                if let Some(gone) = self
                    .on_gone
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                {
                    gone();
                }
            }
        }
        result
    }

    fn read(
        &self,
        channel: DmaChannel,
        addr: DeviceAddr,
        buf: &mut [u8],
    ) -> Result<(), DmaLinkError> {
        let bus = self.config.bus;
        self.with_connection(|conn, next_read| {
            let started = Instant::now();
            let first = next_read[usize::from(channel.id())];
            let mut pending = beats(addr.0, buf.len(), bus).enumerate();
            let mut outstanding: std::collections::VecDeque<(String, DmaBeat)> =
                std::collections::VecDeque::with_capacity(READ_WINDOW);
            loop {
                while outstanding.len() < READ_WINDOW {
                    let Some((i, beat)) = pending.next() else {
                        break;
                    };
                    let id = request_id(channel, first + i as u64);
                    // The ids are used once sent, whatever happens to the replies.
                    next_read[usize::from(channel.id())] = first + i as u64 + 1;
                    conn.send(&MemReadMsg {
                        kind: "mem_read",
                        channel_id: channel.id(),
                        address: beat.address,
                        length: beat.length,
                        start_byte_index: beat.start_byte_index,
                        is_first: beat.is_first,
                        is_last: beat.is_last,
                        request_id: &id,
                    })?;
                    outstanding.push_back((id, beat));
                }
                if outstanding.is_empty() {
                    return Ok(());
                }
                conn.flush()?;
                // Wait for one reply, then take those that already arrived, so the window is
                // refilled in batches rather than one beat per round trip.
                while let Some((id, beat)) = outstanding.pop_front() {
                    conn.receive(channel, &id, &beat, buf, started)?;
                    self.counters.read_beats.fetch_add(1, Ordering::Relaxed);
                    if !conn.reader.has_buffered_line() {
                        break;
                    }
                }
            }
        })
    }

    fn write(
        &self,
        channel: DmaChannel,
        addr: DeviceAddr,
        data: &[u8],
    ) -> Result<(), DmaLinkError> {
        let bus = self.config.bus;
        self.with_connection(|conn, _| {
            for beat in beats(addr.0, data.len(), bus) {
                let bytes = &data[beat.offset..beat.offset + beat.length];
                conn.send(&MemWriteMsg {
                    kind: "mem_write",
                    channel_id: channel.id(),
                    address: beat.address,
                    data: bytes,
                    length: bytes.len(),
                })?;
                self.counters.write_beats.fetch_add(1, Ordering::Relaxed);
            }
            conn.flush()
        })
    }

    /// Checks and performs one access, counting a failure.
    fn access(
        &self,
        addr: DeviceAddr,
        len: usize,
        op: impl FnOnce() -> Result<(), DmaLinkError>,
    ) -> Result<(), DmaLinkError> {
        if len == 0 {
            return Ok(());
        }
        let result = match addr.0.checked_add(len as u64) {
            None => Err(DmaLinkError::AddressOverflow { addr: addr.0, len }),
            Some(_) => op(),
        };
        if result.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// The card side of the DMA channel (serve mode).
///
/// Listens on 127.0.0.1 for the driver's DMA connection (one at a time; a new one is taken
/// when the held one is found dead) and turns each access into the simulator's per-beat
/// messages. Reads wait for every reply, in order, and check its channel, request id and
/// length; any mismatch, timeout or socket error fails the access and drops the connection,
/// which is out of step from then on.
///
/// [`DmaPort`] is implemented on channel 0; [`DmaServer::channel`] gives a port on another.
pub struct DmaServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for DmaServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaServer")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl DmaServer {
    /// Calls `gone` each time the driver's connection ends (the served card resets its
    /// rings: the next driver programs them again, and nothing is fetched in between from
    /// memory that went away with the old one).
    pub fn on_driver_gone(&self, gone: impl Fn() + Send + Sync + 'static) {
        *self
            .shared
            .on_gone
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(gone));
    }

    /// Listens for the driver on 127.0.0.1:`config.port`.
    pub fn bind(config: DmaServerConfig) -> io::Result<Self> {
        let listener = bind_loopback(config.port)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State {
                conn: None,
                next_read: [0; DmaChannel::COUNT as usize],
            }),
            connected: Condvar::new(),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            on_gone: Mutex::new(None),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("dma-server-{}", addr.port()))
            .spawn(move || {
                accept_loop(&listener, &accept_shared.stop, |stream| {
                    accept_shared.offer(stream);
                    ControlFlow::Continue(())
                });
            })?;
        Ok(DmaServer {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `timeout` for a driver connection; returns whether one is held.
    pub fn wait_for_driver(&self, timeout: Duration) -> bool {
        let state = self.shared.state();
        let (state, _) = self
            .shared
            .connected
            .wait_timeout_while(state, timeout, |s| s.conn.is_none())
            .unwrap_or_else(|e| e.into_inner());
        state.conn.is_some()
    }

    /// Reads `buf.len()` bytes at `addr` through `channel`.
    pub fn read_on(
        &self,
        channel: DmaChannel,
        addr: DeviceAddr,
        buf: &mut [u8],
    ) -> Result<(), DmaLinkError> {
        let len = buf.len();
        self.shared
            .access(addr, len, || self.shared.read(channel, addr, buf))
    }

    /// Writes `data` at `addr` through `channel`. Writes get no reply: success means the
    /// beats were sent.
    pub fn write_on(
        &self,
        channel: DmaChannel,
        addr: DeviceAddr,
        data: &[u8],
    ) -> Result<(), DmaLinkError> {
        self.shared
            .access(addr, data.len(), || self.shared.write(channel, addr, data))
    }

    /// A [`DmaPort`] that uses `channel`; it shares this server's connection.
    pub fn channel(&self, channel: DmaChannel) -> DmaChannelPort {
        DmaChannelPort {
            shared: Arc::clone(&self.shared),
            channel,
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> DmaServerStats {
        let c = &self.shared.counters;
        DmaServerStats {
            read_beats: c.read_beats.load(Ordering::Relaxed),
            write_beats: c.write_beats.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            clients_accepted: c.clients_accepted.load(Ordering::Relaxed),
            clients_refused: c.clients_refused.load(Ordering::Relaxed),
            driver_connected: self.shared.state().conn.is_some(),
        }
    }

    /// Stops listening, closes the driver connection and joins the accept thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        if let Some(c) = self.shared.state().conn.take() {
            let _ = c.writer.get_ref().shutdown(Shutdown::Both);
        }
        self.shared.connected.notify_all();
    }
}

impl Drop for DmaServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Maps a link error to the fault the model understands, logging the detail.
fn to_fault(
    result: Result<(), DmaLinkError>,
    addr: DeviceAddr,
    len: usize,
    is_write: bool,
) -> Result<(), DmaFault> {
    result.map_err(|e| {
        if e == DmaLinkError::Closed {
            log::info!(
                "DMA server: access of {len} bytes at {:#x}: the driver has gone",
                addr.0
            );
        } else {
            log::error!(
                "DMA server: access of {len} bytes at {:#x} failed: {e}",
                addr.0
            );
        }
        DmaFault {
            addr,
            len,
            is_write,
        }
    })
}

impl DmaPort for DmaServer {
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault> {
        let len = buf.len();
        to_fault(self.read_on(DmaChannel::ZERO, addr, buf), addr, len, false)
    }

    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault> {
        to_fault(
            self.write_on(DmaChannel::ZERO, addr, data),
            addr,
            data.len(),
            true,
        )
    }
}

/// A [`DmaPort`] on one channel of a [`DmaServer`] (from [`DmaServer::channel`]).
pub struct DmaChannelPort {
    shared: Arc<Shared>,
    channel: DmaChannel,
}

impl fmt::Debug for DmaChannelPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaChannelPort")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl DmaPort for DmaChannelPort {
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault> {
        let len = buf.len();
        let (shared, ch) = (&self.shared, self.channel);
        let result = shared.access(addr, len, || shared.read(ch, addr, buf));
        to_fault(result, addr, len, false)
    }

    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault> {
        let (shared, ch) = (&self.shared, self.channel);
        let result = shared.access(addr, data.len(), || shared.write(ch, addr, data));
        to_fault(result, addr, data.len(), true)
    }
}
