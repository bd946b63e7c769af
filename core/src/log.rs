//! One logging shim for the whole core.
//!
//! With the `defmt` feature the macros forward to `defmt` (firmware); with `log` they
//! forward to the `log` facade (std hosts); with neither they compile to nothing but still
//! type-check their arguments. Enabling both is a compile error, so a build never logs
//! twice or through the wrong sink.

#[cfg(all(feature = "defmt", feature = "log"))]
compile_error!("features `defmt` and `log` of bluerdma-core are mutually exclusive");

/// Logs an error: something from the device, a peer or the user was rejected.
#[macro_export]
macro_rules! core_error {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::error!($($arg)*);
        #[cfg(feature = "log")]
        ::log::error!($($arg)*);
        #[cfg(not(any(feature = "defmt", feature = "log")))]
        { let _ = || { let _ = ::core::format_args!($($arg)*); }; }
    }};
}

/// Logs a warning: a recoverable oddity (retransmission, a late response).
#[macro_export]
macro_rules! core_warn {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::warn!($($arg)*);
        #[cfg(feature = "log")]
        ::log::warn!($($arg)*);
        #[cfg(not(any(feature = "defmt", feature = "log")))]
        { let _ = || { let _ = ::core::format_args!($($arg)*); }; }
    }};
}

/// Logs a debug trace of the driver's progress.
#[macro_export]
macro_rules! core_debug {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::debug!($($arg)*);
        #[cfg(feature = "log")]
        ::log::debug!($($arg)*);
        #[cfg(not(any(feature = "defmt", feature = "log")))]
        { let _ = || { let _ = ::core::format_args!($($arg)*); }; }
    }};
}
