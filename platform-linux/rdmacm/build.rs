//! Derives the exported ABI from the librdmacm installed on the build machine, and links
//! the library against the installed libibverbs.
//!
//! Programs built against the distribution's librdmacm import its symbols by version node
//! (`rdma_connect@RDMACM_1.0`, `rdma_establish@RDMACM_1.2`) and bind them all at load time.
//! This script reads the installed library's dynamic symbol table (`objdump -T`, `objdump
//! -p`) and generates:
//! - `rdmacm.map`: the version nodes with the installed inheritance chain;
//! - `symver.s`: one `.symver cm_<name>, <name>@@<node>` per installed symbol;
//! - `stubs.rs`: `cm_<name>` for every installed symbol the sources do not implement (the
//!   rsocket calls, multicast, ECE); each logs once that it is not supported and fails with
//!   -1 and errno ENOSYS.
//!
//! The sources implement a symbol by defining `fn cm_<name>`. Without a readable installed
//! librdmacm, the snapshot `abi/rdma-core-44.txt` (Debian 12) is used, with a warning.
//! Override the library paths with `BLUERDMA_SYSTEM_RDMACM` and `BLUERDMA_SYSTEM_IBVERBS`.
//!
//! The verbs are called through the C ABI, as the real librdmacm does: the library is
//! linked against the installed `libibverbs.so.1` (its symbols and version nodes; at run
//! time the blue-rdma stand-in of the same name is found first on `LD_LIBRARY_PATH`);
//! without an installed one the references stay unbound until the program, which links
//! libibverbs itself, loads (a warning says so).
//! This file follows platform-linux/ibverbs/build.rs (same objdump parsing); the two are
//! kept separate so that each crate builds on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/riscv64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
];

/// The ABI text: `node NAME [PARENT]` and `sym NAME NODE` lines.
struct Installed {
    nodes: Vec<(String, Option<String>)>,
    symbols: BTreeMap<String, String>,
}

/// The installed library: `env` when set (a path that does not exist means "none"), else
/// the first of the distribution's library directories that has `file`.
fn find_lib(env: &str, file: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={env}");
    match std::env::var_os(env) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.exists()),
        None => LIB_DIRS
            .iter()
            .map(|d| Path::new(d).join(file))
            .find(|p| p.exists()),
    }
}

fn objdump(args: &[&str], lib: &Path) -> Option<String> {
    let out = Command::new("objdump").args(args).arg(lib).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The installed library's ABI in the text form of `abi/rdma-core-44.txt`.
fn describe_installed(lib: &Path) -> Option<String> {
    let headers = objdump(&["-p"], lib)?;
    let mut text = String::new();
    let mut nodes = BTreeSet::new();
    let mut pending: Option<String> = None;
    let defs = headers
        .lines()
        .skip_while(|l| !l.starts_with("Version definitions:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Version References"));
    for line in defs {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with(char::is_whitespace) {
            // The parent of the node on the line before.
            if let (Some(node), Some(parent)) = (pending.take(), fields.first()) {
                writeln!(text, "node {node} {parent}").unwrap();
            }
        } else if fields.len() >= 4 && fields[1] != "0x01" {
            // `index flags hash name`; flags 0x01 is the file's own base definition.
            if let Some(node) = pending.replace(fields[3].to_string()) {
                writeln!(text, "node {node}").unwrap();
            }
            nodes.insert(fields[3].to_string());
        }
    }
    if let Some(node) = pending {
        writeln!(text, "node {node}").unwrap();
    }
    for line in objdump(&["-T"], lib)?.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // `addr g DF .text size VERSION name`.
        if f.len() < 7 || f[1] != "g" || f[3] == "*UND*" || f[3] == "*ABS*" {
            continue;
        }
        let (version, name) = (f[f.len() - 2], f[f.len() - 1]);
        if nodes.contains(version) {
            writeln!(text, "sym {name} {version}").unwrap();
        }
    }
    Some(text)
}

fn parse(text: &str) -> Option<Installed> {
    let mut inst = Installed {
        nodes: Vec::new(),
        symbols: BTreeMap::new(),
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["node", n] => inst.nodes.push((n.to_string(), None)),
            ["node", n, p] => inst.nodes.push((n.to_string(), Some(p.to_string()))),
            ["sym", s, n] => {
                inst.symbols.insert(s.to_string(), n.to_string());
            }
            _ => {}
        }
    }
    (!inst.nodes.is_empty() && !inst.symbols.is_empty()).then_some(inst)
}

/// The `cm_<name>` functions the sources define.
fn implemented(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(src).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "rs") {
            println!("cargo:rerun-if-changed={}", p.display());
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for piece in text.split("extern \"C\" fn cm_").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed=build.rs");
    let ours = implemented(&manifest.join("src"));

    let rdmacm = find_lib("BLUERDMA_SYSTEM_RDMACM", "librdmacm.so.1");
    let fallback = manifest.join("abi/rdma-core-44.txt");
    println!("cargo:rerun-if-changed={}", fallback.display());
    let described = rdmacm.as_deref().and_then(|lib| {
        println!("cargo:rerun-if-changed={}", lib.display());
        describe_installed(lib)
    });
    if described.is_none() {
        println!(
            "cargo:warning=no installed librdmacm.so.1 could be read (install librdmacm1 and \
             binutils, or set BLUERDMA_SYSTEM_RDMACM): using the rdma-core 44 snapshot in {}",
            fallback.display()
        );
    }
    let text = described
        .or_else(|| std::fs::read_to_string(&fallback).ok())
        .expect("abi/rdma-core-44.txt is part of the crate");
    let inst = parse(&text).expect("the ABI description lists nodes and symbols");

    let mut map = String::new();
    let mut symver = String::new();
    let mut stubs = String::from("// Generated by build.rs from the installed librdmacm.\n");
    for (node, parent) in &inst.nodes {
        match parent {
            Some(p) => writeln!(map, "{node} {{ }} {p};").unwrap(),
            None => writeln!(map, "{node} {{ }};").unwrap(),
        }
    }
    for (name, node) in &inst.symbols {
        writeln!(symver, ".symver cm_{name}, {name}@@{node}").unwrap();
        if !ours.contains(name) {
            writeln!(stubs, "crate::stubs::stub!(cm_{name}, \"{name}\");").unwrap();
        }
    }
    let extra: Vec<&String> = ours
        .iter()
        .filter(|n| !inst.symbols.contains_key(*n))
        .collect();
    assert!(
        extra.is_empty(),
        "the sources define cm_ functions the installed librdmacm does not export: {extra:?}"
    );
    std::fs::write(out.join("rdmacm.map"), map).expect("OUT_DIR is writable");
    std::fs::write(out.join("symver.s"), symver).expect("OUT_DIR is writable");
    std::fs::write(out.join("stubs.rs"), stubs).expect("OUT_DIR is writable");

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.join("rdmacm.map").display()
    );
    match find_lib("BLUERDMA_SYSTEM_IBVERBS", "libibverbs.so.1") {
        Some(verbs) => {
            println!("cargo:rerun-if-changed={}", verbs.display());
            println!("cargo:rustc-cdylib-link-arg={}", verbs.display());
        }
        // Every librdmacm program links libibverbs itself (the rdma_cma.h API is made of
        // verbs objects), so the verbs still resolve when the program loads; only the
        // version nodes of the references are lost.
        None => println!(
            "cargo:warning=no installed libibverbs.so.1 to link against (install \
             libibverbs-dev, or set BLUERDMA_SYSTEM_IBVERBS): librdmacm.so takes the verbs \
             from the libibverbs its program loads"
        ),
    }
}
