//! The crate's layering, as lib.rs's module doc lists it, holds: every module of `src/` is
//! listed once, and each uses (`crate::<module>`) only modules listed before it, so no
//! module reaches into a layer above its own. Source files stay under 800 lines.

use std::collections::BTreeSet;
use std::path::Path;

/// The modules in the order lib.rs's `# Layers` list names them.
fn listed(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .filter_map(|l| l.trim_start().strip_prefix("- "))
        .filter_map(|l| {
            let name = l.trim_start_matches('[').strip_prefix('`')?;
            let end = name.find('`')?;
            (name[end..].starts_with("`:") || name[end..].starts_with("`]:"))
                .then(|| name[..end].to_string())
        })
        .collect()
}

/// The crate modules a source file names, from `crate::a` paths and `use crate::{a, b}`.
fn uses(src: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for piece in src.split("crate::").skip(1) {
        if let Some(group) = piece.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(group.split(',').map(|g| ident(g.trim())));
        } else {
            out.insert(ident(piece));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

#[test]
fn each_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let order = listed(&lib);
    let files: BTreeSet<String> = std::fs::read_dir(&src)
        .expect("src/")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".rs")
                .map(String::from)
        })
        .filter(|m| m != "lib")
        .collect();
    let named: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(
        named.len(),
        order.len(),
        "a module is listed twice: {order:?}"
    );
    assert_eq!(
        named, files,
        "lib.rs's layer list and src/ name other modules"
    );
    let mut problems = Vec::new();
    for (at, module) in order.iter().enumerate() {
        let text = std::fs::read_to_string(src.join(format!("{module}.rs"))).expect("module");
        let lines = text.lines().count();
        if lines > 800 {
            problems.push(format!("{module}.rs has {lines} lines (at most 800)"));
        }
        for used in uses(&text) {
            if let Some(pos) = order.iter().position(|m| *m == used) {
                if pos > at {
                    problems.push(format!("{module} uses {used}, which lib.rs lists after it"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_upward_uses() {
    let lib =
        "//! 1. A:\n//!    - [`abi`]: x.\n//!    - `low`: y.\n//! 2. B:\n//!    - `high`: z.\n";
    assert_eq!(listed(lib), ["abi", "low", "high"]);
    let src = "use crate::abi::*;\nuse crate::{high, low::X};\nfn f() { crate::errors::fail(); }";
    let got: Vec<String> = uses(src).into_iter().collect();
    assert_eq!(got, ["abi", "errors", "high", "low"]);
}
