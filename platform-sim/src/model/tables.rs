//! The card's tables: MR table, page table (PGT) and QP contexts (nic-behaviour.md 5.1-5.3,
//! 2.5), with translation of a virtual range to device-address pieces.

use bluerdma_core::addr::{DeviceAddr, PageSize};
use bluerdma_core::keys::{MR_TABLE_LEN, PGT_LEN, QP_TABLE_LEN};
use bluerdma_core::mtu::Pmtu;

/// ibv_access_flags bits the card checks.
pub mod access {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub const LOCAL_WRITE: u8 = 1;
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: u8 = 2;
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: u8 = 4;
}

/// One MR table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrEntry {
    /// Whether the entry is valid (UpdateMrTable with a non-zero length).
    pub valid: bool,
    /// Virtual address of the MR's first byte.
    pub base_va: u64,
    /// Length in bytes.
    pub length: u32,
    /// ibv_access_flags (low 8 bits).
    pub acc_flags: u8,
    /// First PGT index of the MR.
    pub pgt_offset: u32,
    /// The key byte (`mr_key & 0xFF`).
    pub key: u8,
    /// The PD handle the driver put in the reserved field (checked only in strict mode).
    pub pd: u32,
}

/// One QP context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpContext {
    /// Whether the entry is valid (ManageQp with is_valid = 1).
    pub valid: bool,
    /// The QPN key byte.
    pub key: u8,
    /// ibv_qp_type as stored (never read by the RTL).
    pub qp_type: u8,
    /// Access flags checked on receive.
    pub rq_access_flags: u8,
    /// The QP's path MTU (FIRST packet length on receive).
    pub pmtu: Option<Pmtu>,
    /// The peer's QPN (hardware NAKs).
    pub peer_qpn: u32,
    /// The peer's MAC, 48-bit numeric (hardware NAKs).
    pub peer_mac: u64,
    /// The peer's IPv4 address, numeric (hardware NAKs).
    pub peer_ip: u32,
    /// UDP source port of hardware NAKs.
    pub local_udp_port: u16,
}

/// Why a translation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TranslateError {
    /// The MR entry of the key's index is invalid.
    InvalidMr,
    /// The MR's key byte differs from the key's.
    KeyMismatch,
    /// The range is not inside the MR.
    OutOfBounds,
}

/// The card's tables.
pub struct Tables {
    mrs: Vec<MrEntry>,
    pgt: Vec<u64>,
    qps: Vec<QpContext>,
    page: PageSize,
}

impl Tables {
    /// Empty tables for a card with translation pages of `page`.
    pub fn new(page: PageSize) -> Self {
        Self {
            mrs: vec![MrEntry::default(); MR_TABLE_LEN as usize],
            pgt: vec![0; PGT_LEN as usize],
            qps: vec![QpContext::default(); QP_TABLE_LEN as usize],
            page,
        }
    }

    /// How many QP contexts and MR entries are valid (what a process that shared the card
    /// and died must not leave behind).
    pub fn valid_counts(&self) -> (usize, usize) {
        (
            self.qps.iter().filter(|q| q.valid).count(),
            self.mrs.iter().filter(|m| m.valid).count(),
        )
    }

    /// The translation page size.
    pub fn page_size(&self) -> PageSize {
        self.page
    }

    /// The MR entry for table index `index` (masked to the table size, as the RTL does).
    pub fn mr(&self, index: u32) -> &MrEntry {
        &self.mrs[(index % MR_TABLE_LEN) as usize]
    }

    /// Mutable MR entry for `index` (masked).
    pub fn mr_mut(&mut self, index: u32) -> &mut MrEntry {
        &mut self.mrs[(index % MR_TABLE_LEN) as usize]
    }

    /// The QP context for table index `index` (masked).
    pub fn qp(&self, index: u32) -> &QpContext {
        &self.qps[(index % QP_TABLE_LEN) as usize]
    }

    /// Mutable QP context for `index` (masked).
    pub fn qp_mut(&mut self, index: u32) -> &mut QpContext {
        &mut self.qps[(index % QP_TABLE_LEN) as usize]
    }

    /// Stores PGT entry `index` (masked to 17 bits). Only the page-frame bits are kept, as
    /// the RTL keeps bits 47..21 for 2 MiB pages.
    pub fn set_pgt(&mut self, index: u32, entry: u64) {
        let frame_mask = ((1u64 << 48) - 1) & !(self.page.bytes() - 1);
        self.pgt[(index % PGT_LEN) as usize] = entry & frame_mask;
    }

