//! Immediate data, 4 bytes after the RETH on LAST/ONLY packets of the *_WITH_IMMEDIATE
//! opcodes (nic-behaviour.md 1.3 and 1.5).

use zerocopy::network_endian::U32;

use super::{read_layout, write_layout, Header, HeaderKind, WireError};

/// Length of the ImmDt header.
pub const IMM_LEN: usize = 4;

/// Immediate data, as the 32-bit big-endian value on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ImmDt(pub u32);

impl Header for ImmDt {
    const LEN: usize = IMM_LEN;
    const KIND: HeaderKind = HeaderKind::ImmDt;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (v, rest) = read_layout::<U32>(bytes, Self::KIND)?;
        Ok((ImmDt(v.get()), rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        write_layout(&U32::new(self.0), out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian() {
        let mut out = [0u8; 4];
        assert_eq!(ImmDt(0xCAFE_BABE).emit(&mut out), Ok(4));
        assert_eq!(out, [0xCA, 0xFE, 0xBA, 0xBE]);
        assert_eq!(ImmDt::parse(&out), Ok((ImmDt(0xCAFE_BABE), &[][..])));
    }
}
