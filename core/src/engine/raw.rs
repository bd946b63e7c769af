//! The simple NIC: raw Ethernet frames both ways (the driver's ACK frames go out through
//! it too, see `report.rs`). Received frames are handed to a consumer or dropped and
//! counted: the card stops receiving, RDMA included, while the RX ring stays full
//! (correction 1).

use crate::addr::DeviceAddr;
use crate::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_SLOTS, RX_SLOT_SIZE};
use crate::platform::DmaBuffer;
use crate::ring::{Popped, ProducerRing};

use super::config::{RAW_FETCH_MARGIN, RAW_FRAME_MAX};
use super::error::VerbsError;
use super::{Device, Platform, Storage};

/// A DMA buffer cut into equal slots for simple-NIC TX frames, used round-robin.
pub(crate) struct TxSlots {
    pub(crate) buf: Option<DmaBuffer>,
    size: usize,
    pub(crate) next: usize,
}

impl TxSlots {
    pub(crate) fn new(buf: DmaBuffer, size: usize) -> Self {
        TxSlots {
            buf: Some(buf),
            size,
            next: 0,
        }
    }

    /// The next slot (its device address and bytes); the one after it comes next time.
    pub(crate) fn take(&mut self) -> Option<(DeviceAddr, &mut [u8])> {
        let buf = self.buf.as_mut()?;
        let count = buf.len() / self.size;
        let slot = self.next;
        self.next = (slot + 1) % count.max(1);
        let at = slot * self.size;
        let addr = DeviceAddr(buf.device_addr().0 + at as u64);
        Some((addr, buf.as_mut_slice().get_mut(at..at + self.size)?))
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    pub(crate) fn poll_raw_rx(&mut self) -> bool {
        // A consumer drains the ring with take_raw_frames; without one the frames are
        // dropped here, since the card stops receiving when the ring stays full
        // (correction 1).
        if self.keep_raw_frames {
            return false;
        }
        let mut dropped = 0;
        let popped = self.drain_raw(&mut |_| dropped += 1);
        self.stats.raw_dropped += dropped;
        popped > 0
    }

    /// Asks `poll` to leave received simple-NIC frames for [`Device::take_raw_frames`]
    /// (`true`) or to drop them (`false`, the default). A consumer that keeps them must
    /// call `take_raw_frames` as often as it polls: the card stops receiving, RDMA
    /// included, while the ring is full.
    pub fn set_keep_raw_frames(&mut self, keep: bool) {
        self.keep_raw_frames = keep;
    }

    /// Hands each received simple-NIC frame to `f` (the bytes in the RX buffer slot, as
    /// long as its descriptor says) and frees its ring entry; returns how many frames `f`
    /// saw. A descriptor that does not decode or names bytes beyond its 2048-byte slot is
    /// counted in `raw_bad` and skipped. At most one buffer's worth (1024 frames) per call.
    pub fn take_raw_frames(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        self.drain_raw(&mut |frame| {
            n += 1;
            f(frame)
        });
        n
    }

    /// Pops up to RX_SLOTS simple-NIC RX descriptors, `f` seeing each good frame; returns
    /// how many descriptors were popped.
    fn drain_raw(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut popped = 0;
        while popped < RX_SLOTS as usize {
            let Some(p) = self.sn_rx.pop() else { break };
            popped += 1;
            self.stats.raw_frames += 1;
            let rx = match p {
                Popped::One(d) => SimpleNicRx::decode(&d).ok(),
                _ => None,
            };
            let frame = rx.filter(|rx| rx.len <= RX_SLOT_SIZE).and_then(|rx| {
                let start = rx.buffer_offset() as usize;
                let buf = self.rx_buf.as_mut()?.as_mut_slice();
                buf.get(start..start + rx.len as usize)
            });
            match frame {
                Some(bytes) => f(bytes),
                None => self.stats.raw_bad += 1,
            }
        }
        if popped > 0 {
            self.sn_rx.sync_tail(&self.regs);
        }
        popped
    }

    /// Sends one whole Ethernet frame (at most [`RAW_FRAME_MAX`] bytes, the receiving
    /// card's RX slot) through the simple NIC: the bytes are copied into a DMA slot, so
    /// `frame` may be reused at once. Errors: an empty or oversized frame
    /// (InvalidArgument); every slot still waiting for the card, or a full ring (Busy: try
    /// again after a poll).
    pub fn send_raw(&mut self, frame: &[u8]) -> Result<(), VerbsError> {
        if frame.is_empty() || frame.len() > RAW_FRAME_MAX {
            return Err(VerbsError::InvalidArgument {
                what: "raw frame length (1..=2048 bytes)",
            });
        }
        let busy = VerbsError::Busy {
            what: "the simple-NIC TX ring",
        };
        let slot = self.raw_slots.next;
        if let Some(seq) = self.raw_seq[slot] {
            // Descriptors before `fetched` have been fetched by the card.
            let fetched = |ring: &ProducerRing| self.sn_tx_seq - u64::from(ring.pending());
            if seq + RAW_FETCH_MARGIN >= fetched(&self.sn_tx) {
                let _ = self.sn_tx.refresh_tail(&self.regs);
                if seq + RAW_FETCH_MARGIN >= fetched(&self.sn_tx) {
                    return Err(busy);
                }
            }
        }
        let (addr, out) = self.raw_slots.take().ok_or(busy)?;
        out[..frame.len()].copy_from_slice(frame);
        let desc = SimpleNicTx {
            addr,
            len: frame.len() as u32,
        }
        .encode();
        self.sn_tx
            .push_batch(&self.regs, &[desc])
            .map_err(|_| busy)?;
        self.raw_seq[slot] = Some(self.sn_tx_seq);
        self.sn_tx_seq += 1;
        self.sn_tx_bytes += frame.len() as u64;
        self.stats.raw_sent += 1;
        Ok(())
    }
}
