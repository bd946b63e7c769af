//! The library's ABI against the installed rdma-core: every structure size and offset of
//! `src/abi.rs` is measured again by a C program compiled against `<rdma/rdma_cma.h>`
//! (librdmacm-dev), and the built `librdmacm.so` exports every symbol of the installed
//! `librdmacm.so.1` at the same version node. A missing C compiler, header or objdump fails
//! the test with what to install.

mod common;

use common::abi::LAYOUT;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

const HEADER: &str = "/usr/include/rdma/rdma_cma.h";
const INSTALLED: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";
/// How long the compiler, the layout program or objdump may run.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

#[test]
fn structures_match_the_installed_headers() {
    assert!(
        Path::new(HEADER).exists(),
        "{HEADER} is missing: install the librdmacm headers (Debian/Ubuntu: apt-get install librdmacm-dev)"
    );
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _, _) in LAYOUT {
        writeln!(c, "    printf(\"%zu\\n\", (size_t){expr});").unwrap();
    }
    c.push_str("    return 0;\n}\n");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // Named per process: two test runs at once must not rebuild each other's program.
    let pid = std::process::id();
    let (src, bin) = (
        dir.join(format!("rdmacm_layout-{pid}.c")),
        dir.join(format!("rdmacm_layout-{pid}")),
    );
    std::fs::write(&src, c).unwrap();
    let mut cc = Command::new("cc");
    cc.arg("-o").arg(&bin).arg(&src);
    let cc = common::output(cc, LIMIT, "install a C compiler (apt-get install gcc)");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = common::output(
        Command::new(&bin),
        LIMIT,
        "the layout program was just built",
    );
    let measured: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(measured.len(), LAYOUT.len());
    let wrong: Vec<String> = LAYOUT
        .iter()
        .zip(&measured)
        .filter(|((_, ours, _), theirs)| ours != *theirs)
        .map(|((expr, ours, _), theirs)| format!("{expr}: ours {ours}, the header's {theirs}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "layouts differ from {HEADER}:\n{}",
        wrong.join("\n")
    );
}

/// `(name, version)` of every defined, versioned symbol `objdump -T` lists for `lib`.
fn exports(lib: &Path) -> Vec<(String, String)> {
    let mut cmd = Command::new("objdump");
    cmd.arg("-T").arg(lib);
    let out = common::output(cmd, LIMIT, "install binutils (apt-get install binutils)");
    assert!(out.status.success(), "objdump -T {} failed", lib.display());
    let mut v: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7
                && f[1] == "g"
                && f[3] == ".text"
                && f[f.len() - 2].starts_with("RDMACM_"))
            .then(|| (f[f.len() - 1].to_string(), f[f.len() - 2].to_string()))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_installed_symbol_is_exported_at_its_version() {
    assert!(
        Path::new(INSTALLED).exists(),
        "{INSTALLED} is missing: install librdmacm1 (Debian/Ubuntu: apt-get install librdmacm-dev)"
    );
    let ours = exports(&common::build().join("librdmacm.so"));
    let theirs = exports(Path::new(INSTALLED));
    assert!(
        theirs.len() > 60,
        "the installed library lists {} symbols",
        theirs.len()
    );
    let missing: Vec<&(String, String)> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "not exported at the installed version: {missing:?}"
    );
}
