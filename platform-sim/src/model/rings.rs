//! The card's side of the rings (nic-behaviour.md section 6, hardware-contract.md "Rings").
//!
//! Host-to-card rings are read from the card's fetch pointer up to the host-written head; the
//! valid bit is never looked at, and the tail register advances per fetched descriptor.
//! Card-to-host rings are written at the card's head, only into slots the host's tail has
//! freed, with the whole descriptor visible before its valid byte.

use std::sync::atomic::{fence, Ordering};

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::desc::{RawDesc, DESC_SIZE};
use bluerdma_core::regs::{RingId, RingReg};

use super::regs::RegisterFile;
use crate::mem::{DmaFault, DmaPort};

/// Descriptors per ring.
pub const RING_LEN: u32 = 4096;
const PTR_MASK: u32 = 0x1FFF;
const IDX_MASK: u32 = RING_LEN - 1;

/// Descriptors between `tail` and `head` (13-bit pointers).
fn used(head: u32, tail: u32) -> u32 {
    head.wrapping_sub(tail) & PTR_MASK
}

fn slot_addr(base: u64, ptr: u32) -> DeviceAddr {
    DeviceAddr(base.wrapping_add(((ptr & IDX_MASK) as u64) * DESC_SIZE as u64))
}

/// Fetches up to `max` descriptors of a host-to-card ring into `out`, advancing the tail
/// register per descriptor. Returns how many were fetched.
pub fn fetch(
    regs: &RegisterFile,
    dma: &mut dyn DmaPort,
    id: RingId,
    out: &mut Vec<RawDesc>,
    max: usize,
) -> Result<usize, DmaFault> {
    let head = regs.ring(id, RingReg::Head);
    let mut tail = regs.ring(id, RingReg::Tail);
    let avail = used(head, tail);
    if avail > RING_LEN {
        regs.impossible_pointers(id, head, tail);
        return Ok(0);
    }
    // Acquire pairs with the host's release fence before its doorbell.
    fence(Ordering::Acquire);
    let base = regs.ring_base(id);
    let n = (avail as usize).min(max);
    for _ in 0..n {
        let mut d = RawDesc::ZERO;
        dma.read(slot_addr(base, tail), &mut d.0)?;
        out.push(d);
        tail = (tail + 1) & PTR_MASK;
        regs.set_ring(id, RingReg::Tail, tail);
    }
    Ok(n)
}

/// Free slots of a card-to-host ring.
pub fn free_slots(regs: &RegisterFile, id: RingId) -> u32 {
    let head = regs.ring(id, RingReg::Head);
    let tail = regs.ring(id, RingReg::Tail);
    RING_LEN.saturating_sub(used(head, tail))
}

/// Writes `descs` (already carrying valid and has_next) to a card-to-host ring as one unit.
/// Returns `Ok(false)`, writing nothing, when the ring lacks room for all of them: the card
/// never drops a report, it waits (back-pressure).
pub fn produce(
    regs: &RegisterFile,
    dma: &mut dyn DmaPort,
    id: RingId,
    descs: &[RawDesc],
) -> Result<bool, DmaFault> {
    if free_slots(regs, id) < descs.len() as u32 {
        return Ok(false);
    }
    let base = regs.ring_base(id);
    let mut head = regs.ring(id, RingReg::Head);
    for d in descs {
        let at = slot_addr(base, head);
        // Body first, then the byte holding the valid bit, so a host that sees valid sees
        // the whole descriptor.
        dma.write(at, &d.0[..DESC_SIZE - 1])?;
        fence(Ordering::Release);
        dma.write(
            DeviceAddr(at.0 + DESC_SIZE as u64 - 1),
            &d.0[DESC_SIZE - 1..],
        )?;
        head = (head + 1) & PTR_MASK;
    }
    regs.set_ring(id, RingReg::Head, head);
    regs.notify_host();
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::AddressMap;

    fn ring_memory(map: &AddressMap, backing: &mut [u8], dev: u64) {
        // SAFETY: the tests keep `backing` alive for as long as the map is used.
        unsafe { map.insert(DeviceAddr(dev), backing.as_mut_ptr(), backing.len()) };
    }

    #[test]
    fn fetch_reads_up_to_head_across_the_wrap() {
        let regs = RegisterFile::new();
        let mut map = AddressMap::new();
        let mut mem = vec![0u8; RING_LEN as usize * 32];
        ring_memory(&map, &mut mem, 0x10_0000);
        regs.write(0x100, 0x10_0000).unwrap();
        // Host filled slots 4094, 4095, 0 (pointers 4094..4097, guard flips at 4096).
        for (i, slot) in [4094usize, 4095, 0].iter().enumerate() {
            mem[slot * 32] = i as u8 + 1;
        }
        regs.set_ring(RingId::CmdRequest, RingReg::Tail, 4094);
        regs.write(0x108, 4097).unwrap();
        let mut out = Vec::new();
        let n = fetch(&regs, &mut map, RingId::CmdRequest, &mut out, 16).unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            out.iter().map(|d| d.0[0]).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(regs.read(0x10C).unwrap(), 4097);
        assert_eq!(
            fetch(&regs, &mut map, RingId::CmdRequest, &mut out, 16).unwrap(),
            0
        );
    }

    #[test]
    fn produce_respects_the_hosts_tail() {
        let regs = RegisterFile::new();
        let mut map = AddressMap::new();
        let mut mem = vec![0u8; RING_LEN as usize * 32];
        ring_memory(&map, &mut mem, 0x20_0000);
        regs.write(0x110, 0x20_0000).unwrap();
        let mut d = RawDesc::ZERO;
        d.0[31] = 0x80;
        // Ring full: head 4096 ahead of tail 0.
        regs.set_ring(RingId::CmdResponse, RingReg::Head, 4095);
        assert!(produce(&regs, &mut map, RingId::CmdResponse, &[d]).unwrap());
        assert!(!produce(&regs, &mut map, RingId::CmdResponse, &[d]).unwrap());
        regs.write(0x11C, 1).unwrap();
        assert!(produce(&regs, &mut map, RingId::CmdResponse, &[d]).unwrap());
        assert_eq!(regs.read(0x118).unwrap(), 4097);
        assert_eq!(mem[4095 * 32 + 31], 0x80);
        assert_eq!(mem[31], 0x80);
    }
}
