//! The wire between the two stepped cards: each card's link port is a pair of queues that
//! the harness empties and fills by hand, and every frame that crosses is classified,
//! numbered, logged and put through the test's fault rules (drop, duplicate, hold).
//!
//! A frame a rule lets pass goes to the in-flight queue of its destination, which the
//! harness hands to that card's receive step unless the test paused it; the test may look
//! at and rearrange an in-flight queue (reordering), and release held frames behind
//! whatever is queued.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bluerdma_core::keys::Qpn;
use bluerdma_core::transport::Psn;
use bluerdma_core::wire::{RdmaOpcode, RocePacket};

use super::Side;
use crate::link::route::frame_dst_ipv4;
use crate::link::{FrameSender, LinkCounter, LinkPort, LinkStats};

/// What a frame on the wire is, read from its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A RoCE packet that is not an ACK or NAK: data, a READ request or a READ response.
    Packet {
        /// The BTH opcode.
        opcode: RdmaOpcode,
        /// The PSN.
        psn: u32,
        /// The destination QP.
        dqpn: Qpn,
        /// The BTH "retransmission" bit (the card's MigReq position).
        retry: bool,
        /// Payload bytes.
        payload: usize,
    },
    /// A driver's positive ACK: every PSN before `psn` arrived.
    DriverAck {
        /// The cumulative PSN (first one not acknowledged).
        psn: u32,
        /// The requester's QP.
        dqpn: Qpn,
    },
    /// A driver's NAK: resend from `resend_from`.
    DriverNak {
        /// The BTH PSN.
        psn: u32,
        /// The first PSN to resend (the AETH's pre_psn).
        resend_from: u32,
        /// The requester's QP.
        dqpn: Qpn,
    },
    /// The card's own loss NAK (a gap left its 128-PSN window, nic-behaviour.md 3.4).
    CardNak {
        /// `16 * L_new` (BTH PSN).
        psn_now: u32,
        /// `16 * L_old` (AETH pre_psn).
        psn_before_slide: u32,
        /// The requester's QP.
        dqpn: Qpn,
    },
    /// Anything else (not RoCE v2, or headers that do not parse).
    Other,
}

impl FrameKind {
    /// Reads the headers of `frame`.
    pub fn of(frame: &[u8]) -> FrameKind {
        let Ok((packet, payload)) = RocePacket::parse_frame(frame) else {
            return FrameKind::Other;
        };
        let bth = packet.headers.bth;
        match (bth.opcode, packet.headers.aeth) {
            (RdmaOpcode::Acknowledge, Some(aeth)) => {
                match (aeth.is_send_by_driver, aeth.is_window_slided) {
                    (true, false) => FrameKind::DriverAck {
                        psn: bth.psn,
                        dqpn: bth.dqpn,
                    },
                    (true, true) => FrameKind::DriverNak {
                        psn: bth.psn,
                        resend_from: aeth.pre_psn,
                        dqpn: bth.dqpn,
                    },
                    (false, _) => FrameKind::CardNak {
                        psn_now: bth.psn,
                        psn_before_slide: aeth.pre_psn,
                        dqpn: bth.dqpn,
                    },
                }
            }
            (opcode, _) => FrameKind::Packet {
                opcode,
                psn: bth.psn,
                dqpn: bth.dqpn,
                retry: bth.is_retry,
                payload: payload.len(),
            },
        }
    }
}

/// One frame as the harness saw it leave a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Order of transmission over both directions, from 0.
    pub id: u64,
    /// The sending card.
    pub from: Side,
    /// Order of transmission among the frames of `from`, from 0.
    pub nth: u64,
    /// Virtual time at which the harness took it from the card (ns).
    pub sent_ns: u64,
    /// What it is.
    pub kind: FrameKind,
    /// Frame length in bytes.
    pub len: usize,
}

impl FrameInfo {
    /// The BTH opcode of a packet that is not an ACK or NAK.
    pub fn opcode(&self) -> Option<RdmaOpcode> {
        match self.kind {
            FrameKind::Packet { opcode, .. } => Some(opcode),
            _ => None,
        }
    }

