//! The raw-ring scenarios (issue B): work requests posted on blue0's send ring with the
//! core's descriptors, checked at blue1 byte for byte and report for report against the
//! hardware contract (nic-behaviour.md sections 1-4). They need clean links.
//!
//! Each scenario connects its own QP pair and registers its own buffers on the shared
//! testbed, so it sees no other scenario's reports, windows or bytes; the card counters
//! are compared before and after.

use std::time::Duration;

use bluerdma_core::desc::meta::{AckReport, MetaReport};
use bluerdma_core::desc::send::WorkReqOpcode;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::regs::Counter;
use bluerdma_core::wire::RdmaOpcode;

use super::testbed::{QpPair, Testbed, ALL_ACCESS};
use super::{ensure, Failure, Report, Sim};

/// How long after the last expected report to keep listening for more.
const QUIET: Duration = Duration::from_millis(30);
/// The longest a scenario waits for its reports or for the link to settle.
const MAX_WAIT: Duration = Duration::from_secs(5);
/// What a destination buffer holds where nothing may be written.
const UNTOUCHED: u8 = 0x5A;
/// Bytes of destination buffer kept on each side of a WRITE's range.
const GUARD: usize = 4096;
/// Remote offsets of [`WriteCase`] count from a boundary of this many bytes.
const PAGE: usize = 4096;
/// PSNs are 24 bits.
use bluerdma_core::transport::PSN_MASK;

/// One WRITE: `len` bytes from `local_offset` into the source buffer to `remote_offset`
/// into the destination buffer, first PSN `psn`, at `pmtu`.
#[derive(Clone, Copy, Debug)]
pub struct WriteCase {
    /// Payload length.
    pub len: usize,
    /// Start in the source MR.
    pub local_offset: usize,
    /// Start in the destination MR, counted from its first 4 KiB boundary after the guard
    /// bytes (so that the number of packets is known).
    pub remote_offset: usize,
    /// Path MTU of the QP pair.
    pub pmtu: Pmtu,
    /// First PSN. A fresh window expects PSNs below 112 or at the 24-bit wrap (a new QP's
    /// window sits just below PSN 0, nic-behaviour.md 3.2); anything else is a loss.
    pub psn: u32,
}

/// The WRITE scenarios of [`super::SCENARIOS`], in its order.
pub const WRITE_CASES: [WriteCase; 6] = [
    WriteCase {
        len: 1,
        local_offset: 0,
        remote_offset: 0,
        pmtu: Pmtu::Mtu4096,
        psn: 0,
    },
    WriteCase {
        len: 100,
        local_offset: 7,
        remote_offset: 13,
        pmtu: Pmtu::Mtu4096,
        psn: 5,
    },
    WriteCase {
        len: 3 * 1024,
        local_offset: 0,
        remote_offset: 0,
        pmtu: Pmtu::Mtu1024,
        psn: 0x20,
    },
    WriteCase {
        len: 64 * 1024 + 100,
        local_offset: 3,
        remote_offset: 100,
        pmtu: Pmtu::Mtu4096,
        psn: 0x10,
    },
    WriteCase {
        len: 1 << 20,
        local_offset: 0,
        remote_offset: 0,
        pmtu: Pmtu::Mtu4096,
        psn: 0,
    },
    WriteCase {
        len: 4 * 1024,
        local_offset: 0,
        remote_offset: 512,
        pmtu: Pmtu::Mtu1024,
        psn: 0xFF_FFFE,
    },
];

