//! The control messages between a client and its device's daemon, over the daemon's Unix
//! stream socket: a 4-byte little-endian length, then the message (a kind byte and its
//! fields, little-endian). The daemon never trusts a length or a field: a message it cannot
//! read ends that client's connection, which cleans up as if the client had died.

use std::io::{self, Read, Write};
use std::net::Ipv4Addr;

/// The protocol's version, in the hello (2: claims of memory on the PCI card).
pub const VERSION: u16 = 2;

/// The longest message either side sends.
pub const MAX_MESSAGE: usize = 4096;

/// What a client says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The first message of a control connection.
    Hello {
        /// [`VERSION`].
        version: u16,
        /// The engine's page size (the card's must be the same), log2.
        page_shift: u8,
    },
    /// The first message of an out-of-band connection: joins the relay of the client
    /// `slot`, proven by the `token` of its welcome.
    OobHello {
        /// [`VERSION`].
        version: u16,
        /// The client's slot.
        slot: u32,
        /// The welcome's token.
        token: u64,
    },
    /// Makes `len` bytes at `va` of this client reachable by the card, keeping the offset
    /// within a page of `1 << page_shift` bytes.
    Map {
        /// Where.
        va: u64,
        /// How many bytes.
        len: u64,
        /// log2 of the page whose offset the device address keeps.
        page_shift: u8,
        /// Whether the buffer is one of the engine's DMA buffers (rings, staging, frames;
        /// the daemon reads rings there) or user memory.
        dma: bool,
    },
    /// The daemon's state as text (its clients, what each holds in the card, the card's
    /// counters): the first and only message of a status connection.
    Status,
    /// Undoes a map (or a claim of a DMA buffer) by its device address.
    Unmap {
        /// The device address a [`Reply::Mapped`] gave (or the claim named).
        dev: u64,
    },
    /// On a card that reaches memory by physical address (the PCI card, [`Welcome::kind`]
    /// 2), instead of [`Request::Map`]: this client pinned `len` bytes at `va` itself, and
    /// the card reaches them at `dev` (the bus address of `va`'s byte). The daemon checks
    /// the client's page map (every base page of the claim's pages of the card's size must
    /// have the frame `dev` says) before it lets the client's commands, WQEs and page-table
    /// entries name the memory; a false claim is refused with EPERM.
    Claim {
        /// Where, in the client.
        va: u64,
        /// How many bytes.
        len: u64,
        /// The bus address of `va`.
        dev: u64,
        /// One of the engine's DMA buffers (exactly these bytes; the daemon reads rings
        /// there) or user memory (whole pages of the card's size, for page-table entries).
        dma: bool,
    },
    /// Undoes claims of user memory: every page of the card's size in `[dev, dev + len)`.
    Unclaim {
        /// The bus address of the first page.
        dev: u64,
        /// Bytes.
        len: u64,
    },
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The answer to a hello: the client's slot and tables; the register page and hub
    /// descriptors follow as two messages with a descriptor attached ([`Reply::Fd`]).
    Welcome(Welcome),
    /// A descriptor (attached to this message).
    Fd,
    /// The answer to a map.
    Mapped {
        /// The device address of `va`.
        dev: u64,
    },
    /// The answer to an unmap.
    Done,
    /// The answer to a status request.
    Status {
        /// One line per client, then the card's.
        text: String,
    },
    /// A refusal.
    Fail {
        /// The errno.
        errno: i32,
        /// Why.
        msg: String,
    },
}

/// The welcome: what a client's engine needs to run on its share of the card.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The client's slot.
    pub slot: u32,
    /// Proves the out-of-band connection of this client.
    pub token: u64,
    /// The QP indices, MR indices and PGT entries of this client (start, end).
    pub qp_index: (u32, u32),
    /// MR table indices.
    pub mr_index: (u32, u32),
    /// Page table entries.
    pub pgt: (u32, u32),
    /// The backend (0 emulated, 1 RTL, 2 PCI). It says how the client's memory reaches
    /// the card: on 0 and 1 the daemon maps it ([`Request::Map`]); on 2 the client pins and
    /// translates it itself and claims it ([`Request::Claim`], see [`Welcome::claims`]).
    pub kind: u8,
    /// The tuning: command timeout, ACK timeout floor (ns), send window.
    pub command_timeout_ns: u64,
    /// ACK timeout floor.
    pub ack_timeout_min_ns: u64,
    /// Send window.
    pub send_window: u32,
    /// The device's IP (the client's engine must use the same).
    pub ip: Ipv4Addr,
    /// The device's MAC.
    pub mac: [u8; 6],
}

