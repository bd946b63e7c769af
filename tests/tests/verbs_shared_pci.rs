//! A device shared between processes on the PCI card's code path: two fake cards served by
//! `bluerdma-sim pci-serve --root DIR` (`+pci;root=DIR`), each owned by its `bluerdma-devd`,
//! which holds BAR0 and the u-dma-buf buffer. Every client pins its MRs and its engine's DMA
//! buffers in its own hugepages, translates them through its own page map and claims them;
//! the daemon checks each claim against the client's page map, and the card reaches every
//! client's memory by physical address. This process and a `verbs_peer` child share card
//! A; each WRITEs to card B and the bytes are checked; then B WRITEs into each of them.
//! Root only (CI runs as root), with hugepages.
//!
//! Addresses 127.0.8.21 and .22 (backend_pci uses 127.0.8.1..), so other test binaries may
//! run at the same time.

use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bluerdma_linux::devices::DeviceList;
use bluerdma_linux::shared::client::{refused_errno, Session};
use bluerdma_linux::umem::Pagemap;
use bluerdma_linux::BackendKind;
use bluerdma_tests::served::{root_or_skip, Hugepages, Served};
use bluerdma_tests::shared::{open, setup, status, status_field, SharedPair};

const STEP: Duration = Duration::from_secs(60);
/// The QPs' local ACK timeout (4.096 us << 16 = 268 ms).
const TIMEOUT: u8 = 16;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn two_processes_share_a_fake_pci_card() {
    if !root_or_skip("the fake PCI card") {
        return;
    }
    // Three clients (this process on A and on B, the child on A), each with two or three
    // hugepages of DMA buffers and one MR in its own hugepage, one more for the claims, and
    // a margin: other processes may take pages from the pool meanwhile.
    let Ok(_pages) = std::panic::catch_unwind(|| Hugepages::reserve(16)) else {
        eprintln!("SKIPPED: the shared fake PCI card needs 16 free 2 MiB hugepages");
        return;
    };
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 8, 21), Ipv4Addr::new(127, 0, 8, 22));
    let (root_a, root_b) = (scratch("pci-sa"), scratch("pci-sb"));
    let _card_a = Served::pci(&root_a, ip_a, "pci-sa");
    let _card_b = Served::pci(&root_b, ip_b, "pci-sb");
    // The fake card answers commands through a polled BAR, on a loaded machine perhaps only
    // after the card's default 2 s.
    let devices = format!(
        "pa={ip_a}+pci;root={};command_timeout=20,pb={ip_b}+pci;root={};command_timeout=20",
        root_a.display(),
        root_b.display()
    );
    let dir = scratch("verbs_shared_pci");
    setup(&devices, &dir);
    let a = open("pa").expect("open pa through its daemon");
    let b = open("pb").expect("open pb through its daemon");
    assert_eq!(
        (a.backend(), b.backend()),
        (BackendKind::Pci, BackendKind::Pci)
    );

    // The first time a card touches a process's memory it searches the page maps for the
    // frame's owner (tens of ms, more on a loaded machine), once per process and card: an
    // ACK timeout of 268 ms (16) rather than 67 ms keeps that within the first attempts.
    let mut pair = SharedPair::connect(env!("CARGO_BIN_EXE_verbs_peer"), (&a, "pa"), &b, TIMEOUT);
    // Both processes are clients of A's daemon, each with its QP and MR valid in the card
    // (their MRs' page-table entries name claimed pages), and nothing was refused.
    let text = status("pa").expect("pa's daemon state");
    let clients: Vec<&str> = text.lines().filter(|l| l.starts_with("client ")).collect();
    assert_eq!(clients.len(), 2, "{text}");
    for c in clients {
        for key in ["qps", "mrs"] {
            assert!(
                status_field(c, "client", key).is_some_and(|n| n >= 1),
                "{text}"
            );
        }
    }
    for counter in ["refused_commands: 0,", "refused_sends: 0,"] {
        assert!(text.contains(counter), "{text}");
    }

    pair.write_both_ways(STEP);
    let SharedPair { child, ma, .. } = pair;
    child.quit();

    claims_are_checked_against_the_page_map(&ma);
}

/// A raw client of A's daemon: a true claim (of this process's MR page, at its frame) is
/// taken, a false one (another frame; a page that is not mapped) refused with EPERM, a map
/// refused (the PCI card takes claims); and memory unmapped while still claimed gets the
/// client dropped at the daemon's next audit.
fn claims_are_checked_against_the_page_map(ma: &bluerdma_linux::Mr) {
    use bluerdma_core::addr::{PageSize, VirtAddr};
    use bluerdma_linux::shared::proto::{Reply, Request};

    let list = DeviceList::from_env().unwrap();
    let entry = list.get("pa").unwrap();
    let sock = UnixStream::connect(bluerdma_linux::shared::socket_path(entry)).unwrap();
    let session = Session::start("raw", sock, PageSize::Size2M).unwrap();
    assert!(session.welcome.claims(), "{:?}", session.welcome);
    let pagemap = Pagemap::open(Path::new("/proc/self/pagemap")).unwrap();
    let page = 2u64 << 20;
    let va = ma.addr() - ma.addr() % page;
    let dev = pagemap.device_addr(VirtAddr(va)).unwrap().0;
    let errno = |r: std::io::Result<Reply>| r.err().as_ref().and_then(refused_errno);
    let claim = |va, dev| Request::Claim {
        va,
        len: page,
        dev,
        dma: false,
    };
    let c = &session.control;
    assert_eq!(c.call(&claim(va, dev)).unwrap(), Reply::Done);
    assert_eq!(errno(c.call(&claim(va, dev + page))), Some(libc::EPERM));
    // The page below the MR's, with the MR's frame: whether it is mapped (at another frame)
    // or not, the claim is false.
    assert_eq!(errno(c.call(&claim(va - page, dev))), Some(libc::EPERM));
    let map = Request::Map {
        va,
        len: page,
        page_shift: 21,
        dma: false,
    };
    assert_eq!(errno(c.call(&map)), Some(libc::EOPNOTSUPP));
    assert_eq!(
        c.call(&Request::Unclaim { dev, len: page }).unwrap(),
        Reply::Done
    );

    // A hugepage claimed, then unmapped while the claim stands.
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks.
    let huge = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(huge, libc::MAP_FAILED, "a hugepage");
    let hva = huge as u64;
    let hdev = pagemap.device_addr(VirtAddr(hva)).unwrap().0;
    assert_eq!(c.call(&claim(hva, hdev)).unwrap(), Reply::Done);
    // SAFETY: the mapping made above, used by nothing else.
    unsafe { libc::munmap(huge, page as usize) };
    std::thread::sleep(bluerdma_linux::shared::daemon::AUDIT_EVERY * 2);
    assert!(
        c.call(&Request::Unclaim {
            dev: hdev,
            len: page
        })
        .is_err(),
        "the daemon still serves a client whose claimed page went"
    );
}
