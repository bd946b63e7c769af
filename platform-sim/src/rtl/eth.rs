//! The RTL simulators' Ethernet links as [`LinkPort`]s.
//!
//! Both carry one frame per line: the standard base64 (with padding) of the raw Ethernet
//! frame (destination MAC first, no preamble, no FCS), then `\n`
//! (`shared/spec/rtl-sim-protocol.md` "Between simulated NICs", `nic-behaviour.md` 8.4-8.5).
//! - [`TwoCardLink`]: card 1 listens on 127.0.0.1:7777 and takes one connection; card 2
//!   connects, retrying every 100 ms. Frames sent before the link is up are dropped (and
//!   counted), as the bench does.
//! - [`SoftSwitchLink`]: a client of the soft switch on 127.0.0.1:8100 whose first line is the
//!   decimal instance id ([`SoftSwitch`](super::soft_switch::SoftSwitch) is a switch for
//!   tests).
//!
//! Lines that are not valid base64 are counted and skipped; empty lines are ignored.
//!
//! A port's [`LinkPort::sender`] writes to the same stream and counts into the same
//! counters; each call's frames go out in one write under the stream's lock, so the lines
//! of two handles never mix. A sender sees the link as the port does: frames before the
//! link is up are dropped and counted, and once it is down (or the port is dropped) sending
//! fails.

use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::connect::{connect_loopback, RetryPolicy};
use super::line::{excerpt, trim, Line, LineReader};
use super::listener::{accept_loop, bind_loopback};
use crate::link::{FrameSender, LinkCounter, LinkPort, LinkStats};

/// The two-card bench's link port (card 1 listens on it).
pub const TWO_CARD_PORT: u16 = 7777;

/// The soft switch's port.
pub const SOFT_SWITCH_PORT: u16 = 8100;

/// How card 2 of the two-card link retries: every 100 ms, giving up after 300 s.
pub const TWO_CARD_RETRY: RetryPolicy =
    RetryPolicy::fixed(Duration::from_millis(100), Duration::from_secs(300));

/// Received frames queued for `recv_frames`; a full queue stops reading the socket, which
/// pushes back on the peer.
const RX_QUEUE: usize = 1024;

/// At most this many frames are delivered by one `recv_frames` call.
const MAX_BATCH: usize = 256;

/// Encodes `frame` as one line of the link protocol.
pub fn encode_frame_line(frame: &[u8]) -> String {
    let mut line = STANDARD.encode(frame);
    line.push('\n');
    line
}

/// What a simulator link has carried so far, and whether it is up. The same frame counts
/// also feed the port's shared [`crate::link::LinkStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthLinkStatus {
    /// Frames written to the socket.
    pub frames_sent: u64,
    /// Frames decoded from the socket.
    pub frames_received: u64,
    /// Received lines that were not valid base64 (or too long), skipped.
    pub garbage_lines: u64,
    /// Frames dropped because the link was not up yet.
    pub dropped_before_connect: u64,
    /// Whether the link is up.
    pub connected: bool,
}

const NOT_YET: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

#[derive(Default)]
struct LinkShared {
    stop: AtomicBool,
    /// NOT_YET, UP or DOWN.
    state: AtomicU8,
    /// The connected stream, for writing and for shutdown.
    stream: Mutex<Option<TcpStream>>,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    garbage_lines: AtomicU64,
    dropped_before_connect: AtomicU64,
    /// The port's counters as every link reports them.
    counters: crate::link::LinkStats,
}