/// The payload byte at `i` for `seed`: varied, so a misplaced or missing byte shows.
pub fn pattern(seed: u64, i: usize) -> u8 {
    let word = splitmix64(seed ^ (i as u64 / 8));
    (word >> ((i % 8) * 8)) as u8
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How many packets a chunk of `len` bytes to `raddr` makes: one per PMTU-aligned window
/// of the remote range (nic-behaviour.md 1.2).
pub fn packet_count(raddr: u64, len: usize, pmtu: Pmtu) -> u32 {
    let p = u64::from(pmtu.bytes());
    let last = raddr + len.max(1) as u64 - 1;
    (last / p - raddr / p + 1) as u32
}

/// The (opcode, PSN) of every packet report for `qpn`.
fn packets_for(reports: &[MetaReport], qpn: Qpn) -> Vec<(RdmaOpcode, u32)> {
    reports
        .iter()
        .filter_map(|r| match r {
            MetaReport::Packet(p) if p.dqpn == qpn => Some((p.opcode, p.psn)),
            _ => None,
        })
        .collect()
}

/// The last quiet-timer report (AckLocalHw) for `qpn`.
fn last_quiet_report(reports: &[MetaReport], qpn: Qpn) -> Option<AckReport> {
    reports.iter().rev().find_map(|r| match r {
        MetaReport::Ack(a) if a.is_send_by_local_hw && a.qpn == qpn => Some(*a),
        _ => None,
    })
}

fn naks_for(reports: &[MetaReport], qpn: Qpn) -> Vec<AckReport> {
    reports
        .iter()
        .filter_map(|r| match r {
            MetaReport::Nak(a, _) if a.qpn == qpn => Some(*a),
            _ => None,
        })
        .collect()
}

/// Where `expected` and `actual` first differ and how many bytes do.
fn first_difference(expected: &[u8], actual: &[u8]) -> Option<(usize, usize)> {
    let first = expected.iter().zip(actual).position(|(a, b)| a != b)?;
    let count = expected.iter().zip(actual).filter(|(a, b)| a != b).count();
    Some((first, count))
}

/// A WRITE lands intact, nothing around it changes, the card reports FIRST and LAST (or
/// ONLY) with the right PSNs, and its quiet-timer bitmap holds every PSN of the chunk.
pub fn write(sim: &mut Sim<'_>, case: &WriteCase) -> Result<Report, Failure> {
    let seed = sim.seed();
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(ALL_ACCESS, case.pmtu)?;
    let src = bed.register(0, case.local_offset + case.len, ALL_ACCESS, |i| {
        pattern(seed, i)
    })?;
    // Room to start at a page boundary, so that the packet count is the case's own.
    let dst_len = GUARD + PAGE + case.remote_offset + case.len + GUARD;
    let dst = bed.register(1, dst_len, ALL_ACCESS, |_| UNTOUCHED)?;
    let to_page = (PAGE - (dst.at(GUARD) % PAGE as u64) as usize) % PAGE;
    let at = GUARD + to_page + case.remote_offset;
    let n = packet_count(dst.at(at), case.len, case.pmtu);
    let last_psn = case.psn.wrapping_add(n - 1) & PSN_MASK;
    let before = bed.nic_stats(1);
    bed.post(
        0,
        &[qp.write(&src, case.local_offset, &dst, at, case.len, case.psn)],
    )?;
    let reports = bed.reports_until(1, QUIET, MAX_WAIT, |r| {
        packets_for(r, qp.qpn[1])
            .iter()
            .any(|(op, _)| op.is_last() || op.is_only())
            && last_quiet_report(r, qp.qpn[1]).is_some()
    });

    let sent = &bed.bytes(&src)[case.local_offset..][..case.len];
    let landed = bed.bytes(&dst);
    if let Some((first, count)) = first_difference(sent, &landed[at..at + case.len]) {
        return Err(Failure(format!(
            "{count} of {} bytes differ, the first at offset {first}",
            case.len
        )));
    }
    let outside = landed[..at]
        .iter()
        .chain(&landed[at + case.len..])
        .filter(|b| **b != UNTOUCHED)
        .count();
    ensure(outside == 0, || {
        format!("{outside} bytes written outside the WRITE's range")
    })?;

    let expected = if n == 1 {
        vec![(RdmaOpcode::WriteOnly, case.psn)]
    } else {
        vec![
            (RdmaOpcode::WriteFirst, case.psn),
            (RdmaOpcode::WriteLast, last_psn),
        ]
    };
    let got = packets_for(&reports, qp.qpn[1]);
    ensure(got == expected, || {
        format!("packet reports {got:?}, expected {expected:?}")
    })?;
    let ack = last_quiet_report(&reports, qp.qpn[1])
        .ok_or_else(|| Failure("no quiet-timer report".into()))?;
    // Bit i of the window is PSN psn_now - 112 + i; check every PSN of the chunk that the
    // final window still covers.
    let base = ack.psn_now.wrapping_sub(112) & PSN_MASK;
    let missing: Vec<u32> = (0..n)
        .map(|k| case.psn.wrapping_add(k) & PSN_MASK)
        .filter(|psn| {
            let bit = psn.wrapping_sub(base) & PSN_MASK;
            bit < 128 && ack.now_bitmap >> bit & 1 == 0
        })
        .collect();
    ensure(missing.is_empty(), || {
        format!(
            "quiet-timer bitmap (psn_now {:#x}) lacks PSNs {missing:x?}",
            ack.psn_now
        )
    })?;
    let naks = naks_for(&reports, qp.qpn[1]);
    ensure(naks.is_empty(), || {
        format!("unexpected NAK reports {naks:?}")
    })?;

    let after = bed.nic_stats(1);
    let payload = after.rx_payload_bytes - before.rx_payload_bytes;
    let accepted = after.rx_accepted - before.rx_accepted;
    ensure(
        payload == case.len as u64 && accepted == u64::from(n),
        || {
            format!(
                "card counted {payload} payload bytes in {accepted} packets, expected {} in {n}",
                case.len
            )
        },
    )?;
    let reported = if n == 1 { "ONLY" } else { "FIRST+LAST" };
    Ok(Report::notes(format!(
        "{n} packet(s), PSN {:#x}..={last_psn:#x}, {reported} reported, bitmap ok, {} bytes intact",
        case.psn, case.len
    )))
}

/// A WRITE that blue1 refuses: posts it, lets the link settle, and checks that not one
/// byte landed, that no packet was reported, and that `counter` rose by `expected`.
fn refused_write(
    bed: &mut Testbed,
    qp: &QpPair,
    post: impl FnOnce(&mut Testbed) -> Result<(), Failure>,
    dst: &super::testbed::Mr,
    counter: Counter,
    expected: impl FnOnce(u32) -> bool,
) -> Result<u32, Failure> {
    let before = bed.counter(1, counter);
    let payload_before = bed.nic_stats(1).rx_payload_bytes;
    post(bed)?;
    ensure(bed.settle(Duration::from_millis(20), MAX_WAIT), || {
        "the link did not settle".into()
    })?;
    let reports = bed.reports_until(1, QUIET, QUIET, |_| true);
    let delta = bed.counter(1, counter).wrapping_sub(before);
    ensure(expected(delta), || format!("{counter:?} rose by {delta}"))?;
    let got = packets_for(&reports, qp.qpn[1]);
    ensure(got.is_empty(), || {
        format!("refused packets were reported: {got:?}")
    })?;
    let written = bed.bytes(dst).iter().filter(|b| **b != UNTOUCHED).count();
    let payload = bed.nic_stats(1).rx_payload_bytes - payload_before;
    ensure(written == 0 && payload == 0, || {
        format!("{written} bytes changed, {payload} payload bytes counted")
    })?;
    Ok(delta)
}

/// A WRITE whose rkey has the wrong key byte: every packet is dropped and counted in
/// InvalidMrKey, nothing is written or reported.
pub fn rkey_violation(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let seed = sim.seed();
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu4096)?;
    let len = 8192;
    let src = bed.register(0, len, ALL_ACCESS, |i| pattern(seed, i))?;
    let dst = bed.register(1, len, ALL_ACCESS, |_| UNTOUCHED)?;
    let wrong = MrKey::new(dst.key.index(), dst.key.key() ^ 1)
        .ok_or_else(|| Failure("no wrong key".into()))?;
    let n = packet_count(dst.va, len, Pmtu::Mtu4096);
    let mut request = qp.write(&src, 0, &dst, 0, len, 0);
    request.seg0.rkey = wrong;
    let delta = refused_write(
        bed,
        &qp,
        |bed| Ok(bed.post(0, &[request])?),
        &dst,
        Counter::InvalidMrKey,
        |d| d == n,
    )?;
    Ok(Report::notes(format!(
        "rkey {:#x} for {:#x}: {delta} packets counted in InvalidMrKey, 0 bytes written, no report",
        wrong.get(),
        dst.key.get()
    )))
}

