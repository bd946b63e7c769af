//! The engine's error type: every verb returns one of these, never panics.

use core::fmt;

use crate::desc::DescError;
use crate::platform::PlatformError;
use crate::qp::{QpAttrError, QpState, QpTransitionError};
use crate::ring::NotAPointer;
use crate::transport::FragmentError;

/// Why a verb failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// An argument is invalid; `what` names it.
    InvalidArgument {
        /// The argument and the rule it broke.
        what: &'static str,
    },
    /// A fixed table is full; `what` names it.
    OutOfResources {
        /// The resource.
        what: &'static str,
    },
    /// No such object (a stale or foreign handle).
    NoSuchObject {
        /// The kind of object.
        what: &'static str,
        /// The handle that was passed.
        handle: u32,
    },
    /// The object is still in use (e.g. a CQ with QPs, a PD with MRs).
    Busy {
        /// The kind of object.
        what: &'static str,
    },
    /// The QP's state does not allow the operation.
    WrongQpState {
        /// The QP's state.
        state: QpState,
        /// The operation.
        op: &'static str,
    },
    /// A modify_qp transition is not allowed.
    Transition(QpTransitionError),
    /// A modify_qp attribute is out of range.
    Attribute(QpAttrError),
    /// A local buffer is not inside an MR with the right key and access.
    LocalProtection {
        /// The lkey.
        lkey: u32,
    },
    /// The send queue is full.
    SendQueueFull,
    /// The request cannot be cut into card requests.
    Fragment(FragmentError),
    /// The card did not answer a command in time.
    CommandTimeout {
        /// The command.
        op: &'static str,
    },
    /// The card answered a command with is_success = 0.
    CommandFailed {
        /// The command.
        op: &'static str,
    },
    /// A descriptor could not be built.
    Descriptor(DescError),
    /// A platform service failed.
    Platform(PlatformError),
    /// A ring register of the card read a value it cannot hold (not the card's BAR).
    RingRegister(NotAPointer),
    /// The operation is not supported (yet, or by this card).
    Unsupported {
        /// What is not supported.
        what: &'static str,
    },
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            VerbsError::OutOfResources { what } => write!(f, "out of resources: {what}"),
            VerbsError::NoSuchObject { what, handle } => {
                write!(f, "no {what} with handle {handle}")
            }
            VerbsError::Busy { what } => write!(f, "{what} is still in use"),
            VerbsError::WrongQpState { state, op } => {
                write!(f, "{op} is not allowed in QP state {state}")
            }
            VerbsError::Transition(e) => write!(f, "{e}"),
            VerbsError::Attribute(e) => write!(f, "{e}"),
            VerbsError::LocalProtection { lkey } => {
                write!(
                    f,
                    "local buffer is not inside the MR of lkey {lkey:#x} with the needed access"
                )
            }
            VerbsError::SendQueueFull => f.write_str("send queue full"),
            VerbsError::Fragment(e) => write!(f, "{e}"),
            VerbsError::CommandTimeout { op } => write!(f, "the card did not answer {op}"),
            VerbsError::CommandFailed { op } => write!(f, "the card failed {op}"),
            VerbsError::Descriptor(e) => write!(f, "{e}"),
            VerbsError::Platform(e) => write!(f, "{e}"),
            VerbsError::RingRegister(e) => write!(f, "{e}"),
            VerbsError::Unsupported { what } => write!(f, "not supported: {what}"),
        }
    }
}

impl From<PlatformError> for VerbsError {
    fn from(e: PlatformError) -> Self {
        VerbsError::Platform(e)
    }
}

impl From<NotAPointer> for VerbsError {
    fn from(e: NotAPointer) -> Self {
        VerbsError::RingRegister(e)
    }
}

impl From<DescError> for VerbsError {
    fn from(e: DescError) -> Self {
        VerbsError::Descriptor(e)
    }
}

impl From<QpTransitionError> for VerbsError {
    fn from(e: QpTransitionError) -> Self {
        VerbsError::Transition(e)
    }
}

impl From<QpAttrError> for VerbsError {
    fn from(e: QpAttrError) -> Self {
        VerbsError::Attribute(e)
    }
}

impl From<FragmentError> for VerbsError {
    fn from(e: FragmentError) -> Self {
        VerbsError::Fragment(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qp::Gid;
    use std::string::ToString;

    #[test]
    fn errors_read_as_sentences_not_debug_dumps() {
        let e = VerbsError::Attribute(QpAttrError::GidNotIpv4Mapped(Gid([0; 16])));
        assert_eq!(
            e.to_string(),
            "destination GID 0:0:0:0:0:0:0:0 is not IPv4-mapped (::ffff:a.b.c.d)"
        );
        let f = VerbsError::Fragment(FragmentError::TooManyPackets { packets: 1 << 23 });
        assert!(!f.to_string().contains("TooManyPackets"), "{f}");
    }
}
