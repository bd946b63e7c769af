//! `bluerdma-doctor`: can this host run the blue-rdma card? Prints one line per check and,
//! for each problem, the command that fixes it. Exits 1 if any check failed.
//!
//! ```text
//! bluerdma-doctor [--bdf 0000:01:00.0 | --id 1172:0000] [--udmabuf udmabuf0]
//!                 [--hugepages 16] [--root DIR] [--device NAME]
//! ```
//! `--root` reads `DIR/sys`, `DIR/proc` and `DIR/dev` instead of the real ones (tests).
//! `--device NAME` checks the `+pci` device `NAME` of the device list (`BLUERDMA_DEVICES`):
//! its address, u-dma-buf buffer and root.

use std::path::Path;
use std::process::ExitCode;

use bluerdma_linux::doctor::{failed, render, run, DoctorConfig};
use bluerdma_linux::paths::SystemPaths;
use bluerdma_linux::pci::PciSelector;

const USAGE: &str = "usage: bluerdma-doctor [--bdf ADDRESS | --id VENDOR:DEVICE] \
[--udmabuf NAME] [--hugepages N] [--root DIR] [--device NAME]";

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
            "--device" => device(&mut cfg, &value()?)?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(cfg)
}

/// Takes the card's address, u-dma-buf buffer and root from the device list's entry `name`.
fn device(cfg: &mut DoctorConfig, name: &str) -> Result<(), String> {
    use bluerdma_linux::devices::{BackendSpec, DeviceList};
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .get(name)
        .ok_or_else(|| format!("--device {name}: no such device in the device list"))?;
    let BackendSpec::Pci(p) = &entry.backend else {
        return Err(format!(
            "--device {name}: an {} device, not a +pci one: the doctor checks the card",
            entry.backend.kind()
        ));
    };
    if let Some(s) = p.selector {
        cfg.selector = s;
    }
    if let Some(u) = &p.udmabuf {
        cfg.udmabuf = u.clone();
    }
    if let Some(root) = &p.root {
        cfg.paths = SystemPaths::under(root);
    }
    Ok(())
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