/// A WRITE that runs one byte past the MR: the packet that crosses the end is dropped and
/// counted in MemOutOfBounds; the MR's last byte is untouched.
pub fn out_of_bounds(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let seed = sim.seed();
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu4096)?;
    // Not a PMTU multiple: the packet that crosses the end (bytes 4096..=8092 of a
    // page-aligned MR) also holds the MR's last bytes, which must stay untouched.
    let len = 8192 - 100;
    let src = bed.register(0, len, ALL_ACCESS, |i| pattern(seed, i))?;
    let dst = bed.register(1, len, ALL_ACCESS, |_| UNTOUCHED)?;
    let before = bed.counter(1, Counter::MemOutOfBounds);
    bed.post(0, &[qp.write(&src, 0, &dst, 1, len, 0)])?;
    ensure(bed.settle(Duration::from_millis(20), MAX_WAIT), || {
        "the link did not settle".into()
    })?;
    let reports = bed.reports_until(1, QUIET, QUIET, |_| true);
    let delta = bed.counter(1, Counter::MemOutOfBounds).wrapping_sub(before);
    ensure(delta >= 1, || "MemOutOfBounds did not rise".into())?;
    let last = bed.bytes(&dst)[len - 1];
    ensure(last == UNTOUCHED, || {
        format!("the MR's last byte became {last:#x}")
    })?;
    let got = packets_for(&reports, qp.qpn[1]);
    ensure(
        got.iter().all(|(op, _)| !op.is_last() && !op.is_only()),
        || format!("the refused LAST packet was reported: {got:?}"),
    )?;
    Ok(Report::notes(format!(
        "{delta} packet(s) counted in MemOutOfBounds, last byte untouched"
    )))
}

