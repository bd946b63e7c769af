//! The `modify_qp` attributes the driver honours, decoded from their raw verbs values.
//!
//! A verbs front end copies the fields of `struct ibv_qp_attr` into a [`RawQpAttr`];
//! [`QpAttr::decode`] checks the ones named in the mask and turns them into typed values,
//! `None` for the ones the mask leaves out. RoCE carries the peer's IP address in the
//! destination GID of the address vector, IPv4 as `::ffff:a.b.c.d`
//! (reference-driver.md 1.6 (b)); the card speaks IPv4 only, so any other GID is an error.

use core::fmt;
use core::net::Ipv4Addr;

use bitflags::bitflags;

use super::state::{QpAttrMask, QpState};
use crate::keys::Qpn;
use crate::mtu::Pmtu;
use crate::transport::psn::Psn;

bitflags! {
    /// `qp_access_flags` (the `ibv_access_flags` bits that apply to a QP).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct QpAccessFlags: u32 {
        /// IBV_ACCESS_LOCAL_WRITE.
        const LOCAL_WRITE = 1 << 0;
        /// IBV_ACCESS_REMOTE_WRITE: incoming WRITE and SEND (the card's check for both).
        const REMOTE_WRITE = 1 << 1;
        /// IBV_ACCESS_REMOTE_READ.
        const REMOTE_READ = 1 << 2;
        /// IBV_ACCESS_REMOTE_ATOMIC.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// A 16-byte GID as carried in `ibv_global_route.dgid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn to_ipv4(&self) -> Result<Ipv4Addr, QpAttrError> {
        match self.0 {
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d] => Ok(Ipv4Addr::new(a, b, c, d)),
            _ => Err(QpAttrError::GidNotIpv4Mapped(*self)),
        }
    }

    /// The IPv4-mapped GID of `ip`.
    pub fn from_ipv4(ip: Ipv4Addr) -> Self {
        let [a, b, c, d] = ip.octets();
        Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d])
    }
}

/// The raw values of the `ibv_qp_attr` fields the driver reads, as a caller passed them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RawQpAttr {
    /// `qp_state`.
    pub qp_state: u32,
    /// `cur_qp_state`.
    pub cur_qp_state: u32,
    /// `path_mtu` (`ibv_mtu`).
    pub path_mtu: u32,
    /// `dest_qp_num`.
    pub dest_qp_num: u32,
    /// `rq_psn`.
    pub rq_psn: u32,
    /// `sq_psn`.
    pub sq_psn: u32,
    /// `qp_access_flags`.
    pub qp_access_flags: u32,
    /// `ah_attr.grh.dgid`.
    pub dgid: Gid,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
}

/// Decoded attributes; each is `Some` exactly when its mask bit was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// `STATE`: the state to move to.
    pub qp_state: Option<QpState>,
    /// `CUR_STATE`: the state the caller believes the QP is in.
    pub cur_qp_state: Option<QpState>,
    /// `PATH_MTU`.
    pub path_mtu: Option<Pmtu>,
    /// `DEST_QPN`: the peer QP.
    pub dest_qpn: Option<Qpn>,
    /// `RQ_PSN`: first PSN expected from the peer.
    pub rq_psn: Option<Psn>,
    /// `SQ_PSN`: first PSN this QP sends.
    pub sq_psn: Option<Psn>,
    /// `AV`: the peer's IPv4 address, from the destination GID.
    pub dest_ipv4: Option<Ipv4Addr>,
    /// `ACCESS_FLAGS`.
    pub access: Option<QpAccessFlags>,
    /// `TIMEOUT`: local ACK timeout exponent, 0..=31 (0 = no timeout; see
    /// [`crate::time::Nanos::ib_local_ack_timeout`]).
    pub timeout: Option<u8>,
    /// `RETRY_CNT`: 0..=7 retransmissions before RETRY_EXC_ERR.
    pub retry_cnt: Option<u8>,
    /// `RNR_RETRY`: 0..=7 (7 = retry forever).
    pub rnr_retry: Option<u8>,
    /// `MIN_RNR_TIMER`: 0..=31 (IB spec table 45).
    pub min_rnr_timer: Option<u8>,
    /// `MAX_QP_RD_ATOMIC`: READs this QP keeps outstanding at once, 0..=[`MAX_RD_ATOMIC`].
    pub max_rd_atomic: Option<u8>,
}

/// The most READs a QP may keep outstanding (`max_rd_atomic`): the READ responses a peer
/// has room for ([`crate::engine::READ_RESPONSE_ROOM`], its `max_dest_rd_atomic`).
pub const MAX_RD_ATOMIC: u8 = 16;

