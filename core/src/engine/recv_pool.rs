//! The shared table of receive WRs: every QP's posted receive WRs and the ones its peer
//! announced live in one table (caller storage), each QP's as two linked FIFO lists. A QP
//! reserves the receive WRs it may post (its `max_recv_wr`) when it is created, so a post
//! within that never finds the table full; announcements from peers take what no QP
//! reserved.

use crate::oob::RecvWr as OobRecvWr;

use super::wr::RecvWr;
use crate::addr::VirtAddr;
use crate::keys::MrKey;

/// No entry.
const NIL: u32 = u32::MAX;

/// One receive WR of the shared table (its fields are the engine's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvEntry {
    wr_id: u64,
    addr: u64,
    len: u32,
    lkey: u32,
    next: u32,
}

impl Default for RecvEntry {
    fn default() -> Self {
        RecvEntry {
            wr_id: 0,
            addr: 0,
            len: 0,
            lkey: 0,
            next: NIL,
        }
    }
}

impl RecvEntry {
    fn local(r: &RecvWr) -> Self {
        RecvEntry {
            wr_id: r.wr_id,
            addr: r.addr.0,
            len: r.len,
            lkey: r.lkey.get(),
            next: NIL,
        }
    }

    fn remote(r: &OobRecvWr) -> Self {
        RecvEntry {
            wr_id: r.wr_id,
            addr: r.addr,
            len: r.length,
            lkey: r.lkey,
            next: NIL,
        }
    }

    /// As a receive WR posted here.
    pub(crate) fn to_local(self) -> RecvWr {
        RecvWr {
            wr_id: self.wr_id,
            addr: VirtAddr(self.addr),
            len: self.len,
            lkey: MrKey::from_raw(self.lkey),
        }
    }

    /// As a receive WR the peer QP `qpn` announced.
    pub(crate) fn to_remote(self, qpn: u32) -> OobRecvWr {
        OobRecvWr {
            wr_id: self.wr_id,
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
            qpn,
        }
    }
}

/// The table's free entries and its reservations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecvPool {
    /// Entries given back, linked through `next`.
    free: u32,
    /// Every entry from here on has never been used.
    fresh: u32,
    /// Receive WRs the QPs may post (the sum of their `max_recv_wr`).
    reserved: u32,
    /// Entries holding announced receive WRs of peers.
    remote: u32,
    /// Entries in the table.
    total: u32,
}

impl RecvPool {
    /// A pool over a table of `total` entries.
    pub(crate) fn new(total: usize) -> Self {
        RecvPool {
            free: NIL,
            fresh: 0,
            reserved: 0,
            remote: 0,
            total: total.min(NIL as usize - 1) as u32,
        }
    }

    /// Reserves `n` entries for a QP's posts: at most half the table is reserved, so peers'
    /// announcements always have room too.
    pub(crate) fn reserve(&mut self, n: u32) -> bool {
        let fits = self
            .reserved
            .checked_add(n)
            .is_some_and(|r| r <= self.total / 2);
        if fits {
            self.reserved += n;
        }
        fits
    }

    /// Gives back a reservation.
    pub(crate) fn unreserve(&mut self, n: u32) {
        self.reserved = self.reserved.saturating_sub(n);
    }

    fn take(&mut self, table: &mut [RecvEntry], e: RecvEntry) -> Option<u32> {
        let at = if self.free != NIL {
            let at = self.free;
            self.free = table.get(at as usize)?.next;
            at
        } else if self.fresh < self.total && (self.fresh as usize) < table.len() {
            self.fresh += 1;
            self.fresh - 1
        } else {
            return None;
        };
        table[at as usize] = e;
        Some(at)
    }

    fn give(&mut self, table: &mut [RecvEntry], at: u32) {
        if let Some(e) = table.get_mut(at as usize) {
            e.next = self.free;
            self.free = at;
        }
    }
}

