//! The register (CSR) channel: BAR0 reads and writes as JSON lines over TCP.
//!
//! Protocol (`shared/spec/rtl-sim-protocol.md` "Register access", corrected by
//! `nic-behaviour.md` sections 8.1, 8.2 and 8.6.3): the driver is the TCP client of
//! 127.0.0.1:(7700 + instance) (7701 for the one-card loopback bench). Each request is one
//! line `{"is_write": bool, "addr": <BAR0 offset>, "value": <u32>}`; a write gets no reply, a
//! read gets exactly one line `{"is_write": false, "addr": A, "value": V}` as Python's
//! `json.dumps` prints it. One read is in flight at a time, and the simulator queues writes
//! to a separate coroutine, so **a read may reach the card before a write sent earlier on the
//! same connection**: order alone never proves that a write has landed
//! ([`CsrClient::write32_confirmed`] does, for registers that read back what was written).
//!
//! [`CsrClient`] is the driver side; [`CsrServer`] is the card side that the emulated NIC uses
//! in serve mode, behaving as the cocotb bench does (one client at a time).

use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Reg, UndecodedAccess};
use serde::Deserialize;

use super::connect::{connect_loopback, RetryPolicy};
use super::line::{excerpt, trim, Line, LineReader};
use super::listener::{accept_loop, bind_loopback};

/// The CSR port of instance N is `CSR_BASE_PORT + N`.
pub const CSR_BASE_PORT: u16 = 7700;

/// What a read of a dead PCIe device returns; [`CsrClient`] returns it once its connection
/// is broken.
pub const DEAD_DEVICE_READ: u32 = 0xFFFF_FFFF;

pub use bluerdma_core::regs::UNDECODED_READ;

/// The CSR port of simulator instance `inst` (the one-card loopback bench is instance 1).
pub const fn csr_port(inst: u8) -> u16 {
    CSR_BASE_PORT + inst as u16
}

/// One request or read reply, exactly as Python's `json.dumps` prints it (keys in this order,
/// `", "` and `": "` separators), plus the terminating newline.
pub(crate) fn csr_line(is_write: bool, addr: u32, value: u32) -> String {
    format!("{{\"is_write\": {is_write}, \"addr\": {addr}, \"value\": {value}}}\n")
}

/// A request as the card receives it. `value` is ignored for reads, so it may be missing.
#[derive(Deserialize)]
pub(crate) struct CsrRequest {
    pub(crate) is_write: bool,
    pub(crate) addr: u32,
    #[serde(default)]
    pub(crate) value: Option<u32>,
}

/// A read reply as the driver receives it.
#[derive(Deserialize)]
pub(crate) struct CsrReply {
    pub(crate) is_write: bool,
    pub(crate) addr: u32,
    pub(crate) value: u32,
}

// ---------------------------------------------------------------------------------------
// Driver side
// ---------------------------------------------------------------------------------------

/// Why a CSR access through [`CsrClient`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsrError {
    /// The socket failed.
    Io {
        /// The OS error kind.
        kind: io::ErrorKind,
        /// The error as printed.
        message: String,
    },
    /// The simulator closed the connection (it exited, or it refused us as a second client).
    Closed,
    /// No reply to a read of `offset` within the configured time.
    ReplyTimeout {
        /// The BAR0 offset read.
        offset: u16,
        /// How long the client waited.
        waited: Duration,
    },
    /// The reply to a read of `offset` was not the expected line.
    BadReply {
        /// The BAR0 offset read.
        offset: u16,
        /// What was wrong with it.
        reason: String,
    },
    /// [`CsrClient::write32_confirmed`] never read back the value it wrote. The connection
    /// is still usable.
    NotConfirmed {
        /// The BAR0 offset written.
        offset: u16,
        /// The value written.
        wrote: u32,
        /// The last value read back.
        read: u32,
    },
}

