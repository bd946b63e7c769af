//! Property tests of the transport bookkeeping against simple independent models:
//! the fragmenters against a per-packet and a per-byte walk of the remote range, PSN and
//! MSN ordering laws, and the PSN bitmap against a `BTreeSet` of unwrapped positions.

use std::collections::BTreeSet;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::transport::bitmap::{MarkCounts, PsnBitmap, SetOutcome};
use bluerdma_core::transport::fragmenter::{
    num_packets, Chunk, Fragmenter, PacketFragmenter, WrSpan, MAX_CHUNK_BYTES,
    REMOTE_SPLIT_BOUNDARY,
};
use bluerdma_core::transport::msn::Msn;
use bluerdma_core::transport::psn::{Psn, PsnRange, PSN_HALF, PSN_MODULUS};
use proptest::prelude::*;

fn pmtu() -> impl Strategy<Value = Pmtu> {
    (1u8..=5).prop_map(|v| Pmtu::from_ibv(v).unwrap())
}

/// Remote addresses that are often unaligned and often close to a 4 GiB boundary.
fn raddr() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u32>().prop_map(u64::from),
        (1u64..16, 0u64..300_000).prop_map(|(g, d)| g * REMOTE_SPLIT_BOUNDARY - d),
        (0u64..1 << 40).prop_map(|a| a & !0xFFF),
    ]
}

/// PSNs that are often just below the wrap at 2^24.
fn psn() -> impl Strategy<Value = Psn> {
    prop_oneof![
        any::<u32>().prop_map(Psn::from_raw),
        (0u32..2000).prop_map(|d| Psn::from_raw(PSN_MODULUS - 1000 + d)),
    ]
}

/// Packet count by walking the remote range packet by packet.
fn packets_by_walk(raddr: u64, len: u32, pmtu: Pmtu) -> u32 {
    if len == 0 {
        return 1;
    }
    let p = u128::from(pmtu.bytes());
    let (mut pos, end) = (u128::from(raddr), u128::from(raddr) + u128::from(len));
    let mut n = 0;
    while pos < end {
        pos = ((pos / p + 1) * p).min(end);
        n += 1;
    }
    n
}

/// Packet count as the number of distinct PMTU frames that the bytes touch.
fn packets_by_bytes(raddr: u64, len: u32, pmtu: Pmtu) -> u32 {
    if len == 0 {
        return 1;
    }
    let frames: BTreeSet<u128> = (0..u128::from(len))
        .map(|i| (u128::from(raddr) + i) >> pmtu.shift())
        .collect();
    frames.len() as u32
}

fn collect(span: WrSpan, pmtu: Pmtu, max_chunk: u32) -> Vec<Chunk> {
    Fragmenter::new(span, pmtu, max_chunk).unwrap().collect()
}

/// The single packets of a chunk, cut at PMTU-aligned remote addresses as the card does.
fn split_chunk(c: &Chunk, pmtu: Pmtu) -> Vec<(u64, u64, u32, Psn)> {
    let p = u64::from(pmtu.bytes());
    if c.len == 0 {
        return vec![(c.laddr.0, c.raddr.0, 0, c.psn)];
    }
    let mut out = Vec::new();
    let (mut pos, end) = (c.raddr.0, c.raddr.0 + u64::from(c.len));
    let mut psn = c.psn;
    while pos < end {
        let next = ((pos / p + 1) * p).min(end);
        out.push((c.laddr.0 + (pos - c.raddr.0), pos, (next - pos) as u32, psn));
        psn += 1;
        pos = next;
    }
    out
}