impl LinkShared {
    fn stream(&self) -> MutexGuard<'_, Option<TcpStream>> {
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `frames` as one batch of lines (or drops and counts them if the link is not
    /// up yet).
    fn send_frames(&self, name: &str, frames: &[&[u8]]) -> io::Result<()> {
        match self.state.load(Ordering::Acquire) {
            NOT_YET => {
                self.dropped_before_connect
                    .fetch_add(frames.len() as u64, Ordering::Relaxed);
                self.counters
                    .add(LinkCounter::FramesUnroutable, frames.len() as u64);
                return Ok(());
            }
            DOWN => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("{name}: the link is down"),
                ))
            }
            _ => {}
        }
        let mut batch = Vec::new();
        for frame in frames {
            batch.extend_from_slice(encode_frame_line(frame).as_bytes());
        }
        let mut stream = self.stream();
        let Some(s) = stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        if let Err(e) = s.write_all(&batch) {
            self.state.store(DOWN, Ordering::Release);
            return Err(io::Error::new(
                e.kind(),
                format!("{name}: send failed: {e}"),
            ));
        }
        self.frames_sent
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
        self.counters
            .add(LinkCounter::FramesSent, frames.len() as u64);
        Ok(())
    }

    /// Reads frames from `stream` into `tx` until the peer closes or the link stops.
    fn read_frames(&self, name: &str, stream: TcpStream, tx: &SyncSender<Vec<u8>>) {
        let mut reader = LineReader::new(stream);
        loop {
            let line = match reader.next_line() {
                Ok(Some(Line::Text(t))) => trim(t),
                Ok(Some(Line::TooLong(n))) => {
                    self.garbage_lines.fetch_add(1, Ordering::Relaxed);
                    self.counters.add(LinkCounter::BadDatagrams, 1);
                    log::warn!("{name}: skipped a line of {n} bytes");
                    continue;
                }
                Ok(None) => break,
                Err(e) => {
                    if !self.stop.load(Ordering::Acquire) {
                        log::warn!("{name}: receive failed: {e}");
                    }
                    break;
                }
            };
            if line.is_empty() {
                continue;
            }
            match STANDARD.decode(line) {
                Ok(frame) => {
                    self.frames_received.fetch_add(1, Ordering::Relaxed);
                    self.counters.add(LinkCounter::FramesReceived, 1);
                    if tx.send(frame).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    self.garbage_lines.fetch_add(1, Ordering::Relaxed);
                    self.counters.add(LinkCounter::BadDatagrams, 1);
                    log::warn!(
                        "{name}: skipped a line that is not base64 ({e}): {:?}",
                        excerpt(line)
                    );
                }
            }
        }
        if !self.stop.load(Ordering::Acquire) {
            log::info!("{name}: the peer closed the link");
        }
        self.state.store(DOWN, Ordering::Release);
    }
}

/// The machinery both links share: a reader thread decoding lines into a queue, and a
/// writer that sends a batch of frames as one write.
struct LineLink {
    name: String,
    shared: Arc<LinkShared>,
    frames: Option<Receiver<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl LineLink {
    /// A link over an already connected stream.
    fn connected(name: String, stream: TcpStream) -> io::Result<Self> {
        let shared = Arc::new(LinkShared::default());
        *shared.stream() = Some(stream.try_clone()?);
        shared.state.store(UP, Ordering::Release);
        let (tx, rx) = mpsc::sync_channel(RX_QUEUE);
        let thread_shared = Arc::clone(&shared);
        let thread_name = name.clone();
        let thread = thread::Builder::new()
            .name(name.clone())
            .spawn(move || thread_shared.read_frames(&thread_name, stream, &tx))?;
        Ok(LineLink {
            name,
            shared,
            frames: Some(rx),
            thread: Some(thread),
        })
    }

    fn status(&self) -> EthLinkStatus {
        let s = &self.shared;
        EthLinkStatus {
            frames_sent: s.frames_sent.load(Ordering::Relaxed),
            frames_received: s.frames_received.load(Ordering::Relaxed),
            garbage_lines: s.garbage_lines.load(Ordering::Relaxed),
            dropped_before_connect: s.dropped_before_connect.load(Ordering::Relaxed),
            connected: s.state.load(Ordering::Acquire) == UP,
        }
    }

    fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.shared.state.load(Ordering::Acquire) {
                UP => return true,
                DOWN => return false,
                _ if Instant::now() >= deadline => return false,
                _ => thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.shared.send_frames(&self.name, frames)
    }

    fn sender(&self) -> Box<dyn FrameSender> {
        Box::new(LineSender {
            name: self.name.clone(),
            shared: Arc::clone(&self.shared),
        })
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let Some(rx) = self.frames.as_ref() else {
            return Ok(0);
        };
        let closed = || {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: the link is down", self.name),
            )
        };
        let first = match rx.recv_timeout(timeout) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => return Ok(0),
            Err(RecvTimeoutError::Disconnected) => return Err(closed()),
        };
        on_frame(&first);
        let mut delivered = 1;
        while delivered < MAX_BATCH {
            match rx.try_recv() {
                Ok(f) => on_frame(&f),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
            delivered += 1;
        }
        Ok(delivered)
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(s) = self.shared.stream().as_ref() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // The reader may be blocked on a full queue: dropping the receiver frees it.
        self.frames = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // A sender that outlives the port finds the link down, even if it never came up.
        self.shared.state.store(DOWN, Ordering::Release);
    }
}

/// A second transmit handle on a [`LineLink`].
struct LineSender {
    name: String,
    shared: Arc<LinkShared>,
}

impl FrameSender for LineSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.shared.send_frames(&self.name, frames)
    }
}