/// A raw attribute value the driver cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpAttrError {
    /// `path_mtu` is not an `ibv_mtu` value 1..=5.
    InvalidPathMtu(u32),
    /// `dest_qp_num` does not fit in 24 bits.
    DestQpnTooWide(u32),
    /// The destination GID is not an IPv4-mapped address, and the card speaks IPv4 only.
    GidNotIpv4Mapped(Gid),
    /// `qp_access_flags` has bits that do not apply to a QP.
    InvalidAccessFlags(u32),
    /// A field exceeds its IB width (`timeout` and `min_rnr_timer` 5 bits, `retry_cnt` and
    /// `rnr_retry` 3 bits).
    OutOfRange {
        /// The attribute.
        attr: QpAttrMask,
        /// The value given.
        value: u8,
    },
}

impl fmt::Display for QpAttrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpAttrError::InvalidPathMtu(v) => write!(f, "path_mtu {v} is not 1..=5"),
            QpAttrError::DestQpnTooWide(v) => write!(f, "dest_qp_num {v:#x} exceeds 24 bits"),
            QpAttrError::GidNotIpv4Mapped(g) => {
                f.write_str("destination GID ")?;
                for (i, pair) in g.0.chunks(2).enumerate() {
                    if i != 0 {
                        f.write_str(":")?;
                    }
                    let word = pair.iter().fold(0u16, |w, b| (w << 8) | u16::from(*b));
                    write!(f, "{word:x}")?;
                }
                f.write_str(" is not IPv4-mapped (::ffff:a.b.c.d)")
            }
            QpAttrError::InvalidAccessFlags(v) => write!(f, "qp_access_flags {v:#x} invalid"),
            QpAttrError::OutOfRange { attr, value } => write!(f, "{attr} {value} out of range"),
        }
    }
}

fn bounded(attr: QpAttrMask, value: u8, max: u8) -> Result<u8, QpAttrError> {
    if value <= max {
        Ok(value)
    } else {
        Err(QpAttrError::OutOfRange { attr, value })
    }
}

