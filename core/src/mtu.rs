//! The path MTU as the card encodes it: the `ibv_mtu` enum, 1 = 256 B .. 5 = 4096 B.

/// A path MTU the card supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Pmtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes (the reference driver's fixed choice).
    #[default]
    Mtu4096 = 5,
}

impl Pmtu {
    /// Decodes the `ibv_mtu` value; `None` outside 1..=5.
    pub const fn from_ibv(v: u8) -> Option<Self> {
        match v {
            1 => Some(Pmtu::Mtu256),
            2 => Some(Pmtu::Mtu512),
            3 => Some(Pmtu::Mtu1024),
            4 => Some(Pmtu::Mtu2048),
            5 => Some(Pmtu::Mtu4096),
            _ => None,
        }
    }
    /// The `ibv_mtu` value (what descriptors carry in their 3-bit pmtu field).
    pub const fn to_ibv(self) -> u8 {
        self as u8
    }
    /// log2 of the MTU in bytes (`ibv_mtu + 7`).
    pub const fn shift(self) -> u32 {
        self as u32 + 7
    }
    /// The MTU in bytes.
    pub const fn bytes(self) -> u32 {
        1 << self.shift()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibv_values_map_to_sizes() {
        assert_eq!(Pmtu::from_ibv(1).unwrap().bytes(), 256);
        assert_eq!(Pmtu::from_ibv(5).unwrap().bytes(), 4096);
        assert_eq!(Pmtu::from_ibv(0), None);
        assert_eq!(Pmtu::from_ibv(6), None);
        assert_eq!(Pmtu::Mtu1024.to_ibv(), 3);
    }
}