/// A FIFO list of entries of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvList {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for RecvList {
    fn default() -> Self {
        RecvList {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl RecvList {
    fn push(&mut self, pool: &mut RecvPool, table: &mut [RecvEntry], e: RecvEntry) -> Option<u32> {
        let at = pool.take(table, e)?;
        match table.get_mut(self.tail as usize) {
            Some(t) => t.next = at,
            None => self.head = at,
        }
        self.tail = at;
        self.len += 1;
        Some(at)
    }

    fn pop(&mut self, pool: &mut RecvPool, table: &mut [RecvEntry]) -> Option<(u32, RecvEntry)> {
        let at = self.head;
        let e = *table.get(at as usize)?;
        self.head = e.next;
        if self.head == NIL {
            self.tail = NIL;
        }
        self.len -= 1;
        pool.give(table, at);
        Some((at, e))
    }

    fn front(&self, table: &[RecvEntry]) -> Option<RecvEntry> {
        table.get(self.head as usize).copied()
    }
}

/// A QP's receive WRs in the table: its own, in the order they are announced to the peer,
/// and the peer's, in the order they arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvLists {
    local: RecvList,
    /// The first local entry not announced to the peer yet (`NIL`: all are).
    unannounced: u32,
    remote: RecvList,
    /// Receive WRs the QP may have posted at once (its reservation).
    cap: u32,
}

impl Default for RecvLists {
    fn default() -> Self {
        RecvLists {
            local: RecvList::default(),
            unannounced: NIL,
            remote: RecvList::default(),
            cap: 0,
        }
    }
}

impl RecvLists {
    /// Empty lists of a QP that may post `cap` receive WRs.
    pub(crate) fn with_cap(cap: u32) -> Self {
        RecvLists {
            cap,
            ..RecvLists::default()
        }
    }

    /// The QP's `max_recv_wr`.
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }

    /// Receive WRs posted and not completed.
    pub(crate) fn posted(&self) -> u32 {
        self.local.len
    }

    /// Announced receive WRs of the peer not used yet.
    pub(crate) fn remote_len(&self) -> u32 {
        self.remote.len
    }

    /// Appends a receive WR posted here; false when the QP holds `cap` already.
    pub(crate) fn post(
        &mut self,
        pool: &mut RecvPool,
        table: &mut [RecvEntry],
        r: &RecvWr,
        announce: bool,
    ) -> bool {
        if self.local.len >= self.cap {
            return false;
        }
        let Some(at) = self.local.push(pool, table, RecvEntry::local(r)) else {
            return false;
        };
        if announce && self.unannounced == NIL {
            self.unannounced = at;
        }
        true
    }

    /// Takes the oldest posted receive WR (to complete it).
    pub(crate) fn pop_local(
        &mut self,
        pool: &mut RecvPool,
        table: &mut [RecvEntry],
    ) -> Option<RecvWr> {
        let (at, e) = self.local.pop(pool, table)?;
        if at == self.unannounced {
            self.unannounced = e.next;
        }
        Some(e.to_local())
    }

    /// The oldest posted receive WR's id.
    pub(crate) fn oldest(&self, table: &[RecvEntry]) -> Option<u64> {
        self.local.front(table).map(|e| e.wr_id)
    }

    /// The next receive WR to announce to the peer, without taking it off the list.
    pub(crate) fn next_to_announce(&self, table: &[RecvEntry]) -> Option<RecvWr> {
        table.get(self.unannounced as usize).map(|e| e.to_local())
    }

    /// Receive WRs wait to be announced.
    #[inline]
    pub(crate) fn has_unannounced(&self) -> bool {
        self.unannounced != NIL
    }

    /// The receive WR [`RecvLists::next_to_announce`] gave was announced.
    pub(crate) fn announced(&mut self, table: &[RecvEntry]) {
        self.unannounced = table.get(self.unannounced as usize).map_or(NIL, |e| e.next);
    }

    /// Nothing is left to announce (the QP was flushed).
    pub(crate) fn forget_unannounced(&mut self) {
        self.unannounced = NIL;
    }

    /// Appends a receive WR the peer announced; false when every entry peers may use is
    /// taken.
    pub(crate) fn add_remote(
        &mut self,
        pool: &mut RecvPool,
        table: &mut [RecvEntry],
        r: &OobRecvWr,
    ) -> bool {
        if pool.remote >= pool.total - pool.reserved.min(pool.total) {
            return false;
        }
        let ok = self
            .remote
            .push(pool, table, RecvEntry::remote(r))
            .is_some();
        pool.remote += ok as u32;
        ok
    }

    /// The peer's next announced receive WR (for peer QP `qpn`).
    pub(crate) fn next_remote(&self, table: &[RecvEntry], qpn: u32) -> Option<OobRecvWr> {
        self.remote.front(table).map(|e| e.to_remote(qpn))
    }

    /// Drops the peer's next announced receive WR (a SEND used it).
    pub(crate) fn pop_remote(&mut self, pool: &mut RecvPool, table: &mut [RecvEntry]) {
        if self.remote.pop(pool, table).is_some() {
            pool.remote -= 1;
        }
    }

    /// Gives every entry back (the QP is reset or destroyed); the reservation stays.
    pub(crate) fn clear(&mut self, pool: &mut RecvPool, table: &mut [RecvEntry]) {
        while self.local.pop(pool, table).is_some() {}
        while self.remote.len > 0 {
            self.pop_remote(pool, table);
        }
        *self = RecvLists::with_cap(self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(id: u64) -> RecvWr {
        RecvWr {
            wr_id: id,
            addr: VirtAddr(0x1000 * id),
            len: 64,
            lkey: MrKey::from_raw(0x100),
        }
    }

    #[test]
    fn lists_of_several_qps_share_the_table_in_order() {
        let mut table = [RecvEntry::default(); 8];
        let mut pool = RecvPool::new(8);
        assert!(
            pool.reserve(2) && pool.reserve(2) && !pool.reserve(1),
            "half the table"
        );
        let (mut a, mut b) = (RecvLists::with_cap(2), RecvLists::with_cap(2));
        assert!(a.post(&mut pool, &mut table, &wr(1), true));
        assert!(b.post(&mut pool, &mut table, &wr(10), true));
        assert!(a.post(&mut pool, &mut table, &wr(2), true));
        assert!(!a.post(&mut pool, &mut table, &wr(3), true), "cap 2");
        assert_eq!(a.next_to_announce(&table).map(|r| r.wr_id), Some(1));
        a.announced(&table);
        assert_eq!(a.next_to_announce(&table).map(|r| r.wr_id), Some(2));
        assert_eq!(a.pop_local(&mut pool, &mut table).map(|r| r.wr_id), Some(1));
        assert_eq!(a.oldest(&table), Some(2));
        // Popping the first unannounced WR moves the cursor on.
        assert_eq!(a.pop_local(&mut pool, &mut table).map(|r| r.wr_id), Some(2));
        assert_eq!(a.next_to_announce(&table), None);
        assert!(a.post(&mut pool, &mut table, &wr(4), false));
        assert_eq!(
            a.next_to_announce(&table),
            None,
            "posted in ERR: not announced"
        );
        assert_eq!(
            b.pop_local(&mut pool, &mut table).map(|r| r.wr_id),
            Some(10)
        );
    }

    #[test]
    fn peers_take_only_what_no_qp_reserved() {
        let mut table = [RecvEntry::default(); 8];
        let mut pool = RecvPool::new(8);
        assert!(pool.reserve(4));
        let mut a = RecvLists::with_cap(4);
        let rec = |id| OobRecvWr {
            wr_id: id,
            addr: 0x2000,
            length: 8,
            lkey: 0x200,
            qpn: 0x300,
        };
        for id in 0..4 {
            assert!(a.add_remote(&mut pool, &mut table, &rec(id)));
        }
        assert!(!a.add_remote(&mut pool, &mut table, &rec(9)), "4 reserved");
        for id in 0..4 {
            assert!(
                a.post(&mut pool, &mut table, &wr(id), true),
                "the reservation holds"
            );
        }
        assert_eq!(a.next_remote(&table, 0x300), Some(rec(0)));
        a.pop_remote(&mut pool, &mut table);
        assert!(a.add_remote(&mut pool, &mut table, &rec(9)));
        a.clear(&mut pool, &mut table);
        assert_eq!((a.posted(), a.remote_len(), a.cap()), (0, 0, 4));
        pool.unreserve(4);
        let mut b = RecvLists::with_cap(0);
        for id in 0..8 {
            assert!(
                b.add_remote(&mut pool, &mut table, &rec(id)),
                "{id}: all free again"
            );
        }
    }
}
