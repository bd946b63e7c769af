//! Page-table (PGT) entries and the staging buffer of an UpdatePGT command
//! (layout-verification.md 1.2 UpdatePGT, 1.7 and section 5 "PGT entry"; hardware-contract.md
//! correction 7; background reference-driver.md 2.10).
//!
//! UpdatePGT makes the card read `entry_count` little-endian u64 page base addresses from
//! `dma_addr`. The RTL asserts that `dma_addr` is 512-byte aligned, that the read does not
//! cross 4 KiB and that it is at most 512 bytes (64 entries); the driver stages at most 16.

use super::cmd::{UpdatePgt, MAX_PGT_ENTRIES};
use super::DescError;
use crate::addr::DeviceAddr;
use crate::keys::PGT_LEN;

/// Bytes per staged entry.
pub const PGT_ENTRY_SIZE: usize = 8;
/// Entries the driver puts in one UpdatePGT (the card accepts up to [`MAX_PGT_ENTRIES`]).
pub const DRIVER_ENTRIES_PER_UPDATE: usize = 16;
/// Required alignment of the staging buffer's device address.
pub const STAGING_ALIGN: u64 = 512;
/// The staged entries must not cross a boundary of this size.
pub const STAGING_BOUNDARY: u64 = 4096;

/// One page-table entry: the device address of a page base. The RTL keeps only bits
/// 47..21 ([`PgtEntry::rtl_page_number`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PgtEntry(pub DeviceAddr);

impl PgtEntry {
    /// The 8 bytes as staged (u64 little-endian).
    #[inline]
    pub const fn encode(self) -> [u8; PGT_ENTRY_SIZE] {
        self.0.get().to_le_bytes()
    }
    /// From the 8 staged bytes.
    #[inline]
    pub const fn decode(bytes: [u8; PGT_ENTRY_SIZE]) -> Self {
        PgtEntry(DeviceAddr(u64::from_le_bytes(bytes)))
    }
    /// The 27-bit page number the RTL stores (`PA[47:21]`, 2 MiB pages).
    #[inline]
    pub const fn rtl_page_number(self) -> u32 {
        ((self.0.get() >> 21) & ((1 << 27) - 1)) as u32
    }
}

/// Checks the card's rules for reading `entry_count` entries at `dma_addr` (correction 7):
/// count 1..=64, 512-byte alignment, no 4 KiB crossing.
pub fn check_staging(dma_addr: DeviceAddr, entry_count: u32) -> Result<(), DescError> {
    if entry_count == 0 || entry_count > MAX_PGT_ENTRIES {
        return Err(DescError::PgtEntryCount {
            count: entry_count.into(),
            max: MAX_PGT_ENTRIES.into(),
        });
    }
    if dma_addr.get() % STAGING_ALIGN != 0 {
        return Err(DescError::PgtMisaligned { dma_addr });
    }
    let bytes = u64::from(entry_count) * PGT_ENTRY_SIZE as u64;
    // Unreachable with 512-byte alignment and <= 512 bytes; kept so that raising
    // MAX_PGT_ENTRIES (the 4 KiB Xilinx build) keeps the rule.
    if dma_addr.get() % STAGING_BOUNDARY + bytes > STAGING_BOUNDARY {
        return Err(DescError::PgtCrosses4K { dma_addr, bytes });
    }
    Ok(())
}

impl UpdatePgt {
    /// [`check_staging`] for this command's `dma_addr` and `entry_count`.
    pub fn check_staging(&self) -> Result<(), DescError> {
        check_staging(self.dma_addr, self.entry_count)
    }
}

/// Writes `entries` to the staging buffer `buf` (whose device address is `buf_addr`) and
/// returns the UpdatePGT command that makes the card copy them to PGT
/// `start_index..start_index + entries.len()`.
///
/// Errors: 0 or more than [`DRIVER_ENTRIES_PER_UPDATE`] entries, a range past the page
/// table, a staging address the card rejects ([`check_staging`]), `buf` too short. Nothing
/// is written on error.
pub fn stage_pgt_update(
    buf: &mut [u8],
    buf_addr: DeviceAddr,
    start_index: u32,
    entries: &[DeviceAddr],
) -> Result<UpdatePgt, DescError> {
    let count = entries.len();
    if count == 0 || count > DRIVER_ENTRIES_PER_UPDATE {
        return Err(DescError::PgtEntryCount {
            count: count as u64,
            max: DRIVER_ENTRIES_PER_UPDATE as u64,
        });
    }
    // count <= 16, so the cast is exact.
    let count = count as u32;
    match start_index.checked_add(count) {
        Some(end) if end <= PGT_LEN => {}
        _ => return Err(DescError::PgtIndexRange { start_index, count }),
    }
    check_staging(buf_addr, count)?;
    let needed = entries.len() * PGT_ENTRY_SIZE;
    let Some(dst) = buf.get_mut(..needed) else {
        return Err(DescError::BufferTooSmall {
            needed,
            len: buf.len(),
        });
    };
    for (slot, &addr) in dst.chunks_exact_mut(PGT_ENTRY_SIZE).zip(entries) {
        slot.copy_from_slice(&PgtEntry(addr).encode());
    }
    Ok(UpdatePgt {
        dma_addr: buf_addr,
        start_index,
        entry_count: count,
    })
}

