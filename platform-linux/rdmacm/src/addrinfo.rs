//! The endpoint helpers: `rdma_getaddrinfo`/`rdma_freeaddrinfo`, `rdma_create_ep`/
//! `rdma_destroy_ep` and `rdma_get_request` (rdma_server and rdma_client use nothing else).
//!
//! `rdma_getaddrinfo` resolves IPv4 names and services with the system resolver; a passive
//! request gives the source address (the wildcard without a node), an active one the
//! destination (and the hints' source, if any). Endpoints are synchronous ids.

use core::ffi::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::abi::*;
use crate::api::{self, complete};
use crate::err;
use crate::state::{self, Id};

fn sockaddr_in(a: SocketAddrV4) -> Box<libc::sockaddr_in> {
    Box::new(libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    })
}

/// The system resolver's IPv4 address and port for `node`/`service` (either may be NULL),
/// or its `EAI_*` code.
///
/// # Safety
/// Both are NULL or NUL-terminated strings.
unsafe fn lookup(
    node: *const c_char,
    service: *const c_char,
    numeric: bool,
    passive: bool,
) -> Result<SocketAddrV4, c_int> {
    if node.is_null() && service.is_null() {
        return Err(libc::EAI_NONAME);
    }
    // SAFETY: all-zero is valid addrinfo hints.
    let mut hints: libc::addrinfo = unsafe { core::mem::zeroed() };
    hints.ai_family = libc::AF_INET;
    hints.ai_socktype = libc::SOCK_STREAM;
    hints.ai_flags =
        if numeric { libc::AI_NUMERICHOST } else { 0 } | if passive { libc::AI_PASSIVE } else { 0 };
    let mut res: *mut libc::addrinfo = core::ptr::null_mut();
    // SAFETY: per the contract; `res` receives a list freed below.
    let rc = unsafe { libc::getaddrinfo(node, service, &hints, &mut res) };
    if rc != 0 {
        return Err(rc);
    }
    // SAFETY: a successful getaddrinfo returns at least one AF_INET entry.
    let a = unsafe {
        let sin = &*((*res).ai_addr as *const libc::sockaddr_in);
        let a = SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        );
        libc::freeaddrinfo(res);
        a
    };
    Ok(a)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    crate::init_log();
    if res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the application's hints, or NULL.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    if let Some(f) = h
        .map(|h| h.ai_family)
        .filter(|&f| f != 0 && f != libc::AF_INET && f != libc::AF_INET6)
    {
        log::error!("rdma_getaddrinfo: address family {f} is not supported (IPv4 only)");
        return libc::EAI_FAMILY;
    }
    // SAFETY: the application's strings.
    let addr = match unsafe { lookup(node, service, flags & RAI_NUMERICHOST != 0, passive) } {
        Ok(a) => a,
        Err(e) => {
            let name = |p: *const c_char| {
                if p.is_null() {
                    "-".into()
                } else {
                    // SAFETY: the application's NUL-terminated string.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            };
            log::info!(
                "rdma_getaddrinfo({}, {}): resolver error {e}",
                name(node),
                name(service)
            );
            return e;
        }
    };
    let ps = h.map_or(0, |h| h.ai_port_space);
    let qp_type = match (h.map_or(0, |h| h.ai_qp_type), ps as u32) {
        (0, RDMA_PS_UDP | RDMA_PS_IPOIB) => IBV_QPT_UD as c_int,
        (0, _) => IBV_QPT_RC as c_int,
        (t, _) => t,
    };
    let ps = match ps {
        0 if qp_type == IBV_QPT_UD as c_int => RDMA_PS_UDP as c_int,
        0 => RDMA_PS_TCP as c_int,
        p => p,
    };
    // SAFETY: the hints' source address, when it names one.
    let hint_src = h
        .filter(|h| h.ai_src_len > 0 && !h.ai_src_addr.is_null())
        .and_then(|h| unsafe { api::sockaddr_v4(h.ai_src_addr) }.ok());
    let (src, dst) = match passive {
        true => (Some(addr), None),
        false => (hint_src.map(|s| SocketAddrV4::new(*s.ip(), 0)), Some(addr)),
    };
    let len = core::mem::size_of::<libc::sockaddr_in>() as u32;
    let out = Box::new(RdmaAddrinfo {
        ai_flags: flags,
        ai_family: libc::AF_INET,
        ai_qp_type: qp_type,
        ai_port_space: ps,
        ai_src_len: if src.is_some() { len } else { 0 },
        ai_dst_len: if dst.is_some() { len } else { 0 },
        ai_src_addr: src.map_or(core::ptr::null_mut(), |a| {
            Box::into_raw(sockaddr_in(a)) as *mut libc::sockaddr
        }),
        ai_dst_addr: dst.map_or(core::ptr::null_mut(), |a| {
            Box::into_raw(sockaddr_in(a)) as *mut libc::sockaddr
        }),
        ai_src_canonname: core::ptr::null_mut(),
        ai_dst_canonname: core::ptr::null_mut(),
        ai_route_len: 0,
        ai_route: core::ptr::null_mut(),
        ai_connect_len: 0,
        ai_connect: core::ptr::null_mut(),
        ai_next: core::ptr::null_mut(),
    });
    // SAFETY: `res` is writable.
    unsafe { *res = Box::into_raw(out) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list from rdma_getaddrinfo; each part is freed once.
        unsafe {
            let b = Box::from_raw(p);
            for a in [b.ai_src_addr, b.ai_dst_addr] {
                if !a.is_null() {
                    drop(Box::from_raw(a as *mut libc::sockaddr_in));
                }
            }
            p = b.ai_next;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_ep(
    id: *mut *mut RdmaCmId,
    res: *mut RdmaAddrinfo,
    pd: *mut c_void,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the application's addrinfo.
    let (Some(r), false) = (unsafe { res.as_ref() }, id.is_null()) else {
        return err(libc::EINVAL);
    };
    let mut cid: *mut RdmaCmId = core::ptr::null_mut();
    // SAFETY: a NULL channel makes a synchronous id.
    if unsafe {
        api::cm_rdma_create_id(
            core::ptr::null_mut(),
            &mut cid,
            core::ptr::null_mut(),
            r.ai_port_space as u32,
        )
    } != 0
    {
        return -1;
    }
    let fail = |cid: *mut RdmaCmId| {
        // SAFETY: errno of this thread, kept across the cleanup.
        let e = unsafe { *libc::__errno_location() };
        // SAFETY: the id made above.
        unsafe { api::cm_rdma_destroy_id(cid) };
        err(e)
    };
    if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: the id made above and the application's address.
        if unsafe { api::cm_rdma_bind_addr(cid, r.ai_src_addr) } != 0 {
            return fail(cid);
        }
        // SAFETY: the application's attributes, or NULL.
        if let Some(a) = unsafe { qp_init_attr.as_ref() } {
            // SAFETY: reads the token of the id made above.
            let token = unsafe { (*(cid as *mut Id)).token };
            if let Some(e) = state::lock().ids.get_mut(&token) {
                e.ep_qp = Some((*a, pd as usize));
            }
        }
    } else {
        // SAFETY: the id made above; the addresses are the application's.
        let resolved = unsafe {
            api::cm_rdma_resolve_addr(cid, r.ai_src_addr, r.ai_dst_addr, 2000) == 0
                && api::cm_rdma_resolve_route(cid, 2000) == 0
        };
        if !resolved {
            return fail(cid);
        }
        if !qp_init_attr.is_null() {
            // SAFETY: as above.
            if unsafe { crate::qp::cm_rdma_create_qp(cid, pd, qp_init_attr) } != 0 {
                return fail(cid);
            }
        }
    }
    // SAFETY: `id` is writable.
    unsafe { *id = cid };
    0
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_destroy_ep(id: *mut RdmaCmId) {
    if api::live(id).is_err() {
        return;
    }
    // SAFETY: an endpoint from rdma_create_ep or rdma_get_request.
    unsafe {
        if !(*id).qp.is_null() {
            crate::qp::cm_rdma_destroy_qp(id);
        }
        if !(*id).srq.is_null() {
            crate::qp::cm_rdma_destroy_srq(id);
        }
        api::cm_rdma_destroy_id(id);
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_get_request(
    listen: *mut RdmaCmId,
    id: *mut *mut RdmaCmId,
) -> c_int {
    let (Ok(token), false) = (api::live(listen), id.is_null()) else {
        return err(libc::EINVAL);
    };
    let ep_qp = match state::lock().ids.get(&token) {
        Some(e) if e.own.is_some() => e.ep_qp,
        _ => return err(libc::EINVAL),
    };
    // SAFETY: a live synchronous id: waits for its next event.
    if unsafe { complete(listen) } != 0 {
        return -1;
    }
    // SAFETY: complete() kept the event in listen->event.
    let ev = unsafe { (*listen).event };
    // SAFETY: as above.
    if unsafe { (*ev).event } != RDMA_CM_EVENT_CONNECT_REQUEST {
        return err(libc::EINVAL);
    }
    // SAFETY: the event moves from the listener to the new id, which acknowledges it.
    let child = unsafe {
        (*listen).event = core::ptr::null_mut();
        let child = (*ev).id;
        (*child).event = ev;
        child
    };
    if let Some((mut attr, pd)) = ep_qp {
        // SAFETY: the new id and a copy of the endpoint's attributes.
        if unsafe { crate::qp::cm_rdma_create_qp(child, pd as *mut c_void, &mut attr) } != 0 {
            // SAFETY: errno of this thread; the new id is rejected with the failure.
            let e = unsafe { *libc::__errno_location() };
            // SAFETY: the new id, refused and given up.
            unsafe {
                crate::connect::cm_rdma_reject(child, core::ptr::null(), 0);
                api::cm_rdma_destroy_id(child);
            }
            return err(e);
        }
    }
    // SAFETY: `id` is writable.
    unsafe { *id = child };
    0
}
