//! Where a frame goes: the IPv4 destination in its header.
//!
//! The link routes like the RTL simulator's soft switch (`shared/spec/nic-behaviour.md`
//! section 8.5): by frame bytes 30..33, the IPv4 destination address after a 14-byte Ethernet
//! header (section 1.4). The receiving card applies its own MAC and IP filter (section 2.1),
//! so the link never looks at MAC addresses.

use std::net::Ipv4Addr;

/// EtherType of IPv4 (frame bytes 12..13).
const ETHERTYPE_IPV4: u16 = 0x0800;
/// Frame bytes 30..33 hold the IPv4 destination address.
const DST_IP_OFFSET: usize = 30;

/// Why a frame cannot be routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// The frame is shorter than the 34 bytes that reach the destination address.
    TooShort(usize),
    /// The EtherType (bytes 12..13) is not IPv4; it is given.
    NotIpv4(u16),
}

/// The IPv4 destination of an Ethernet frame (destination MAC first, no FCS).
pub fn frame_dst_ipv4(frame: &[u8]) -> Result<Ipv4Addr, RouteError> {
    let too_short = RouteError::TooShort(frame.len());
    let ethertype = frame.get(12..14).ok_or(too_short)?;
    let ethertype = u16::from_be_bytes([ethertype[0], ethertype[1]]);
    if ethertype != ETHERTYPE_IPV4 {
        return Err(RouteError::NotIpv4(ethertype));
    }
    let dst = frame
        .get(DST_IP_OFFSET..DST_IP_OFFSET + 4)
        .ok_or(too_short)?;
    Ok(Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ethertype: u16, dst: [u8; 4], len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[30..34].copy_from_slice(&dst);
        f
    }

    #[test]
    fn reads_destination_from_bytes_30_to_33() {
        let f = frame(0x0800, [127, 0, 0, 2], 96);
        assert_eq!(frame_dst_ipv4(&f), Ok(Ipv4Addr::new(127, 0, 0, 2)));
    }

    #[test]
    fn rejects_non_ipv4_and_short_frames() {
        assert_eq!(
            frame_dst_ipv4(&frame(0x0806, [127, 0, 0, 2], 60)),
            Err(RouteError::NotIpv4(0x0806))
        );
        let f = frame(0x0800, [127, 0, 0, 2], 34);
        assert_eq!(frame_dst_ipv4(&f[..33]), Err(RouteError::TooShort(33)));
        assert_eq!(frame_dst_ipv4(&f[..10]), Err(RouteError::TooShort(10)));
    }
}
