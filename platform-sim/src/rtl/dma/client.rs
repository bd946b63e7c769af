//! The driver side of the DMA channel: answers the simulator's beats from host memory.

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use bluerdma_core::addr::DeviceAddr;

use super::{dma_port, MemReadResponse, SimRequest, MAX_BEAT_BYTES};
use crate::mem::AddressMap;
use crate::rtl::connect::{connect_loopback, RetryPolicy};
use crate::rtl::line::{excerpt, trim, Line, LineReader};

/// Where and how [`DmaClient`] connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaClientConfig {
    /// TCP port on 127.0.0.1 ([`dma_port`] of the instance).
    pub port: u16,
    /// Retry while the simulator is not listening yet.
    pub retry: RetryPolicy,
}

impl DmaClientConfig {
    /// The defaults for simulator instance `inst`.
    pub fn for_instance(inst: u8) -> Self {
        DmaClientConfig {
            port: dma_port(inst),
            retry: RetryPolicy::SIMULATOR,
        }
    }
}

impl Default for DmaClientConfig {
    /// The one-card loopback bench (instance 1, port 7003).
    fn default() -> Self {
        Self::for_instance(1)
    }
}

/// What a [`DmaClient`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaClientStats {
    /// `mem_write` beats executed (faulting ones included).
    pub write_beats: u64,
    /// `mem_read` beats answered (faulting ones included).
    pub read_beats: u64,
    /// Bytes written to host memory.
    pub bytes_written: u64,
    /// Bytes read from host memory.
    pub bytes_read: u64,
    /// Beats outside every mapped region (writes dropped, reads answered with zeros).
    pub faults: u64,
    /// Lines that were not a valid request, skipped.
    pub malformed_lines: u64,
    /// Bytes read from the ranges given to [`DmaClient::watch_reads`].
    pub watched_bytes_read: u64,
    /// Whether the connection is still being served.
    pub running: bool,
}

/// How many address ranges [`DmaClient::watch_reads`] takes.
pub const WATCHED_RANGES: usize = 2;

#[derive(Default)]
struct Counters {
    write_beats: AtomicU64,
    read_beats: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    faults: AtomicU64,
    malformed_lines: AtomicU64,
    running: AtomicBool,
    /// Set by `shutdown`, so the end of the connection is not reported as the simulator's.
    closing: AtomicBool,
    /// Address ranges (start, end) whose reads are counted in `watched_read`.
    watched: [(AtomicU64, AtomicU64); WATCHED_RANGES],
    watched_read: AtomicU64,
}

impl Counters {
    /// Counts the bytes of a read of `len` at `addr` that fall in a watched range.
    fn note_read(&self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        let inside: u64 = self
            .watched
            .iter()
            .map(|(s, e)| {
                let (s, e) = (s.load(Ordering::Relaxed), e.load(Ordering::Relaxed));
                end.min(e).saturating_sub(addr.max(s))
            })
            .sum();
        if inside > 0 {
            self.watched_read.fetch_add(inside, Ordering::Release);
        }
    }
}

