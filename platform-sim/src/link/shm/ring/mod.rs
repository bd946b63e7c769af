//! One direction of the shared-memory link: a ring of frame slots in a sealed memfd that
//! the sending card creates, maps and passes to the receiving card ([`super::bell`]).
//!
//! Layout (version 1; integers in the host's byte order, both ends run on one host):
//!
//! | Bytes | Field | Written by |
//! |---|---|---|
//! | 0..8 | magic `BLRDRING` | sender, once |
//! | 8..12 | version, 1 | sender, once |
//! | 12..16 | header length, 4096 | sender, once |
//! | 16..20 | slot count N (a power of two, 2..=65536) | sender, once |
//! | 20..24 | slot length S (a multiple of 64, 128..=65600) | sender, once |
//! | 24..28, 28..32 | source and destination card IPv4 (octets as a big-endian u32) | sender, once |
//! | 32..36 | the link's UDP port | sender, once |
//! | 36..40 | the sender's pid (for people reading a dump) | sender, once |
//! | 40..48 | nonce: tells this ring from an earlier one of the same sender | sender, once |
//! | 128..136 | head: slots published, counting from 0 | sender |
//! | 136..140 | closed: 1 once the sender has gone | sender |
//! | 144..152 | frames the sender dropped because the ring stayed full | sender |
//! | 256..264 | tail: slots consumed | receiver |
//! | 264..268 | sleeping: 1 while the receiver waits for a wake-up | receiver, cleared by the sender |
//! | 272..280 | attached: the nonce while the receiver reads the ring, 0 before and after | receiver |
//! | 4096.. | N slots of S bytes: frame length L (u32), 4 reserved bytes, the L frame bytes | sender |
//!
//! Slot `i % N` holds frame `i`. The sender writes frames at its own head and then
//! publishes the new head (Release); the receiver reads up to the head it observed
//! (Acquire), copies each frame out, then publishes its tail. Each side keeps its own copy
//! of the index it owns and never trusts the other's: a head more than N slots ahead of the
//! receiver's tail, or a tail behind it, is a [`RingError::Corrupt`] ring, and a slot
//! length of 0 or more than S − 8 is a bad frame, skipped.
//!
//! The memfd is sealed against shrinking and growing before it is passed, and the receiver
//! checks the seals: neither side can make the other's mapping shorter than the file, so
//! no access faults. Nothing in the mapping is ever borrowed as a Rust reference to plain
//! bytes: indices and lengths are atomics, and frame bytes are copied in and out with
//! bounds-checked raw copies, so a peer that writes garbage (or writes while we copy) makes
//! us copy garbage, which the card checks like any frame from the wire.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// First eight bytes of a ring.
pub const MAGIC: u64 = u64::from_le_bytes(*b"BLRDRING");
/// The layout version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the first slot.
pub const HEADER_LEN: usize = 4096;
/// Bytes before a frame in its slot.
pub const SLOT_HEADER: usize = 8;
/// Fewest and most slots of a ring.
pub const MIN_SLOTS: u32 = 2;
/// See [`MIN_SLOTS`].
pub const MAX_SLOTS: u32 = 1 << 16;
/// Shortest and longest slot (a multiple of 64 so that every slot starts on a cache line).
pub const MIN_SLOT_LEN: u32 = 128;
/// See [`MIN_SLOT_LEN`]: a 64 KiB frame and its slot header, rounded up to 64.
pub const MAX_SLOT_LEN: u32 = 65_600;
/// The largest ring a receiver maps.
pub const MAX_RING_BYTES: usize = 256 << 20;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_HEADER_LEN: usize = 12;
const OFF_SLOT_COUNT: usize = 16;
const OFF_SLOT_LEN: usize = 20;
const OFF_SRC: usize = 24;
const OFF_DST: usize = 28;
const OFF_PORT: usize = 32;
const OFF_PID: usize = 36;
const OFF_NONCE: usize = 40;
const OFF_HEAD: usize = 128;
const OFF_CLOSED: usize = 136;
const OFF_DROPPED: usize = 144;
const OFF_TAIL: usize = 256;
const OFF_SLEEPING: usize = 264;
const OFF_ATTACHED: usize = 272;

/// The slots of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// How many slots (a power of two).
    pub slots: u32,
    /// Bytes per slot, its 8-byte header included.
    pub slot_len: u32,
}

