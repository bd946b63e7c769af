//! The IB queue-pair state machine and its attribute-mask table, as `const` data.
//!
//! The card has no QP states (its QP context is valid or not, nic-behaviour.md 5.3), so
//! the driver enforces them. The table follows the IB specification (11.2.5, Modify QP)
//! as Linux's `ib_modify_qp_is_ok` encodes it, for the three transport types the driver
//! knows: for each `(from, to)` pair and QP type, the attributes a `modify_qp` must carry
//! (required) and may carry (optional). Everything else in the mask is forbidden, except
//! `STATE`, which names the transition itself.
//!
//! Two deliberate points:
//! - any state may go to RESET or ERR with no other attribute (IB spec: "any state" rows);
//! - SQE -> RTS is listed for UC and UD only: an RC QP never enters SQE (its send errors
//!   move it to ERR), so the RC entry would be dead.
//!
//! `CUR_STATE` is optional exactly in the transitions out of RTR, RTS, SQD and SQE that
//! the kernel accepts it in, so the table alone reproduces the kernel's extra check that
//! `CUR_STATE` is only given in those states. [`check_modify`] resolves `STATE` and
//! `CUR_STATE` the way a `modify_qp` call does.

use core::fmt;

use bitflags::bitflags;

/// A QP state, with the `ibv_qp_state` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// IBV_QPS_RESET (0).
    Reset,
    /// IBV_QPS_INIT (1).
    Init,
    /// IBV_QPS_RTR (2): ready to receive.
    Rtr,
    /// IBV_QPS_RTS (3): ready to send.
    Rts,
    /// IBV_QPS_SQD (4): send queue drained.
    Sqd,
    /// IBV_QPS_SQE (5): send queue error (UC and UD only).
    Sqe,
    /// IBV_QPS_ERR (6).
    Err,
    /// Any other value received from a caller (IBV_QPS_UNKNOWN = 7 included).
    Unknown(u32),
}

impl QpState {
    /// Every known state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// Decodes an `ibv_qp_state` value.
    pub const fn from_ibv(v: u32) -> Self {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            other => QpState::Unknown(other),
        }
    }

    /// The `ibv_qp_state` value.
    pub const fn to_ibv(self) -> u32 {
        match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Sqd => 4,
            QpState::Sqe => 5,
            QpState::Err => 6,
            QpState::Unknown(v) => v,
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
            QpState::Unknown(v) => return write!(f, "UNKNOWN({v})"),
        };
        f.write_str(name)
    }
}

/// A QP transport type, with the `ibv_qp_type` values. The card's send descriptor carries
/// the same numbers (nic-behaviour.md 1.2); the driver exercises RC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// IBV_QPT_RC (2): reliable connected.
    Rc,
    /// IBV_QPT_UC (3): unreliable connected.
    Uc,
    /// IBV_QPT_UD (4): unreliable datagram.
    Ud,
    /// Any other value (raw packet 8, XRC 9/10, ...): not supported by the state table.
    Unknown(u32),
}

impl QpType {
    /// Decodes an `ibv_qp_type` value.
    pub const fn from_ibv(v: u32) -> Self {
        match v {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            other => QpType::Unknown(other),
        }
    }

    /// The `ibv_qp_type` value.
    pub const fn to_ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
            QpType::Unknown(v) => v,
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpType::Rc => f.write_str("RC"),
            QpType::Uc => f.write_str("UC"),
            QpType::Ud => f.write_str("UD"),
            QpType::Unknown(v) => write!(f, "QP type {v}"),
        }
    }
}

bitflags! {
    /// The `attr_mask` of `ibv_modify_qp`, with the libibverbs bit values (`ibv_qp_attr_mask`).
    /// Bits 21..24 were never exposed by libibverbs; unknown bits are kept (`from_bits_retain`)
    /// so that the table can name them as forbidden.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`: the state to move to.
        const STATE = 1 << 0;
        /// `cur_qp_state`: the state the caller believes the QP is in.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`: the primary path (for RoCE: the destination GID, hence IP).
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`: local ACK timeout exponent.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends: the alternate path.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit`.
        const RATE_LIMIT = 1 << 25;
    }
}

