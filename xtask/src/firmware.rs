//! The firmware checks of `cargo xtask ci` (issue F): build the soft-core firmware for
//! riscv32imac, prove its dependency tree has no `std` and no `alloc`, print its size
//! (text/data/bss, plus the DMA arena and the stack reserve) so that growth is visible, build
//! the core with its defmt logging (host and soft-core), and boot the firmware on QEMU
//! (qemu-system-misc, which .ci/run installs; missing in CI is a failure, elsewhere a skip).
//!
//! Wiring (main.rs): `mod firmware;` and, next to `no_std_build`, in `ci`:
//! `rows.extend(firmware::firmware_checks(root, &logs));`
//!
//! The size comes from the ELF section headers, read here in a few lines, so the check
//! needs neither binutils nor cargo-binutils.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{check, Row, RISCV_TARGET};

/// The firmware's package and binary name.
const FIRMWARE: &str = "bluerdma-firmware";

/// `cargo xtask firmware`: the firmware rows of `ci` alone, as a table.
pub fn run(root: &Path) -> Result<(), String> {
    let logs = root.join("target").join("xtask");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let rows = firmware_checks(root, &logs);
    super::print_table(&rows);
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    match failed {
        0 => Ok(()),
        n => Err(format!(
            "{n} firmware check(s) failed; logs in {}",
            logs.display()
        )),
    }
}

/// Every firmware check: the build with its size, then (if it built for the target) the
/// boot on QEMU.
pub fn firmware_checks(root: &Path, logs: &Path) -> Vec<Row> {
    let build = firmware_build(root, logs);
    let built_for_target = build.failed == 0 && !build.suite.contains("FALLBACK");
    let mut rows = vec![build];
    rows.extend(core_defmt_builds(root, logs, built_for_target));
    if built_for_target {
        rows.push(firmware_boot(root, logs));
    }
    rows
}

/// The core with its `defmt` logging, which the firmware uses (`core-defmt`): for the host
/// (every log argument has a `defmt::Format`) and, when the target is there, for the
/// soft-core.
fn core_defmt_builds(root: &Path, logs: &Path, have_target: bool) -> Vec<Row> {
    let mut rows = vec![check(
        root,
        logs,
        "core with defmt logging",
        "cargo build -p bluerdma-core --features defmt --locked",
    )];
    if have_target {
        rows.push(check(
            root,
            logs,
            "core with defmt for riscv32imac",
            &format!(
                "cargo build -p bluerdma-core --features defmt --target {RISCV_TARGET} --release \
                 --locked"
            ),
        ));
    }
    rows
}

fn firmware_elf(root: &Path) -> PathBuf {
    root.join("target")
        .join(RISCV_TARGET)
        .join("release")
        .join(FIRMWARE)
}

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
        // defmt keeps only errors unless told otherwise; the firmware's progress is info.
        &format!(
            "DEFMT_LOG=info cargo build -p {FIRMWARE} --release --locked --target {RISCV_TARGET}"
        ),
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
    let elf = firmware_elf(root);
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

/// The verdict word of a firmware that found no card: `FAILED | Step::Open`
/// (firmware/src/soft_core.rs and `Step` in platform-baremetal/src/firmware.rs).
const VERDICT_NO_CARD: u32 = 0xBAD0_0001;

/// Boots the firmware on QEMU's `virt` machine (RAM at 0x8000_0000 as in memory.x, nothing
/// behind the NIC's register window) and reads its verdict word through the QEMU monitor.
/// With no card the self-test must fail at open once the command timeout runs out: that
/// proves the image boots (riscv-rt, memory.x, stack), and that the DMA pool, the register
/// writes, the mcycle clock and the engine's timeout path work on a RISC-V core.
pub fn firmware_boot(root: &Path, logs: &Path) -> Row {
    let suite = "firmware boots on QEMU (no card)";
    let start = Instant::now();
    let row = |passed: bool, note: String| Row {
        suite: suite.into(),
        passed: passed as u64,
        failed: !passed as u64,
        time: start.elapsed(),
        note,
    };
    let have_qemu = Command::new("qemu-system-riscv32")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_qemu {
        // .ci/run installs it; in CI its absence is a failure, not a silent skip.
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            let note = "qemu-system-riscv32 missing: apt-get install qemu-system-misc".to_string();
            eprintln!("ci: {suite}: FAILED: {note}");
            return row(false, note);
        }
        println!("ci: {suite}: SKIPPED: qemu-system-riscv32 not installed (qemu-system-misc)");
        return Row {
            passed: 0,
            failed: 0,
            ..row(
                true,
                "skipped: no qemu-system-riscv32 (apt-get install qemu-system-misc)".into(),
            )
        };
    }
    println!("ci: {suite}");
    match boot_on_qemu(&firmware_elf(root), logs) {
        Ok((verdict, waited)) if verdict == VERDICT_NO_CARD => row(
            true,
            format!("verdict {verdict:#x} (open timed out) after {waited:.1?}"),
        ),
        Ok((verdict, _)) => {
            let note = format!("verdict {verdict:#x}, expected {VERDICT_NO_CARD:#x}");
            eprintln!("ci: {suite}: {note}");
            row(false, note)
        }
        Err(e) => {
            eprintln!("ci: {suite}: {e}");
            row(false, e)
        }
    }
}