impl Welcome {
    /// Whether the client claims the memory it pinned itself ([`Request::Claim`]) rather
    /// than asking the daemon to map it ([`Request::Map`]).
    pub fn claims(&self) -> bool {
        self.kind == 2
    }
}

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        if self.0.len() < N {
            return Err(bad("message too short"));
        }
        let (a, b) = self.0.split_at(N);
        self.0 = b;
        Ok(a.try_into().expect("split at N"))
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> io::Result<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(i32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn end(&self) -> io::Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(bad("trailing bytes in a message"))
        }
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl Request {
    /// The message's bytes (without the length).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(32));
        match self {
            Request::Hello {
                version,
                page_shift,
            } => w.u8(1).u16(*version).u8(*page_shift),
            Request::OobHello {
                version,
                slot,
                token,
            } => w.u8(2).u16(*version).u32(*slot).u64(*token),
            Request::Map {
                va,
                len,
                page_shift,
                dma,
            } => w
                .u8(3)
                .u64(*va)
                .u64(*len)
                .u8(*page_shift)
                .u8(u8::from(*dma)),
            Request::Unmap { dev } => w.u8(4).u64(*dev),
            Request::Status => w.u8(5),
            Request::Claim { va, len, dev, dma } => {
                w.u8(6).u64(*va).u64(*len).u64(*dev).u8(u8::from(*dma))
            }
            Request::Unclaim { dev, len } => w.u8(7).u64(*dev).u64(*len),
        };
        w.0
    }

    /// Reads a message's bytes.
    pub fn decode(b: &[u8]) -> io::Result<Request> {
        let mut r = R(b);
        let m = match r.u8()? {
            1 => Request::Hello {
                version: r.u16()?,
                page_shift: r.u8()?,
            },
            2 => Request::OobHello {
                version: r.u16()?,
                slot: r.u32()?,
                token: r.u64()?,
            },
            3 => Request::Map {
                va: r.u64()?,
                len: r.u64()?,
                page_shift: r.u8()?,
                dma: r.u8()? != 0,
            },
            4 => Request::Unmap { dev: r.u64()? },
            5 => Request::Status,
            6 => Request::Claim {
                va: r.u64()?,
                len: r.u64()?,
                dev: r.u64()?,
                dma: r.u8()? != 0,
            },
            7 => Request::Unclaim {
                dev: r.u64()?,
                len: r.u64()?,
            },
            k => return Err(bad(&format!("unknown request kind {k}"))),
        };
        r.end()?;
        Ok(m)
    }
}

