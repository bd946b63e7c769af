//! `bluerdma-devd DEVICE [--socket PATH] [--linger SECONDS]`: the daemon that lets many
//! processes share one device (README, "Many processes on one device"). The first process
//! that opens a device with `BLUERDMA_SHARED=1` starts it with its own environment (the
//! device list, link options, key files); it exits `--linger` seconds (default 3) after its
//! last client.

use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    bluerdma_linux::stderr_log::init("bluerdma-devd");
    let mut args = std::env::args().skip(1);
    let Some(device) = args.next().filter(|a| !a.starts_with('-')) else {
        eprintln!("usage: bluerdma-devd DEVICE [--socket PATH] [--linger SECONDS]");
        return ExitCode::from(2);
    };
    let mut cfg = bluerdma_linux::shared::daemon::DaemonConfig {
        socket: bluerdma_linux::shared::run_dir().join(format!("{device}.sock")),
        device,
        linger: Duration::from_secs(3),
    };
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--socket", Some(p)) => cfg.socket = p.into(),
            ("--linger", Some(s)) => match s.parse::<f64>() {
                Ok(s) if s >= 0.0 => cfg.linger = Duration::from_secs_f64(s),
                _ => {
                    eprintln!("bluerdma-devd: --linger takes seconds, not `{s}`");
                    return ExitCode::from(2);
                }
            },
            (other, _) => {
                eprintln!("bluerdma-devd: unknown argument `{other}`");
                return ExitCode::from(2);
            }
        }
    }
    // The daemon must not die with the terminal or the program that started it.
    // SAFETY: setsid has no preconditions; failing (already a group leader) is harmless.
    unsafe { libc::setsid() };
    match bluerdma_linux::shared::daemon::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bluerdma-devd: {}: {e}", cfg.device);
            ExitCode::FAILURE
        }
    }
}
