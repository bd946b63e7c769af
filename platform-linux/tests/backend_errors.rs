//! Opening a `+pci` device that cannot work gives the reason and the fix, and the errno a
//! card owner can act on: each case is a fake sysfs tree with one thing wrong, opened
//! through the device list as the libibverbs stand-in opens it.
//!
//! | what is wrong | errno | the message names |
//! |---|---|---|
//! | BAR0 reads 0xFFFFFFFF (the card does not answer) | ENODEV | the bitstream, remove and rescan |
//! | translating IOMMU | ENODEV | `iommu=pt` |
//! | the named u-dma-buf buffer is missing | ENODEV | `modprobe u-dma-buf` |
//! | no card in the tree | ENODEV | the sysfs directory, `lspci` |
//! | not root (user nobody) | EACCES | run as root |

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use bluerdma_linux::devices::{self, DeviceList, Settings};
use bluerdma_linux::OpenError;
use common::fake_sysfs::FakeSystem;
use common::is_root;

const BDF: &str = "0000:3b:00.0";
const CHILD: &str = "BLUERDMA_BACKEND_ERRORS_CHILD";

/// A tree with a working card (as far as the driver can tell before the first command).
fn card() -> FakeSystem {
    let sys = FakeSystem::new();
    std::os::unix::fs::symlink("/proc/self/pagemap", sys.paths.pagemap()).unwrap();
    sys.pci_device(BDF, 0x1172, 0x0000, 0);
    sys.udmabuf("udmabuf0", 0x70_0000_0000, 8 << 20);
    sys
}

/// Opens `blue0=127.0.0.1+pci<options>;root=<tree>`.
fn open(sys: &FakeSystem, options: &str) -> OpenError {
    let text = format!(
        "blue0=127.0.0.1+pci{options};root={}",
        sys.dir.path().display()
    );
    let list = DeviceList::parse_inline(&text).unwrap();
    let entry = &list.entries()[0];
    let settings = Settings::from_vars(&|_| None).unwrap();
    match devices::open(&list, entry, entry.spec(), &settings) {
        Ok(_) => panic!("{text} opened"),
        Err(e) => {
            println!("{} ({})", e, e.errno_name());
            e
        }
    }
}

#[test]
fn a_bar_that_reads_all_ones_is_enodev_naming_the_bitstream() {
    let sys = card();
    let bar = sys.paths.pci_devices().join(BDF).join("resource0");
    std::fs::write(&bar, vec![0xFF; 0x10000]).unwrap();
    let e = open(&sys, "");
    assert_eq!((e.errno, e.device.as_str()), (libc::ENODEV, "blue0"));
    assert!(e.message.contains("reads 0xFFFFFFFF"), "{e}");
    assert!(e.message.contains("reload the bitstream"), "{e}");
    assert!(e.message.contains("/sys/bus/pci/rescan"), "{e}");
}

#[test]
fn a_translating_iommu_is_enodev_naming_iommu_pt() {
    let sys = card();
    sys.write(
        &format!("sys/bus/pci/devices/{BDF}/iommu_group/type"),
        "DMA-FQ\n",
    );
    let e = open(&sys, "");
    assert_eq!(e.errno, libc::ENODEV);
    assert!(e.message.contains("translating mode (DMA-FQ)"), "{e}");
    assert!(e.message.contains("iommu=pt"), "{e}");
}

#[test]
fn a_missing_u_dma_buf_buffer_is_enodev_naming_the_module() {
    let sys = card();
    let e = open(&sys, ";udmabuf=udmabuf3");
    assert_eq!(e.errno, libc::ENODEV);
    assert!(e.message.contains("udmabuf3"), "{e}");
    assert!(e.message.contains("modprobe u-dma-buf"), "{e}");
}

#[test]
fn a_tree_without_the_card_is_enodev_naming_lspci() {
    let sys = FakeSystem::new();
    let e = open(&sys, ":0000:3b:00.1");
    assert_eq!(e.errno, libc::ENODEV);
    assert!(e.message.contains("no PCI device at 0000:3b:00.1"), "{e}");
    assert!(e.message.contains("lspci -D"), "{e}");
}

#[test]
fn without_root_the_card_is_eacces_naming_root() {
    if !is_root() {
        common::skip(format_args!(
            "SKIPPED: switching to another user needs root (CI runs as root)"
        ));
        return;
    }
    let sys = card();
    // Readable to all, as sysfs is; writable by root only.
    for entry in walk(sys.dir.path()) {
        let mode = if entry.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_open_as_nobody",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD, sys.dir.path())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child failed"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_symlink() {
            continue;
        }
        if p.is_dir() {
            all.extend(walk(&p));
        } else {
            all.push(p);
        }
    }
    all
}

#[test]
#[ignore = "runs in a child process as user nobody (see without_root_the_card_is_eacces_...)"]
fn child_open_as_nobody() {
    let root = std::env::var(CHILD).expect("run by without_root_the_card_is_eacces_naming_root");
    let text = format!("blue0=127.0.0.1+pci;root={root}");
    let list = DeviceList::parse_inline(&text).unwrap();
    let entry = &list.entries()[0];
    let settings = Settings::from_vars(&|_| None).unwrap();
    let e = devices::open(&list, entry, entry.spec(), &settings)
        .err()
        .unwrap();
    println!("{e} ({})", e.errno_name());
    assert_eq!(e.errno, libc::EACCES, "{e}");
    assert!(e.message.contains("Permission denied"), "{e}");
    assert!(e.message.contains("run as root"), "{e}");
}
