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
use std::time::Duration;

use bluerdma_linux::scenarios::{run, Options, Row, Scale};

fn parse() -> Result<Options, String> {
    let mut o = Options {
        port: 4792,
        faults: std::env::var("BLUERDMA_LINK_FAULTS")
            .ok()
            .map(|s| s.parse())
            .transpose()
            .map_err(|e| format!("BLUERDMA_LINK_FAULTS: {e}"))?,
        soak: None,
        seed: 1,
        perf: true,
        in_memory: false,
        scenarios: true,
        devices: None,
        scale: Scale::Full,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--port" => {
                o.port = value("--port")?
                    .parse()
                    .map_err(|_| "--port: not a port".to_string())?
            }
            "--faults" => {
                o.faults = Some(
                    value("--faults")?
                        .parse()
                        .map_err(|e| format!("--faults: {e}"))?,
                )
            }
            "--seed" => {
                o.seed = value("--seed")?
                    .parse()
                    .map_err(|_| "--seed: not a number".to_string())?
            }
            "--soak" => {
                o.soak = Some(Duration::from_secs(
                    value("--soak")?
                        .parse()
                        .map_err(|_| "--soak: seconds".to_string())?,
                ))
            }
            "--no-perf" => o.perf = false,
            "--in-memory" => o.in_memory = true,
            "--devices" => o.devices = Some(value("--devices")?),
            "--small" => o.scale = Scale::Small,
            "--help" | "-h" => {
                println!(
                    "sim (verbs) [--port P] [--faults SPEC] [--seed N] [--soak SECS] [--no-perf] \
                     [--devices LIST] [--small]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if let (Some(f), seed) = (o.faults.as_mut(), o.seed) {
        f.seed ^= seed;
    }
    Ok(o)
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
        Some(list) => println!("sim (verbs): devices {list}; sizes {:?}", opts.scale),
        None => println!(
            "sim (verbs): blue0 = 127.0.0.1, blue1 = 127.0.0.2 on the UDP link, port {}; \
             faults {}",
            opts.port,
            opts.faults
                .map(|f| f.to_string())
                .unwrap_or_else(|| "none".into())
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
