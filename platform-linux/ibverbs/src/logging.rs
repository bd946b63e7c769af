//! The library's log: a minimal stderr logger, installed on first use, its level from
//! `BLUERDMA_LOG` (error, warn (the default), info, debug, trace, off).

/// Installs the logger (once per process; a logger the program installed first wins).
pub(crate) fn init_log() {
    bluerdma_linux::stderr_log::init("bluerdma");
}
