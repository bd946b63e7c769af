//! What the verbs layer does for an inline emulated card (one that runs in the driver's
//! threads, [`crate::backend::InlineCard`]): the engine lock that runs the card's transmit
//! side when a verb rang its send ring ([`EngineGuard`]), and what an application's CQ
//! polls tell the card and the progress thread (a spin on the CQ, its end).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use bluerdma_core::time::Instant;

use super::wake::Sleep;
use super::{Engine, Inner};

impl Inner {
    pub(super) fn lock(&self) -> EngineGuard<'_> {
        EngineGuard {
            dev: Some(self.dev.lock().unwrap_or_else(|e| e.into_inner())),
            inner: self,
            defer_tx: false,
        }
    }

    /// Whether a post of `wrs` work requests at `now` is (part of) a burst: several at once,
    /// or close to the previous post. An inline card's transmit side then waits for the
    /// application's next poll or the progress thread, so that posting costs a register
    /// write and the burst goes out together.
    pub(super) fn post_burst(&self, now: Instant, wrs: usize) -> bool {
        let prev = self.last_post.swap(now.0, Ordering::Relaxed);
        wrs > 1 || within_burst(prev, now)
    }

    /// Whether the application posted within the last [`POST_BURST`] (it may post again).
    pub(super) fn app_posting(&self, now: Instant) -> bool {
        within_burst(self.last_post.load(Ordering::Relaxed), now)
    }

    /// After new work was posted: wakes the progress thread, unless the card is inline (the
    /// engine's unlock ran the card or left it to the application's next poll, waking a
    /// progress thread that waits in the card's link; see [`EngineGuard`]).
    pub(super) fn kick_posted(&self) {
        // An inline card's doorbell woke a waiting progress thread already (EngineGuard).
        if self.inline.is_none() {
            self.kick();
        }
    }

    /// An application thread is about to poll: an inline card receives, and transmits what
    /// was posted, first.
    pub(super) fn app_poll(&self) {
        if let Some(card) = &self.inline {
            card.step();
            // Simple-NIC frames go to their handler on the progress thread: tell it.
            if self.raw_wanted.load(Ordering::Acquire) {
                let n = card.raw_frames();
                if self.raw_seen.swap(n, Ordering::Relaxed) != n {
                    self.kick();
                }
            }
        }
    }

    /// An application thread's poll found `n` completions at `now`: one that found none
    /// spins (see `spin_start`); one that found some goes off to use them (and may spin on
    /// memory, where only the progress thread can receive for it).
    pub(super) fn app_polled(&self, now: Instant, n: usize) {
        let Some(card) = &self.inline else { return };
        if n > 0 {
            self.spin_start.store(0, Ordering::Relaxed);
            card.app_spins(false);
            return;
        }
        let now = now.0.max(1);
        self.spin_last.store(now, Ordering::Relaxed);
        let start = self.spin_start.load(Ordering::Relaxed);
        if start == 0 {
            self.spin_start.store(now, Ordering::Relaxed);
        } else if now - start.min(now) >= LONG_SPIN.as_nanos() as u64 {
            card.app_spins(true);
        }
    }

    /// Whether an application thread spins on a CQ for long now ([`Inner::app_polled`]).
    pub(super) fn app_spins_long(&self, now: Instant) -> bool {
        let start = self.spin_start.load(Ordering::Relaxed);
        let last = self.spin_last.load(Ordering::Relaxed);
        start != 0
            && now.0.saturating_sub(start) >= LONG_SPIN.as_nanos() as u64
            && now.0.saturating_sub(last) < SPIN_GAP.as_nanos() as u64
    }
}

/// CQ polls that find nothing for this long are a spin ([`Inner::app_polled`]): shorter
/// ones (between the completions of a stream) are not worth telling the card about.
const LONG_SPIN: Duration = Duration::from_micros(50);
/// A spin has ended when its last poll is this old.
const SPIN_GAP: Duration = Duration::from_micros(200);
/// Posts closer together than this are a burst ([`Inner::post_burst`]).
const POST_BURST: Duration = Duration::from_micros(5);

/// Whether `now` is within [`POST_BURST`] of a post at `prev` (ns since the epoch).
fn within_burst(prev: u64, now: Instant) -> bool {
    now.0.saturating_sub(prev) < POST_BURST.as_nanos() as u64
}

/// The engine, locked by a verb. When it is unlocked after the verb rang a send-ring
/// doorbell of an inline card, the card's transmit side runs in this thread, as the card
/// starts at its doorbell; within a burst of posts ([`EngineGuard::defer_tx`]) it waits for
/// the application's next poll, or wakes a progress thread that waits in the card's link.
pub(super) struct EngineGuard<'a> {
    dev: Option<MutexGuard<'a, Engine>>,
    inner: &'a Inner,
    /// Leave the transmit side to the next step (a post in a burst).
    pub(super) defer_tx: bool,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        // Some until drop.
        self.dev.as_deref().expect("engine guard used after drop")
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.dev
            .as_deref_mut()
            .expect("engine guard used after drop")
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        drop(self.dev.take());
        let inner = self.inner;
        // The doorbell's store and the progress thread's `deep_sleep` store are SeqCst, as
        // these loads: either it sees the doorbell before it waits, or this sees it wait.
        if let Some(card) = &inner.inline {
            if !card.tx_pending() {
                return;
            }
            match (inner.wake.sleep(), self.defer_tx) {
                // A progress thread that is awake runs the card in its next round: leave it
                // the work (it checks for it before it waits, see `deep_wait`).
                (Sleep::Awake, _) => {}
                (_, false) => {
                    card.flush_tx();
                    // The next post's distance to this one starts now: the transmit side
                    // run here (a sendmmsg on the UDP link, several microseconds) made
                    // every post after it look like no burst, and each ran the transmit
                    // side itself again (0.2-0.6 M WR/s one per call on UDP).
                    inner.last_post.store(inner.now().0, Ordering::Relaxed);
                }
                // The application spins on a CQ: its next poll runs the card, and the
                // progress thread's wait ends within SPIN_WAIT (1 ms) if it never comes.
                // Waking the thread cost a quarter of a one-WR post_send in a burst.
                (Sleep::Short, true) => {}
                // Once per wait: the posts that follow find the thread awake.
                (Sleep::Long, true) => {
                    inner.wake.kick_once();
                }
            }
        }
    }
}
