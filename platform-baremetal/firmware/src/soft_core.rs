//! The soft-core entry: platform services over this FPGA design's memory map (memory.x),
//! the self-test, and the verdict in `SELFTEST_RESULT` and the defmt log.

use core::net::Ipv4Addr;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicU32, Ordering};

use bluerdma_baremetal::clock::{cycles_to_nanos, CycleClock};
use bluerdma_baremetal::core::desc::MacAddr;
use bluerdma_baremetal::core::engine::DeviceConfig;
use bluerdma_baremetal::dma::{DmaArena, DmaPool};
use bluerdma_baremetal::firmware::{firmware_main, FirmwareConfig, FirmwareError};
use bluerdma_baremetal::memory::IdentityMemory;
use bluerdma_baremetal::panic::halt;
use bluerdma_baremetal::regs::MmioRegs;
use bluerdma_baremetal::storage::StaticStorage;
use bluerdma_baremetal::Baremetal;
use riscv::register::mcycle;

/// The NIC's register block in this FPGA design.
const REG_BASE: usize = 0x4000_0000;
/// The soft-core's clock (mcycle rate).
const CPU_HZ: u64 = 100_000_000;
/// The DMA arena: the engine's 3.3 MiB at open plus the self-test's 30 KiB buffer.
const ARENA_BYTES: usize = 4 << 20;
/// The card's address; the self-test's QPs talk to it (loopback).
const CARD_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CARD_MAC: MacAddr = MacAddr([0x02, 0x00, 10, 0, 0, 1]);

/// `SELFTEST_RESULT` while the test runs.
const RUNNING: u32 = 0;
/// `SELFTEST_RESULT` when the test passed.
const PASSED: u32 = 0x600D_0000;
/// `SELFTEST_RESULT` when the test failed: ORed with the failed step's index.
const FAILED: u32 = 0xBAD0_0000;

/// The verdict, for a debugger or a testbench that watches memory.
#[no_mangle]
#[used]
static SELFTEST_RESULT: AtomicU32 = AtomicU32::new(RUNNING);

#[link_section = ".dma"]
static mut ARENA: DmaArena<ARENA_BYTES> = DmaArena::new();

defmt::timestamp!(
    "{=u64:us}",
    cycles_to_nanos(mcycle::read64(), CPU_HZ) / 1_000
);

#[riscv_rt::entry]
fn main() -> ! {
    // SAFETY: `main` runs once and never returns, and this is the only reference ever
    // taken to ARENA, so the `&'static mut` is unique.
    let arena: &'static mut [u8] = unsafe { &mut (*addr_of_mut!(ARENA)).0 };
    let pool = DmaPool::new(arena);
    let (start, end) = pool.range();
    // SAFETY: REG_BASE is the NIC's register window in this design (memory.x), mapped for
    // 32-bit accesses and used by nothing else.
    let regs = unsafe { MmioRegs::at(REG_BASE) };
    let mut clock = CycleClock::new(CPU_HZ, mcycle::read64);
    let cfg = FirmwareConfig::new(DeviceConfig::new(CARD_MAC, CARD_IP));
    defmt::info!(
        "blue-rdma firmware: self-test on the card at {=u32:#x}",
        REG_BASE as u32
    );
    let verdict = firmware_main::<Baremetal, _>(
        regs,
        &pool,
        IdentityMemory::new(start as u64..end as u64),
        StaticStorage::<2, 8, 2, 8, 4>::new(),
        &cfg,
        &mut || clock.now(),
    );
    match verdict {
        Ok(r) => {
            defmt::info!(
                "self-test passed: {=u32} bytes, WRITE {=u64} ns, READ {=u64} ns, DMA peak {=usize} bytes",
                r.bytes,
                r.write_time.0,
                r.read_time.0,
                pool.usage().peak
            );
            SELFTEST_RESULT.store(PASSED, Ordering::SeqCst);
        }
        Err(e) => {
            let (kind, detail) = e.reason();
            defmt::error!(
                "self-test failed at {=str}: {=str} {=str}",
                e.step().name(),
                kind,
                detail
            );
            if let FirmwareError::DataMismatch {
                offset,
                expected,
                found,
                ..
            } = e
            {
                defmt::error!(
                    "byte {=u32} is {=u8:#x}, expected {=u8:#x}",
                    offset,
                    found,
                    expected
                );
            }
            SELFTEST_RESULT.store(FAILED | e.step() as u32, Ordering::SeqCst);
        }
    }
    halt()
}
