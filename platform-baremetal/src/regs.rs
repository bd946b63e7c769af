//! The card's register block, memory-mapped at a base address given at init
//! (hardware-contract.md "BAR0", layout-verification.md section 2).
//!
//! The block is an array of `volatile-register` cells, so every access is one 32-bit
//! volatile load or store; the core names registers only through [`Reg`], so no undecoded
//! offset can be touched. On RISC-V a Release fence orders memory accesses only: the
//! descriptors written before a doorbell are ordered before the doorbell's I/O store here
//! with `fence w,o`, and an I/O load is ordered before the memory reads that depend on it
//! with `fence i,r`.

use core::ptr::NonNull;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Reg;
use volatile_register::RW;

/// Bytes of the register window the driver uses: every decoded register lies below this
/// (the counters end at 0x488; the RTL decodes 16 address bits, so the BAR is larger).
pub const REG_WINDOW_BYTES: usize = 0x500;

/// The card's registers as the CPU sees them: 32-bit cells from BAR offset 0.
#[repr(C)]
pub struct RegisterBlock {
    words: [RW<u32>; REG_WINDOW_BYTES / 4],
}

/// Register access through the memory-mapped block.
pub struct MmioRegs {
    block: NonNull<RegisterBlock>,
}

impl MmioRegs {
    /// The card's registers at `base`.
    ///
    /// # Safety
    /// `base` must be the address of the card's register window (BAR offset 0), mapped for
    /// 32-bit volatile reads and writes of [`REG_WINDOW_BYTES`] bytes for as long as the
    /// returned value (or anything holding it) lives, and nothing else may treat that
    /// memory as ordinary Rust data.
    pub const unsafe fn new(base: NonNull<RegisterBlock>) -> Self {
        Self { block: base }
    }

    /// The card's registers at the physical address `addr` (firmware: the base is fixed by
    /// the FPGA design and given at build time).
    ///
    /// # Safety
    /// As [`MmioRegs::new`]; `addr` must not be 0.
    pub const unsafe fn at(addr: usize) -> Self {
        // SAFETY: the caller promises `addr` is a mapped, non-null register window.
        unsafe { Self::new(NonNull::new_unchecked(addr as *mut RegisterBlock)) }
    }

    fn cell(&self, reg: Reg) -> Option<&RW<u32>> {
        // SAFETY: `new`'s contract keeps the block mapped while `self` lives; the cells are
        // `VolatileCell`s, so a shared reference only ever performs volatile accesses.
        let block = unsafe { self.block.as_ref() };
        block.words.get(usize::from(reg.offset()) / 4)
    }
}

impl RegisterAccess for MmioRegs {
    fn read32(&self, reg: Reg) -> u32 {
        // Every decoded register lies inside the window (tested below); a miss would read
        // as the card's answer to an undecoded address, never touch memory outside.
        let value = self.cell(reg).map_or(UNDECODED, RW::read);
        after_io_read();
        value
    }

    fn write32(&self, reg: Reg, value: u32) {
        before_io_write();
        if let Some(cell) = self.cell(reg) {
            // SAFETY: `reg` is a decoded register (the type guarantees it), so the store is
            // one the card expects; the cell lies inside the mapped window.
            unsafe { cell.write(value) };
        }
    }
}

/// What the card answers to an undecoded read (the emulated NIC returns the same).
const UNDECODED: u32 = 0xAAAA_AAAA;

/// Orders earlier memory writes (descriptors in DMA memory) before the next I/O store.
#[inline(always)]
fn before_io_write() {
    #[cfg(any(target_arch = "riscv32", target_arch = "riscv64"))]
    // SAFETY: `fence` has no operands and changes no register or memory; without `nomem`
    // the asm is also a compiler barrier.
    unsafe {
        core::arch::asm!("fence w,o", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "riscv32", target_arch = "riscv64")))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

/// Orders an I/O load (a ring pointer) before the memory reads that depend on it.
#[inline(always)]
fn after_io_read() {
    #[cfg(any(target_arch = "riscv32", target_arch = "riscv64"))]
    // SAFETY: as in `before_io_write`.
    unsafe {
        core::arch::asm!("fence i,r", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "riscv32", target_arch = "riscv64")))]
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bluerdma_core::regs::{Counter, RingId, RingReg, MAX_CHANNELS};

    /// Plain memory standing in for the card's window.
    #[repr(C, align(4))]
    struct FakeWindow([u32; REG_WINDOW_BYTES / 4]);

    fn regs_over(window: &mut FakeWindow) -> MmioRegs {
        // SAFETY: the window is plain memory of the right size that outlives `regs` in
        // every test, and the tests touch it only through `regs` while `regs` lives.
        unsafe { MmioRegs::new(NonNull::from(window).cast()) }
    }

    #[test]
    fn every_decoded_register_lies_inside_the_window() {
        for off in 0..0x1_0000u32 {
            if let Some(reg) = Reg::decode(off, MAX_CHANNELS) {
                assert!(
                    usize::from(reg.offset()) + 4 <= REG_WINDOW_BYTES,
                    "decoded register {off:#x} outside the {REG_WINDOW_BYTES:#x}-byte window"
                );
            }
        }
    }

    #[test]
    fn accesses_land_on_the_registers_byte_offset() {
        let mut window = FakeWindow([0; REG_WINDOW_BYTES / 4]);
        let head = RingId::CmdRequest.reg(RingReg::Head, 1).unwrap();
        let counter = Counter::EthRdma.reg();
        {
            let regs = regs_over(&mut window);
            regs.write32(head, 0x1234);
            regs.write32(counter, 0xDEAD_BEEF);
            assert_eq!(regs.read32(head), 0x1234);
        }
        assert_eq!(window.0[0x108 / 4], 0x1234);
        assert_eq!(window.0[0x488 / 4], 0xDEAD_BEEF);
        let written: usize = window.0.iter().filter(|w| **w != 0).count();
        assert_eq!(written, 2, "no other word of the window was touched");
    }
}
