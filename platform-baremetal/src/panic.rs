//! Stopping the soft-core: [`halt`], and with the feature `panic-handler` (firmware builds
//! only, `target_os = "none"`) a panic handler that reports where it panicked and halts.
//!
//! The report is the panic's location, in the defmt log (unless the panic happened while a
//! log frame was being written) and in [`PANIC_LINE`] for a debugger or testbench. The
//! message is left out: formatting it would link `core::fmt` into every firmware.

use core::sync::atomic::AtomicU32;

/// The line of the panic that halted the firmware, or 0 (none yet).
#[no_mangle]
#[used]
pub static PANIC_LINE: AtomicU32 = AtomicU32::new(0);

/// Stops here for good: waits for interrupts forever (RISC-V `wfi`), or spins elsewhere.
pub fn halt() -> ! {
    loop {
        #[cfg(any(target_arch = "riscv32", target_arch = "riscv64"))]
        // SAFETY: `wfi` only pauses the hart until an interrupt; it touches no state.
        unsafe {
            core::arch::asm!("wfi", options(nomem, nostack, preserves_flags));
        }
        #[cfg(not(any(target_arch = "riscv32", target_arch = "riscv64")))]
        core::hint::spin_loop();
    }
}

#[cfg(all(feature = "panic-handler", target_os = "none"))]
#[panic_handler]
fn on_panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let (file, line) = info
        .location()
        .map_or(("<unknown>", u32::MAX), |l| (l.file(), l.line()));
    PANIC_LINE.store(line, core::sync::atomic::Ordering::SeqCst);
    #[cfg(feature = "defmt")]
    if !crate::logger::busy() {
        defmt::error!("panic at {=str}:{=u32}; halting", file, line);
    }
    let _ = file;
    halt()
}
