//! `bluerdma-doctor`: checks that this host can run the real card, and prints for each
//! failure the exact command that fixes it.
//!
//! Checks, in order: privileges (CAP_SYS_ADMIN for frame numbers, CAP_IPC_LOCK or
//! RLIMIT_MEMLOCK for pinning), page-map visibility, the 2 MiB hugepage pool,
//! `vm.compact_unevictable_allowed` (issue E item 5), u-dma-buf, the PCI device, its
//! BAR0 (enabled, mappable, answering), bus mastering, and the IOMMU (device addresses
//! are physical addresses only without translation). When all of those pass, a last check
//! opens the card as the driver does ([`crate::backend::pci::open_with`]: it enables the
//! device and its bus mastering, maps BAR0 and the DMA memory) and reports the same errno
//! and message a verb would get. Every path comes from a [`SystemPaths`], so the checks
//! run against fake trees in tests.

use std::fmt::{self, Write as _};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Counter;

use crate::bar::Bar0;
use crate::dma::{open_buffers_fit, UdmaBuf, UdmaBufConfig};
use crate::paths::{parse_number, read_trimmed, SystemPaths};
use crate::pci::{PciDevice, PciError, PciSelector, COMMAND_BUS_MASTER, COMMAND_MEMORY};
use crate::umem::{compaction_moves_locked_pages, Pagemap, UmemError};

/// What to check.
#[derive(Clone, Debug)]
pub struct DoctorConfig {
    /// Where sysfs, procfs and /dev are.
    pub paths: SystemPaths,
    /// Which PCI device is the card.
    pub selector: PciSelector,
    /// The u-dma-buf buffer's name.
    pub udmabuf: String,
    /// Free 2 MiB hugepages wanted (registered memory and DMA).
    pub hugepages: u64,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        Self {
            paths: SystemPaths::default(),
            selector: PciSelector::default(),
            udmabuf: "udmabuf0".into(),
            hugepages: 16,
        }
    }
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, with a limitation.
    Warn,
    /// The card cannot be used until fixed.
    Fail,
    /// Not checked (something it depends on failed).
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "[ ok ]",
            Status::Warn => "[warn]",
            Status::Fail => "[FAIL]",
            Status::Skip => "[skip]",
        })
    }
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// The command that fixes it (for warnings and failures).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn bad(name: &'static str, status: Status, detail: impl Into<String>, fix: String) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
            fix: Some(fix),
        }
    }

    fn skip(name: &'static str, why: &str) -> Self {
        Self {
            name,
            status: Status::Skip,
            detail: why.into(),
            fix: None,
        }
    }
}

const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_ADMIN: u32 = 21;
const SETCAP: &str = "sudo setcap cap_sys_admin,cap_ipc_lock+ep <program>";
const HUGEPAGE_KIB: u64 = 2048;