    /// The PSN of a packet that is not an ACK or NAK.
    pub fn psn(&self) -> Option<u32> {
        match self.kind {
            FrameKind::Packet { psn, .. } => Some(psn),
            _ => None,
        }
    }

    /// A data packet (WRITE, SEND or READ response: it carries a payload opcode).
    pub fn is_data(&self) -> bool {
        self.opcode()
            .is_some_and(|o| o.is_write() || o.is_send() || o.is_read_response())
    }

    /// A packet with the retransmission bit.
    pub fn is_retry(&self) -> bool {
        matches!(self.kind, FrameKind::Packet { retry: true, .. })
    }

    /// A driver's positive ACK.
    pub fn is_ack(&self) -> bool {
        matches!(self.kind, FrameKind::DriverAck { .. })
    }

    /// A driver's positive ACK that acknowledges `psn` (its cumulative PSN is past it,
    /// modulo 2^24): "the ACK of PSN x".
    pub fn acks(&self, psn: u32) -> bool {
        match self.kind {
            FrameKind::DriverAck { psn: upto, .. } => {
                Psn::from_raw(psn).is_before(Psn::from_raw(upto))
            }
            _ => false,
        }
    }
}

/// A frame with its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What the harness saw.
    pub info: FrameInfo,
    /// The Ethernet frame.
    pub bytes: Vec<u8>,
}

/// What a fault rule does to the frames it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The frame is lost.
    Drop,
    /// The frame arrives twice in a row.
    Duplicate,
    /// The frame is kept aside until [`super::Pair::release_held`].
    Hold,
}

/// What happened to a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Passed to its destination.
    Passed,
    /// Dropped by a rule.
    Dropped,
    /// Passed twice.
    Duplicated,
    /// Held by a rule (see [`super::Pair::release_held`]).
    Held,
    /// Its destination is neither card.
    Unroutable,
}

/// A line of the wire log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The frame.
    pub info: FrameInfo,
    /// What the rules did with it.
    pub fate: Fate,
}

impl fmt::Display for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.info;
        write!(
            f,
            "#{} {:?}#{} at {} ns: {:?} ({} B) {:?}",
            i.id, i.from, i.nth, i.sent_ns, i.kind, i.len, self.fate
        )
    }
}

/// A rule: `fault` for the frames `pred` matches, `left` more times (`None`: always).
struct Rule {
    fault: Fault,
    left: Option<u32>,
    pred: Box<dyn FnMut(&FrameInfo) -> bool>,
}

/// One card's port: what it sent, what it is given.
#[derive(Default)]
struct Queues {
    outbox: VecDeque<Vec<u8>>,
    inbox: VecDeque<Vec<u8>>,
}

fn lock(q: &Mutex<Queues>) -> MutexGuard<'_, Queues> {
    q.lock().unwrap_or_else(|e| e.into_inner())
}

/// The link port of a stepped card: frames sent wait in its outbox for the harness, frames
/// the harness gives it wait in its inbox. `recv_frames` never waits.
pub(super) struct PairPort {
    queues: Arc<Mutex<Queues>>,
    stats: LinkStats,
}

impl PairPort {
    fn push(&self, frames: &[&[u8]]) {
        let mut q = lock(&self.queues);
        q.outbox.extend(frames.iter().map(|f| f.to_vec()));
        self.stats.add(LinkCounter::FramesSent, frames.len() as u64);
    }
}

impl FrameSender for PairPort {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.push(frames);
        Ok(())
    }
}

impl LinkPort for PairPort {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.push(frames);
        Ok(())
    }

    fn recv_frames(
        &mut self,
        _timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // Taken out first: the card's frame handler may send (NAKs) into the same queues.
        let frames: Vec<Vec<u8>> = lock(&self.queues).inbox.drain(..).collect();
        for f in &frames {
            on_frame(f);
        }
        self.stats
            .add(LinkCounter::FramesReceived, frames.len() as u64);
        Ok(frames.len())
    }

    fn stats(&self) -> &LinkStats {
        &self.stats
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        Ok(Box::new(PairPort {
            queues: Arc::clone(&self.queues),
            stats: self.stats.clone(),
        }))
    }
}

