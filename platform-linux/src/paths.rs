//! Where the kernel's interfaces live: `/sys`, `/proc` and `/dev`.
//!
//! Everything in this crate that reads sysfs, procfs or a device node takes its paths from a
//! [`SystemPaths`], so tests can point it at a directory tree they built (a fake PCI device,
//! a fake u-dma-buf) and at regular files standing in for `resource0` or `pagemap`.

use std::path::{Path, PathBuf};

/// The roots of the kernel's file interfaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemPaths {
    /// sysfs, normally `/sys`.
    pub sys: PathBuf,
    /// procfs, normally `/proc`.
    pub proc: PathBuf,
    /// Device nodes, normally `/dev`.
    pub dev: PathBuf,
}

impl Default for SystemPaths {
    fn default() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            proc: PathBuf::from("/proc"),
            dev: PathBuf::from("/dev"),
        }
    }
}

impl SystemPaths {
    /// All three roots under one directory (`<root>/sys`, `<root>/proc`, `<root>/dev`).
    pub fn under(root: &Path) -> Self {
        Self {
            sys: root.join("sys"),
            proc: root.join("proc"),
            dev: root.join("dev"),
        }
    }

    /// The PCI devices directory (`/sys/bus/pci/devices`).
    pub fn pci_devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }

    /// A `vm.*` sysctl file (`/proc/sys/vm/<name>`).
    pub fn vm_sysctl(&self, name: &str) -> PathBuf {
        self.proc.join("sys/vm").join(name)
    }

    /// This process's page map (`/proc/self/pagemap`).
    pub fn pagemap(&self) -> PathBuf {
        self.proc.join("self/pagemap")
    }

    /// This process's memory map (`/proc/self/maps`).
    pub fn maps(&self) -> PathBuf {
        self.proc.join("self/maps")
    }

    /// This process's mount table (`/proc/self/mounts`).
    pub fn mounts(&self) -> PathBuf {
        self.proc.join("self/mounts")
    }

    /// This process's status (`/proc/self/status`, for the capability sets).
    pub fn status(&self) -> PathBuf {
        self.proc.join("self/status")
    }

    /// The sysfs directory of the pool of hugepages of `kib` KiB.
    pub fn hugepages(&self, kib: u64) -> PathBuf {
        self.sys
            .join(format!("kernel/mm/hugepages/hugepages-{kib}kB"))
    }

    /// The sysfs class directory of the u-dma-buf driver.
    pub fn udmabuf_class(&self) -> PathBuf {
        self.sys.join("class/u-dma-buf")
    }
}

/// Reads a small text file and trims it.
pub(crate) fn read_trimmed(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

/// Parses a number written in decimal or with a `0x` prefix in hex.
pub(crate) fn parse_number(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_in_both_bases() {
        assert_eq!(parse_number("0x1172\n"), Some(0x1172));
        assert_eq!(parse_number(" 4194304 "), Some(4 << 20));
        assert_eq!(parse_number("0xzz"), None);
        assert_eq!(parse_number(""), None);
    }

    #[test]
    fn paths_hang_off_their_roots() {
        let p = SystemPaths::under(Path::new("/tmp/x"));
        assert_eq!(p.pci_devices(), Path::new("/tmp/x/sys/bus/pci/devices"));
        assert_eq!(
            p.vm_sysctl("nr_hugepages"),
            Path::new("/tmp/x/proc/sys/vm/nr_hugepages")
        );
        assert_eq!(
            p.hugepages(2048),
            Path::new("/tmp/x/sys/kernel/mm/hugepages/hugepages-2048kB")
        );
    }
}
