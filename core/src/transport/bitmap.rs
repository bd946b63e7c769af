//! A fixed-size PSN bitmap anchored at a base PSN, without allocation.
//!
//! The driver keeps one per QP and direction: on the receive side it records which PSNs
//! arrived (from the card's packet reports and bitmap reports), on the send side which PSNs
//! the peer acknowledged. Bit `i` stands for PSN `base + i` (modulo 2^24); every PSN before
//! the base counts as set. [`PsnBitmap::advance`] shifts out the leading run of set bits,
//! so the base is always the first PSN still missing (the cumulative ACK point).
//!
//! The card's own bitmaps are 128 bits wide, 16-PSN strides, and anchored differently: the
//! PSN it reports (`psn_now`) is the first PSN of the newest stride, which sits at bit 112
//! (nic-behaviour.md 3.3 and 3.6; reference-driver.md 1.6 (f)). [`card_bitmap_base`] turns
//! such a report into the PSN of its bit 0, and [`PsnBitmap::merge_card_report`] merges it.

use core::fmt;

use super::psn::{Psn, PsnRange, PSN_HALF};

/// Width of the bitmaps the card reports and puts in NAK frames (nic-behaviour.md 3.1).
pub const CARD_BITMAP_BITS: u32 = 128;
/// The card tracks PSNs in strides of this many (nic-behaviour.md 3.1).
pub const CARD_STRIDE: u32 = 16;
/// Bit of a card bitmap that stands for its `psn_now`: the newest stride occupies bits
/// 112..127, so `psn_now` is 128 - 16 = 112 PSNs above bit 0.
pub const CARD_PSN_NOW_BIT: u32 = CARD_BITMAP_BITS - CARD_STRIDE;

/// The PSN of bit 0 of a bitmap that the card generated: `psn_now - 112`.
///
/// Applies to locally generated reports (AckLocalHw, NakLocalHw), to NAK packets from a
/// peer's hardware (NakRemoteHw), and to their `psn_before_slide`/`pre_bitmap` pair
/// (nic-behaviour.md 3.6). It does not apply to ACK/NAK frames built by a driver, whose
/// PSN already names bit 0.
pub const fn card_bitmap_base(psn_now: Psn) -> Psn {
    psn_now.wrapping_sub(CARD_PSN_NOW_BIT)
}

/// What [`PsnBitmap::set`] did with one PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// The bit was clear and is now set.
    Set,
    /// The bit was already set (a duplicate).
    AlreadySet,
    /// The PSN is before the base: already counted as set, nothing changed.
    BelowBase,
    /// The PSN is at or beyond the end of the window: not recorded.
    BeyondWindow,
}

/// What a range or bitmap merge did, counted in PSNs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkCounts {
    /// Bits that went from clear to set.
    pub newly_set: u32,
    /// PSNs before the base (already counted as set; nothing changed).
    pub below_base: u32,
    /// PSNs at or beyond the end of the window (not recorded).
    pub beyond_window: u32,
}

/// Where a PSN falls relative to the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Below,
    In(u32),
    Beyond,
}

/// A bitmap of `WORDS * 64` PSNs starting at a base PSN.
///
/// `WORDS * 64` must be at most 2^23 so that "before the base" and "beyond the window" are
/// told apart by signed PSN distance; a larger `WORDS` fails to compile when used.
#[derive(Clone, PartialEq, Eq)]
pub struct PsnBitmap<const WORDS: usize> {
    base: Psn,
    words: [u64; WORDS],
}

impl<const WORDS: usize> PsnBitmap<WORDS> {
    /// Number of PSNs the window covers.
    pub const WINDOW: u32 = {
        assert!(WORDS > 0 && WORDS <= (PSN_HALF / 64) as usize);
        (WORDS * 64) as u32
    };

    /// An empty bitmap whose first missing PSN is `base`.
    pub const fn new(base: Psn) -> Self {
        let _ = Self::WINDOW;
        Self {
            base,
            words: [0; WORDS],
        }
    }

    /// Forgets everything and restarts at `base` (a QP reaching RTR or being reset).
    pub fn reset(&mut self, base: Psn) {
        self.base = base;
        self.words = [0; WORDS];
    }

    /// The base: the PSN of bit 0. After [`Self::advance`] it is the first missing PSN.
    pub const fn base(&self) -> Psn {
        self.base
    }

    /// The PSNs the window covers, `[base, base + WINDOW)`.
    pub const fn window(&self) -> PsnRange {
        PsnRange::new(self.base, Self::WINDOW)
    }

