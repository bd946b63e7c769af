//! The behavioural model of the card.

pub mod autoack;
pub mod regs;
pub mod rings;
pub mod tables;