impl fmt::Display for QpAttrMask {
    /// Attribute names joined by `|` (`DEST_QPN|RQ_PSN`), unknown bits in hex, `none` if empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, _) in self.iter_names() {
            if !first {
                f.write_str("|")?;
            }
            f.write_str(name)?;
            first = false;
        }
        let unknown = self.bits() & !QpAttrMask::all().bits();
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{unknown:#x}")?;
            first = false;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// The attributes of one transition for one QP type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrRule {
    /// Attributes the mask must contain.
    pub required: QpAttrMask,
    /// Attributes the mask may contain.
    pub optional: QpAttrMask,
}

/// One row of the transition table: a `(from, to)` pair and its rule per QP type; `None`
/// where the transition is not valid for that type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Current state.
    pub from: QpState,
    /// Requested state.
    pub to: QpState,
    /// Rule for RC QPs.
    pub rc: Option<AttrRule>,
    /// Rule for UC QPs.
    pub uc: Option<AttrRule>,
    /// Rule for UD QPs.
    pub ud: Option<AttrRule>,
}

impl Transition {
    /// The rule for `qp_type`, if the transition is valid for it.
    pub const fn rule(&self, qp_type: QpType) -> Option<AttrRule> {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::Unknown(_) => None,
        }
    }
}

/// The union of `bits` (`|` is not usable in `const` items).
const fn m(bits: &[QpAttrMask]) -> QpAttrMask {
    let mut acc = 0;
    let mut i = 0;
    while i < bits.len() {
        acc |= bits[i].bits();
        i += 1;
    }
    QpAttrMask::from_bits_retain(acc)
}

const fn rule(required: QpAttrMask, optional: QpAttrMask) -> Option<AttrRule> {
    Some(AttrRule { required, optional })
}

const NONE: QpAttrMask = QpAttrMask::empty();

/// A transition valid for every QP type with no attribute but `STATE`.
const fn bare(from: QpState, to: QpState) -> Transition {
    Transition {
        from,
        to,
        rc: rule(NONE, NONE),
        uc: rule(NONE, NONE),
        ud: rule(NONE, NONE),
    }
}

use QpAttrMask as A;
use QpState as S;