    /// PGT entry `index` (masked).
    pub fn pgt(&self, index: u32) -> u64 {
        self.pgt[(index % PGT_LEN) as usize]
    }

    /// Checks that `[va, va + len)` lies inside the MR of `key` (full-width arithmetic; the
    /// RTL's 33-bit compare is a hardware limit the driver avoids).
    pub fn check_bounds(&self, key: u32, va: u64, len: u64) -> Result<&MrEntry, TranslateError> {
        let mr = self.mr(key >> 8);
        if !mr.valid {
            return Err(TranslateError::InvalidMr);
        }
        if mr.key != key as u8 {
            return Err(TranslateError::KeyMismatch);
        }
        let off = va
            .checked_sub(mr.base_va)
            .ok_or(TranslateError::OutOfBounds)?;
        match off.checked_add(len) {
            Some(end) if end <= mr.length as u64 => Ok(mr),
            _ => Err(TranslateError::OutOfBounds),
        }
    }

    /// Translates `[va, va + len)` of the MR with table index `mr_index` into device-address
    /// pieces that never cross a page, calling `f(device_addr, offset_in_range, piece_len)`.
    /// The caller has checked bounds (or, on transmit, the card checks nothing).
    pub fn translate(
        &self,
        mr_index: u32,
        va: u64,
        len: u64,
        mut f: impl FnMut(DeviceAddr, u64, u64),
    ) {
        let mr = self.mr(mr_index);
        let shift = self.page.shift();
        let page = self.page.bytes();
        let mut done = 0u64;
        while done < len {
            let cur = va.wrapping_add(done);
            let in_page = cur & (page - 1);
            let piece = (page - in_page).min(len - done);
            let rel_pages = (cur >> shift).wrapping_sub(mr.base_va >> shift);
            let idx = (mr.pgt_offset as u64).wrapping_add(rel_pages) % PGT_LEN as u64;
            let dev = self.pgt[idx as usize] | in_page;
            f(DeviceAddr(dev), done, piece);
            done += piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translation_follows_the_page_table_for_unaligned_bases() {
        let mut t = Tables::new(PageSize::Size2M);
        let base = 0x7f00_0010_0000u64; // 1 MiB into a 2 MiB page
        *t.mr_mut(5) = MrEntry {
            valid: true,
            base_va: base,
            length: 4 << 20,
            acc_flags: access::REMOTE_WRITE | access::LOCAL_WRITE,
            pgt_offset: 100,
            key: 0xA5,
            pd: 1,
        };
        // The MR spans three 2 MiB pages; frames are deliberately not contiguous.
        t.set_pgt(100, 0x4000_0000);
        t.set_pgt(101, 0x1000_0000);
        t.set_pgt(102, 0x2000_0000 | 0x1234); // low bits are dropped, as in the RTL
        let mut pieces = Vec::new();
        t.translate(5, base + (1 << 20) - 8, 16, |d, off, len| {
            pieces.push((d.0, off, len))
        });
        assert_eq!(
            pieces,
            vec![(0x4000_0000 + (2 << 20) - 8, 0, 8), (0x1000_0000, 8, 8)]
        );
        assert_eq!(t.pgt(102), 0x2000_0000);
        assert!(t.check_bounds((5 << 8) | 0xA5, base, 4 << 20).is_ok());
        assert_eq!(
            t.check_bounds((5 << 8) | 0xA5, base, (4 << 20) + 1)
                .unwrap_err(),
            TranslateError::OutOfBounds
        );
        assert_eq!(
            t.check_bounds((5 << 8) | 0xA5, base - 1, 1).unwrap_err(),
            TranslateError::OutOfBounds
        );
        assert_eq!(
            t.check_bounds((5 << 8) | 0xA6, base, 1).unwrap_err(),
            TranslateError::KeyMismatch
        );
        assert_eq!(
            t.check_bounds((6 << 8) | 0xA5, base, 1).unwrap_err(),
            TranslateError::InvalidMr
        );
        assert_eq!(
            t.check_bounds((5 << 8) | 0xA5, u64::MAX, 2).unwrap_err(),
            TranslateError::OutOfBounds
        );
    }
}
