//! RDMA extended transport header, 16 bytes: VA (8), R_Key (4), DMA length (4)
//! (nic-behaviour.md 1.5). The card puts one on every SEND, WRITE and READ-response packet
//! and on the READ request; `va` is that packet's remote start address and `dma_len` the
//! message total on FIRST/ONLY packets, this packet's payload length on the others
//! (nic-behaviour.md 1.3).

use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_layout, write_layout, Header, HeaderKind, WireError};
use crate::addr::VirtAddr;
use crate::keys::MrKey;

/// Length of the RETH.
pub const RETH_LEN: usize = 16;

/// An RDMA extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address (in the responder's MR).
    pub va: VirtAddr,
    /// Remote key of the responder's MR.
    pub rkey: MrKey,
    /// DMA length (see the module doc for which length).
    pub dma_len: u32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    va: U64,
    rkey: U32,
    dma_len: U32,
}

impl Header for Reth {
    const LEN: usize = RETH_LEN;
    const KIND: HeaderKind = HeaderKind::Reth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<Layout>(bytes, Self::KIND)?;
        let reth = Reth {
            va: VirtAddr(l.va.get()),
            rkey: MrKey::from_raw(l.rkey.get()),
            dma_len: l.dma_len.get(),
        };
        Ok((reth, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = Layout {
            va: U64::new(self.va.get()),
            rkey: U32::new(self.rkey.get()),
            dma_len: U32::new(self.dma_len),
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        let reth = Reth {
            va: VirtAddr(0x0000_7F00_DEAD_0002),
            rkey: MrKey::from_raw(0x001F_FFA5),
            dma_len: 0x0001_0000,
        };
        let mut out = [0u8; 16];
        assert_eq!(reth.emit(&mut out), Ok(16));
        assert_eq!(
            out,
            [
                0x00, 0x00, 0x7F, 0x00, 0xDE, 0xAD, 0x00, 0x02, 0x00, 0x1F, 0xFF, 0xA5, 0x00, 0x01,
                0x00, 0x00
            ]
        );
        assert_eq!(Reth::parse(&out), Ok((reth, &[][..])));
    }
}
