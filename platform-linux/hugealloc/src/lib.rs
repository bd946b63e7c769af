//! `libbluerdma_hugealloc.so`: a preloaded allocator for unmodified RDMA programs on the
//! blue-rdma card.
//!
//! The card translates registered memory in 2 MiB pages, each of which must be one
//! physically contiguous block; the heap's 4 KiB pages are not, so `reg_mr` of a buffer
//! from `malloc` fails on the card. Programs such as perftest, UCX and MPI allocate their
//! buffers themselves. Run them with
//!
//! ```text
//! LD_PRELOAD=target/release/libbluerdma_hugealloc.so ib_write_bw ...
//! ```
//!
//! and every page-aligned allocation (`memalign`, `posix_memalign`, `aligned_alloc`,
//! `valloc`, `pvalloc` with an alignment of at least 4 KiB: how such programs allocate
//! buffers they register), and every `malloc`/`calloc` of at least
//! `BLUERDMA_HUGEALLOC_MIN` bytes (default 1 MiB; 0 turns that off), comes from 2 MiB
//! hugetlb pages: whole pages, 2 MiB aligned, zeroed. Everything else goes to glibc's
//! allocator (`__libc_malloc` and friends). When the hugepage pool is empty the allocation
//! comes from glibc and one line on stderr says so (`reg_mr` of it on the card will fail);
//! reserve pages with `echo 64 | sudo tee /proc/sys/vm/nr_hugepages`.
//!
//! Hugepage allocations live in one reserved range of address space (64 GiB, no memory
//! until used), so `free` tells them from glibc's by address without a lock; freeing one
//! gives its pages back to the pool at once. The allocator never allocates itself.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

const HUGEPAGE: usize = 2 << 20;
/// The reserved range: 32768 hugepages.
const SLOTS: usize = 32768;
const REGION: usize = SLOTS * HUGEPAGE;
const MAP_HUGE_2MB: i32 = 21 << libc::MAP_HUGE_SHIFT;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// The reserved range's start (0 until the first hugepage allocation).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// `BLUERDMA_HUGEALLOC_MIN`, read on first use (usize::MAX: not yet).
static MIN: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Whether the "pool empty" line was printed.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Which slots are taken, and each allocation's length in slots (at its first slot).
struct Slots {
    used: [u64; SLOTS / 64],
    len: [u16; SLOTS],
}

static STATE: Mutex<Slots> = Mutex::new(Slots {
    used: [0; SLOTS / 64],
    len: [0; SLOTS],
});

fn say(msg: &str) {
    // SAFETY: writes a static message to stderr; no allocation.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// The range, reserved on first use; 0 if it cannot be.
fn base() -> usize {
    let b = BASE.load(Ordering::Acquire);
    if b != 0 {
        return b;
    }
    let _guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let b = BASE.load(Ordering::Acquire);
    if b != 0 {
        return b;
    }
    // SAFETY: a fresh inaccessible reservation at an address the kernel picks; one
    // hugepage more than needed, to align the start.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            REGION + HUGEPAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return 0;
    }
    let start = (p as usize).next_multiple_of(HUGEPAGE);
    BASE.store(start, Ordering::Release);
    start
}

/// Whether `p` is a hugepage allocation.
fn ours(p: *mut c_void) -> bool {
    let b = BASE.load(Ordering::Acquire);
    b != 0 && (p as usize) >= b && (p as usize) < b + REGION
}

/// The malloc threshold.
fn min_bytes() -> usize {
    let m = MIN.load(Ordering::Relaxed);
    if m != usize::MAX {
        return m;
    }
    // SAFETY: getenv returns a NUL-terminated string or NULL; it is only read here.
    let v = unsafe { libc::getenv(c"BLUERDMA_HUGEALLOC_MIN".as_ptr()) };
    let mut n: usize = 1 << 20;
    if !v.is_null() {
        // SAFETY: as above.
        let s = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
        if let Some(parsed) = parse(s) {
            n = if parsed == 0 { usize::MAX - 1 } else { parsed };
        }
    }
    MIN.store(n, Ordering::Relaxed);
    n
}

/// A decimal number of bytes, without allocating.
fn parse(s: &[u8]) -> Option<usize> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0usize, |n, &c| {
        c.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add((c - b'0') as usize))
            .flatten()
    })
}