impl Geometry {
    /// Checks the limits of the layout; the size of the whole ring in bytes.
    pub fn check(&self) -> Result<usize, RingError> {
        let ok = self.slots.is_power_of_two()
            && (MIN_SLOTS..=MAX_SLOTS).contains(&self.slots)
            && (MIN_SLOT_LEN..=MAX_SLOT_LEN).contains(&self.slot_len)
            && self.slot_len % 64 == 0;
        let bytes = HEADER_LEN + self.slots as usize * self.slot_len as usize;
        if !ok || bytes > MAX_RING_BYTES {
            return Err(RingError::BadGeometry(*self));
        }
        Ok(bytes)
    }

    /// The longest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.slot_len as usize - SLOT_HEADER
    }
}

/// Which ring this is: its two cards, their link's port, and the sender's nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingId {
    /// The sending card.
    pub src: Ipv4Addr,
    /// The receiving card.
    pub dst: Ipv4Addr,
    /// The UDP port of the link.
    pub port: u16,
    /// Chosen by the sender for each ring it creates.
    pub nonce: u64,
}

/// Why a ring cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The memory is shorter than the header, or not the size its geometry gives.
    BadSize {
        /// Bytes of the memfd.
        len: u64,
        /// Bytes the header announces (0 if the header itself did not fit).
        expected: u64,
    },
    /// The first eight bytes are not [`MAGIC`].
    BadMagic(u64),
    /// A version this code does not read.
    UnknownVersion(u32),
    /// The header length is not [`HEADER_LEN`].
    BadHeaderLen(u32),
    /// Slot count or slot length outside the limits.
    BadGeometry(Geometry),
    /// The ring's cards, port or nonce are not those of the announcement.
    WrongRing {
        /// What the header says.
        found: RingId,
        /// What the announcement said.
        expected: RingId,
    },
    /// The memfd may still shrink or grow (its seals are given).
    NotSealed(i32),
    /// The peer's index is impossible given ours: head and tail are given.
    Corrupt {
        /// The sender's published head.
        head: u64,
        /// The receiver's tail.
        tail: u64,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadSize { len, expected } => {
                write!(f, "ring of {len} bytes, expected {expected}")
            }
            Self::BadMagic(m) => write!(f, "bad ring magic {m:#018x}"),
            Self::UnknownVersion(v) => write!(f, "unknown ring version {v}"),
            Self::BadHeaderLen(l) => write!(f, "ring header length {l}, expected {HEADER_LEN}"),
            Self::BadGeometry(g) => write!(
                f,
                "ring of {} slots of {} bytes is outside the limits",
                g.slots, g.slot_len
            ),
            Self::WrongRing { found, expected } => {
                write!(f, "ring is {found:?}, announced as {expected:?}")
            }
            Self::NotSealed(s) => write!(f, "ring memory is not sealed (seals {s:#x})"),
            Self::Corrupt { head, tail } => {
                write!(f, "ring indices impossible: head {head}, tail {tail}")
            }
        }
    }
}

impl std::error::Error for RingError {}

impl From<RingError> for io::Error {
    fn from(e: RingError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A shared mapping of a whole memfd, at least [`HEADER_LEN`] bytes long.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Kept open for as long as the mapping lives (and passed to the peer from here).
    fd: OwnedFd,
}

// SAFETY: the mapping is shared memory that both processes already access concurrently;
// this code reaches it only through atomics and bounds-checked raw copies, never through
// references to plain bytes, so moving or sharing the handle between threads adds nothing.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all `len` bytes of `fd` for reading and writing, shared.
    fn new(fd: OwnedFd, len: usize) -> io::Result<Self> {
        if len < HEADER_LEN {
            return Err(RingError::BadSize {
                len: len as u64,
                expected: HEADER_LEN as u64,
            }
            .into());
        }
        // SAFETY: a fresh mapping chosen by the kernel (no address hint, so nothing of ours
        // is replaced), of a file the caller checked is at least `len` bytes and cannot
        // shrink (sealed), so no access within `len` faults.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(Self { ptr, len, fd })
    }

