//! Opening the card's platform over a fake tree: the device is enabled and made a bus
//! master, BAR0 maps, DMA comes from u-dma-buf; a translating IOMMU is refused.

mod common;

use bluerdma_core::platform::{DmaAllocator, RegisterAccess};
use bluerdma_core::regs::{RingId, RingReg, DECODED_CHANNELS};
use bluerdma_linux::card::{open_card, CardConfig, CardError};
use bluerdma_linux::dma::CardDma;
use common::fake_sysfs::FakeSystem;

fn fake_card() -> FakeSystem {
    let sys = FakeSystem::new();
    std::os::unix::fs::symlink("/proc/self/pagemap", sys.paths.pagemap()).unwrap();
    sys.udmabuf("udmabuf0", 0x1_2340_0000, 4 << 20);
    let d = sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0x0000);
    std::fs::write(d.join("enable"), "0\n").unwrap();
    sys
}

#[test]
fn opening_enables_the_card_and_maps_everything() {
    let sys = fake_card();
    let cfg = CardConfig {
        paths: sys.paths.clone(),
        ..CardConfig::default()
    };
    let parts = open_card(&cfg).unwrap();
    assert_eq!(parts.device.address().to_string(), "0000:3b:00.0");
    assert_eq!(
        std::fs::read_to_string(parts.device.dir().join("enable")).unwrap(),
        "1"
    );
    assert_eq!(
        parts.device.command().unwrap() & 0x6,
        0x6,
        "memory + bus master"
    );
    let head = RingId::Send(0)
        .reg(RingReg::Head, DECODED_CHANNELS)
        .unwrap();
    parts.regs.write32(head, 5);
    assert_eq!(parts.regs.read32(head), 5);
    assert!(matches!(parts.dma, CardDma::Udmabuf(_)));
    let ring = parts.dma.alloc(128 << 10, 4096).unwrap();
    assert_eq!(ring.device_addr().0, 0x1_2340_0000);
    // SAFETY: nothing uses the buffer afterwards.
    unsafe { parts.dma.free(ring) };
}

#[test]
fn a_translating_iommu_is_refused_with_the_fix() {
    let sys = fake_card();
    let d = sys.paths.pci_devices().join("0000:3b:00.0");
    std::fs::create_dir_all(d.join("iommu_group")).unwrap();
    std::fs::write(d.join("iommu_group/type"), "DMA\n").unwrap();
    let cfg = CardConfig {
        paths: sys.paths.clone(),
        ..CardConfig::default()
    };
    let e = open_card(&cfg).err().unwrap();
    assert!(matches!(e, CardError::Iommu { .. }));
    assert!(e.to_string().contains("iommu=pt"), "{e}");
}

#[test]
fn the_core_engine_runs_on_this_platform_from_any_thread() {
    fn send<T: Send>() {}
    send::<
        bluerdma_core::engine::Device<
            bluerdma_linux::card::CardPlatform,
            bluerdma_linux::storage::HeapStorage,
        >,
    >();
}