/// Maps the range `[at, at + len)` of the reservation back to inaccessible (giving its
/// pages back to the pool).
fn release(at: usize, len: usize) {
    // SAFETY: replaces part of our own reservation with an inaccessible mapping.
    unsafe {
        libc::mmap(
            at as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

/// `size` bytes of hugepages, or NULL (pool empty, range full).
fn huge(size: usize) -> *mut c_void {
    let Some(n) = size
        .max(1)
        .checked_next_multiple_of(HUGEPAGE)
        .map(|b| b / HUGEPAGE)
    else {
        return std::ptr::null_mut();
    };
    let b = base();
    if b == 0 || n > SLOTS {
        return std::ptr::null_mut();
    }
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(first) = free_run(&s.used, n) else {
        return std::ptr::null_mut();
    };
    let at = b + first * HUGEPAGE;
    // SAFETY: replaces `n` free slots of our reservation (no allocation lives there) with
    // hugetlb pages; the kernel reserves the pages now, so an empty pool fails here.
    let p = unsafe {
        libc::mmap(
            at as *mut c_void,
            n * HUGEPAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_FIXED
                | libc::MAP_HUGETLB
                | MAP_HUGE_2MB,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        release(at, n * HUGEPAGE);
        drop(s);
        if !WARNED.swap(true, Ordering::Relaxed) {
            say(
                "bluerdma-hugealloc: no free 2 MiB hugepage: buffers come from malloc, and \
                 reg_mr of them on the card fails; reserve pages with \
                 `echo 64 | sudo tee /proc/sys/vm/nr_hugepages`\n",
            );
        }
        return std::ptr::null_mut();
    }
    for i in first..first + n {
        s.used[i / 64] |= 1 << (i % 64);
    }
    s.len[first] = n as u16;
    p
}

/// The first run of `n` free slots.
fn free_run(used: &[u64; SLOTS / 64], n: usize) -> Option<usize> {
    let mut run = 0;
    for i in 0..SLOTS {
        if used[i / 64] & (1 << (i % 64)) == 0 {
            run += 1;
            if run == n {
                return Some(i + 1 - n);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// Bytes of the hugepage allocation at `p`.
fn span(p: *mut c_void) -> usize {
    let slot = (p as usize - BASE.load(Ordering::Acquire)) / HUGEPAGE;
    let s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    s.len[slot] as usize * HUGEPAGE
}

fn huge_free(p: *mut c_void) {
    let b = BASE.load(Ordering::Acquire);
    let first = (p as usize - b) / HUGEPAGE;
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let n = s.len[first] as usize;
    if n == 0 || (p as usize) % HUGEPAGE != 0 {
        drop(s);
        say("bluerdma-hugealloc: free of a pointer it did not hand out; ignored\n");
        return;
    }
    release(b + first * HUGEPAGE, n * HUGEPAGE);
    for i in first..first + n {
        s.used[i / 64] &= !(1 << (i % 64));
    }
    s.len[first] = 0;
}

/// A page-aligned request of any size: hugepages if there are, else glibc's. A small one
/// is a registered buffer too (ibv_ud_pingpong's is `memalign(page, size + 40)`: 2088
/// bytes for `-s 2048`).
fn aligned(align: usize, size: usize) -> *mut c_void {
    if (4096..=HUGEPAGE).contains(&align) && size > 0 {
        let p = huge(size);
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: glibc's own allocator.
    unsafe { __libc_memalign(align, size) }
}

/// `malloc`.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    if size >= min_bytes() {
        let p = huge(size);
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: glibc's own allocator.
    unsafe { __libc_malloc(size) }
}

/// `calloc` (hugetlb pages are zeroed by the kernel).
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    if let Some(total) = n.checked_mul(size) {
        if total >= min_bytes() {
            let p = huge(total);
            if !p.is_null() {
                return p;
            }
        }
    }
    // SAFETY: glibc's own allocator.
    unsafe { __libc_calloc(n, size) }
}

/// `free`.
///
/// # Safety
/// `p` is NULL or came from this allocator (or glibc's) and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if ours(p) {
        huge_free(p);
    } else {
        // SAFETY: not ours, so glibc's; the caller's contract.
        unsafe { __libc_free(p) }
    }
}

/// `realloc`: a hugepage allocation stays where it is while the new size fits.
///
/// # Safety
/// As `free` for `p`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if !ours(p) {
        // SAFETY: glibc's pointer.
        return unsafe { __libc_realloc(p, size) };
    }
    let have = span(p);
    if size <= have {
        return p;
    }
    let q = malloc(size);
    if !q.is_null() {
        // SAFETY: both are live and at least `have` bytes long (q holds `size` > have).
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), have) };
        huge_free(p);
    }
    q
}

/// `posix_memalign`.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || align % std::mem::size_of::<usize>() != 0 {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's pointer.
    unsafe { *out = p };
    0
}

/// `memalign`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(align, size)
}

/// `aligned_alloc`.
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    aligned(align, size)
}

/// `valloc`.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(4096, size)
}

/// `pvalloc`.
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(4096, size.next_multiple_of(4096))
}

/// `malloc_usable_size`: a hugepage allocation's whole span; glibc's own otherwise.
///
/// # Safety
/// `p` is NULL or a live allocation.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if ours(p) {
        return span(p);
    }
    type Usable = unsafe extern "C" fn(*mut c_void) -> usize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let mut f = NEXT.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: looks up the next definition of the symbol (glibc's).
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
        NEXT.store(f, Ordering::Relaxed);
    }
    if f == 0 {
        return 0;
    }
    // SAFETY: glibc's malloc_usable_size, with its own pointer.
    unsafe { std::mem::transmute::<usize, Usable>(f)(p) }
}
