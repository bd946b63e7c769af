//! The doctor against fake sysfs/procfs/dev trees: a healthy host passes every check; each
//! problem fails (or warns) with the exact command that fixes it; the binary's exit code
//! follows.

mod common;

use std::process::Command;

use bluerdma_linux::doctor::{failed, render, run, Check, DoctorConfig, Status};
use common::fake_sysfs::FakeSystem;
use common::is_root;

const BDF: &str = "0000:3b:00.0";

/// A host with everything in place. The page map is the real one (root sees frames).
fn healthy() -> FakeSystem {
    let sys = FakeSystem::new();
    sys.write("proc/self/status", "Name:\tx\nCapEff:\t000001ffffffffff\n");
    std::os::unix::fs::symlink("/proc/self/pagemap", sys.paths.pagemap()).unwrap();
    sys.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        "64\n",
    );
    sys.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        "64\n",
    );
    sys.sysctl("compact_unevictable_allowed", "0\n");
    sys.udmabuf("udmabuf0", 0x1_2340_0000, 4 << 20);
    sys.pci_device(BDF, 0x1172, 0x0000, 0x0006);
    sys
}

fn config(sys: &FakeSystem) -> DoctorConfig {
    DoctorConfig {
        paths: sys.paths.clone(),
        ..DoctorConfig::default()
    }
}

fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks.iter().find(|c| c.name == name).unwrap()
}

fn fix(c: &Check) -> &str {
    c.fix
        .as_deref()
        .unwrap_or_else(|| panic!("{} has no fix", c.name))
}

#[test]
fn a_healthy_host_passes_every_check() {
    if !is_root() {
        common::skip(format_args!(
            "SKIPPED: the page-map check needs root to see frames"
        ));
        return;
    }
    let sys = healthy();
    let checks = run(&config(&sys));
    let report = render(&checks);
    assert_eq!(checks.len(), 10, "{report}");
    for c in &checks {
        assert_eq!(c.status, Status::Ok, "{report}");
    }
    assert!(
        report.ends_with("10 checks: 10 ok, 0 warnings, 0 failed, 0 skipped\n"),
        "{report}"
    );
    // The last check opens the card as the driver does.
    assert!(check(&checks, "open")
        .detail
        .contains("the driver opens the card"));
    assert!(check(&checks, "bar0")
        .detail
        .contains("65536 bytes at 0xfe000000"));
}

#[test]
fn a_bare_host_gets_a_fix_for_each_failure() {
    let sys = FakeSystem::new();
    sys.write("proc/self/status", "CapEff:\t0000000000000000\n");
    sys.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
        "0\n",
    );
    sys.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        "0\n",
    );
    sys.sysctl("compact_unevictable_allowed", "1\n");
    let checks = run(&config(&sys));
    let report = render(&checks);
    assert!(failed(&checks));
    let p = check(&checks, "privileges");
    assert_eq!(p.status, Status::Fail, "{report}");
    assert!(p.detail.contains("no CAP_SYS_ADMIN"));
    assert!(fix(p).contains("setcap cap_sys_admin,cap_ipc_lock+ep"));
    assert_eq!(check(&checks, "pagemap").status, Status::Fail);
    let h = check(&checks, "hugepages");
    assert_eq!(h.status, Status::Fail);
    assert!(
        fix(h).starts_with("echo 16 | sudo tee ")
            && fix(h).ends_with("/etc/sysctl.d/90-bluerdma.conf)")
            && fix(h).contains("hugepages-2048kB/nr_hugepages"),
        "{report}"
    );
    let c = check(&checks, "compaction");
    assert_eq!(c.status, Status::Warn);
    assert!(fix(c).starts_with("sudo sysctl -w vm.compact_unevictable_allowed=0"));
    let u = check(&checks, "u-dma-buf");
    assert_eq!(
        u.status,
        Status::Fail,
        "no hugepages either: DMA has no source"
    );
    assert!(fix(u).starts_with("sudo modprobe u-dma-buf udmabuf0=4194304"));
    let d = check(&checks, "pci device");
    assert_eq!(d.status, Status::Fail);
    assert!(fix(d).contains("/sys/bus/pci/rescan") && fix(d).contains("lspci -nn -d 1172:"));
    for name in ["bar0", "bus master", "iommu"] {
        assert_eq!(check(&checks, name).status, Status::Skip);
    }
    // Every failure and warning carries a fix line in the report.
    let problems = checks
        .iter()
        .filter(|c| matches!(c.status, Status::Fail | Status::Warn))
        .count();
    assert_eq!(
        report.matches("\n       fix: ").count(),
        problems,
        "{report}"
    );
}

