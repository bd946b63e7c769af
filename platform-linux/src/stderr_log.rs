//! The log of this project's libraries and programs: `<prefix> <level>: <message>` on
//! stderr, its level from `BLUERDMA_LOG` (error, warn (the default), info, debug, trace,
//! off). Installed once per process; a logger the program installed first wins.

use std::sync::OnceLock;

/// The environment variable that sets the level.
pub const LOG_ENV: &str = "BLUERDMA_LOG";

struct StderrLog {
    prefix: &'static str,
}

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            use std::io::Write;
            // One write per line: a reader that tags what it reads (mpirun --tag-output)
            // must not see a line in pieces.
            let line = format!(
                "{} {}: {}\n",
                self.prefix,
                r.level().as_str().to_lowercase(),
                r.args()
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
    fn flush(&self) {}
}

/// The level `BLUERDMA_LOG` asks for.
pub fn level_from_env() -> log::LevelFilter {
    match std::env::var(LOG_ENV).as_deref() {
        Ok("error") => log::LevelFilter::Error,
        Ok("info") => log::LevelFilter::Info,
        Ok("debug") => log::LevelFilter::Debug,
        Ok("trace") => log::LevelFilter::Trace,
        Ok("off") => log::LevelFilter::Off,
        _ => log::LevelFilter::Warn,
    }
}

/// Installs the logger with `prefix` (the first call in a process decides the prefix).
pub fn init(prefix: &'static str) {
    static LOGGER: OnceLock<StderrLog> = OnceLock::new();
    let mut fresh = false;
    let logger = LOGGER.get_or_init(|| {
        fresh = true;
        StderrLog { prefix }
    });
    if fresh && log::set_logger(logger).is_ok() {
        log::set_max_level(level_from_env());
    }
}