    /// The u32 at header offset `off` (a constant below [`HEADER_LEN`], 4-aligned).
    fn u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= HEADER_LEN);
        // SAFETY: `off + 4 <= HEADER_LEN <= len` and the mapping is page-aligned, so the
        // pointer is in bounds and 4-aligned for the mapping's lifetime (borrowed from
        // self); the memory is only ever accessed atomically or by raw byte copies.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }

    /// The u64 at header offset `off` (a constant below [`HEADER_LEN`], 8-aligned).
    fn u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= HEADER_LEN);
        // SAFETY: as in `u32`, with 8 bytes and 8-alignment.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast()) }
    }

    /// The length word of the slot at byte `off` (a slot start: 64-aligned, checked in
    /// bounds by the caller's geometry and here).
    fn slot_len_word(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: in bounds and 4-aligned (checked above) for the mapping's lifetime.
        Some(unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) })
    }

    /// Copies `bytes` to offset `off`; false (and nothing written) if it does not fit.
    fn write(&self, off: usize, bytes: &[u8]) -> bool {
        if off
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        // SAFETY: the destination range is inside the mapping (checked above) and cannot
        // overlap `bytes`, which is private memory of this process.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(off), bytes.len())
        };
        true
    }

    /// Copies `out.len()` bytes from offset `off`; false (and `out` untouched) if the range
    /// is not inside the mapping.
    fn read(&self, off: usize, out: &mut [u8]) -> bool {
        if off.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        // SAFETY: the source range is inside the mapping (checked above), `out` is private
        // memory of this process, so they do not overlap; the bytes are copied before
        // anything looks at them, whatever the peer writes meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is the one mmap returned, and no reference into it outlives
        // self (every accessor borrows self).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn ip_word(ip: Ipv4Addr) -> u32 {
    u32::from_be_bytes(ip.octets())
}

/// The identity recorded in a header.
fn header_id(m: &Mapping) -> RingId {
    RingId {
        src: Ipv4Addr::from(m.u32(OFF_SRC).load(Ordering::Relaxed).to_be_bytes()),
        dst: Ipv4Addr::from(m.u32(OFF_DST).load(Ordering::Relaxed).to_be_bytes()),
        port: m.u32(OFF_PORT).load(Ordering::Relaxed) as u16,
        nonce: m.u64(OFF_NONCE).load(Ordering::Relaxed),
    }
}

/// Where slot `index` starts.
fn slot_offset(geo: &Geometry, index: u64) -> usize {
    // The slot count is a power of two, so the remainder is the low bits, below 65 536.
    let slot = (index & u64::from(geo.slots - 1)) as usize;
    HEADER_LEN + slot * geo.slot_len as usize
}

/// The sending end of a ring.
pub struct TxRing {
    map: Mapping,
    geo: Geometry,
    id: RingId,
    /// Our head: frames written (published or not).
    head: u64,
    /// The head the receiver can see.
    published: u64,
    /// Slots known to be free since the receiver's tail was last read: the tail is read
    /// again only when these run out ([`TxRing::has_room`]), not once per frame, so the
    /// cache line the receiver writes is not pulled across for every frame.
    known_free: u64,
}

