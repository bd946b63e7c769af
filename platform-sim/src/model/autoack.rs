//! The card's per-QP PSN bitmap window and its automatic loss/quiet reports
//! (nic-behaviour.md section 3, with the review's corrections 4 and 7).
//!
//! Each QP index keeps a 128-bit bitmap and a *stride number* `L` (stride = 16 PSNs). Bit i
//! stands for PSN `16·L − 112 + i`: the newest stride is bits 112..127, the seven older ones
//! below. A new PSN either lands in the window, slides it forward (a loss if a bit shifted
//! out was 0), or is stale. The RTL freezes its bitmap pipeline on a stale PSN; the model
//! does what was intended (ignore it, count it, refresh the timer state).

/// Bits of the stride number.
const STRIDE_BITS: u32 = 20;
const STRIDE_MASK: u32 = (1 << STRIDE_BITS) - 1;
/// The stride number after reset.
const RESET_BOUND: u32 = STRIDE_MASK;

/// The state of one QP index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckWindow {
    /// The 128-bit receive bitmap.
    pub bitmap: u128,
    /// The stride number of the newest stride (`psn_now = 16 * left_bound`).
    pub left_bound: u32,
    /// The QPN key byte of the last merged packet.
    pub key: u8,
    /// Counter of NAKs sent (the MSN of hardware NAKs).
    pub ack_msn: u16,
    /// When the last packet was merged (ns).
    pub last_entry_time: u64,
    /// Whether the last merge has been reported (by a NAK or the quiet timer).
    pub has_reported: bool,
}

impl Default for AckWindow {
    fn default() -> Self {
        Self {
            bitmap: u128::MAX,
            left_bound: RESET_BOUND,
            key: 0,
            ack_msn: 0,
            last_entry_time: 0,
            has_reported: true,
        }
    }
}

/// What merging one PSN did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// The PSN landed in the window (or slid it without a gap).
    Accepted,
    /// The window slid over a PSN that never arrived: send a NAK and report locally.
    Lost(LossReport),
    /// The PSN is more than 8 strides behind the window: ignored (the RTL would freeze).
    Stale,
}

/// Everything the NAK packet and the local NakLocalHw report need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossReport {
    /// The bitmap before the merge.
    pub pre_bitmap: u128,
    /// The bitmap after the merge.
    pub now_bitmap: u128,
    /// `16 * L_old`.
    pub psn_before_slide: u32,
    /// `16 * L_new`.
    pub psn_now: u32,
    /// The NAK's MSN (the counter before its increment).
    pub msn: u16,
    /// The QPN key byte (of the packet that triggered the loss).
    pub key: u8,
}

/// A quiet-timer report (AckLocalHw): the current window, no packet on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuietReport {
    /// The current bitmap.
    pub now_bitmap: u128,
    /// `16 * L`.
    pub psn_now: u32,
    /// The stored key byte.
    pub key: u8,
}

impl AckWindow {
    /// Resets the window, as every ManageQp for the index does.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Merges the PSN of an accepted packet that updates the bitmap, at time `now` (ns).
    pub fn merge(&mut self, psn: u32, key: u8, now: u64) -> MergeOutcome {
        let psn = psn & 0x00FF_FFFF;
        let new_bound = psn >> 4;
        let bit = 112 + (psn & 0xF);
        // d = (Ln - L) mod 2^20, read as a signed 20-bit number.
        let raw = new_bound.wrapping_sub(self.left_bound) & STRIDE_MASK;
        let d = ((raw << (32 - STRIDE_BITS)) as i32) >> (32 - STRIDE_BITS);
        // Every merge, stale included, refreshes the timer state (review correction 4).
        self.last_entry_time = now;
        self.has_reported = false;
        if d <= -8 {
            return MergeOutcome::Stale;
        }
        self.key = key;
        if d <= 0 {
            let pos = (bit as i32 + 16 * d) as u32;
            self.bitmap |= 1u128 << pos;
            return MergeOutcome::Accepted;
        }
        let pre_bitmap = self.bitmap;
        let old_bound = self.left_bound;
        let lost = if d < 8 {
            let shift = 16 * d as u32;
            let out_mask = (1u128 << shift) - 1;
            let lost = self.bitmap & out_mask != out_mask;
            self.bitmap >>= shift;
            lost
        } else {
            self.bitmap = 0;
            true
        };
        self.bitmap |= 1u128 << bit;
        self.left_bound = new_bound;
        if !lost {
            return MergeOutcome::Accepted;
        }
        let msn = self.ack_msn;
        self.ack_msn = self.ack_msn.wrapping_add(1);
        self.has_reported = true;
        MergeOutcome::Lost(LossReport {
            pre_bitmap,
            now_bitmap: self.bitmap,
            psn_before_slide: (old_bound << 4) & 0x00FF_FFFF,
            psn_now: (new_bound << 4) & 0x00FF_FFFF,
            msn,
            key,
        })
    }