proptest! {
    #[test]
    fn num_packets_matches_the_per_packet_walk(
        raddr in raddr(), len in prop_oneof![0u32..=1 << 20, any::<u32>()], pmtu in pmtu()
    ) {
        prop_assume!(len < 1 << 24 || pmtu.bytes() >= 1024);
        prop_assert_eq!(num_packets(raddr, len, pmtu), packets_by_walk(raddr, len, pmtu));
    }

    #[test]
    fn num_packets_matches_the_per_byte_model(raddr in raddr(), len in 0u32..20_000, pmtu in pmtu()) {
        prop_assert_eq!(num_packets(raddr, len, pmtu), packets_by_bytes(raddr, len, pmtu));
    }

    #[test]
    fn fragmenter_chunks_tile_the_request(
        laddr in any::<u64>().prop_map(|a| a >> 2),
        raddr in raddr(),
        len in prop_oneof![0u32..10_000, 0u32..600_000, 0u32..(8 << 20)],
        first_psn in psn(),
        pmtu in pmtu(),
        chunk_pmtus in prop_oneof![Just(None), (1u32..20).prop_map(Some)],
        chunk_extra in 0u32..4096,
    ) {
        let max_chunk = match chunk_pmtus {
            None => MAX_CHUNK_BYTES,
            Some(k) => k * pmtu.bytes() + chunk_extra,
        };
        let span = WrSpan { laddr: VirtAddr(laddr), raddr: VirtAddr(raddr), len, first_psn };
        let chunks = collect(span, pmtu, max_chunk);
        let p = u64::from(pmtu.bytes());
        prop_assert!(!chunks.is_empty());
        prop_assert_eq!(chunks.iter().map(|c| u64::from(c.len)).sum::<u64>(), u64::from(len));
        prop_assert_eq!(chunks[0].raddr.0, raddr);
        prop_assert_eq!(chunks[0].laddr.0, laddr);
        prop_assert_eq!(chunks[0].psn, first_psn);
        let mut total = 0u32;
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            prop_assert_eq!(c.is_first, i == 0);
            prop_assert_eq!(c.is_last, last);
            prop_assert!(!c.is_retry);
            prop_assert!(c.len <= max_chunk);
            prop_assert!(c.len > 0 || len == 0);
            prop_assert_eq!(c.packets, num_packets(c.raddr.0, c.len, pmtu));
            let end = u128::from(c.raddr.0) + u128::from(c.len);
            if c.len > 0 {
                let b = u128::from(REMOTE_SPLIT_BOUNDARY);
                prop_assert_eq!(u128::from(c.raddr.0) / b, (end - 1) / b, "crosses 4 GiB");
            }
            if !last {
                prop_assert_eq!(end % u128::from(p), 0, "chunk end not PMTU-aligned");
                let n = &chunks[i + 1];
                prop_assert_eq!(u128::from(n.raddr.0), end);
                prop_assert_eq!(n.laddr.0, c.laddr.0 + u64::from(c.len));
                prop_assert_eq!(n.psn, c.psn + c.packets);
            }
            total += c.packets;
        }
        prop_assert_eq!(total, num_packets(raddr, len, pmtu));
        prop_assert_eq!(total, packets_by_walk(raddr, len, pmtu));
    }

    #[test]
    fn packet_fragmenter_agrees_with_the_cards_split_of_the_chunks(
        raddr in raddr(),
        len in 0u32..200_000,
        first_psn in psn(),
        pmtu in pmtu(),
        lo in -50i32..400,
        range_len in 0u32..400,
    ) {
        let span = WrSpan { laddr: VirtAddr(0x5555_0000), raddr: VirtAddr(raddr), len, first_psn };
        let expected: Vec<(u64, u64, u32, Psn)> = collect(span, pmtu, MAX_CHUNK_BYTES)
            .iter()
            .flat_map(|c| split_chunk(c, pmtu))
            .collect();
        let total = span.packets(pmtu);
        prop_assert_eq!(expected.len() as u32, total);

        let range = PsnRange::new(first_psn + lo as u32, range_len);
        let got: Vec<Chunk> = PacketFragmenter::new(span, pmtu, range).unwrap().collect();
        let want: Vec<&(u64, u64, u32, Psn)> =
            expected.iter().filter(|e| range.contains(e.3)).collect();
        prop_assert_eq!(got.len(), want.len());
        prop_assert_eq!(span.psns(pmtu).overlaps(range), !want.is_empty());
        for (g, w) in got.iter().zip(want) {
            prop_assert_eq!((g.laddr.0, g.raddr.0, g.len, g.psn), *w);
            prop_assert!(g.is_retry);
            prop_assert_eq!(g.packets, 1);
            prop_assert_eq!(g.is_first, g.psn == first_psn);
            prop_assert_eq!(g.is_last, g.psn == first_psn + (total - 1));
        }
    }

    #[test]
    fn psn_ordering_is_antisymmetric_and_consistent(a in psn(), b in psn()) {
        prop_assert!(!(a.is_before(b) && b.is_before(a)));
        prop_assert_eq!(a.is_before(b), b.is_after(a));
        let d = a.distance(b);
        prop_assert!(d > -(PSN_HALF as i32) && d <= PSN_HALF as i32);
        prop_assert_eq!(a.wrapping_add(d as u32), b);
        prop_assert_eq!(b.wrapping_sub(d as u32), a);
        let half = a.forward_distance(b) == PSN_HALF;
        if half {
            prop_assert!(!a.is_before(b) && !a.is_after(b));
        } else {
            prop_assert_eq!(b.distance(a), -d);
            let count = [a == b, a.is_before(b), a.is_after(b)].iter().filter(|x| **x).count();
            prop_assert_eq!(count, 1, "exactly one of equal, before, after");
            prop_assert_eq!(a.is_before(b), d > 0);
        }
    }

    #[test]
    fn psn_ordering_is_transitive_within_a_quarter(a in psn(), x in 1u32..1 << 22, y in 1u32..1 << 22) {
        let b = a + x;
        let c = b + y;
        prop_assert!(a.is_before(b) && b.is_before(c) && a.is_before(c));
    }

    #[test]
    fn msn_ordering_is_antisymmetric(a in any::<u16>(), b in any::<u16>()) {
        let (a, b) = (Msn::new(a), Msn::new(b));
        prop_assert!(!(a.is_before(b) && b.is_before(a)));
        prop_assert_eq!(a.is_before(b), b.is_after(a));
        prop_assert_eq!(a.wrapping_add(a.distance(b) as u16), b);
    }
}

