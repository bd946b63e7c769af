//! The progress thread of a [`Context`](super::Context): it polls the engine, spinning while
//! there is work and backing off to short sleeps (never past a timer deadline) when there
//! is none, hands received simple-NIC frames to the raw handler, fires armed CQs' events
//! and delivers the engine's asynchronous events to the event handler, all without the
//! device lock.
//!
//! With an inline emulated card it also steps the card each round, and where it would
//! sleep it waits in the card's link instead (until a frame, a kick or the next deadline):
//! frames are announced to it (a wake-up per batch) unless the application spins on a CQ
//! for long, whose polls then receive for it with no wake-up of any thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bluerdma_core::time::Instant;

use super::wake::Sleep;
use super::{CqInner, Engine, Inner};

/// Frames taken from the engine under its lock, handed to the raw handler after it.
#[derive(Default)]
struct RawBatch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl RawBatch {
    /// Copies the frames the engine holds (when a handler wants them); returns how many.
    fn take(&mut self, inner: &Inner, dev: &mut Engine) -> usize {
        self.bytes.clear();
        self.ends.clear();
        if !inner.raw_wanted.load(Ordering::Acquire) {
            return 0;
        }
        dev.take_raw_frames(&mut |f| {
            self.bytes.extend_from_slice(f);
            self.ends.push(self.bytes.len());
        })
    }

    /// Runs the handler on every frame taken, once: the batch is empty afterwards (a round
    /// that could not take the engine lock must not hand the last batch over again; it did,
    /// and a UD receiver got a datagram twice).
    fn deliver(&mut self, inner: &Inner) {
        if self.ends.is_empty() {
            return;
        }
        {
            let mut h = inner.raw.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = h.as_mut() {
                let mut start = 0;
                for &end in &self.ends {
                    h(&self.bytes[start..end]);
                    start = end;
                }
            }
        }
        self.bytes.clear();
        self.ends.clear();
    }
}

