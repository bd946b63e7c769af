//! Issue E item 5: pinning that holds. Pin, force memory compaction
//! (`/proc/sys/vm/compact_memory`), re-read the page map, and require every frame to be
//! unchanged, for both means the resolver relies on:
//! - hugetlb pages (compaction does not migrate them), with the sysctl left as it is;
//! - mlocked ordinary pages with `vm.compact_unevictable_allowed=0`, set by the test and
//!   restored afterwards.
//!
//! Without either, frames do move (the bench `umem` counts them: with the sysctl at 1 a
//! forced compaction moved a few hundred of 65,536 mlocked pages on this machine kind),
//! which is why [`HostUmem`] refuses such a pin by default.

mod common;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::umem::{HostUmem, Pagemap, PagemapEntry, Stability};
use common::{Buf, System};

const MIB: usize = 1 << 20;

fn frames(va: u64, len: usize) -> Vec<u64> {
    let pm = Pagemap::open(&SystemPaths::default().pagemap()).unwrap();
    let mut e = vec![PagemapEntry(0); len / 4096];
    pm.read(VirtAddr(va), &mut e).unwrap();
    e.iter().map(|e| e.pfn()).collect()
}

fn compact() {
    std::fs::write("/proc/sys/vm/compact_memory", "1").expect("write compact_memory");
}

/// Pins `buf`, compacts twice, and checks that the resolver's table and the page map
/// still agree with the frames before compaction.
fn pin_compact_and_compare(buf: &Buf, expect: Stability) {
    let va = VirtAddr(buf.addr());
    let mut umem = HostUmem::new().unwrap();
    assert_eq!(umem.try_pin(va, buf.len as u64), Ok(expect));
    let before = frames(buf.addr(), buf.len);
    assert!(before.iter().all(|&f| f != 0), "frames not visible");
    let mut table = vec![DeviceAddr(0); buf.len / 4096];
    umem.try_translate(va, PageSize::Size4K, &mut table)
        .unwrap();
    compact();
    compact();
    let after = frames(buf.addr(), buf.len);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert_eq!(moved, 0, "{moved} of {} pinned pages moved", before.len());
    for (i, (t, f)) in table.iter().zip(&after).enumerate() {
        assert_eq!(
            t.0,
            f * 4096,
            "page {i}: the card's entry no longer matches"
        );
    }
    umem.release(va, buf.len as u64);
}

#[test]
fn hugetlb_frames_survive_forced_compaction() {
    let Some(mut sys) = System::take("reserving hugepages and compacting memory") else {
        return;
    };
    let Some(buf) = sys.hugetlb_buf(64 * MIB) else {
        return;
    };
    pin_compact_and_compare(&buf, Stability::Hugetlb);
    drop(sys);
}

#[test]
fn mlocked_frames_survive_forced_compaction_with_the_sysctl_off() {
    let Some(mut sys) = System::take("setting vm.compact_unevictable_allowed") else {
        return;
    };
    let sysctl = "/proc/sys/vm/compact_unevictable_allowed";
    let old = std::fs::read_to_string(sysctl).unwrap();
    assert!(sys.vm_sysctl("compact_unevictable_allowed", "0"));
    let buf = Buf::ordinary(256 * MIB);
    pin_compact_and_compare(&buf, Stability::CompactionOff);
    drop(sys);
    assert_eq!(
        std::fs::read_to_string(sysctl).unwrap(),
        old,
        "sysctl restored"
    );
}
