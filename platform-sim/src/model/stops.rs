//! Where the RTL stops: the events after which the open-rdma RTL freezes or its simulation
//! ends (nic-behaviour.md 0 "Sim abort", 1.2, 1.7, 2.1-2.2, 3.3, 5.1-5.2, 6.1), and what the
//! emulated card does when one happens ([`RtlStopPolicy`]).
//!
//! By default the card freezes, as the RTL would: from that moment it fetches no
//! descriptor, executes no command, writes no report and takes no frame (frames that arrive
//! are counted in `frozen_drops` and dropped), so the driver's next command times out. The
//! event is logged once, counted in `rtl_stops` and kept ([`super::Shared::rtl_stop`]), so
//! a test or a state dump can name it. [`RtlStopPolicy::Fail`] also makes dropping a
//! threaded card ([`super::Nic`]) panic with the event, so that the test that caused it
//! fails even when its own assertions came first; `BLUERDMA_RTL_STOPS` chooses the policy
//! of [`super::NicConfig::default`] (the repository's `.cargo/config.toml` sets `fail`).
//!
//! This is not the `strict` protection-domain check ([`super::NicConfig::strict`]): that
//! one adds a check the card lacks, this one keeps the card from carrying on where the
//! RTL cannot.

use std::fmt;

/// The environment variable [`RtlStopPolicy::from_env`] reads.
pub const RTL_STOPS_ENV: &str = "BLUERDMA_RTL_STOPS";

/// One event at which the RTL freezes or its simulation ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RtlStop {
    /// A send WQE with payload whose lkey indexes an invalid MR entry ("mrTable must be
    /// valid here", nic-behaviour.md 1.7): the driver invalidated an MR while a descriptor
    /// using it was still on the send ring.
    InvalidLkey {
        /// The WQE's lkey.
        lkey: u32,
        /// The WQE's source QPN.
        sqpn: u32,
    },
    /// A payload-less WQE (a READ or zero-length request) that is not both first and last
    /// (nic-behaviour.md 1.2).
    PayloadlessNotWhole {
        /// The WQE's op code.
        op: u8,
    },
    /// An UpdatePGT whose staging buffer breaks the DMA rules or cannot be read
    /// (nic-behaviour.md 5.2).
    UpdatePgt {
        /// Why.
        reason: String,
    },
    /// A command op code the RTL does not implement (5..=7, nic-behaviour.md 5.1).
    UnknownCommand {
        /// The op code's low three bits.
        op: u8,
    },
    /// A host access to a register address the RTL does not decode (nic-behaviour.md 6.1).
    UndecodedRegister {
        /// The byte offset.
        offset: u32,
        /// A write (else a read).
        is_write: bool,
    },
    /// A PSN more than 8 strides behind its QP's receive window: the RTL's bitmap pipeline
    /// never finishes the update and stops for every QP (nic-behaviour.md 3.3).
    StalePsn {
        /// The QP index.
        qp_index: u32,
        /// The PSN.
        psn: u32,
        /// The window's newest stride (PSN / 16).
        stride: u32,
    },
    /// A frame of one beat (at most 32 bytes), a RoCE frame that ends in its second beat,
    /// or a RoCE frame with payload that ends by byte 96 (nic-behaviour.md 2.1-2.2).
    ShortFrame {
        /// The frame's length.
        len: usize,
    },
}

impl RtlStop {
    /// A short, stable name of the event (for stats, logs and test assertions).
    pub fn name(&self) -> &'static str {
        match self {
            RtlStop::InvalidLkey { .. } => "invalid_lkey",
            RtlStop::PayloadlessNotWhole { .. } => "payloadless_not_whole",
            RtlStop::UpdatePgt { .. } => "update_pgt_failed",
            RtlStop::UnknownCommand { .. } => "unknown_command",
            RtlStop::UndecodedRegister { .. } => "undecoded_register",
            RtlStop::StalePsn { .. } => "stale_psn",
            RtlStop::ShortFrame { .. } => "short_frame",
        }
    }
}

impl fmt::Display for RtlStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.name())?;
        match self {
            RtlStop::InvalidLkey { lkey, sqpn } => write!(
                f,
                "send WQE of QP {sqpn:#x} has lkey {lkey:#x}, which has no valid MR entry"
            ),
            RtlStop::PayloadlessNotWhole { op } => write!(
                f,
                "payload-less send WQE (op {op}) is not both first and last"
            ),
            RtlStop::UpdatePgt { reason } => write!(f, "UpdatePGT failed: {reason}"),
            RtlStop::UnknownCommand { op } => write!(f, "command op code {op} is not implemented"),
            RtlStop::UndecodedRegister { offset, is_write } => write!(
                f,
                "undecoded register {} at {offset:#x}",
                if *is_write { "write" } else { "read" }
            ),
            RtlStop::StalePsn {
                qp_index,
                psn,
                stride,
            } => write!(
                f,
                "PSN {psn:#x} on QP index {qp_index} is more than 8 strides behind the window (stride {stride:#x})"
            ),
            RtlStop::ShortFrame { len } => write!(f, "frame of {len} bytes"),
        }
    }
}

/// What the card does at an [`RtlStop`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RtlStopPolicy {
    /// Freeze, as the RTL does (see the module documentation).
    #[default]
    Freeze,
    /// Freeze, and a threaded card that froze panics when it is dropped (tests).
    Fail,
    /// Log the event, count it and carry on (the model's behaviour before it froze; for
    /// fault-injection runs that want to see past a stop).
    Continue,
}

impl RtlStopPolicy {
    /// The policy `text` names: `freeze`, `fail` or `continue`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "freeze" => Ok(RtlStopPolicy::Freeze),
            "fail" => Ok(RtlStopPolicy::Fail),
            "continue" => Ok(RtlStopPolicy::Continue),
            other => Err(format!(
                "RTL-stop policy {other:?} is none of freeze, fail, continue"
            )),
        }
    }

    /// The policy [`RTL_STOPS_ENV`] names; [`RtlStopPolicy::Freeze`] when it is unset (or
    /// unusable, which is logged).
    pub fn from_env() -> Self {
        match std::env::var(RTL_STOPS_ENV) {
            Ok(v) => Self::parse(v.trim()).unwrap_or_else(|e| {
                log::warn!("{RTL_STOPS_ENV}: {e}; the card freezes at RTL stops");
                RtlStopPolicy::Freeze
            }),
            Err(_) => RtlStopPolicy::Freeze,
        }
    }

    /// Whether the card freezes at a stop.
    pub fn freezes(self) -> bool {
        self != RtlStopPolicy::Continue
    }
}

impl fmt::Display for RtlStopPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RtlStopPolicy::Freeze => "freeze",
            RtlStopPolicy::Fail => "fail",
            RtlStopPolicy::Continue => "continue",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print_back() {
        for p in [
            RtlStopPolicy::Freeze,
            RtlStopPolicy::Fail,
            RtlStopPolicy::Continue,
        ] {
            assert_eq!(RtlStopPolicy::parse(&p.to_string()), Ok(p));
        }
        assert!(RtlStopPolicy::parse("strict")
            .unwrap_err()
            .contains("freeze, fail, continue"));
        assert!(!RtlStopPolicy::Continue.freezes());
    }

    #[test]
    fn an_event_names_itself_first() {
        let e = RtlStop::InvalidLkey {
            lkey: 0x712,
            sqpn: 0x1A5,
        };
        assert_eq!(
            e.to_string(),
            "invalid_lkey: send WQE of QP 0x1a5 has lkey 0x712, which has no valid MR entry"
        );
    }
}