// ---------------------------------------------------------------------------------------
// PSN bitmap against a model of unwrapped positions.

const W: u64 = 256;
type Bm = PsnBitmap<4>;

#[derive(Clone, Debug)]
enum Op {
    Set(i64),
    SetRange(i64, u32),
    Merge(i64, u128),
    Advance,
    AdvanceTo(i64),
}

fn op() -> impl Strategy<Value = Op> {
    // Offsets relative to the current base, reaching below it and beyond the window.
    let off = -300i64..(W as i64 + 300);
    prop_oneof![
        4 => off.clone().prop_map(Op::Set),
        2 => (off.clone(), 0u32..200).prop_map(|(o, l)| Op::SetRange(o, l)),
        2 => (off.clone(), any::<u128>()).prop_map(|(o, b)| Op::Merge(o, b)),
        2 => Just(Op::Advance),
        1 => off.prop_map(Op::AdvanceTo),
    ]
}

/// The model: set positions and the base, as unwrapped integers (PSN = position mod 2^24).
struct Model {
    base: u64,
    set: BTreeSet<u64>,
}

impl Model {
    fn psn(pos: u64) -> Psn {
        Psn::from_raw(pos as u32)
    }
    fn mark(&mut self, pos: u64, counts: &mut MarkCounts) -> SetOutcome {
        if pos < self.base {
            counts.below_base += 1;
            SetOutcome::BelowBase
        } else if pos >= self.base + W {
            counts.beyond_window += 1;
            SetOutcome::BeyondWindow
        } else if self.set.insert(pos) {
            counts.newly_set += 1;
            SetOutcome::Set
        } else {
            SetOutcome::AlreadySet
        }
    }
    fn move_base(&mut self, to: u64) {
        self.base = to;
        self.set = self.set.split_off(&to);
    }
    fn is_set(&self, pos: u64) -> bool {
        pos < self.base || self.set.contains(&pos)
    }
    fn missing(&self, start: u64, len: u64) -> Vec<u64> {
        (start..start + len)
            .filter(|&p| p >= self.base && (p >= self.base + W || !self.set.contains(&p)))
            .collect()
    }
}