impl Drop for LineLink {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One card's end of the two-card bench's Ethernet link.
pub struct TwoCardLink {
    link: LineLink,
    local_addr: Option<SocketAddr>,
}

impl fmt::Debug for TwoCardLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwoCardLink")
            .field("local_addr", &self.local_addr)
            .field("status", &self.status())
            .finish()
    }
}

impl TwoCardLink {
    /// Card 1: listens on 127.0.0.1:`port` (0 picks a free port) and takes the first
    /// connection in the background. Until then, sent frames are dropped and counted.
    pub fn listen(port: u16) -> io::Result<Self> {
        let listener = bind_loopback(port)?;
        let local_addr = listener.local_addr()?;
        let name = format!("two-card-link-{}", local_addr.port());
        let shared = Arc::new(LinkShared::default());
        let (tx, rx) = mpsc::sync_channel(RX_QUEUE);
        let thread_shared = Arc::clone(&shared);
        let thread_name = name.clone();
        let thread = thread::Builder::new().name(name.clone()).spawn(move || {
            let mut accepted = None;
            accept_loop(&listener, &thread_shared.stop, |stream| {
                accepted = Some(stream);
                ControlFlow::Break(())
            });
            // The bench takes exactly one connection; later ones are refused by the OS.
            drop(listener);
            let Some(stream) = accepted else {
                return;
            };
            match stream.try_clone() {
                Ok(clone) => *thread_shared.stream() = Some(clone),
                Err(e) => {
                    log::error!("{thread_name}: cannot use the connection: {e}");
                    thread_shared.state.store(DOWN, Ordering::Release);
                    return;
                }
            }
            log::info!("{thread_name}: card 2 connected");
            thread_shared.state.store(UP, Ordering::Release);
            thread_shared.read_frames(&thread_name, stream, &tx);
        })?;
        Ok(TwoCardLink {
            link: LineLink {
                name,
                shared,
                frames: Some(rx),
                thread: Some(thread),
            },
            local_addr: Some(local_addr),
        })
    }

    /// Card 2: connects to card 1 on 127.0.0.1:`port`, retrying under `retry`
    /// ([`TWO_CARD_RETRY`] is the bench's).
    pub fn connect(port: u16, retry: &RetryPolicy) -> io::Result<Self> {
        let stream = connect_loopback(port, retry)?;
        Ok(TwoCardLink {
            link: LineLink::connected(format!("two-card-link-to-{port}"), stream)?,
            local_addr: None,
        })
    }

    /// The address card 1 listens on (`None` for card 2).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Waits up to `timeout` for the link to come up; returns whether it is up.
    pub fn wait_connected(&self, timeout: Duration) -> bool {
        self.link.wait_connected(timeout)
    }

    /// The counters so far.
    pub fn status(&self) -> EthLinkStatus {
        self.link.status()
    }
}

impl LinkPort for TwoCardLink {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.link.send_frames(frames)
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(self.link.sender())
    }

    fn stats(&self) -> &LinkStats {
        &self.link.shared.counters
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        self.link.recv_frames(timeout, on_frame)
    }
}

/// A node's port on the soft switch.
pub struct SoftSwitchLink {
    link: LineLink,
    instance: u8,
}

impl fmt::Debug for SoftSwitchLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftSwitchLink")
            .field("instance", &self.instance)
            .field("status", &self.status())
            .finish()
    }
}

impl SoftSwitchLink {
    /// Connects to the switch on 127.0.0.1:`port` (retrying under `retry`) and registers as
    /// `instance`, whose IP becomes 17.34.51.(9 + instance).
    pub fn connect(port: u16, instance: u8, retry: &RetryPolicy) -> io::Result<Self> {
        let mut stream = connect_loopback(port, retry)?;
        stream.write_all(format!("{instance}\n").as_bytes())?;
        Ok(SoftSwitchLink {
            link: LineLink::connected(format!("soft-switch-node-{instance}"), stream)?,
            instance,
        })
    }

    /// The instance id this node registered.
    pub fn instance(&self) -> u8 {
        self.instance
    }

    /// The counters so far.
    pub fn status(&self) -> EthLinkStatus {
        self.link.status()
    }
}

impl LinkPort for SoftSwitchLink {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.link.send_frames(frames)
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(self.link.sender())
    }

    fn stats(&self) -> &LinkStats {
        &self.link.shared.counters
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        self.link.recv_frames(timeout, on_frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_standard_padded_base64_lines() {
        assert_eq!(encode_frame_line(&[0xFF, 0xFE]), "//4=\n");
        assert_eq!(encode_frame_line(&[1, 2, 3]), "AQID\n");
        assert!(STANDARD.decode("//4").is_err(), "padding is required");
    }
}