/// The transition table (IB spec 11.2.5; Linux `qp_state_table` semantics).
pub const TRANSITIONS: &[Transition] = &[
    // Any state -> RESET and any state -> ERR.
    bare(S::Reset, S::Reset),
    bare(S::Init, S::Reset),
    bare(S::Rtr, S::Reset),
    bare(S::Rts, S::Reset),
    bare(S::Sqd, S::Reset),
    bare(S::Sqe, S::Reset),
    bare(S::Err, S::Reset),
    bare(S::Reset, S::Err),
    bare(S::Init, S::Err),
    bare(S::Rtr, S::Err),
    bare(S::Rts, S::Err),
    bare(S::Sqd, S::Err),
    bare(S::Sqe, S::Err),
    bare(S::Err, S::Err),
    Transition {
        from: S::Reset,
        to: S::Init,
        rc: rule(m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]), NONE),
        uc: rule(m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]), NONE),
        ud: rule(m(&[A::PKEY_INDEX, A::PORT, A::QKEY]), NONE),
    },
    Transition {
        from: S::Init,
        to: S::Init,
        rc: rule(NONE, m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS])),
        uc: rule(NONE, m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS])),
        ud: rule(NONE, m(&[A::PKEY_INDEX, A::PORT, A::QKEY])),
    },
    Transition {
        from: S::Init,
        to: S::Rtr,
        rc: rule(
            m(&[
                A::AV,
                A::PATH_MTU,
                A::DEST_QPN,
                A::RQ_PSN,
                A::MAX_DEST_RD_ATOMIC,
                A::MIN_RNR_TIMER,
            ]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
        ),
        uc: rule(
            m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
            m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
        ),
        ud: rule(NONE, m(&[A::PKEY_INDEX, A::QKEY])),
    },
    Transition {
        from: S::Rtr,
        to: S::Rts,
        rc: rule(
            m(&[
                A::SQ_PSN,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
            ]),
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
        ),
        uc: rule(
            A::SQ_PSN,
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
        ),
        ud: rule(A::SQ_PSN, m(&[A::CUR_STATE, A::QKEY])),
    },
    Transition {
        from: S::Rts,
        to: S::Rts,
        rc: rule(
            NONE,
            m(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
                A::MIN_RNR_TIMER,
            ]),
        ),
        uc: rule(
            NONE,
            m(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
            ]),
        ),
        ud: rule(NONE, m(&[A::CUR_STATE, A::QKEY])),
    },
    Transition {
        from: S::Rts,
        to: S::Sqd,
        rc: rule(NONE, A::EN_SQD_ASYNC_NOTIFY),
        uc: rule(NONE, A::EN_SQD_ASYNC_NOTIFY),
        ud: rule(NONE, A::EN_SQD_ASYNC_NOTIFY),
    },
    Transition {
        from: S::Sqd,
        to: S::Rts,
        rc: rule(
            NONE,
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
        ),
        uc: rule(
            NONE,
            m(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
        ),
        ud: rule(NONE, m(&[A::CUR_STATE, A::QKEY])),
    },
    Transition {
        from: S::Sqd,
        to: S::Sqd,
        rc: rule(
            NONE,
            m(&[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
                A::MAX_DEST_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
        ),
        uc: rule(
            NONE,
            m(&[
                A::AV,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ]),
        ),
        ud: rule(NONE, m(&[A::PKEY_INDEX, A::QKEY])),
    },
    Transition {
        from: S::Sqe,
        to: S::Rts,
        rc: None,
        uc: rule(NONE, m(&[A::CUR_STATE, A::ACCESS_FLAGS])),
        ud: rule(NONE, m(&[A::CUR_STATE, A::QKEY])),
    },
];

/// The row of [`TRANSITIONS`] for `(from, to)`, if any QP type may take it.
pub fn find_transition(from: QpState, to: QpState) -> Option<&'static Transition> {
    TRANSITIONS.iter().find(|t| t.from == from && t.to == to)
}

/// Why a `modify_qp` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionFault {
    /// The QP type has no state table (only RC, UC and UD do).
    UnsupportedQpType,
    /// The current or requested state is not a known `ibv_qp_state`.
    UnknownState,
    /// `CUR_STATE` was given and names another state than the QP is in.
    CurrentStateMismatch {
        /// The state the caller claimed.
        claimed: QpState,
    },
    /// The table has no such transition for this QP type.
    NotAllowed,
    /// The transition exists, but the mask lacks required attributes or carries others.
    Attributes {
        /// Required attributes absent from the mask.
        missing: QpAttrMask,
        /// Attributes in the mask that are neither required nor optional.
        forbidden: QpAttrMask,
    },
}

/// A refused QP transition: the states, the QP type and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpTransitionError {
    /// The QP's type.
    pub qp_type: QpType,
    /// The state the QP is in.
    pub current: QpState,
    /// The state asked for (the current one if the mask lacks `STATE`).
    pub requested: QpState,
    /// What is wrong.
    pub fault: TransitionFault,
}

impl fmt::Display for QpTransitionError {
    /// For example `INIT -> RTR on RC: missing DEST_QPN|RQ_PSN; forbidden SQ_PSN`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} on {}: ",
            self.current, self.requested, self.qp_type
        )?;
        match self.fault {
            TransitionFault::UnsupportedQpType => f.write_str("unsupported QP type"),
            TransitionFault::UnknownState => f.write_str("unknown QP state"),
            TransitionFault::CurrentStateMismatch { claimed } => {
                write!(f, "cur_qp_state says {claimed}")
            }
            TransitionFault::NotAllowed => f.write_str("not a valid transition"),
            TransitionFault::Attributes { missing, forbidden } => {
                match (missing.is_empty(), forbidden.is_empty()) {
                    (false, false) => write!(f, "missing {missing}; forbidden {forbidden}"),
                    (false, true) => write!(f, "missing {missing}"),
                    _ => write!(f, "forbidden {forbidden}"),
                }
            }
        }
    }
}

