//! The library's log: a minimal stderr logger, installed on first use, its level from
//! `BLUERDMA_LOG` (error, warn (the default), info, debug, trace, off).

/// Prints `bluerdma <level>: <message>` on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!(
                "bluerdma {}: {}",
                r.level().as_str().to_lowercase(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

/// Installs the logger (once per process; a logger the program installed first wins).
pub(crate) fn init_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = match std::env::var("BLUERDMA_LOG").as_deref() {
            Ok("error") => log::LevelFilter::Error,
            Ok("info") => log::LevelFilter::Info,
            Ok("debug") => log::LevelFilter::Debug,
            Ok("trace") => log::LevelFilter::Trace,
            Ok("off") => log::LevelFilter::Off,
            _ => log::LevelFilter::Warn,
        };
        if log::set_logger(&StderrLog).is_ok() {
            log::set_max_level(level);
        }
    });
}
