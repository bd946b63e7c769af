//! A state dump for debugging (issue C item 4): rings, queue pairs, memory regions and every
//! counter, written to any `core::fmt::Write` (no allocation).

use core::fmt::{self, Write};

use super::{Device, Platform, Storage, Timer};
use crate::time::Instant;

impl<P: Platform, S: Storage> Device<P, S> {
    /// Writes the device's state: rings (head, tail, pending), QPs (state, PSNs, outstanding
    /// work, timers), MRs and the engine's counters.
    pub fn dump(&mut self, out: &mut dyn Write, now: Instant) -> fmt::Result {
        let c = &self.cfg;
        writeln!(
            out,
            "device {} mac {} page {} B",
            c.ip,
            c.mac,
            c.page_size.bytes()
        )?;
        writeln!(out, "rings (driver's view):")?;
        for (name, head, tail, pending) in [
            (
                "cmd-request",
                self.commands.request_ring().head().csr(),
                self.commands.request_ring().cached_tail().csr(),
                self.commands.request_ring().pending(),
            ),
            (
                "send",
                self.send.head().csr(),
                self.send.cached_tail().csr(),
                self.send.pending(),
            ),
            (
                "simple-nic-tx",
                self.sn_tx.head().csr(),
                self.sn_tx.cached_tail().csr(),
                self.sn_tx.pending(),
            ),
        ] {
            writeln!(
                out,
                "  {name:<14} head {head:#06x} tail(cached) {tail:#06x} pending {pending}"
            )?;
        }
        for (name, tail) in [
            ("cmd-response", self.commands.response_ring().tail().csr()),
            ("meta-report", self.meta.tail().csr()),
            ("simple-nic-rx", self.sn_rx.tail().csr()),
        ] {
            writeln!(out, "  {name:<14} tail {tail:#06x}")?;
        }
        writeln!(out, "queue pairs:")?;
        for i in self.qp_indices() {
            if !self.qp(i).in_use() {
                continue;
            }
            let deadline = self.timers(i).get(Timer::Retransmit);
            let timer = match deadline {
                Some(d) if d >= now => ((d - now).0 / 1_000) as i64,
                Some(d) => -(((now - d).0 / 1_000) as i64),
                None => 0,
            };
            let (len, sent) = (self.sq(i).len(), self.sq(i).sent());
            let q = self.qp(i);
            let a = q.attrs;
            writeln!(
                out,
                "  qp {:#08x} {} -> {:#08x}@{} pmtu {} | sq: next psn {:#08x} acked {:#08x} wqes {} sent {} timer {} us retries {}/{} | rq: base {:#08x} acked {:#08x} msgs {} recvs {} peer's {}",
                a.qpn.get(),
                a.state,
                a.dest_qpn.get(),
                a.peer_ip,
                a.pmtu.bytes(),
                q.req.next_psn().get(),
                q.req.acked_psn().get(),
                len,
                sent,
                timer,
                q.req.retries_left(),
                a.retry_cnt,
                q.resp.base().get(),
                q.resp.acked().get(),
                q.resp.queued(),
                q.rq.posted(),
                q.rq.lists.remote_len(),
            )?;
        }
        let s = self.storage.slices();
        writeln!(out, "memory regions:")?;
        for m in s.mrs.iter().filter(|m| m.pd_in_use().is_some()) {
            writeln!(
                out,
                "  key {:#010x} va {:#x} len {} access {:#x} pd {} pgt {}+{}",
                m.key.get(),
                m.va,
                m.len,
                m.access.bits(),
                m.pd,
                m.pgt_offset,
                m.pages
            )?;
        }
        writeln!(out, "completion queues:")?;
        for (i, cq) in s.cqs.iter().enumerate().filter(|(_, c)| c.in_use) {
            writeln!(out, "  cq {i} queued {} overruns {}", cq.len, cq.overruns)?;
        }
        writeln!(out, "counters: {:?}", self.stats())
    }
}
