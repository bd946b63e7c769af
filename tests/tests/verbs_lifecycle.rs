//! Objects through their whole life on one device, through the verbs API with its progress
//! thread running: registrations that race the progress thread, memory the card cannot
//! use, and what closing a device gives back.

use bluerdma_linux::Context;
use bluerdma_sim::link::MemHub;
use bluerdma_tests::{ALL, IP0};

/// Held by every test of this file while it runs: the round test counts the process's
/// threads and RSS, which another test's device running beside it would change.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn device() -> Context {
    let hub = MemHub::new();
    let spec = bluerdma_linux::DeviceSpec::new("blue0", IP0);
    Context::open_emulated(spec, Box::new(hub.attach(IP0).unwrap())).unwrap()
}

/// The progress thread moves a registration on while the caller polls it too; whoever
/// finishes it, the caller gets its key (the caller used to see "no command with handle"
/// when the progress thread had collected the last response first).
#[test]
fn registrations_racing_the_progress_thread_all_succeed() {
    let _alone = alone();
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    for i in 0..400 {
        let mr = pd
            .alloc_mr(4096, ALL)
            .unwrap_or_else(|e| panic!("registration {i}: {e}"));
        assert_eq!(mr.len(), 4096);
    }
}

/// The process's resident KiB and its threads. Threads: the fewest of 20 samples 1 ms
/// apart, because a thread that closing a device joined is still counted for a moment after
/// the join returns (the kernel wakes the joiner before the thread leaves its group); a
/// count taken in that moment failed the round test with 4 threads against 3. A thread
/// that stays is seen in every sample.
fn usage() -> (u64, u64) {
    let field = |name: &str| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
    };
    let threads = (0..20)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            field("Threads:")
        })
        .min()
        .unwrap();
    (field("VmRSS:"), threads)
}

/// Closing a device gives back its card's DMA memory and threads: 300 open/use/close
/// rounds keep the process's memory and threads where they were (each round used to keep
/// about 4 MiB).
#[test]
fn closing_a_device_frees_its_memory_and_threads() {
    let _alone = alone();
    let round = |i: u64| {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq_sized(16).unwrap();
        let _qp = pd.create_qp(&cq, &cq).unwrap();
        let mr = pd.alloc_mr(1 << 16, ALL).unwrap();
        assert_eq!(mr.len(), 1 << 16, "round {i}");
    };
    for i in 0..20 {
        round(i);
    }
    let (rss, threads) = usage();
    for i in 0..300 {
        round(i);
    }
    let (rss2, threads2) = usage();
    assert_eq!(threads2, threads, "threads after 300 rounds");
    assert!(
        rss2 < rss + 32 * 1024,
        "RSS grew from {rss} KiB to {rss2} KiB over 300 rounds"
    );
}

/// Registration refuses memory the card must not touch: unmapped, or read-only with an
/// access that lets the card write it; and a remote write access without the local one.
#[test]
fn registration_refuses_memory_the_card_may_not_touch() {
    use bluerdma_core::engine::VerbsError;
    use bluerdma_core::platform::PlatformError;
    let _alone = alone();
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    let page = 4096;
    // A range the process may not read: reserved with PROT_NONE (a range unmapped again at
    // once was not safe to use: a thread starting meanwhile, the device's progress thread,
    // put its signal stack there).
    // SAFETY: a fresh anonymous mapping at an address the kernel picks, unmapped at the end.
    let gone = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        p as *mut u8
    };
    // SAFETY: the registration is refused before the card could touch the range.
    let r = unsafe { pd.reg_mr(gone, page, ALL) };
    assert!(
        matches!(
            r.as_ref().map_err(|e| e.kind),
            Err(VerbsError::Platform(PlatformError::NotMapped { .. }))
        ),
        "unmapped memory: {:?}",
        r.err()
    );
    // SAFETY: a read-only anonymous mapping, kept for the test.
    let ro = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8
    };
    // SAFETY: as above.
    let r = unsafe { pd.reg_mr(ro, page, bluerdma_core::desc::AccessFlags::LOCAL_WRITE) };
    assert!(
        matches!(
            r.as_ref().map_err(|e| e.kind),
            Err(VerbsError::Platform(PlatformError::ReadOnly { .. }))
        ),
        "read-only memory for writing: {:?}",
        r.err()
    );
    // SAFETY: the mapping stays until the end of the test, after the MR is dropped.
    let ok = unsafe { pd.reg_mr(ro, page, bluerdma_core::desc::AccessFlags::REMOTE_READ) };
    assert!(
        ok.is_ok(),
        "read-only memory for REMOTE_READ: {:?}",
        ok.err()
    );
    drop(ok);
    let r = pd.alloc_mr(page, bluerdma_core::desc::AccessFlags::REMOTE_WRITE);
    assert!(
        matches!(
            r.as_ref().map_err(|e| e.kind),
            Err(VerbsError::InvalidArgument { .. })
        ),
        "REMOTE_WRITE without LOCAL_WRITE: {:?}",
        r.err()
    );
    // SAFETY: the mappings are ours and no MR uses them.
    unsafe {
        libc::munmap(ro as *mut libc::c_void, page);
        libc::munmap(gone as *mut libc::c_void, page);
    }
}
