//! Capture of link traffic to a classic pcap file that Wireshark and tshark read.
//!
//! The file is the original libpcap format: a 24-byte global header (magic `a1b2c3d4`
//! written in native byte order, version 2.4, microsecond timestamps, snap length 65 535,
//! link type 1 = Ethernet), then one 16-byte record header and the frame bytes per frame.
//! Frames carry no FCS. tshark decodes the RoCE v2 headers of this card's frames with
//! `-d udp.port==4791,infiniband` (port 4791 is also its default for RoCE v2).
//!
//! One [`PcapSink`] may be shared by the ports of every card, so that one file holds the
//! whole conversation; wrap each port in a [`CapturingLink`] that records what it transmits
//! (each frame is then captured once, by its sender). Where the wrapper sits decides what
//! is seen: `CapturingLink<FaultyLink<_>>` records frames before fault injection,
//! `FaultyLink<CapturingLink<_>>` the frames that actually went out. A port's
//! [`LinkPort::sender`] records what it transmits into the same sink, from the same place
//! in the stack (the direction setting only concerns received frames, which a sender has
//! none of).

use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{FrameSender, LinkPort, LinkStats};

/// Classic pcap magic number (microsecond timestamps).
const PCAP_MAGIC: u32 = 0xA1B2_C3D4;
/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;
/// Largest frame recorded whole; longer frames are cut (their original length is kept).
pub const SNAPLEN: u32 = 65_535;

/// Writes pcap records to any byte sink.
pub struct PcapWriter<W: Write> {
    out: W,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&PCAP_MAGIC.to_ne_bytes());
        header[4..6].copy_from_slice(&2u16.to_ne_bytes());
        header[6..8].copy_from_slice(&4u16.to_ne_bytes());
        // 8..16: time zone offset and timestamp accuracy, both 0.
        header[16..20].copy_from_slice(&SNAPLEN.to_ne_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&header)?;
        Ok(Self { out, frames: 0 })
    }

    /// Records `frame`, seen at `time` (time since the Unix epoch).
    pub fn write_frame(&mut self, time: Duration, frame: &[u8]) -> io::Result<()> {
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let incl_len = orig_len.min(SNAPLEN);
        // incl_len <= SNAPLEN < usize::MAX, and <= frame.len().
        let kept = frame.get(..incl_len as usize).unwrap_or(frame);
        let seconds = u32::try_from(time.as_secs()).unwrap_or(u32::MAX);
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&seconds.to_ne_bytes());
        header[4..8].copy_from_slice(&time.subsec_micros().to_ne_bytes());
        header[8..12].copy_from_slice(&incl_len.to_ne_bytes());
        header[12..16].copy_from_slice(&orig_len.to_ne_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(kept)?;
        self.frames += 1;
        Ok(())
    }

    /// How many frames were recorded.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Pushes buffered records to the underlying sink.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying sink (records written so far are in it after [`PcapWriter::flush`]).
    pub fn get_ref(&self) -> &W {
        &self.out
    }
}

impl<W: Write> Drop for PcapWriter<W> {
    fn drop(&mut self) {
        if let Err(e) = self.out.flush() {
            log::warn!("pcap capture: final flush failed: {e}");
        }
    }
}

/// A pcap writer shared by several ports: cloning shares the file. Records are written
/// under a lock, each whole, in the order the ports capture them; the file is flushed when
/// the last clone is dropped.
#[derive(Clone)]
pub struct PcapSink {
    writer: Arc<Mutex<PcapWriter<Box<dyn Write + Send>>>>,
}

impl fmt::Debug for PcapSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapSink").finish_non_exhaustive()
    }
}

impl PcapSink {
    /// Creates (or truncates) the pcap file at `path`.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let file = File::create(path)?;
        Self::new(BufWriter::with_capacity(256 << 10, file))
    }

    /// Captures into any byte sink.
    pub fn new(out: impl Write + Send + 'static) -> io::Result<Self> {
        let boxed: Box<dyn Write + Send> = Box::new(out);
        Ok(Self {
            writer: Arc::new(Mutex::new(PcapWriter::new(boxed)?)),
        })
    }

    /// Records `frames`, all stamped with the current wall-clock time.
    pub fn capture(&self, frames: &[&[u8]]) -> io::Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let mut writer = self.lock()?;
        frames
            .iter()
            .try_for_each(|frame| writer.write_frame(now, frame))
    }

    /// How many frames were recorded through every clone.
    pub fn frames(&self) -> io::Result<u64> {
        Ok(self.lock()?.frames())
    }

    /// Pushes buffered records to the file, so that a reader sees every frame so far.
    pub fn flush(&self) -> io::Result<()> {
        self.lock()?.flush()
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, PcapWriter<Box<dyn Write + Send>>>> {
        // A thread that panicked while holding the lock may have left half a record.
        self.writer
            .lock()
            .map_err(|_| io::Error::other("pcap sink poisoned by a panic while writing"))
    }
}

