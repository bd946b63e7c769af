//! The inline card: the emulated card without threads of its own, stepped by its driver's
//! threads (the default for the devices of the verbs API).
//!
//! A real card works beside the host; an emulated one needs a CPU to do that work, and with
//! two threads per card (transmit, receive) every doorbell and every frame was a hand-off
//! between threads: a wake-up, and on a two-core machine a wait for a CPU. An
//! [`InlineNic`] does the same work in the thread that has it to give:
//!
//! - the doorbell: a head write of the command ring runs the transmit side at once, in the
//!   writer's thread ([`InlineNic::doorbell`]; [`crate::inproc::SimRegs`] calls it); one of
//!   the send rings marks it due, and the driver's next step runs it
//!   ([`InlineNic::ring_send`]): posting costs a register write, as on the card;
//! - a driver that polls runs the receive side first ([`InlineNic::receive`]), so an
//!   application that spins on its CQ takes frames off the link itself, with no wake-up;
//! - a driver thread with nothing to do waits in the link ([`InlineNic::wait`]) until a
//!   frame, a [`LinkWaker`] or its deadline, so an idle card costs no CPU.
//!
//! What the card does per packet is the same code as the threaded card's ([`super::Nic`]:
//! [`TxEngine`], [`RxEngine`]), with the transmit and receive sides under separate locks as
//! two threads would run them. Two threads that want the same side at once do not wait for
//! each other: the second leaves a note and the one inside runs one more pass for it. The
//! differences: the card never waits for its driver (it takes no command it has no room to
//! answer; [`Shared::produce_blocking`]), and its timers (the quiet timer) run when a driver
//! thread steps it, which a waiting driver thread does by their deadline.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::card::{NicConfig, Shared, SteppedNic};
use super::clock::CardClock;
use super::regs::RegisterFile;
use super::rx::RxEngine;
use super::tx::TxEngine;
use crate::link::{LinkPort, LinkWaker};
use crate::mem::DmaPort;

/// The environment variable that chooses how emulated devices run their card: `threads`
/// for the threaded card ([`super::Nic`]), anything else (or unset) for the inline card.
pub const CARD_ENV: &str = "BLUERDMA_CARD";

/// Whether [`CARD_ENV`] asks for the threaded card.
pub fn threaded_from_env() -> bool {
    matches!(
        std::env::var(CARD_ENV).as_deref().map(str::trim),
        Ok("threads" | "threaded")
    )
}

/// How long a waiting thread sleeps at most when its link has no waker (it cannot be told
/// about work another thread has for it).
const UNWAKEABLE_WAIT: Duration = Duration::from_millis(1);
/// How soon reports waiting for ring space are tried again.
const PENDING_RETRY: Duration = Duration::from_micros(20);

/// An emulated card stepped by its driver's threads (see the module documentation).
pub struct InlineNic {
    shared: Arc<Shared>,
    tx: Mutex<TxEngine>,
    rx: Mutex<RxEngine>,
    /// A pass of the transmit side was asked for while another thread ran it.
    tx_again: AtomicBool,
    /// A send-ring doorbell was rung since the transmit side last ran.
    tx_pending: AtomicBool,
    /// A thread waits in the link without holding the receive side.
    waiting: AtomicBool,
    /// Senders announce frames to that thread (the link's sleeping sign is up).
    announced: AtomicBool,
    /// The same for the receive side.
    rx_again: AtomicBool,
    waker: Option<LinkWaker>,
}

impl InlineNic {
    /// A card on `regs`, reaching host memory through the two DMA ports and the world
    /// through `link`, on real time.
    pub fn new(
        config: NicConfig,
        regs: Arc<RegisterFile>,
        tx_dma: Box<dyn DmaPort>,
        rx_dma: Box<dyn DmaPort>,
        link: Box<dyn LinkPort>,
    ) -> std::io::Result<Self> {
        let waker = link.waker();
        let SteppedNic { shared, tx, rx } =
            SteppedNic::build(config, regs, tx_dma, rx_dma, link, CardClock::real(), true)?;
        Ok(Self {
            shared,
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            tx_again: AtomicBool::new(false),
            tx_pending: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            announced: AtomicBool::new(false),
            rx_again: AtomicBool::new(false),
            waker,
        })
    }