/// The effective capability set, from the status file's `CapEff` line.
fn effective_caps(paths: &SystemPaths) -> Option<u64> {
    let status = std::fs::read_to_string(paths.status()).ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return None;
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

fn check_privileges(paths: &SystemPaths) -> Check {
    const NAME: &str = "privileges";
    let Some(caps) = effective_caps(paths) else {
        return Check::bad(
            NAME,
            Status::Fail,
            format!("cannot read {}", paths.status().display()),
            "mount procfs: `sudo mount -t proc proc /proc`".into(),
        );
    };
    let has = |c: u32| caps & (1 << c) != 0;
    if !has(CAP_SYS_ADMIN) {
        return Check::bad(
            NAME,
            Status::Fail,
            "no CAP_SYS_ADMIN: physical addresses of registered memory are hidden",
            format!("run as root (`sudo`), or `{SETCAP}`"),
        );
    }
    if !has(CAP_IPC_LOCK) {
        if let Some(limit) = memlock_limit() {
            return Check::bad(
                NAME,
                Status::Warn,
                format!(
                    "CAP_SYS_ADMIN, but no CAP_IPC_LOCK: registered memory is limited to \
                     RLIMIT_MEMLOCK ({limit} bytes)"
                ),
                format!("`ulimit -l unlimited` (as root), or `{SETCAP}`"),
            );
        }
    }
    Check::ok(NAME, "CAP_SYS_ADMIN and CAP_IPC_LOCK")
}

fn check_pagemap(paths: &SystemPaths) -> Check {
    const NAME: &str = "pagemap";
    let probe = vec![1u8; 4096];
    let va = VirtAddr(std::hint::black_box(probe.as_ptr()) as u64);
    let result = Pagemap::open(&paths.pagemap()).and_then(|pm| pm.device_addr(va));
    match result {
        Ok(_) => Check::ok(NAME, "frame numbers are visible in /proc/self/pagemap"),
        Err(e @ UmemError::PfnHidden { .. }) => Check::bad(
            NAME,
            Status::Fail,
            e.to_string(),
            format!("run as root (`sudo`), or `{SETCAP}`"),
        ),
        Err(e) => Check::bad(
            NAME,
            Status::Fail,
            e.to_string(),
            "mount procfs: `sudo mount -t proc proc /proc`".into(),
        ),
    }
}

fn check_hugepages(paths: &SystemPaths, want: u64) -> Check {
    const NAME: &str = "hugepages";
    let pool = paths.hugepages(HUGEPAGE_KIB);
    let read = |f: &str| {
        read_trimmed(&pool.join(f))
            .ok()
            .and_then(|t| parse_number(&t))
    };
    let (Some(nr), Some(free)) = (read("nr_hugepages"), read("free_hugepages")) else {
        return Check::bad(
            NAME,
            Status::Fail,
            format!("no 2 MiB hugepage pool ({} missing)", pool.display()),
            "use a kernel with CONFIG_HUGETLBFS (hugepages are required for 2 MiB pages)".into(),
        );
    };
    if free >= want {
        return Check::ok(
            NAME,
            format!("{free} of {nr} 2 MiB hugepages free ({want} wanted)"),
        );
    }
    let target = nr + (want - free);
    Check::bad(
        NAME,
        Status::Fail,
        format!("{free} of {nr} 2 MiB hugepages free, {want} wanted"),
        format!(
            "echo {target} | sudo tee {}  (persist: `vm.nr_hugepages = {target}` in \
             /etc/sysctl.d/90-bluerdma.conf)",
            pool.join("nr_hugepages").display()
        ),
    )
}

fn check_compaction(paths: &SystemPaths) -> Check {
    const NAME: &str = "compaction";
    match compaction_moves_locked_pages(paths) {
        Ok(false) => Check::ok(
            NAME,
            "vm.compact_unevictable_allowed=0: compaction leaves mlocked pages in place",
        ),
        Ok(true) => Check::bad(
            NAME,
            Status::Warn,
            "vm.compact_unevictable_allowed=1: compaction may move mlocked pages, so only \
             hugetlb memory can be registered",
            "sudo sysctl -w vm.compact_unevictable_allowed=0  (persist: \
             `vm.compact_unevictable_allowed = 0` in /etc/sysctl.d/90-bluerdma.conf)"
                .into(),
        ),
        Err(e) => Check::bad(NAME, Status::Warn, e.to_string(), "run as root".into()),
    }
}

fn check_udmabuf(paths: &SystemPaths, name: &str, hugepages_ok: bool) -> Check {
    const NAME: &str = "u-dma-buf";
    // Without u-dma-buf, ring memory comes from hugepages: a limitation, not a failure.
    let missing = if hugepages_ok {
        Status::Warn
    } else {
        Status::Fail
    };
    let load = format!(
        "sudo modprobe u-dma-buf {name}=4194304  (build and install the u-dma-buf module \
         first if modprobe cannot find it)"
    );
    let cfg = UdmaBufConfig {
        name: name.into(),
        sync: true,
    };
    match UdmaBuf::open(paths, &cfg) {
        Ok(buf) => {
            let (base, len) = (buf.device_addr().0, buf.len());
            if open_buffers_fit(base, len) {
                Check::ok(NAME, format!("{} bytes at {base:#x}", len))
            } else {
                Check::bad(
                    NAME,
                    missing,
                    format!(
                        "{len} bytes at {base:#x} cannot hold the rings and the 2 MiB-aligned \
                         receive buffer"
                    ),
                    format!("sudo rmmod u_dma_buf && {load}"),
                )
            }
        }
        Err(e @ crate::dma::DmaError::Open { .. }) => Check::bad(
            NAME,
            Status::Fail,
            e.to_string(),
            format!(
                "run as root (`sudo`), or `sudo chmod 0666 {}`",
                paths.dev.join(name).display()
            ),
        ),
        Err(crate::dma::DmaError::Attribute { path, source }) => Check::bad(
            NAME,
            missing,
            format!("no u-dma-buf buffer {name}: {}: {source}", path.display()),
            load,
        ),
        Err(e) => Check::bad(NAME, missing, e.to_string(), load),
    }
}

fn check_device(cfg: &DoctorConfig) -> (Check, Option<PciDevice>) {
    const NAME: &str = "pci device";
    match PciDevice::open(&cfg.paths, cfg.selector) {
        Ok(dev) => {
            let check = match dev.driver() {
                Some(driver) => Check::bad(
                    NAME,
                    Status::Warn,
                    format!(
                        "{} ({}) is bound to kernel driver {driver}",
                        dev.address(),
                        dev.id()
                    ),
                    format!(
                        "echo {} | sudo tee {}/driver/unbind",
                        dev.address(),
                        dev.dir().display()
                    ),
                ),
                None => Check::ok(NAME, format!("{} ({})", dev.address(), dev.id())),
            };
            (check, Some(dev))
        }
        Err(e) => {
            let (detail, fix) = match &e {
                PciError::Ambiguous { .. } => {
                    (e.to_string(), "bluerdma-doctor --bdf <address>".to_owned())
                }
                PciError::NotFound { id, path } => (
                    format!("no PCI device {id} in {}", path.display()),
                    format!(
                        "load the bitstream, then `echo 1 | sudo tee /sys/bus/pci/rescan`; \
                         `lspci -nn -d {:04x}:` must list the card",
                        id.vendor
                    ),
                ),
                _ => (e.to_string(), "`lspci -D` lists the addresses".to_owned()),
            };
            (Check::bad(NAME, Status::Fail, detail, fix), None)
        }
    }
}

fn check_bar0(dev: &PciDevice) -> Check {
    const NAME: &str = "bar0";
    let bdf = dev.address();
    let enable = format!("echo 1 | sudo tee {}", dev.dir().join("enable").display());
    let info = match dev.bar(0) {
        Ok(b) if b.len > 0 => b,
        Ok(_) => {
            return Check::bad(
                NAME,
                Status::Fail,
                format!("{bdf} has no BAR0: wrong device or bitstream"),
                "bluerdma-doctor --bdf <address of the card>".into(),
            )
        }
        Err(e) => return Check::bad(NAME, Status::Fail, e.to_string(), enable),
    };
    match dev.is_enabled() {
        Ok(true) => {}
        Ok(false) => {
            return Check::bad(
                NAME,
                Status::Fail,
                format!("{bdf} is not enabled (memory decoding off)"),
                enable,
            )
        }
        Err(e) => return Check::bad(NAME, Status::Fail, e.to_string(), "run as root".into()),
    }
    let bar = match Bar0::map(&dev.resource0()) {
        Ok(b) => b,
        Err(e) => {
            return Check::bad(
                NAME,
                Status::Fail,
                e.to_string(),
                "run as root (`sudo`)".into(),
            )
        }
    };
    let probe = bar.read32(Counter::EthRdma.reg());
    if probe == u32::MAX {
        return Check::bad(
            NAME,
            Status::Fail,
            format!("{bdf}: BAR0 reads all ones: the card does not answer"),
            format!(
                "reload the bitstream, then `echo 1 | sudo tee {}/remove && echo 1 | sudo tee \
                 /sys/bus/pci/rescan`",
                dev.dir().display()
            ),
        );
    }
    Check::ok(
        NAME,
        format!(
            "{} bytes at {:#x}, mapped; {} RDMA frames received",
            info.len, info.start, probe
        ),
    )
}

fn check_bus_master(dev: &PciDevice) -> Check {
    const NAME: &str = "bus master";
    let want = COMMAND_MEMORY | COMMAND_BUS_MASTER;
    match dev.command() {
        Ok(cmd) if cmd & want == want => Check::ok(NAME, format!("command register {cmd:#06x}")),
        Ok(cmd) => Check::bad(
            NAME,
            Status::Warn,
            format!(
                "command register {cmd:#06x}: memory or bus mastering off (the driver turns \
                 both on when it opens the card; without bus mastering all DMA is dropped)"
            ),
            format!("sudo setpci -s {} COMMAND=0x06:0x06", dev.address()),
        ),
        Err(e) => Check::bad(
            NAME,
            Status::Fail,
            e.to_string(),
            "run as root (`sudo`)".into(),
        ),
    }
}

fn check_iommu(dev: &PciDevice) -> Check {
    const NAME: &str = "iommu";
    let kind = dev.iommu_group_type();
    if PciDevice::iommu_passes_physical(kind.as_deref()) {
        return Check::ok(
            NAME,
            match kind {
                Some(k) => format!("IOMMU group type {k}: device addresses are physical"),
                None => "no IOMMU translation: device addresses are physical".into(),
            },
        );
    }
    Check::bad(
        NAME,
        Status::Fail,
        format!(
            "IOMMU group type {}: the card would see I/O virtual addresses, not the physical \
             ones the driver programs",
            kind.unwrap_or_default()
        ),
        format!(
            "boot with `iommu=pt` (add it to GRUB_CMDLINE_LINUX, then update-grub), or with \
             no driver bound: `echo identity | sudo tee {}/iommu_group/type`",
            dev.dir().display()
        ),
    )
}

fn check_open(cfg: &DoctorConfig, udmabuf_ok: bool) -> Check {
    const NAME: &str = "open";
    let card = crate::card::CardConfig {
        paths: cfg.paths.clone(),
        selector: cfg.selector,
        dma: if udmabuf_ok {
            crate::card::DmaSource::Udmabuf(UdmaBufConfig {
                name: cfg.udmabuf.clone(),
                sync: true,
            })
        } else {
            crate::card::DmaSource::Auto
        },
        compaction: crate::umem::CompactionPolicy::Refuse,
    };
    match crate::backend::pci::open_with("the card", &card) {
        Ok(_) => Check::ok(
            NAME,
            "the driver opens the card: enabled, bus master, BAR0 answers, DMA memory mapped",
        ),
        Err(e) => Check::bad(
            NAME,
            Status::Fail,
            format!("opening it fails with {}: {}", e.errno_name(), e.message),
            "as the message says".into(),
        ),
    }
}

/// Runs every check.
pub fn run(cfg: &DoctorConfig) -> Vec<Check> {
    let mut checks = vec![
        check_privileges(&cfg.paths),
        check_pagemap(&cfg.paths),
        check_hugepages(&cfg.paths, cfg.hugepages),
        check_compaction(&cfg.paths),
    ];
    let hugepages_ok = checks[2].status == Status::Ok;
    checks.push(check_udmabuf(&cfg.paths, &cfg.udmabuf, hugepages_ok));
    let (device, dev) = check_device(cfg);
    checks.push(device);
    match dev {
        Some(dev) => {
            checks.push(check_bar0(&dev));
            checks.push(check_bus_master(&dev));
            checks.push(check_iommu(&dev));
        }
        None => {
            for name in ["bar0", "bus master", "iommu"] {
                checks.push(Check::skip(name, "no PCI device"));
            }
        }
    }
    if failed(&checks) {
        checks.push(Check::skip("open", "fix the failures above first"));
    } else {
        let udmabuf_ok = checks[4].status == Status::Ok;
        checks.push(check_open(cfg, udmabuf_ok));
    }
    checks
}

/// Whether any check failed.
pub fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// The report: one line per check, each warning's and failure's fix below it, a summary.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(out, "{} {:<11} {}", c.status, c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "       fix: {fix}");
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "{} checks: {} ok, {} warnings, {} failed, {} skipped",
        checks.len(),
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    );
    out
}