/// A WRITE to a QP whose receive side lacks REMOTE_WRITE: dropped, counted in
/// InvalidQpAccess, nothing written.
pub fn qp_access(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let seed = sim.seed();
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(AccessFlags::LOCAL_WRITE, Pmtu::Mtu4096)?;
    let len = 100;
    let src = bed.register(0, len, ALL_ACCESS, |i| pattern(seed, i))?;
    let dst = bed.register(1, len, ALL_ACCESS, |_| UNTOUCHED)?;
    let request = qp.write(&src, 0, &dst, 0, len, 0);
    let delta = refused_write(
        bed,
        &qp,
        |bed| Ok(bed.post(0, &[request])?),
        &dst,
        Counter::InvalidQpAccess,
        |d| d == 1,
    )?;
    Ok(Report::notes(format!(
        "{delta} packet counted in InvalidQpAccess, 0 bytes written"
    )))
}

/// A READ request reaches blue1 as a two-descriptor report carrying the requester's
/// address and key in its extension (the card checks no rkey on a READ: correction 12a).
pub fn read_request(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu4096)?;
    let sink = bed.register(0, 4096, ALL_ACCESS, |_| 0)?;
    let raddr = 0x7000_1234_5000u64;
    let rkey = MrKey::new(9, 0x99).ok_or_else(|| Failure("bad test key".into()))?;
    let psn = 0x42;
    let request = qp.request(
        WorkReqOpcode::Read,
        sink.va,
        sink.key,
        raddr,
        rkey,
        4096,
        psn,
    );
    bed.post(0, &[request])?;
    let reports = bed.reports_until(1, QUIET, MAX_WAIT, |r| {
        r.iter().any(|m| matches!(m, MetaReport::ReadRequest(..)))
    });
    let (info, ext) = reports
        .iter()
        .find_map(|r| match r {
            MetaReport::ReadRequest(i, e) if i.dqpn == qp.qpn[1] => Some((*i, *e)),
            _ => None,
        })
        .ok_or_else(|| Failure(format!("no READ request report in {reports:?}")))?;
    let fields = [
        ("opcode", info.opcode == RdmaOpcode::ReadRequest),
        ("psn", info.psn == psn),
        ("raddr", info.raddr.0 == raddr),
        ("rkey", info.rkey == rkey),
        ("total_len", info.total_len == 4096),
        ("ext.laddr", ext.laddr.0 == sink.va),
        ("ext.lkey", ext.lkey == sink.key),
        ("ext.total_len", ext.total_len == 4096),
    ];
    let wrong: Vec<&str> = fields
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect();
    ensure(wrong.is_empty(), || {
        format!("wrong fields {wrong:?} in {info:?} / {ext:?}")
    })?;
    Ok(Report::notes(format!(
        "ReadRequest + extension: PSN {psn:#x}, raddr {raddr:#x}, laddr and lkey of the sink"
    )))
}