impl CsrError {
    fn io(e: &io::Error) -> Self {
        CsrError::Io {
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// Whether the connection is unusable after this error (every error except
    /// [`CsrError::NotConfirmed`]).
    pub fn breaks_connection(&self) -> bool {
        !matches!(self, CsrError::NotConfirmed { .. })
    }
}

impl fmt::Display for CsrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsrError::Io { message, .. } => write!(f, "CSR socket error: {message}"),
            CsrError::Closed => f.write_str("the simulator closed the CSR connection"),
            CsrError::ReplyTimeout { offset, waited } => {
                write!(
                    f,
                    "no reply to the CSR read of {offset:#x} within {waited:?}"
                )
            }
            CsrError::BadReply { offset, reason } => {
                write!(f, "bad reply to the CSR read of {offset:#x}: {reason}")
            }
            CsrError::NotConfirmed {
                offset,
                wrote,
                read,
            } => write!(
                f,
                "CSR {offset:#x}: wrote {wrote:#x} but it still reads {read:#x}"
            ),
        }
    }
}

impl std::error::Error for CsrError {}

/// Where and how [`CsrClient`] connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsrClientConfig {
    /// TCP port on 127.0.0.1 ([`csr_port`] of the instance).
    pub port: u16,
    /// Retry while the simulator is not listening yet.
    pub retry: RetryPolicy,
    /// How long a read waits for its reply before the connection is declared broken.
    pub reply_timeout: Duration,
}

impl CsrClientConfig {
    /// The defaults for simulator instance `inst`.
    pub fn for_instance(inst: u8) -> Self {
        CsrClientConfig {
            port: csr_port(inst),
            retry: RetryPolicy::SIMULATOR,
            reply_timeout: Duration::from_secs(30),
        }
    }
}

impl Default for CsrClientConfig {
    /// The one-card loopback bench (instance 1, port 7701).
    fn default() -> Self {
        Self::for_instance(1)
    }
}

struct CsrConnection {
    writer: TcpStream,
    reader: LineReader<TcpStream>,
    /// The first error that broke the connection; sticky.
    broken: Option<CsrError>,
}

impl CsrConnection {
    /// Runs `op` unless the connection is already broken, and makes a breaking error sticky.
    fn guarded<T>(
        &mut self,
        op: impl FnOnce(&mut Self) -> Result<T, CsrError>,
    ) -> Result<T, CsrError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let result = op(self);
        if let Err(e) = &result {
            if e.breaks_connection() {
                log::error!("CSR channel broken, reads now return {DEAD_DEVICE_READ:#x}: {e}");
                self.broken = Some(e.clone());
                // Out of step for good: close it so the simulator can take a new client.
                let _ = self.writer.shutdown(std::net::Shutdown::Both);
            }
        }
        result
    }

    fn send(&mut self, is_write: bool, offset: u16, value: u32) -> Result<(), CsrError> {
        self.writer
            .write_all(csr_line(is_write, offset.into(), value).as_bytes())
            .map_err(|e| CsrError::io(&e))
    }

    fn read(&mut self, offset: u16) -> Result<u32, CsrError> {
        self.send(false, offset, 0)?;
        let started = Instant::now();
        loop {
            let line = match self.reader.next_line() {
                Ok(Some(Line::Text(t))) => trim(t),
                Ok(Some(Line::TooLong(n))) => {
                    return Err(CsrError::BadReply {
                        offset,
                        reason: format!("a line of {n} bytes"),
                    })
                }
                Ok(None) => return Err(CsrError::Closed),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(CsrError::ReplyTimeout {
                        offset,
                        waited: started.elapsed(),
                    })
                }
                Err(e) => return Err(CsrError::io(&e)),
            };
            if line.is_empty() {
                continue;
            }
            let bad = |reason: String| CsrError::BadReply { offset, reason };
            let reply: CsrReply = serde_json::from_slice(line)
                .map_err(|e| bad(format!("{e} in {:?}", excerpt(line))))?;
            if reply.is_write || reply.addr != u32::from(offset) {
                return Err(bad(format!(
                    "expected a read reply for {offset:#x}, got {:?}",
                    excerpt(line)
                )));
            }
            return Ok(reply.value);
        }
    }
}