    /// The shared state: counters, register file, tables and windows.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The driver rang a doorbell: the transmit side runs its rings now (or, if another
    /// thread is inside it, once more when that one is done). Returns whether this thread
    /// did work.
    pub fn doorbell(&self) -> bool {
        self.tx_pending.store(false, Ordering::SeqCst);
        combine(&self.tx, &self.tx_again, |tx| tx.step())
    }

    /// The driver rang a send-ring doorbell: the transmit side runs at the next step of
    /// this card ([`InlineNic::flush_tx`], [`InlineNic::step`], [`InlineNic::wait`]), not
    /// in the call that posts, so that posting costs what writing a register costs and the
    /// work requests posted before the next poll go out together.
    pub fn ring_send(&self) {
        self.tx_pending.store(true, Ordering::SeqCst);
    }

    /// Simple-NIC frames the card has written to the host so far (a driver that hands
    /// them to a consumer on another thread learns from this that there are new ones).
    pub fn raw_frames(&self) -> u64 {
        self.shared.stats.simple_rx.load(Ordering::Relaxed)
    }

    /// Whether a send-ring doorbell waits for the transmit side.
    pub fn tx_pending(&self) -> bool {
        self.tx_pending.load(Ordering::SeqCst)
    }

    /// Runs the transmit side if a send-ring doorbell waits for it; whether it did work.
    pub fn flush_tx(&self) -> bool {
        self.tx_pending() && self.doorbell()
    }

    /// The receive side takes what the link holds, runs its timers and writes the reports
    /// that found room. Returns whether this thread did work. While a thread waits in the
    /// link ([`InlineNic::wait`]) this does nothing: a frame that arrives wakes that thread,
    /// which receives it.
    pub fn receive(&self) -> bool {
        combine(&self.rx, &self.rx_again, |rx| rx.step_now())
    }

    /// Both sides, receive first.
    pub fn step(&self) -> bool {
        let rx = self.receive();
        self.doorbell() | rx
    }

    /// Waits in the link for a frame, a [`InlineNic::wake`] or `timeout` (shorter when the
    /// card's own timers or waiting reports need it sooner; at most 1 ms on a link that
    /// cannot be woken), then runs the receive side. Returns whether it did work.
    ///
    /// With `announced`, senders that can (the shared-memory rings) wake this thread for
    /// each frame; without, an application spins on its CQ and receives for itself, and
    /// nothing wakes this thread but a timeout, a wake or the application leaving its spin
    /// ([`InlineNic::app_spins`]). The receive side is not held during the wait where the
    /// link allows it ([`LinkPort::wait_fds`]), so other threads receive meanwhile.
    pub fn wait(&self, timeout: Duration, announced: bool) -> bool {
        // A doorbell rung before the caller said it waits (see `ring_send`): no wait.
        if self.flush_tx() {
            return true;
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            // Another thread is in the receive side: it does the work.
            return false;
        };
        if rx.step_now() {
            return true;
        }
        let mut timeout = timeout.min(self.card_deadline(&rx));
        if self.waker.is_none() {
            timeout = timeout.min(UNWAKEABLE_WAIT);
        }
        let fds = rx.link_mut().wait_fds();
        if fds.is_empty() {
            // Only `recv_frames` can wait on this link: hold the receive side meanwhile.
            let n = rx.step(timeout);
            drop(rx);
            self.serve_notes();
            return n > 0;
        }
        let pending = announced && rx.link_mut().set_sleeping(true);
        self.announced.store(announced, Ordering::SeqCst);
        self.waiting.store(true, Ordering::SeqCst);
        drop(rx);
        if !pending {
            wait_readable(&fds, timeout);
        }
        self.waiting.store(false, Ordering::SeqCst);
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        rx.link_mut().set_sleeping(false);
        self.announced.store(false, Ordering::SeqCst);
        let work = rx.step_now();
        drop(rx);
        self.serve_notes();
        work
    }

    /// An application thread's CQ poll found nothing (`spinning`: it polls again, and
    /// receives for itself) or found completions (it goes off to use them, perhaps to spin
    /// on memory the card writes). A thread waiting in the link is told: senders stop
    /// announcing frames to it while the application spins, and start again when it
    /// leaves (frames that arrived meanwhile wake it at once).
    pub fn app_spins(&self, spinning: bool) {
        if !self.waiting.load(Ordering::SeqCst) || self.announced.load(Ordering::SeqCst) != spinning
        {
            return;
        }
        let mut rx = if spinning {
            match self.rx.try_lock() {
                Ok(rx) => rx,
                Err(_) => return,
            }
        } else {
            self.rx.lock().unwrap_or_else(|e| e.into_inner())
        };
        if !self.waiting.load(Ordering::SeqCst) {
            return;
        }
        let pending = rx.link_mut().set_sleeping(!spinning);
        self.announced.store(!spinning, Ordering::SeqCst);
        drop(rx);
        // Leaving: frames that arrived meanwhile were not announced. Starting to spin: the
        // waiter's timeout was meant for an idle card; it comes back with a spinner's.
        if pending || spinning {
            self.wake();
        }
    }