impl Reply {
    /// The message's bytes (without the length).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64));
        match self {
            Reply::Welcome(x) => {
                w.u8(1)
                    .u32(x.slot)
                    .u64(x.token)
                    .u32(x.qp_index.0)
                    .u32(x.qp_index.1)
                    .u32(x.mr_index.0)
                    .u32(x.mr_index.1)
                    .u32(x.pgt.0)
                    .u32(x.pgt.1)
                    .u8(x.kind)
                    .u64(x.command_timeout_ns)
                    .u64(x.ack_timeout_min_ns)
                    .u32(x.send_window)
                    .u32(u32::from(x.ip));
                w.0.extend_from_slice(&x.mac);
            }
            Reply::Fd => {
                w.u8(2);
            }
            Reply::Mapped { dev } => {
                w.u8(3).u64(*dev);
            }
            Reply::Done => {
                w.u8(4);
            }
            Reply::Fail { errno, msg } => {
                w.u8(5).u32(*errno as u32);
                text(&mut w, msg);
            }
            Reply::Status { text: t } => {
                w.u8(6);
                text(&mut w, t);
            }
        }
        w.0
    }

    /// Reads a message's bytes.
    pub fn decode(b: &[u8]) -> io::Result<Reply> {
        let mut r = R(b);
        let m = match r.u8()? {
            1 => Reply::Welcome(Welcome {
                slot: r.u32()?,
                token: r.u64()?,
                qp_index: (r.u32()?, r.u32()?),
                mr_index: (r.u32()?, r.u32()?),
                pgt: (r.u32()?, r.u32()?),
                kind: r.u8()?,
                command_timeout_ns: r.u64()?,
                ack_timeout_min_ns: r.u64()?,
                send_window: r.u32()?,
                ip: Ipv4Addr::from(r.u32()?),
                mac: r.take::<6>()?,
            }),
            2 => Reply::Fd,
            3 => Reply::Mapped { dev: r.u64()? },
            4 => Reply::Done,
            5 => {
                let errno = r.i32()?;
                Reply::Fail {
                    errno,
                    msg: read_text(&mut r)?,
                }
            }
            6 => Reply::Status {
                text: read_text(&mut r)?,
            },
            k => return Err(bad(&format!("unknown reply kind {k}"))),
        };
        r.end()?;
        Ok(m)
    }
}

fn text(w: &mut W, t: &str) {
    let mut m = t.as_bytes();
    m = &m[..m.len().min(MAX_MESSAGE - 16)];
    w.u16(m.len() as u16);
    w.0.extend_from_slice(m);
}

fn read_text(r: &mut R<'_>) -> io::Result<String> {
    let n = r.u16()? as usize;
    if r.0.len() != n {
        return Err(bad("bad text length"));
    }
    let t = String::from_utf8_lossy(r.0).into_owned();
    r.0 = &[];
    Ok(t)
}

/// Writes one framed message.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(body.len() + 4);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    w.write_all(&b)
}

/// The length prefix of a frame, checked.
pub fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n == 0 || n > MAX_MESSAGE {
        return Err(bad(&format!("a message of {n} bytes")));
    }
    Ok(n)
}

/// Reads one framed message (blocking).
pub fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut p = [0u8; 4];
    r.read_exact(&mut p)?;
    let n = frame_len(p)?;
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_read_back_as_written() {
        let reqs = [
            Request::Hello {
                version: 1,
                page_shift: 21,
            },
            Request::OobHello {
                version: 1,
                slot: 3,
                token: 0xDEAD_BEEF_0102_0304,
            },
            Request::Map {
                va: 0x7f00_0000_1000,
                len: 4096,
                page_shift: 12,
                dma: true,
            },
            Request::Unmap {
                dev: 0xF000_0000_0000,
            },
            Request::Status,
            Request::Claim {
                va: 0x7f00_0020_0000,
                len: 2 << 20,
                dev: 0x1_2340_0000,
                dma: false,
            },
            Request::Unclaim {
                dev: 0x1_2340_0000,
                len: 4 << 20,
            },
        ];
        for r in reqs {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let w = Welcome {
            slot: 2,
            token: 7,
            qp_index: (1, 128),
            mr_index: (0, 1024),
            pgt: (0, 16384),
            kind: 0,
            command_timeout_ns: 10,
            ack_timeout_min_ns: 0,
            send_window: 1024,
            ip: Ipv4Addr::new(127, 0, 0, 5),
            mac: [2, 0, 127, 0, 0, 5],
        };
        let replies = [
            Reply::Welcome(w),
            Reply::Fd,
            Reply::Mapped { dev: 5 },
            Reply::Done,
            Reply::Fail {
                errno: 22,
                msg: "no".into(),
            },
            Reply::Status {
                text: "slot 0".into(),
            },
        ];
        for r in replies {
            assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
        }
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_a_message_or_an_error(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Request::decode(&b);
            let _ = Reply::decode(&b);
        }

        #[test]
        fn a_frame_length_is_bounded(p in any::<[u8; 4]>()) {
            if let Ok(n) = frame_len(p) {
                prop_assert!(n > 0 && n <= MAX_MESSAGE);
            }
        }
    }
}
