//! Work requests cut into send chunks, and into single packets for retransmission.
//!
//! The driver hands the card one chunk per pair of send descriptors; the card cuts each
//! chunk into packets at every **remote** address that is a multiple of the PMTU and gives
//! them consecutive PSNs from the chunk's PSN (nic-behaviour.md 1.2, confirmed by review T1).
//! So a chunk of `L` bytes at remote address `a` becomes
//! `((a + L - 1) >> p) - (a >> p) + 1` packets, one more than `L / PMTU` when `a` is not
//! aligned (the reference driver forgot that packet: reference-driver.md 6, bug 1).
//!
//! Rules the chunks follow:
//! - at most 64 KiB each ([`MAX_CHUNK_BYTES`], reference-driver.md 1.6 (c));
//! - every chunk but the last ends on a PMTU-aligned remote address, so the packets of the
//!   chunks are exactly the packets of the whole request and PSNs run on without a gap;
//! - no chunk crosses a 4 GiB remote boundary: the card's splitter computes on 32 bits and
//!   runs away on such a range (nic-behaviour-review.md T2). A 4 GiB boundary is also a
//!   PMTU boundary, so this split costs no packet.
//!
//! [`PacketFragmenter`] yields single-packet chunks with `is_retry` for a PSN range of one
//! work request, including the packets of a request that started before the range
//! (reference-driver.md 6, bug 4: the reference skipped them and never resent them).

use core::fmt;

use super::psn::{Psn, PsnRange, PSN_HALF};
use crate::addr::VirtAddr;
use crate::mtu::Pmtu;

/// Largest chunk the driver posts as one pair of send descriptors.
pub const MAX_CHUNK_BYTES: u32 = 64 * 1024;

/// Remote ranges are split at multiples of this (4 GiB): the card's 32-bit splitter fails
/// on a range that crosses one (nic-behaviour-review.md T2).
pub const REMOTE_SPLIT_BOUNDARY: u64 = 1 << 32;

/// Number of packets the card makes of `len` bytes at remote address `raddr`: the range is
/// cut at every multiple of the PMTU. A zero-length request is one packet.
pub const fn num_packets(raddr: u64, len: u32, pmtu: Pmtu) -> u32 {
    if len == 0 {
        return 1;
    }
    let shift = pmtu.shift();
    // u128: the count stays exact even for a range ending past 2^64 (rejected elsewhere).
    let last = raddr as u128 + len as u128 - 1;
    ((last >> shift) - ((raddr as u128) >> shift) + 1) as u32
}

/// The part of a work request the fragmenters need: where the bytes are, where they go,
/// how many, and the PSN of its first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrSpan {
    /// Local virtual address of the first byte (translated by the card through the lkey).
    pub laddr: VirtAddr,
    /// Remote virtual address of the first byte, in the peer's address space (rkey).
    pub raddr: VirtAddr,
    /// Length in bytes; 0 is a valid request of one packet.
    pub len: u32,
    /// PSN of the request's first packet.
    pub first_psn: Psn,
}

impl WrSpan {
    /// Number of packets (and PSNs) the request occupies.
    pub const fn packets(&self, pmtu: Pmtu) -> u32 {
        num_packets(self.raddr.0, self.len, pmtu)
    }

    /// The PSNs of the request's packets.
    pub const fn psns(&self, pmtu: Pmtu) -> PsnRange {
        PsnRange::new(self.first_psn, self.packets(pmtu))
    }

    fn check(&self, pmtu: Pmtu) -> Result<(), FragmentError> {
        // The last byte must be addressable; a range may end exactly at 2^64.
        let last = (self.len as u64).saturating_sub(1);
        if self.raddr.0.checked_add(last).is_none() {
            return Err(FragmentError::RemoteAddressOverflow {
                raddr: self.raddr,
                len: self.len,
            });
        }
        if self.laddr.0.checked_add(last).is_none() {
            return Err(FragmentError::LocalAddressOverflow {
                laddr: self.laddr,
                len: self.len,
            });
        }
        let packets = self.packets(pmtu);
        if packets >= PSN_HALF {
            return Err(FragmentError::TooManyPackets { packets });
        }
        Ok(())
    }
}

