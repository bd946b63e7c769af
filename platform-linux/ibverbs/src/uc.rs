//! UC QPs, carried as RC. The card reports no UC packet (nic-behaviour.md 4.1: only RC
//! packets produce meta reports), so a UC receiver would never learn that a SEND or a
//! WRITE_WITH_IMM arrived. A UC QP of this library is therefore an RC QP of the engine
//! (`rc_qp.rs`) with UC's interface: ibv_qp.qp_type is IBV_QPT_UC, ibv_modify_qp takes
//! UC's attribute masks (checked against UC's state table, then completed with the RC
//! attributes the engine needs: timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12),
//! and RDMA READ and atomics are refused at post time (EINVAL), as UC has neither.
//!
//! What differs from a UC QP of a card that has UC: delivery is reliable (lost packets are
//! resent; UC would drop the message), a SEND that finds no receive WR waits for one (UC
//! would drop it), a send completes once acknowledged rather than once sent, and a peer
//! that stops answering fails the QP with RETRY_EXC_ERR. Both ends must be this driver's
//! UC QPs (they speak RC on the wire).

use core::ffi::c_int;

use bluerdma_core::qp::{check_transition, QpAttrMask, QpState, QpType};

use crate::abi::*;

/// RC attributes a UC transition leaves out: min_rnr_timer 12 (0.64 ms), timeout 14
/// (67 ms), retry_cnt 7, rnr_retry 7 (a SEND waits for a receive WR).
const MIN_RNR_TIMER: u8 = 12;
const TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;
const RNR_RETRY: u8 = 7;

/// Whether `qp` is a UC QP.
pub(crate) fn is_uc(qp: &IbvQp) -> bool {
    qp.qp_type == IBV_QPT_UC
}

/// The RC attributes and mask for a UC modify of `qp` (in `state`) with `a` and `mask`:
/// EINVAL (logged with the state table's words) for what UC does not allow.
pub(crate) fn as_rc(
    state: QpState,
    a: &IbvQpAttr,
    mask: QpAttrMask,
) -> Result<(IbvQpAttr, QpAttrMask), c_int> {
    let to = if mask.contains(QpAttrMask::STATE) {
        QpState::from_ibv(a.qp_state)
    } else {
        state
    };
    if let Err(e) = check_transition(QpType::Uc, state, to, mask) {
        log::error!("modify_qp: {e}");
        return Err(libc::EINVAL);
    }
    let mut rc = *a;
    let mut mask = mask;
    if state == QpState::Init && to == QpState::Rtr {
        rc.min_rnr_timer = MIN_RNR_TIMER;
        rc.max_dest_rd_atomic = 0;
        mask |= QpAttrMask::MIN_RNR_TIMER | QpAttrMask::MAX_DEST_RD_ATOMIC;
    }
    if state == QpState::Rtr && to == QpState::Rts {
        rc.timeout = TIMEOUT;
        rc.retry_cnt = RETRY_CNT;
        rc.rnr_retry = RNR_RETRY;
        rc.max_rd_atomic = 0;
        mask |= QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    Ok((rc, mask))
}

/// Whether a UC QP may post `opcode` (READ and atomics are RC's).
pub(crate) fn refuses(opcode: u32) -> bool {
    matches!(
        opcode,
        IBV_WR_RDMA_READ
            | IBV_WR_ATOMIC_CMP_AND_SWP
            | IBV_WR_ATOMIC_FETCH_AND_ADD
            // Its invalidation waits for the ACKs of the requests before it (`remote_inv`),
            // which UC has not.
            | IBV_WR_SEND_WITH_INV
    )
}