    fn position(&self, psn: Psn) -> Position {
        let d = self.base.distance(psn);
        if d < 0 {
            Position::Below
        } else if (d as u32) < Self::WINDOW {
            Position::In(d as u32)
        } else {
            Position::Beyond
        }
    }

    /// Sets the bit of `psn` and says what happened.
    pub fn set(&mut self, psn: Psn) -> SetOutcome {
        let off = match self.position(psn) {
            Position::Below => return SetOutcome::BelowBase,
            Position::Beyond => return SetOutcome::BeyondWindow,
            Position::In(off) => off,
        };
        let Some(word) = self.words.get_mut((off / 64) as usize) else {
            return SetOutcome::BeyondWindow;
        };
        let bit = 1u64 << (off % 64);
        if *word & bit != 0 {
            SetOutcome::AlreadySet
        } else {
            *word |= bit;
            SetOutcome::Set
        }
    }

    /// `true` if `psn` is recorded: before the base, or in the window with its bit set.
    /// PSNs beyond the window are not set.
    pub fn is_set(&self, psn: Psn) -> bool {
        match self.position(psn) {
            Position::Below => true,
            Position::Beyond => false,
            Position::In(off) => self.bit(off),
        }
    }

    fn bit(&self, off: u32) -> bool {
        self.words
            .get((off / 64) as usize)
            .is_some_and(|w| w & (1u64 << (off % 64)) != 0)
    }

    /// Sets every PSN of `range`. The part before the base and the part beyond the window are
    /// counted, not recorded.
    pub fn set_range(&mut self, range: PsnRange) -> MarkCounts {
        let mut counts = MarkCounts::default();
        // Offsets relative to the base, as i64 so that the part below the base is negative.
        let start = i64::from(self.base.distance(range.start()));
        let end = start + i64::from(range.len());
        let window = i64::from(Self::WINDOW);
        counts.below_base = (end.min(0) - start.min(0)) as u32;
        counts.beyond_window = (end.max(window) - start.max(window)) as u32;
        let lo = start.clamp(0, window) as u32;
        let hi = end.clamp(0, window) as u32;
        let mut off = lo;
        while off < hi {
            let bit = off % 64;
            let n = (hi - off).min(64 - bit);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            counts.newly_set += self.or_word((off / 64) as usize, mask);
            off += n;
        }
        counts
    }

    /// ORs `mask` into word `w`, returning how many bits went from clear to set.
    fn or_word(&mut self, w: usize, mask: u64) -> u32 {
        match self.words.get_mut(w) {
            Some(word) => {
                let new = mask & !*word;
                *word |= mask;
                new.count_ones()
            }
            None => 0,
        }
    }

    /// ORs the 64 bits `v` in at signed offset `off` from the base.
    fn or_u64_at(&mut self, mut off: i64, mut v: u64, counts: &mut MarkCounts) {
        if v == 0 {
            return;
        }
        if off <= -64 {
            counts.below_base += v.count_ones();
            return;
        }
        if off < 0 {
            let s = (-off) as u32;
            counts.below_base += (v & ((1u64 << s) - 1)).count_ones();
            v >>= s;
            off = 0;
        }
        let window = i64::from(Self::WINDOW);
        if off >= window {
            counts.beyond_window += v.count_ones();
            return;
        }
        let w = (off / 64) as usize;
        let b = (off % 64) as u32;
        counts.newly_set += self.or_word(w, v << b);
        if b != 0 {
            let high = v >> (64 - b);
            if w + 1 < WORDS {
                counts.newly_set += self.or_word(w + 1, high);
            } else {
                counts.beyond_window += high.count_ones();
            }
        }
    }

    /// Merges a 128-bit bitmap whose bit `i` (least significant first) stands for PSN
    /// `bitmap_base + i`. Only set bits are merged; clear bits never clear anything.
    pub fn merge_window(&mut self, bitmap_base: Psn, bitmap: u128) -> MarkCounts {
        let mut counts = MarkCounts::default();
        let off = i64::from(self.base.distance(bitmap_base));
        self.or_u64_at(off, bitmap as u64, &mut counts);
        self.or_u64_at(off + 64, (bitmap >> 64) as u64, &mut counts);
        counts
    }

    /// Merges a bitmap the card generated, whose `psn_now` is 112 above bit 0
    /// ([`card_bitmap_base`]).
    pub fn merge_card_report(&mut self, psn_now: Psn, bitmap: u128) -> MarkCounts {
        self.merge_window(card_bitmap_base(psn_now), bitmap)
    }