impl fmt::Debug for TxRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxRing")
            .field("id", &self.id)
            .field("geo", &self.geo)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl TxRing {
    /// Creates the ring's memfd, sized and sealed, and writes its header.
    pub fn create(id: RingId, geo: Geometry) -> io::Result<Self> {
        let bytes = geo.check()?;
        let name = CString::new(format!("bluerdma-link {}->{}:{}", id.src, id.dst, id.port))
            .map_err(io::Error::other)?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd);
        file.set_len(bytes as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::new(file.into(), bytes)?;
        map.u32(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        map.u32(OFF_HEADER_LEN)
            .store(HEADER_LEN as u32, Ordering::Relaxed);
        map.u32(OFF_SLOT_COUNT).store(geo.slots, Ordering::Relaxed);
        map.u32(OFF_SLOT_LEN).store(geo.slot_len, Ordering::Relaxed);
        map.u32(OFF_SRC).store(ip_word(id.src), Ordering::Relaxed);
        map.u32(OFF_DST).store(ip_word(id.dst), Ordering::Relaxed);
        map.u32(OFF_PORT)
            .store(u32::from(id.port), Ordering::Relaxed);
        map.u32(OFF_PID)
            .store(std::process::id(), Ordering::Relaxed);
        map.u64(OFF_NONCE).store(id.nonce, Ordering::Relaxed);
        // The magic last, after the fields it vouches for.
        map.u64(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Self {
            map,
            geo,
            id,
            head: 0,
            published: 0,
            known_free: 0,
        })
    }

    /// The memfd, to pass to the receiver.
    pub fn fd(&self) -> &OwnedFd {
        &self.map.fd
    }

    /// Which ring this is.
    pub fn id(&self) -> RingId {
        self.id
    }

    /// The longest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.geo.max_frame()
    }

    /// Whether the receiver has attached to this ring (written its nonce back).
    pub fn attached(&self) -> bool {
        self.map.u64(OFF_ATTACHED).load(Ordering::Acquire) == self.id.nonce
    }

    /// Free slots, from the receiver's tail; a tail that is ahead of our head, or so far
    /// behind that more than N slots would be in use, is an error.
    pub fn free_slots(&mut self) -> Result<u64, RingError> {
        let tail = self.map.u64(OFF_TAIL).load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        let slots = u64::from(self.geo.slots);
        self.known_free = 0;
        if used > slots || tail > self.published {
            return Err(RingError::Corrupt {
                head: self.head,
                tail,
            });
        }
        self.known_free = slots - used;
        Ok(self.known_free)
    }

    /// Whether the next slot is free: from the slots known free, or else from the
    /// receiver's tail, read again ([`TxRing::free_slots`]).
    pub fn has_room(&mut self) -> Result<bool, RingError> {
        if self.known_free > 0 {
            return Ok(true);
        }
        Ok(self.free_slots()? > 0)
    }

    /// Writes `frame` into the next slot without publishing it; false if it is empty or
    /// longer than a slot holds, or if the ring is full or broken ([`TxRing::has_room`]).
    pub fn push(&mut self, frame: &[u8]) -> bool {
        let Ok(len) = u32::try_from(frame.len()) else {
            return false;
        };
        if frame.is_empty()
            || frame.len() > self.geo.max_frame()
            || !self.has_room().unwrap_or(false)
        {
            return false;
        }
        let off = slot_offset(&self.geo, self.head);
        let Some(word) = self.map.slot_len_word(off) else {
            return false;
        };
        if !self.map.write(off + SLOT_HEADER, frame) {
            return false;
        }
        word.store(len, Ordering::Relaxed);
        self.head += 1;
        self.known_free -= 1;
        true
    }

    /// Frames written and not yet published.
    pub fn unpublished(&self) -> u64 {
        self.head - self.published
    }

    /// Publishes every frame written, and says whether the receiver was asleep waiting for
    /// them (then the caller wakes it; the flag is cleared here so that one sleep gets one
    /// wake-up).
    pub fn publish(&mut self) -> bool {
        if self.head != self.published {
            // Release: the slots' bytes are visible before the head that covers them.
            self.map.u64(OFF_HEAD).store(self.head, Ordering::Release);
            self.published = self.head;
        }
        // SeqCst on both sides (here and RxRing::sleep_check) orders our head store before
        // the flag read, and the receiver's flag store before its head read: one of us sees
        // the other.
        fence(Ordering::SeqCst);
        let sleeping = self.map.u32(OFF_SLEEPING);
        sleeping.load(Ordering::SeqCst) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0
    }

    /// Counts `n` frames dropped because the ring stayed full.
    pub fn add_dropped(&self, n: u64) {
        self.map.u64(OFF_DROPPED).fetch_add(n, Ordering::Relaxed);
    }

    /// Writes `bytes` at byte `off` of the ring, header or slots, as a broken or hostile
    /// sender might (for tests; offsets as in the module's table); false if out of bounds.
    pub fn write_raw(&self, off: usize, bytes: &[u8]) -> bool {
        self.map.write(off, bytes)
    }

    /// Marks the ring closed: the receiver drains it and lets it go.
    pub fn close(&self) {
        self.map.u32(OFF_CLOSED).store(1, Ordering::Release);
    }
}

impl Drop for TxRing {
    fn drop(&mut self) {
        self.publish();
        self.close();
    }
}

/// The receiving end of a ring.
pub struct RxRing {
    map: Mapping,
    geo: Geometry,
    id: RingId,
    /// Our tail: frames consumed.
    tail: u64,
}

impl fmt::Debug for RxRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxRing")
            .field("id", &self.id)
            .field("geo", &self.geo)
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

/// Frames a receiver consumes before it publishes its tail within one batch.
const TAIL_EVERY: u64 = 32;

