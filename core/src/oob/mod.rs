//! The out-of-band channel's codec (oob-channel.md): the hello and the 32-byte receive-WR
//! record. The transport itself belongs to the platform.

mod codec;

pub use codec::*;
