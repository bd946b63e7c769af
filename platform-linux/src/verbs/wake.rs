//! How the progress thread is woken. It sleeps in one of two places: on a condition
//! variable (a card that runs in threads of its own, or the RTL and PCI backends), or, with
//! an inline card, in the card's link (ppoll on its socket and bell) while `deep_sleep` is
//! up. A kick sets a flag that either sleep reads before it starts, and ends whichever
//! sleep is under way.
//!
//! Every waker goes through [`Wake::kick`], the application's verbs and the out-of-band
//! channel's I/O thread alike: a waker that only signalled the condition variable left a
//! progress thread asleep in the link until its next deadline (up to 200 ms) when an
//! out-of-band record (an atomic request, a receive announcement) arrived.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Ends a wait in the inline card's link (`InlineCard::wake`).
pub(crate) type LinkBell = Arc<dyn Fn() + Send + Sync>;

/// The progress thread's wake-up, shared by everything that wakes it. It holds the inline
/// card's bell, never the device.
pub(crate) struct Wake {
    state: Mutex<KickState>,
    cv: Condvar,
    /// Whether and how the progress thread waits in the inline card's link
    /// ([`Sleep`] as a number): a kick must wake the link.
    deep_sleep: AtomicU8,
    bell: Option<LinkBell>,
}

/// Where the progress thread is with respect to the inline card's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sleep {
    /// Running (or about to sleep on the condition variable).
    Awake = 0,
    /// Waiting in the link until a frame, a kick or its next deadline (up to 200 ms).
    Long = 1,
    /// Waiting in the link while the application spins on a CQ: its polls run the card,
    /// and the wait ends within 1 ms by itself.
    Short = 2,
}

#[derive(Default)]
struct KickState {
    kicked: bool,
    /// A thread waits on the condition variable: only then is it signalled (a notify with
    /// no waiter is still a futex system call).
    waiting: bool,
}

impl Wake {
    pub(crate) fn new(bell: Option<LinkBell>) -> Wake {
        Wake {
            state: Mutex::new(KickState::default()),
            cv: Condvar::new(),
            deep_sleep: AtomicU8::new(Sleep::Awake as u8),
            bell,
        }
    }

    /// Wakes the progress thread wherever it sleeps; a kick before it sleeps is kept.
    pub(crate) fn kick(&self) {
        self.set_kicked();
        if self.deep_sleep.load(Ordering::SeqCst) != Sleep::Awake as u8 {
            self.wake_link();
        }
    }

    /// Wakes a progress thread that waits in the card's link once per wait: the kicks
    /// that follow find it awake. Returns whether it was asleep there.
    pub(crate) fn kick_once(&self) -> bool {
        if self.deep_sleep.swap(Sleep::Awake as u8, Ordering::SeqCst) == Sleep::Awake as u8 {
            return false;
        }
        self.set_kicked();
        self.wake_link();
        true
    }

    /// Whether and how the progress thread waits (or is about to wait) in the card's link.
    pub(crate) fn sleep(&self) -> Sleep {
        match self.deep_sleep.load(Ordering::SeqCst) {
            s if s == Sleep::Long as u8 => Sleep::Long,
            s if s == Sleep::Short as u8 => Sleep::Short,
            _ => Sleep::Awake,
        }
    }

    fn wake_link(&self) {
        if let Some(ring) = &self.bell {
            ring();
        }
    }

    fn set_kicked(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.kicked = true;
        if s.waiting {
            self.cv.notify_one();
        }
    }

