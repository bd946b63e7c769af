//! Queue pairs: connecting one (`modify` and its RESET -> INIT -> RTR -> RTS helper), its
//! PSN numbering (the application's against the wire's), posting, querying, and destroying
//! it in the card when the handle goes.

use std::net::Ipv4Addr;
use std::sync::Mutex;

use bluerdma_core::engine::{QpAttrs, RecvWr, SendWr};
use bluerdma_core::keys::Qpn;
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, RawQpAttr};

use bluerdma_core::transport::PSN_MASK;

use super::{err, Cq, Error, Pd};

/// Where a QP connects to: what the peer tells us out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The peer's QPN.
    pub qpn: Qpn,
    /// The peer's IPv4 address.
    pub ip: Ipv4Addr,
    /// The first PSN the peer sends.
    pub psn: u32,
}

/// Whether the card can take `psn` as a connection's first PSN after a QP reset: not in
/// 0x7FFFF0..=0xFFFF7F (nic-behaviour-review.md P5/P6: the RTL freezes, the emulated NIC
/// ignores the packet).
pub fn card_takes_first_psn(psn: u32) -> bool {
    !(0x7F_FFF0..=0xFF_FF7F).contains(&(psn & PSN_MASK))
}

/// A queue pair.
pub struct Qp {
    pub(super) pd: Pd,
    pub(super) _cqs: (Cq, Cq),
    pub(super) qpn: Qpn,
    /// Application PSN minus wire PSN (mod 2^24), send and receive (see [`Qp::modify`]).
    pub(super) psn_offset: Mutex<(u32, u32)>,
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// This QP as an endpoint for a peer (our IP, our QPN, our first PSN).
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint {
            qpn: self.qpn,
            ip: self.pd.0.ctx.spec.ip,
            psn,
        }
    }

    /// modify_qp with raw ibv attributes and mask.
    ///
    /// Every connection starts on the wire from the device's `wire_psn_start` (0 by
    /// default), whatever `sq_psn` and `rq_psn` say. Applications such as ibv_rc_pingpong
    /// pick random PSNs, and the card cannot take a first PSN in 0x7FFFF0..=0xFFFF7F after
    /// a QP reset. It must also be a constant: a responder that stays in RTR (perftest's
    /// ib_read_bw server) answers READs from its send PSNs without ever being given an
    /// `sq_psn`, and the requester must know where those start. Both ends run this driver.
    /// [`Qp::psns`] reports the application's numbering.
    pub fn modify(&self, attr: &RawQpAttr, mask: QpAttrMask) -> Result<(), Error> {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        let start = ctx.spec.wire_psn_start & PSN_MASK;
        let mut wire = *attr;
        if mask.contains(QpAttrMask::SQ_PSN) {
            wire.sq_psn = start;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            wire.rq_psn = start;
        }
        ctx.lock()
            .modify_qp(self.qpn, &wire, mask, &mut clock)
            .map_err(err("modify_qp"))?;
        // Application PSN = wire PSN + this offset (mod 2^24).
        let offset = |app: u32| (app & PSN_MASK).wrapping_sub(start) & PSN_MASK;
        let mut psn = self.psn_offset.lock().unwrap_or_else(|e| e.into_inner());
        if mask.contains(QpAttrMask::SQ_PSN) {
            psn.0 = offset(attr.sq_psn);
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            psn.1 = offset(attr.rq_psn);
        }
        Ok(())
    }

    /// The next PSN this QP sends and the next it expects, in the application's numbering
    /// (the `sq_psn` and `rq_psn` it set, advanced by the traffic; see [`Qp::modify`]).
    pub fn psns(&self, attrs: &QpAttrs) -> (u32, u32) {
        let (sq, rq) = *self.psn_offset.lock().unwrap_or_else(|e| e.into_inner());
        (
            sq.wrapping_add(attrs.sq_psn.get()) & PSN_MASK,
            rq.wrapping_add(attrs.rq_psn.get()) & PSN_MASK,
        )
    }

    /// RESET -> INIT -> RTR -> RTS towards `remote`, sending from `my_psn`, with IB
    /// `timeout` and `retry_cnt`.
    pub fn connect(
        &self,
        remote: Endpoint,
        my_psn: u32,
        timeout: u8,
        retry_cnt: u8,
    ) -> Result<(), Error> {
        self.connect_rnr(remote, my_psn, timeout, retry_cnt, 7, 12)
    }

    /// As [`Qp::connect`], with the RNR attributes: `rnr_retry` (7 = forever) and
    /// `min_rnr_timer` (IB table 45 code; 12 = 0.64 ms).
    pub fn connect_rnr(
        &self,
        remote: Endpoint,
        my_psn: u32,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        min_rnr_timer: u8,
    ) -> Result<(), Error> {
        let access = (1 | 2 | 4) as u32; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Init.to_ibv(),
                qp_access_flags: access,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Rtr.to_ibv(),
                path_mtu: 5,
                dest_qp_num: remote.qpn.get(),
                rq_psn: remote.psn,
                dgid: Gid::from_ipv4(remote.ip),
                min_rnr_timer,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Rts.to_ibv(),
                sq_psn: my_psn,
                timeout,
                retry_cnt,
                rnr_retry,
                max_rd_atomic: bluerdma_core::qp::MAX_RD_ATOMIC,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// How many send WRs posted on this QP have left its send queue (completed, failed or
    /// flushed, signaled or not): the caller's buffers of the first that many are free.
    pub fn sq_retired(&self) -> Result<u64, Error> {
        self.pd
            .0
            .ctx
            .lock()
            .sq_retired(self.qpn)
            .map_err(err("sq_retired"))
    }

    /// The QP's state and attributes.
    pub fn query(&self) -> Result<QpAttrs, Error> {
        self.pd
            .0
            .ctx
            .lock()
            .query_qp(self.qpn)
            .map_err(err("query_qp"))
    }

    /// Posts a chain of send work requests; on failure returns the index of the first
    /// request not posted (`bad_wr`) and why.
    ///
    /// # Safety
    /// Every local buffer `[laddr, laddr + len)` must stay valid, and must not be written
    /// (for WRITE) or read (for READ) by the caller, until the request's completion is
    /// polled (or, for an unsignaled request, a later signaled one's): it belongs to the
    /// work request until then.
    pub unsafe fn post_send(&self, wrs: &[SendWr]) -> Result<(), (usize, Error)> {
        let ctx = &self.pd.0.ctx;
        let now = ctx.now();
        let mut dev = ctx.lock();
        dev.defer_tx = ctx.inline.is_some() && ctx.post_burst(now, wrs.len());
        let r = dev.post_send(self.qpn, wrs, now).map_err(|(k, e)| {
            (
                k,
                Error {
                    op: "post_send",
                    kind: e,
                },
            )
        });
        drop(dev);
        ctx.kick_posted();
        r
    }

    /// Posts receive work requests (SEND arrives with issue D; WRITE_WITH_IMM consumes them).
    ///
    /// # Safety
    /// As for [`Qp::post_send`]: each buffer belongs to the request until its completion.
    pub unsafe fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), (usize, Error)> {
        self.pd
            .0
            .ctx
            .lock()
            .post_recv(self.qpn, wrs)
            .map_err(|(k, e)| {
                (
                    k,
                    Error {
                        op: "post_recv",
                        kind: e,
                    },
                )
            })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        if let Err(e) = ctx.lock().destroy_qp(self.qpn, &mut clock) {
            log::error!("destroy_qp({:#x}): {e}", self.qpn.get());
        }
    }
}

#[cfg(test)]
mod psn_tests {
    use super::card_takes_first_psn;

    #[test]
    fn first_psns_the_card_cannot_take() {
        for (psn, ok) in [
            (0, true),
            (0x7F_FFEF, true),
            (0x7F_FFF0, false),
            (0xAB_CDEF, false),
            (0xFF_FF7F, false),
            (0xFF_FF80, true),
            (0xFF_FFF0, true),
        ] {
            assert_eq!(card_takes_first_psn(psn), ok, "first PSN {psn:#x}");
        }
    }
}