fn runs(positions: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in positions {
        match out.last_mut() {
            Some((s, l)) if *s + *l == p => *l += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

proptest! {
    #[test]
    fn bitmap_matches_a_btreeset_model(
        start in prop_oneof![any::<u32>(), (0u32..600).prop_map(|d| PSN_MODULUS - 300 + d)],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let start = u64::from(start & (PSN_MODULUS - 1));
        // Unwrapped positions start high enough that offsets below the base stay positive.
        let origin = start + u64::from(PSN_MODULUS);
        let mut model = Model { base: origin, set: BTreeSet::new() };
        let mut bm = Bm::new(Model::psn(origin));
        for op in ops {
            let at = |o: i64| (model.base as i64 + o) as u64;
            match op {
                Op::Set(o) => {
                    let pos = at(o);
                    let mut c = MarkCounts::default();
                    prop_assert_eq!(bm.set(Model::psn(pos)), model.mark(pos, &mut c));
                }
                Op::SetRange(o, len) => {
                    let pos = at(o);
                    let mut want = MarkCounts::default();
                    for p in pos..pos + u64::from(len) {
                        model.mark(p, &mut want);
                    }
                    prop_assert_eq!(bm.set_range(PsnRange::new(Model::psn(pos), len)), want);
                }
                Op::Merge(o, bits) => {
                    let pos = at(o);
                    let mut want = MarkCounts::default();
                    for i in 0..128 {
                        if bits >> i & 1 == 1 {
                            model.mark(pos + i, &mut want);
                        }
                    }
                    prop_assert_eq!(bm.merge_window(Model::psn(pos), bits), want);
                }
                Op::Advance => {
                    let mut b = model.base;
                    while model.set.contains(&b) {
                        b += 1;
                    }
                    model.move_base(b);
                    prop_assert_eq!(bm.advance(), Model::psn(b));
                }
                Op::AdvanceTo(o) => {
                    let pos = at(o);
                    if pos > model.base {
                        model.move_base(pos);
                    }
                    prop_assert_eq!(bm.advance_to(Model::psn(pos)), Model::psn(model.base));
                }
            }
            prop_assert_eq!(bm.base(), Model::psn(model.base));
            for p in model.base - 3..model.base + W + 3 {
                prop_assert_eq!(bm.is_set(Model::psn(p)), model.is_set(p), "position {}", p);
            }
            let first = (model.base..model.base + W).find(|p| !model.set.contains(p));
            prop_assert_eq!(bm.first_missing(), Model::psn(first.unwrap_or(model.base + W)));
            let (qs, ql) = (model.base - 20, W + 60);
            let want = model.missing(qs, ql);
            let got: Vec<Psn> = bm.missing(PsnRange::new(Model::psn(qs), ql as u32)).collect();
            prop_assert_eq!(got, want.iter().map(|&p| Model::psn(p)).collect::<Vec<_>>());
            let got_runs: Vec<(Psn, u32)> = bm
                .missing_runs(PsnRange::new(Model::psn(qs), ql as u32))
                .map(|r| (r.start(), r.len()))
                .collect();
            let want_runs: Vec<(Psn, u32)> =
                runs(&want).iter().map(|&(s, l)| (Model::psn(s), l as u32)).collect();
            prop_assert_eq!(got_runs, want_runs);
        }
    }
}
