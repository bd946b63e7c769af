//! The QP type as descriptors carry it: `ibv_qp_type` in a 4-bit field (layout-verification.md
//! 1.2 ManageQp qp_type, 1.3 Seg0 qp_type). The card implements RC only.

/// `ibv_qp_type`, as far as it fits the 4-bit descriptor field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// IBV_QPT_RC (2): the only type the card implements.
    Rc,
    /// IBV_QPT_UC (3).
    Uc,
    /// IBV_QPT_UD (4).
    Ud,
    /// IBV_QPT_RAW_PACKET (8).
    RawPacket,
    /// IBV_QPT_XRC_SEND (9).
    XrcSend,
    /// IBV_QPT_XRC_RECV (10).
    XrcRecv,
    /// Any other value of the field, kept as read.
    Unknown(u8),
}

impl QpType {
    /// From the raw value.
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            8 => QpType::RawPacket,
            9 => QpType::XrcSend,
            10 => QpType::XrcRecv,
            other => QpType::Unknown(other),
        }
    }
    /// The raw value.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
            QpType::RawPacket => 8,
            QpType::XrcSend => 9,
            QpType::XrcRecv => 10,
            QpType::Unknown(raw) => raw,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip() {
        for raw in 0..=255u8 {
            assert_eq!(QpType::from_raw(raw).raw(), raw);
        }
        assert_eq!(QpType::from_raw(2), QpType::Rc);
        assert_eq!(QpType::from_raw(5), QpType::Unknown(5));
    }
}
