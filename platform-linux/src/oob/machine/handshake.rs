//! The handshake of one connection (protocol version 2): the hello checks, the proofs
//! of the shared secret ([`crate::oob::auth`]) and which connection a peer keeps.
//!
//! The dialer sends its hello at connect; the listener answers with its own; the dialer
//! sends its proof; the listener checks it and only then decides, by the rules of the
//! `oob` module docs, whether the connection becomes the peer's: if so it sends its own
//! proof, which opens the connection on the dialer's side too; if not it closes it. So
//! nothing unauthenticated ever replaces or closes a live connection or a dial, and a
//! dial refused by the tie-break is closed before the listener's proof, which the dialer
//! reads as "refused" rather than "lost".

use std::net::Ipv4Addr;

use bluerdma_core::oob::{Capabilities, Hello, Proof};

use super::super::auth::{self, Role};
use super::super::stats::Counters;
use super::conn::{PeerLink, Phase, Token};
use super::Machine;

impl Machine {
    /// The other side's hello arrived; `false` if this connection was closed.
    pub(super) fn on_hello(&mut self, token: Token, hello: Hello) -> bool {
        let Some(conn) = self.conns.get(&token) else {
            return false;
        };
        let (peer, dialed, phase) = (conn.peer, conn.dialed, conn.phase);
        if let Some(why) = self.check_hello(peer, &hello) {
            Counters::add(&self.counters.protocol_errors, 1);
            self.log_refusal(peer, dialed, &why);
            self.conn_failed(token, &why, false);
            return false;
        }
        let Some(until) = phase.deadline() else {
            return false;
        };
        let ours = if dialed {
            None
        } else {
            match (self.auth.nonces)() {
                Ok(nonce) => Some(Hello::new(self.ip()).with_nonce(nonce).to_bytes()),
                Err(e) => {
                    log::error!(
                        "OOB {}: closing a connection from {peer}: cannot draw a nonce: {e}",
                        self.local
                    );
                    self.close_conn(token);
                    return false;
                }
            }
        };
        let secret = &self.auth.secret;
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        conn.peer_caps = hello.capabilities;
        conn.phase = Phase::Proof { until };
        match ours {
            // Ours went out at connect; prove that we hold the secret for both nonces.
            None => {
                conn.hellos[1] = hello.to_bytes();
                let proof = auth::proof(secret, Role::Dialer, &conn.hellos);
                conn.out.extend_from_slice(&proof.to_bytes());
            }
            // Answer with our nonce; the dialer proves itself next.
            Some(ours) => {
                conn.hellos = [hello.to_bytes(), ours];
                conn.out.extend_from_slice(&ours);
            }
        }
        true
    }

    /// Logs why the handshake with `peer` failed: in the peers' budget for our own dial,
    /// in the garbage budget for a connection that was never a peer's.
    fn log_refusal(&mut self, peer: Ipv4Addr, dialed: bool, why: &str) {
        if dialed {
            net_log!(self, link_log, log::Level::Error, "refusing {peer}: {why}");
        } else {
            net_log!(
                self,
                garbage_log,
                log::Level::Error,
                "refusing a connection from {peer}: {why}"
            );
        }
    }

    /// Why a hello from `peer` is refused, if it is.
    fn check_hello(&self, peer: Ipv4Addr, hello: &Hello) -> Option<String> {
        if hello.device_ip != peer {
            Some(format!(
                "its hello names device {} but the connection comes from {peer}",
                hello.device_ip
            ))
        } else if peer == self.ip() {
            Some(format!("its hello names this device's own IP {peer}"))
        } else if !hello.capabilities.contains(Capabilities::RECV_WR_RECORDS) {
            Some(format!(
                "its hello does not announce receive-WR records (capabilities {:#x})",
                hello.capabilities.bits()
            ))
        } else {
            None
        }
    }

    /// The other side's proof arrived; `false` if this connection was closed.
    pub(super) fn on_proof(&mut self, token: Token, proof: Proof) -> bool {
        let Some(conn) = self.conns.get(&token) else {
            return false;
        };
        let (peer, dialed, hellos) = (conn.peer, conn.dialed, conn.hellos);
        let theirs = if dialed { Role::Listener } else { Role::Dialer };
        if auth::verify(&self.auth.secret, theirs, &hellos, &proof) {
            if dialed {
                self.open(token, peer);
                return true;
            }
            return self.accept(token, peer);
        }
        Counters::add(&self.counters.protocol_errors, 1);
        Counters::add(&self.counters.auth_failures, 1);
        let why = format!(
            "its proof of the OOB secret does not match this device's ({}): the two devices \
             use different OOB keys, or {peer} is not the device it claims to be",
            self.auth.source
        );
        self.log_refusal(peer, dialed, &why);
        if dialed {
            self.conn_failed(token, &why, false);
        } else {
            // Our proof lets an honest dialer with another key name the mismatch too.
            let ours = auth::proof(&self.auth.secret, Role::Listener, &hellos);
            self.close_conn_saying(token, ours.to_bytes().to_vec());
        }
        false
    }

    /// An accepted connection proved itself: decide which connection the peer keeps
    /// (module docs of `oob`); `false` if it is not this one.
    fn accept(&mut self, token: Token, peer: Ipv4Addr) -> bool {
        match self.peers.get(&peer).copied() {
            None | Some(PeerLink::AwaitingPeer { .. }) => {}
            Some(PeerLink::Dialing(ours)) => {
                Counters::add(&self.counters.race_closed, 1);
                if self.ip() < peer {
                    log::debug!(
                        "OOB {}: {peer} dialed while we dial it; keeping ours (lower IP)",
                        self.local
                    );
                    self.close_conn(token);
                    return false;
                }
                log::debug!(
                    "OOB {}: {peer} dialed while we dial it; keeping theirs (lower IP)",
                    self.local
                );
                self.close_conn(ours);
            }
            Some(PeerLink::Connected(current)) => {
                let current_dialed = self.conns.get(&current).is_some_and(|c| c.dialed);
                if peer > self.ip() && current_dialed {
                    // The higher side's dial from a race we already settled.
                    Counters::add(&self.counters.race_closed, 1);
                    self.close_conn(token);
                    return false;
                }
                self.lose_peer(peer, "it opened a new connection (it restarted?)");
            }
        }
        let secret = &self.auth.secret;
        if let Some(conn) = self.conns.get_mut(&token) {
            // Nothing is queued on an accepted connection before its proof.
            let proof = auth::proof(secret, Role::Listener, &conn.hellos);
            conn.out.extend_from_slice(&proof.to_bytes());
        }
        self.open(token, peer);
        true
    }

    /// The connection becomes the peer's connection.
    pub(super) fn open(&mut self, token: Token, peer: Ipv4Addr) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let was_handshaking = conn.holds_handshake_slot();
        conn.phase = Phase::Open;
        let how = if conn.dialed { "dialed" } else { "accepted" };
        self.peers.insert(peer, PeerLink::Connected(token));
        self.links_changed = true;
        Counters::add(&self.counters.established, 1);
        Counters::add(&self.counters.open_connections, 1);
        net_log!(
            self,
            link_log,
            log::Level::Info,
            "connected to {peer} ({how})"
        );
        if was_handshaking {
            self.end_handshake(peer);
        }
    }
}
