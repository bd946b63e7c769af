//! The firmware's logic on the emulated NIC: the very function the soft-core runs
//! (`firmware_main`), driven against an in-process emulated card whose link loops packets
//! back to the card itself, with the bare-metal memory services (static DMA pool with
//! identity addresses, identity translation) standing in for the soft-core's RAM.

use std::alloc::{alloc_zeroed, Layout};
use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::time::Instant as StdInstant;

use bluerdma_baremetal::dma::{DmaArena, DmaPool};
use bluerdma_baremetal::firmware::{firmware_main, FirmwareConfig, FirmwareError, Step};
use bluerdma_baremetal::memory::IdentityMemory;
use bluerdma_baremetal::regs::{MmioRegs, RegisterBlock, REG_WINDOW_BYTES};
use bluerdma_baremetal::storage::StaticStorage;
use bluerdma_baremetal::Baremetal;
use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::desc::MacAddr;
use bluerdma_core::engine::{DeviceConfig, VerbsError, WcOpcode, WcStatus};
use bluerdma_core::platform::{NoOob, Platform, PlatformError, RegisterAccess};
use bluerdma_core::regs::Reg;
use bluerdma_core::time::Instant;
use bluerdma_sim::inproc::{InProcessCard, SimRegs};
use bluerdma_sim::link::MemHub;
use bluerdma_sim::mem::{HostDma, HostMemory};
use bluerdma_sim::model::NicConfig;

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// The firmware's arena: the engine needs 3.3 MiB at open (dma.rs).
const ARENA: usize = 4 << 20;

/// The soft-core's memory services over an emulated card's registers.
struct FirmwareOnSim<'a>(PhantomData<&'a DmaPool>);

impl<'a> Platform for FirmwareOnSim<'a> {
    type Regs = SimRegs;
    type Dma = &'a DmaPool;
    type Mem = IdentityMemory;
    type Oob = NoOob;
}

/// The emulator's own memory services (heap buffers, offset device addresses).
struct SimServices;

impl Platform for SimServices {
    type Regs = SimRegs;
    type Dma = HostDma;
    type Mem = HostMemory;
    type Oob = NoOob;
}

/// The firmware's storage: two QPs, two CQs, a few MRs.
type FwStorage = StaticStorage<2, 8, 2, 8, 4>;

fn device_config() -> DeviceConfig {
    DeviceConfig::new(MacAddr([0x02, 0, 127, 0, 0, 9]), IP)
}

fn std_clock() -> impl FnMut() -> Instant {
    let epoch = StdInstant::now();
    move || Instant(epoch.elapsed().as_nanos() as u64)
}

/// A 2 MiB-aligned arena of `N` bytes that lives for the rest of the test process, as the
/// firmware's `static` does.
fn leak_arena<const N: usize>() -> &'static mut [u8] {
    // Allocated on the heap directly: it is too large for a test thread's stack.
    let layout = Layout::new::<DmaArena<N>>();
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) };
    assert!(!ptr.is_null(), "cannot allocate a {N}-byte arena");
    // SAFETY: `ptr` is valid for N zeroed bytes with the arena's alignment, and is never
    // freed, so the slice may live for the rest of the process.
    unsafe { std::slice::from_raw_parts_mut(ptr, N) }
}

/// An emulated card on its own hub: frames to its own IP come back to it.
fn card() -> InProcessCard {
    let hub = MemHub::new();
    InProcessCard::start(
        NicConfig {
            name: "fw0".into(),
            ..NicConfig::default()
        },
        Box::new(hub.attach(IP).unwrap()),
    )
    .unwrap()
}

/// A pool over a fresh arena that the card reaches at identity addresses, as on the
/// soft-core where the card and the CPU share physical memory; and the identity resolver
/// for the same window.
fn identity_memory(card: &InProcessCard, arena: &'static mut [u8]) -> (DmaPool, IdentityMemory) {
    let (ptr, len) = (arena.as_mut_ptr(), arena.len());
    // SAFETY: the arena is leaked, so it stays valid for the card's whole life.
    unsafe { card.map.insert(DeviceAddr(ptr as u64), ptr, len) };
    let pool = DmaPool::new(arena);
    let (start, end) = pool.range();
    (pool, IdentityMemory::new(start as u64..end as u64))
}

