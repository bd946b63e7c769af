//! The firmware's log: defmt frames in a memory ring.
//!
//! The soft-core has no console, so the log goes to RAM: [`LogRing`] keeps the newest bytes
//! of the rzCOBS-encoded defmt stream. A debugger, or the host through a memory window,
//! finds the ring by its symbol (`BLUERDMA_DEFMT_LOG`) or its magic word, reads `written` and
//! the bytes before `written % N`, and feeds them to `defmt-print` with the firmware ELF.
//! Frames are delimited by zero bytes, so a reader that starts mid-frame resynchronises at
//! the next frame.
//!
//! With the feature `defmt-ring`, this module installs the defmt global logger that writes
//! there. It masks machine interrupts from `acquire` to `release` on RISC-V, so a frame is
//! never interleaved with one from an interrupt handler.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

use spin::Mutex;

/// "DFMT", little-endian: marks a [`LogRing`] in a memory dump.
pub const LOG_MAGIC: u32 = u32::from_le_bytes(*b"DFMT");

/// Bytes of the firmware's log ring.
pub const LOG_RING_BYTES: usize = 4096;

/// A ring of the newest `N` bytes written to it. The layout is fixed (`repr(C)`: magic,
/// capacity, bytes written so far, then the bytes) so that a memory dump can be decoded
/// without the firmware's help. The header is filled in by the first write, so an unused
/// ring is all zeros and costs no image bytes (it lives in `.bss`).
#[repr(C)]
pub struct LogRing<const N: usize> {
    magic: AtomicU32,
    capacity: AtomicU32,
    /// Bytes ever written (wraps at 2^32; the newest byte is at `(written - 1) % N`).
    written: AtomicU32,
    bytes: UnsafeCell<[u8; N]>,
    lock: Mutex<()>,
}

// SAFETY: `bytes` is only touched while `lock` is held, so shared references from several
// contexts never race on it; the other fields are atomic.
unsafe impl<const N: usize> Sync for LogRing<N> {}

impl<const N: usize> LogRing<N> {
    /// An empty ring. `N` must be a power of two, so that the position survives the
    /// 32-bit byte count wrapping.
    pub const fn new() -> Self {
        const { assert!(N.is_power_of_two(), "LogRing size must be a power of two") };
        Self {
            magic: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            written: AtomicU32::new(0),
            bytes: UnsafeCell::new([0; N]),
            lock: Mutex::new(()),
        }
    }

    /// Appends `data`, overwriting the oldest bytes when full.
    pub fn write(&self, data: &[u8]) {
        let _held = self.lock.lock();
        if self.magic.load(Ordering::Relaxed) == 0 {
            self.capacity.store(N as u32, Ordering::Relaxed);
            self.magic.store(LOG_MAGIC, Ordering::Relaxed);
        }
        // Only the last N bytes of a long write can survive; the skipped ones still count,
        // so the stream position stays continuous for readers.
        let skipped = data.len().saturating_sub(N);
        let written = self.written.load(Ordering::Relaxed) as usize;
        let mut pos = (written % N + skipped % N) % N;
        // SAFETY: the lock is held, so this is the only reference to the bytes.
        let bytes = unsafe { &mut *self.bytes.get() };
        for &b in data.get(skipped..).unwrap_or_default() {
            if let Some(slot) = bytes.get_mut(pos) {
                *slot = b;
            }
            pos = (pos + 1) % N;
        }
        self.written.fetch_add(data.len() as u32, Ordering::Release);
    }

    /// Bytes ever written (modulo 2^32).
    pub fn written(&self) -> u32 {
        self.written.load(Ordering::Acquire)
    }

    /// Copies the newest `min(out.len(), N, written)` bytes, oldest first, into the front
    /// of `out`; returns how many.
    pub fn copy_newest(&self, out: &mut [u8]) -> usize {
        let _held = self.lock.lock();
        let written = self.written.load(Ordering::Relaxed) as usize;
        let n = out.len().min(N).min(written);
        // SAFETY: the lock is held, so no writer changes the bytes meanwhile.
        let bytes = unsafe { &*self.bytes.get() };
        let start = (written % N + N - n) % N;
        for (i, o) in out.iter_mut().take(n).enumerate() {
            *o = bytes.get((start + i) % N).copied().unwrap_or(0);
        }
        n
    }
}

impl<const N: usize> Default for LogRing<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The firmware's log ring, written by the defmt global logger (feature `defmt-ring`).
#[no_mangle]
#[used]
pub static BLUERDMA_DEFMT_LOG: LogRing<LOG_RING_BYTES> = LogRing::new();

/// Whether a defmt frame is being written now (a panic handler must not start another).
pub fn busy() -> bool {
    #[cfg(feature = "defmt-ring")]
    {
        global::TAKEN.load(Ordering::Acquire)
    }
    #[cfg(not(feature = "defmt-ring"))]
    {
        false
    }
}

