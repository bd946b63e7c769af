//! Derives the exported ABI from the libibverbs installed on the build machine.
//!
//! Programs and provider libraries built against the distribution's libibverbs import
//! symbols by version node (`ibv_get_device_list@IBVERBS_1.1`, the provider ABI
//! `IBVERBS_PRIVATE_<n>` whose number changes between rdma-core releases). The stand-in
//! must define the same nodes and every symbol those binaries may bind at load time (they
//! are all BIND_NOW). So this script reads the installed library's dynamic symbol table
//! (`objdump -T`, `objdump -p`) and generates:
//! - `ibverbs.map`: the version nodes with the installed inheritance chain;
//! - `symver.s`: one `.symver bv_<name>, <name>@@<node>` per installed symbol, so each
//!   symbol is exported at exactly its installed version;
//! - `stubs.rs`: `bv_<name>` for every installed symbol the sources do not implement; each
//!   logs that it is not supported and fails (NULL, or EOPNOTSUPP).
//!
//! The sources implement a symbol by defining `fn bv_<name>`. Without a readable installed
//! libibverbs, the snapshot `abi/rdma-core-44.txt` (Debian 12) is used, with a warning.
//! Override the library path with `BLUERDMA_SYSTEM_IBVERBS`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
    "/usr/lib/aarch64-linux-gnu/libibverbs.so.1",
    "/usr/lib/riscv64-linux-gnu/libibverbs.so.1",
    "/usr/lib64/libibverbs.so.1",
    "/usr/lib/libibverbs.so.1",
];

/// Stubs that return a pointer (NULL on failure); every other stub returns EOPNOTSUPP as
/// an int (a void function's caller ignores it).
const POINTER_STUBS: &[&str] = &[
    "_verbs_init_and_alloc_context",
    "verbs_open_device",
    "ibv_import_device",
    "ibv_import_pd",
    "ibv_import_mr",
    "ibv_import_dm",
    "ibv_reg_dmabuf_mr",
    "ibv_create_ah",
    "ibv_create_ah_from_wc",
];

struct Installed {
    /// Node name -> parent node, in definition order.
    nodes: Vec<(String, Option<String>)>,
    /// Symbol -> default version node.
    symbols: BTreeMap<String, String>,
}

fn objdump(args: &[&str], lib: &Path) -> Option<String> {
    let out = Command::new("objdump").args(args).arg(lib).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The installed library's ABI in the text form of `abi/rdma-core-44.txt`:
/// `node NAME [PARENT]` and `sym NAME NODE` lines.
fn describe_installed(lib: &Path) -> Option<String> {
    let headers = objdump(&["-p"], lib)?;
    let mut text = String::new();
    let mut nodes = BTreeSet::new();
    let mut in_defs = false;
    let mut pending: Option<String> = None;
    for line in headers.lines() {
        if line.starts_with("Version definitions:") {
            in_defs = true;
            continue;
        }
        if !in_defs {
            continue;
        }
        if line.trim().is_empty() || line.starts_with("Version References") {
            break;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with(char::is_whitespace) {
            // The parent of the node on the line before.
            if let (Some(node), Some(parent)) = (pending.take(), fields.first()) {
                writeln!(text, "node {node} {parent}").unwrap();
            }
        } else if fields.len() >= 4 && fields[1] != "0x01" {
            // `index flags hash name`; flags 0x01 is the file's own base definition.
            if let Some(node) = pending.take() {
                writeln!(text, "node {node}").unwrap();
            }
            nodes.insert(fields[3].to_string());
            pending = Some(fields[3].to_string());
        }
    }
    if let Some(node) = pending {
        writeln!(text, "node {node}").unwrap();
    }
    let table = objdump(&["-T"], lib)?;
    for line in table.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // `addr g DF .text size VERSION name`; hidden compat versions are `(VERSION)`.
        if f.len() < 7 || f[1] != "g" || f[3] == "*UND*" || f[3] == "*ABS*" {
            continue;
        }
        let (version, name) = (f[f.len() - 2], f[f.len() - 1]);
        if nodes.contains(version) && !nodes.contains(name) {
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
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
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

fn implemented(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                println!("cargo:rerun-if-changed={}", p.display());
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for piece in text.split("fn bv_").skip(1) {
                    let name: String = piece
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        names.insert(name);
                    }
                }
            }
        }
    }
    names
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-env-changed=BLUERDMA_SYSTEM_IBVERBS");
    println!("cargo:rerun-if-changed=build.rs");
    let ours = implemented(&manifest.join("src"));

    let lib = std::env::var_os("BLUERDMA_SYSTEM_IBVERBS")
        .map(PathBuf::from)
        .or_else(|| CANDIDATES.iter().map(PathBuf::from).find(|p| p.exists()));
    if let Some(lib) = &lib {
        println!("cargo:rerun-if-changed={}", lib.display());
    }
    let fallback = manifest.join("abi/rdma-core-44.txt");
    println!("cargo:rerun-if-changed={}", fallback.display());
    let described = lib.as_deref().and_then(describe_installed);
    if described.is_none() {
        println!(
            "cargo:warning=no installed libibverbs.so.1 could be read (install libibverbs1 and \
             binutils, or set BLUERDMA_SYSTEM_IBVERBS): using the rdma-core 44 snapshot in {}",
            fallback.display()
        );
    }
    let text = described
        .or_else(|| std::fs::read_to_string(&fallback).ok())
        .expect("abi/rdma-core-44.txt is part of the crate");
    let inst = parse(&text).expect("the ABI description lists nodes and symbols");

    let mut map = String::new();
    let mut symver = String::new();
    let mut stubs = String::from("// Generated by build.rs from the installed libibverbs.\n");
    for (node, parent) in &inst.nodes {
        match parent {
            Some(p) => writeln!(map, "{node} {{ }} {p};").unwrap(),
            None => writeln!(map, "{node} {{ }};").unwrap(),
        }
    }
    for (name, node) in &inst.symbols {
        writeln!(symver, ".symver bv_{name}, {name}@@{node}").unwrap();
        if !ours.contains(name) {
            let kind = if POINTER_STUBS.contains(&name.as_str()) {
                "ptr"
            } else if name.starts_with("verbs_register_driver_") {
                // Provider libraries (libmlx5, libefa) call it from their constructors:
                // nothing to register, nothing to say.
                "noop"
            } else {
                "int"
            };
            writeln!(stubs, "crate::stubs::stub!({kind} bv_{name}, \"{name}\");").unwrap();
        }
    }
    let extra: Vec<&String> = ours
        .iter()
        .filter(|n| !inst.symbols.contains_key(*n))
        .collect();
    if !extra.is_empty() {
        panic!(
            "the sources define bv_ functions the installed libibverbs does not export: {extra:?}"
        );
    }
    std::fs::write(out.join("ibverbs.map"), map).expect("OUT_DIR is writable");
    std::fs::write(out.join("symver.s"), symver).expect("OUT_DIR is writable");
    std::fs::write(out.join("stubs.rs"), stubs).expect("OUT_DIR is writable");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.join("ibverbs.map").display()
    );
}