impl RxRing {
    /// Maps a ring passed by a sender and checks it against `expected`: the seals, the
    /// size, the magic, the version, the geometry and the identity.
    pub fn open(fd: OwnedFd, expected: &RingId) -> io::Result<Self> {
        // SAFETY: fcntl on a descriptor we own, without a pointer argument.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & need != need {
            return Err(RingError::NotSealed(seals).into());
        }
        let file = std::fs::File::from(fd);
        let len = file.metadata()?.len();
        if len < HEADER_LEN as u64 || len > MAX_RING_BYTES as u64 {
            return Err(RingError::BadSize { len, expected: 0 }.into());
        }
        let map = Mapping::new(file.into(), len as usize)?;
        let magic = map.u64(OFF_MAGIC).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(RingError::BadMagic(magic).into());
        }
        let version = map.u32(OFF_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(RingError::UnknownVersion(version).into());
        }
        let header_len = map.u32(OFF_HEADER_LEN).load(Ordering::Relaxed);
        if header_len as usize != HEADER_LEN {
            return Err(RingError::BadHeaderLen(header_len).into());
        }
        let geo = Geometry {
            slots: map.u32(OFF_SLOT_COUNT).load(Ordering::Relaxed),
            slot_len: map.u32(OFF_SLOT_LEN).load(Ordering::Relaxed),
        };
        let bytes = geo.check()?;
        if bytes as u64 != len {
            return Err(RingError::BadSize {
                len,
                expected: bytes as u64,
            }
            .into());
        }
        let found = header_id(&map);
        if found != *expected {
            return Err(RingError::WrongRing {
                found,
                expected: *expected,
            }
            .into());
        }
        let ring = Self {
            map,
            geo,
            id: found,
            tail: 0,
        };
        // A new ring starts empty; anything else is the sender's mistake, found now.
        ring.pending()?;
        Ok(ring)
    }

    /// Which ring this is.
    pub fn id(&self) -> RingId {
        self.id
    }

    /// The ring's slots.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Tells the sender that we read this ring.
    pub fn acknowledge(&self) {
        self.map
            .u64(OFF_ATTACHED)
            .store(self.id.nonce, Ordering::Release);
    }

    /// Frames published and not yet consumed.
    pub fn pending(&self) -> Result<u64, RingError> {
        // Acquire: the slots up to this head are written before we read them.
        let head = self.map.u64(OFF_HEAD).load(Ordering::Acquire);
        let ready = head.wrapping_sub(self.tail);
        if ready > u64::from(self.geo.slots) {
            return Err(RingError::Corrupt {
                head,
                tail: self.tail,
            });
        }
        Ok(ready)
    }

    /// Copies up to `max` published frames out, one at a time, into `scratch` (at least
    /// [`Geometry::max_frame`] bytes) and hands each to `on_frame`. Returns the frames
    /// delivered and the slots skipped because their length was impossible.
    pub fn pop(
        &mut self,
        max: u64,
        scratch: &mut [u8],
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> Result<(usize, u64), RingError> {
        let ready = self.pending()?.min(max);
        let (mut delivered, mut bad) = (0, 0);
        for i in 0..ready {
            let off = slot_offset(&self.geo, self.tail);
            let len = self
                .map
                .slot_len_word(off)
                .map_or(0, |w| w.load(Ordering::Relaxed)) as usize;
            let possible = len > 0 && len <= self.geo.max_frame();
            let copied = match scratch.get_mut(..len).filter(|_| possible) {
                Some(frame) => self.map.read(off + SLOT_HEADER, frame),
                None => false,
            };
            match scratch.get(..len).filter(|_| copied) {
                Some(frame) => {
                    on_frame(frame);
                    delivered += 1;
                }
                None => bad += 1,
            }
            self.tail += 1;
            if (i + 1) % TAIL_EVERY == 0 {
                self.publish_tail();
            }
        }
        if ready > 0 {
            self.publish_tail();
        }
        Ok((delivered, bad))
    }

    fn publish_tail(&self) {
        // Release: our copies out of the slots are done before the sender may reuse them.
        self.map.u64(OFF_TAIL).store(self.tail, Ordering::Release);
    }

    /// Raises or lowers the flag that asks the sender for a wake-up. Raising it returns
    /// whether frames are already waiting (then the caller must not sleep).
    pub fn set_sleeping(&self, sleeping: bool) -> bool {
        let flag = self.map.u32(OFF_SLEEPING);
        if !sleeping {
            flag.store(0, Ordering::Relaxed);
            return false;
        }
        flag.store(1, Ordering::SeqCst);
        // See TxRing::publish.
        fence(Ordering::SeqCst);
        !matches!(self.pending(), Ok(0))
    }

    /// Whether the sender has closed the ring.
    pub fn closed(&self) -> bool {
        self.map.u32(OFF_CLOSED).load(Ordering::Acquire) != 0
    }

    /// The sender's count of frames it dropped for a full ring.
    pub fn dropped(&self) -> u64 {
        self.map.u64(OFF_DROPPED).load(Ordering::Relaxed)
    }
}

impl Drop for RxRing {
    /// Takes the acknowledgement back: a sender that still writes finds out (at its next
    /// probe or full ring) that nobody reads, and goes back to UDP.
    fn drop(&mut self) {
        self.map.u64(OFF_ATTACHED).store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
