//! The counters of a [`super::TcpOob`]: atomics the I/O side bumps and any thread can read
//! as one [`TcpOobStats`] snapshot.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the counters once: the snapshot type with its docs, the atomics behind it,
/// and the one-line state dump.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Counters of a [`TcpOob`](super::TcpOob), for tests and state dumps. Gauges say
        /// "now"; the others count since the transport started.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct TcpOobStats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        /// The atomics behind [`TcpOobStats`].
        #[derive(Default)]
        pub(super) struct Counters {
            $(pub(super) $name: AtomicU64,)*
        }

        impl Counters {
            pub(super) fn snapshot(&self) -> TcpOobStats {
                TcpOobStats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl fmt::Display for TcpOobStats {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut sep = "";
                $(
                    write!(f, "{sep}{}={}", stringify!($name), self.$name)?;
                    sep = " ";
                )*
                let _ = sep;
                Ok(())
            }
        }
    };
}

counters! {
    /// TCP connections the listener accepted (before any check).
    accepted,
    /// Dials started.
    dialed,
    /// Connections that became a peer's connection (dialed or accepted).
    established,
    /// Gauge: peer connections open now.
    open_connections,
    /// Gauge: accepted connections in their handshake (hello and proof) now.
    handshaking,
    /// Accepted connections closed at once because too many waited for their hello.
    refused_over_limit,
    /// Connections closed because their hello (or proof) did not arrive in time.
    hello_timeouts,
    /// Connections closed for bytes that break the protocol (any of the kinds below too).
    protocol_errors,
    /// Of the protocol errors: a peer speaking another protocol version.
    version_mismatches,
    /// Of the protocol errors: a proof of the OOB secret that did not match (another key,
    /// or a spoofed or replayed hello).
    auth_failures,
    /// Connections closed by the tie-break when both sides dialed.
    race_closed,
    /// Dials that failed to connect.
    dial_failures,
    /// `PeerLost` events reported.
    peers_lost,
    /// Records handed to a connection (or delivered locally, for the device's own IP).
    records_sent,
    /// Records received (including the locally delivered ones).
    records_received,
    /// Records dropped from a send queue because their peer was lost.
    records_dropped,
    /// Receive-WR-too-short records not sent because the peer's hello lacks LENGTH_ERRORS.
    records_withheld,
    /// `send(2)` calls that wrote bytes (records per call shows the batching).
    write_calls,
    /// Bytes written to connections.
    bytes_written,
    /// `send` calls refused with `WouldBlock` (the peer's queue or the event queue full).
    would_block,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn set(gauge: &AtomicU64, n: u64) {
        gauge.store(n, Ordering::Relaxed);
    }

    pub(super) fn sub(gauge: &AtomicU64, n: u64) {
        gauge.fetch_sub(n, Ordering::Relaxed);
    }
}
