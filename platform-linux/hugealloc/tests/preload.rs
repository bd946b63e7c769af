//! The preloaded allocator under a real program: `tests/preload.c`, compiled with `cc` and
//! run with `LD_PRELOAD` pointing at this crate's library, checks that page-aligned and
//! large allocations are 2 MiB hugetlb pages (smaps' KernelPageSize), that small ones are
//! not, and that free, realloc, calloc and malloc_usable_size behave. Hugepages are
//! reserved for it, which needs root (CI runs as root).

use std::path::{Path, PathBuf};
use std::process::Command;

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(name: &str) -> u64 {
    std::fs::read_to_string(format!("{POOL}/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The library, built for this test's profile and target directory (a `cargo test` of
/// the workspace does not always build the cdylib before this test runs).
fn library() -> PathBuf {
    let dir = bluerdma_tests::served::cargo_build(&["-p", "bluerdma-hugealloc"]);
    let lib = dir.join("libbluerdma_hugealloc.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

#[test]
fn page_aligned_and_large_allocations_are_hugepages() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: reserving hugepages needs root (CI runs as root)");
        return;
    }
    let added = 8u64.saturating_sub(read("free_hugepages"));
    if added > 0 {
        std::fs::write(
            format!("{POOL}/nr_hugepages"),
            (read("nr_hugepages") + added).to_string(),
        )
        .unwrap();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bin = dir.join(format!("preload-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload.c");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("a C compiler (apt-get install gcc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin)
        .env("LD_PRELOAD", library())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bin);
    if added > 0 {
        let _ = std::fs::write(
            format!("{POOL}/nr_hugepages"),
            read("nr_hugepages").saturating_sub(added).to_string(),
        );
    }
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}