    /// Takes the kick flag: whether a kick came since the last take.
    fn take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut s.kicked)
    }

    /// Sleeps on the condition variable until a kick or `timeout`; whether it was kicked.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.waiting = true;
        let (mut s, _) = self
            .cv
            .wait_timeout_while(s, timeout, |s| !s.kicked)
            .unwrap_or_else(|e| e.into_inner());
        s.waiting = false;
        std::mem::take(&mut s.kicked)
    }

    /// Runs `wait` (a wait in the card's link) unless a kick came first; a kick during it
    /// wakes the link. The flag is raised before the kick flag is read (both SeqCst with the
    /// kickers' accesses), so a kick is seen either here or by the kicker.
    pub(crate) fn deep_wait(&self, how: Sleep, wait: impl FnOnce()) {
        self.deep_sleep.store(how as u8, Ordering::SeqCst);
        if !self.take() {
            wait();
        }
        self.deep_sleep.store(Sleep::Awake as u8, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread;
    use std::time::Instant;

    /// A link whose wait ends when its bell rings, counting the rings.
    #[derive(Default)]
    struct Bell {
        rung: Mutex<bool>,
        cv: Condvar,
        rings: AtomicUsize,
    }

    impl Bell {
        fn wait(&self, timeout: Duration) {
            let g = self.rung.lock().unwrap();
            let (mut g, _) = self.cv.wait_timeout_while(g, timeout, |r| !*r).unwrap();
            *g = false;
        }
    }

    /// A Wake whose link bell is `bell`.
    fn wake_with(bell: &Arc<Bell>) -> Arc<Wake> {
        let b = Arc::clone(bell);
        Arc::new(Wake::new(Some(Arc::new(move || {
            b.rings.fetch_add(1, Ordering::SeqCst);
            *b.rung.lock().unwrap() = true;
            b.cv.notify_one();
        }))))
    }

    fn sleep_in_link(wake: &Arc<Wake>, bell: &Arc<Bell>) -> thread::JoinHandle<Duration> {
        let (w, b) = (Arc::clone(wake), Arc::clone(bell));
        let h = thread::spawn(move || {
            let t = Instant::now();
            w.deep_wait(Sleep::Long, || b.wait(Duration::from_secs(10)));
            t.elapsed()
        });
        while wake.sleep() == Sleep::Awake {
            thread::yield_now();
        }
        h
    }

    #[test]
    fn a_kick_from_another_thread_ends_a_wait_in_the_link() {
        // What the out-of-band channel's I/O thread does when a record arrives.
        let bell = Arc::new(Bell::default());
        let wake = wake_with(&bell);
        let sleeper = sleep_in_link(&wake, &bell);
        thread::sleep(Duration::from_millis(20));
        wake.kick();
        let slept = sleeper.join().unwrap();
        assert!(
            slept < Duration::from_secs(5),
            "slept {slept:?} after the kick"
        );
        assert_eq!(bell.rings.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_kick_ends_a_short_wait_too() {
        // A post in a burst leaves a short wait alone; a record from the out-of-band
        // channel must not.
        let bell = Arc::new(Bell::default());
        let wake = wake_with(&bell);
        let (w, b) = (Arc::clone(&wake), Arc::clone(&bell));
        let sleeper =
            thread::spawn(move || w.deep_wait(Sleep::Short, || b.wait(Duration::from_secs(10))));
        while wake.sleep() != Sleep::Short {
            thread::yield_now();
        }
        wake.kick();
        sleeper.join().unwrap();
        assert_eq!(bell.rings.load(Ordering::SeqCst), 1);
        assert_eq!(wake.sleep(), Sleep::Awake);
    }

    #[test]
    fn a_kick_before_the_wait_skips_it() {
        let bell = Arc::new(Bell::default());
        let wake = wake_with(&bell);
        wake.kick();
        let mut waited = false;
        wake.deep_wait(Sleep::Long, || waited = true);
        assert!(!waited, "a kept kick must skip the wait");
        // It was taken: the next wait happens.
        wake.deep_wait(Sleep::Long, || waited = true);
        assert!(waited);
    }

    #[test]
    fn kick_once_wakes_one_wait_and_only_while_it_lasts() {
        let bell = Arc::new(Bell::default());
        let wake = wake_with(&bell);
        assert!(!wake.kick_once(), "nobody sleeps: nothing to wake");
        let sleeper = sleep_in_link(&wake, &bell);
        assert!(wake.kick_once());
        assert!(
            !wake.kick_once(),
            "the second kick of the same wait rings nothing"
        );
        sleeper.join().unwrap();
        assert_eq!(bell.rings.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_kick_ends_a_wait_on_the_condition_variable() {
        let wake = Arc::new(Wake::new(None));
        let w = Arc::clone(&wake);
        let sleeper = thread::spawn(move || {
            let t = Instant::now();
            (w.wait(Duration::from_secs(10)), t.elapsed())
        });
        thread::sleep(Duration::from_millis(20));
        wake.kick();
        let (kicked, slept) = sleeper.join().unwrap();
        assert!(
            kicked && slept < Duration::from_secs(5),
            "{kicked} {slept:?}"
        );
        assert!(!wake.wait(Duration::from_millis(1)), "the kick was taken");
    }
}
