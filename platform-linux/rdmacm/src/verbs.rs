//! The verbs this library calls, through libibverbs' C ABI as the real librdmacm does (at
//! run time that is the blue-rdma stand-in), the device table, and the QP attributes of
//! each connection step.
//!
//! A device's address is the IPv4 address in its GID 0 (`::ffff:<ip>`, RoCE v2). Each
//! device is opened once per process and stays open; its protection domain (`id->pd` of
//! every id on it) is allocated on first use.

use core::ffi::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};

use crate::abi::*;

extern "C" {
    fn ibv_get_device_list(num: *mut c_int) -> *mut *mut c_void;
    fn ibv_get_device_name(dev: *mut c_void) -> *const c_char;
    fn ibv_open_device(dev: *mut c_void) -> *mut c_void;
    fn ibv_query_device(ctx: *mut c_void, attr: *mut IbvDeviceAttr) -> c_int;
    fn ibv_query_port(ctx: *mut c_void, port: u8, attr: *mut IbvPortAttr) -> c_int;
    fn ibv_query_gid(ctx: *mut c_void, port: u8, index: c_int, gid: *mut [u8; 16]) -> c_int;
    fn ibv_alloc_pd(ctx: *mut c_void) -> *mut c_void;
    pub(crate) fn ibv_create_comp_channel(ctx: *mut c_void) -> *mut c_void;
    pub(crate) fn ibv_destroy_comp_channel(ch: *mut c_void) -> c_int;
    pub(crate) fn ibv_create_cq(
        ctx: *mut c_void,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int,
    ) -> *mut c_void;
    pub(crate) fn ibv_destroy_cq(cq: *mut c_void) -> c_int;
    pub(crate) fn ibv_create_qp(pd: *mut c_void, attr: *mut IbvQpInitAttr) -> *mut IbvQp;
    pub(crate) fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int;
    pub(crate) fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int;
    pub(crate) fn ibv_create_srq(pd: *mut c_void, attr: *mut IbvSrqInitAttr) -> *mut c_void;
    pub(crate) fn ibv_destroy_srq(srq: *mut c_void) -> c_int;
}

/// One opened device.
pub(crate) struct Device {
    /// `struct ibv_context *`, opened for the life of the process.
    ctx: usize,
    pub(crate) name: String,
    pub(crate) ip: Ipv4Addr,
    /// `enum ibv_mtu` of port 1.
    pub(crate) mtu: u8,
    pub(crate) max_responder: u8,
    pub(crate) max_initiator: u8,
    pd: Mutex<usize>,
}

impl Device {
    pub(crate) fn ctx(&self) -> *mut c_void {
        self.ctx as *mut c_void
    }

    /// The device's protection domain, allocated on first use (this starts the device's
    /// emulated card), or the errno of `ibv_alloc_pd`.
    pub(crate) fn pd(&self) -> Result<*mut c_void, c_int> {
        let mut pd = self.pd.lock().unwrap_or_else(|e| e.into_inner());
        if *pd == 0 {
            // SAFETY: an open context.
            *pd = unsafe { ibv_alloc_pd(self.ctx()) } as usize;
            if *pd == 0 {
                // SAFETY: errno of this thread, set by libibverbs.
                let e = match unsafe { *libc::__errno_location() } {
                    0 => libc::ENODEV,
                    e => e,
                };
                log::error!(
                    "{} ({}): ibv_alloc_pd failed (errno {e}); is another process using the device?",
                    self.name,
                    self.ip
                );
                return Err(e);
            }
        }
        Ok(*pd as *mut c_void)
    }
}

/// `::ffff:<ip>`.
pub(crate) fn mapped_gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The devices libibverbs lists whose GID 0 is an IPv4-mapped address, opened once.
pub(crate) fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(open_all)
}

