//! Project hygiene checked as ordinary tests: the shape the design card fixes, the no_std
//! and no-alloc promise of the core, where `unsafe` may live, and that CI runs the README's
//! test command.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Core files compiled only for the core's own unit tests (declared behind `#[cfg(test)]`):
/// they may use std and unsafe like any test code.
const CORE_TEST_ONLY: [&str; 1] = ["ring/testing.rs"];

fn is_test_only(root: &Path, file: &Path) -> bool {
    let rel = file.strip_prefix(root.join("core/src")).unwrap_or(file);
    let rel = rel.to_string_lossy();
    let Some(name) = CORE_TEST_ONLY.iter().find(|t| rel.ends_with(*t)) else {
        return false;
    };
    // The declaring module must gate it behind cfg(test).
    let stem = Path::new(name)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let parent = file.parent().unwrap().join("mod.rs");
    let decl = fs::read_to_string(parent).unwrap_or_default();
    let gated = decl
        .lines()
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim() == format!("mod {stem};"));
    assert!(gated, "{name} must be declared behind #[cfg(test)]");
    true
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
    let mut files = Vec::new();
    rust_files(&root.join("core/src"), &mut files);
    for f in files.into_iter().filter(|f| !is_test_only(&root, f)) {
        let text = fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("extern crate alloc") && !text.contains("alloc::"),
            "{} uses alloc; the core must be allocation-free",
            f.display()
        );
    }
}

/// `unsafe` in the core lives only where memory or hardware demand it, and every block or
/// impl says why it is sound.
#[test]
fn core_unsafe_is_confined_and_justified() {
    const ALLOWED: [&str; 3] = ["ring/memory.rs", "platform.rs", "ring/mod.rs"];
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("core/src"), &mut files);
    for f in files.into_iter().filter(|f| !is_test_only(&root, f)) {
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
                ALLOWED.iter().any(|a| rel.ends_with(a)),
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