pub(super) fn progress_loop(inner: &Inner) {
    let mut idle_rounds = 0u32;
    let mut raw = RawBatch::default();
    // When the progress thread began to leave its rounds to a posting application.
    let mut posting_since: Option<Instant> = None;
    while !inner.stop.load(Ordering::Acquire) {
        let now = inner.now();
        // try_lock: an application thread inside a verb drives progress itself; the progress
        // thread never makes it wait (on two cores a contended lock costs more than a poll).
        let mut fire = Vec::new();
        let mut events = Vec::new();
        let mut clock = inner.clock();
        let mut round = |dev: &mut Engine| {
            let w = dev.poll(now) | dev.run_remote_invalidations(&mut clock);
            let frames = raw.take(inner, dev);
            collect_events(inner, dev, &mut fire);
            while let Some(e) = dev.take_event() {
                events.push(e);
            }
            (w || frames > 0, dev.next_deadline())
        };
        // The application is posting (an inline card): the round waits until it stops, for
        // at most POSTING_WAIT. Run beside the posts, the card and the engine pulled the
        // send ring's and the engine's cache lines from under the posting thread and made
        // each post up to twice as slow; the posts that follow each other within 5 us are
        // sent by the first round after them, or by the application's next poll.
        if inner.inline.is_some() && inner.app_posting(now) {
            let since = *posting_since.get_or_insert(now);
            if now.0.saturating_sub(since.0) < POSTING_WAIT.as_nanos() as u64 {
                thread::yield_now();
                continue;
            }
        }
        posting_since = None;
        let polled = match inner.dev.try_lock() {
            Ok(mut dev) => Some(round(&mut dev)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(round(&mut p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        // An inline card, outside the engine lock: what arrived, and what the round posted.
        let card_work = inner.inline.as_ref().is_some_and(|c| c.step());
        // The raw handler and event callbacks run without the engine lock.
        raw.deliver(inner);
        for cq in fire {
            if let Some(f) = cq.notify.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                f();
            }
        }
        if !events.is_empty() {
            let mut h = inner.events.lock().unwrap_or_else(|e| e.into_inner());
            for e in events {
                match h.as_mut() {
                    Some(h) => h(e),
                    None => log::warn!("{}: asynchronous event {e:?}", inner.spec.name),
                }
            }
        }
        let Some((work, deadline)) = polled else {
            thread::yield_now();
            continue;
        };
        if work || card_work {
            idle_rounds = 0;
            continue;
        }
        idle_rounds = idle_rounds.saturating_add(1);
        let until_deadline = |backoff: Duration| {
            deadline
                .map(|d| Duration::from_nanos(d.0.saturating_sub(inner.now().0)))
                .unwrap_or(backoff)
        };
        if let Some(card) = &inner.inline {
            if inner.app_spins_long(inner.now()) {
                // The application spins on a CQ: its polls run the card and the engine
                // with no wake-up of any thread, and senders do not announce frames to
                // this thread. It looks again after a while for what only it does (armed
                // CQs, raw frames, events); the application leaving its spin wakes it
                // early when frames wait.
                deep_wait(
                    inner,
                    &**card,
                    until_deadline(SPIN_WAIT).min(SPIN_WAIT),
                    false,
                );
                continue;
            }
            if idle_rounds >= SPIN_ROUNDS {
                deep_wait(
                    inner,
                    &**card,
                    until_deadline(DEEP_WAIT).min(DEEP_WAIT),
                    true,
                );
                continue;
            }
        }
        if idle_rounds < SPIN_ROUNDS {
            // A reply or an ACK usually follows within microseconds: stay close, but let
            // the card's threads run.
            thread::yield_now();
            continue;
        }
        // Back off: 20 us doubling to 1 ms, never past a retransmission deadline.
        let backoff = Duration::from_micros(20u64 << (idle_rounds - SPIN_ROUNDS).min(6))
            .min(Duration::from_millis(1));
        if wait_kick(inner, backoff.min(until_deadline(backoff))) {
            idle_rounds = 0;
        }
    }
}

/// The longest the progress thread leaves its rounds to an application that keeps posting
/// (its timers and the frames that arrive wait that long at most).
const POSTING_WAIT: Duration = Duration::from_micros(50);
/// Idle rounds spent yielding before the thread sleeps.
const SPIN_ROUNDS: u32 = 64;
/// How long the progress thread waits while the application spins.
const SPIN_WAIT: Duration = Duration::from_millis(1);
/// The longest wait in an inline card's link with no deadline (the engine's timers all
/// have deadlines; this only bounds what a missed wake-up could cost).
const DEEP_WAIT: Duration = Duration::from_millis(200);

/// Sleeps until a kick or `timeout`; returns whether it was kicked.
fn wait_kick(inner: &Inner, timeout: Duration) -> bool {
    inner.wake.wait(timeout)
}

/// Waits in the inline card's link until a frame, a kick (which wakes the link while the
/// thread sleeps there) or `timeout`. Unannounced (the application spins on a CQ), the
/// wait is a short one ([`SPIN_WAIT`]) that a post in a burst does not end.
fn deep_wait(
    inner: &Inner,
    card: &dyn crate::backend::InlineCard,
    timeout: Duration,
    announced: bool,
) {
    let how = if announced { Sleep::Long } else { Sleep::Short };
    inner.wake.deep_wait(how, || {
        card.wait(timeout, announced);
    });
}

/// Every armed CQ that holds a completion is disarmed and returned in `fire`
/// (level-triggered: a completion already queued when the CQ was armed fires too, so an
/// event is never lost between a poll and an arm).
fn collect_events(inner: &Inner, dev: &mut Engine, fire: &mut Vec<Arc<CqInner>>) {
    let mut armed = inner.armed.lock().unwrap_or_else(|e| e.into_inner());
    if armed.is_empty() {
        return;
    }
    armed.retain(|w| {
        let Some(cq) = w.upgrade() else { return false };
        if !cq.armed.load(Ordering::Acquire) {
            return false;
        }
        if dev.cq_len(cq.cq) == 0 {
            return true;
        }
        // Cq::push may have fired and disarmed it meanwhile.
        if cq.armed.swap(false, Ordering::AcqRel) {
            fire.push(Arc::clone(&cq));
        }
        false
    });
}