/// Runs QEMU until the firmware's `SELFTEST_RESULT` is set (60 s at most); returns it and
/// how long it took.
fn boot_on_qemu(elf: &Path, logs: &Path) -> Result<(u32, Duration), String> {
    let image = std::fs::read(elf).map_err(|e| format!("cannot read {}: {e}", elf.display()))?;
    let addr = Elf::new(&image)?.symbol("SELFTEST_RESULT")?;
    let sock = logs.join("qemu-monitor.sock");
    let _ = std::fs::remove_file(&sock);
    let log = std::fs::File::create(logs.join("qemu.log")).map_err(|e| e.to_string())?;
    let mut qemu = Command::new("qemu-system-riscv32")
        .args([
            "-machine", "virt", "-m", "512M", "-display", "none", "-serial", "none",
        ])
        .args(["-bios", "none", "-kernel"])
        .arg(elf)
        .arg("-monitor")
        .arg(format!("unix:{},server,nowait", sock.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start qemu: {e}"))?;
    let start = Instant::now();
    let result = poll_verdict(&sock, addr, start);
    let _ = qemu.kill();
    let _ = qemu.wait();
    let _ = std::fs::remove_file(&sock);
    result.map(|v| (v, start.elapsed()))
}

fn poll_verdict(sock: &Path, addr: u64, start: Instant) -> Result<u32, String> {
    let deadline = start + Duration::from_secs(60);
    let mut monitor = loop {
        match UnixStream::connect(sock) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("no QEMU monitor at {}: {e}", sock.display())),
        }
    };
    monitor
        .set_read_timeout(Some(Duration::from_millis(300)))
        .map_err(|e| e.to_string())?;
    let needle = format!("{addr:x}: 0x");
    while Instant::now() < deadline {
        monitor
            .write_all(format!("xp /1wx {addr:#x}\n").as_bytes())
            .map_err(|e| format!("QEMU monitor: {e}"))?;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = monitor.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&out);
        let value = text
            .rfind(&needle)
            .and_then(|at| text.get(at + needle.len()..at + needle.len() + 8))
            .and_then(|hex| u32::from_str_radix(hex, 16).ok());
        if let Some(v) = value.filter(|&v| v != 0) {
            return Ok(v);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err("no verdict from the firmware within 60 s".into())
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
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;

impl ElfSizes {
    /// Reads the section headers of a little-endian ELF32 or ELF64 file.
    fn parse(b: &[u8]) -> Result<Self, String> {
        let elf = Elf::new(b)?;
        let mut sizes = ElfSizes::default();
        for i in 0..elf.shnum {
            let sh = elf.section(i)?;
            if sh.flags & SHF_ALLOC == 0 {
                continue;
            }
            let name = elf.section_name(sh.name)?;
            let slot = match name.as_str() {
                n if n == ".dma" || n.starts_with(".dma.") => &mut sizes.dma,
                ".stack" | ".heap" => &mut sizes.stack,
                _ if sh.kind == SHT_NOBITS => &mut sizes.bss,
                _ if sh.flags & SHF_WRITE != 0 => &mut sizes.data,
                _ => &mut sizes.text,
            };
            *slot += sh.size;
        }
        Ok(sizes)
    }
}

/// One section header.
struct Section {
    name: u32,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
    link: u32,
}

/// A little-endian ELF32 or ELF64 file, read just enough for sizes and symbol addresses.
struct Elf<'a> {
    b: &'a [u8],
    wide: bool,
    shoff: u64,
    shentsize: u64,
    shnum: u64,
    shstrndx: u64,
}

impl<'a> Elf<'a> {
    fn new(b: &'a [u8]) -> Result<Self, String> {
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
        let mut elf = Elf {
            b,
            wide,
            shoff: 0,
            shentsize: 0,
            shnum: 0,
            shstrndx: 0,
        };
        let at: [usize; 4] = if wide {
            [0x28, 0x3A, 0x3C, 0x3E]
        } else {
            [0x20, 0x2E, 0x30, 0x32]
        };
        elf.shoff = elf.word(at[0])?;
        elf.shentsize = elf.rd(at[1], 2)?;
        elf.shnum = elf.rd(at[2], 2)?;
        elf.shstrndx = elf.rd(at[3], 2)?;
        Ok(elf)
    }

    /// `n` little-endian bytes at `off`.
    fn rd(&self, off: usize, n: usize) -> Result<u64, String> {
        let s = off
            .checked_add(n)
            .and_then(|end| self.b.get(off..end))
            .ok_or_else(|| bad("truncated"))?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(s);
        Ok(u64::from_le_bytes(v))
    }

    /// An address-sized field at `off`.
    fn word(&self, off: usize) -> Result<u64, String> {
        self.rd(off, if self.wide { 8 } else { 4 })
    }

    fn section(&self, i: u64) -> Result<Section, String> {
        let at = i
            .checked_mul(self.shentsize)
            .and_then(|o| o.checked_add(self.shoff))
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(|| bad("section header out of range"))?;
        let w = if self.wide { 8 } else { 4 };
        // name, type, flags, addr, offset, size, link.
        Ok(Section {
            name: self.rd(at, 4)? as u32,
            kind: self.rd(at + 4, 4)? as u32,
            flags: self.word(at + 8)?,
            offset: self.word(at + 8 + 2 * w)?,
            size: self.word(at + 8 + 3 * w)?,
            link: self.rd(at + 8 + 4 * w, 4)? as u32,
        })
    }

    /// The NUL-terminated string at `off` of the string table in section `table`.
    fn string(&self, table: u64, off: u32) -> Result<String, String> {
        let start = self.section(table)?.offset.saturating_add(u64::from(off));
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        self.b
            .get(start..)
            .and_then(|s| s.split(|&c| c == 0).next())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .ok_or_else(|| bad("string out of range"))
    }

    fn section_name(&self, off: u32) -> Result<String, String> {
        self.string(self.shstrndx, off)
    }

    /// The value (address) of the symbol `name`.
    fn symbol(&self, name: &str) -> Result<u64, String> {
        for i in 0..self.shnum {
            let sh = self.section(i)?;
            if sh.kind != SHT_SYMTAB {
                continue;
            }
            let entsize = if self.wide { 24 } else { 16 };
            for k in 0..sh.size / entsize {
                let at = usize::try_from(sh.offset + k * entsize).map_err(|_| bad("symbol"))?;
                let value = if self.wide {
                    self.rd(at + 8, 8)?
                } else {
                    self.rd(at + 4, 4)?
                };
                if self.string(u64::from(sh.link), self.rd(at, 4)? as u32)? == name {
                    return Ok(value);
                }
            }
        }
        Err(format!("no symbol `{name}` in the firmware"))
    }
}

fn bad(what: &str) -> String {
    format!("not a usable ELF file: {what}")
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

    #[test]
    fn symbols_are_found_by_name() {
        // ELF32: null section, .strtab, .symtab (null symbol + two), .shstrtab.
        let strtab = b"\0OTHER\0SELFTEST_RESULT\0";
        let shstr = b"\0.strtab\0.symtab\0.shstrtab\0";
        let sym = |name: u32, value: u32| {
            let mut e = [0u8; 16];
            e[0..4].copy_from_slice(&name.to_le_bytes());
            e[4..8].copy_from_slice(&value.to_le_bytes());
            e
        };
        let mut b = vec![0u8; 52];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 1;
        b[5] = 1;
        let str_at = b.len() as u32;
        b.extend_from_slice(strtab);
        let shstr_at = b.len() as u32;
        b.extend_from_slice(shstr);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        let sym_at = b.len() as u32;
        for e in [sym(0, 0), sym(1, 0x1234), sym(7, 0x8000_f7b0)] {
            b.extend_from_slice(&e);
        }
        let shoff = b.len() as u32;
        b[0x20..0x24].copy_from_slice(&shoff.to_le_bytes());
        b[0x2E..0x30].copy_from_slice(&40u16.to_le_bytes());
        b[0x30..0x32].copy_from_slice(&4u16.to_le_bytes());
        b[0x32..0x34].copy_from_slice(&3u16.to_le_bytes());
        // (name, type, offset, size, link)
        for (name, kind, offset, size, link) in [
            (0u32, 0u32, 0u32, 0u32, 0u32),
            (1, 3, str_at, strtab.len() as u32, 0),
            (9, SHT_SYMTAB, sym_at, 48, 1),
            (17, 3, shstr_at, shstr.len() as u32, 0),
        ] {
            let mut h = [0u8; 40];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[16..20].copy_from_slice(&offset.to_le_bytes());
            h[20..24].copy_from_slice(&size.to_le_bytes());
            h[24..28].copy_from_slice(&link.to_le_bytes());
            b.extend_from_slice(&h);
        }
        let elf = Elf::new(&b).unwrap();
        assert_eq!(elf.symbol("SELFTEST_RESULT"), Ok(0x8000_f7b0));
        assert_eq!(elf.symbol("OTHER"), Ok(0x1234));
        assert!(elf.symbol("MISSING").unwrap_err().contains("MISSING"));
    }
}
