//! The host user-memory resolver on this machine's real memory: a registered 64 MiB
//! buffer translated at 2 MiB, 64 KiB and 4 KiB pages and checked against independent
//! page-map reads (same page, same frame; frames stable while pinned); MR bases that are
//! not page aligned; the refusal of movable memory; overlapping pins.

mod common;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::platform::{MemoryResolver, PlatformError};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::umem::{
    CompactionPolicy, HostUmem, Pagemap, PagemapEntry, Stability, UmemError,
};
use common::{locked_kib, Buf, System};

const MIB: usize = 1 << 20;

/// The frame of every 4 KiB page of `[va, va + len)`, read straight from the page map.
fn frames_4k(va: u64, len: usize) -> Vec<u64> {
    let pm = Pagemap::open(&SystemPaths::default().pagemap()).unwrap();
    let mut e = vec![PagemapEntry(0); len / 4096];
    pm.read(VirtAddr(va), &mut e).unwrap();
    e.iter()
        .enumerate()
        .map(|(i, e)| {
            let f = e.pfn() * 4096;
            assert_ne!(f, 0, "page {i} of the buffer has no visible frame");
            f
        })
        .collect()
}

fn translate(umem: &mut HostUmem, va: u64, page: PageSize, n: usize) -> Vec<u64> {
    let mut out = vec![DeviceAddr(0); n];
    umem.try_translate(VirtAddr(va), page, &mut out)
        .unwrap_or_else(|e| panic!("translate {n} pages of {page:?} at {va:#x}: {e}"));
    out.iter().map(|d| d.0).collect()
}

/// Translation in runs of 16 pages, as the core does it for UpdatePgt commands.
fn translate_by_16(umem: &mut HostUmem, va: u64, page: PageSize, n: usize) -> Vec<u64> {
    let first = page.base_of(va);
    let mut all = Vec::new();
    for start in (0..n).step_by(16) {
        let k = (n - start).min(16);
        let at = if start == 0 {
            va
        } else {
            first + start as u64 * page.bytes()
        };
        all.extend(translate(umem, at, page, k));
    }
    all
}

#[test]
fn hugetlb_64mib_translates_consistently_at_every_page_size() {
    let Some(mut sys) = System::take("reserving hugepages") else {
        return;
    };
    let Some(buf) = sys.hugetlb_buf(64 * MIB) else {
        return;
    };
    let va = buf.addr();
    let mut umem = HostUmem::new().unwrap();
    assert_eq!(umem.try_pin(VirtAddr(va), 64 << 20), Ok(Stability::Hugetlb));

    let direct = frames_4k(va, 64 * MIB);
    let huge = translate(&mut umem, va, PageSize::Size2M, 32);
    let mid = translate(&mut umem, va, PageSize::Size64K, 1024);
    let small = translate(&mut umem, va, PageSize::Size4K, 16384);
    for (i, f) in huge.iter().enumerate() {
        assert_eq!(
            f % (2 << 20),
            0,
            "2 MiB entry {i} is not a page base: {f:#x}"
        );
    }
    // Same page, same frame: every smaller page lies inside its 2 MiB page's frame.
    for (i, &f) in small.iter().enumerate() {
        assert_eq!(f, direct[i], "4 KiB page {i}");
        assert_eq!(f, huge[i / 512] + (i % 512) as u64 * 4096, "4 KiB page {i}");
    }
    for (i, &f) in mid.iter().enumerate() {
        assert_eq!(f, huge[i / 32] + (i % 32) as u64 * 65536, "64 KiB page {i}");
    }
    let mut distinct = huge.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 32, "two 2 MiB pages share a frame");
    // The core's 16-page runs give the same table; frames stay put while pinned.
    assert_eq!(translate_by_16(&mut umem, va, PageSize::Size2M, 32), huge);
    assert_eq!(
        translate_by_16(&mut umem, va, PageSize::Size4K, 16384),
        small
    );
    assert_eq!(frames_4k(va, 64 * MIB), direct);
    umem.release(VirtAddr(va), 64 << 20);
    drop(sys);
}

#[test]
fn unaligned_mr_bases_get_page_base_entries() {
    let Some(mut sys) = System::take("reserving hugepages") else {
        return;
    };
    let Some(buf) = sys.hugetlb_buf(8 * MIB) else {
        return;
    };
    let direct = frames_4k(buf.addr(), 8 * MIB);
    let mut umem = HostUmem::new().unwrap();
    // An MR from 1 MiB + 0x1234 into the buffer, 4 MiB long: it touches three 2 MiB pages.
    let va = buf.addr() + MIB as u64 + 0x1234;
    let len = 4 * MIB;
    umem.try_pin(VirtAddr(va), len as u64).unwrap();
    let pages = PageSize::Size2M.pages_spanned(va, len as u64) as usize;
    assert_eq!(pages, 3);
    let huge = translate(&mut umem, va, PageSize::Size2M, pages);
    assert_eq!(huge, vec![direct[0], direct[512], direct[1024]]);
    let n4 = PageSize::Size4K.pages_spanned(va, len as u64) as usize;
    let small = translate(&mut umem, va, PageSize::Size4K, n4);
    assert_eq!(
        small[0], direct[257],
        "first entry is the base of the page holding va"
    );
    assert_eq!(small[n4 - 1], direct[257 + n4 - 1]);
    // Through the core's trait: the same entries.
    let mut out = [DeviceAddr(0); 3];
    MemoryResolver::translate(&mut umem, VirtAddr(va), PageSize::Size2M, &mut out).unwrap();
    assert_eq!(out.map(|d| d.0).to_vec(), huge);
    drop(sys);
}

