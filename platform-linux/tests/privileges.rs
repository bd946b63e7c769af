//! The error text for each missing privilege, produced for real: each case runs one of
//! the `child_*` tests below in a child process of this test binary that lacks the
//! privilege (a capability dropped from its bounding set before exec, so even root does
//! not get it back; or a non-root user), and the child checks the error it gets.
//!
//! | privilege | how the child loses it | what fails |
//! |---|---|---|
//! | CAP_SYS_ADMIN | dropped | pagemap frame numbers read as 0 |
//! | CAP_IPC_LOCK | dropped, RLIMIT_MEMLOCK 1 MiB | mlock of 64 MiB |
//! | root | uid 65534 | opening `resource0` and `/dev/udmabufN` |

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::platform::{MemoryResolver, PlatformError};
use bluerdma_linux::bar::Bar0;
use bluerdma_linux::dma::{UdmaBuf, UdmaBufConfig};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::umem::{CompactionPolicy, HostUmem, UmemError};
use common::fake_sysfs::FakeSystem;
use common::{is_root, Buf};

const CAP_IPC_LOCK: libc::c_ulong = 14;
const CAP_SYS_ADMIN: libc::c_ulong = 21;
const CHILD: &str = "BLUERDMA_PRIVILEGE_CHILD";

/// Runs the ignored test `name` of this binary in a child set up by `setup`; requires it
/// to pass (and to have run).
fn run_child(name: &str, setup: impl FnOnce(&mut Command)) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
    setup(&mut cmd);
    let out = cmd.output().expect("spawn the child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- child {name}:\n{stdout}{stderr}");
    assert!(out.status.success(), "child {name} failed");
    assert!(stdout.contains("1 passed"), "child {name} did not run");
}

