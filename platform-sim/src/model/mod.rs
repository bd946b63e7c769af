//! The behavioural model of the card (nic-behaviour.md): register file, card side of the
//! rings, command processing, transmit and receive paths, PSN windows and reports, and
//! the places where the RTL stops ([`stops`]).

pub mod autoack;
pub mod card;
pub mod clock;
mod cmd;
pub mod inline;
pub mod regs;
pub mod rings;
mod rx;
pub mod stats;
pub mod stops;
pub mod tables;
mod tx;

pub use card::{CardState, Nic, NicConfig, Shared, SteppedNic};
pub use clock::{CardClock, VirtualClock};
pub use inline::{InlineNic, CARD_ENV};
pub use stats::{NicStats, NicStatsSnapshot};
pub use stops::{RtlStop, RtlStopPolicy, RTL_STOPS_ENV};