/// Whether each `per`-page run of `frames` is contiguous and aligned to its size.
fn contiguous_runs(frames: &[u64], per: usize) -> bool {
    frames.chunks(per).all(|run| {
        run[0] % (per as u64 * 4096) == 0
            && run
                .iter()
                .enumerate()
                .all(|(j, &f)| f == run[0] + j as u64 * 4096)
    })
}

#[test]
fn ordinary_64mib_with_compaction_off_translates_consistently() {
    let Some(mut sys) = System::take("setting vm.compact_unevictable_allowed") else {
        return;
    };
    assert!(sys.vm_sysctl("compact_unevictable_allowed", "0"));
    let buf = Buf::ordinary(64 * MIB);
    let va = buf.addr();
    let mut umem = HostUmem::new().unwrap();
    assert_eq!(
        umem.try_pin(VirtAddr(va), 64 << 20),
        Ok(Stability::CompactionOff)
    );
    let direct = frames_4k(va, 64 * MIB);
    assert_eq!(translate(&mut umem, va, PageSize::Size4K, 16384), direct);
    assert_eq!(
        translate_by_16(&mut umem, va, PageSize::Size4K, 16384),
        direct
    );
    // Larger pages: accepted exactly when the 4 KiB frames happen to be contiguous.
    for (page, per) in [(PageSize::Size64K, 16), (PageSize::Size2M, 512)] {
        let mut out = vec![DeviceAddr(0); 16384 / per];
        let r = umem.try_translate(VirtAddr(va), page, &mut out);
        if contiguous_runs(&direct, per) {
            assert_eq!(r, Ok(()));
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, UmemError::NotContiguous { .. }), "{e}");
            assert!(e.to_string().contains("hugetlb"), "{e}");
        }
    }
    assert_eq!(frames_4k(va, 64 * MIB), direct, "frames moved while pinned");
    umem.release(VirtAddr(va), 64 << 20);
    drop(sys);
}

#[test]
fn movable_memory_is_refused_while_compaction_may_move_it() {
    let Some(mut sys) = System::take("setting vm.compact_unevictable_allowed") else {
        return;
    };
    assert!(sys.vm_sysctl("compact_unevictable_allowed", "1"));
    let buf = Buf::ordinary(4 * MIB);
    let va = VirtAddr(buf.addr());
    let mut umem = HostUmem::new().unwrap();
    assert_eq!(
        MemoryResolver::pin(&mut umem, va, 4 * MIB, true),
        Err(PlatformError::PinFailed { va })
    );
    let text = umem.last_error().unwrap().to_string();
    assert!(
        text.contains("sysctl -w vm.compact_unevictable_allowed=0"),
        "{text}"
    );
    let mut lax = HostUmem::with(SystemPaths::default(), CompactionPolicy::Allow).unwrap();
    assert_eq!(lax.try_pin(va, 4 << 20), Ok(Stability::Unprotected));
    lax.release(va, 4 << 20);
    drop(sys);
}

#[test]
fn overlapping_pins_keep_shared_pages_locked() {
    let Some(mut sys) = System::take("setting vm.compact_unevictable_allowed") else {
        return;
    };
    assert!(sys.vm_sysctl("compact_unevictable_allowed", "0"));
    let buf = Buf::ordinary(8 * MIB);
    let va = buf.addr();
    let before = locked_kib();
    let mut umem = HostUmem::new().unwrap();
    umem.try_pin(VirtAddr(va), 6 << 20).unwrap();
    umem.try_pin(VirtAddr(va + (2 << 20)), 6 << 20).unwrap();
    assert_eq!(locked_kib() - before, 8 * 1024);
    umem.release(VirtAddr(va), 6 << 20);
    assert_eq!(
        locked_kib() - before,
        6 * 1024,
        "the second MR lost its lock"
    );
    umem.try_pin(VirtAddr(va + 4096), 4096).unwrap();
    umem.release(VirtAddr(va + (2 << 20)), 6 << 20);
    assert_eq!(locked_kib() - before, 4);
    drop(umem);
    assert_eq!(
        locked_kib(),
        before,
        "dropping the resolver unlocks the rest"
    );
    drop(sys);
}

#[test]
fn holes_and_untouched_pages_are_named() {
    let Some(mut sys) = System::take("setting vm.compact_unevictable_allowed") else {
        return;
    };
    assert!(sys.vm_sysctl("compact_unevictable_allowed", "0"));
    let buf = Buf::ordinary(4 * MIB);
    let hole = buf.addr() + (2 * MIB) as u64;
    // SAFETY: unmaps the middle of our own test mapping; the rest is unmapped on drop
    // (munmap of an already unmapped range is harmless).
    unsafe { libc::munmap(hole as *mut libc::c_void, 4096) };
    let mut umem = HostUmem::new().unwrap();
    assert_eq!(
        umem.try_pin(VirtAddr(buf.addr()), 4 << 20),
        Err(UmemError::NotMapped { va: VirtAddr(hole) })
    );
    // Not pinned and never touched: no frame.
    let fresh = Buf::ordinary_untouched(MIB);
    let mut out = [DeviceAddr(0); 1];
    let e = umem
        .try_translate(VirtAddr(fresh.addr()), PageSize::Size4K, &mut out)
        .unwrap_err();
    assert_eq!(
        e,
        UmemError::NotPresent {
            va: VirtAddr(fresh.addr())
        }
    );
    drop(sys);
}
