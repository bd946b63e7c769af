//! Invalidate extended transport header, 4 bytes after the RETH on LAST/ONLY packets of
//! the SEND_*_WITH_INVALIDATE opcodes: the rkey to invalidate (nic-behaviour.md 1.3, 1.5).

use zerocopy::network_endian::U32;

use super::{read_layout, write_layout, Header, HeaderKind, WireError};
use crate::keys::MrKey;

/// Length of the IETH.
pub const IETH_LEN: usize = 4;

/// The key a SEND_WITH_INVALIDATE invalidates at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ieth {
    /// The rkey to invalidate.
    pub rkey: MrKey,
}

impl Header for Ieth {
    const LEN: usize = IETH_LEN;
    const KIND: HeaderKind = HeaderKind::Ieth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (v, rest) = read_layout::<U32>(bytes, Self::KIND)?;
        Ok((
            Ieth {
                rkey: MrKey::from_raw(v.get()),
            },
            rest,
        ))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        write_layout(&U32::new(self.rkey.get()), out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian() {
        let ieth = Ieth {
            rkey: MrKey::from_raw(0x0012_34AB),
        };
        let mut out = [0u8; 4];
        assert_eq!(ieth.emit(&mut out), Ok(4));
        assert_eq!(out, [0x00, 0x12, 0x34, 0xAB]);
        assert_eq!(
            Ieth::parse(&out[..3]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Ieth,
                needed: 4,
                available: 3
            }
        );
    }
}