/// The driver's register access over the simulator's CSR socket.
///
/// `read32` cannot fail in [`RegisterAccess`], so once the connection breaks (socket error,
/// simulator gone, no or wrong reply) every read returns [`DEAD_DEVICE_READ`], as a PCIe
/// device that fell off the bus does, writes are dropped, the cause is logged once, and
/// [`CsrClient::error`] reports it. [`CsrClient::try_read32`] and
/// [`CsrClient::try_write32`] return the error instead.
///
/// Reads may overtake earlier writes on the simulator side (module docs).
pub struct CsrClient {
    conn: Mutex<CsrConnection>,
}

impl fmt::Debug for CsrClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsrClient")
            .field("error", &self.error())
            .finish_non_exhaustive()
    }
}

impl CsrClient {
    /// Connects to the simulator, retrying while it is not listening yet.
    pub fn connect(config: &CsrClientConfig) -> io::Result<Self> {
        let stream = connect_loopback(config.port, &config.retry)?;
        stream.set_read_timeout(Some(config.reply_timeout))?;
        let reader = LineReader::new(stream.try_clone()?);
        Ok(CsrClient {
            conn: Mutex::new(CsrConnection {
                writer: stream,
                reader,
                broken: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, CsrConnection> {
        // A panic elsewhere while holding the lock leaves the connection as consistent as
        // any socket error would; `broken` records what matters.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads a register, or says why the channel failed.
    pub fn try_read32(&self, reg: Reg) -> Result<u32, CsrError> {
        self.lock().guarded(|c| c.read(reg.offset()))
    }

    /// Sends a register write (no reply comes), or says why the channel failed.
    pub fn try_write32(&self, reg: Reg, value: u32) -> Result<(), CsrError> {
        self.lock().guarded(|c| c.send(true, reg.offset(), value))
    }

    /// Writes a register and reads it back until it holds `value` or `timeout` passes.
    ///
    /// Only for registers that read back what was written and that the card does not change
    /// (ring base addresses, the producer index of a host-to-card ring). It is the only way
    /// to know that a write has landed, since a read can overtake it.
    pub fn write32_confirmed(
        &self,
        reg: Reg,
        value: u32,
        timeout: Duration,
    ) -> Result<(), CsrError> {
        self.try_write32(reg, value)?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(100);
        loop {
            let read = self.try_read32(reg)?;
            if read == value {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CsrError::NotConfirmed {
                    offset: reg.offset(),
                    wrote: value,
                    read,
                });
            }
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// The error that broke the connection, if any.
    pub fn error(&self) -> Option<CsrError> {
        self.lock().broken.clone()
    }
}

impl RegisterAccess for CsrClient {
    fn read32(&self, reg: Reg) -> u32 {
        self.try_read32(reg).unwrap_or(DEAD_DEVICE_READ)
    }

    fn write32(&self, reg: Reg, value: u32) {
        // A failure is logged once and kept in `error()`; a dead device swallows writes.
        let _ = self.try_write32(reg, value);
    }
}

// ---------------------------------------------------------------------------------------
// Card side
// ---------------------------------------------------------------------------------------

/// The card behind a [`CsrServer`]: BAR0 accesses by raw byte offset, as they arrive.
pub trait CsrTarget: Send + Sync {
    /// Reads the register at `offset`, or reports that the card does not decode it.
    fn csr_read(&self, offset: u32) -> Result<u32, UndecodedAccess>;
    /// Writes the register at `offset`, or reports that the card does not decode it.
    fn csr_write(&self, offset: u32, value: u32) -> Result<(), UndecodedAccess>;
}

/// What a [`CsrServer`] has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CsrServerStats {
    /// Reads answered (undecoded ones included).
    pub reads: u64,
    /// Writes delivered to the target (undecoded ones included).
    pub writes: u64,
    /// Lines that were not a valid request (bad JSON, missing fields, too long).
    pub malformed_lines: u64,
    /// Accesses the target did not decode.
    pub undecoded_accesses: u64,
    /// Clients served.
    pub clients_accepted: u64,
    /// Connections closed at once because a client was already being served.
    pub clients_refused: u64,
    /// Whether a client is being served now.
    pub client_connected: bool,
}

#[derive(Default)]
struct CsrServerCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    malformed_lines: AtomicU64,
    undecoded_accesses: AtomicU64,
    clients_accepted: AtomicU64,
    clients_refused: AtomicU64,
}

struct CsrServerShared {
    target: Arc<dyn CsrTarget>,
    stop: AtomicBool,
    /// A clone of the served client's stream, to end it on shutdown; `Some` while serving.
    client: Mutex<Option<TcpStream>>,
    counters: CsrServerCounters,
    /// Called when a client's connection ends ([`CsrServer::on_client_gone`]).
    on_gone: Mutex<Option<ClientGone>>,
}

/// What the card does when its CSR client (its driver) goes away.
type ClientGone = Box<dyn Fn() + Send + Sync>;

impl CsrServerShared {
    fn client(&self) -> MutexGuard<'_, Option<TcpStream>> {
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The card side of the CSR channel (serve mode): listens on 127.0.0.1, serves one client
/// at a time (a second connection while one is alive is closed at once, as the cocotb bench
/// does), and accepts a new client after the current one drops.
///
/// Malformed lines are logged, counted and skipped; an access the target does not decode is
/// logged as an error and counted, and a read of it is answered with [`UNDECODED_READ`].
/// (The RTL simulator ends the simulation instead; serving on keeps the driver's bug
/// visible without killing the test.)
pub struct CsrServer {
    addr: SocketAddr,
    shared: Arc<CsrServerShared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for CsrServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsrServer")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CsrServer {
    /// Listens on 127.0.0.1:`port` (0 picks a free port) and serves `target`.
    pub fn bind(port: u16, target: Arc<dyn CsrTarget>) -> io::Result<Self> {
        let listener = bind_loopback(port)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(CsrServerShared {
            target,
            stop: AtomicBool::new(false),
            client: Mutex::new(None),
            counters: CsrServerCounters::default(),
            on_gone: Mutex::new(None),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("csr-server-{}", addr.port()))
            .spawn(move || {
                let mut handler: Option<JoinHandle<()>> = None;
                accept_loop(&listener, &accept_shared.stop, |stream| {
                    let mut current = accept_shared.client();
                    if current.is_some() {
                        accept_shared
                            .counters
                            .clients_refused
                            .fetch_add(1, Ordering::Relaxed);
                        log::warn!("CSR server {addr}: refusing a second client");
                        return ControlFlow::Continue(());
                    }
                    let Ok(clone) = stream.try_clone() else {
                        return ControlFlow::Continue(());
                    };
                    *current = Some(clone);
                    drop(current);
                    accept_shared
                        .counters
                        .clients_accepted
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(previous) = handler.take() {
                        let _ = previous.join();
                    }
                    let serve_shared = Arc::clone(&accept_shared);
                    handler = thread::Builder::new()
                        .name(format!("csr-client-{}", addr.port()))
                        .spawn(move || {
                            serve_client(&serve_shared, stream);
                            // Before the next client can be accepted: it finds the card
                            // as the hook left it.
                            if let Some(gone) = serve_shared
                                .on_gone
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .as_ref()
                            {
                                gone();
                            }
                            *serve_shared.client() = None;
                        })
                        .map_err(|e| log::error!("CSR server {addr}: cannot spawn: {e}"))
                        .ok();
                    ControlFlow::Continue(())
                });
                if let Some(current) = accept_shared.client().as_ref() {
                    let _ = current.shutdown(std::net::Shutdown::Both);
                }
                if let Some(h) = handler {
                    let _ = h.join();
                }
            })?;
        Ok(CsrServer {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// Calls `gone` each time a client's connection ends, before the next client is
    /// served (one client at a time: a second one is refused while the first is served).
    pub fn on_client_gone(&self, gone: impl Fn() + Send + Sync + 'static) {
        *self
            .shared
            .on_gone
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(gone));
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters so far.
    pub fn stats(&self) -> CsrServerStats {
        let c = &self.shared.counters;
        CsrServerStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            malformed_lines: c.malformed_lines.load(Ordering::Relaxed),
            undecoded_accesses: c.undecoded_accesses.load(Ordering::Relaxed),
            clients_accepted: c.clients_accepted.load(Ordering::Relaxed),
            clients_refused: c.clients_refused.load(Ordering::Relaxed),
            client_connected: self.shared.client().is_some(),
        }
    }

    /// Stops listening, disconnects the client and joins the server's threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CsrServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one client until it disconnects or the server stops.
fn serve_client(shared: &CsrServerShared, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let mut writer = stream;
    let mut reader = match writer.try_clone() {
        Ok(s) => LineReader::new(s),
        Err(e) => {
            log::error!("CSR server: cannot serve {peer}: {e}");
            return;
        }
    };
    log::info!("CSR server: serving {peer}");
    loop {
        let line = match reader.next_line() {
            Ok(Some(Line::Text(t))) => trim(t),
            Ok(Some(Line::TooLong(n))) => {
                shared
                    .counters
                    .malformed_lines
                    .fetch_add(1, Ordering::Relaxed);
                log::warn!("CSR server: skipped a line of {n} bytes from {peer}");
                continue;
            }
            Ok(None) => break,
            Err(e) => {
                if !shared.stop.load(Ordering::Acquire) {
                    log::warn!("CSR server: connection to {peer} failed: {e}");
                }
                break;
            }
        };
        if line.is_empty() {
            continue;
        }
        let Some(reply) = handle_request(shared, line) else {
            continue;
        };
        if let Err(e) = writer.write_all(reply.as_bytes()) {
            log::warn!("CSR server: cannot reply to {peer}: {e}");
            break;
        }
    }
    log::info!("CSR server: {peer} disconnected");
}

/// Executes one request line; returns the reply line for a read.
fn handle_request(shared: &CsrServerShared, line: &[u8]) -> Option<String> {
    let c = &shared.counters;
    let malformed = |why: &dyn fmt::Display| {
        c.malformed_lines.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "CSR server: skipped malformed line {:?}: {why}",
            excerpt(line)
        );
    };
    let request: CsrRequest = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            malformed(&e);
            return None;
        }
    };
    let undecoded = |u: UndecodedAccess| {
        c.undecoded_accesses.fetch_add(1, Ordering::Relaxed);
        log::error!(
            "CSR server: driver {} undecoded BAR0 offset {:#x} (the RTL simulator would abort)",
            if u.is_write { "wrote" } else { "read" },
            u.offset
        );
    };
    if request.is_write {
        let Some(value) = request.value else {
            malformed(&"a write without a value");
            return None;
        };
        c.writes.fetch_add(1, Ordering::Relaxed);
        if let Err(u) = shared.target.csr_write(request.addr, value) {
            undecoded(u);
        }
        None
    } else {
        c.reads.fetch_add(1, Ordering::Relaxed);
        let value = shared.target.csr_read(request.addr).unwrap_or_else(|u| {
            undecoded(u);
            UNDECODED_READ
        });
        Some(csr_line(false, request.addr, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_use_python_json_dumps_spacing() {
        assert_eq!(
            csr_line(false, 0x104, 0xDEAD_BEEF),
            "{\"is_write\": false, \"addr\": 260, \"value\": 3735928559}\n"
        );
        assert_eq!(
            csr_line(true, 0, 0),
            "{\"is_write\": true, \"addr\": 0, \"value\": 0}\n"
        );
    }

    #[test]
    fn requests_parse_with_or_without_spaces_and_value() {
        let r: CsrRequest = serde_json::from_str(r#"{"is_write":false,"addr":8}"#).unwrap();
        assert!(!r.is_write && r.addr == 8 && r.value.is_none());
        let r: CsrRequest =
            serde_json::from_str(r#"{"is_write": true, "addr": 8, "value": 4294967295}"#).unwrap();
        assert_eq!(r.value, Some(u32::MAX));
        assert!(serde_json::from_str::<CsrRequest>(r#"{"is_write":true,"addr":-1}"#).is_err());
        assert!(serde_json::from_str::<CsrRequest>(
            r#"{"is_write":true,"addr":1,"value":4294967296}"#
        )
        .is_err());
    }
}