fn open_all() -> Vec<Device> {
    let mut n: c_int = 0;
    // SAFETY: `n` is writable; the list stays allocated (the contexts keep using it).
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        log::error!(
            "ibv_get_device_list found no RDMA device: is the blue-rdma libibverbs.so.1 first \
             on LD_LIBRARY_PATH (target/ibverbs)?"
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` entries.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a listed device; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a listed device.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            log::warn!("ibv_open_device({name}) failed; skipping it");
            continue;
        }
        let mut gid = [0u8; 16];
        // SAFETY: an open context and a 16-byte GID.
        let ok = unsafe { ibv_query_gid(ctx, 1, 0, &mut gid) } == 0;
        let ip = Ipv4Addr::from([gid[12], gid[13], gid[14], gid[15]]);
        if !ok || gid[..12] != mapped_gid(Ipv4Addr::UNSPECIFIED)[..12] {
            log::warn!("{name}: GID 0 is not an IPv4-mapped address; the CM skips it");
            continue;
        }
        let mut port = IbvPortAttr::default();
        // SAFETY: an open context; `port` is a whole ibv_port_attr.
        let mtu = match unsafe { ibv_query_port(ctx, 1, &mut port) } {
            0 if (1..=5).contains(&port.active_mtu) => port.active_mtu as u8,
            _ => IBV_MTU_4096 as u8,
        };
        // SAFETY: all-zero is a valid ibv_device_attr; the verb fills it.
        let mut attr: IbvDeviceAttr = unsafe { core::mem::zeroed() };
        // SAFETY: an open context; `attr` is a whole ibv_device_attr.
        let (max_responder, max_initiator) = match unsafe { ibv_query_device(ctx, &mut attr) } {
            0 => (
                attr.max_qp_rd_atom.clamp(0, 255) as u8,
                attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            ),
            _ => (16, 16),
        };
        log::debug!("device {name}: {ip}, MTU enum {mtu}");
        out.push(Device {
            ctx: ctx as usize,
            name,
            ip,
            mtu,
            max_responder,
            max_initiator,
            pd: Mutex::new(0),
        });
    }
    if out.is_empty() {
        log::error!(
            "no RDMA device with an IPv4 GID: is the blue-rdma libibverbs.so.1 first on \
             LD_LIBRARY_PATH (target/ibverbs)?"
        );
    }
    out
}

/// The index of the device at `ip`.
pub(crate) fn device_at(ip: Ipv4Addr) -> Option<usize> {
    devices().iter().position(|d| d.ip == ip)
}

/// The local device for a connection to `dst` from a source the application did not name:
/// the device at the address the kernel's route to `dst` starts from. When `dst` is itself
/// one of our devices (a loopback route), another device is chosen when there is one: one
/// device serves one process at a time, so the peer at `dst` is another process. Without a
/// device on the route, the first device that can reach `dst` (loopback devices reach
/// 127.0.0.0/8 only); None when there is none.
pub(crate) fn route_device(dst: Ipv4Addr) -> Option<usize> {
    let devs = devices();
    let src = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect((dst, 9)).map(|()| s))
        .and_then(|s| s.local_addr())
        .ok()
        .and_then(|a| match a.ip() {
            std::net::IpAddr::V4(v4) => Some(v4),
            std::net::IpAddr::V6(_) => None,
        });
    // A loopback device reaches loopback peers only, a device on a network the network.
    let reaches = |d: &Device| d.ip.is_loopback() == dst.is_loopback();
    let other = || devs.iter().position(|d| d.ip != dst && reaches(d));
    match src.and_then(device_at) {
        Some(i) if devs[i].ip != dst => Some(i),
        Some(i) => other().or(Some(i)),
        None => other().or_else(|| devs.iter().position(reaches)),
    }
}

/// What the QP transitions of one connection need, copied from the id's state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpPlan {
    pub(crate) ud: bool,
    pub(crate) peer_ip: Option<Ipv4Addr>,
    pub(crate) peer_qpn: u32,
    pub(crate) peer_psn: u32,
    pub(crate) psn: u32,
    pub(crate) mtu: u8,
    /// `max_dest_rd_atomic`.
    pub(crate) responder_resources: u8,
    /// `max_rd_atomic`.
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) timeout: u8,
    pub(crate) tos: u8,
}

/// The minimum RNR NAK timer the CM gives a QP (12: 0.64 ms).
const MIN_RNR_TIMER: u8 = 12;
/// The local ACK timeout when the application sets none (14: 67 ms).
pub(crate) const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// The attributes and mask that move a QP to `state` (INIT, RTR or RTS), as
/// `rdma_init_qp_attr` reports them; RTR and RTS of a connected QP need the peer.
pub(crate) fn qp_attr(plan: &QpPlan, state: u32) -> Result<(IbvQpAttr, c_int), c_int> {
    let mut a = IbvQpAttr {
        qp_state: state,
        ..IbvQpAttr::default()
    };
    let m = match (state, plan.ud) {
        (IBV_QPS_INIT, ud) => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY
            } else {
                a.qp_access_flags =
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS
            }
        }
        (IBV_QPS_RTR, true) => mask::STATE,
        (IBV_QPS_RTS, true) => {
            a.sq_psn = plan.psn;
            mask::STATE | mask::SQ_PSN
        }
        (IBV_QPS_RTR, false) => {
            let peer = plan.peer_ip.ok_or(libc::EINVAL)?;
            a.path_mtu = plan.mtu as u32;
            a.dest_qp_num = plan.peer_qpn;
            a.rq_psn = plan.peer_psn;
            a.max_dest_rd_atomic = plan.responder_resources;
            a.min_rnr_timer = MIN_RNR_TIMER;
            a.ah_attr = ah_to(peer, plan.tos);
            mask::STATE
                | mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER
        }
        (IBV_QPS_RTS, false) => {
            plan.peer_ip.ok_or(libc::EINVAL)?;
            a.sq_psn = plan.psn;
            a.timeout = plan.timeout;
            a.retry_cnt = plan.retry_count.min(7);
            a.rnr_retry = plan.rnr_retry.min(7);
            a.max_rd_atomic = plan.initiator_depth;
            mask::STATE
                | mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::SQ_PSN
                | mask::MAX_QP_RD_ATOMIC
        }
        (IBV_QPS_ERR, _) => mask::STATE,
        _ => return Err(libc::EINVAL),
    };
    Ok((a, m))
}

/// The address vector of a peer device: RoCE v2, GID index 0 on both ends.
pub(crate) fn ah_to(peer: Ipv4Addr, tos: u8) -> IbvAhAttr {
    IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: mapped_gid(peer),
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: tos,
            _pad: 0,
        },
        is_global: 1,
        port_num: 1,
        ..IbvAhAttr::default()
    }
}

/// Moves `qp` through `states` in order; the first failure's errno.
///
/// # Safety
/// `qp` is a live QP.
pub(crate) unsafe fn transition(
    qp: *mut IbvQp,
    plan: &QpPlan,
    states: &[u32],
) -> Result<(), c_int> {
    for &s in states {
        let (mut a, m) = qp_attr(plan, s)?;
        // SAFETY: the caller's QP; `a` lives across the call.
        let rc = unsafe { ibv_modify_qp(qp, &mut a, m) };
        if rc != 0 {
            log::error!("ibv_modify_qp to state {s} failed: errno {rc}");
            return Err(rc);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_steps_need_the_peer_and_carry_the_exchanged_numbers() {
        let mut plan = QpPlan {
            peer_qpn: 0x17,
            peer_psn: 0xABCDE,
            psn: 0x12345,
            mtu: 5,
            retry_count: 9,
            rnr_retry: 7,
            timeout: 14,
            ..QpPlan::default()
        };
        assert_eq!(qp_attr(&plan, IBV_QPS_RTR).err(), Some(libc::EINVAL));
        plan.peer_ip = Some(Ipv4Addr::new(127, 0, 0, 1));
        let (rtr, m) = qp_attr(&plan, IBV_QPS_RTR).unwrap();
        assert_eq!(
            (rtr.dest_qp_num, rtr.rq_psn, rtr.path_mtu),
            (0x17, 0xABCDE, 5)
        );
        assert_eq!(rtr.ah_attr.grh.dgid[10..], [0xff, 0xff, 127, 0, 0, 1]);
        assert_eq!(rtr.ah_attr.is_global, 1);
        assert!(m & mask::AV != 0 && m & mask::DEST_QPN != 0);
        let (rts, _) = qp_attr(&plan, IBV_QPS_RTS).unwrap();
        assert_eq!((rts.sq_psn, rts.retry_cnt, rts.rnr_retry), (0x12345, 7, 7));
        plan.ud = true;
        let (init, m) = qp_attr(&plan, IBV_QPS_INIT).unwrap();
        assert_eq!((init.qkey, m & mask::QKEY), (RDMA_UDP_QKEY, mask::QKEY));
    }
}