/// PSN 0, then PSN 200: the gap slides out of blue1's window, so blue1 sends a NAK to the
/// requester and reports the loss locally (nic-behaviour.md 3.4); blue0 reports the NAK.
pub fn psn_gap(sim: &mut Sim<'_>) -> Result<Report, Failure> {
    let seed = sim.seed();
    let bed = sim.bed()?;
    bed.drain_reports();
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu4096)?;
    let src = bed.register(0, 64, ALL_ACCESS, |i| pattern(seed, i))?;
    let dst = bed.register(1, 4096, ALL_ACCESS, |_| UNTOUCHED)?;
    let naks_before = bed.nic_stats(1).naks_sent;
    bed.post(
        0,
        &[
            qp.write(&src, 0, &dst, 0, 64, 0),
            qp.write(&src, 0, &dst, 0, 64, 200),
        ],
    )?;
    let local = bed.reports_until(1, QUIET, MAX_WAIT, |r| !naks_for(r, qp.qpn[1]).is_empty());
    let nak = *naks_for(&local, qp.qpn[1])
        .first()
        .ok_or_else(|| Failure(format!("no local NAK report in {local:?}")))?;
    ensure(
        nak.is_send_by_local_hw && nak.is_packet_lost && nak.is_window_slided,
        || format!("local NAK flags wrong: {nak:?}"),
    )?;
    ensure(nak.psn_now == 200 & !0xF && nak.msn == 0, || {
        format!(
            "local NAK psn_now {:#x} msn {}, expected 0xc0 and 0",
            nak.psn_now, nak.msn
        )
    })?;
    let remote = bed.reports_until(0, QUIET, MAX_WAIT, |r| !naks_for(r, qp.qpn[0]).is_empty());
    let rnak = *naks_for(&remote, qp.qpn[0])
        .first()
        .ok_or_else(|| Failure(format!("blue0 did not report the NAK: {remote:?}")))?;
    ensure(
        !rnak.is_send_by_local_hw && !rnak.is_send_by_driver && rnak.is_packet_lost,
        || format!("remote NAK flags wrong: {rnak:?}"),
    )?;
    ensure(rnak.psn_now == nak.psn_now, || {
        format!(
            "remote NAK psn_now {:#x} != local {:#x}",
            rnak.psn_now, nak.psn_now
        )
    })?;
    let naks = bed.nic_stats(1).naks_sent - naks_before;
    ensure(naks == 1, || format!("blue1 sent {naks} NAK packets"))?;
    Ok(Report::notes(format!(
        "1 NAK packet, local report psn_now {:#x}, blue0 reported it for its QP {:#x}",
        nak.psn_now,
        qp.qpn[0].get()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_cut_at_remote_pmtu_boundaries() {
        assert_eq!(packet_count(0x1000, 1, Pmtu::Mtu4096), 1);
        assert_eq!(packet_count(0x1000, 4096, Pmtu::Mtu4096), 1);
        assert_eq!(packet_count(0x1001, 4096, Pmtu::Mtu4096), 2);
        assert_eq!(packet_count(0x1000, 3072, Pmtu::Mtu1024), 3);
        assert_eq!(
            packet_count(0x1000 + 100, 64 * 1024 + 100, Pmtu::Mtu4096),
            17
        );
    }

    #[test]
    fn the_pattern_depends_on_seed_and_position() {
        let a: Vec<u8> = (0..64).map(|i| pattern(1, i)).collect();
        let b: Vec<u8> = (0..64).map(|i| pattern(2, i)).collect();
        assert_ne!(a, b);
        assert!(a.windows(8).any(|w| w[0] != w[7]));
    }
}
