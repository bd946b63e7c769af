//! The verbs half of `cargo xtask sim`: the driver engine end to end on two emulated NICs.
//!
//! `cargo run --release -p bluerdma-linux --example sim -- [--port P] [--faults SPEC]
//! [--seed N] [--soak SECS] [--no-perf] [--devices LIST] [--small]`
//!
//! `--devices` opens the first two devices of an inline device list (`BLUERDMA_DEVICES`
//! syntax, e.g. cards served by `bluerdma-sim serve`: `blue0=127.0.0.1+rtl:P/Q,...`)
//! instead of two emulated NICs; `--small` fits the sizes to the RTL protocol's speed.

use std::io::Write;
use std::process::ExitCode;

use bluerdma_linux::scenarios::{run, Options, Row};

fn parse() -> Result<Options, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "sim (verbs) [--port P] [--faults SPEC] [--seed N] [--soak SECS] [--no-perf] [--in-memory]\n\
             [--devices LIST] [--small]\n\
             --seed N is the seed that runs (faults and soak); without it SPEC's seed= is"
        );
        std::process::exit(0);
    }
    let env_faults = std::env::var("BLUERDMA_LINK_FAULTS").ok();
    Options::from_args(args, env_faults.as_deref())
}

/// Logs warnings and errors of the driver and the cards to stderr (BLUERDMA_LOG=debug for
/// more).
struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.0
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{} {}] {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() -> ExitCode {
    let level = match std::env::var("BLUERDMA_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        Ok("error") => log::LevelFilter::Error,
        Ok("off") => log::LevelFilter::Off,
        _ => log::LevelFilter::Warn,
    };
    let logger = Box::leak(Box::new(StderrLog(level)));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::from(2);
        }
    };
    match &opts.devices {
        Some(list) => println!(
            "sim (verbs): devices {list}; sizes {:?}; seed {}",
            opts.scale, opts.seed
        ),
        None => println!(
            "sim (verbs): blue0 = 127.0.0.1, blue1 = 127.0.0.2 on the {}, port {}; faults {}; seed {}",
            bluerdma_linux::scenarios::link_name(),
            opts.port,
            opts.faults
                .map(|f| f.to_string())
                .unwrap_or_else(|| "none".into()),
            opts.seed
        ),
    }
    let mut n = 0;
    let rows = match run(&opts, &mut |r: &Row| {
        n += 1;
        println!(
            "[{n}] {} {} ({:.2}s)",
            r.name,
            if r.ok { "ok" } else { "FAILED" },
            r.time.as_secs_f64()
        );
        let _ = std::io::stdout().flush();
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!();
    println!("{:<34} {:<7} {:>8}  notes", "scenario", "result", "time");
    println!("{}", "-".repeat(100));
    for r in &rows {
        let first = r.notes.lines().next().unwrap_or("");
        println!(
            "{:<34} {:<7} {:>7.2}s  {first}",
            r.name,
            if r.ok { "ok" } else { "FAILED" },
            r.time.as_secs_f64()
        );
        if !r.ok {
            for l in r.notes.lines().skip(1) {
                println!("    {l}");
            }
        }
    }
    println!("{}", "-".repeat(100));
    let failed = rows.iter().filter(|r| !r.ok).count();
    println!(
        "sim (verbs): {} passed, {} failed",
        rows.len() - failed,
        failed
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
