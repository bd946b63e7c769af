//! Address vectors (`ibv_ah_attr`): the peer a QP connects to (modify_qp to RTR) or a UD
//! datagram goes to (ibv_create_ah). On this RoCE v2 device a peer is its IPv4-mapped GID
//! in a GRH, and `sgid_index` must name an entry of the GID table.
//!
//! Programs written for the seed driver set up the address vector in two ways a strict
//! RoCE stack refuses, and are accepted by default (each is logged once):
//! - `is_global = 0` with the peer's IPv4-mapped GID in `grh.dgid`: the GID is used;
//! - `IBV_QP_AV` in the RTR -> RTS attribute mask with an all-zero GID: the address vector
//!   is ignored (the QP keeps the peer it was given at RTR).
//!
//! With `BLUERDMA_STRICT_AV=1` both are refused with EINVAL, as rdma-core on RoCE does.

use core::ffi::c_int;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use bluerdma_core::qp::Gid;

use crate::abi::IbvAhAttr;
use crate::caps::{GID_INDEXES, GID_TABLE_LEN};

/// The environment variable that refuses the seed's address-vector habits.
pub(crate) const STRICT_ENV: &str = "BLUERDMA_STRICT_AV";

/// Whether the seed's habits are refused (read at each use: a test may set it).
pub(crate) fn strict() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| !matches!(v.trim(), "" | "0"))
}

/// Logs `what` the first time `seen` is set.
fn once(seen: &AtomicBool, what: &str) {
    if !seen.swap(true, Ordering::Relaxed) {
        log::info!("{what} (logged once; {STRICT_ENV}=1 refuses it)");
    }
}

/// The peer's address an address vector names (for RTR or an AH), under the rules above.
pub(crate) fn peer(a: &IbvAhAttr, verb: &str) -> Result<Ipv4Addr, c_int> {
    static NOT_GLOBAL: AtomicBool = AtomicBool::new(false);
    if a.port_num > 1 {
        log::error!(
            "{verb}: port {} does not exist (the device has port 1)",
            a.port_num
        );
        return Err(libc::EINVAL);
    }
    let gid = Gid(a.grh.dgid);
    if a.is_global == 0 {
        let mapped = gid.to_ipv4().ok().filter(|_| !strict());
        let Some(ip) = mapped else {
            log::error!(
                "{verb}: the address vector has no GRH (is_global = 0): on this RoCE device \
                 the peer is named by its GID (run ibv_rc_pingpong with -g 0)"
            );
            return Err(libc::EINVAL);
        };
        once(
            &NOT_GLOBAL,
            &format!(
                "{verb}: is_global = 0 with the IPv4-mapped GID of {ip} in grh.dgid: using it, \
                 as the seed driver did"
            ),
        );
        return Ok(ip);
    }
    let index = u32::from(a.grh.sgid_index);
    if index >= GID_TABLE_LEN || !GID_INDEXES.contains(&index) {
        log::error!(
            "{verb}: sgid_index {index} is not in the GID table (the device has GIDs at {:?})",
            GID_INDEXES
        );
        return Err(libc::EINVAL);
    }
    gid.to_ipv4().map_err(|e| {
        log::error!("{verb}: {e}");
        libc::EINVAL
    })
}

/// Whether the address vector of a modify_qp that is not the move to RTR may be left out:
/// the seed's all-zero one on RTR -> RTS is (unless strict), anything else is the engine's
/// to judge.
pub(crate) fn ignorable_after_rtr(a: &IbvAhAttr, verb: &str) -> bool {
    static ZERO_AV: AtomicBool = AtomicBool::new(false);
    if a.grh.dgid != [0; 16] || strict() {
        return false;
    }
    once(
        &ZERO_AV,
        &format!(
            "{verb}: IBV_QP_AV with an all-zero GID after RTR: ignored, as the seed driver did"
        ),
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn av(is_global: u8, dgid: [u8; 16], sgid_index: u8) -> IbvAhAttr {
        let mut a = IbvAhAttr {
            is_global,
            port_num: 1,
            ..IbvAhAttr::default()
        };
        a.grh.dgid = dgid;
        a.grh.sgid_index = sgid_index;
        a
    }

    #[test]
    fn the_seed_habits_are_accepted_and_a_bad_gid_index_is_not() {
        let mapped = Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 2)).0;
        assert_eq!(
            peer(&av(1, mapped, 0), "t"),
            Ok(Ipv4Addr::new(127, 0, 0, 2))
        );
        assert_eq!(
            peer(&av(0, mapped, 9), "t"),
            Ok(Ipv4Addr::new(127, 0, 0, 2))
        );
        assert_eq!(peer(&av(0, [0; 16], 0), "t"), Err(libc::EINVAL));
        assert_eq!(
            peer(&av(1, mapped, 1), "t"),
            Err(libc::EINVAL),
            "index 1 is empty"
        );
        assert_eq!(
            peer(&av(1, mapped, 3), "t"),
            Ok(Ipv4Addr::new(127, 0, 0, 2))
        );
        assert_eq!(peer(&av(1, [0xfe; 16], 0), "t"), Err(libc::EINVAL));
        assert!(ignorable_after_rtr(&av(0, [0; 16], 0), "t"));
        assert!(!ignorable_after_rtr(&av(1, mapped, 0), "t"));
    }
}