    /// Passes asked for while this thread held the receive side without running them.
    fn serve_notes(&self) {
        if self.rx_again.load(Ordering::SeqCst) {
            combine(&self.rx, &self.rx_again, |rx| rx.step_now());
        }
    }

    /// Ends a thread's [`InlineNic::wait`] early, if the link can (see
    /// [`LinkPort::waker`]).
    pub fn wake(&self) {
        if let Some(w) = &self.waker {
            w();
        }
    }

    /// Whether a waiting thread can be woken ([`InlineNic::wake`]); without a waker it
    /// wakes up every millisecond.
    pub fn can_wake(&self) -> bool {
        self.waker.is_some()
    }

    /// How long the receive side may wait before its own work falls due: reports waiting
    /// for room, the earliest quiet timer. A frozen card has none.
    fn card_deadline(&self, rx: &RxEngine) -> Duration {
        if self.shared.frozen() {
            return Duration::MAX;
        }
        if rx.has_pending() {
            return PENDING_RETRY;
        }
        let quiet = self.shared.config.quiet_timeout.as_nanos() as u64;
        let now = self.shared.now_ns();
        let state = self.shared.state();
        state
            .quiet_pending
            .iter()
            .filter_map(|&i| state.windows.get(i as usize))
            .filter(|w| !w.has_reported)
            .map(|w| w.last_entry_time.saturating_add(quiet).saturating_add(1))
            .min()
            .map_or(Duration::MAX, |t| {
                Duration::from_nanos(t.saturating_sub(now))
            })
    }
}

/// Waits up to `timeout` for any of `fds` to become readable.
fn wait_readable(fds: &[RawFd], timeout: Duration) {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `polls` is a valid array of pollfds for the call, `ts` a valid timespec; the
    // descriptors belong to the link, which outlives the card (and a closed one only makes
    // ppoll report POLLNVAL). No signal mask.
    unsafe {
        libc::ppoll(
            polls.as_mut_ptr(),
            polls.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

impl Drop for InlineNic {
    fn drop(&mut self) {
        self.shared.fail_on_unreported_stop();
    }
}

/// Runs `pass` on the engine behind `lock` until no other thread has asked for another
/// pass; if another thread is inside, asks it for one and returns at once. Returns whether
/// this thread's passes did work.
fn combine<E>(lock: &Mutex<E>, again: &AtomicBool, mut pass: impl FnMut(&mut E) -> bool) -> bool {
    let mut work = false;
    loop {
        again.store(true, Ordering::SeqCst);
        let mut engine: MutexGuard<'_, E> = match lock.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // The holder sees `again` after its pass (below) and runs one more.
            Err(std::sync::TryLockError::WouldBlock) => return work,
        };
        while again.swap(false, Ordering::AcqRel) {
            work |= pass(&mut engine);
        }
        drop(engine);
        // A note left between the last swap and the unlock: nobody ran a pass for it.
        if !again.load(Ordering::SeqCst) {
            return work;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_pass_asked_for_while_another_thread_is_inside_is_run_by_that_thread() {
        let lock = Mutex::new(0u32);
        let again = AtomicBool::new(false);
        let inner_calls = AtomicUsize::new(0);
        let work = combine(&lock, &again, |n| {
            *n += 1;
            if *n == 1 {
                // Another thread rings while this one is inside: it returns at once,
                // having done nothing itself.
                let nested = combine(&lock, &again, |_| unreachable!("the lock is held"));
                assert!(!nested);
                inner_calls.fetch_add(1, Ordering::Relaxed);
            }
            true
        });
        assert!(work);
        assert_eq!(inner_calls.load(Ordering::Relaxed), 1);
        assert_eq!(
            *lock.lock().unwrap(),
            2,
            "the note was served by one more pass"
        );
        assert!(!again.load(Ordering::SeqCst));
    }
}
