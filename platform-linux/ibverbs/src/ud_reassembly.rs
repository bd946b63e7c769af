//! Datagrams of several frames put back together on the receive side: a datagram longer
//! than one frame's payload arrives as FIRST, MIDDLE..., LAST frames with consecutive PSNs
//! from one source QP (`bluerdma_core::wire::ud`). Frames of different sources interleave
//! freely; a frame that does not continue its source's datagram (one lost or reordered on
//! the way) drops that datagram, as UD allows, and so does one that would grow it past the
//! port's MTU.

use std::net::Ipv4Addr;

use bluerdma_core::wire::ud::{UdFrame, UdPart, UD_MAX_DATAGRAM};

/// Sources with a datagram in progress a QP keeps at once; the oldest is dropped beyond.
const PARTIALS: usize = 16;

/// A datagram in progress.
struct Partial {
    from: (Ipv4Addr, u32),
    next_psn: u32,
    data: Vec<u8>,
}

/// What a frame amounts to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Assembled {
    /// A whole datagram: this frame's payload.
    Whole,
    /// The last frame of a datagram of several: all of it.
    Complete(Vec<u8>),
    /// More frames are to come.
    Incomplete,
    /// The frame breaks its source's datagram (a frame missing before it, or too long):
    /// what was gathered is dropped.
    Broken,
}

/// A QP's datagrams in progress.
#[derive(Default)]
pub(crate) struct Reassembly {
    partials: Vec<Partial>,
}

impl Reassembly {
    /// Takes frame `f` with `payload`.
    pub(crate) fn add(&mut self, f: &UdFrame, payload: &[u8]) -> Assembled {
        let from = (f.src_ip, f.deth.src_qpn);
        let at = self.partials.iter().position(|p| p.from == from);
        match f.part {
            UdPart::Only => {
                // A whole datagram also ends any of the same source that lost its tail.
                if let Some(i) = at {
                    self.partials.swap_remove(i);
                }
                Assembled::Whole
            }
            UdPart::First => {
                if let Some(i) = at {
                    self.partials.swap_remove(i);
                }
                if self.partials.len() >= PARTIALS {
                    self.partials.remove(0);
                }
                let mut data = Vec::with_capacity(UD_MAX_DATAGRAM);
                data.extend_from_slice(payload);
                self.partials.push(Partial {
                    from,
                    next_psn: (f.psn + 1) & 0xFF_FFFF,
                    data,
                });
                Assembled::Incomplete
            }
            UdPart::Middle | UdPart::Last => {
                let Some(i) = at else {
                    return Assembled::Broken;
                };
                let p = &mut self.partials[i];
                if p.next_psn != f.psn || p.data.len() + payload.len() > UD_MAX_DATAGRAM {
                    self.partials.swap_remove(i);
                    return Assembled::Broken;
                }
                p.data.extend_from_slice(payload);
                p.next_psn = (p.next_psn + 1) & 0xFF_FFFF;
                if f.part == UdPart::Middle {
                    return Assembled::Incomplete;
                }
                Assembled::Complete(self.partials.swap_remove(i).data)
            }
        }
    }

    /// Forgets every datagram in progress (the QP was reset).
    pub(crate) fn clear(&mut self) {
        self.partials.clear();
    }
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
        assert_eq!(
            r.add(&frame(2, 0, UdPart::Last), b"!"),
            Assembled::Complete(b"xy!".to_vec())
        );
        assert_eq!(
            r.add(&frame(1, 12, UdPart::Last), b"e"),
            Assembled::Complete(b"abcde".to_vec())
        );
    }

    #[test]
    fn a_missing_frame_drops_the_datagram_and_nothing_else() {
        let mut r = Reassembly::default();
        r.add(&frame(1, 10, UdPart::First), b"ab");
        assert_eq!(
            r.add(&frame(1, 12, UdPart::Last), b"e"),
            Assembled::Broken,
            "11 lost"
        );
        assert_eq!(
            r.add(&frame(1, 13, UdPart::Last), b"e"),
            Assembled::Broken,
            "no FIRST"
        );
        r.add(&frame(1, 20, UdPart::First), &[0; 3000]);
        assert_eq!(
            r.add(&frame(1, 21, UdPart::Last), &[0; 1200]),
            Assembled::Broken,
            "> MTU"
        );
        r.add(&frame(1, 30, UdPart::First), b"a");
        assert_eq!(r.add(&frame(1, 31, UdPart::Only), b"b"), Assembled::Whole);
        assert_eq!(
            r.add(&frame(1, 32, UdPart::Last), b"c"),
            Assembled::Broken,
            "replaced"
        );
        for q in 0..(PARTIALS as u32 + 4) {
            r.add(&frame(q, 0, UdPart::First), b"p");
        }
        assert_eq!(r.partials.len(), PARTIALS, "bounded");
    }
}
