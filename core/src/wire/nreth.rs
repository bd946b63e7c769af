//! NAK retry header, 4 bytes: last_retry_psn (24 bits) then 8 reserved bits
//! (nic-behaviour.md 1.5, layout-verification.md 1.6 C16).
//!
//! The RTL declares it but never fills it: the hardware NAK's 54-byte header area is BTH,
//! AETH and six zero bytes, which this codec reads as an NRETH (last_retry_psn 0) plus two
//! pad bytes. The driver's 90-byte frame has no NRETH.

use super::{read_layout, u24_from_be, u24_to_be, write_layout, Header, HeaderKind, WireError};

/// Length of the NRETH.
pub const NRETH_LEN: usize = 4;

/// The NAK retry header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Nreth {
    /// The last retried PSN (24 bits; 0 in every frame the card sends).
    pub last_retry_psn: u32,
}

impl Header for Nreth {
    const LEN: usize = NRETH_LEN;
    const KIND: HeaderKind = HeaderKind::Nreth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let ([a, b, c, _reserved], rest) = read_layout::<[u8; 4]>(bytes, Self::KIND)?;
        Ok((
            Nreth {
                last_retry_psn: u24_from_be([a, b, c]),
            },
            rest,
        ))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let [a, b, c] = u24_to_be(self.last_retry_psn, "nreth.last_retry_psn")?;
        write_layout(&[a, b, c, 0], out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_then_reserved() {
        let mut out = [0xFFu8; 4];
        let n = Nreth {
            last_retry_psn: 0x123456,
        };
        assert_eq!(n.emit(&mut out), Ok(4));
        assert_eq!(out, [0x12, 0x34, 0x56, 0x00]);
        assert_eq!(Nreth::parse(&[0x12, 0x34, 0x56, 0x99]), Ok((n, &[][..])));
    }
}
