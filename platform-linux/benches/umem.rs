//! Figures of the Linux platform (issue E), each with its baseline in the same run.
//!
//! `cargo bench -p bluerdma-linux --bench umem [-- --reps N]` (as root: it reserves 1 GiB of
//! hugepages, sets `vm.compact_unevictable_allowed`, and forces compaction; every setting
//! is restored at the end).
//!
//! 1. virt-to-phys of a 1 GiB MR: [`HostUmem`] (pagemap opened once, entries read in
//!    batches; hugetlb frames once per 2 MiB) against the reference driver's way (open
//!    `/proc/self/pagemap`, read one entry, close, for every page), same memory, same
//!    result checked:
//!    - 2 MiB pages over hugetlb memory; 4 KiB pages over hugetlb memory;
//!    - 4 KiB pages over ordinary memory;
//!    - both as one call and as the core issues them (runs of 16 pages).
//! 2. Registration of a 1 GiB MR with 2 MiB pages: end to end on the emulated NIC
//!    (`Pd::reg_mr`: pin, translate, 32 UpdatePgt commands and an UpdateMrTable, each
//!    answered by the emulated card), and the real platform's share (pin + translate of
//!    hugetlb memory by [`HostUmem`]).
//! 3. Frames moved by one forced compaction of 256 MiB of mlocked memory, with
//!    `vm.compact_unevictable_allowed` 1 and 0, and of hugetlb memory.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::desc::AccessFlags;
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::umem::{CompactionPolicy, HostUmem, Pagemap, PagemapEntry};
use bluerdma_linux::{Context, DeviceSpec};
use bluerdma_sim::link::MemHub;

const GIB: usize = 1 << 30;
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const FREE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
const COMPACT_SYSCTL: &str = "/proc/sys/vm/compact_unevictable_allowed";

struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize, hugetlb: bool, touch: bool) -> Option<Map> {
        let extra = if hugetlb {
            libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT)
        } else {
            libc::MAP_NORESERVE
        };
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let m = Map { ptr: p.cast(), len };
        if !hugetlb {
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        }
        if touch {
            for off in (0..len).step_by(4096) {
                // SAFETY: inside the mapping.
                unsafe { m.ptr.add(off).write_volatile(1) };
            }
        }
        Some(m)
    }

    fn va(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Restores settings on drop.
struct Settings(Vec<(&'static str, String)>);

impl Settings {
    fn set(&mut self, path: &'static str, value: &str) -> bool {
        let Ok(old) = fs::read_to_string(path) else {
            return false;
        };
        if fs::write(path, value).is_err() {
            return false;
        }
        self.0.push((path, old.trim().to_owned()));
        true
    }
}

impl Drop for Settings {
    fn drop(&mut self) {
        for (p, v) in self.0.drain(..).rev() {
            let _ = fs::write(p, v);
        }
    }
}

/// The reference driver's way: open the page map for every page, read its entry, close.
fn reference_way(va: u64, page: PageSize, n: usize) -> Vec<u64> {
    let first = page.base_of(va);
    (0..n)
        .map(|i| {
            let page_va = first + i as u64 * page.bytes();
            let f = fs::File::open("/proc/self/pagemap").unwrap();
            let mut e = [0u8; 8];
            f.read_exact_at(&mut e, page_va / 4096 * 8).unwrap();
            let e = u64::from_le_bytes(e);
            (e & ((1 << 55) - 1)) * 4096
        })
        .collect()
}

fn ours(umem: &mut HostUmem, va: u64, page: PageSize, n: usize, run: usize) -> Vec<u64> {
    let first = page.base_of(va);
    let mut out = vec![DeviceAddr(0); n];
    for (c, chunk) in out.chunks_mut(run).enumerate() {
        let at = if c == 0 {
            va
        } else {
            first + (c * run) as u64 * page.bytes()
        };
        umem.try_translate(VirtAddr(at), page, chunk)
            .unwrap_or_else(|e| panic!("translate: {e}"));
    }
    out.iter().map(|d| d.0).collect()
}

/// Median wall time of `reps` runs of `f`, and its last result.
fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..reps {
        let t = Instant::now();
        last = Some(std::hint::black_box(f()));
        times.push(t.elapsed());
    }
    times.sort();
    (times[times.len() / 2], last.unwrap())
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn translation_row(label: &str, umem: &mut HostUmem, va: u64, page: PageSize, reps: usize) {
    let n = PageSize::pages_spanned(page, va, GIB as u64) as usize;
    let base_reps = if n > 4096 { reps.min(3) } else { reps };
    let (t_ref, r_ref) = time(base_reps, || reference_way(va, page, n));
    let (t_one, r_one) = time(reps, || ours(umem, va, page, n, n));
    let (t_16, r_16) = time(reps, || ours(umem, va, page, n, 16));
    assert_eq!(r_one, r_ref, "{label}: batched and per-page results differ");
    assert_eq!(r_16, r_ref, "{label}: 16-page runs differ");
    let ratio = |t: Duration| t_ref.as_secs_f64() / t.as_secs_f64();
    println!(
        "| {label} | {n} | {} | {} ({:.1}x) | {} ({:.1}x) |",
        ms(t_ref),
        ms(t_one),
        ratio(t_one),
        ms(t_16),
        ratio(t_16)
    );
}

fn emulated_registration(reps: usize) {
    let hub = MemHub::new();
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    let ctx = Context::open_emulated(
        DeviceSpec::new("blue0", ip),
        Box::new(hub.attach(ip).unwrap()),
    )
    .expect("open the emulated card");
    let pd = ctx.alloc_pd().unwrap();
    let mem = Map::new(GIB, false, false).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut reg = Vec::new();
    let mut dereg = Vec::new();
    for _ in 0..reps.max(5) {
        let t = Instant::now();
        // SAFETY: the mapping outlives the MR (dropped below, before `mem`).
        let mr = unsafe { pd.reg_mr(mem.ptr, GIB, access) }.expect("reg_mr 1 GiB");
        reg.push(t.elapsed());
        let t = Instant::now();
        drop(mr);
        dereg.push(t.elapsed());
    }
    reg.sort();
    dereg.sort();
    println!(
        "| reg_mr 1 GiB, 2 MiB pages, emulated NIC (end to end) | {} (min {}, max {}) | goal <= 5 ms |",
        ms(reg[reg.len() / 2]),
        ms(reg[0]),
        ms(reg[reg.len() - 1])
    );
    println!(
        "| dereg_mr of the same | {} | |",
        ms(dereg[dereg.len() / 2])
    );
}

fn host_registration(va: u64, reps: usize) {
    let (t, _) = time(reps, || {
        let mut umem = HostUmem::new().unwrap();
        umem.try_pin(VirtAddr(va), GIB as u64).unwrap();
        let r = ours(&mut umem, va, PageSize::Size2M, 512, 16);
        umem.release(VirtAddr(va), GIB as u64);
        r
    });
    println!(
        "| pin + translate 1 GiB hugetlb, 2 MiB pages, HostUmem (real platform's share) | {} | |",
        ms(t)
    );
}

fn frames(va: u64, len: usize) -> Vec<u64> {
    let pm = Pagemap::open(&SystemPaths::default().pagemap()).unwrap();
    let mut e = vec![PagemapEntry(0); len / 4096];
    pm.read(VirtAddr(va), &mut e).unwrap();
    e.iter().map(|e| e.pfn()).collect()
}

fn moved_by_compaction(va: u64, len: usize) -> usize {
    let before = frames(va, len);
    fs::write("/proc/sys/vm/compact_memory", "1").unwrap();
    let after = frames(va, len);
    before.iter().zip(&after).filter(|(a, b)| a != b).count()
}

fn compaction(settings: &mut Settings, huge: Option<u64>) {
    let len = 256 << 20;
    for allowed in ["1", "0"] {
        if !settings.set(COMPACT_SYSCTL, allowed) {
            return;
        }
        let mem = Map::new(len, false, true).unwrap();
        // SAFETY: mlock of our own mapping.
        unsafe { libc::mlock(mem.ptr.cast(), len) };
        let moved = moved_by_compaction(mem.va(), len);
        println!(
            "| mlocked 4 KiB pages, vm.compact_unevictable_allowed={allowed} | {moved} of {} |",
            len / 4096
        );
    }
    if let Some(va) = huge {
        let moved = moved_by_compaction(va, len);
        println!("| hugetlb pages | {moved} of {} |", len / 4096);
    }
}

fn main() {
    let mut reps = 5;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--reps") {
        reps = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(reps);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("run as root: the page map hides frames from other users");
    }
    let mut settings = Settings(Vec::new());
    let free: u64 = fs::read_to_string(FREE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let nr: u64 = fs::read_to_string(POOL)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if root && free < 512 {
        settings.set(POOL, &(nr + 512 - free).to_string());
    }
    println!(
        "## virt-to-phys of a 1 GiB MR (median of {reps}; the per-page baseline: of at most 3)\n"
    );
    println!("| memory, page size | pages | open per page (reference) | batched, one call | batched, runs of 16 (as the core) |");
    println!("|---|---|---|---|---|");
    let huge = if root {
        Map::new(GIB, true, true)
    } else {
        None
    };
    match &huge {
        Some(h) => {
            let mut umem = HostUmem::new().unwrap();
            umem.try_pin(VirtAddr(h.va()), GIB as u64).unwrap();
            translation_row("hugetlb, 2 MiB", &mut umem, h.va(), PageSize::Size2M, reps);
            translation_row("hugetlb, 4 KiB", &mut umem, h.va(), PageSize::Size4K, reps);
        }
        None => println!("| hugetlb | no 1 GiB of hugepages: skipped | | | |"),
    }
    if root {
        let ordinary = Map::new(GIB, false, true).unwrap();
        let mut umem = HostUmem::with(SystemPaths::default(), CompactionPolicy::Allow).unwrap();
        umem.try_pin(VirtAddr(ordinary.va()), GIB as u64).unwrap();
        translation_row(
            "ordinary, 4 KiB",
            &mut umem,
            ordinary.va(),
            PageSize::Size4K,
            reps,
        );
    }
    println!(
        "\n## MR registration, 1 GiB, 2 MiB pages (median of {})\n",
        reps.max(5)
    );
    println!("| what | time | |");
    println!("|---|---|---|");
    emulated_registration(reps);
    if let Some(h) = &huge {
        host_registration(h.va(), reps);
    }
    if root {
        println!("\n## Frames moved by one forced compaction (256 MiB, pinned)\n");
        println!("| memory | pages with a new frame |");
        println!("|---|---|");
        compaction(&mut settings, huge.as_ref().map(Map::va));
    }
}
