//! Finding the card on the PCI bus through sysfs (`/sys/bus/pci/devices`).
//!
//! The card is found by vendor and device ID (0x1172 / 0x0000 by default, the IDs the
//! reference driver looks for: reference-driver.md 1.5) or named by its address
//! (`0000:01:00.0`). Its BAR0 is the sysfs file `resource0`, which [`crate::bar::Bar0`] maps.
//! Nothing binds a kernel driver to the card, so this module also reads and sets the
//! command register's memory and bus-master bits: without bus mastering every DMA of the
//! card is dropped silently.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::paths::{parse_number, read_trimmed, SystemPaths};

/// A PCI vendor and device ID pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PciId {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
}

impl PciId {
    /// The IDs of the blue-rdma FPGA card (Intel/Altera vendor ID, device 0).
    pub const BLUE_RDMA: PciId = PciId {
        vendor: 0x1172,
        device: 0x0000,
    };
}

impl Default for PciId {
    fn default() -> Self {
        Self::BLUE_RDMA
    }
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:04x}", self.vendor, self.device)
    }
}

impl FromStr for PciId {
    type Err = String;
    /// Parses `vvvv:dddd` (hex, as `lspci -n` prints it).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a PCI ID (expected vvvv:dddd in hex)");
        let (v, d) = s.split_once(':').ok_or_else(bad)?;
        let hex = |t: &str| u16::from_str_radix(t.trim_start_matches("0x"), 16).map_err(|_| bad());
        Ok(PciId {
            vendor: hex(v)?,
            device: hex(d)?,
        })
    }
}

/// A PCI function address (`domain:bus:device.function`, the sysfs directory name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..=31).
    pub device: u8,
    /// Function number (0..=7).
    pub function: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = String;
    /// Parses `dddd:bb:dd.f` or `bb:dd.f` (domain 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("`{s}` is not a PCI address (expected dddd:bb:dd.f, e.g. 0000:01:00.0)");
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let addr = PciAddress {
            domain: u16::from_str_radix(domain, 16).map_err(|_| bad())?,
            bus: u8::from_str_radix(bus, 16).map_err(|_| bad())?,
            device: u8::from_str_radix(device, 16).map_err(|_| bad())?,
            function: u8::from_str_radix(function, 16).map_err(|_| bad())?,
        };
        if addr.device > 31 || addr.function > 7 {
            return Err(bad());
        }
        Ok(addr)
    }
}

/// How to choose the card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PciSelector {
    /// The only device with these IDs.
    Id(PciId),
    /// The device at this address.
    Address(PciAddress),
}

impl Default for PciSelector {
    fn default() -> Self {
        PciSelector::Id(PciId::BLUE_RDMA)
    }
}

/// A BAR as the `resource` file lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarInfo {
    /// Bus address of the first byte.
    pub start: u64,
    /// Length in bytes (0 when the BAR is not implemented).
    pub len: u64,
    /// The kernel's resource flags (`IORESOURCE_*`).
    pub flags: u64,
}

/// The command register's memory-space enable bit.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// The command register's bus-master enable bit (the card may issue DMA).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;

/// Why the card could not be found or examined. The text says what to run.
#[derive(Debug)]
pub enum PciError {
    /// The PCI devices directory cannot be listed.
    NoPciBus {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// No device with the IDs.
    NotFound {
        /// The IDs looked for.
        id: PciId,
        /// Where.
        path: PathBuf,
    },
    /// Nothing at the address.
    NoSuchAddress {
        /// The address.
        address: PciAddress,
        /// Where.
        path: PathBuf,
    },
    /// Several devices have the IDs.
    Ambiguous {
        /// The IDs.
        id: PciId,
        /// Every device that has them.
        found: Vec<PciAddress>,
    },
    /// An attribute file cannot be read or written.
    Attribute {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An attribute file holds something unexpected.
    Malformed {
        /// The file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
}

impl fmt::Display for PciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PciError::NoPciBus { path, source } => {
                write!(
                    f,
                    "cannot list {}: {source} (is sysfs mounted?)",
                    path.display()
                )
            }
            PciError::NotFound { id, path } => write!(
                f,
                "no PCI device {id} in {}: is the card seated and its bitstream loaded? \
                 `lspci -nn -d {:04x}:` lists it; `echo 1 > /sys/bus/pci/rescan` rescans \
                 after loading the bitstream",
                path.display(),
                id.vendor
            ),
            PciError::NoSuchAddress { address, path } => write!(
                f,
                "no PCI device at {address} ({} does not exist); `lspci -D` lists addresses",
                path.display()
            ),
            PciError::Ambiguous { id, found } => {
                write!(f, "{} devices have IDs {id} (", found.len())?;
                for (i, a) in found.iter().enumerate() {
                    write!(f, "{}{a}", if i > 0 { ", " } else { "" })?;
                }
                write!(f, "): choose one by address (--bdf)")
            }
            PciError::Attribute { path, source } => {
                write!(f, "{}: {source}", path.display())?;
                if source.kind() == io::ErrorKind::PermissionDenied {
                    write!(f, " (run as root: `sudo`)")?;
                }
                Ok(())
            }
            PciError::Malformed { path, text } => {
                write!(f, "{}: unexpected content `{text}`", path.display())
            }
        }
    }
}