    /// Offset of the first clear bit at or after `from`, or `WINDOW` if the rest is set.
    fn next_clear(&self, from: u32) -> u32 {
        self.scan(from, |w| !w)
    }

    /// Offset of the first set bit at or after `from`, or `WINDOW` if none.
    fn next_set(&self, from: u32) -> u32 {
        self.scan(from, |w| w)
    }

    fn scan(&self, from: u32, pick: impl Fn(u64) -> u64) -> u32 {
        let first = (from / 64) as usize;
        let mut mask = u64::MAX.checked_shl(from % 64).unwrap_or(0);
        for (i, &w) in self.words.iter().enumerate().skip(first) {
            let hits = pick(w) & mask;
            if hits != 0 {
                return i as u32 * 64 + hits.trailing_zeros();
            }
            mask = u64::MAX;
        }
        Self::WINDOW
    }

    /// The first PSN not yet set (the base plus the leading run of set bits); the end of the
    /// window if every bit is set.
    pub fn first_missing(&self) -> Psn {
        self.base.wrapping_add(self.next_clear(0))
    }

    /// Shifts out the leading run of set bits and returns the new base, the first missing
    /// PSN. Returns the old base unchanged if its bit is clear.
    pub fn advance(&mut self) -> Psn {
        let n = self.next_clear(0);
        self.shift_out(n);
        self.base
    }

    /// Moves the base forward to `psn`, counting every PSN before it as set (a cumulative
    /// ACK). Does nothing if `psn` is not after the base. Bits at and after `psn` keep their
    /// value; call [`Self::advance`] to move past any that are already set.
    pub fn advance_to(&mut self, psn: Psn) -> Psn {
        if psn.is_after(self.base) {
            let n = self.base.forward_distance(psn);
            self.shift_out(n);
        }
        self.base
    }

    /// Drops the first `n` bits, moving the base by `n`.
    fn shift_out(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        let ws = (n / 64) as usize;
        let bs = n % 64;
        for i in 0..WORDS {
            let lo = self.words.get(i + ws).copied().unwrap_or(0);
            let hi = self.words.get(i + ws + 1).copied().unwrap_or(0);
            let v = if bs == 0 {
                lo
            } else {
                (lo >> bs) | (hi << (64 - bs))
            };
            if let Some(w) = self.words.get_mut(i) {
                *w = v;
            }
        }
        self.base = self.base.wrapping_add(n);
    }

    /// The PSNs of `range` that are not set, in order. PSNs before the base are never
    /// missing; PSNs beyond the window always are (nothing is known about them).
    pub fn missing(&self, range: PsnRange) -> Missing<'_, WORDS> {
        let (cur, end) = self.offsets(range);
        Missing {
            bitmap: self,
            cur,
            end,
        }
    }

    /// The maximal runs of missing PSNs in `range`, in order (same rules as
    /// [`Self::missing`]): what a NAK reports and what retransmission resends.
    pub fn missing_runs(&self, range: PsnRange) -> MissingRuns<'_, WORDS> {
        let (cur, end) = self.offsets(range);
        MissingRuns {
            bitmap: self,
            cur,
            end,
        }
    }

    /// The part of `range` at or after the base, as offsets from the base.
    fn offsets(&self, range: PsnRange) -> (u64, u64) {
        let start = i64::from(self.base.distance(range.start()));
        let end = start + i64::from(range.len());
        (start.max(0) as u64, end.max(0) as u64)
    }
}

impl<const WORDS: usize> fmt::Debug for PsnBitmap<WORDS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PsnBitmap {{ base: {}, words: [", self.base)?;
        for (i, w) in self.words.iter().enumerate() {
            if i != 0 {
                f.write_str(", ")?;
            }
            write!(f, "{w:#018x}")?;
        }
        f.write_str("] }")
    }
}

/// Iterator over missing PSNs, from [`PsnBitmap::missing`].
#[derive(Clone, Debug)]
pub struct Missing<'a, const WORDS: usize> {
    bitmap: &'a PsnBitmap<WORDS>,
    cur: u64,
    end: u64,
}

impl<const WORDS: usize> Iterator for Missing<'_, WORDS> {
    type Item = Psn;

    fn next(&mut self) -> Option<Psn> {
        if self.cur < u64::from(PsnBitmap::<WORDS>::WINDOW) {
            self.cur = u64::from(self.bitmap.next_clear(self.cur as u32));
        }
        if self.cur >= self.end {
            return None;
        }
        let psn = self.bitmap.base.wrapping_add(self.cur as u32);
        self.cur += 1;
        Some(psn)
    }
}

