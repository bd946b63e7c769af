//! The connection-manager messages two peers exchange over TCP (the CM port, 60001 by
//! default), modelled on the IB CM's REQ/MRA/REP/REJ/RTU/DREQ/DREP and SIDR REQ/REP.
//!
//! Every message is an 8-byte header and a body:
//!
//! ```text
//! 0..4  magic "BRCM"    4  version (1)    5  kind    6..8  body length (big-endian)
//! ```
//!
//! The body is at most [`MAX_BODY`] bytes; fields are big-endian; private data is a length
//! byte and that many bytes, at most what the IB spec leaves the consumer (REQ 56 after the
//! rdma_cm header, REP 196, REJ 148, SIDR REQ 180, SIDR REP 136). [`decode`] checks the
//! length once and never panics: a stream that is not this protocol, a newer version, an
//! unknown kind or a body that does not parse is a typed [`DecodeError`], and the connection
//! is dropped (a newer version is first told so with a REJ, reason 31).

use std::fmt;

pub const MAGIC: [u8; 4] = *b"BRCM";
pub const VERSION: u8 = 1;
pub const HEADER: usize = 8;
pub const MAX_BODY: usize = 512;

/// Private data limits (bytes), per message.
pub const REQ_PRIVATE: usize = 56;
pub const REP_PRIVATE: usize = 196;
pub const REJ_PRIVATE: usize = 148;
pub const SIDR_REQ_PRIVATE: usize = 180;
pub const SIDR_REP_PRIVATE: usize = 136;

/// IB CM reject reasons this library sends (IBTA 12.6.7.2).
pub mod reason {
    pub const NO_RESOURCES: u16 = 3;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const CONSUMER_DEFINED: u16 = 28;
    pub const INVALID_CLASS_VERSION: u16 = 31;
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// SIDR REP status values (IBTA 12.11.2).
pub mod sidr {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
}

/// Connection parameters a REQ or REP carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// 24 bits.
    pub qpn: u32,
    /// 24 bits.
    pub psn: u32,
    /// `enum ibv_mtu`, 1..=5.
    pub mtu: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
}

/// A connect request: the target's port in the listener's port space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    pub ps: u16,
    pub dst_port: u16,
    pub src_port: u16,
    pub params: Params,
    pub private: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rep {
    pub params: Params,
    pub private: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    pub reason: u16,
    pub private: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    pub ps: u16,
    pub dst_port: u16,
    pub src_port: u16,
    pub private: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    pub status: u8,
    pub qpn: u32,
    pub qkey: u32,
    pub private: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    Req(Req),
    /// "Request received; the application decides": the requester waits longer.
    Mra,
    Rep(Rep),
    Rej(Rej),
    Rtu,
    Dreq,
    Drep,
    SidrReq(SidrReq),
    SidrRep(SidrRep),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic([u8; 4]),
    /// A version this library does not speak.
    Version(u8),
    UnknownKind(u8),
    TooLong(usize),
    /// The body of a known kind does not parse; `what` names the field.
    Body {
        kind: u8,
        what: &'static str,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::BadMagic(m) => write!(f, "not a blue-rdma CM stream (starts {m:02x?})"),
            DecodeError::Version(v) => {
                write!(f, "CM protocol version {v} (this library speaks {VERSION})")
            }
            DecodeError::UnknownKind(k) => write!(f, "unknown CM message kind {k}"),
            DecodeError::TooLong(n) => {
                write!(f, "CM message body of {n} bytes (at most {MAX_BODY})")
            }
            DecodeError::Body { kind, what } => write!(f, "CM message kind {kind}: bad {what}"),
        }
    }
}

impl Msg {
    fn kind(&self) -> u8 {
        match self {
            Msg::Req(_) => 1,
            Msg::Mra => 2,
            Msg::Rep(_) => 3,
            Msg::Rej(_) => 4,
            Msg::Rtu => 5,
            Msg::Dreq => 6,
            Msg::Drep => 7,
            Msg::SidrReq(_) => 8,
            Msg::SidrRep(_) => 9,
        }
    }

    /// Appends the encoded message to `out`. Private data past its limit is cut (the API
    /// refuses longer data before it gets here).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, self.kind(), 0, 0]);
        let private = |out: &mut Vec<u8>, p: &[u8], limit: usize| {
            let p = &p[..p.len().min(limit)];
            out.push(p.len() as u8);
            out.extend_from_slice(p);
        };
        match self {
            Msg::Req(r) => {
                out.extend_from_slice(&r.ps.to_be_bytes());
                out.extend_from_slice(&r.dst_port.to_be_bytes());
                out.extend_from_slice(&r.src_port.to_be_bytes());
                put_params(out, &r.params);
                private(out, &r.private, REQ_PRIVATE);
            }
            Msg::Rep(r) => {
                put_params(out, &r.params);
                private(out, &r.private, REP_PRIVATE);
            }
            Msg::Rej(r) => {
                out.extend_from_slice(&r.reason.to_be_bytes());
                private(out, &r.private, REJ_PRIVATE);
            }
            Msg::SidrReq(r) => {
                out.extend_from_slice(&r.ps.to_be_bytes());
                out.extend_from_slice(&r.dst_port.to_be_bytes());
                out.extend_from_slice(&r.src_port.to_be_bytes());
                private(out, &r.private, SIDR_REQ_PRIVATE);
            }
            Msg::SidrRep(r) => {
                out.push(r.status);
                out.extend_from_slice(&r.qpn.to_be_bytes());
                out.extend_from_slice(&r.qkey.to_be_bytes());
                private(out, &r.private, SIDR_REP_PRIVATE);
            }
            Msg::Mra | Msg::Rtu | Msg::Dreq | Msg::Drep => {}
        }
        let len = (out.len() - start - HEADER) as u16;
        out[start + 6..start + 8].copy_from_slice(&len.to_be_bytes());
    }
}