#[test]
fn the_firmware_writes_and_reads_back_through_the_card_in_loopback() {
    let card = card();
    let (pool, mem) = identity_memory(&card, leak_arena::<ARENA>());
    let cfg = FirmwareConfig::new(device_config());
    let report = firmware_main::<FirmwareOnSim, _>(
        card.regs.clone(),
        &pool,
        mem,
        FwStorage::new(),
        &cfg,
        &mut std_clock(),
    )
    .unwrap_or_else(|e| panic!("{e}; card {}", card.nic.stats().snapshot()));

    assert_eq!(report.bytes, 10_000);
    assert_eq!(
        (report.write.wr_id, report.write.status, report.write.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(
        (report.read.wr_id, report.read.status, report.read.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(report.write.qp_num, report.qp_a.get());
    assert_eq!(report.read.qp_num, report.qp_b.get());
    assert_eq!(report.read.byte_len, 10_000);
    assert_eq!(report.stats.retransmits, 0, "a clean link needs no retry");
    assert_eq!(report.stats.bad_reports, 0);

    // The packets really crossed the card: three 4 KiB packets each for the WRITE and
    // the READ response, all accepted, nothing faulted.
    let nic = card.nic.stats().snapshot();
    assert_eq!(nic.dma_faults, 0, "{nic}");
    // No data packet failed a check. (An ACK frame still in flight when the firmware
    // destroys its QPs is dropped as InvalidQpContext, as on the card: that is allowed.)
    for c in [
        bluerdma_core::regs::Counter::InvalidQpAccess,
        bluerdma_core::regs::Counter::InvalidMrKey,
        bluerdma_core::regs::Counter::MemOutOfBounds,
        bluerdma_core::regs::Counter::InvalidMrAccess,
        bluerdma_core::regs::Counter::PacketLengthError,
    ] {
        assert_eq!(card.nic.regs().counter(c), 0, "{c:?}: {nic}");
    }
    assert!(
        nic.rx_check_failed
            <= card
                .nic
                .regs()
                .counter(bluerdma_core::regs::Counter::InvalidQpContext) as u64,
        "{nic}"
    );
    assert!(nic.rx_payload_bytes >= 20_000, "{nic}");
    // The firmware gave every DMA byte back.
    let usage = pool.usage();
    assert_eq!((usage.in_use, usage.bad_frees), (0, 0), "{usage:?}");
    assert!(
        usage.peak > 3 << 20,
        "the engine's rings were in the pool: {usage:?}"
    );
}

#[test]
fn the_same_logic_runs_on_the_emulators_own_memory_services_across_a_psn_wrap() {
    let card = card();
    let mut cfg = FirmwareConfig::new(device_config());
    // 100000 bytes: 25 packets in two 64 KiB chunks, starting 3 PSNs below the 24-bit wrap.
    cfg.transfer_len = 100_000;
    cfg.psn_a = 0xFF_FFFD;
    cfg.psn_b = 0xFF_FFFF;
    cfg.seed = 0xC3;
    let report = firmware_main::<SimServices, _>(
        card.regs.clone(),
        HostDma::new(card.map.clone()),
        HostMemory::new(card.map.clone()),
        FwStorage::new(),
        &cfg,
        &mut std_clock(),
    )
    .unwrap_or_else(|e| panic!("{e}; card {}", card.nic.stats().snapshot()));
    assert_eq!(report.write.byte_len, 100_000);
    assert_eq!(report.read.byte_len, 100_000);
    assert_eq!(card.nic.stats().snapshot().dma_faults, 0);
}

#[test]
fn an_arena_too_small_for_the_engine_names_the_failed_allocation() {
    let card = card();
    let (pool, mem) = identity_memory(&card, leak_arena::<{ 1 << 20 }>());
    let err = firmware_main::<FirmwareOnSim, _>(
        card.regs.clone(),
        &pool,
        mem,
        FwStorage::new(),
        &FirmwareConfig::new(device_config()),
        &mut std_clock(),
    )
    .unwrap_err();
    // The six rings fit into 1 MiB; the 2 MiB simple-NIC receive buffer does not.
    assert_eq!(
        err,
        FirmwareError::Verbs {
            step: Step::Open,
            error: VerbsError::Platform(PlatformError::OutOfMemory { requested: 2 << 20 })
        },
        "{err}"
    );
}

#[test]
fn memory_outside_the_cards_window_is_refused_at_registration() {
    let card = card();
    let (pool, _) = identity_memory(&card, leak_arena::<ARENA>());
    let (start, _) = pool.range();
    // A window that ends where the pool begins: the data buffer lies outside it.
    let mem = IdentityMemory::new(0..start as u64);
    let err = firmware_main::<FirmwareOnSim, _>(
        card.regs.clone(),
        &pool,
        mem,
        FwStorage::new(),
        &FirmwareConfig::new(device_config()),
        &mut std_clock(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            FirmwareError::Verbs {
                step: Step::RegMr,
                error: VerbsError::Platform(PlatformError::NotMapped { .. })
            }
        ),
        "{err}"
    );
}

/// A card that never answers: every register reads 0 and writes vanish.
struct DeadRegs;

impl RegisterAccess for DeadRegs {
    fn read32(&self, _reg: Reg) -> u32 {
        0
    }
    fn write32(&self, _reg: Reg, _value: u32) {}
}

struct FirmwareOnDeadCard<'a>(PhantomData<&'a DmaPool>);

impl<'a> Platform for FirmwareOnDeadCard<'a> {
    type Regs = DeadRegs;
    type Dma = &'a DmaPool;
    type Mem = IdentityMemory;
    type Oob = NoOob;
}

#[test]
fn a_card_that_never_answers_fails_open_after_the_command_timeout_instead_of_hanging() {
    let pool = DmaPool::new(leak_arena::<ARENA>());
    let (start, end) = pool.range();
    // A tick clock as on the soft-core: 1 ms per reading.
    let mut ticks = 0u64;
    let mut clock = || {
        ticks += 1;
        Instant(ticks * 1_000_000)
    };
    let err = firmware_main::<FirmwareOnDeadCard, _>(
        DeadRegs,
        &pool,
        IdentityMemory::new(start as u64..end as u64),
        FwStorage::new(),
        &FirmwareConfig::new(device_config()),
        &mut clock,
    )
    .unwrap_err();
    assert_eq!(
        err,
        FirmwareError::Verbs {
            step: Step::Open,
            error: VerbsError::CommandTimeout {
                op: "SetNetworkParam"
            }
        }
    );
    assert_eq!(err.reason(), ("command timeout", "SetNetworkParam"));
    // The default 2 s command timeout, counted in clock readings, not wall time.
    assert!((2_000..2_100).contains(&ticks), "{ticks} readings");
}

#[test]
fn the_soft_core_platform_programs_the_rings_through_its_register_window() {
    // The firmware's own platform type, over plain memory standing in for the register
    // window: nothing answers, so open times out, but every register write is visible.
    let mut window = vec![0u32; REG_WINDOW_BYTES / 4];
    let block = std::ptr::NonNull::new(window.as_mut_ptr().cast::<RegisterBlock>()).unwrap();
    // SAFETY: `window` is REG_WINDOW_BYTES of u32-aligned memory that outlives the engine
    // (dropped inside firmware_main) and is read below only after that.
    let regs = unsafe { MmioRegs::new(block) };
    let pool = DmaPool::new(leak_arena::<ARENA>());
    let (start, end) = pool.range();
    let mut ticks = 0u64;
    let mut clock = || {
        ticks += 1;
        Instant(ticks * 1_000_000)
    };
    let err = firmware_main::<Baremetal, _>(
        regs,
        &pool,
        IdentityMemory::new(start as u64..end as u64),
        FwStorage::new(),
        &FirmwareConfig::new(device_config()),
        &mut clock,
    )
    .unwrap_err();
    assert_eq!(err.step(), Step::Open);
    // Command request ring (block 0x100): base = an identity address inside the pool,
    // head = 1 after the one command that was never answered.
    let base = u64::from(window[0x100 / 4]) | u64::from(window[0x104 / 4]) << 32;
    assert!(
        (start as u64..end as u64).contains(&base) && base % 4096 == 0,
        "ring base {base:#x} outside the pool {start:#x}..{end:#x}"
    );
    assert_eq!(window[0x108 / 4], 1, "one command doorbell");
    // All six rings were programmed with distinct bases.
    let mut bases: Vec<u32> = [0x000, 0x010, 0x100, 0x110, 0x140, 0x150]
        .iter()
        .map(|b| window[b / 4])
        .collect();
    bases.sort_unstable();
    bases.dedup();
    assert_eq!(bases.len(), 6, "{bases:x?}");
}
