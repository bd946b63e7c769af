//! Queue pairs: the IB state machine with its attribute table ([`state`]) and the
//! `modify_qp` attributes the driver honours ([`attr`]).

pub mod attr;
pub mod state;

pub use attr::{Gid, QpAccessFlags, QpAttr, QpAttrError, RawQpAttr, MAX_RD_ATOMIC};
pub use state::{
    check_modify, check_transition, QpAttrMask, QpState, QpTransitionError, QpType, TransitionFault,
};
