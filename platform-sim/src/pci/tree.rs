//! The fake sysfs tree of a served PCI card: what the driver's unchanged PCI code finds
//! under `<root>` (`SystemPaths::under(root)` of bluerdma-linux).
//!
//! ```text
//! <root>/sys/bus/pci/devices/<bdf>/{vendor,device,enable,resource,config,resource0}
//! <root>/sys/class/u-dma-buf/udmabuf0/{phys_addr,size}
//! <root>/dev/udmabuf0           the u-dma-buf buffer: a regular file both processes map
//! <root>/proc -> /proc          real page maps: the driver's physical addresses are real
//! <root>/sys/kernel -> /sys/kernel
//! ```
//!
//! `resource0` and `udmabuf0` are regular files mapped shared by the driver and by this
//! process, so both see the same bytes. The u-dma-buf buffer's "physical address" is made
//! up: it must not be the address of any real page, or a DMA meant for the buffer would be
//! taken for one into the driver's memory (and the reverse). [`fake_phys_base`] places it
//! above every range `/proc/iomem` lists as System RAM.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// The card's PCI IDs (the ones the driver looks for by default).
pub const VENDOR: u16 = 0x1172;
/// The card's device ID.
pub const DEVICE: u16 = 0x0000;
/// BAR0's length: the card decodes 16 bits of address.
pub const BAR0_LEN: u64 = 0x1_0000;
/// The u-dma-buf buffer's name.
pub const UDMABUF: &str = "udmabuf0";

/// The files of a built tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeTree {
    /// The root directory.
    pub root: PathBuf,
    /// The PCI function's address.
    pub bdf: String,
    /// The device's sysfs directory.
    pub device_dir: PathBuf,
    /// BAR0's file.
    pub resource0: PathBuf,
    /// The u-dma-buf buffer's file.
    pub udmabuf: PathBuf,
    /// The buffer's made-up physical address.
    pub udmabuf_phys: u64,
    /// The buffer's length.
    pub udmabuf_len: u64,
}

/// The end (exclusive) of the highest System RAM range in the text of `/proc/iomem`;
/// `None` if it lists none or hides the addresses (it shows zeros to non-root readers).
pub fn ram_end(iomem: &str) -> Option<u64> {
    iomem
        .lines()
        .filter(|l| !l.starts_with(' ') && l.contains(": System RAM"))
        .filter_map(|l| {
            let (range, _) = l.split_once(" : ")?;
            let (_, end) = range.split_once('-')?;
            u64::from_str_radix(end.trim(), 16).ok()
        })
        .max()
        .filter(|&end| end > 0)
        .map(|end| end + 1)
}

/// A physical address for the fake u-dma-buf buffer: the first 1 GiB boundary above all
/// System RAM of this machine (from `/proc/iomem`, which needs root to show addresses).
pub fn fake_phys_base() -> io::Result<u64> {
    let text = fs::read_to_string("/proc/iomem")?;
    let end = ram_end(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "/proc/iomem shows no System RAM addresses (they read as 0 without root): \
             pci-serve needs root to place the fake u-dma-buf buffer above all RAM",
        )
    })?;
    const GIB: u64 = 1 << 30;
    Ok(end.div_ceil(GIB) * GIB)
}

fn write(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    fs::write(path, contents)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// A zero-filled file of `len` bytes (replacing any earlier one, which a driver of an
/// earlier run may still map).
fn zero_file(path: &Path, len: u64) -> io::Result<()> {
    let _ = fs::remove_file(path);
    fs::File::create(path)
        .and_then(|f| f.set_len(len))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Builds the tree of a card at `bdf` with a u-dma-buf buffer of `udmabuf_len` bytes at
/// `udmabuf_phys`. An existing tree under `root` is rebuilt.
pub fn build(root: &Path, bdf: &str, udmabuf_phys: u64, udmabuf_len: u64) -> io::Result<FakeTree> {
    let sys = root.join("sys");
    let device_dir = sys.join("bus/pci/devices").join(bdf);
    fs::create_dir_all(&device_dir)?;
    write(&device_dir.join("vendor"), format!("{VENDOR:#06x}\n"))?;
    write(&device_dir.join("device"), format!("{DEVICE:#06x}\n"))?;
    // Disabled, memory decoding and bus mastering off: the driver turns them on.
    write(&device_dir.join("enable"), "0\n")?;
    write(
        &device_dir.join("resource"),
        format!(
            "0x00000000fe000000 0x{:016x} 0x0000000000040200\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
            0xfe00_0000u64 + BAR0_LEN - 1
        ),
    )?;
    let mut config = vec![0u8; 256];
    config[0..2].copy_from_slice(&VENDOR.to_le_bytes());
    config[2..4].copy_from_slice(&DEVICE.to_le_bytes());
    write(&device_dir.join("config"), config)?;
    let resource0 = device_dir.join("resource0");
    zero_file(&resource0, BAR0_LEN)?;
    let class = sys.join("class/u-dma-buf").join(UDMABUF);
    fs::create_dir_all(&class)?;
    write(&class.join("phys_addr"), format!("{udmabuf_phys:#018x}\n"))?;
    write(&class.join("size"), format!("{udmabuf_len}\n"))?;
    let dev = root.join("dev");
    fs::create_dir_all(&dev)?;
    let udmabuf = dev.join(UDMABUF);
    zero_file(&udmabuf, udmabuf_len)?;
    for (link, target) in [
        (root.join("proc"), Path::new("/proc")),
        (sys.join("kernel"), Path::new("/sys/kernel")),
    ] {
        if fs::symlink_metadata(&link).is_err() {
            symlink(target, &link)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", link.display())))?;
        }
    }
    Ok(FakeTree {
        root: root.to_owned(),
        bdf: bdf.into(),
        device_dir,
        resource0,
        udmabuf,
        udmabuf_phys,
        udmabuf_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_buffer_goes_above_the_highest_system_ram() {
        let iomem = "\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
00100000-bfffffff : System RAM
  01000000-01ffffff : Kernel code
c0000000-febfffff : PCI Bus 0000:00
100000000-63fffffff : System RAM
640000000-7fffffffff : PCI Bus 0000:00
";
        assert_eq!(ram_end(iomem), Some(0x6_4000_0000));
        // Non-root readers see zeros.
        assert_eq!(ram_end("00000000-00000000 : System RAM\n"), None);
        assert_eq!(ram_end("00000000-00000fff : Reserved\n"), None);
    }

    #[test]
    fn the_tree_has_what_the_driver_reads() {
        let dir = std::env::temp_dir().join(format!("fake-pci-{}", std::process::id()));
        let t = build(&dir, "0000:3b:00.0", 0x7_0000_0000, 8 << 20).unwrap();
        assert_eq!(fs::metadata(&t.resource0).unwrap().len(), BAR0_LEN);
        assert_eq!(fs::metadata(&t.udmabuf).unwrap().len(), 8 << 20);
        assert_eq!(
            fs::read_to_string(dir.join("sys/class/u-dma-buf/udmabuf0/phys_addr")).unwrap(),
            "0x0000000700000000\n"
        );
        assert!(dir.join("proc/self/pagemap").exists());
        // Rebuilding over an existing tree works.
        build(&dir, "0000:3b:00.0", 0x7_0000_0000, 8 << 20).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
