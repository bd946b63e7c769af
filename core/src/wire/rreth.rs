//! The READ request's second extension header, 12 bytes after the RETH: the requester's
//! sink {VA (8), L_Key (4)} (nic-behaviour.md 1.3 and 1.5). Not an IBTA header: the
//! responder's driver answers the request by writing READ responses to this address.

use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_layout, write_layout, Header, HeaderKind, WireError};
use crate::addr::VirtAddr;
use crate::keys::MrKey;

/// Length of the RRETH.
pub const RRETH_LEN: usize = 12;

/// The requester's sink of an RDMA READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rreth {
    /// Requester-side virtual address the response data goes to.
    pub va: VirtAddr,
    /// The requester's local key for that buffer.
    pub lkey: MrKey,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    va: U64,
    lkey: U32,
}

impl Header for Rreth {
    const LEN: usize = RRETH_LEN;
    const KIND: HeaderKind = HeaderKind::Rreth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<Layout>(bytes, Self::KIND)?;
        let rreth = Rreth {
            va: VirtAddr(l.va.get()),
            lkey: MrKey::from_raw(l.lkey.get()),
        };
        Ok((rreth, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = Layout {
            va: U64::new(self.va.get()),
            lkey: U32::new(self.lkey.get()),
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        let rreth = Rreth {
            va: VirtAddr(0x0000_7F12_3460_0000),
            lkey: MrKey::from_raw(0x001F_FEA6),
        };
        let mut out = [0u8; 12];
        assert_eq!(rreth.emit(&mut out), Ok(12));
        assert_eq!(
            out,
            [0x00, 0x00, 0x7F, 0x12, 0x34, 0x60, 0x00, 0x00, 0x00, 0x1F, 0xFE, 0xA6]
        );
        assert_eq!(Rreth::parse(&out), Ok((rreth, &[][..])));
    }
}
