//! `libibverbs.so.1` for the blue-rdma driver: unmodified ibverbs programs (ibv_devinfo,
//! ibv_rc_pingpong, perftest, anything that links libibverbs) run on the driver and its
//! emulated NIC, with no kernel module, found through `LD_LIBRARY_PATH`.
//!
//! - Devices are the list of [`bluerdma_linux::devices`] (`BLUERDMA_DEVICES`; by default
//!   `bluerdma0` at 127.0.0.1 and `bluerdma1` at 127.0.0.2). Opening one costs nothing; the
//!   emulated card (its UDP link on `<ip>:4791` and its out-of-band listener on
//!   `<ip>:60000`, or `BLUERDMA_OOB_PORT`) starts with the first object made on it, so
//!   `ibv_devinfo` works while another process uses the device.
//! - The port is RoCE: Ethernet link layer, ACTIVE, LID 0, GID 0 and 3 are the device's
//!   IPv4-mapped address (RoCE v2). Connect QPs with a GID (`ibv_rc_pingpong -g 0`).
//! - RC QPs with one SGE per work request: RDMA WRITE (with immediate), READ, SEND (with
//!   immediate); completion channels; shared receive queues; UD QPs and address handles
//!   (`ud.rs`: datagrams of up to 1978 bytes through the simple NIC). Everything else the
//!   installed libibverbs exports is present (programs and provider libraries are
//!   BIND_NOW) and fails with EOPNOTSUPP and a log line when called.
//! - `BLUERDMA_LOG=error|warn|info|debug` sets what is printed on stderr (default warn).
//!
//! The exported names and version nodes come from the installed libibverbs at build time
//! (see build.rs); the structures' layout is checked at compile time ([`abi`]).

// Exported functions take raw pointers from C callers; each documents its contract in the
// verbs man pages rather than in Rust `# Safety` sections.
#![allow(clippy::missing_safety_doc)]

pub mod abi;
mod device;
mod objects;
mod post;
mod srq;
mod stubs;
mod ud;

use core::ffi::c_int;

std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));
include!(concat!(env!("OUT_DIR"), "/stubs.rs"));

/// Sets `errno` for the calling thread.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The errno for an engine error.
pub(crate) fn errno_of(e: &bluerdma_linux::verbs::Error) -> c_int {
    use bluerdma_core::engine::VerbsError as V;
    match e.kind {
        V::InvalidArgument { .. }
        | V::Attribute(_)
        | V::Transition(_)
        | V::WrongQpState { .. }
        | V::LocalProtection { .. }
        | V::Fragment(_)
        | V::Descriptor(_) => libc::EINVAL,
        V::NoSuchObject { .. } => libc::EINVAL,
        V::OutOfResources { .. } | V::SendQueueFull => libc::ENOMEM,
        V::Busy { .. } => libc::EBUSY,
        V::Unsupported { .. } => libc::EOPNOTSUPP,
        V::CommandTimeout { .. } | V::CommandFailed { .. } | V::Platform(_) => libc::EIO,
    }
}

/// Logs `e` and returns its errno.
pub(crate) fn fail(e: bluerdma_linux::verbs::Error) -> c_int {
    log::error!("{e}");
    errno_of(&e)
}

/// A minimal stderr logger, installed on first use, level from `BLUERDMA_LOG`.
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
