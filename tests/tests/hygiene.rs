//! Project hygiene checked as ordinary tests: the shape the design card fixes, the no_std
//! and no-alloc promise of the core, where `unsafe` may live, and that CI runs the README's
//! test command.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files of modules declared as `#[cfg(test)] mod name;`: test doubles that are compiled
/// only into the host unit-test binary (where std is linked), never into the core itself.
fn test_only_files(src: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut test_only = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let Some(name) = pair[1]
                .trim_start_matches("pub(crate) ")
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            if pair[0] != "#[cfg(test)]" {
                continue;
            }
            // `lib.rs` and `mod.rs` own the modules of their folder; `a.rs` those of `a/`.
            let stem = f.file_stem().unwrap();
            let dir = if stem == "lib" || stem == "mod" {
                f.parent().unwrap().to_path_buf()
            } else {
                f.with_extension("")
            };
            test_only.push(dir.join(format!("{name}.rs")));
            test_only.push(dir.join(name).join("mod.rs"));
        }
    }
    test_only
}

#[test]
fn top_level_layout_is_the_design_cards() {
    let root = root();
    for p in [
        "Cargo.toml",
        "core",
        "platform-linux",
        "platform-sim",
        "platform-baremetal",
        "xtask",
        "tests",
        "README.md",
        ".ci/run",
        "docs/TESTING.md",
        "docs/BENCHMARKS.md",
    ] {
        assert!(root.join(p).exists(), "missing top-level `{p}`");
    }
}

#[test]
fn core_is_no_std_and_never_links_alloc() {
    let root = root();
    let lib = fs::read_to_string(root.join("core/src/lib.rs")).unwrap();
    assert!(
        lib.contains("#![no_std]"),
        "core/src/lib.rs must declare #![no_std]"
    );
    let test_only = test_only_files(&root.join("core/src"));
    let mut files = Vec::new();
    rust_files(&root.join("core/src"), &mut files);
    for f in files.iter().filter(|f| !test_only.contains(f)) {
        let text = fs::read_to_string(f).unwrap();
        assert!(
            !text.contains("extern crate alloc") && !text.contains("alloc::"),
            "{} uses alloc; the core must be allocation-free",
            f.display()
        );
    }
}

/// `unsafe` in the core lives only where memory or hardware demand it (and in test doubles
/// that stand in for DMA memory), and every block or impl says why it is sound.
#[test]
fn core_unsafe_is_confined_and_justified() {
    const ALLOWED: [&str; 3] = ["ring/memory.rs", "platform.rs", "ring/mod.rs"];
    let root = root();
    let test_only = test_only_files(&root.join("core/src"));
    let mut files = Vec::new();
    rust_files(&root.join("core/src"), &mut files);
    for f in files {
        let rel = f
            .strip_prefix(root.join("core/src"))
            .unwrap()
            .to_string_lossy()
            .to_string();
        let text = fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let is_block = code.contains("unsafe {") || code.contains("unsafe impl");
            if !is_block {
                continue;
            }
            assert!(
                ALLOWED.iter().any(|a| rel.ends_with(a)) || test_only.contains(&f),
                "core/src/{rel}:{}: unsafe outside the ring-memory and platform modules",
                i + 1
            );
            let justified = lines[..i]
                .iter()
                .rev()
                .take(8)
                .any(|l| l.trim_start().starts_with("// SAFETY:"));
            assert!(
                justified,
                "core/src/{rel}:{}: unsafe without a `// SAFETY:` comment",
                i + 1
            );
        }
    }
}

/// The README's quick start is exactly two commands, and CI runs its test command.
#[test]
fn ci_runs_the_readme_test_command() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("## Quick start")
        .expect("README has a `## Quick start` section");
    let section = &readme[start..];
    let block = section
        .split("```")
        .nth(1)
        .expect("quick start has a code block");
    let commands: Vec<&str> = block
        .lines()
        .skip(1)
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands.len(),
        2,
        "quick start must be exactly two commands: {commands:?}"
    );
    let ci = fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains(commands[1])),
        ".ci/run must call the README's test command `{}`",
        commands[1]
    );
}

/// The core's normal dependencies, as resolved for the soft-core target with the feature sets
/// firmware uses (none, and `defmt`), enable no `std` or `alloc` feature. Proc-macro crates
/// run on the build host, so their subtrees are skipped. Needs `cargo`; skipped without it.
#[test]
fn core_dependencies_need_neither_std_nor_alloc() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for features in [&[][..], &["--features", "defmt"][..]] {
        let output = Command::new(&cargo)
            .current_dir(root())
            .args(["tree", "-p", "bluerdma-core", "-e", "normal", "--locked"])
            .args(["--target", "riscv32imac-unknown-none-elf"])
            .args(["--prefix", "depth", "--format", "{p}|{f}"])
            .args(features)
            .output();
        let output = match output {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED: cannot run `cargo tree` ({e}); dependency features unchecked");
                return;
            }
        };
        let tree = String::from_utf8(output.stdout).unwrap();
        assert!(
            output.status.success(),
            "`cargo tree {features:?}` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let offenders = std_or_alloc_features(&tree);
        assert!(
            offenders.is_empty(),
            "core dependencies (cargo tree {features:?}) enable std/alloc features: {offenders:?}"
        );
    }
}

/// Reads `cargo tree --prefix depth --format '{p}|{f}'` and returns `package: feature` for
/// every feature naming std or alloc outside proc-macro subtrees.
fn std_or_alloc_features(tree: &str) -> Vec<String> {
    let mut offenders = Vec::new();
    let mut skip_below: Option<usize> = None;
    for line in tree.lines() {
        let digits = line.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(depth) = line[..digits].parse::<usize>() else {
            continue;
        };
        if skip_below.is_some_and(|d| depth > d) {
            continue;
        }
        skip_below = None;
        let (package, features) = line[digits..]
            .split_once('|')
            .unwrap_or((&line[digits..], ""));
        if package.contains("(proc-macro)") {
            skip_below = Some(depth);
            continue;
        }
        offenders.extend(
            features
                .split(',')
                .filter(|f| f.contains("std") || f.contains("alloc"))
                .map(|f| format!("{package}: {f}")),
        );
    }
    offenders
}

#[test]
fn dependency_feature_scan_skips_proc_macros_and_finds_std() {
    let tree = "0core v0.1.0|default\n\
                1macros v1 (proc-macro)|\n\
                2syn v2|default,std\n\
                1heapless v0.8.0|\n\
                2byteorder v1|std\n";
    assert_eq!(std_or_alloc_features(tree), ["byteorder v1: std"]);
}
