//! Links the firmware for the soft-core: the memory map (memory.x), riscv-rt's link.x and
//! defmt's section script. Nothing to do for a host build (the binary is a stub there).

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::write(out.join("memory.x"), include_bytes!("memory.x")).expect("write memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    // memory.x must come before link.x, which uses its region aliases.
    for script in ["-Tmemory.x", "-Tlink.x", "-Tdefmt.x"] {
        println!("cargo:rustc-link-arg-bins={script}");
    }
}
