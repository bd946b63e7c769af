//! The one error type of every descriptor decoder (and of the PGT staging checks): it names
//! the descriptor, the field and the raw value, so a bad descriptor read from the card can
//! be logged and counted instead of panicking (hardware-contract.md decision 3).

use core::fmt;

use crate::addr::DeviceAddr;

/// Which descriptor (or which part of a pair) an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DescKind {
    /// A command request whose op code is not known yet.
    CmdRequest,
    /// UpdateMrTable command request.
    UpdateMrTable,
    /// UpdatePGT command request.
    UpdatePgt,
    /// QpManagement command request.
    ManageQp,
    /// SetNetworkParam command request.
    SetNetworkParam,
    /// SetRawPacketReceiveMeta command request.
    SetRawPacketReceiveMeta,
    /// Command response.
    CmdResponse,
    /// Send request, first descriptor.
    SendSeg0,
    /// Send request, second descriptor.
    SendSeg1,
    /// Meta report, first descriptor of any kind (before its op code is known).
    MetaReport,
    /// Meta report: PacketBasicInfo.
    PacketInfo,
    /// Meta report: ReadReqExtendInfo (second descriptor of a READ request).
    ReadReqExt,
    /// Meta report: Ack.
    Ack,
    /// Meta report: AckExtra (second descriptor of a NAK).
    AckExtra,
    /// Simple-NIC transmit descriptor.
    SimpleNicTx,
    /// Simple-NIC receive descriptor.
    SimpleNicRx,
    /// The page-table staging buffer of an UpdatePGT command.
    PgtStaging,
}

impl DescKind {
    /// The name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            DescKind::CmdRequest => "command request",
            DescKind::UpdateMrTable => "UpdateMrTable",
            DescKind::UpdatePgt => "UpdatePGT",
            DescKind::ManageQp => "ManageQp",
            DescKind::SetNetworkParam => "SetNetworkParam",
            DescKind::SetRawPacketReceiveMeta => "SetRawPacketReceiveMeta",
            DescKind::CmdResponse => "command response",
            DescKind::SendSeg0 => "send Seg0",
            DescKind::SendSeg1 => "send Seg1",
            DescKind::MetaReport => "meta report",
            DescKind::PacketInfo => "PacketBasicInfo",
            DescKind::ReadReqExt => "ReadReqExtendInfo",
            DescKind::Ack => "Ack",
            DescKind::AckExtra => "AckExtra",
            DescKind::SimpleNicTx => "simple-NIC TX",
            DescKind::SimpleNicRx => "simple-NIC RX",
            DescKind::PgtStaging => "PGT staging buffer",
        }
    }
}

impl fmt::Display for DescKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is wrong with a descriptor (or a pair, or a PGT staging buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DescError {
    /// The op code is not one this descriptor family defines or the codec supports.
    UnknownOpCode {
        /// The descriptor.
        desc: DescKind,
        /// The op_code byte as read.
        raw: u8,
    },
    /// A field holds a value outside its domain.
    InvalidField {
        /// The descriptor.
        desc: DescKind,
        /// The field name as in the layout tables.
        field: &'static str,
        /// The raw field value.
        raw: u64,
    },
    /// The descriptor's has_next bit is not what its position requires.
    UnexpectedHasNext {
        /// The descriptor.
        desc: DescKind,
        /// The has_next bit as read.
        has_next: bool,
    },
    /// The first descriptor announces (or, for a READ request, requires) a second one and
    /// none was given.
    MissingSecond {
        /// The first descriptor.
        first: DescKind,
    },
    /// A second descriptor was given but the first has has_next = 0.
    UnexpectedSecond {
        /// The first descriptor.
        first: DescKind,
    },
    /// The second descriptor does not belong to the first (its op code differs).
    PairMismatch {
        /// The second descriptor as the first one expects it.
        second: DescKind,
        /// The op code of the first descriptor.
        first_op: u8,
        /// The op code of the second descriptor.
        second_op: u8,
    },
    /// A PGT update with a number of entries the card does not accept.
    PgtEntryCount {
        /// The number of entries.
        count: u64,
        /// The largest accepted count.
        max: u64,
    },
    /// `start_index + count` runs past the card's page table.
    PgtIndexRange {
        /// The first PGT index.
        start_index: u32,
        /// The number of entries.
        count: u32,
    },
    /// The staging buffer's device address is not 512-byte aligned (correction 7).
    PgtMisaligned {
        /// The staging buffer's device address.
        dma_addr: DeviceAddr,
    },
    /// The staged entries would cross a 4 KiB boundary (correction 7).
    PgtCrosses4K {
        /// The staging buffer's device address.
        dma_addr: DeviceAddr,
        /// The number of bytes of entries.
        bytes: u64,
    },
    /// A byte buffer is shorter than the data that must be written to or read from it.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        len: usize,
    },
}

impl fmt::Display for DescError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DescError::UnknownOpCode { desc, raw } => {
                write!(f, "{desc}: unknown or unsupported op code {raw:#04x}")
            }
            DescError::InvalidField { desc, field, raw } => {
                write!(f, "{desc}: invalid {field} {raw:#x}")
            }
            DescError::UnexpectedHasNext { desc, has_next } => {
                write!(f, "{desc}: has_next = {} is not allowed here", has_next as u8)
            }
            DescError::MissingSecond { first } => {
                write!(f, "{first}: the second descriptor of the pair is missing")
            }
            DescError::UnexpectedSecond { first } => {
                write!(f, "{first}: has_next = 0 but a second descriptor was given")
            }
            DescError::PairMismatch {
                second,
                first_op,
                second_op,
            } => write!(
                f,
                "{second}: op code {second_op:#04x} does not match the first descriptor's {first_op:#04x}"
            ),
            DescError::PgtEntryCount { count, max } => {
                write!(f, "UpdatePGT: entry count {count} outside 1..={max}")
            }
            DescError::PgtIndexRange { start_index, count } => write!(
                f,
                "UpdatePGT: entries {start_index}..{start_index}+{count} run past the page table"
            ),
            DescError::PgtMisaligned { dma_addr } => {
                write!(f, "UpdatePGT: dma_addr {:#x} is not 512-byte aligned", dma_addr.get())
            }
            DescError::PgtCrosses4K { dma_addr, bytes } => write!(
                f,
                "UpdatePGT: {bytes} bytes at dma_addr {:#x} cross a 4 KiB boundary",
                dma_addr.get()
            ),
            DescError::BufferTooSmall { needed, len } => {
                write!(f, "buffer of {len} bytes, {needed} needed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn messages_name_descriptor_field_and_value() {
        let e = DescError::InvalidField {
            desc: DescKind::ManageQp,
            field: "pmtu",
            raw: 7,
        };
        assert_eq!(e.to_string(), "ManageQp: invalid pmtu 0x7");
        let e = DescError::UnknownOpCode {
            desc: DescKind::MetaReport,
            raw: 0x12,
        };
        assert_eq!(
            e.to_string(),
            "meta report: unknown or unsupported op code 0x12"
        );
        let e = DescError::PairMismatch {
            second: DescKind::AckExtra,
            first_op: 0x11,
            second_op: 0x0c,
        };
        assert!(e.to_string().contains("0x0c"));
    }
}
