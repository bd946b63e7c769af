//! The verbs API on the PCI card's code path, against fake cards served by
//! `bluerdma-sim pci-serve --root DIR` processes: the driver opens `+pci;root=DIR` with its
//! unchanged real-card code (sysfs discovery, enable and bus master, BAR0 mmap, u-dma-buf,
//! mlock + pagemap translation of 2 MiB hugetlb pages), and the served card reads and
//! writes the driver's memory by physical address. Root only (CI runs as root).
//!
//! Each test uses its own addresses in 127.0.8.0/24.

use std::net::Ipv4Addr;

use bluerdma_linux::BackendKind;
use bluerdma_tests::connect_pair;
use bluerdma_tests::served::{exercise, open_all, root_or_skip, Hugepages, Served};

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn write_read_and_send_between_two_fake_pci_cards_move_every_byte() {
    if !root_or_skip("the fake PCI card") {
        return;
    }
    // Three 1 MiB MRs per side, each in its own 2 MiB hugepage (and a margin: other
    // processes may take pages from the pool meanwhile).
    let _pages = Hugepages::reserve(16);
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 8, 1), Ipv4Addr::new(127, 0, 8, 2));
    let (root_a, root_b) = (scratch("pci-a"), scratch("pci-b"));
    let _card_a = Served::pci(&root_a, ip_a, "pci-a");
    let _card_b = Served::pci(&root_b, ip_b, "pci-b");
    // The fake card answers commands through a polled BAR, on a loaded machine perhaps
    // only after the card's default 2 s.
    let devs = open_all(&format!(
        "blue0={ip_a}+pci;root={};command_timeout=20,blue1={ip_b}+pci;root={};command_timeout=20",
        root_a.display(),
        root_b.display()
    ));
    let (a, b) = (&devs[0], &devs[1]);
    assert_eq!(
        (a.backend(), b.backend()),
        (BackendKind::Pci, BackendKind::Pci)
    );
    let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
    exercise(a, b, (&sa, &sb), 3);
    exercise(b, a, (&sb, &sa), 5);
    // The card's counters come from its BAR.
    assert!(
        a.card_stats().starts_with("0000:3b:00.0"),
        "{}",
        a.card_stats()
    );
    // The QPs go first (their destruction is a command the cards answer), then the
    // devices, then the cards.
}

/// A served card is not reset when its driver goes: each ring's pointers stay where the
/// last driver left them. Drivers one after another on the same two cards (as perftest runs
/// one tool after another) must each take every ring over from there and move every byte.
/// Each later driver is checked to start on a used card (the simple-NIC TX tail its
/// predecessor's ACKs moved is not 0 in the BAR). The race that made a driver which
/// programmed its rings at 0 lose its ACK ring (the card saw the old head with the new
/// tail) is timing-dependent; the ring unit tests pin the fix itself (a driver writes no
/// pointer but its own, set to the card's).
#[test]
fn drivers_one_after_another_on_the_same_cards_take_every_ring_over() {
    if !root_or_skip("the fake PCI card") {
        return;
    }
    let _pages = Hugepages::reserve(16);
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 8, 3), Ipv4Addr::new(127, 0, 8, 4));
    let (root_a, root_b) = (scratch("pci-c"), scratch("pci-d"));
    let _card_a = Served::pci(&root_a, ip_a, "pci-c");
    let _card_b = Served::pci(&root_b, ip_b, "pci-d");
    let list = format!(
        "blue0={ip_a}+pci;root={};command_timeout=20,blue1={ip_b}+pci;root={};command_timeout=20",
        root_a.display(),
        root_b.display()
    );
    for driver in 0..3u32 {
        if driver > 0 {
            for root in [&root_a, &root_b] {
                let tail = simple_nic_tx_tail(root);
                assert_ne!(
                    tail, 0,
                    "driver {driver} starts on an unused card ({root:?})"
                );
            }
        }
        let devs = open_all(&list);
        let (a, b) = (&devs[0], &devs[1]);
        let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
        exercise(a, b, (&sa, &sb), 11 + driver);
        exercise(b, a, (&sb, &sa), 17 + driver);
    }
}

/// The simple-NIC TX tail of the fake card under `root`, as its BAR holds it once the
/// card's mirror has copied it there (polled: it may take a moment after the driver went).
fn simple_nic_tx_tail(root: &std::path::Path) -> u32 {
    use bluerdma_core::regs::{RingId, RingReg, DECODED_CHANNELS};
    use std::os::unix::fs::FileExt;
    let bar = root.join("sys/bus/pci/devices/0000:3b:00.0/resource0");
    let file = std::fs::File::open(&bar).unwrap_or_else(|e| panic!("{}: {e}", bar.display()));
    let at = RingId::SimpleNicTx
        .reg(RingReg::Tail, DECODED_CHANNELS)
        .expect("decoded")
        .offset();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let mut word = [0u8; 4];
        file.read_exact_at(&mut word, u64::from(at))
            .expect("BAR read");
        let tail = u32::from_le_bytes(word);
        if tail != 0 || std::time::Instant::now() >= deadline {
            return tail;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