/// The entries staged in `bytes` (the card's side of UpdatePGT): the first
/// `entry_count` u64 LE values. Error: `bytes` shorter than `entry_count * 8`.
pub fn staged_entries(
    bytes: &[u8],
    entry_count: u32,
) -> Result<impl Iterator<Item = PgtEntry> + '_, DescError> {
    let needed = (entry_count as usize).saturating_mul(PGT_ENTRY_SIZE);
    let Some(src) = bytes.get(..needed) else {
        return Err(DescError::BufferTooSmall {
            needed,
            len: bytes.len(),
        });
    };
    Ok(src.chunks_exact(PGT_ENTRY_SIZE).map(|c| {
        let mut b = [0u8; PGT_ENTRY_SIZE];
        b.copy_from_slice(c);
        PgtEntry::decode(b)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_rules_follow_correction_7() {
        assert_eq!(check_staging(DeviceAddr(0x1000), 64), Ok(()));
        assert_eq!(check_staging(DeviceAddr(0x1E00), 64), Ok(()));
        assert_eq!(
            check_staging(DeviceAddr(0x1008), 1),
            Err(DescError::PgtMisaligned {
                dma_addr: DeviceAddr(0x1008)
            })
        );
        assert_eq!(
            check_staging(DeviceAddr(0x1000), 65),
            Err(DescError::PgtEntryCount { count: 65, max: 64 })
        );
        assert_eq!(
            check_staging(DeviceAddr(0x1000), 0),
            Err(DescError::PgtEntryCount { count: 0, max: 64 })
        );
    }

    #[test]
    fn stage_writes_le_entries_and_returns_the_command() {
        let mut buf = [0xEEu8; 256];
        let entries = [DeviceAddr(0x1_2340_0000), DeviceAddr(0x1_2360_0000)];
        let cmd = stage_pgt_update(&mut buf, DeviceAddr(0x8000_0200), 7, &entries).unwrap();
        assert_eq!(
            cmd,
            UpdatePgt {
                dma_addr: DeviceAddr(0x8000_0200),
                start_index: 7,
                entry_count: 2
            }
        );
        assert_eq!(&buf[..8], &[0x00, 0x00, 0x40, 0x23, 0x01, 0, 0, 0]);
        assert_eq!(&buf[8..16], &[0x00, 0x00, 0x60, 0x23, 0x01, 0, 0, 0]);
        assert_eq!(buf[16], 0xEE, "nothing past the entries is touched");
        let back: heapless::Vec<PgtEntry, 4> = staged_entries(&buf, 2).unwrap().collect();
        assert_eq!(&back[..], &[PgtEntry(entries[0]), PgtEntry(entries[1])]);
    }

    #[test]
    fn stage_rejects_bad_requests_without_writing() {
        let mut buf = [0u8; 64];
        let one = [DeviceAddr(0x20_0000)];
        let seventeen = [DeviceAddr(0); 17];
        assert_eq!(
            stage_pgt_update(&mut buf, DeviceAddr(0x1000), 0, &seventeen),
            Err(DescError::PgtEntryCount { count: 17, max: 16 })
        );
        assert_eq!(
            stage_pgt_update(&mut buf, DeviceAddr(0x1000), 0, &[]),
            Err(DescError::PgtEntryCount { count: 0, max: 16 })
        );
        assert_eq!(
            stage_pgt_update(&mut buf, DeviceAddr(0x1000), PGT_LEN, &one),
            Err(DescError::PgtIndexRange {
                start_index: PGT_LEN,
                count: 1
            })
        );
        assert_eq!(
            stage_pgt_update(&mut buf, DeviceAddr(0x1100), 0, &one),
            Err(DescError::PgtMisaligned {
                dma_addr: DeviceAddr(0x1100)
            })
        );
        assert_eq!(
            stage_pgt_update(&mut buf[..7], DeviceAddr(0x1000), 0, &one),
            Err(DescError::BufferTooSmall { needed: 8, len: 7 })
        );
        assert_eq!(buf, [0u8; 64]);
        assert!(matches!(
            staged_entries(&buf, 9),
            Err(DescError::BufferTooSmall {
                needed: 72,
                len: 64
            })
        ));
    }

    #[test]
    fn entry_golden_vector_and_rtl_page_number() {
        let e = PgtEntry(DeviceAddr(0x0000_0001_2340_0000));
        assert_eq!(e.encode(), [0x00, 0x00, 0x40, 0x23, 0x01, 0x00, 0x00, 0x00]);
        assert_eq!(PgtEntry::decode(e.encode()), e);
        assert_eq!(e.rtl_page_number(), 0x91A);
    }
}
