//! Protection domains: numbers 1..=255 in a bitmap (0 is never handed out, the card's "no
//! PD").

use super::error::VerbsError;
use super::{Device, Platform, Storage};

/// Which protection domains are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PdTable {
    used: [u64; 4],
}

impl Default for PdTable {
    #[inline]
    fn default() -> Self {
        // PD 0 is reserved.
        PdTable { used: [1, 0, 0, 0] }
    }
}

impl PdTable {
    #[inline]
    fn bit(pd: u32) -> Option<(usize, u64)> {
        let w = (pd / 64) as usize;
        (w < 4).then_some((w, 1u64 << (pd % 64)))
    }

    /// Allocates the lowest free PD.
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let (w, word) = self
            .used
            .iter_mut()
            .enumerate()
            .find(|(_, word)| **word != u64::MAX)?;
        let bit = (!*word).trailing_zeros();
        *word |= 1 << bit;
        Some(w as u32 * 64 + bit)
    }

    /// Whether `pd` is allocated.
    #[inline]
    pub(crate) fn contains(&self, pd: u32) -> bool {
        pd != 0 && Self::bit(pd).is_some_and(|(w, b)| self.used[w] & b != 0)
    }

    /// Frees `pd`.
    #[inline]
    pub(crate) fn free(&mut self, pd: u32) {
        if let (true, Some((w, b))) = (pd != 0, Self::bit(pd)) {
            self.used[w] &= !b;
        }
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Allocates a protection domain (1..=255).
    pub fn alloc_pd(&mut self) -> Result<u32, VerbsError> {
        self.pds.alloc().ok_or(VerbsError::OutOfResources {
            what: "protection domains",
        })
    }

    /// Frees a protection domain; refused while an MR or QP uses it.
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), VerbsError> {
        self.check_pd(pd)?;
        let s = self.storage.slices();
        if s.mrs.iter().any(|m| m.pd_in_use() == Some(pd))
            || s.qps.iter().any(|q| q.in_use() && q.attrs.pd == pd)
        {
            return Err(VerbsError::Busy { what: "PD" });
        }
        self.pds.free(pd);
        Ok(())
    }

    pub(crate) fn check_pd(&self, pd: u32) -> Result<(), VerbsError> {
        if self.pds.contains(pd) {
            Ok(())
        } else {
            Err(VerbsError::NoSuchObject {
                what: "PD",
                handle: pd,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pds_are_1_to_255_and_reused_after_free() {
        let mut t = PdTable::default();
        assert!(!t.contains(0));
        let all: heapless::Vec<u32, 256> = core::iter::from_fn(|| t.alloc()).collect();
        assert_eq!(all.len(), 255);
        assert_eq!((all[0], all[254]), (1, 255));
        t.free(77);
        assert!(!t.contains(77) && t.contains(78));
        assert_eq!(t.alloc(), Some(77));
        t.free(0);
        t.free(4000);
        assert!(!t.contains(0) && !t.contains(4000));
    }
}