/// Why a work request cannot be fragmented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragmentError {
    /// The remote range runs past the end of the 64-bit address space.
    RemoteAddressOverflow {
        /// The remote start address.
        raddr: VirtAddr,
        /// The length.
        len: u32,
    },
    /// The local range runs past the end of the 64-bit address space.
    LocalAddressOverflow {
        /// The local start address.
        laddr: VirtAddr,
        /// The length.
        len: u32,
    },
    /// The request needs 2^23 PSNs or more: more than can be ordered in the PSN space.
    TooManyPackets {
        /// Packets the request would need.
        packets: u32,
    },
    /// The maximum chunk size is smaller than one PMTU, so no chunk could end aligned.
    ChunkSmallerThanPmtu {
        /// The requested maximum chunk size.
        max_chunk: u32,
        /// The PMTU in bytes.
        pmtu: u32,
    },
}

impl fmt::Display for FragmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FragmentError::RemoteAddressOverflow { raddr, len } => {
                write!(f, "remote range {:#x} + {len} overflows 64 bits", raddr.0)
            }
            FragmentError::LocalAddressOverflow { laddr, len } => {
                write!(f, "local range {:#x} + {len} overflows 64 bits", laddr.0)
            }
            FragmentError::TooManyPackets { packets } => {
                write!(f, "{packets} packets exceed the PSN window of 2^23")
            }
            FragmentError::ChunkSmallerThanPmtu { max_chunk, pmtu } => {
                write!(
                    f,
                    "maximum chunk {max_chunk} is smaller than the PMTU {pmtu}"
                )
            }
        }
    }
}

/// One piece of a work request, posted as one pair of send descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Local address of the chunk's first byte.
    pub laddr: VirtAddr,
    /// Remote address of the chunk's first byte.
    pub raddr: VirtAddr,
    /// Length in bytes (0 only for a zero-length request).
    pub len: u32,
    /// PSN of the chunk's first packet (Seg0.psn).
    pub psn: Psn,
    /// Number of packets, hence PSNs, the card makes of this chunk.
    pub packets: u32,
    /// The chunk holds the request's first packet (Seg1.is_first).
    pub is_first: bool,
    /// The chunk holds the request's last packet (Seg1.is_last).
    pub is_last: bool,
    /// The chunk is a retransmission (Seg1.is_retry; the BTH MigReq bit on the wire).
    pub is_retry: bool,
}

/// Cuts a work request into chunks (see the module documentation for the rules).
#[derive(Clone, Debug)]
pub struct Fragmenter {
    span: WrSpan,
    pmtu: Pmtu,
    max_chunk: u32,
    /// Bytes already handed out.
    done: u32,
    /// PSN of the next chunk.
    psn: Psn,
    finished: bool,
}

impl Fragmenter {
    /// A fragmenter with chunks of at most `max_chunk` bytes (normally [`MAX_CHUNK_BYTES`]).
    pub fn new(span: WrSpan, pmtu: Pmtu, max_chunk: u32) -> Result<Self, FragmentError> {
        if max_chunk < pmtu.bytes() {
            return Err(FragmentError::ChunkSmallerThanPmtu {
                max_chunk,
                pmtu: pmtu.bytes(),
            });
        }
        span.check(pmtu)?;
        Ok(Self {
            span,
            pmtu,
            max_chunk,
            done: 0,
            psn: span.first_psn,
            finished: false,
        })
    }

    /// Length of the chunk that starts at remote address `r` with `rem` bytes left.
    fn next_len(&self, r: u64, rem: u32) -> u32 {
        // u128: the boundary after the last 4 GiB of the address space is 2^64.
        let r = r as u128;
        let boundary = (r | (REMOTE_SPLIT_BOUNDARY as u128 - 1)) + 1;
        let limit = (r + self.max_chunk as u128).min(boundary);
        if r + rem as u128 <= limit {
            return rem;
        }
        // Not the last chunk: end on a PMTU boundary. max_chunk >= PMTU keeps this above r,
        // and the 4 GiB boundary is itself PMTU-aligned.
        let mask = self.pmtu.bytes() as u128 - 1;
        let end = ((r + self.max_chunk as u128) & !mask).min(boundary);
        (end - r) as u32
    }
}

