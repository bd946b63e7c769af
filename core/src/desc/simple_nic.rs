//! Simple-NIC descriptors: raw Ethernet frames to and from the card (layout-verification.md
//! 1.5; hardware-contract.md correction 1; background reference-driver.md 2.8).
//!
//! RX frames land in 2048-byte slots of a 2 MiB buffer (1024 slots) at
//! `write_base_addr + slot_idx * 2048`, not the 128-byte slots of the reference driver. The
//! RTL writes RX descriptors with is_extended_op_code = 1; decoding accepts 0 or 1.

use super::{BitField, DescError, DescKind, RawDesc};
use crate::addr::DeviceAddr;

/// Size of one RX frame slot in bytes.
pub const RX_SLOT_SIZE: u32 = 2048;
/// Number of RX frame slots (the card's slot counter is 10 bits and wraps).
pub const RX_SLOTS: u32 = 1024;
/// Size of the RX frame buffer in bytes (2 MiB).
pub const RX_BUFFER_SIZE: u32 = RX_SLOT_SIZE * RX_SLOTS;

const TX_ADDR: BitField = BitField::new(128, 64);
const TX_LEN: BitField = BitField::new(192, 32);
const RX_SLOT_IDX: BitField = BitField::new(160, 32);
const RX_LEN: BitField = BitField::new(192, 32);

/// Transmit one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleNicTx {
    /// Device address of the frame (should not cross a page boundary, RTL comment).
    pub addr: DeviceAddr,
    /// Frame length in bytes.
    pub len: u32,
}

/// One received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleNicRx {
    /// The slot the frame is in, `0..RX_SLOTS`.
    pub slot_idx: u32,
    /// Frame length in bytes (a frame longer than a slot runs into the next one).
    pub len: u32,
}

impl SimpleNicTx {
    /// The descriptor: op 0, has_next 0, valid 1.
    #[inline]
    pub fn encode(&self) -> RawDesc {
        let mut d = RawDesc::with_header(0, false);
        d.set(TX_ADDR, self.addr.get());
        d.set(TX_LEN, self.len.into());
        d
    }
    /// Decodes as the RTL does: it reads neither the op code nor the valid bit.
    #[inline]
    pub fn decode(d: &RawDesc) -> Self {
        SimpleNicTx {
            addr: DeviceAddr(d.get(TX_ADDR)),
            len: d.get(TX_LEN) as u32,
        }
    }
}

impl SimpleNicRx {
    /// The descriptor as the RTL writes it: op 0, is_extended_op_code 1, valid 1.
    #[inline]
    pub fn encode(&self) -> RawDesc {
        let mut d = RawDesc::with_header(0, false);
        d.set_is_extended_op_code(true);
        d.set(RX_SLOT_IDX, self.slot_idx.into());
        d.set(RX_LEN, self.len.into());
        d
    }
    /// Decodes an RX descriptor (is_extended_op_code may be 0 or 1). Errors: op code not 0,
    /// slot_idx outside the buffer.
    #[inline]
    pub fn decode(d: &RawDesc) -> Result<Self, DescError> {
        if d.op_code() != 0 {
            return Err(DescError::UnknownOpCode {
                desc: DescKind::SimpleNicRx,
                raw: d.op_code(),
            });
        }
        let slot_idx = d.get(RX_SLOT_IDX);
        if slot_idx >= u64::from(RX_SLOTS) {
            return Err(DescError::InvalidField {
                desc: DescKind::SimpleNicRx,
                field: "slot_idx",
                raw: slot_idx,
            });
        }
        Ok(SimpleNicRx {
            slot_idx: slot_idx as u32,
            len: d.get(RX_LEN) as u32,
        })
    }
    /// Byte offset of the frame in the RX buffer.
    pub const fn buffer_offset(&self) -> u32 {
        self.slot_idx * RX_SLOT_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_two_mib_of_2048_byte_slots() {
        assert_eq!(RX_BUFFER_SIZE, 2 << 20);
        assert_eq!(
            SimpleNicRx {
                slot_idx: 1023,
                len: 0
            }
            .buffer_offset(),
            (2 << 20) - 2048
        );
    }

    #[test]
    fn rx_accepts_either_extended_bit_and_rejects_bad_slots() {
        let rx = SimpleNicRx {
            slot_idx: 5,
            len: 90,
        };
        let mut d = rx.encode();
        assert_eq!(SimpleNicRx::decode(&d), Ok(rx));
        d.set_is_extended_op_code(false);
        assert_eq!(SimpleNicRx::decode(&d), Ok(rx));
        d.set_bits(160, 32, 1024);
        assert_eq!(
            SimpleNicRx::decode(&d),
            Err(DescError::InvalidField {
                desc: DescKind::SimpleNicRx,
                field: "slot_idx",
                raw: 1024
            })
        );
        d.set_op_code(1);
        assert_eq!(
            SimpleNicRx::decode(&d),
            Err(DescError::UnknownOpCode {
                desc: DescKind::SimpleNicRx,
                raw: 1
            })
        );
    }
}