/// Iterator over runs of missing PSNs, from [`PsnBitmap::missing_runs`].
#[derive(Clone, Debug)]
pub struct MissingRuns<'a, const WORDS: usize> {
    bitmap: &'a PsnBitmap<WORDS>,
    cur: u64,
    end: u64,
}

impl<const WORDS: usize> Iterator for MissingRuns<'_, WORDS> {
    type Item = PsnRange;

    fn next(&mut self) -> Option<PsnRange> {
        let window = u64::from(PsnBitmap::<WORDS>::WINDOW);
        if self.cur < window {
            self.cur = u64::from(self.bitmap.next_clear(self.cur as u32));
        }
        if self.cur >= self.end {
            return None;
        }
        let start = self.cur;
        let stop = if start < window {
            u64::from(self.bitmap.next_set(start as u32))
        } else {
            self.end
        };
        let stop = if stop == window {
            self.end
        } else {
            stop.min(self.end)
        };
        self.cur = stop;
        let psn = self.bitmap.base.wrapping_add(start as u32);
        Some(PsnRange::new(psn, (stop - start) as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    type Bm = PsnBitmap<2>;

    fn p(v: u32) -> Psn {
        Psn::from_raw(v)
    }

    #[test]
    fn set_reports_each_outcome_at_the_window_edges() {
        let mut b = Bm::new(p(100));
        assert_eq!(b.set(p(99)), SetOutcome::BelowBase);
        assert_eq!(b.set(p(100)), SetOutcome::Set);
        assert_eq!(b.set(p(100)), SetOutcome::AlreadySet);
        assert_eq!(b.set(p(100 + 127)), SetOutcome::Set);
        assert_eq!(b.set(p(100 + 128)), SetOutcome::BeyondWindow);
        assert!(b.is_set(p(99)) && b.is_set(p(100)) && b.is_set(p(227)));
        assert!(!b.is_set(p(101)) && !b.is_set(p(228)));
    }

    #[test]
    fn advance_shifts_out_leading_ones_and_returns_first_missing() {
        let mut b = Bm::new(p(10));
        for q in [10, 11, 12, 14] {
            b.set(p(q));
        }
        assert_eq!(b.first_missing(), p(13));
        assert_eq!(b.advance(), p(13));
        assert_eq!(b.base(), p(13));
        assert!(!b.is_set(p(13)) && b.is_set(p(14)) && b.is_set(p(12)));
        assert_eq!(b.advance(), p(13), "a clear base does not move");
        b.set(p(13));
        assert_eq!(b.advance(), p(15));
    }

    #[test]
    fn advance_over_a_full_window_moves_by_the_window() {
        let mut b = Bm::new(p(0));
        assert_eq!(b.set_range(PsnRange::new(p(0), 128)).newly_set, 128);
        assert_eq!(b.first_missing(), p(128));
        assert_eq!(b.advance(), p(128));
        assert_eq!(b.set(p(255)), SetOutcome::Set, "the freed window is clear");
        assert_eq!(b.set(p(256)), SetOutcome::BeyondWindow);
    }

    #[test]
    fn psn_wrap_at_2_pow_24_is_seamless() {
        let mut b = Bm::new(p(0xFF_FFF0));
        assert_eq!(
            b.set_range(PsnRange::new(p(0xFF_FFF0), 0x20)).newly_set,
            0x20
        );
        assert_eq!(b.set(p(0xFF_FFEF)), SetOutcome::BelowBase);
        assert_eq!(b.advance(), p(0x10));
        assert_eq!(b.set(p(0xFF_FFFF)), SetOutcome::BelowBase);
        assert_eq!(b.set(p(0x10 + 127)), SetOutcome::Set);
        assert_eq!(b.set(p(0x10 + 128)), SetOutcome::BeyondWindow);
    }

    #[test]
    fn set_range_counts_the_parts_outside_the_window() {
        let mut b = Bm::new(p(1000));
        let c = b.set_range(PsnRange::new(p(990), 200));
        assert_eq!(
            c,
            MarkCounts {
                newly_set: 128,
                below_base: 10,
                beyond_window: 62
            }
        );
        let again = b.set_range(PsnRange::new(p(1000), 5));
        assert_eq!(again.newly_set, 0);
    }

    #[test]
    fn merge_window_aligns_any_offset() {
        // Reports starting 3 PSNs after the base and 70 before it.
        let mut b = PsnBitmap::<4>::new(p(1000));
        let c = b.merge_window(p(1003), u128::MAX);
        assert_eq!(c.newly_set, 128);
        assert!(!b.is_set(p(1002)) && b.is_set(p(1003)) && b.is_set(p(1130)));
        assert!(!b.is_set(p(1131)));

        let mut b = Bm::new(p(1000));
        let c = b.merge_window(p(930), (1u128 << 69) | (1u128 << 70) | (1u128 << 127));
        assert_eq!(c.below_base, 1);
        assert_eq!(c.newly_set, 2);
        assert!(b.is_set(p(1000)) && b.is_set(p(1057)) && !b.is_set(p(1001)));
    }

    #[test]
    fn merge_window_counts_bits_beyond_the_window() {
        let mut b = Bm::new(p(0));
        let c = b.merge_window(p(100), u128::MAX);
        assert_eq!(c.newly_set, 28);
        assert_eq!(c.beyond_window, 100);
        let far = b.merge_window(p(5000), 0b1011);
        assert_eq!(far.beyond_window, 3);
    }

    #[test]
    fn card_reports_are_remapped_by_112() {
        // psn_now = 0x200: bit 0 is 0x190 (= 0x200 - 112), bit 112 is psn_now itself.
        assert_eq!(card_bitmap_base(p(0x200)), p(0x190));
        assert_eq!(card_bitmap_base(p(0x10)), p(0xFF_FFA0), "wraps below zero");
        let mut b = Bm::new(p(0x190));
        let c = b.merge_card_report(p(0x200), 1u128 << 112);
        assert_eq!(c.newly_set, 1);
        assert!(b.is_set(p(0x200)));
        assert!(!b.is_set(p(0x190)));
        // A freshly reset card reports all ones with psn_now = 0xFFFFF << 4 = 0xFFFFF0: its
        // bits stand for 0xFFFF80..=0xFFFFFF, all before 0, so a tracker at 0 learns nothing.
        let mut b = Bm::new(p(0));
        let c = b.merge_card_report(p(0xFF_FFF0), u128::MAX);
        assert_eq!(c.below_base, 128);
        assert_eq!(c.newly_set, 0);
        assert_eq!(b.first_missing(), p(0));
    }

    #[test]
    fn advance_to_acks_cumulatively() {
        let mut b = Bm::new(p(50));
        b.set(p(60));
        b.set(p(62));
        assert_eq!(b.advance_to(p(40)), p(50), "going back is ignored");
        assert_eq!(b.advance_to(p(60)), p(60));
        assert!(b.is_set(p(60)) && !b.is_set(p(61)) && b.is_set(p(62)));
        assert_eq!(b.advance(), p(61));
        assert_eq!(
            b.advance_to(p(61 + 1000)),
            p(1061),
            "beyond the window clears all"
        );
        assert!(!b.is_set(p(1061)) && !b.is_set(p(1062)));
    }

    #[test]
    fn missing_lists_holes_and_everything_beyond_the_window() {
        let mut b = Bm::new(p(0));
        for q in [0, 1, 3, 4, 6] {
            b.set(p(q));
        }
        let m: Vec<u32> = b.missing(PsnRange::new(p(0), 8)).map(Psn::get).collect();
        assert_eq!(m, [2, 5, 7]);
        // Below the base is never missing, beyond the window always is.
        b.advance();
        let m: Vec<u32> = b
            .missing(PsnRange::new(p(0xFF_FFFE), 8))
            .map(Psn::get)
            .collect();
        assert_eq!(m, [2, 5]);
        let tail: Vec<u32> = b.missing(PsnRange::new(p(127), 4)).map(Psn::get).collect();
        assert_eq!(tail, [127, 128, 129, 130]);
    }

    #[test]
    fn missing_runs_merge_adjacent_holes_and_cross_the_window_end() {
        let mut b = Bm::new(p(0));
        b.set_range(PsnRange::new(p(0), 3));
        b.set_range(PsnRange::new(p(10), 100));
        b.set(p(120));
        let runs: Vec<(u32, u32)> = b
            .missing_runs(PsnRange::new(p(0), 200))
            .map(|r| (r.start().get(), r.len()))
            .collect();
        assert_eq!(runs, [(3, 7), (110, 10), (121, 79)]);
        let none: Vec<PsnRange> = b.missing_runs(PsnRange::new(p(10), 100)).collect();
        assert!(none.is_empty());
    }

    #[test]
    fn reset_clears_and_rebases() {
        let mut b = Bm::new(p(5));
        b.set(p(5));
        b.reset(p(0xFF_FFFF));
        assert_eq!(b.base(), p(0xFF_FFFF));
        assert!(!b.is_set(p(0xFF_FFFF)));
        assert_eq!(b.window().end(), p(127));
    }
}
