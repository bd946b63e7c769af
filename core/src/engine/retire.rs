//! Taking back what descriptors on the send ring may still name. The card fetches the send
//! ring on its own time, and a WQE whose lkey has no valid MR entry stops the RTL
//! (nic-behaviour.md 1.7: "mrTable must be valid here"). So the card-side invalidation of an
//! MR (and the unpinning of its memory) waits until the card's tail has passed every
//! descriptor posted before `dereg_mr`, and a QP is invalidated in the card (destroyed, or
//! gone to ERR) only once the card has fetched what was posted before.
//!
//! A [`SendMark`] is a count of descriptors posted to the send ring; the card has fetched
//! everything before it when the count posted minus the ring's pending descriptors has
//! reached it (a count, not a ring pointer, so it cannot wrap). The blocking waits
//! ([`Device::wait_send_fetched`]) give up with [`VerbsError::CommandTimeout`] (naming the
//! wait, and logging the ring's head and tail) when the card's tail stops moving for a
//! command timeout: a frozen card is reported, never waited for forever.
//!
//! What the card's tail says is "fetched": the RTL's MR lookup for a fetched WQE happens a
//! few pipeline stages later, which the driver cannot observe (README, hardware
//! limitations).

use crate::addr::DeviceAddr;
use crate::time::Instant;

use super::error::VerbsError;
use super::{Device, Platform, Storage};

/// What `dereg_mr` waits for (named in its timeout: "the card did not answer ...").
pub(crate) const DEREG_WAIT: &str = "the send-ring fetch dereg_mr waits for";
/// What `destroy_qp` waits for.
pub(crate) const DESTROY_WAIT: &str = "the send-ring fetch destroy_qp waits for";

/// What the card has yet to take from the driver's memory ([`Device::tx_backlog`]). A
/// driver that goes away keeps its DMA buffers until the card has taken it: after the
/// tail has passed a simple-NIC descriptor the card still reads the frame it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxBacklog {
    /// Descriptors on the send and simple-NIC TX rings the card has not fetched.
    pub unfetched: u32,
    /// Bytes of every simple-NIC frame posted so far (driver ACKs and raw frames); the
    /// card reads each frame once, from [`Device::simple_nic_tx_buffers`].
    pub simple_nic_bytes: u64,
}

/// The descriptors posted to the send ring before some moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SendMark(u64);

impl<P: Platform, S: Storage> Device<P, S> {
    /// Everything posted to the send ring so far.
    #[inline]
    pub(crate) fn send_mark(&self) -> SendMark {
        SendMark(self.send_posted)
    }

    /// The send ring took `n` more descriptors.
    #[inline]
    pub(crate) fn note_send_posted(&mut self, n: usize) {
        self.send_posted += n as u64;
    }

    /// Whether the card has fetched every descriptor posted before `mark`. Reads the tail
    /// CSR only when the cached tail says not yet.
    pub(crate) fn send_fetched(&mut self, mark: SendMark) -> bool {
        let fetched = |d: &Self| d.send_posted - u64::from(d.send.pending());
        if fetched(self) >= mark.0 {
            return true;
        }
        // An impossible tail is logged by the ring and leaves the cached one.
        let _ = self.send.refresh_tail(&self.regs);
        fetched(self) >= mark.0
    }

    /// Waits until the card has fetched every descriptor posted before `mark` (the blocking
    /// helper of `dereg_mr` and `destroy_qp`; `waiting_for` names the wait in the error).
    /// Fails with [`VerbsError::CommandTimeout`] when the card's tail has not moved for a
    /// command timeout.
    pub(crate) fn wait_send_fetched(
        &mut self,
        mark: SendMark,
        waiting_for: &'static str,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let timeout = self.cfg.command_timeout;
        let mut tail = self.send.cached_tail();
        let mut deadline = clock() + timeout;
        loop {
            // The time is read before the tail: a tail that moved by then is in time.
            let now = clock();
            if self.send_fetched(mark) {
                return Ok(());
            }
            if self.send.cached_tail() != tail {
                tail = self.send.cached_tail();
                deadline = now + timeout;
            } else if now >= deadline {
                core_error!(
                    "{}: the card has not fetched the send ring for {} ms (head {:#x}, tail {:#x}): it is stopped or frozen",
                    waiting_for,
                    timeout.0 / 1_000_000,
                    self.send.head().csr(),
                    tail.csr()
                );
                return Err(VerbsError::CommandTimeout { op: waiting_for });
            }
            core::hint::spin_loop();
        }
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Reads the send and simple-NIC TX tails and says what the card has yet to take. A
    /// tail that reads impossible is logged by the ring and counts as not moved.
    pub fn tx_backlog(&mut self) -> TxBacklog {
        let _ = self.send.refresh_tail(&self.regs);
        let _ = self.sn_tx.refresh_tail(&self.regs);
        TxBacklog {
            unfetched: u32::from(self.send.pending()) + u32::from(self.sn_tx.pending()),
            simple_nic_bytes: self.sn_tx_bytes,
        }
    }

    /// The DMA buffers simple-NIC TX frames are sent from (driver ACKs, raw frames): where
    /// the card reads the bytes [`TxBacklog::simple_nic_bytes`] counts.
    pub fn simple_nic_tx_buffers(&self) -> [Option<(DeviceAddr, usize)>; 2] {
        [&self.ack_slots, &self.raw_slots]
            .map(|s| s.buf.as_ref().map(|b| (b.device_addr(), b.len())))
    }
}
