//! Wakes the OOB I/O thread out of `poll(2)` when the caller's side queued records or
//! drained events: an eventfd, written at most once per wake-up.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The eventfd and the flag that says a wake-up is already pending.
pub(super) struct Waker {
    fd: File,
    pending: AtomicBool,
}

impl Waker {
    pub(super) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Waker {
            fd: File::from(fd),
            pending: AtomicBool::new(false),
        })
    }

    /// The descriptor the I/O thread polls for reading.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Wakes the I/O thread unless a wake-up is already pending: it then has yet to
    /// `clear` and look at the queues, and will see what the caller queued.
    pub(super) fn wake(&self) {
        if !self.pending.swap(true, Ordering::SeqCst) {
            self.wake_now();
        }
    }

    pub(super) fn wake_now(&self) {
        // A full counter (EAGAIN) is already readable, which is all a wake-up needs.
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    /// Called by the I/O thread before it looks at the queues: runs [`Waker::CLEAR_STEPS`].
    pub(super) fn clear(&self) {
        for step in Self::CLEAR_STEPS {
            step(self);
        }
    }

    /// The eventfd is drained before the flag drops. In the other order a `wake` landing
    /// between the two steps is swallowed while the flag stays set; every later `wake` then
    /// skips the write and queued records wait for the idle timeout (a lost wake-up that
    /// cut the SEND rate over TCP to a few hundred per second). The test below injects a
    /// `wake` at every point of this list.
    const CLEAR_STEPS: [fn(&Waker); 2] = [Waker::drain, Waker::lower_flag];

    fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = (&self.fd).read(&mut buf);
    }

    fn lower_flag(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }

    /// Whether a `poll(2)` on the eventfd would return at once.
    #[cfg(test)]
    fn readable(&self) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        super::io_thread::sys_poll(&mut fds, std::time::Duration::ZERO).expect("poll") > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `wake` at any point of `clear` leaves the I/O thread able to be woken: whenever
    /// the flag says a wake-up is pending, the eventfd is readable, so `poll(2)` returns.
    #[test]
    fn a_wake_during_clear_is_never_lost() {
        for at in 0..=Waker::CLEAR_STEPS.len() {
            let w = Waker::new().unwrap();
            w.wake();
            for (i, step) in Waker::CLEAR_STEPS.iter().enumerate() {
                if i == at {
                    w.wake();
                }
                step(&w);
            }
            if at == Waker::CLEAR_STEPS.len() {
                w.wake();
            }
            let pending = w.pending.load(Ordering::SeqCst);
            assert!(
                !pending || w.readable(),
                "a wake before step {at} of clear was swallowed: flag set, eventfd empty"
            );
            // The next sender's wake must reach the I/O thread.
            w.wake();
            assert!(
                w.readable(),
                "wake after a wake at step {at} did not wake poll(2)"
            );
        }
    }
}
