//! The firmware check of `cargo xtask ci` (issue F): build the soft-core firmware for
//! riscv32imac, prove its dependency tree has no `std` and no `alloc`, and print its size
//! (text/data/bss, plus the DMA arena and the stack reserve) so that growth is visible.
//!
//! Wiring (main.rs): `mod firmware;` and, next to `no_std_build`, in `ci`:
//! `rows.push(firmware::firmware_build(root, &logs));`
//!
//! The size comes from the ELF section headers, read here in a few lines, so the check
//! needs neither binutils nor cargo-binutils.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::{check, Row, RISCV_TARGET};

/// The firmware's package and binary name.
const FIRMWARE: &str = "bluerdma-firmware";

/// Builds the firmware for the soft-core (or, loudly, falls back to a host build when the
/// target is missing) and reports its size in the row's note.
pub fn firmware_build(root: &Path, logs: &Path) -> Row {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(RISCV_TARGET))
        .unwrap_or(false);
    if !installed {
        let banner = "!".repeat(78);
        eprintln!("{banner}");
        eprintln!("!! WARNING: the {RISCV_TARGET} target is not installed.");
        eprintln!("!! The firmware check falls back to a HOST build of bluerdma-baremetal and the");
        eprintln!("!! firmware stub; it does NOT prove that the firmware links for the soft-core,");
        eprintln!("!! and no size is reported. Fix: rustup target add {RISCV_TARGET}");
        eprintln!("{banner}");
        let mut row = check(
            root,
            logs,
            "firmware (HOST FALLBACK)",
            &format!("cargo build -p bluerdma-baremetal -p {FIRMWARE} --release --locked"),
        );
        row.note = format!("FALLBACK: {RISCV_TARGET} unavailable, no size");
        return row;
    }

    let mut row = check(
        root,
        logs,
        "firmware for riscv32imac",
        &format!("cargo build -p {FIRMWARE} --release --locked --target {RISCV_TARGET}"),
    );
    if row.failed > 0 {
        return row;
    }
    let start = Instant::now();
    if let Err(e) = no_std_tree(root) {
        eprintln!("ci: firmware: {e}");
        return Row {
            passed: 0,
            failed: 1,
            time: row.time + start.elapsed(),
            note: e,
            ..row
        };
    }
    let elf = root
        .join("target")
        .join(RISCV_TARGET)
        .join("release")
        .join(FIRMWARE);
    match std::fs::read(&elf)
        .map_err(|e| format!("cannot read {}: {e}", elf.display()))
        .and_then(|bytes| ElfSizes::parse(&bytes))
    {
        Ok(s) => {
            println!(
                "ci: firmware size: text {} data {} bss {} (reserved: DMA arena {}, stack {})",
                s.text, s.data, s.bss, s.dma, s.stack
            );
            row.note = format!(
                "text {} data {} bss {} B; +{} KiB DMA arena",
                s.text,
                s.data,
                s.bss,
                s.dma / 1024
            );
        }
        Err(e) => {
            eprintln!("ci: firmware: {e}");
            row.passed = 0;
            row.failed = 1;
            row.note = e;
        }
    }
    row
}