impl Iterator for Fragmenter {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.finished {
            return None;
        }
        let rem = self.span.len - self.done;
        // `check` proved that the last byte of both ranges is addressable, and done < len.
        let raddr = self.span.raddr.0 + u64::from(self.done);
        let laddr = self.span.laddr.0 + u64::from(self.done);
        let len = self.next_len(raddr, rem);
        let packets = num_packets(raddr, len, self.pmtu);
        let chunk = Chunk {
            laddr: VirtAddr(laddr),
            raddr: VirtAddr(raddr),
            len,
            psn: self.psn,
            packets,
            is_first: self.done == 0,
            is_last: len == rem,
            is_retry: false,
        };
        self.done += len;
        self.psn = self.psn.wrapping_add(packets);
        self.finished = chunk.is_last;
        Some(chunk)
    }
}

impl core::iter::FusedIterator for Fragmenter {}

/// Yields the packets of one work request whose PSNs fall in a range, one single-packet
/// chunk each, marked `is_retry`.
///
/// The request may start before the range (its earlier packets are skipped, the later ones
/// resent) or end after it. Select the requests to resend with
/// `span.psns(pmtu).overlaps(range)`, not by their first PSN.
#[derive(Clone, Debug)]
pub struct PacketFragmenter {
    span: WrSpan,
    pmtu: Pmtu,
    /// Packets in the whole request.
    total: u32,
    /// Index of the next packet to yield, and one past the last.
    next: u32,
    end: u32,
}

impl PacketFragmenter {
    /// The packets of `span` whose PSNs lie in `range`. The request and the range must be
    /// within 2^23 PSNs of each other, as every outstanding PSN of a QP is.
    pub fn new(span: WrSpan, pmtu: Pmtu, range: PsnRange) -> Result<Self, FragmentError> {
        span.check(pmtu)?;
        let total = span.packets(pmtu);
        let lo = i64::from(span.first_psn.distance(range.start()));
        let hi = lo + i64::from(range.len());
        let clamp = |k: i64| k.clamp(0, i64::from(total)) as u32;
        let (next, end) = (clamp(lo), clamp(hi));
        Ok(Self {
            span,
            pmtu,
            total,
            next,
            end: end.max(next),
        })
    }

    /// Remote start address and length of packet `k < total`.
    fn packet(&self, k: u32) -> (u64, u32) {
        // u128: the request may end exactly at 2^64.
        let a = u128::from(self.span.raddr.0);
        let p = u128::from(self.pmtu.bytes());
        let aligned = a & !(p - 1);
        let start = if k == 0 {
            a
        } else {
            aligned + u128::from(k) * p
        };
        let stop = (aligned + (u128::from(k) + 1) * p).min(a + u128::from(self.span.len));
        // start <= last byte of the request, so it fits in u64; stop - start <= PMTU.
        (start as u64, stop.saturating_sub(start) as u32)
    }
}