impl QpAttr {
    /// Decodes the fields of `raw` whose bits are in `mask`; the others stay `None` and are
    /// not looked at. PSNs keep their low 24 bits, as the kernel does.
    pub fn decode(raw: &RawQpAttr, mask: QpAttrMask) -> Result<Self, QpAttrError> {
        let has = |bit| mask.contains(bit);
        let mut a = QpAttr::default();
        if has(QpAttrMask::STATE) {
            a.qp_state = Some(QpState::from_ibv(raw.qp_state));
        }
        if has(QpAttrMask::CUR_STATE) {
            a.cur_qp_state = Some(QpState::from_ibv(raw.cur_qp_state));
        }
        if has(QpAttrMask::PATH_MTU) {
            let mtu = u8::try_from(raw.path_mtu)
                .ok()
                .and_then(Pmtu::from_ibv)
                .ok_or(QpAttrError::InvalidPathMtu(raw.path_mtu))?;
            a.path_mtu = Some(mtu);
        }
        if has(QpAttrMask::DEST_QPN) {
            if raw.dest_qp_num > 0x00FF_FFFF {
                return Err(QpAttrError::DestQpnTooWide(raw.dest_qp_num));
            }
            a.dest_qpn = Some(Qpn::from_raw(raw.dest_qp_num));
        }
        if has(QpAttrMask::RQ_PSN) {
            a.rq_psn = Some(Psn::from_raw(raw.rq_psn));
        }
        if has(QpAttrMask::SQ_PSN) {
            a.sq_psn = Some(Psn::from_raw(raw.sq_psn));
        }
        if has(QpAttrMask::AV) {
            a.dest_ipv4 = Some(raw.dgid.to_ipv4()?);
        }
        if has(QpAttrMask::ACCESS_FLAGS) {
            let flags = QpAccessFlags::from_bits(raw.qp_access_flags)
                .ok_or(QpAttrError::InvalidAccessFlags(raw.qp_access_flags))?;
            a.access = Some(flags);
        }
        if has(QpAttrMask::TIMEOUT) {
            a.timeout = Some(bounded(QpAttrMask::TIMEOUT, raw.timeout, 31)?);
        }
        if has(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = Some(bounded(QpAttrMask::RETRY_CNT, raw.retry_cnt, 7)?);
        }
        if has(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = Some(bounded(QpAttrMask::RNR_RETRY, raw.rnr_retry, 7)?);
        }
        if has(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = Some(bounded(QpAttrMask::MIN_RNR_TIMER, raw.min_rnr_timer, 31)?);
        }
        if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = Some(bounded(
                QpAttrMask::MAX_QP_RD_ATOMIC,
                raw.max_rd_atomic,
                MAX_RD_ATOMIC,
            )?);
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    fn mapped(a: u8, b: u8, c: u8, d: u8) -> Gid {
        Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d])
    }

    #[test]
    fn ipv4_mapped_gid_yields_the_address() {
        assert_eq!(
            mapped(10, 0, 0, 7).to_ipv4(),
            Ok(Ipv4Addr::new(10, 0, 0, 7))
        );
        assert_eq!(
            Gid::from_ipv4(Ipv4Addr::new(192, 168, 1, 2)),
            mapped(192, 168, 1, 2)
        );
    }

    #[test]
    fn other_gids_are_errors_naming_the_gid() {
        let link_local = Gid([0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let e = link_local.to_ipv4().unwrap_err();
        assert_eq!(
            e.to_string(),
            "destination GID fe80:0:0:0:0:0:0:1 is not IPv4-mapped (::ffff:a.b.c.d)"
        );
        assert!(
            Gid::default().to_ipv4().is_err(),
            "the zero GID is not an address"
        );
        let mut compat = mapped(1, 2, 3, 4);
        compat.0[10] = 0;
        assert!(compat.to_ipv4().is_err(), "only ::ffff: is IPv4-mapped");
    }

    #[test]
    fn decode_reads_only_masked_fields() {
        let raw = RawQpAttr {
            qp_state: 2,
            path_mtu: 9,
            dest_qp_num: 0x0102_0304,
            rq_psn: 0xFF12_3456,
            dgid: mapped(10, 1, 2, 3),
            ..RawQpAttr::default()
        };
        // Bad path_mtu and dest_qp_num are ignored while their bits are clear.
        let a = QpAttr::decode(
            &raw,
            QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::RQ_PSN,
        )
        .unwrap();
        assert_eq!(a.qp_state, Some(QpState::Rtr));
        assert_eq!(a.dest_ipv4, Some(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(a.rq_psn, Some(Psn::from_raw(0x12_3456)));
        assert_eq!(a.path_mtu, None);
        assert_eq!(a.sq_psn, None);
        assert_eq!(
            QpAttr::decode(&raw, QpAttrMask::PATH_MTU),
            Err(QpAttrError::InvalidPathMtu(9))
        );
        assert_eq!(
            QpAttr::decode(&raw, QpAttrMask::DEST_QPN),
            Err(QpAttrError::DestQpnTooWide(0x0102_0304))
        );
    }

    #[test]
    fn decode_checks_widths_and_flags() {
        let mut raw = RawQpAttr {
            path_mtu: 3,
            dest_qp_num: 0x00_0123,
            qp_access_flags: 0b110,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            ..RawQpAttr::default()
        };
        let all = QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::ACCESS_FLAGS
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MIN_RNR_TIMER;
        let a = QpAttr::decode(&raw, all).unwrap();
        assert_eq!(a.path_mtu, Some(Pmtu::Mtu1024));
        assert_eq!(a.dest_qpn.map(Qpn::get), Some(0x123));
        assert_eq!(
            a.access,
            Some(QpAccessFlags::REMOTE_WRITE | QpAccessFlags::REMOTE_READ)
        );
        assert_eq!((a.timeout, a.retry_cnt), (Some(14), Some(7)));
        raw.retry_cnt = 8;
        let e = QpAttr::decode(&raw, all).unwrap_err();
        assert_eq!(e.to_string(), "RETRY_CNT 8 out of range");
        raw.retry_cnt = 0;
        raw.timeout = 50;
        assert_eq!(
            QpAttr::decode(&raw, all),
            Err(QpAttrError::OutOfRange {
                attr: QpAttrMask::TIMEOUT,
                value: 50
            }),
            "the reference's exponent 50 is refused, not clamped"
        );
        raw.timeout = 0;
        raw.max_rd_atomic = 16;
        let rd = QpAttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(QpAttr::decode(&raw, rd).unwrap().max_rd_atomic, Some(16));
        raw.max_rd_atomic = 17;
        assert_eq!(
            QpAttr::decode(&raw, rd).unwrap_err().to_string(),
            "MAX_QP_RD_ATOMIC 17 out of range",
            "more READs than the peer has room for"
        );
        assert_eq!(
            QpAttr::decode(&raw, all).unwrap().max_rd_atomic,
            None,
            "not in the mask"
        );
        raw.max_rd_atomic = 0;
        raw.qp_access_flags = 1 << 4;
        assert_eq!(
            QpAttr::decode(&raw, all),
            Err(QpAttrError::InvalidAccessFlags(16))
        );
    }
}