#[test]
fn device_problems_name_their_commands() {
    let sys = healthy();
    let dir = sys.paths.pci_devices().join(BDF);
    std::fs::write(dir.join("enable"), "0\n").unwrap();
    let mut config_space = std::fs::read(dir.join("config")).unwrap();
    config_space[4] = 0x02; // memory on, bus master off
    std::fs::write(dir.join("config"), config_space).unwrap();
    std::fs::create_dir_all(dir.join("iommu_group")).unwrap();
    std::fs::write(dir.join("iommu_group/type"), "DMA-FQ\n").unwrap();
    std::fs::create_dir_all(sys.dir.path().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
    std::os::unix::fs::symlink(
        sys.dir.path().join("sys/bus/pci/drivers/vfio-pci"),
        dir.join("driver"),
    )
    .unwrap();
    let checks = run(&config(&sys));
    let report = render(&checks);
    let d = check(&checks, "pci device");
    assert_eq!(d.status, Status::Warn, "{report}");
    assert!(d.detail.contains("bound to kernel driver vfio-pci"));
    assert!(
        fix(d).starts_with(&format!("echo {BDF} | sudo tee "))
            && fix(d).ends_with("/driver/unbind")
    );
    let b = check(&checks, "bar0");
    assert_eq!(b.status, Status::Fail);
    assert!(b.detail.contains("not enabled"));
    assert!(fix(b).starts_with("echo 1 | sudo tee ") && fix(b).ends_with(&format!("{BDF}/enable")));
    let m = check(&checks, "bus master");
    assert_eq!(m.status, Status::Warn);
    assert_eq!(fix(m), format!("sudo setpci -s {BDF} COMMAND=0x06:0x06"));
    let i = check(&checks, "iommu");
    assert_eq!(i.status, Status::Fail);
    assert!(i.detail.contains("DMA-FQ"));
    assert!(fix(i).contains("iommu=pt") && fix(i).contains("echo identity | sudo tee"));
}

#[test]
fn a_silent_card_and_a_small_udmabuf_are_caught() {
    let sys = healthy();
    let resource0 = sys.paths.pci_devices().join(BDF).join("resource0");
    std::fs::write(&resource0, vec![0xFF; 0x10000]).unwrap();
    // 4 MiB, but 4 KiB below a 2 MiB boundary: after the rings, the only 2 MiB-aligned
    // place for the receive buffer runs past the end.
    sys.udmabuf("udmabuf0", 0x1_235F_F000, 4 << 20);
    let checks = run(&config(&sys));
    let report = render(&checks);
    let b = check(&checks, "bar0");
    assert_eq!(b.status, Status::Fail, "{report}");
    assert!(b.detail.contains("reads all ones"));
    assert!(fix(b).contains("/sys/bus/pci/rescan") && fix(b).contains(&format!("{BDF}/remove")));
    let u = check(&checks, "u-dma-buf");
    assert_eq!(u.status, Status::Warn, "hugepages can stand in: {report}");
    assert!(u.detail.contains("cannot hold the rings"));
    assert!(fix(u).starts_with("sudo rmmod u_dma_buf && sudo modprobe u-dma-buf"));
}

#[test]
fn the_binary_exits_with_the_verdict() {
    let bin = env!("CARGO_BIN_EXE_bluerdma-doctor");
    let bare = FakeSystem::new();
    let out = Command::new(bin)
        .args([
            "--root",
            bare.dir.path().to_str().unwrap(),
            "--hugepages",
            "4",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[FAIL] pci device"), "{text}");
    assert!(text.contains("fix: "), "{text}");
    let out = Command::new(bin)
        .arg("--bdf")
        .arg("nonsense")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a PCI address"));
    if is_root() {
        let ok = healthy();
        let out = Command::new(bin)
            .args(["--root", ok.dir.path().to_str().unwrap(), "--bdf", BDF])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
    }
}

#[test]
fn the_binary_checks_a_device_of_the_list() {
    let bin = env!("CARGO_BIN_EXE_bluerdma-doctor");
    let sys = healthy();
    let list = format!(
        "blue0=127.0.0.1,blue1=127.0.0.2+pci:{BDF};root={}",
        sys.dir.path().display()
    );
    let run = |device: &str| {
        Command::new(bin)
            .args(["--device", device])
            .env("BLUERDMA_DEVICES", &list)
            .output()
            .unwrap()
    };
    let out = run("blue0");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--device blue0: an emulated device, not a +pci one"),
        "{err}"
    );
    let out = run("blue9");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such device"));
    if is_root() {
        let out = run("blue1");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains("[ ok ] open"), "{text}");
    }
}