impl Iterator for PacketFragmenter {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.next >= self.end {
            return None;
        }
        let k = self.next;
        self.next += 1;
        let (raddr, len) = self.packet(k);
        let offset = raddr - self.span.raddr.0;
        Some(Chunk {
            laddr: VirtAddr(self.span.laddr.0 + offset),
            raddr: VirtAddr(raddr),
            len,
            psn: self.span.first_psn.wrapping_add(k),
            packets: 1,
            is_first: k == 0,
            is_last: k + 1 == self.total,
            is_retry: true,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.end - self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for PacketFragmenter {}
impl core::iter::FusedIterator for PacketFragmenter {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const KIB: u32 = 1024;

    fn span(raddr: u64, len: u32, psn: u32) -> WrSpan {
        WrSpan {
            laddr: VirtAddr(0x7000_0000_0000 + 3),
            raddr: VirtAddr(raddr),
            len,
            first_psn: Psn::from_raw(psn),
        }
    }

    fn chunks(s: WrSpan, pmtu: Pmtu) -> Vec<Chunk> {
        Fragmenter::new(s, pmtu, MAX_CHUNK_BYTES).unwrap().collect()
    }

    #[test]
    fn num_packets_counts_the_leading_partial_packet() {
        let m = Pmtu::Mtu4096;
        assert_eq!(num_packets(0, 0, m), 1);
        assert_eq!(num_packets(0x1234, 0, m), 1);
        assert_eq!(num_packets(0, 4096, m), 1);
        assert_eq!(num_packets(0, 4097, m), 2);
        // Reference bug 1: 8192 bytes from 100 bytes before a boundary are 3 packets, not 2.
        assert_eq!(num_packets(4096 - 100, 8192, m), 3);
        assert_eq!(num_packets(4095, 2, m), 2);
        assert_eq!(num_packets(4095, 1, m), 1);
        assert_eq!(num_packets(0, u32::MAX, Pmtu::Mtu256), 1 << 24);
        assert_eq!(num_packets(u64::MAX, 1, Pmtu::Mtu256), 1);
    }

    #[test]
    fn aligned_request_splits_into_64k_chunks() {
        let c = chunks(span(0x10_0000, 200 * KIB, 7), Pmtu::Mtu4096);
        let lens: Vec<u32> = c.iter().map(|c| c.len).collect();
        assert_eq!(lens, [64 * KIB, 64 * KIB, 64 * KIB, 8 * KIB]);
        let psns: Vec<u32> = c.iter().map(|c| c.psn.get()).collect();
        assert_eq!(psns, [7, 23, 39, 55]);
        assert!(c[0].is_first && !c[0].is_last);
        assert!(!c[1].is_first && !c[1].is_last);
        assert!(!c[3].is_first && c[3].is_last);
        assert_eq!(c[2].raddr, VirtAddr(0x10_0000 + 128 * 1024));
        assert_eq!(c[2].laddr, VirtAddr(0x7000_0000_0000 + 3 + 128 * 1024));
        assert!(c.iter().all(|c| !c.is_retry));
    }

    #[test]
    fn unaligned_start_ends_chunks_on_pmtu_boundaries() {
        let pmtu = Pmtu::Mtu1024;
        let s = span(0x1_0100, 130 * KIB, 0xFF_FFFE);
        let c = chunks(s, pmtu);
        // First chunk: 0x10100 + 64 KiB = 0x20100, rounded down to 0x20000.
        assert_eq!(c[0].len, 0x20000 - 0x1_0100);
        assert_eq!(c[0].packets, 64);
        assert_eq!(c[1].raddr, VirtAddr(0x2_0000));
        assert_eq!(c[1].len, 64 * KIB);
        assert_eq!(
            c[1].psn,
            Psn::from_raw(0xFF_FFFE) + 64,
            "PSN wraps past 2^24"
        );
        assert_eq!(c[1].psn.get(), 62);
        let total: u32 = c.iter().map(|c| c.packets).sum();
        assert_eq!(total, s.packets(pmtu));
        assert_eq!(total, 131);
        for w in c.windows(2) {
            assert_eq!((w[0].raddr.0 + u64::from(w[0].len)) % 1024, 0);
            assert_eq!(w[1].psn, w[0].psn + w[0].packets);
        }
    }

    #[test]
    fn zero_length_request_is_one_chunk_of_one_psn() {
        let c = chunks(span(0x1234, 0, 99), Pmtu::Mtu256);
        assert_eq!(
            c,
            [Chunk {
                laddr: VirtAddr(0x7000_0000_0003),
                raddr: VirtAddr(0x1234),
                len: 0,
                psn: Psn::from_raw(99),
                packets: 1,
                is_first: true,
                is_last: true,
                is_retry: false,
            }]
        );
    }

    #[test]
    fn no_chunk_crosses_a_4_gib_remote_boundary() {
        let b = REMOTE_SPLIT_BOUNDARY;
        // 10 KiB starting 1 KiB + 100 bytes before 4 GiB, PMTU 4096.
        let s = span(b - 1124, 10 * KIB, 0);
        let c = chunks(s, Pmtu::Mtu4096);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].raddr.0 + u64::from(c[0].len), b);
        assert_eq!(c[1].raddr.0, b);
        assert_eq!(c[0].packets + c[1].packets, s.packets(Pmtu::Mtu4096));
        // Near the top of the address space the boundary is 2^64 itself.
        let top = span(u64::MAX - 99, 100, 0);
        assert_eq!(chunks(top, Pmtu::Mtu256).len(), 1);
    }

    #[test]
    fn invalid_requests_are_errors_not_panics() {
        let over = span(u64::MAX - 98, 100, 0);
        assert!(matches!(
            Fragmenter::new(over, Pmtu::Mtu256, MAX_CHUNK_BYTES),
            Err(FragmentError::RemoteAddressOverflow { len: 100, .. })
        ));
        let mut local = span(0, 100, 0);
        local.laddr = VirtAddr(u64::MAX);
        assert!(matches!(
            Fragmenter::new(local, Pmtu::Mtu256, MAX_CHUNK_BYTES),
            Err(FragmentError::LocalAddressOverflow { .. })
        ));
        assert_eq!(
            Fragmenter::new(span(0, 1, 0), Pmtu::Mtu4096, 2048).unwrap_err(),
            FragmentError::ChunkSmallerThanPmtu {
                max_chunk: 2048,
                pmtu: 4096
            }
        );
        let huge = span(0, u32::MAX, 0);
        let e = PacketFragmenter::new(huge, Pmtu::Mtu256, PsnRange::new(Psn::ZERO, 1));
        assert_eq!(
            e.unwrap_err(),
            FragmentError::TooManyPackets { packets: 1 << 24 }
        );
        assert_eq!(
            std::format!("{}", FragmentError::TooManyPackets { packets: 1 << 24 }),
            "16777216 packets exceed the PSN window of 2^23"
        );
    }

    #[test]
    fn packet_fragmenter_resends_a_request_that_started_before_the_range() {
        // Reference bug 4: a request of PSNs 10..=14 with loss reported from PSN 12 on.
        let pmtu = Pmtu::Mtu256;
        let s = span(0x1000 + 56, 4 * 256 + 100, 10);
        assert_eq!(s.packets(pmtu), 5);
        let range = PsnRange::from_bounds(Psn::from_raw(12), Psn::from_raw(40));
        assert!(s.psns(pmtu).overlaps(range));
        let p: Vec<Chunk> = PacketFragmenter::new(s, pmtu, range).unwrap().collect();
        let got: Vec<(u32, u64, u32, bool, bool)> = p
            .iter()
            .map(|c| (c.psn.get(), c.raddr.0, c.len, c.is_first, c.is_last))
            .collect();
        // The request covers [0x1038, 0x149C): packets start at 0x1038, 0x1100, ... 0x1400.
        assert_eq!(
            got,
            [
                (12, 0x1200, 256, false, false),
                (13, 0x1300, 256, false, false),
                (14, 0x1400, 0x9C, false, true),
            ]
        );
        assert!(p.iter().all(|c| c.is_retry && c.packets == 1));
        assert_eq!(p[0].laddr.0, s.laddr.0 + (0x1200 - (0x1000 + 56)));
    }

    #[test]
    fn packet_fragmenter_clips_both_ends_and_handles_first_packet() {
        let pmtu = Pmtu::Mtu256;
        let s = span(0x2000 + 200, 1000, 0xFF_FFFF);
        // Packets: [0x20C8,0x2100) 56 B, then 256, 256, 256, and 176 B: 5 packets.
        assert_eq!(s.packets(pmtu), 5);
        let all: Vec<Chunk> = PacketFragmenter::new(s, pmtu, s.psns(pmtu))
            .unwrap()
            .collect();
        assert_eq!(all.len(), 5);
        assert_eq!(
            (all[0].raddr.0, all[0].len, all[0].is_first),
            (0x20C8, 56, true)
        );
        assert_eq!(all[4].len, 1000 - 56 - 3 * 256);
        assert_eq!(all.iter().map(|c| c.len).sum::<u32>(), 1000);
        assert_eq!(all[1].psn, Psn::ZERO, "wraps");
        // A range that covers only the middle.
        let mid = PsnRange::new(Psn::from_raw(1), 2);
        let m: Vec<u32> = PacketFragmenter::new(s, pmtu, mid)
            .unwrap()
            .map(|c| c.psn.get())
            .collect();
        assert_eq!(m, [1, 2]);
        // Ranges entirely before or after yield nothing.
        let before = PsnRange::new(Psn::from_raw(0xFF_FF00), 0xFF);
        assert_eq!(PacketFragmenter::new(s, pmtu, before).unwrap().len(), 0);
        let after = PsnRange::new(Psn::from_raw(4), 10);
        assert_eq!(PacketFragmenter::new(s, pmtu, after).unwrap().len(), 0);
    }

    #[test]
    fn packet_fragmenter_zero_length_request() {
        let s = span(0x10, 0, 5);
        let p: Vec<Chunk> = PacketFragmenter::new(s, Pmtu::Mtu4096, PsnRange::new(Psn::ZERO, 100))
            .unwrap()
            .collect();
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].len, p[0].psn.get(), p[0].is_first, p[0].is_last),
            (0, 5, true, true)
        );
    }
}