/// Checks that a QP of `qp_type` in state `current` may move to `requested` with the
/// attributes in `mask`.
///
/// `STATE` is required when the states differ and is otherwise optional; `CUR_STATE` is
/// checked by the table like any attribute (its value is [`check_modify`]'s business).
pub fn check_transition(
    qp_type: QpType,
    current: QpState,
    requested: QpState,
    mask: QpAttrMask,
) -> Result<(), QpTransitionError> {
    let fail = |fault| {
        Err(QpTransitionError {
            qp_type,
            current,
            requested,
            fault,
        })
    };
    if matches!(qp_type, QpType::Unknown(_)) {
        return fail(TransitionFault::UnsupportedQpType);
    }
    if matches!(current, QpState::Unknown(_)) || matches!(requested, QpState::Unknown(_)) {
        return fail(TransitionFault::UnknownState);
    }
    let Some(rule) = find_transition(current, requested).and_then(|t| t.rule(qp_type)) else {
        return fail(TransitionFault::NotAllowed);
    };
    let mut required = rule.required;
    if current != requested {
        required |= QpAttrMask::STATE;
    }
    let allowed = required | rule.optional | QpAttrMask::STATE;
    let missing = required.difference(mask);
    let forbidden = mask.difference(allowed);
    if missing.is_empty() && forbidden.is_empty() {
        Ok(())
    } else {
        fail(TransitionFault::Attributes { missing, forbidden })
    }
}