    /// The quiet-timer check: a report is due when the last merge has not been reported and
    /// nothing arrived for `quiet_ns`.
    pub fn poll_quiet(&mut self, now: u64, quiet_ns: u64) -> Option<QuietReport> {
        if self.has_reported || now.saturating_sub(self.last_entry_time) <= quiet_ns {
            return None;
        }
        self.has_reported = true;
        Some(QuietReport {
            now_bitmap: self.bitmap,
            psn_now: (self.left_bound << 4) & 0x00FF_FFFF,
            key: self.key,
        })
    }
}

/// Does packet `psn` (24-bit) show as received in a report whose `psn_now` is given? The
/// helper applies the "−112" rule: bit 0 of the bitmap is `psn_now − 112`.
pub fn bitmap_has(bitmap: u128, psn_now: u32, psn: u32) -> bool {
    let base = psn_now.wrapping_sub(112) & 0x00FF_FFFF;
    let off = psn.wrapping_sub(base) & 0x00FF_FFFF;
    off < 128 && bitmap & (1u128 << off) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_stream_never_reports_loss() {
        let mut w = AckWindow::default();
        for psn in 0..1000u32 {
            assert_eq!(
                w.merge(psn, 7, psn as u64),
                MergeOutcome::Accepted,
                "psn {psn}"
            );
        }
        assert!(bitmap_has(w.bitmap, w.left_bound << 4, 999));
        assert!(bitmap_has(w.bitmap, w.left_bound << 4, 900));
    }

    #[test]
    fn first_psn_at_or_above_112_after_reset_is_a_loss() {
        let mut w = AckWindow::default();
        assert_eq!(w.merge(111, 1, 0), MergeOutcome::Accepted);
        let mut w = AckWindow::default();
        match w.merge(112, 1, 0) {
            MergeOutcome::Lost(r) => {
                assert_eq!(r.psn_now, 112);
                assert_eq!(r.msn, 0);
                assert_eq!(r.now_bitmap, 1u128 << 112);
            }
            other => panic!("expected a loss, got {other:?}"),
        }
        assert_eq!(w.ack_msn, 1);
    }

    #[test]
    fn a_gap_that_slides_out_is_reported_once() {
        let mut w = AckWindow::default();
        for psn in 0..16 {
            w.merge(psn, 1, 0);
        }
        // PSN 16 never arrives; 17..=143 do. Sliding past stride 1 loses it.
        let mut losses = Vec::new();
        for psn in 17..=160 {
            if let MergeOutcome::Lost(r) = w.merge(psn, 1, 0) {
                losses.push((psn, r));
            }
        }
        assert_eq!(losses.len(), 1, "{losses:?}");
        let (psn, r) = losses[0];
        assert_eq!(
            psn,
            16 + 128,
            "the hole leaves the window when stride 9 starts"
        );
        assert!(!bitmap_has(r.pre_bitmap, r.psn_before_slide, 16));
        assert!(bitmap_has(r.pre_bitmap, r.psn_before_slide, 17));
    }

    #[test]
    fn stale_psn_is_ignored_but_refreshes_the_timer() {
        let mut w = AckWindow::default();
        for psn in 0..300 {
            w.merge(psn, 1, 0);
        }
        let before = w;
        assert_eq!(w.merge(10, 1, 50), MergeOutcome::Stale);
        assert_eq!(w.bitmap, before.bitmap);
        assert_eq!(w.left_bound, before.left_bound);
        assert!(w.poll_quiet(100, 10).is_some());
    }

    #[test]
    fn late_packet_inside_the_window_fills_its_bit() {
        let mut w = AckWindow::default();
        for psn in (0..40).filter(|p| *p != 20) {
            w.merge(psn, 1, 0);
        }
        assert!(!bitmap_has(w.bitmap, w.left_bound << 4, 20));
        assert_eq!(w.merge(20, 1, 0), MergeOutcome::Accepted);
        assert!(bitmap_has(w.bitmap, w.left_bound << 4, 20));
    }

    #[test]
    fn quiet_timer_reports_once_per_burst() {
        let mut w = AckWindow::default();
        w.merge(0, 9, 1_000);
        assert_eq!(
            w.poll_quiet(5_000, 10_000),
            None,
            "still within the quiet time"
        );
        let r = w.poll_quiet(20_000, 10_000).expect("report due");
        assert_eq!(r.key, 9);
        assert_eq!(r.psn_now, 0);
        assert_eq!(w.poll_quiet(40_000, 10_000), None, "already reported");
    }

    #[test]
    fn psn_wraps_at_2_pow_24() {
        // A window that has been following traffic up to PSN 0xFF_FF00.
        let mut w = AckWindow {
            left_bound: 0xF_FFF0,
            ..AckWindow::default()
        };
        for psn in 0xFF_FF00u32..0x100_0040 {
            let outcome = w.merge(psn & 0xFF_FFFF, 1, 0);
            assert!(
                !matches!(outcome, MergeOutcome::Lost(_) | MergeOutcome::Stale),
                "{psn:#x}"
            );
        }
        assert!(bitmap_has(w.bitmap, w.left_bound << 4, 0x3F));
    }
}
