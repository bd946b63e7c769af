//! Datagrams of several frames put back together on the receive side: a datagram longer
//! than one frame's payload arrives as FIRST, MIDDLE..., LAST frames with consecutive PSNs
//! from one source QP (`bluerdma_core::wire::ud`). Frames of different sources interleave
//! freely, and the frames of one datagram may arrive in any order: the emulated link
//! reorders the frames in flight when it moves a destination from UDP to shared memory, as
//! a path change does on a network (an in-order rule lost the first datagram of about one
//! `ibv_ud_pingpong -s 2048` run in five under load). Like IP reassembly, the pieces wait,
//! by PSN, until a FIRST..LAST run is complete. A source keeps at most [`PIECES`] pieces
//! waiting and a QP at most [`SOURCES`] sources; the oldest pieces go first, counted as
//! broken: their datagram lost a frame, as UD allows. So does a run that would grow past
//! the port's MTU.

use std::net::Ipv4Addr;

use bluerdma_core::wire::ud::{UdFrame, UdPart, UD_MAX_DATAGRAM};

/// Sources with pieces waiting that a QP keeps at once; the oldest is dropped beyond.
const SOURCES: usize = 16;
/// Pieces one source keeps waiting (a datagram has at most three frames: two datagrams in
/// flight and a stray fit).
const PIECES: usize = 8;
/// A PSN's 24 bits.
const PSN_MASK: u32 = 0xFF_FFFF;

/// One frame of a datagram of several, waiting for the others.
struct Piece {
    psn: u32,
    part: UdPart,
    imm: Option<u32>,
    data: Vec<u8>,
}

/// The pieces from one source QP, oldest first (the oldest are dropped first).
struct Source {
    from: (Ipv4Addr, u32),
    pieces: Vec<Piece>,
}

/// What a frame amounts to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Assembled {
    /// A whole datagram: this frame's payload.
    Whole,
    /// The frame completed a datagram of several: all of it, and the immediate data of its
    /// LAST frame.
    Complete { data: Vec<u8>, imm: Option<u32> },
    /// More frames are to come.
    Incomplete,
}

/// A QP's datagrams in progress.
#[derive(Default)]
pub(crate) struct Reassembly {
    sources: Vec<Source>,
    /// Pieces dropped without completing their datagram (see [`Reassembly::take_broken`]).
    broken: u64,
}

impl Reassembly {
    /// Takes frame `f` with `payload`.
    pub(crate) fn add(&mut self, f: &UdFrame, payload: &[u8]) -> Assembled {
        if f.part == UdPart::Only {
            return Assembled::Whole;
        }
        let from = (f.src_ip, f.deth.src_qpn);
        let at = match self.sources.iter().position(|s| s.from == from) {
            Some(i) => i,
            None => {
                if self.sources.len() >= SOURCES {
                    let gone = self.sources.remove(0);
                    self.broken += gone.pieces.len() as u64;
                }
                self.sources.push(Source {
                    from,
                    pieces: Vec::with_capacity(PIECES),
                });
                self.sources.len() - 1
            }
        };
        let src = &mut self.sources[at];
        // A frame seen again (the same PSN) replaces the one waiting.
        if let Some(i) = src.pieces.iter().position(|p| p.psn == f.psn) {
            src.pieces.remove(i);
            self.broken += 1;
        }
        if src.pieces.len() >= PIECES {
            src.pieces.remove(0);
            self.broken += 1;
        }
        src.pieces.push(Piece {
            psn: f.psn,
            part: f.part,
            imm: f.imm,
            data: payload.to_vec(),
        });
        let Some((first, n)) = complete_run(&src.pieces, f.psn) else {
            return Assembled::Incomplete;
        };
        // The run's PSNs are first, first + 1, ..., every one of them waiting.
        let in_run = |p: &Piece| ((p.psn.wrapping_sub(first)) & PSN_MASK) < n;
        let len: usize = src
            .pieces
            .iter()
            .filter(|p| in_run(p))
            .map(|p| p.data.len())
            .sum();
        if len > UD_MAX_DATAGRAM {
            src.pieces.retain(|p| !in_run(p));
            self.broken += u64::from(n);
            self.forget_empty();
            return Assembled::Incomplete;
        }
        let mut data = Vec::with_capacity(len);
        let mut imm = None;
        for k in 0..n {
            let psn = (first + k) & PSN_MASK;
            if let Some(i) = src.pieces.iter().position(|p| p.psn == psn) {
                let p = src.pieces.remove(i);
                data.extend_from_slice(&p.data);
                if p.part == UdPart::Last {
                    imm = p.imm;
                }
            }
        }
        self.forget_empty();
        Assembled::Complete { data, imm }
    }

