//! `librdmacm.so.1` for the blue-rdma driver: programs that set up their connections with
//! the RDMA connection manager (rping, udaddy, rdma_server/rdma_client, `ib_write_bw -R`)
//! run unchanged on the blue-rdma libibverbs stand-in, with no kernel rdma_cm.
//!
//! - The verbs are called through libibverbs' C ABI ([`verbs`]); the devices are the ones
//!   it lists, each at the IPv4 address of its GID 0.
//! - Event channels are a socket pair: the application polls `channel->fd`, which is
//!   readable while events wait ([`channel`]).
//! - The connection exchange runs over TCP between the two processes' CM threads
//!   ([`reactor`]): listeners bind `<device ip>:<CM port>` (60001, or `BLUERDMA_CM_PORT`,
//!   or `BLUERDMA_OOB_PORT` + 1) and the messages are those of [`wire`]. QPs made by the CM
//!   move through INIT, RTR and RTS with the peer's QPN and PSN from that exchange.
//! - A step the peer's CM does not answer within `BLUERDMA_CM_TIMEOUT_MS` (5000 by default;
//!   12 times that once it said the application is deciding) ends in
//!   `RDMA_CM_EVENT_UNREACHABLE`.
//! - Every symbol the installed librdmacm exports is exported at its version node (see
//!   build.rs); rsockets, multicast and ECE fail with ENOSYS and a log line.
//! - `BLUERDMA_LOG=error|warn|info|debug` sets what is printed on stderr (default warn).

// Exported functions take raw pointers from C callers; each follows its librdmacm man page
// rather than a Rust `# Safety` section.
#![allow(clippy::missing_safety_doc)]

pub mod abi;
mod addrinfo;
mod api;
mod channel;
mod connect;
mod qp;
mod reactor;
mod state;
mod stubs;
mod verbs;
mod wire;

use core::ffi::c_int;
use std::time::Duration;

std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));
include!(concat!(env!("OUT_DIR"), "/stubs.rs"));

/// The TCP port of the CM exchange when nothing is configured.
const DEFAULT_CM_PORT: u16 = 60001;

/// Sets `errno` for the calling thread.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The failure convention of librdmacm: errno = `e`, return -1.
pub(crate) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The CM's TCP port: `BLUERDMA_CM_PORT`, else `BLUERDMA_OOB_PORT` + 1, else 60001.
pub(crate) fn cm_port() -> u16 {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
    };
    var("BLUERDMA_CM_PORT")
        .or_else(|| var("BLUERDMA_OOB_PORT").map(|p| p.wrapping_add(1)))
        .unwrap_or(DEFAULT_CM_PORT)
}

/// How long the peer's CM may take to answer one step (`BLUERDMA_CM_TIMEOUT_MS`).
pub(crate) fn cm_timeout() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let ms = std::env::var("BLUERDMA_CM_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(5000)
            .max(10);
        Duration::from_millis(ms)
    })
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
                "bluerdma-cm {}: {}",
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
