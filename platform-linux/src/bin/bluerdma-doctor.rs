//! `bluerdma-doctor`: can this host run the blue-rdma card? Prints one line per check and,
//! for each problem, the command that fixes it. Exits 1 if any check failed.
//!
//! ```text
//! bluerdma-doctor [--bdf 0000:01:00.0 | --id 1172:0000] [--udmabuf udmabuf0]
//!                 [--hugepages 16] [--root DIR]
//! ```
//! `--root` reads `DIR/sys`, `DIR/proc` and `DIR/dev` instead of the real ones (tests).

use std::path::Path;
use std::process::ExitCode;

use bluerdma_linux::doctor::{failed, render, run, DoctorConfig};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::pci::PciSelector;

const USAGE: &str = "usage: bluerdma-doctor [--bdf ADDRESS | --id VENDOR:DEVICE] \
[--udmabuf NAME] [--hugepages N] [--root DIR]";

fn parse(args: &[String]) -> Result<DoctorConfig, String> {
    let mut cfg = DoctorConfig::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--bdf" => cfg.selector = PciSelector::Address(value()?.parse()?),
            "--id" => cfg.selector = PciSelector::Id(value()?.parse()?),
            "--udmabuf" => cfg.udmabuf = value()?,
            "--hugepages" => {
                cfg.hugepages = value()?
                    .parse()
                    .map_err(|_| format!("--hugepages needs a number\n{USAGE}"))?
            }
            "--root" => cfg.paths = SystemPaths::under(Path::new(&value()?)),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(cfg)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let checks = run(&cfg);
    print!("{}", render(&checks));
    if failed(&checks) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