fn put_params(out: &mut Vec<u8>, p: &Params) {
    out.extend_from_slice(&(p.qpn & 0xFF_FFFF).to_be_bytes());
    out.extend_from_slice(&(p.psn & 0xFF_FFFF).to_be_bytes());
    out.extend_from_slice(&[
        p.mtu,
        p.responder_resources,
        p.initiator_depth,
        p.flow_control,
        p.retry_count,
        p.rnr_retry_count,
        p.srq,
    ]);
}

/// A cursor over a body whose length was checked; every read fails instead of panicking.
struct Body<'a> {
    b: &'a [u8],
    kind: u8,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Body {
                kind: self.kind,
                what,
            });
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u24(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let v = self.u32(what)?;
        if v > 0xFF_FFFF {
            return Err(DecodeError::Body {
                kind: self.kind,
                what,
            });
        }
        Ok(v)
    }
    fn private(&mut self, limit: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.u8("private data length")? as usize;
        if n > limit {
            return Err(DecodeError::Body {
                kind: self.kind,
                what: "private data length",
            });
        }
        Ok(self.take(n, "private data")?.to_vec())
    }
    fn params(&mut self) -> Result<Params, DecodeError> {
        let qpn = self.u24("QPN")?;
        let psn = self.u24("PSN")?;
        let mtu = self.u8("MTU")?;
        if !(1..=5).contains(&mtu) {
            return Err(DecodeError::Body {
                kind: self.kind,
                what: "MTU",
            });
        }
        Ok(Params {
            qpn,
            psn,
            mtu,
            responder_resources: self.u8("responder resources")?,
            initiator_depth: self.u8("initiator depth")?,
            flow_control: self.u8("flow control")?,
            retry_count: self.u8("retry count")?,
            rnr_retry_count: self.u8("RNR retry count")?,
            srq: self.u8("SRQ")?,
        })
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Body {
                kind: self.kind,
                what: "length (trailing bytes)",
            })
        }
    }
}