#[cfg(feature = "defmt-ring")]
mod global {
    use core::cell::UnsafeCell;
    use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::BLUERDMA_DEFMT_LOG;

    /// Set from `acquire` to `release`.
    pub(super) static TAKEN: AtomicBool = AtomicBool::new(false);
    /// The interrupt-enable state to restore at `release`.
    static SAVED_IRQ: AtomicUsize = AtomicUsize::new(0);

    struct EncoderCell(UnsafeCell<defmt::Encoder>);
    // SAFETY: the encoder is used only between `acquire` and `release`, which `TAKEN` makes
    // exclusive to one context at a time.
    unsafe impl Sync for EncoderCell {}
    static ENCODER: EncoderCell = EncoderCell(UnsafeCell::new(defmt::Encoder::new()));

    fn sink(bytes: &[u8]) {
        BLUERDMA_DEFMT_LOG.write(bytes);
    }

    /// The defmt global logger of the firmware: frames go to [`BLUERDMA_DEFMT_LOG`].
    #[defmt::global_logger]
    struct RingLogger;

    // SAFETY: `acquire` makes the logger exclusive (interrupts masked, `TAKEN` set), the
    // other functions touch the encoder only while it is held, and `release` undoes both.
    unsafe impl defmt::Logger for RingLogger {
        fn acquire() {
            let saved = irq::disable();
            if TAKEN.swap(true, Ordering::Acquire) {
                irq::restore(saved);
                // defmt's contract for a nested acquire.
                panic!("defmt logger acquired twice");
            }
            SAVED_IRQ.store(saved, Ordering::Relaxed);
            // SAFETY: `TAKEN` was clear and is now ours: no other reference to the encoder.
            unsafe { (*ENCODER.0.get()).start_frame(sink) };
        }

        unsafe fn flush() {}

        unsafe fn release() {
            // SAFETY: the caller holds the logger (defmt's contract), so the encoder is ours.
            unsafe { (*ENCODER.0.get()).end_frame(sink) };
            let saved = SAVED_IRQ.load(Ordering::Relaxed);
            TAKEN.store(false, Ordering::Release);
            irq::restore(saved);
        }

        unsafe fn write(bytes: &[u8]) {
            // SAFETY: as in `release`.
            unsafe { (*ENCODER.0.get()).write(bytes, sink) };
        }
    }

    /// Machine-mode interrupt masking (mstatus.MIE); nothing to do elsewhere.
    mod irq {
        /// Clears MIE; returns the previous mstatus.
        #[inline(always)]
        pub fn disable() -> usize {
            #[cfg(any(target_arch = "riscv32", target_arch = "riscv64"))]
            {
                let old: usize;
                // SAFETY: reads and clears mstatus.MIE (bit 3), which only masks machine
                // interrupts; the firmware runs in machine mode.
                unsafe { core::arch::asm!("csrrci {0}, mstatus, 8", out(reg) old) };
                old
            }
            #[cfg(not(any(target_arch = "riscv32", target_arch = "riscv64")))]
            0
        }

        /// Sets MIE again if `saved` had it.
        #[inline(always)]
        pub fn restore(saved: usize) {
            #[cfg(any(target_arch = "riscv32", target_arch = "riscv64"))]
            if saved & 8 != 0 {
                // SAFETY: re-enables machine interrupts that were enabled before `disable`.
                unsafe { core::arch::asm!("csrsi mstatus, 8") };
            }
            #[cfg(not(any(target_arch = "riscv32", target_arch = "riscv64")))]
            let _ = saved;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_in_order() {
        let ring = LogRing::<8>::new();
        ring.write(b"abc");
        let mut out = [0u8; 16];
        assert_eq!(ring.copy_newest(&mut out), 3);
        assert_eq!(&out[..3], b"abc");
        ring.write(b"defghij");
        assert_eq!(ring.written(), 10);
        let n = ring.copy_newest(&mut out);
        assert_eq!(&out[..n], b"cdefghij");
        // A write longer than the ring keeps its tail and counts every byte.
        ring.write(b"0123456789AB");
        assert_eq!(ring.written(), 22);
        let n = ring.copy_newest(&mut out);
        assert_eq!(&out[..n], b"456789AB");
        let mut small = [0u8; 3];
        assert_eq!(ring.copy_newest(&mut small), 3);
        assert_eq!(&small, b"9AB");
    }

    #[test]
    fn the_header_is_findable_in_a_memory_dump() {
        let ring = LogRing::<16>::new();
        // SAFETY: as below.
        let unused = unsafe { core::ptr::read(&ring as *const LogRing<16> as *const [u32; 3]) };
        assert_eq!(unused, [0; 3], "an unused ring is all zeros (.bss)");
        ring.write(&[1, 2, 3]);
        // SAFETY: `LogRing` is repr(C) and at least 12 bytes long; reads plain integers.
        let header = unsafe { core::ptr::read(&ring as *const LogRing<16> as *const [u32; 3]) };
        assert_eq!(header, [LOG_MAGIC, 16, 3]);
    }
}