/// Both directions of the wire.
pub(super) struct Wire {
    ips: [Ipv4Addr; 2],
    ports: [Arc<Mutex<Queues>>; 2],
    next_id: u64,
    sent: [u64; 2],
    rules: Vec<Rule>,
    /// Frames on their way to each card.
    pub(super) in_flight: [VecDeque<Frame>; 2],
    /// Frames a rule held.
    pub(super) held: Vec<Frame>,
    /// Delivery to each card paused by the test.
    pub(super) paused: [bool; 2],
    pub(super) log: Vec<LogEntry>,
}

impl Wire {
    /// A wire between cards at `ips`.
    pub(super) fn new(ips: [Ipv4Addr; 2]) -> Self {
        Self {
            ips,
            ports: Default::default(),
            next_id: 0,
            sent: [0; 2],
            rules: Vec::new(),
            in_flight: Default::default(),
            held: Vec::new(),
            paused: [false; 2],
            log: Vec::new(),
        }
    }

    /// The link port of `side`'s card.
    pub(super) fn port(&self, side: Side) -> PairPort {
        PairPort {
            queues: Arc::clone(&self.ports[side.index()]),
            stats: LinkStats::new(),
        }
    }

    pub(super) fn add_rule(
        &mut self,
        fault: Fault,
        times: Option<u32>,
        pred: Box<dyn FnMut(&FrameInfo) -> bool>,
    ) {
        self.rules.push(Rule {
            fault,
            left: times,
            pred,
        });
    }

    pub(super) fn clear_rules(&mut self) {
        self.rules.clear();
    }

    /// Takes every frame the cards sent, in card order, through the rules; returns how
    /// many were taken.
    pub(super) fn carry(&mut self, now_ns: u64) -> usize {
        let mut n = 0;
        for from in Side::BOTH {
            let frames: Vec<Vec<u8>> = lock(&self.ports[from.index()]).outbox.drain(..).collect();
            n += frames.len();
            for bytes in frames {
                self.route(from, bytes, now_ns);
            }
        }
        n
    }

    fn route(&mut self, from: Side, bytes: Vec<u8>, now_ns: u64) {
        let info = FrameInfo {
            id: self.next_id,
            from,
            nth: self.sent[from.index()],
            sent_ns: now_ns,
            kind: FrameKind::of(&bytes),
            len: bytes.len(),
        };
        self.next_id += 1;
        self.sent[from.index()] += 1;
        let to = self.side_at(&bytes);
        let fault = self.rules.iter_mut().find_map(|r| {
            if r.left == Some(0) || !(r.pred)(&info) {
                return None;
            }
            if let Some(left) = r.left.as_mut() {
                *left -= 1;
            }
            Some(r.fault)
        });
        let frame = Frame { info, bytes };
        let fate = match (to, fault) {
            (None, _) => Fate::Unroutable,
            (Some(_), Some(Fault::Drop)) => Fate::Dropped,
            (Some(_), Some(Fault::Hold)) => {
                self.held.push(frame);
                Fate::Held
            }
            (Some(to), Some(Fault::Duplicate)) => {
                self.in_flight[to.index()].push_back(frame.clone());
                self.in_flight[to.index()].push_back(frame);
                Fate::Duplicated
            }
            (Some(to), None) => {
                self.in_flight[to.index()].push_back(frame);
                Fate::Passed
            }
        };
        self.log.push(LogEntry { info, fate });
    }

    /// The card a frame is for (by its IPv4 destination).
    pub(super) fn side_at(&self, bytes: &[u8]) -> Option<Side> {
        match frame_dst_ipv4(bytes) {
            Ok(ip) if ip == self.ips[0] => Some(Side::A),
            Ok(ip) if ip == self.ips[1] => Some(Side::B),
            _ => None,
        }
    }

    /// Hands `to`'s in-flight frames to its card (unless paused); returns how many.
    pub(super) fn deliver(&mut self, to: Side) -> usize {
        if self.paused[to.index()] {
            return 0;
        }
        let frames = std::mem::take(&mut self.in_flight[to.index()]);
        let n = frames.len();
        lock(&self.ports[to.index()])
            .inbox
            .extend(frames.into_iter().map(|f| f.bytes));
        n
    }
}