/// The driver's DMA service for the RTL simulator: a thread that executes the simulator's
/// requests strictly in arrival order against an [`AddressMap`].
///
/// A beat outside the map is logged and counted; a read of one is answered with zeros so the
/// simulator does not wait forever. Malformed lines are counted and skipped. Dropping the
/// client (or [`DmaClient::shutdown`]) closes the connection and joins the thread.
pub struct DmaClient {
    control: TcpStream,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for DmaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaClient")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl DmaClient {
    /// Connects to the simulator (retrying while it is not listening yet) and starts serving
    /// its requests from `map`.
    pub fn connect(config: &DmaClientConfig, map: AddressMap) -> io::Result<Self> {
        let stream = connect_loopback(config.port, &config.retry)?;
        let reader = LineReader::new(stream.try_clone()?);
        let writer = BufWriter::new(stream.try_clone()?);
        let counters = Arc::new(Counters::default());
        counters.running.store(true, Ordering::Release);
        let thread_counters = Arc::clone(&counters);
        let thread = thread::Builder::new()
            .name(format!("dma-client-{}", config.port))
            .spawn(move || {
                let result = serve(&map, &thread_counters, reader, writer);
                thread_counters.running.store(false, Ordering::Release);
                if thread_counters.closing.load(Ordering::Acquire) {
                    return;
                }
                match result {
                    Ok(()) => log::info!("DMA client: the simulator closed the connection"),
                    Err(e) => log::warn!("DMA client: connection failed: {e}"),
                }
            })?;
        Ok(DmaClient {
            control: stream,
            counters,
            thread: Some(thread),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> DmaClientStats {
        let c = &self.counters;
        DmaClientStats {
            write_beats: c.write_beats.load(Ordering::Acquire),
            read_beats: c.read_beats.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            faults: c.faults.load(Ordering::Relaxed),
            malformed_lines: c.malformed_lines.load(Ordering::Relaxed),
            watched_bytes_read: c.watched_read.load(Ordering::Acquire),
            running: c.running.load(Ordering::Acquire),
        }
    }

    /// Counts, from now on, the bytes the card reads inside `ranges` (start, length; at
    /// most [`WATCHED_RANGES`], the rest ignored) in [`DmaClientStats::watched_bytes_read`]:
    /// how a driver that closes learns that the card has read the frames it was handed.
    pub fn watch_reads(&self, ranges: &[(DeviceAddr, usize)]) {
        for (slot, &(start, len)) in self.counters.watched.iter().zip(ranges) {
            slot.0.store(start.0, Ordering::Relaxed);
            slot.1
                .store(start.0.saturating_add(len as u64), Ordering::Relaxed);
        }
    }

    /// Closes the connection and waits for the service thread to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.counters.closing.store(true, Ordering::Release);
        // Ends the thread's blocking read with end-of-stream.
        let _ = self.control.shutdown(Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DmaClient {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves requests until the simulator closes the connection (`Ok`) or it fails.
fn serve(
    map: &AddressMap,
    counters: &Counters,
    mut reader: LineReader<TcpStream>,
    mut writer: BufWriter<TcpStream>,
) -> io::Result<()> {
    loop {
        // Replies are batched while complete requests are already waiting, and leave before
        // we may block.
        if !reader.has_buffered_line() {
            writer.flush()?;
        }
        let line = match reader.next_line()? {
            None => return Ok(()),
            Some(Line::TooLong(n)) => {
                counters.malformed_lines.fetch_add(1, Ordering::Relaxed);
                log::warn!("DMA client: skipped a line of {n} bytes");
                continue;
            }
            Some(Line::Text(t)) => trim(t),
        };
        if line.is_empty() {
            continue;
        }
        let request: SimRequest = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                counters.malformed_lines.fetch_add(1, Ordering::Relaxed);
                log::warn!("DMA client: skipped {:?}: {e}", excerpt(line));
                continue;
            }
        };
        execute(map, counters, request, &mut writer, line)?;
    }
}

/// Executes one request, writing the reply of a read to `writer`. A request that is not a
/// well-formed `mem_write` or `mem_read` is counted and skipped.
fn execute(
    map: &AddressMap,
    counters: &Counters,
    request: SimRequest,
    writer: &mut impl Write,
    line: &[u8],
) -> io::Result<()> {
    let malformed = |why: &str| {
        counters.malformed_lines.fetch_add(1, Ordering::Relaxed);
        log::warn!("DMA client: skipped {:?}: {why}", excerpt(line));
    };
    let channel_id = request.channel_id;
    match (request.kind.as_str(), request.data, request.request_id) {
        ("mem_write", Some(data), _) => {
            if data.len() != request.length {
                malformed("length is not the number of data bytes");
                return Ok(());
            }
            match map.write(DeviceAddr(request.address), &data) {
                Ok(()) => {
                    counters
                        .bytes_written
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                Err(fault) => {
                    counters.faults.fetch_add(1, Ordering::Relaxed);
                    log::error!("DMA client: dropped channel {channel_id}'s {fault}");
                }
            }
            // Release: whoever sees the count also sees the bytes written.
            counters.write_beats.fetch_add(1, Ordering::Release);
        }
        ("mem_read", _, Some(request_id)) => {
            let length = request.length;
            if length > MAX_BEAT_BYTES {
                malformed("more bytes than any beat holds");
                return Ok(());
            }
            counters.read_beats.fetch_add(1, Ordering::Relaxed);
            // A fault leaves the buffer zeroed, which is the answer.
            let mut data = vec![0u8; length];
            match map.read(DeviceAddr(request.address), &mut data) {
                Ok(()) => {
                    counters
                        .bytes_read
                        .fetch_add(length as u64, Ordering::Relaxed);
                    counters.note_read(request.address, length as u64);
                }
                Err(fault) => {
                    counters.faults.fetch_add(1, Ordering::Relaxed);
                    log::error!("DMA client: answered channel {channel_id}'s {fault} with zeros");
                }
            }
            let reply = MemReadResponse {
                kind: "mem_read_response",
                channel_id,
                request_id: &request_id,
                data: &data,
                start_byte_index: request.start_byte_index,
                is_first: request.is_first,
                is_last: request.is_last,
            };
            serde_json::to_writer(&mut *writer, &reply).map_err(io::Error::from)?;
            writer.write_all(b"\n")?;
        }
        ("mem_write", None, _) => malformed("a mem_write without data"),
        ("mem_read", _, None) => malformed("a mem_read without a request_id"),
        (other, _, _) => malformed(&format!("unknown type {other:?}")),
    }
    Ok(())
}