    /// Pieces dropped since the last call, each from a datagram that lost a frame (or
    /// grew past the MTU).
    pub(crate) fn take_broken(&mut self) -> u64 {
        std::mem::take(&mut self.broken)
    }

    /// Forgets every datagram in progress (the QP was reset).
    pub(crate) fn clear(&mut self) {
        self.sources.clear();
    }

    fn forget_empty(&mut self) {
        self.sources.retain(|s| !s.pieces.is_empty());
    }
}

/// The FIRST's PSN and the frame count of the complete run through `psn` among `pieces`,
/// if every frame of it, FIRST to LAST, is there.
fn complete_run(pieces: &[Piece], psn: u32) -> Option<(u32, u32)> {
    let part = |psn: u32| pieces.iter().find(|p| p.psn == psn).map(|p| p.part);
    // Back to the FIRST: only MIDDLEs (or this frame) on the way.
    let mut first = psn;
    let mut steps = 0;
    loop {
        match part(first)? {
            UdPart::First => break,
            UdPart::Middle => {}
            UdPart::Last if first == psn => {}
            UdPart::Last | UdPart::Only => return None,
        }
        steps += 1;
        if steps > PIECES {
            return None;
        }
        first = first.wrapping_sub(1) & PSN_MASK;
    }
    // On to the LAST: only MIDDLEs between.
    let mut n = 1;
    while n <= PIECES as u32 {
        match part((first + n) & PSN_MASK)? {
            UdPart::Middle => n += 1,
            UdPart::Last => return Some((first, n + 1)),
            UdPart::First | UdPart::Only => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use bluerdma_core::wire::ud::{Deth, DEFAULT_PKEY};
    use bluerdma_core::wire::MacAddr;

    fn frame(src_qpn: u32, psn: u32, part: UdPart) -> UdFrame {
        UdFrame {
            src_mac: MacAddr::BROADCAST,
            dst_mac: MacAddr::BROADCAST,
            src_ip: Ipv4Addr::new(127, 0, 0, 1),
            dst_ip: Ipv4Addr::new(127, 0, 0, 2),
            udp_src_port: 0,
            pkey: DEFAULT_PKEY,
            solicited: false,
            dst_qpn: 0x80_0000,
            psn,
            deth: Deth { qkey: 1, src_qpn },
            imm: None,
            part,
        }
    }

    fn whole(data: &[u8], imm: Option<u32>) -> Assembled {
        Assembled::Complete {
            data: data.to_vec(),
            imm,
        }
    }

    #[test]
    fn interleaved_sources_are_put_back_together_in_order() {
        let mut r = Reassembly::default();
        assert_eq!(
            r.add(&frame(1, 10, UdPart::First), b"ab"),
            Assembled::Incomplete
        );
        assert_eq!(
            r.add(&frame(2, 0xFF_FFFF, UdPart::First), b"xy"),
            Assembled::Incomplete
        );
        assert_eq!(
            r.add(&frame(1, 11, UdPart::Middle), b"cd"),
            Assembled::Incomplete
        );
        assert_eq!(r.add(&frame(3, 5, UdPart::Only), b"z"), Assembled::Whole);
        assert_eq!(r.add(&frame(2, 0, UdPart::Last), b"!"), whole(b"xy!", None));
        assert_eq!(
            r.add(&frame(1, 12, UdPart::Last), b"e"),
            whole(b"abcde", None)
        );
        assert_eq!(r.take_broken(), 0);
        assert!(r.sources.is_empty(), "nothing left waiting");
    }

    #[test]
    fn frames_of_a_datagram_may_arrive_in_any_order() {
        // Every order of a three-frame datagram (PSN wrapping inside it) gives the bytes
        // in PSN order and the LAST frame's immediate data.
        let parts = [
            (0xFF_FFFF, UdPart::First, &b"ab"[..]),
            (0, UdPart::Middle, &b"cd"[..]),
            (1, UdPart::Last, &b"e"[..]),
        ];
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut r = Reassembly::default();
            let mut got = Vec::new();
            for &k in &order {
                let (psn, part, data) = parts[k];
                let mut f = frame(7, psn, part);
                if part == UdPart::Last {
                    f.imm = Some(0xfeed);
                }
                got.push(r.add(&f, data));
            }
            assert_eq!(got[..2], [Assembled::Incomplete, Assembled::Incomplete]);
            assert_eq!(got[2], whole(b"abcde", Some(0xfeed)), "order {order:?}");
            assert_eq!(r.take_broken(), 0);
        }
        // The first datagram's LAST overtaken by the next datagram's frames.
        let mut r = Reassembly::default();
        r.add(&frame(1, 10, UdPart::First), b"a");
        r.add(&frame(1, 12, UdPart::First), b"c");
        assert_eq!(r.add(&frame(1, 13, UdPart::Last), b"d"), whole(b"cd", None));
        assert_eq!(r.add(&frame(1, 11, UdPart::Last), b"b"), whole(b"ab", None));
    }

    #[test]
    fn a_missing_frame_drops_the_datagram_and_nothing_else() {
        let mut r = Reassembly::default();
        r.add(&frame(1, 10, UdPart::First), b"ab");
        assert_eq!(
            r.add(&frame(1, 12, UdPart::Last), b"e"),
            Assembled::Incomplete,
            "11 lost: waits"
        );
        assert_eq!(r.add(&frame(1, 20, UdPart::Only), b"z"), Assembled::Whole);
        r.add(&frame(1, 30, UdPart::First), &[0; 3000]);
        assert_eq!(
            r.add(&frame(1, 31, UdPart::Last), &[0; 1200]),
            Assembled::Incomplete,
            "> MTU"
        );
        assert_eq!(r.take_broken(), 2, "the run past the MTU");
        // The stray pieces of the lost datagram go once newer pieces need the room.
        for k in 0..PIECES as u32 {
            let part = if k % 2 == 0 {
                UdPart::First
            } else {
                UdPart::Last
            };
            let got = r.add(&frame(1, 40 + k, part), b"p");
            if k % 2 == 1 {
                assert_eq!(got, whole(b"pp", None));
            }
        }
        r.add(&frame(1, 100, UdPart::First), b"q");
        r.add(&frame(1, 102, UdPart::First), b"q");
        r.add(&frame(1, 104, UdPart::First), b"q");
        r.add(&frame(1, 106, UdPart::First), b"q");
        r.add(&frame(1, 108, UdPart::First), b"q");
        r.add(&frame(1, 110, UdPart::First), b"q");
        r.add(&frame(1, 112, UdPart::First), b"q");
        assert_eq!(r.take_broken(), 1, "PSN 10 went first");
        assert_eq!(
            r.add(&frame(1, 11, UdPart::Last), b"b"),
            Assembled::Incomplete,
            "its FIRST is gone"
        );
        assert_eq!(r.take_broken(), 1, "PSN 12 made room");
        for q in 0..(SOURCES as u32 + 4) {
            r.add(&frame(q + 10, 0, UdPart::First), b"p");
        }
        assert_eq!(r.sources.len(), SOURCES, "bounded");
        assert!(r.sources.iter().all(|s| s.pieces.len() <= PIECES));
    }
}