impl std::error::Error for PciError {}

/// One PCI function, by its sysfs directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDevice {
    address: PciAddress,
    id: PciId,
    dir: PathBuf,
}

fn attribute(path: &Path) -> Result<String, PciError> {
    read_trimmed(path).map_err(|source| PciError::Attribute {
        path: path.to_owned(),
        source,
    })
}

fn id_attribute(dir: &Path, name: &str) -> Result<u16, PciError> {
    let path = dir.join(name);
    let text = attribute(&path)?;
    parse_number(&text)
        .and_then(|v| u16::try_from(v).ok())
        .ok_or(PciError::Malformed { path, text })
}

impl PciDevice {
    /// The device at `address`.
    pub fn at(paths: &SystemPaths, address: PciAddress) -> Result<Self, PciError> {
        let dir = paths.pci_devices().join(address.to_string());
        if !dir.exists() {
            return Err(PciError::NoSuchAddress { address, path: dir });
        }
        Self::from_dir(address, dir)
    }

    fn from_dir(address: PciAddress, dir: PathBuf) -> Result<Self, PciError> {
        let id = PciId {
            vendor: id_attribute(&dir, "vendor")?,
            device: id_attribute(&dir, "device")?,
        };
        Ok(Self { address, id, dir })
    }

    /// Every device with IDs `id`, in address order.
    pub fn find_all(paths: &SystemPaths, id: PciId) -> Result<Vec<Self>, PciError> {
        let root = paths.pci_devices();
        let entries = fs::read_dir(&root).map_err(|source| PciError::NoPciBus {
            path: root.clone(),
            source,
        })?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(address) = name.to_str().and_then(|n| n.parse::<PciAddress>().ok()) else {
                continue;
            };
            // A device that vanishes or has unreadable IDs is not the card.
            if let Ok(dev) = Self::from_dir(address, entry.path()) {
                if dev.id == id {
                    found.push(dev);
                }
            }
        }
        found.sort_by_key(|d| d.address);
        Ok(found)
    }

    /// The card `selector` names: the device at an address, or the only one with the IDs.
    pub fn open(paths: &SystemPaths, selector: PciSelector) -> Result<Self, PciError> {
        match selector {
            PciSelector::Address(a) => Self::at(paths, a),
            PciSelector::Id(id) => {
                let mut all = Self::find_all(paths, id)?;
                match all.len() {
                    0 => Err(PciError::NotFound {
                        id,
                        path: paths.pci_devices(),
                    }),
                    1 => Ok(all.remove(0)),
                    _ => Err(PciError::Ambiguous {
                        id,
                        found: all.iter().map(|d| d.address).collect(),
                    }),
                }
            }
        }
    }

    /// The device's address.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// The device's IDs.
    pub fn id(&self) -> PciId {
        self.id
    }

    /// The device's sysfs directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that maps BAR0 (`resource0`).
    pub fn resource0(&self) -> PathBuf {
        self.dir.join("resource0")
    }

    /// BAR `index` as the `resource` file lists it (one line per resource:
    /// start, end, flags).
    pub fn bar(&self, index: usize) -> Result<BarInfo, PciError> {
        let path = self.dir.join("resource");
        let text = attribute(&path)?;
        let malformed = || PciError::Malformed {
            path: path.clone(),
            text: text.lines().nth(index).unwrap_or("").to_owned(),
        };
        let line = text.lines().nth(index).ok_or_else(malformed)?;
        let mut nums = line.split_whitespace().map(parse_number);
        let (Some(Some(start)), Some(Some(end)), Some(Some(flags))) =
            (nums.next(), nums.next(), nums.next())
        else {
            return Err(malformed());
        };
        let len = if end > start { end - start + 1 } else { 0 };
        Ok(BarInfo { start, len, flags })
    }

    /// Whether the kernel has enabled the device (`enable` reads 1).
    pub fn is_enabled(&self) -> Result<bool, PciError> {
        Ok(attribute(&self.dir.join("enable"))? != "0")
    }

    /// Enables the device (writes 1 to `enable`; needs root).
    pub fn enable(&self) -> Result<(), PciError> {
        let path = self.dir.join("enable");
        fs::write(&path, "1").map_err(|source| PciError::Attribute { path, source })
    }

    /// The PCI command register (config space offset 4).
    pub fn command(&self) -> Result<u16, PciError> {
        let path = self.dir.join("config");
        let file = fs::File::open(&path).map_err(|source| PciError::Attribute {
            path: path.clone(),
            source,
        })?;
        let mut word = [0u8; 2];
        file.read_exact_at(&mut word, 4)
            .map_err(|source| PciError::Attribute { path, source })?;
        Ok(u16::from_le_bytes(word))
    }

    /// Sets the memory-space and bus-master bits of the command register (needs root),
    /// leaving the other bits as they are. Returns the new value.
    pub fn enable_bus_master(&self) -> Result<u16, PciError> {
        let cmd = self.command()? | COMMAND_MEMORY | COMMAND_BUS_MASTER;
        let path = self.dir.join("config");
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|source| PciError::Attribute {
                path: path.clone(),
                source,
            })?;
        file.write_all_at(&cmd.to_le_bytes(), 4)
            .map_err(|source| PciError::Attribute { path, source })?;
        Ok(cmd)
    }

    /// The kernel driver bound to the device, if any.
    pub fn driver(&self) -> Option<String> {
        let link = fs::read_link(self.dir.join("driver")).ok()?;
        Some(link.file_name()?.to_string_lossy().into_owned())
    }

    /// The type of the device's IOMMU group (`identity`, `DMA`, `DMA-FQ`, ...), or `None`
    /// when the device is not behind an IOMMU. Only `identity` (or none) makes device
    /// addresses equal to physical ones, which is what pagemap translation produces.
    pub fn iommu_group_type(&self) -> Option<String> {
        read_trimmed(&self.dir.join("iommu_group/type")).ok()
    }

    /// Whether an IOMMU group with `type` lets the card use physical addresses.
    pub fn iommu_passes_physical(group_type: Option<&str>) -> bool {
        matches!(group_type, None | Some("identity"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_reject_nonsense() {
        let a: PciAddress = "0000:3b:00.1".parse().unwrap();
        assert_eq!(
            a,
            PciAddress {
                domain: 0,
                bus: 0x3b,
                device: 0,
                function: 1
            }
        );
        assert_eq!(a.to_string(), "0000:3b:00.1");
        assert_eq!("3b:00.1".parse::<PciAddress>().unwrap(), a);
        for bad in ["", "3b:00", "0000:3b:20.0", "0000:3b:00.8", "x:y:z.w"] {
            let e = bad.parse::<PciAddress>().unwrap_err();
            assert!(e.contains("not a PCI address"), "{bad}: {e}");
        }
    }

    #[test]
    fn ids_parse_like_lspci_prints_them() {
        assert_eq!("1172:0000".parse::<PciId>().unwrap(), PciId::BLUE_RDMA);
        assert_eq!(PciId::BLUE_RDMA.to_string(), "1172:0000");
        assert!("1172".parse::<PciId>().is_err());
    }

    #[test]
    fn only_identity_iommu_groups_pass_physical_addresses() {
        assert!(PciDevice::iommu_passes_physical(None));
        assert!(PciDevice::iommu_passes_physical(Some("identity")));
        assert!(!PciDevice::iommu_passes_physical(Some("DMA-FQ")));
        assert!(!PciDevice::iommu_passes_physical(Some("DMA")));
    }
}