/// Drops `caps` from the bounding set before exec and sets RLIMIT_MEMLOCK to `memlock`.
fn without_caps(cmd: &mut Command, caps: &'static [libc::c_ulong], memlock: Option<u64>) {
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // system calls (prctl, setrlimit) on values it owns.
    unsafe {
        cmd.pre_exec(move || {
            for &cap in caps {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(bytes) = memlock {
                let lim = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
}

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
fn without_cap_sys_admin_translation_names_it() {
    if !is_root() {
        common::skip(format_args!(
            "SKIPPED: dropping a capability from root needs root (CI runs as root)"
        ));
        return;
    }
    run_child("child_translate_without_cap_sys_admin", |c| {
        without_caps(c, &[CAP_SYS_ADMIN], None)
    });
}

#[test]
#[ignore = "runs in a child process without CAP_SYS_ADMIN (see without_cap_sys_admin_...)"]
fn child_translate_without_cap_sys_admin() {
    assert!(
        in_child(),
        "run by without_cap_sys_admin_translation_names_it"
    );
    let buf = Buf::ordinary(1 << 20);
    let va = VirtAddr(buf.addr());
    let mut umem = HostUmem::with(SystemPaths::default(), CompactionPolicy::Allow).unwrap();
    umem.try_pin(va, 1 << 20).unwrap();
    let mut out = [DeviceAddr(0); 4];
    assert_eq!(
        MemoryResolver::translate(&mut umem, va, PageSize::Size4K, &mut out),
        Err(PlatformError::NotPermitted)
    );
    let e = umem.last_error().unwrap();
    assert_eq!(*e, UmemError::PfnHidden { va });
    let text = e.to_string();
    println!("error: {text}");
    assert!(text.contains("needs CAP_SYS_ADMIN"), "{text}");
    assert!(text.contains("setcap cap_sys_admin"), "{text}");
}

#[test]
fn without_cap_ipc_lock_pinning_names_the_limit() {
    if !is_root() {
        common::skip(format_args!(
            "SKIPPED: dropping a capability from root needs root (CI runs as root)"
        ));
        return;
    }
    run_child("child_pin_without_cap_ipc_lock", |c| {
        without_caps(c, &[CAP_IPC_LOCK], Some(1 << 20))
    });
}

#[test]
#[ignore = "runs in a child process without CAP_IPC_LOCK (see without_cap_ipc_lock_...)"]
fn child_pin_without_cap_ipc_lock() {
    assert!(
        in_child(),
        "run by without_cap_ipc_lock_pinning_names_the_limit"
    );
    let buf = Buf::ordinary(64 << 20);
    let va = VirtAddr(buf.addr());
    let mut umem = HostUmem::with(SystemPaths::default(), CompactionPolicy::Allow).unwrap();
    assert_eq!(
        MemoryResolver::pin(&mut umem, va, 64 << 20, true),
        Err(PlatformError::PinFailed { va })
    );
    let e = umem.last_error().unwrap();
    assert_eq!(
        *e,
        UmemError::LockLimit {
            va,
            len: 64 << 20,
            limit: 1 << 20
        }
    );
    let text = e.to_string();
    println!("error: {text}");
    assert!(text.contains("RLIMIT_MEMLOCK is 1048576 bytes"), "{text}");
    assert!(
        text.contains("lacks CAP_IPC_LOCK") && text.contains("ulimit -l"),
        "{text}"
    );
}

#[test]
fn without_root_the_card_files_say_so() {
    if !is_root() {
        common::skip(format_args!(
            "SKIPPED: switching to another user needs root (CI runs as root)"
        ));
        return;
    }
    let sys = FakeSystem::new();
    sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0);
    sys.udmabuf("udmabuf0", 0x1_0000_0000, 4 << 20);
    // Directories open to all, as in sysfs; the BAR and the buffer node root-only.
    let open_dirs = |p: &Path| {
        let mut at = p.to_path_buf();
        while at.starts_with(sys.dir.path()) {
            std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o755)).unwrap();
            at.pop();
        }
    };
    let resource0 = sys.paths.pci_devices().join("0000:3b:00.0/resource0");
    open_dirs(resource0.parent().unwrap());
    open_dirs(&sys.paths.udmabuf_class().join("udmabuf0"));
    open_dirs(&sys.paths.dev);
    let node = sys.paths.dev.join("udmabuf0");
    for f in [&resource0, &node] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for f in ["phys_addr", "size"] {
        let p = sys.paths.udmabuf_class().join("udmabuf0").join(f);
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    run_child("child_card_files_as_nobody", |c| {
        c.uid(65534)
            .gid(65534)
            .env("BLUERDMA_FAKE_ROOT", sys.dir.path());
    });
}

#[test]
#[ignore = "runs in a child process as user nobody (see without_root_the_card_files_say_so)"]
fn child_card_files_as_nobody() {
    assert!(in_child(), "run by without_root_the_card_files_say_so");
    let root = std::env::var_os("BLUERDMA_FAKE_ROOT").unwrap();
    let paths = SystemPaths::under(Path::new(&root));
    let resource0 = paths.pci_devices().join("0000:3b:00.0/resource0");
    let text = Bar0::map(&resource0).err().unwrap().to_string();
    println!("error: {text}");
    assert!(text.contains("Permission denied"), "{text}");
    assert!(text.contains("mapping a PCI BAR needs root"), "{text}");
    let text = UdmaBuf::open(&paths, &UdmaBufConfig::default())
        .err()
        .unwrap()
        .to_string();
    println!("error: {text}");
    assert!(
        text.contains("run as root") && text.contains("chmod"),
        "{text}"
    );
    // An ordinary user has no CAP_SYS_ADMIN either.
    let buf = Buf::ordinary(1 << 20);
    let mut umem = HostUmem::with(SystemPaths::default(), CompactionPolicy::Allow).unwrap();
    let mut out = [DeviceAddr(0)];
    let e = umem
        .try_translate(VirtAddr(buf.addr()), PageSize::Size4K, &mut out)
        .unwrap_err();
    assert!(matches!(e, UmemError::PfnHidden { .. }), "{e}");
}
