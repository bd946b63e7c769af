//! A state dump for debugging (issue C item 4): rings, queue pairs, memory regions and every
//! counter, written to any `core::fmt::Write` (no allocation).

use core::fmt::{self, Write};

use super::*;

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
                self.cmd.head().csr(),
                self.cmd.cached_tail().csr(),
                self.cmd.pending(),
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
            ("cmd-response", self.resp.tail().csr()),
            ("meta-report", self.meta.tail().csr()),
            ("simple-nic-rx", self.sn_rx.tail().csr()),
        ] {
            writeln!(out, "  {name:<14} tail {tail:#06x}")?;
        }
        let s = self.storage.slices();
        writeln!(out, "queue pairs:")?;
        for q in s.qps.iter().filter(|q| q.in_use) {
            let timer = match q.deadline {
                Some(d) if d >= now => {
                    let left = d - now;
                    (left.0 / 1_000) as i64
                }
                Some(d) => -(((now - d).0 / 1_000) as i64),
                None => 0,
            };
            writeln!(
                out,
                "  qp {:#08x} {} -> {:#08x}@{} pmtu {} | sq: next psn {:#08x} acked {:#08x} wqes {} sent {} timer {} us retries {}/{} | rq: base {:#08x} acked {:#08x} msgs {} recvs {}",
                q.qpn.get(),
                q.state,
                q.dest_qpn.get(),
                q.peer_ip,
                q.pmtu.bytes(),
                q.next_psn.get(),
                q.acked_psn.get(),
                q.sq_len,
                q.sq_sent,
                if q.deadline.is_some() { timer } else { 0 },
                q.retries_left,
                q.retry_cnt,
                q.rx.base().get(),
                q.acked_rx.get(),
                q.msgs.len(),
                q.recvs.len(),
            )?;
        }
        writeln!(out, "memory regions:")?;
        for m in s.mrs.iter().filter(|m| m.in_use) {
            writeln!(
                out,
                "  key {:#010x} va {:#x} len {} access {:#x} pd {} pgt {}+{}",
                m.key, m.va, m.len, m.access, m.pd, m.pgt_offset, m.pages
            )?;
        }
        writeln!(out, "completion queues:")?;
        for (i, cq) in s.cqs.iter().enumerate().filter(|(_, c)| c.in_use) {
            writeln!(out, "  cq {i} queued {} overruns {}", cq.len, cq.overruns)?;
        }
        writeln!(out, "counters: {:?}", self.stats)
    }
}
