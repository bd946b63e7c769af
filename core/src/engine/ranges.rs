//! Contiguous ranges of the device's shared tables, handed to objects at creation: the
//! page-table entries of an MR, a QP's send queue in the WQE table, a CQ's ring in the
//! completion table. One first-fit bitmap ([`RunMap`]) serves all three, and [`Carver`]
//! puts a table of any length on a bitmap of fixed size by handing out blocks of entries.

/// A first-fit allocator of runs of `WORDS * 64` units (one bit each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunMap<const WORDS: usize> {
    used: [u64; WORDS],
    /// Units that exist (the rest of the bitmap is never handed out).
    units: u32,
}

impl<const WORDS: usize> RunMap<WORDS> {
    /// A map of `units` free units (at most `WORDS * 64`).
    pub(crate) const fn new(units: u32) -> Self {
        let max = (WORDS * 64) as u32;
        RunMap {
            used: [0; WORDS],
            units: if units < max { units } else { max },
        }
    }

    fn is_used(&self, i: u32) -> bool {
        self.used[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Takes the first run of `n` free units; `None` if there is none (or `n` is 0).
    pub(crate) fn alloc(&mut self, n: u32) -> Option<u32> {
        if n == 0 || n > self.units {
            return None;
        }
        let (mut i, mut run) = (0u32, 0u32);
        while i < self.units {
            // Whole words at once where they are full (or empty and the run fits).
            if i % 64 == 0 && i + 64 <= self.units {
                let word = self.used[(i / 64) as usize];
                if word == u64::MAX {
                    run = 0;
                    i += 64;
                    continue;
                }
                if word == 0 && run + 64 < n {
                    run += 64;
                    i += 64;
                    continue;
                }
            }
            if self.is_used(i) {
                run = 0;
            } else {
                run += 1;
                if run == n {
                    let start = i + 1 - n;
                    self.mark(start, n, true);
                    return Some(start);
                }
            }
            i += 1;
        }
        None
    }

    /// Gives back `n` units from `start`.
    pub(crate) fn free(&mut self, start: u32, n: u32) {
        self.mark(start, n, false);
    }

    /// Whether all `n` units from `start` are free.
    pub(crate) fn is_free(&self, start: u32, n: u32) -> bool {
        start.checked_add(n).is_some_and(|end| end <= self.units)
            && (start..start + n).all(|i| !self.is_used(i))
    }

    /// Takes `n` units from `start` (they must be free: see [`RunMap::is_free`]).
    pub(crate) fn take(&mut self, start: u32, n: u32) {
        self.mark(start, n, true);
    }

    fn mark(&mut self, start: u32, n: u32, used: bool) {
        for i in start..start.saturating_add(n).min(self.units) {
            let (w, b) = ((i / 64) as usize, i % 64);
            if used {
                self.used[w] |= 1 << b;
            } else {
                self.used[w] &= !(1 << b);
            }
        }
    }
}

/// Blocks of a shared table of any length on a bitmap of 4096 blocks.
pub(crate) const CARVER_BLOCKS: usize = 4096;

/// A range of a shared table: its first entry and its length (whole blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) base: u32,
    pub(crate) len: u32,
}

/// Hands out ranges of a table of `entries` entries, in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Carver {
    map: RunMap<{ CARVER_BLOCKS / 64 }>,
    block: u32,
}

impl Carver {
    /// A carver for a table of `entries` entries.
    pub(crate) fn new(entries: usize) -> Self {
        let entries = entries.min(u32::MAX as usize) as u32;
        let block = entries.div_ceil(CARVER_BLOCKS as u32).max(1);
        Carver {
            map: RunMap::new(entries / block),
            block,
        }
    }

    fn blocks(&self, entries: u32) -> u32 {
        entries.div_ceil(self.block)
    }

    /// A free range of at least `entries` entries.
    pub(crate) fn alloc(&mut self, entries: u32) -> Option<Range> {
        let n = self.blocks(entries.max(1));
        let start = self.map.alloc(n)?;
        Some(Range {
            base: start * self.block,
            len: n * self.block,
        })
    }

    /// Gives `r` back.
    pub(crate) fn free(&mut self, r: Range) {
        if r.len > 0 {
            self.map.free(r.base / self.block, r.len / self.block);
        }
    }

    /// `r` grown or shrunk in place to at least `entries` entries, if the blocks after it
    /// are free (shrinking always succeeds); `None` leaves `r` as it was.
    pub(crate) fn resize_in_place(&mut self, r: Range, entries: u32) -> Option<Range> {
        let (start, have, want) = (
            r.base / self.block,
            r.len / self.block,
            self.blocks(entries.max(1)),
        );
        if want > have {
            if !self.map.is_free(start + have, want - have) {
                return None;
            }
            self.map.take(start + have, want - have);
        } else {
            self.map.free(start + want, have - want);
        }
        Some(Range {
            base: r.base,
            len: want * self.block,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_first_fit_and_reused_after_free() {
        let mut m = RunMap::<2>::new(100);
        assert_eq!(m.alloc(10), Some(0));
        assert_eq!(m.alloc(70), Some(10));
        assert_eq!(m.alloc(30), None, "20 left");
        assert_eq!(m.alloc(20), Some(80));
        m.free(10, 70);
        assert_eq!(m.alloc(64), Some(10));
        assert_eq!(m.alloc(7), None);
        assert_eq!(m.alloc(6), Some(74));
        assert_eq!(m.alloc(0), None);
        assert!(!m.is_free(95, 10), "past the end");
    }

    #[test]
    fn a_run_may_cross_whole_empty_words() {
        let mut m = RunMap::<4>::new(256);
        assert_eq!(m.alloc(3), Some(0));
        assert_eq!(m.alloc(200), Some(3));
        m.free(3, 200);
        assert_eq!(m.alloc(253), Some(3));
    }

    #[test]
    fn a_carver_hands_out_whole_blocks_of_its_table() {
        let mut c = Carver::new(4096 * 16);
        let a = c.alloc(1).unwrap();
        assert_eq!(a, Range { base: 0, len: 16 });
        let b = c.alloc(4100).unwrap();
        assert_eq!((b.base, b.len), (16, 4112));
        assert_eq!(c.resize_in_place(a, 40), None, "b follows a");
        c.free(b);
        let a2 = c.resize_in_place(a, 40).unwrap();
        assert_eq!(a2, Range { base: 0, len: 48 });
        let a3 = c.resize_in_place(a2, 5).unwrap();
        assert_eq!(a3.len, 16);
        assert_eq!(c.alloc(4096 * 16 - 16).map(|r| r.base), Some(16));
        assert!(c.alloc(1).is_none());
        // A small table (firmware): one entry per block.
        let mut f = Carver::new(8);
        assert_eq!(f.alloc(8), Some(Range { base: 0, len: 8 }));
        assert!(f.alloc(1).is_none());
    }
}
