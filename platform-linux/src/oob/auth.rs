//! How the two ends of an OOB connection prove that they hold the same secret
//! ([`super::key`]), with HMAC-SHA256 over both hellos (protocol version 2).
//!
//! Each hello carries a nonce its sender drew at random for the connection. The dialer's
//! proof is `HMAC(secret, "bluerdma OOB v2 dialer" || dialer hello || listener hello)`
//! and the listener's the same with `"bluerdma OOB v2 listener"`. A proof therefore holds
//! for one connection only (a replayed hello meets a new nonce) and for one role (a proof
//! cannot be reflected back to the side that made it), and it covers the device IPs and
//! capabilities that both hellos announce.

use std::io;

use bluerdma_core::oob::{Proof, HELLO_LEN, NONCE_LEN, PROOF_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::key::OobSecret;

/// Which side of the connection a proof speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The side that dialed.
    Dialer,
    /// The side that accepted.
    Listener,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Dialer => b"bluerdma OOB v2 dialer",
            Role::Listener => b"bluerdma OOB v2 listener",
        }
    }
}

/// The two hellos of a connection, as sent: the dialer's, then the listener's.
pub(super) type Hellos = [[u8; HELLO_LEN]; 2];

fn mac(secret: &OobSecret, role: Role, hellos: &Hellos) -> Hmac<Sha256> {
    let mut mac = secret.hmac();
    mac.update(role.label());
    mac.update(&hellos[0]);
    mac.update(&hellos[1]);
    mac
}

/// The proof `role` sends on the connection of `hellos`.
pub(super) fn proof(secret: &OobSecret, role: Role, hellos: &Hellos) -> Proof {
    let mut out = [0u8; PROOF_LEN];
    out.copy_from_slice(&mac(secret, role, hellos).finalize().into_bytes());
    Proof(out)
}

/// Whether `got` is `role`'s proof on the connection of `hellos` (in constant time).
pub(super) fn verify(secret: &OobSecret, role: Role, hellos: &Hellos, got: &Proof) -> bool {
    mac(secret, role, hellos).verify_slice(&got.0).is_ok()
}

/// Where a machine gets the nonces of its hellos.
pub(super) type NonceSource = Box<dyn FnMut() -> io::Result<[u8; NONCE_LEN]> + Send>;

/// Nonces from the operating system's random generator.
pub(super) fn random_nonces() -> NonceSource {
    Box::new(|| {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(io::Error::other)?;
        Ok(nonce)
    })
}

/// What a machine needs to authenticate its connections.
pub(super) struct Auth {
    pub(super) secret: OobSecret,
    /// Where the secret came from, for messages ("key file /run/bluerdma/oob.key").
    pub(super) source: String,
    pub(super) nonces: NonceSource,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bluerdma_core::oob::Hello;
    use std::net::Ipv4Addr;

    /// Two hellos with the capabilities the pinned proof was computed with (bits 0..3),
    /// whatever this driver announces now.
    fn hellos(nonce_d: u8, nonce_l: u8) -> Hellos {
        let hello = |ip, nonce| Hello {
            capabilities: bluerdma_core::oob::Capabilities::from_bits_retain(0x0f),
            ..Hello::new(ip).with_nonce([nonce; NONCE_LEN])
        };
        let d = hello(Ipv4Addr::new(10, 0, 0, 1), nonce_d);
        let l = hello(Ipv4Addr::new(10, 0, 0, 2), nonce_l);
        [d.to_bytes(), l.to_bytes()]
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_proof_holds_for_its_role_its_nonces_and_its_secret_only() {
        let secret = OobSecret::new(b"0123456789abcdef").unwrap();
        let other = OobSecret::new(b"0123456789abcdeF").unwrap();
        let h = hellos(1, 2);
        let p = proof(&secret, Role::Dialer, &h);
        assert!(verify(&secret, Role::Dialer, &h, &p));
        assert!(!verify(&secret, Role::Listener, &h, &p), "reflected");
        assert!(
            !verify(&secret, Role::Dialer, &hellos(1, 3), &p),
            "replayed"
        );
        assert!(!verify(&other, Role::Dialer, &h, &p), "another secret");
        let mut flipped = p;
        flipped.0[31] ^= 1;
        assert!(!verify(&secret, Role::Dialer, &h, &flipped));
    }

    /// Pins the construction: HMAC-SHA256 (RFC 2104) of label || dialer hello || listener
    /// hello. The value was computed independently (Python's hmac module).
    #[test]
    fn the_proof_is_hmac_sha256_of_the_label_and_both_hellos() {
        let secret = OobSecret::new(b"0123456789abcdef").unwrap();
        let p = proof(&secret, Role::Listener, &hellos(0xaa, 0xbb));
        assert_eq!(hex(&p.0), EXPECTED_LISTENER_PROOF);
    }

    const EXPECTED_LISTENER_PROOF: &str =
        "9129407598c99884d3e2a918a63412b41074e500d650eeb1140685fd9ffb7d15";
}
