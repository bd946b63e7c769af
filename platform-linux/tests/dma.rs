//! DMA allocators: u-dma-buf over a fake sysfs entry and a regular file standing in for
//! `/dev/udmabuf0`, laid out as the core asks at device open; real 2 MiB hugepages whose
//! physical addresses are checked against the page map.

mod common;

use std::os::unix::fs::FileExt;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer};
use bluerdma_linux::dma::{CardDma, DmaError, HugePageDma, UdmaBuf, UdmaBufConfig, HUGEPAGE};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::umem::Pagemap;
use common::fake_sysfs::FakeSystem;
use common::System;

const PHYS: u64 = 0x1_2340_0000; // 4 MiB aligned, like an order-10 allocation

/// What the core allocates at open: six 128 KiB rings, the 2 MiB simple-NIC receive
/// buffer (2 MiB aligned), a 4 KiB PGT staging buffer and 512 KiB of ACK frames.
fn open_layout(dma: &impl DmaAllocator) -> Vec<DmaBuffer> {
    let mut v: Vec<DmaBuffer> = (0..6)
        .map(|_| dma.alloc(128 << 10, 4096).unwrap())
        .collect();
    v.push(dma.alloc(2 << 20, 2 << 20).unwrap());
    v.push(dma.alloc(4096, 4096).unwrap());
    v.push(dma.alloc(512 << 10, 4096).unwrap());
    v
}

fn no_overlap(bufs: &[DmaBuffer]) {
    let mut r: Vec<(u64, u64)> = bufs
        .iter()
        .map(|b| (b.device_addr().0, b.device_addr().0 + b.len() as u64))
        .collect();
    r.sort_unstable();
    for w in r.windows(2) {
        assert!(w[0].1 <= w[1].0, "buffers overlap: {w:x?}");
    }
}

#[test]
fn udmabuf_holds_the_open_layout_in_4_mib() {
    let sys = FakeSystem::new();
    sys.udmabuf("udmabuf0", PHYS, 4 << 20);
    let dma = UdmaBuf::open(&sys.paths, &UdmaBufConfig::default()).unwrap();
    assert_eq!(dma.device_addr().0, PHYS);
    let mut bufs = open_layout(&dma);
    no_overlap(&bufs);
    for b in &bufs {
        let (cpu, dev) = (b.cpu().as_ptr() as u64, b.device_addr().0);
        assert_eq!(cpu % 4096, 0);
        // CPU and device addresses are congruent modulo 2 MiB, so alignments agree.
        assert_eq!(cpu % (2 << 20), dev % (2 << 20));
    }
    let rx = &bufs[6];
    assert_eq!(rx.device_addr().0 % (2 << 20), 0);
    assert_eq!(rx.cpu().as_ptr() as u64 % (2 << 20), 0);

    // A byte written through the CPU pointer is at (device address - phys) in the buffer.
    bufs[7].as_mut_slice()[5] = 0xA5;
    let off = bufs[7].device_addr().0 - PHYS + 5;
    let file = std::fs::File::open(sys.paths.dev.join("udmabuf0")).unwrap();
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, off).unwrap();
    assert_eq!(b, [0xA5]);

    // Full now (a second 2 MiB buffer cannot fit); freeing makes room again, zeroed.
    assert!(dma.alloc(2 << 20, 2 << 20).is_err());
    let staging = bufs.remove(7);
    // SAFETY: no pointer into the buffer is used afterwards.
    unsafe { dma.free(staging) };
    let mut again = dma.alloc(4096, 4096).unwrap();
    assert!(
        again.as_mut_slice().iter().all(|&x| x == 0),
        "reused memory is zeroed"
    );
    bufs.push(again);
    for b in bufs {
        // SAFETY: as above.
        unsafe { dma.free(b) };
    }
    assert_eq!(dma.free_bytes(), 4 << 20);
}

#[test]
fn udmabuf_problems_name_the_fix() {
    let sys = FakeSystem::new();
    let e = UdmaBuf::open(&sys.paths, &UdmaBufConfig::default())
        .err()
        .unwrap();
    assert!(matches!(e, DmaError::Attribute { .. }));
    assert!(
        e.to_string().contains("modprobe u-dma-buf udmabuf0="),
        "{e}"
    );
    sys.udmabuf("udmabuf1", PHYS, 4 << 20);
    std::fs::remove_file(sys.paths.dev.join("udmabuf1")).unwrap();
    let cfg = UdmaBufConfig {
        name: "udmabuf1".into(),
        sync: false,
    };
    let e = UdmaBuf::open(&sys.paths, &cfg).err().unwrap().to_string();
    assert!(e.contains("dev/udmabuf1"), "{e}");
}

#[test]
fn hugepage_buffers_are_physically_where_the_page_map_says() {
    let Some(mut sys) = System::take("reserving hugepages") else {
        return;
    };
    if !sys.reserve_hugepages(4) {
        return;
    }
    let dma = HugePageDma::new(&SystemPaths::default(), 3).unwrap();
    let card = CardDma::HugePages(dma);
    let bufs = open_layout(&card);
    no_overlap(&bufs);
    let CardDma::HugePages(dma) = &card else {
        unreachable!()
    };
    // Rings and ACK frames share the first page; the 2 MiB buffer needs a page of its own.
    assert_eq!(dma.pages(), 2);
    let pm = Pagemap::open(&SystemPaths::default().pagemap()).unwrap();
    for b in &bufs {
        let cpu = b.cpu().as_ptr() as u64;
        assert_eq!(cpu % (2 << 20), b.device_addr().0 % (2 << 20));
        // Every 4 KiB page of the buffer: the page map agrees with the device address.
        for off in (0..b.len() as u64).step_by(4096) {
            assert_eq!(
                pm.device_addr(VirtAddr(cpu + off)).unwrap().0,
                b.device_addr().0 + off
            );
        }
    }
    assert!(
        card.alloc(HUGEPAGE + 1, 4096).is_err(),
        "one buffer is one page at most"
    );
    for b in bufs {
        // SAFETY: no pointer into the buffer is used afterwards.
        unsafe { card.free(b) };
    }
    drop(card);
    drop(sys);
}
