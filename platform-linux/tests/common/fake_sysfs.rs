//! A fake sysfs/procfs/dev tree: PCI devices with their attribute files, a u-dma-buf
//! buffer backed by a regular file, and vm sysctls.
#![allow(dead_code)]

use std::fs;
use std::path::Path;

use bluerdma_linux::paths::SystemPaths;

pub struct FakeSystem {
    pub dir: tempfile::TempDir,
    pub paths: SystemPaths,
}

impl FakeSystem {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let paths = SystemPaths::under(dir.path());
        fs::create_dir_all(paths.pci_devices()).unwrap();
        fs::create_dir_all(paths.proc.join("sys/vm")).unwrap();
        fs::create_dir_all(paths.proc.join("self")).unwrap();
        fs::create_dir_all(&paths.dev).unwrap();
        Self { dir, paths }
    }

    /// A PCI function with IDs, a 64 KiB BAR0 (file `resource0`), `enable`, `resource`
    /// and a 256-byte config space whose command register is `command`.
    pub fn pci_device(
        &self,
        bdf: &str,
        vendor: u16,
        device: u16,
        command: u16,
    ) -> std::path::PathBuf {
        let d = self.paths.pci_devices().join(bdf);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("vendor"), format!("{vendor:#06x}\n")).unwrap();
        fs::write(d.join("device"), format!("{device:#06x}\n")).unwrap();
        fs::write(d.join("enable"), "1\n").unwrap();
        fs::write(
            d.join("resource"),
            "0x00000000fe000000 0x00000000fe00ffff 0x0000000000040200\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        )
        .unwrap();
        let mut config = vec![0u8; 256];
        config[0..2].copy_from_slice(&vendor.to_le_bytes());
        config[2..4].copy_from_slice(&device.to_le_bytes());
        config[4..6].copy_from_slice(&command.to_le_bytes());
        fs::write(d.join("config"), config).unwrap();
        fs::File::create(d.join("resource0"))
            .unwrap()
            .set_len(0x10000)
            .unwrap();
        d
    }

    /// A u-dma-buf buffer `name` of `size` bytes at `phys`, backed by a regular file.
    pub fn udmabuf(&self, name: &str, phys: u64, size: u64) {
        let class = self.paths.udmabuf_class().join(name);
        fs::create_dir_all(&class).unwrap();
        fs::write(class.join("phys_addr"), format!("{phys:#018x}\n")).unwrap();
        fs::write(class.join("size"), format!("{size}\n")).unwrap();
        fs::File::create(self.paths.dev.join(name))
            .unwrap()
            .set_len(size)
            .unwrap();
    }

    pub fn sysctl(&self, name: &str, value: &str) {
        fs::write(self.paths.vm_sysctl(name), value).unwrap();
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        fs::create_dir_all(p.parent().unwrap_or(Path::new("/"))).unwrap();
        fs::write(p, text).unwrap();
    }
}
