//! The emulated card's own counters: everything the register counters do not cover, so a
//! test or `cargo xtask sim` can see why a frame, a command or a descriptor went nowhere.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! nic_stats {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Counters of one emulated card (statistics: relaxed atomics).
        #[derive(Default)]
        pub struct NicStats {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`NicStats`] at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct NicStatsSnapshot {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl NicStats {
            /// Every counter.
            pub fn snapshot(&self) -> NicStatsSnapshot {
                NicStatsSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl fmt::Display for NicStatsSnapshot {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                $(
                    if self.$name != 0 {
                        if !first { f.write_str(" ")?; }
                        first = false;
                        write!(f, "{}={}", stringify!($name), self.$name)?;
                    }
                )*
                if first { f.write_str("(all zero)")?; }
                Ok(())
            }
        }
    };
}

nic_stats! {
    /// Commands executed.
    commands,
    /// Commands rejected: unknown op code (no response, as the card) or a request the card
    /// cannot execute (answered with is_success = 0).
    command_errors,
    /// DMA accesses outside every mapped region.
    dma_faults,
    /// Work requests (Seg0 + Seg1) taken from the send ring.
    wqes,
    /// Send-ring descriptors that did not form Seg0 + Seg1, or a WQE the card cannot send.
    bad_wqes,
    /// RoCE packets transmitted.
    tx_packets,
    /// Payload bytes transmitted.
    tx_payload_bytes,
    /// Frames received from the link.
    rx_frames,
    /// Frames dropped before SetNetworkParam (the card ignores the link until then).
    rx_before_setup,
    /// RoCE frames whose headers did not parse.
    rx_malformed,
    /// RoCE packets dropped by a receive check (see the register counters for which).
    rx_check_failed,
    /// RoCE packets with an opcode the card does not handle (UC/UD/CNP/atomics/*_INV).
    rx_unsupported,
    /// RoCE packets accepted.
    rx_accepted,
    /// Payload bytes written to host memory.
    rx_payload_bytes,
    /// PSNs more than 8 strides behind the window (an RTL stop: see `rtl_stops`).
    stale_psns,
    /// NAK packets sent by the card's loss detector.
    naks_sent,
    /// Meta-report events written (a pair counts once).
    meta_reports,
    /// Quiet-timer reports written.
    quiet_reports,
    /// Times a full card-to-host ring made the card wait.
    backpressure_waits,
    /// Frames sent from the simple-NIC TX ring.
    simple_tx,
    /// Frames delivered to the simple-NIC RX ring.
    simple_rx,
    /// Simple-NIC frames dropped: no RX buffer configured, or longer than a slot.
    simple_rx_dropped,
    /// Packets refused by the strict protection-domain check (strict mode only).
    strict_pd_drops,
    /// Events at which the RTL freezes or its simulation ends (`model::stops`); the first
    /// one froze the card unless its policy is `continue`.
    rtl_stops,
    /// Frames that arrived while the card was frozen (dropped).
    frozen_drops,
}

impl NicStats {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