/// Which frames a [`CapturingLink`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureDirection {
    /// Transmitted frames only: with one shared sink, every frame is recorded once.
    Transmit,
    /// Transmitted and received frames (a frame between two capturing ports is then
    /// recorded twice).
    Both,
}

/// A [`LinkPort`] that records frames into a [`PcapSink`] and passes them on unchanged.
/// A capture error is returned by the call that hit it.
pub struct CapturingLink<L: LinkPort> {
    inner: L,
    sink: PcapSink,
    direction: CaptureDirection,
}

impl<L: LinkPort> fmt::Debug for CapturingLink<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapturingLink")
            .field("direction", &self.direction)
            .finish_non_exhaustive()
    }
}

impl<L: LinkPort> CapturingLink<L> {
    /// Records `inner`'s traffic in `direction` into `sink`.
    pub fn new(inner: L, sink: PcapSink, direction: CaptureDirection) -> Self {
        Self {
            inner,
            sink,
            direction,
        }
    }

    /// The wrapped port.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped port, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The sink frames are recorded into.
    pub fn sink(&self) -> &PcapSink {
        &self.sink
    }
}

impl<L: LinkPort> LinkPort for CapturingLink<L> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.sink.capture(frames)?;
        self.inner.send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        if self.direction == CaptureDirection::Transmit {
            return self.inner.recv_frames(timeout, on_frame);
        }
        let sink = &self.sink;
        let mut capture_error = None;
        let received = self.inner.recv_frames(timeout, &mut |frame| {
            if capture_error.is_none() {
                capture_error = sink.capture(&[frame]).err();
            }
            on_frame(frame);
        })?;
        match capture_error {
            Some(e) => Err(e),
            None => Ok(received),
        }
    }

    fn stats(&self) -> &LinkStats {
        self.inner.stats()
    }

    fn waker(&self) -> Option<super::LinkWaker> {
        self.inner.waker()
    }

    fn set_sleeping(&mut self, sleeping: bool) -> bool {
        self.inner.set_sleeping(sleeping)
    }

    fn wait_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.inner.wait_fds()
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(CapturingSender {
            inner: self.inner.sender()?,
            sink: self.sink.clone(),
        }))
    }
}

/// A second transmit handle on a [`CapturingLink`]: records, then passes on.
struct CapturingSender {
    inner: Box<dyn FrameSender>,
    sink: PcapSink,
}

impl FrameSender for CapturingSender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.sink.capture(frames)?;
        self.inner.send_frames(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_classic_header_and_records() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(1_700_000_000, 123_456_789), &[1, 2, 3])
            .unwrap();
        let bytes = w.get_ref().clone();
        assert_eq!(bytes.len(), 24 + 16 + 3);
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!(word(0), 0xA1B2_C3D4);
        assert_eq!(
            &bytes[4..8],
            &[2u16.to_ne_bytes(), 4u16.to_ne_bytes()].concat()[..]
        );
        assert_eq!((word(8), word(12)), (0, 0));
        assert_eq!((word(16), word(20)), (65_535, 1));
        assert_eq!((word(24), word(28)), (1_700_000_000, 123_456));
        assert_eq!((word(32), word(36)), (3, 3));
        assert_eq!(&bytes[40..], &[1, 2, 3]);
    }

    #[test]
    fn frames_longer_than_snaplen_are_cut_but_keep_their_length() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let big = vec![0xEE; SNAPLEN as usize + 10];
        w.write_frame(Duration::ZERO, &big).unwrap();
        let bytes = w.get_ref();
        assert_eq!(bytes.len(), 24 + 16 + SNAPLEN as usize);
        assert_eq!(&bytes[32..36], &SNAPLEN.to_ne_bytes());
        assert_eq!(&bytes[36..40], &(SNAPLEN + 10).to_ne_bytes());
    }
}