/// Fails if anything in the firmware's target dependency tree enables `std` or `alloc`
/// (proc-macros run on the build host and are left out).
fn no_std_tree(root: &Path) -> Result<(), String> {
    let out = Command::new("cargo")
        .args(["tree", "-p", FIRMWARE, "--target", RISCV_TARGET, "--locked"])
        .args(["-e", "normal,features,no-proc-macro", "--prefix", "none"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    match offending_line(&tree) {
        Some(line) => Err(format!("std or alloc in the firmware's tree: `{line}`")),
        None => Ok(()),
    }
}

/// The first `cargo tree` line that enables a `std` or `alloc` feature or names such a crate.
fn offending_line(tree: &str) -> Option<&str> {
    tree.lines().map(str::trim).find(|l| {
        let crate_name = l.split_whitespace().next().unwrap_or("");
        l.contains("feature \"std\"")
            || l.contains("feature \"alloc\"")
            || ["std", "alloc"].contains(&crate_name)
    })
}

/// Section sizes of an ELF image, Berkeley-style (`size`), with the firmware's reserved
/// regions counted apart so that the DMA arena does not drown the code.
#[derive(Debug, Default, PartialEq, Eq)]
struct ElfSizes {
    /// Allocated, read-only or executable: code, read-only data, init and unwind tables.
    text: u64,
    /// Allocated, writable, with contents (initial values in the image).
    data: u64,
    /// Allocated, writable, no contents (zeroed at start), minus the reserved regions.
    bss: u64,
    /// The `.dma` arena (memory.x).
    dma: u64,
    /// The `.stack` and `.heap` reserves (riscv-rt).
    stack: u64,
}

const SHF_WRITE: u64 = 1;
const SHF_ALLOC: u64 = 2;
const SHT_NOBITS: u32 = 8;

impl ElfSizes {
    /// Reads the section headers of a little-endian ELF32 or ELF64 file.
    fn parse(b: &[u8]) -> Result<Self, String> {
        let bad = |what: &str| format!("not a usable ELF file: {what}");
        if b.get(..4) != Some(b"\x7fELF".as_slice()) {
            return Err(bad("no ELF magic"));
        }
        if b.get(5) != Some(&1) {
            return Err(bad("not little-endian"));
        }
        let wide = match b.get(4) {
            Some(1) => false,
            Some(2) => true,
            _ => return Err(bad("unknown class")),
        };
        let rd = |off: usize, n: usize| -> Result<u64, String> {
            let s = off
                .checked_add(n)
                .and_then(|end| b.get(off..end))
                .ok_or_else(|| bad("truncated header"))?;
            let mut v = [0u8; 8];
            v[..n].copy_from_slice(s);
            Ok(u64::from_le_bytes(v))
        };
        let word = if wide { 8 } else { 4 };
        let (shoff, shentsize, shnum, shstrndx) = if wide {
            (rd(0x28, 8)?, rd(0x3A, 2)?, rd(0x3C, 2)?, rd(0x3E, 2)?)
        } else {
            (rd(0x20, 4)?, rd(0x2E, 2)?, rd(0x30, 2)?, rd(0x32, 2)?)
        };
        let header = |i: u64| -> Result<(u32, u32, u64, u64, u64), String> {
            let at = i
                .checked_mul(shentsize)
                .and_then(|o| o.checked_add(shoff))
                .and_then(|a| usize::try_from(a).ok())
                .ok_or_else(|| bad("section header out of range"))?;
            let name = rd(at, 4)? as u32;
            let kind = rd(at + 4, 4)? as u32;
            let flags = rd(at + 8, word)?;
            // sh_addr then sh_offset, then sh_size.
            let offset = rd(at + 8 + 2 * word, word)?;
            let size = rd(at + 8 + 3 * word, word)?;
            Ok((name, kind, flags, offset, size))
        };
        let (_, _, _, strtab, _) = header(shstrndx)?;
        let name_of = |off: u32| -> String {
            let start =
                usize::try_from(strtab.saturating_add(u64::from(off))).unwrap_or(usize::MAX);
            b.get(start..)
                .and_then(|s| s.split(|&c| c == 0).next())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default()
        };
        let mut sizes = ElfSizes::default();
        for i in 0..shnum {
            let (name, kind, flags, _, size) = header(i)?;
            if flags & SHF_ALLOC == 0 {
                continue;
            }
            let name = name_of(name);
            let slot = match name.as_str() {
                n if n == ".dma" || n.starts_with(".dma.") => &mut sizes.dma,
                ".stack" | ".heap" => &mut sizes.stack,
                _ if kind == SHT_NOBITS => &mut sizes.bss,
                _ if flags & SHF_WRITE != 0 => &mut sizes.data,
                _ => &mut sizes.text,
            };
            *slot += size;
        }
        Ok(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian ELF32 with the given (name, type, flags, size) sections after a null
    /// section, and a section-name table last.
    fn elf32(sections: &[(&str, u32, u64, u32)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_offs = Vec::new();
        for (n, ..) in sections {
            name_offs.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shstr_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let mut b = vec![0u8; 52];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 1; // ELF32
        b[5] = 1; // little-endian
        let names_at = b.len() as u32;
        b.extend_from_slice(&names);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        let shoff = b.len() as u32;
        let shnum = sections.len() as u16 + 2;
        b[0x20..0x24].copy_from_slice(&shoff.to_le_bytes());
        b[0x2E..0x30].copy_from_slice(&40u16.to_le_bytes());
        b[0x30..0x32].copy_from_slice(&shnum.to_le_bytes());
        b[0x32..0x34].copy_from_slice(&(shnum - 1).to_le_bytes());
        let mut sh = |name: u32, kind: u32, flags: u32, offset: u32, size: u32| {
            let mut h = [0u8; 40];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[8..12].copy_from_slice(&flags.to_le_bytes());
            h[16..20].copy_from_slice(&offset.to_le_bytes());
            h[20..24].copy_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&h);
        };
        sh(0, 0, 0, 0, 0);
        for ((_, kind, flags, size), name) in sections.iter().zip(&name_offs) {
            sh(*name, *kind, *flags as u32, 0, *size);
        }
        sh(shstr_name, 3, 0, names_at, names.len() as u32);
        b
    }

    #[test]
    fn sections_are_counted_like_size_with_reserved_regions_apart() {
        const PROGBITS: u32 = 1;
        let exec = SHF_ALLOC | 4;
        let image = elf32(&[
            (".text", PROGBITS, exec, 57_160),
            (".rodata", PROGBITS, SHF_ALLOC, 5_576),
            (".data", PROGBITS, SHF_ALLOC | SHF_WRITE, 16),
            (".bss", SHT_NOBITS, SHF_ALLOC | SHF_WRITE, 4_128),
            (".dma", SHT_NOBITS, SHF_ALLOC | SHF_WRITE, 4 << 20),
            (".stack", SHT_NOBITS, SHF_ALLOC | SHF_WRITE, 456_896),
            (".debug_info", PROGBITS, 0, 293_437),
        ]);
        assert_eq!(
            ElfSizes::parse(&image).unwrap(),
            ElfSizes {
                text: 57_160 + 5_576,
                data: 16,
                bss: 4_128,
                dma: 4 << 20,
                stack: 456_896,
            }
        );
    }

    #[test]
    fn broken_files_are_errors_not_panics() {
        assert!(ElfSizes::parse(b"").is_err());
        assert!(ElfSizes::parse(b"\x7fELF\x01\x01").is_err());
        let mut image = elf32(&[(".text", 1, SHF_ALLOC, 10)]);
        image.truncate(image.len() - 20);
        assert!(ElfSizes::parse(&image).is_err());
    }

    #[test]
    fn std_or_alloc_anywhere_in_the_tree_is_found() {
        let clean = "bluerdma-firmware v0.1.0\nheapless feature \"default\"\nspin v0.12.3\n";
        assert_eq!(offending_line(clean), None);
        let dirty = "spin v0.12.3\nserde feature \"std\"\n";
        assert_eq!(offending_line(dirty), Some("serde feature \"std\""));
        assert!(offending_line("heapless feature \"alloc\"").is_some());
        // A crate whose name merely contains the word is fine.
        assert_eq!(offending_line("stable_deref_trait v1.2.1"), None);
    }
}