/// Checks a whole `modify_qp` call and returns the state the QP moves to.
///
/// `actual` is the state the driver holds for the QP; `cur_qp_state` and `qp_state` are the
/// call's fields, read only when `CUR_STATE` and `STATE` are in `mask`. Without `STATE`
/// the QP stays where it is (a pure attribute change). With `CUR_STATE` the claimed state
/// must equal `actual`: the driver, not the card, is the authority on QP state here, so a
/// caller that believes otherwise is told so instead of acting on a wrong premise.
pub fn check_modify(
    qp_type: QpType,
    actual: QpState,
    mask: QpAttrMask,
    cur_qp_state: QpState,
    qp_state: QpState,
) -> Result<QpState, QpTransitionError> {
    let requested = if mask.contains(QpAttrMask::STATE) {
        qp_state
    } else {
        actual
    };
    if mask.contains(QpAttrMask::CUR_STATE) && cur_qp_state != actual {
        return Err(QpTransitionError {
            qp_type,
            current: actual,
            requested,
            fault: TransitionFault::CurrentStateMismatch {
                claimed: cur_qp_state,
            },
        });
    }
    check_transition(qp_type, actual, requested, mask).map(|()| requested)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;
    use std::string::ToString;

    const RC: QpType = QpType::Rc;

    #[test]
    fn mask_bits_have_the_libibverbs_values() {
        let expect: [(QpAttrMask, u32); 22] = [
            (A::STATE, 1),
            (A::CUR_STATE, 2),
            (A::EN_SQD_ASYNC_NOTIFY, 4),
            (A::ACCESS_FLAGS, 8),
            (A::PKEY_INDEX, 16),
            (A::PORT, 32),
            (A::QKEY, 64),
            (A::AV, 128),
            (A::PATH_MTU, 256),
            (A::TIMEOUT, 512),
            (A::RETRY_CNT, 1024),
            (A::RNR_RETRY, 2048),
            (A::RQ_PSN, 4096),
            (A::MAX_QP_RD_ATOMIC, 8192),
            (A::ALT_PATH, 16384),
            (A::MIN_RNR_TIMER, 32768),
            (A::SQ_PSN, 65536),
            (A::MAX_DEST_RD_ATOMIC, 131072),
            (A::PATH_MIG_STATE, 262144),
            (A::CAP, 524288),
            (A::DEST_QPN, 1048576),
            (A::RATE_LIMIT, 33554432),
        ];
        for (flag, bits) in expect {
            assert_eq!(flag.bits(), bits, "{flag}");
        }
    }

    #[test]
    fn states_and_types_round_trip_ibv_values() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(s.to_ibv(), i as u32);
            assert_eq!(QpState::from_ibv(i as u32), *s);
        }
        assert_eq!(QpState::from_ibv(7), QpState::Unknown(7));
        assert_eq!(QpState::Unknown(99).to_ibv(), 99);
        assert_eq!(QpType::from_ibv(2), QpType::Rc);
        assert_eq!(QpType::from_ibv(3), QpType::Uc);
        assert_eq!(QpType::from_ibv(4), QpType::Ud);
        assert_eq!(QpType::from_ibv(8), QpType::Unknown(8));
        assert_eq!(QpType::Ud.to_ibv(), 4);
    }

    #[test]
    fn rc_connection_sequence_is_accepted() {
        let init = A::STATE | A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS;
        assert_eq!(check_transition(RC, S::Reset, S::Init, init), Ok(()));
        let rtr = A::STATE
            | A::AV
            | A::PATH_MTU
            | A::DEST_QPN
            | A::RQ_PSN
            | A::MAX_DEST_RD_ATOMIC
            | A::MIN_RNR_TIMER;
        assert_eq!(check_transition(RC, S::Init, S::Rtr, rtr), Ok(()));
        assert_eq!(
            check_transition(RC, S::Init, S::Rtr, rtr | A::ACCESS_FLAGS | A::PKEY_INDEX),
            Ok(())
        );
        let rts =
            A::STATE | A::SQ_PSN | A::TIMEOUT | A::RETRY_CNT | A::RNR_RETRY | A::MAX_QP_RD_ATOMIC;
        assert_eq!(check_transition(RC, S::Rtr, S::Rts, rts), Ok(()));
    }

    #[test]
    fn error_names_states_and_missing_and_forbidden_attributes() {
        let mask =
            A::STATE | A::AV | A::PATH_MTU | A::MAX_DEST_RD_ATOMIC | A::MIN_RNR_TIMER | A::SQ_PSN;
        let e = check_transition(RC, S::Init, S::Rtr, mask).unwrap_err();
        assert_eq!(
            e.fault,
            TransitionFault::Attributes {
                missing: A::DEST_QPN | A::RQ_PSN,
                forbidden: A::SQ_PSN
            }
        );
        assert_eq!(
            e.to_string(),
            "INIT -> RTR on RC: missing RQ_PSN|DEST_QPN; forbidden SQ_PSN"
        );
    }

    #[test]
    fn ud_and_uc_have_their_own_requirements() {
        let ud_init = A::STATE | A::PKEY_INDEX | A::PORT | A::QKEY;
        assert_eq!(
            check_transition(QpType::Ud, S::Reset, S::Init, ud_init),
            Ok(())
        );
        let e = check_transition(RC, S::Reset, S::Init, ud_init).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT on RC: missing ACCESS_FLAGS; forbidden QKEY"
        );
        assert_eq!(
            check_transition(QpType::Ud, S::Init, S::Rtr, A::STATE),
            Ok(())
        );
        let uc_rtr = A::STATE | A::AV | A::PATH_MTU | A::DEST_QPN | A::RQ_PSN;
        assert_eq!(
            check_transition(QpType::Uc, S::Init, S::Rtr, uc_rtr),
            Ok(())
        );
        assert_eq!(
            check_transition(QpType::Uc, S::Rtr, S::Rts, A::STATE | A::SQ_PSN),
            Ok(())
        );
    }

    #[test]
    fn any_state_goes_to_reset_or_err_with_state_only() {
        for from in QpState::ALL {
            for to in [S::Reset, S::Err] {
                for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
                    assert_eq!(
                        check_transition(t, from, to, A::STATE),
                        Ok(()),
                        "{from}->{to}"
                    );
                }
            }
        }
        let e = check_transition(RC, S::Rts, S::Err, A::STATE | A::TIMEOUT).unwrap_err();
        assert_eq!(e.to_string(), "RTS -> ERR on RC: forbidden TIMEOUT");
    }

    #[test]
    fn invalid_transitions_and_inputs_are_named() {
        let e = check_transition(RC, S::Rts, S::Init, A::STATE).unwrap_err();
        assert_eq!(e.fault, TransitionFault::NotAllowed);
        assert_eq!(e.to_string(), "RTS -> INIT on RC: not a valid transition");
        let e = check_transition(RC, S::Sqe, S::Rts, A::STATE).unwrap_err();
        assert_eq!(e.fault, TransitionFault::NotAllowed, "RC never uses SQE");
        assert_eq!(
            check_transition(QpType::Ud, S::Sqe, S::Rts, A::STATE),
            Ok(())
        );
        let e = check_transition(QpType::Unknown(8), S::Reset, S::Init, A::STATE).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT on QP type 8: unsupported QP type"
        );
        let e = check_transition(RC, S::Reset, S::Unknown(7), A::STATE).unwrap_err();
        assert_eq!(e.to_string(), "RESET -> UNKNOWN(7) on RC: unknown QP state");
        let e = check_transition(
            RC,
            S::Init,
            S::Rtr,
            QpAttrMask::from_bits_retain(1 << 21 | 1),
        );
        assert!(e.unwrap_err().to_string().ends_with("forbidden 0x200000"));
    }

    #[test]
    fn state_bit_is_required_to_move_and_optional_to_stay() {
        let e = check_transition(RC, S::Rts, S::Reset, QpAttrMask::empty()).unwrap_err();
        assert_eq!(e.to_string(), "RTS -> RESET on RC: missing STATE");
        assert_eq!(
            check_transition(RC, S::Rts, S::Rts, A::MIN_RNR_TIMER),
            Ok(())
        );
        assert_eq!(check_transition(RC, S::Rts, S::Rts, A::STATE), Ok(()));
    }

    #[test]
    fn cur_state_is_accepted_only_where_the_kernel_accepts_it() {
        assert_eq!(check_transition(RC, S::Rts, S::Rts, A::CUR_STATE), Ok(()));
        assert_eq!(
            check_transition(RC, S::Sqd, S::Rts, A::STATE | A::CUR_STATE),
            Ok(())
        );
        let e = check_transition(RC, S::Init, S::Init, A::CUR_STATE).unwrap_err();
        assert_eq!(e.to_string(), "INIT -> INIT on RC: forbidden CUR_STATE");
        let e = check_transition(RC, S::Rtr, S::Reset, A::STATE | A::CUR_STATE).unwrap_err();
        assert!(matches!(e.fault, TransitionFault::Attributes { .. }));
    }

    #[test]
    fn check_modify_resolves_state_and_cur_state() {
        // Without STATE the QP stays; the attribute change is checked against RTS -> RTS.
        assert_eq!(
            check_modify(RC, S::Rts, A::MIN_RNR_TIMER, S::Reset, S::Reset),
            Ok(S::Rts)
        );
        let e = check_modify(RC, S::Rts, A::SQ_PSN, S::Reset, S::Reset).unwrap_err();
        assert_eq!(e.to_string(), "RTS -> RTS on RC: forbidden SQ_PSN");
        assert_eq!(
            check_modify(RC, S::Rts, A::STATE, S::Reset, S::Err),
            Ok(S::Err)
        );
        let e = check_modify(RC, S::Rtr, A::STATE | A::CUR_STATE, S::Rts, S::Rts).unwrap_err();
        assert_eq!(e.to_string(), "RTR -> RTS on RC: cur_qp_state says RTS");
        assert_eq!(
            check_modify(RC, S::Sqd, A::STATE | A::CUR_STATE, S::Sqd, S::Rts),
            Ok(S::Rts)
        );
    }

    #[test]
    fn table_has_one_row_per_pair_and_only_known_states() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            assert!(!matches!(a.from, S::Unknown(_)) && !matches!(a.to, S::Unknown(_)));
            for b in &TRANSITIONS[i + 1..] {
                assert!(
                    !(a.from == b.from && a.to == b.to),
                    "{} -> {}",
                    a.from,
                    a.to
                );
            }
            for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
                if let Some(r) = a.rule(t) {
                    assert!(r.required.intersection(r.optional).is_empty());
                    assert!(!r.required.contains(A::STATE) && !r.optional.contains(A::STATE));
                }
            }
        }
        assert_eq!(format!("{}", QpAttrMask::empty()), "none");
    }
}