/// Decodes the first message of `buf`: `Ok(None)` while the message is incomplete (at most
/// `HEADER + MAX_BODY` bytes are ever needed), `Ok(Some((msg, used)))` once it is whole.
pub fn decode(buf: &[u8]) -> Result<Option<(Msg, usize)>, DecodeError> {
    // The magic and version are judged on what has arrived, so garbage is refused early.
    let have = buf.len().min(4);
    if buf[..have] != MAGIC[..have] {
        let mut m = [0; 4];
        m[..have].copy_from_slice(&buf[..have]);
        return Err(DecodeError::BadMagic(m));
    }
    if buf.len() > 4 && buf[4] != VERSION {
        return Err(DecodeError::Version(buf[4]));
    }
    if buf.len() < HEADER {
        return Ok(None);
    }
    let kind = buf[5];
    let len = u16::from_be_bytes([buf[6], buf[7]]) as usize;
    if len > MAX_BODY {
        return Err(DecodeError::TooLong(len));
    }
    if !(1..=9).contains(&kind) {
        return Err(DecodeError::UnknownKind(kind));
    }
    if buf.len() < HEADER + len {
        return Ok(None);
    }
    let mut b = Body {
        b: &buf[HEADER..HEADER + len],
        kind,
    };
    let msg = match kind {
        1 => Msg::Req(Req {
            ps: b.u16("port space")?,
            dst_port: b.u16("destination port")?,
            src_port: b.u16("source port")?,
            params: b.params()?,
            private: b.private(REQ_PRIVATE)?,
        }),
        2 => Msg::Mra,
        3 => Msg::Rep(Rep {
            params: b.params()?,
            private: b.private(REP_PRIVATE)?,
        }),
        4 => Msg::Rej(Rej {
            reason: b.u16("reason")?,
            private: b.private(REJ_PRIVATE)?,
        }),
        5 => Msg::Rtu,
        6 => Msg::Dreq,
        7 => Msg::Drep,
        8 => Msg::SidrReq(SidrReq {
            ps: b.u16("port space")?,
            dst_port: b.u16("destination port")?,
            src_port: b.u16("source port")?,
            private: b.private(SIDR_REQ_PRIVATE)?,
        }),
        _ => Msg::SidrRep(SidrRep {
            status: b.u8("status")?,
            qpn: b.u24("QPN")?,
            qkey: b.u32("Q_Key")?,
            private: b.private(SIDR_REP_PRIVATE)?,
        }),
    };
    b.end()?;
    Ok(Some((msg, HEADER + len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params() -> Params {
        Params {
            qpn: 0x12_3456,
            psn: 0xAB_CDEF,
            mtu: 5,
            responder_resources: 1,
            initiator_depth: 2,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 6,
            srq: 0,
        }
    }

    fn samples() -> Vec<Msg> {
        vec![
            Msg::Req(Req {
                ps: 0x106,
                dst_port: 7174,
                src_port: 40000,
                params: params(),
                private: vec![9; 56],
            }),
            Msg::Mra,
            Msg::Rep(Rep {
                params: params(),
                private: vec![1, 2, 3],
            }),
            Msg::Rej(Rej {
                reason: reason::CONSUMER_DEFINED,
                private: vec![0xEE; 148],
            }),
            Msg::Rtu,
            Msg::Dreq,
            Msg::Drep,
            Msg::SidrReq(SidrReq {
                ps: 0x111,
                dst_port: 7174,
                src_port: 1,
                private: vec![],
            }),
            Msg::SidrRep(SidrRep {
                status: 0,
                qpn: 0x80_0001,
                qkey: 0x0123_4567,
                private: vec![5; 136],
            }),
        ]
    }

    /// The layout a peer in another language would implement from the module docs.
    #[test]
    fn a_req_is_laid_out_as_documented() {
        let mut out = Vec::new();
        Msg::Req(Req {
            ps: 0x106,
            dst_port: 7174,
            src_port: 0x9c40,
            params: params(),
            private: vec![0xAA],
        })
        .encode(&mut out);
        assert_eq!(
            out,
            [
                b'B', b'R', b'C', b'M', 1, 1, 0, 23, // header: 23-byte body
                0x01, 0x06, 0x1c, 0x06, 0x9c, 0x40, // ps, dst port 7174, src port
                0, 0x12, 0x34, 0x56, 0, 0xAB, 0xCD, 0xEF, // QPN, PSN
                5, 1, 2, 1, 7, 6, 0, // mtu .. srq
                1, 0xAA, // private data
            ]
        );
    }

    #[test]
    fn every_kind_round_trips_and_waits_for_its_last_byte() {
        for m in samples() {
            let mut out = Vec::new();
            m.encode(&mut out);
            assert_eq!(decode(&out), Ok(Some((m.clone(), out.len()))), "{m:?}");
            for cut in 0..out.len() {
                assert_eq!(decode(&out[..cut]), Ok(None), "{m:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn garbage_is_named() {
        assert_eq!(
            decode(b"GET / HTTP/1.1\r\n"),
            Err(DecodeError::BadMagic(*b"GET "))
        );
        assert_eq!(
            decode(b"BRCM\x02\x01\x00\x00"),
            Err(DecodeError::Version(2))
        );
        assert_eq!(
            decode(b"BRCM\x01\x0a\x00\x00"),
            Err(DecodeError::UnknownKind(10))
        );
        assert_eq!(
            decode(b"BRCM\x01\x01\x02\x01"),
            Err(DecodeError::TooLong(513))
        );
        // A REQ whose private data claims 57 bytes.
        let mut out = Vec::new();
        Msg::Req(Req {
            ps: 0x106,
            dst_port: 1,
            src_port: 2,
            params: params(),
            private: vec![],
        })
        .encode(&mut out);
        let last = out.len() - 1;
        out[last] = 57;
        out.extend_from_slice(&[0; 57]);
        out[7] += 57;
        assert_eq!(
            decode(&out),
            Err(DecodeError::Body {
                kind: 1,
                what: "private data length"
            })
        );
        // An RTU with a body.
        assert_eq!(
            decode(b"BRCM\x01\x05\x00\x01\x00"),
            Err(DecodeError::Body {
                kind: 5,
                what: "length (trailing bytes)"
            })
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn random_bodies_behind_a_valid_header_never_panic(
            kind in 0u8..12,
            body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut buf = MAGIC.to_vec();
            buf.extend_from_slice(&[VERSION, kind]);
            buf.extend_from_slice(&(body.len() as u16).to_be_bytes());
            buf.extend_from_slice(&body);
            match decode(&buf) {
                Ok(Some((_, used))) => prop_assert_eq!(used, buf.len()),
                Ok(None) => prop_assert!(false, "a whole message was reported incomplete"),
                Err(_) => {}
            }
        }

        #[test]
        fn encoded_requests_decode_to_themselves(
            qpn in 0u32..0x100_0000, psn in 0u32..0x100_0000, mtu in 1u8..6,
            private in proptest::collection::vec(any::<u8>(), 0..=56),
        ) {
            let m = Msg::Req(Req {
                ps: 0x106, dst_port: 1, src_port: 2,
                params: Params { qpn, psn, mtu, ..Params::default() },
                private,
            });
            let mut out = Vec::new();
            m.encode(&mut out);
            prop_assert_eq!(decode(&out), Ok(Some((m, out.len()))));
        }
    }
}
