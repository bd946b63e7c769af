//! The state the machine keeps: what it asks of the socket layer ([`Action`]), what the
//! socket layer tells it ([`Closed`], [`Interest`]), one connection ([`Conn`] in its
//! [`Phase`]), the link to a peer ([`PeerLink`]) and the handshake slots ([`Handshakes`]).

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::time::Instant;

use bluerdma_core::oob::{Capabilities, OobDecoder, HELLO_LEN};

use super::super::auth::Hellos;

/// Names one connection between the machine and the socket layer.
pub(in crate::oob) type Token = u64;

/// What the socket layer must do for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::oob) enum Action {
    /// Open a TCP connection from the device IP to `peer` on the peer port, then report
    /// [`super::Machine::on_connected`] or [`super::Machine::on_connect_failed`] for
    /// `token`.
    Dial {
        /// The connection's name from now on.
        token: Token,
        /// Whom to dial.
        peer: Ipv4Addr,
    },
    /// Close the connection (the machine has forgotten it). `last_words` are written first
    /// if the socket takes them at once.
    Close {
        /// The connection.
        token: Token,
        /// Bytes to try to send before closing (usually none).
        last_words: Vec<u8>,
    },
}

/// How a connection ended, as the socket layer saw it.
#[derive(Debug)]
pub(in crate::oob) enum Closed<'a> {
    /// The peer closed it (a read returned 0).
    Eof,
    /// A read failed.
    Read(&'a io::Error),
    /// A write failed.
    Write(&'a io::Error),
}

/// What the socket layer waits for on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::oob) struct Interest {
    /// A dial waiting for its TCP connect (writable means done).
    pub(in crate::oob) connecting: bool,
    /// The handshake is through: records flow (reading may pause when events pile up).
    pub(in crate::oob) open: bool,
    /// The machine has bytes for it ([`super::Machine::output`]).
    pub(in crate::oob) has_output: bool,
}

/// The state of the link to one peer.
#[derive(Clone, Copy, Debug)]
pub(super) enum PeerLink {
    /// Our dial is under way.
    Dialing(Token),
    /// Both sides dialed and ours was refused: the lower-IP peer's dial should arrive.
    AwaitingPeer { until: Instant },
    /// The connection is open.
    Connected(Token),
}

/// Where a connection is in its handshake. `until` is the handshake's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// A dial waiting for the TCP connect.
    Connecting { until: Instant },
    /// Waiting for the other side's hello.
    Hello { until: Instant },
    /// Both hellos are known; waiting for the other side's proof.
    Proof { until: Instant },
    /// Records flow.
    Open,
}

impl Phase {
    pub(super) fn deadline(self) -> Option<Instant> {
        match self {
            Phase::Connecting { until } | Phase::Hello { until } | Phase::Proof { until } => {
                Some(until)
            }
            Phase::Open => None,
        }
    }

    /// Between the TCP connect and the end of the handshake.
    pub(super) fn handshaking(self) -> bool {
        matches!(self, Phase::Hello { .. } | Phase::Proof { .. })
    }
}

pub(super) struct Conn {
    /// The dialed peer, or the accepted connection's source address.
    pub(super) peer: Ipv4Addr,
    pub(super) dialed: bool,
    pub(super) phase: Phase,
    pub(super) decoder: OobDecoder,
    /// The capabilities of the peer's hello (empty before it).
    pub(super) peer_caps: Capabilities,
    /// The dialer's and the listener's hello as sent, as far as known.
    pub(super) hellos: Hellos,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
}

impl Conn {
    pub(super) fn new(peer: Ipv4Addr, dialed: bool, phase: Phase) -> Self {
        Conn {
            peer,
            dialed,
            phase,
            decoder: OobDecoder::new(),
            peer_caps: Capabilities::empty(),
            hellos: [[0; HELLO_LEN]; 2],
            out: Vec::new(),
            out_pos: 0,
        }
    }

    pub(super) fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// An accepted connection still in its handshake (it holds a handshake slot).
    pub(super) fn holds_handshake_slot(&self) -> bool {
        !self.dialed && self.phase.handshaking()
    }
}

/// Accepted connections in their handshake, in all and per source address.
#[derive(Default)]
pub(super) struct Handshakes {
    pub(super) total: usize,
    by_ip: HashMap<Ipv4Addr, usize>,
}

impl Handshakes {
    pub(super) fn from(&self, src: Ipv4Addr) -> usize {
        self.by_ip.get(&src).copied().unwrap_or(0)
    }

    pub(super) fn begin(&mut self, src: Ipv4Addr) {
        self.total += 1;
        *self.by_ip.entry(src).or_default() += 1;
    }

    pub(super) fn end(&mut self, src: Ipv4Addr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_ip.get_mut(&src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_ip.remove(&src);
            }
        }
    }
}
