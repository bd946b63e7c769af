//! The id calls of librdmacm: create and destroy, bind, address and route resolution,
//! listen, connect, accept, reject, disconnect, migrate, options, and what
//! `rdma_get_cm_event` does to an event before the application sees it ([`deliver`]).
//!
//! Address resolution is immediate (ADDR_RESOLVED and ROUTE_RESOLVED are queued by the
//! call): the local device is the one at the bound source address, else the one the route
//! to the destination leaves from ([`crate::verbs::route_device`]). Ids made with a NULL
//! channel are synchronous: each call waits for its event, as with the real library.

use core::ffi::{c_char, c_int, c_void};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use crate::abi::*;
use crate::channel::{EventBox, Post};
use crate::err;
use crate::state::{self, Id, IdEntry, IdPtr, OwnChannel, St, Token};
use crate::verbs::{self, devices};
use crate::wire::Params;

/// A new, unpublished id.
pub(crate) fn new_id(
    token: Token,
    channel: *mut RdmaEventChannel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> *mut Id {
    // SAFETY: all-zero is a valid RdmaCmId (NULL pointers, zero numbers).
    let mut c: RdmaCmId = unsafe { core::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = qp_type;
    let b = Box::into_raw(Box::new(Id {
        c,
        token,
        path: IbvSaPathRec::default(),
        own_cqs: false,
    }));
    // SAFETY: `b` was just allocated; the route points at its own path record.
    unsafe { (*b).c.route.path_rec = &mut (*b).path };
    b
}

/// Frees an id the state forgot, with its own channel and an unacknowledged sync event.
pub(crate) fn free_id(e: IdEntry) {
    // SAFETY: the entry was the last record of the id; the application gave it up.
    unsafe {
        let id = e.cid.0;
        drop(crate::channel::take_back((*id).c.event));
        drop(Box::from_raw(id));
        if let Some(OwnChannel(ch)) = e.own {
            drop(Box::from_raw(ch));
        }
    }
}

fn write_sockaddr(dst: &mut SockaddrStorage, a: SocketAddrV4) {
    *dst = SockaddrStorage::default();
    dst.0[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    dst.0[2..4].copy_from_slice(&a.port().to_be_bytes());
    dst.0[4..8].copy_from_slice(&a.ip().octets());
}

/// Fills the id's device, addresses, GIDs and path record.
pub(crate) fn set_route(
    id: &mut Id,
    device: Option<usize>,
    local: SocketAddrV4,
    remote: Option<SocketAddrV4>,
) {
    let dev = device.map(|d| &devices()[d]);
    id.c.verbs = dev.map_or(core::ptr::null_mut(), |d| d.ctx());
    id.c.port_num = if dev.is_some() { 1 } else { 0 };
    write_sockaddr(&mut id.c.route.addr.src, local);
    id.c.route.addr.ib.sgid = verbs::mapped_gid(*local.ip());
    id.c.route.addr.ib.pkey = 0xFFFFu16.to_be();
    if let Some(r) = remote {
        write_sockaddr(&mut id.c.route.addr.dst, r);
        id.c.route.addr.ib.dgid = verbs::mapped_gid(*r.ip());
        id.path = IbvSaPathRec {
            dgid: verbs::mapped_gid(*r.ip()),
            sgid: verbs::mapped_gid(*local.ip()),
            hop_limit: 64,
            reversible: 1,
            numb_path: 1,
            pkey: 0xFFFFu16.to_be(),
            mtu_selector: 2,
            mtu: dev.map_or(IBV_MTU_4096 as u8, |d| d.mtu),
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: 18,
            ..IbvSaPathRec::default()
        };
        id.c.route.num_paths = 1;
    }
}

/// The token of an application's id; None for a pointer that is no live id of this library
/// (it is never followed).
pub(crate) fn token_of(id: *mut RdmaCmId) -> Option<Token> {
    state::lock().addrs.get(&(id as usize)).copied()
}

/// [`token_of`], or EINVAL with a log line.
pub(crate) fn live(id: *mut RdmaCmId) -> Result<Token, c_int> {
    token_of(id).ok_or_else(|| {
        log::error!("{id:p} is not an rdma_cm_id of this library (destroyed?)");
        libc::EINVAL
    })
}

/// An IPv4 socket address from a `struct sockaddr` (IPv4, IPv4-mapped IPv6 or `::`).
///
/// # Safety
/// `p` is NULL or points to a socket address of its family's size.
pub(crate) unsafe fn sockaddr_v4(p: *const libc::sockaddr) -> Result<SocketAddrV4, c_int> {
    // SAFETY: per the contract.
    let Some(sa) = (unsafe { p.as_ref() }) else {
        return Err(libc::EINVAL);
    };
    match sa.sa_family as c_int {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(p as *const libc::sockaddr_in) };
            Ok(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*(p as *const libc::sockaddr_in6) };
            let ip6 = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            match (ip6.to_ipv4_mapped(), ip6.is_unspecified()) {
                (Some(v4), _) => Ok(SocketAddrV4::new(v4, port)),
                (None, true) => Ok(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
                _ => Err(libc::EAFNOSUPPORT),
            }
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// In synchronous mode, waits for the id's next event and keeps it in `id->event` (the
/// previous one is acknowledged); -1 with errno from a failed event.
///
/// # Safety
/// `id` is a live id.
pub(crate) unsafe fn complete(id: *mut RdmaCmId) -> c_int {
    // SAFETY: per the contract.
    let cid = unsafe { &mut *(id as *mut Id) };
    let inner = {
        let cm = state::lock();
        match cm.ids.get(&cid.token) {
            Some(e) if e.own.is_some() => Arc::clone(&e.channel),
            _ => return 0,
        }
    };
    ack_sync_event(cid);
    let mut ev = match inner.pop() {
        Ok(ev) => ev,
        Err(e) => return err(e),
    };
    deliver(&mut ev);
    let (event, status) = (ev.ev.event, ev.ev.status);
    cid.c.event = crate::channel::hand_out(ev);
    match status {
        0 => 0,
        _ if event == RDMA_CM_EVENT_REJECTED => err(libc::ECONNREFUSED),
        s if s < 0 => err(-s),
        _ => err(libc::ECONNREFUSED),
    }
}

/// Acknowledges the event a synchronous call kept in `id->event`.
pub(crate) fn ack_sync_event(cid: &mut Id) {
    if !cid.c.event.is_null() {
        // Made by complete() or moved by rdma_get_request, owned by the id.
        drop(crate::channel::take_back(cid.c.event));
        cid.c.event = core::ptr::null_mut();
    }
}

/// What `rdma_get_cm_event` does before handing out `ev`.
pub(crate) fn deliver(ev: &mut EventBox) {
    match ev.post {
        Post::None => {}
        Post::ConnectRequest => {
            let (child, listen) = (ev.ev.id as *mut Id, ev.ev.listen_id);
            let device = state::lock().ids.get(&ev.token).and_then(|e| e.device);
            // SAFETY: the new id is not yet the application's; the listener is live (its
            // destruction removes this event).
            unsafe {
                (*child).c.context = (*listen).context;
                if let Some(d) = device {
                    (*child).c.pd = devices()[d].pd().unwrap_or(core::ptr::null_mut());
                }
            }
        }
        Post::ConnectResponse => crate::qp::connect_response(ev),
    }
}

pub(crate) fn with_entry<R>(
    id: *mut RdmaCmId,
    f: impl FnOnce(&mut state::Cm, Token) -> Result<R, c_int>,
) -> Result<R, c_int> {
    let mut cm = state::lock();
    let Some(&token) = cm.addrs.get(&(id as usize)) else {
        log::error!("{id:p} is not an rdma_cm_id of this library (destroyed?)");
        return Err(libc::EINVAL);
    };
    f(&mut cm, token)
}

pub(crate) fn ret(r: Result<c_int, c_int>) -> c_int {
    r.unwrap_or_else(err)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_id(
    channel: *mut RdmaEventChannel,
    id: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    crate::init_log();
    if id.is_null() || ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IPOIB, RDMA_PS_IB].contains(&ps) {
        return err(libc::EINVAL);
    }
    let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    // SAFETY: an application channel from rdma_create_event_channel, or NULL.
    let (inner, channel_c, own) = match unsafe { crate::channel::attach(channel) } {
        Ok(c) => c,
        Err(e) => return err(e),
    };
    let mut cm = state::lock();
    let token = cm.token();
    let psn = (cm.random() & 0xFF_FFFF) as u32;
    let cid = new_id(token, channel_c, context, ps, qp_type);
    cm.addrs.insert(cid as usize, token);
    cm.ids.insert(
        token,
        IdEntry {
            cid: IdPtr(cid),
            channel: inner,
            channel_c,
            own,
            ps,
            ud: qp_type == IBV_QPT_UD,
            passive: false,
            device: None,
            local: None,
            remote: None,
            state: St::Idle,
            conn: None,
            psn,
            mine: Params::default(),
            peer: None,
            peer_gone: None,
            disconnect_reported: false,
            tos: 0,
            ack_timeout: verbs::DEFAULT_ACK_TIMEOUT,
            listening: Vec::new(),
            ep_qp: None,
        },
    );
    // SAFETY: `id` is writable.
    unsafe { *id = cid as *mut RdmaCmId };
    0
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    let Ok(token) = live(id) else {
        return err(libc::EINVAL);
    };
    let entry = state::lock().forget(token);
    crate::reactor::wake();
    match entry {
        Some(e) => {
            // The synchronous-mode event the id keeps goes with it; others are the
            // application's, and another thread may still be handling one.
            // SAFETY: the id is live until free_id, and no other call uses it now.
            ack_sync_event(unsafe { &mut *e.cid.0 });
            let left = crate::channel::wait_acknowledged(token, ACK_WAIT);
            if left > 0 {
                log::warn!(
                    "rdma_destroy_id: {left} event(s) of this id not acknowledged (rdma_ack_cm_event each before rdma_destroy_id); the id is freed, their event->id dangles"
                );
            }
            free_id(e);
            0
        }
        None => err(libc::EINVAL),
    }
}

/// How long `rdma_destroy_id` waits for another thread to acknowledge the id's events
/// (rdma-core's waits for ever).
const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves the device of a source address: None for the wildcard, ENODEV for an address
/// that is not one of ours.
fn device_of(ip: Ipv4Addr) -> Result<Option<usize>, c_int> {
    if ip.is_unspecified() {
        return Ok(None);
    }
    verbs::device_at(ip).map(Some).ok_or_else(|| {
        let list: Vec<String> = devices()
            .iter()
            .map(|d| format!("{} {}", d.name, d.ip))
            .collect();
        log::error!(
            "{ip} is not the address of an RDMA device (devices: {})",
            list.join(", ")
        );
        libc::ENODEV
    })
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_bind_addr(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the application's address.
    let sa = match unsafe { sockaddr_v4(addr) } {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let device = match device_of(*sa.ip()) {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    let pd = match device.map(|d| devices()[d].pd()).transpose() {
        Ok(pd) => pd.unwrap_or(core::ptr::null_mut()),
        Err(e) => return err(e),
    };
    let r = with_entry(id, |cm, t| {
        let (ps, state) = (cm.ids[&t].ps, cm.ids[&t].state);
        if state != St::Idle {
            return Err(libc::EINVAL);
        }
        let port = match sa.port() {
            0 => cm.ephemeral_port(ps, *sa.ip()).ok_or(libc::EADDRINUSE)?,
            p if cm.port_taken(ps, *sa.ip(), p) => {
                log::info!("rdma_bind_addr: {sa} (port space {ps:#x}) is taken by another id");
                return Err(libc::EADDRINUSE);
            }
            p => p,
        };
        log::debug!("id {t}: bound to {}:{port}", sa.ip());
        let e = cm.ids.get_mut(&t).expect("checked");
        let local = SocketAddrV4::new(*sa.ip(), port);
        e.local = Some(local);
        e.device = device;
        e.state = St::Bound;
        // SAFETY: the application's id; the library fills its route.
        set_route(unsafe { &mut *(id as *mut Id) }, device, local, None);
        Ok(0)
    });
    if r.is_ok() {
        // SAFETY: as above.
        unsafe { (*id).pd = pd };
    }
    ret(r)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_resolve_addr(
    id: *mut RdmaCmId,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the application's addresses.
    let dst = match unsafe { sockaddr_v4(dst) } {
        Ok(a) if !a.ip().is_unspecified() => a,
        Ok(_) => return err(libc::EINVAL),
        Err(e) => return err(e),
    };
    let src = if src.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(match unsafe { sockaddr_v4(src) } {
            Ok(a) => a,
            Err(e) => return err(e),
        })
    };
    let src_dev = match src.map(|s| device_of(*s.ip())).transpose() {
        Ok(d) => d.flatten(),
        Err(e) => return err(e),
    };
    let r = with_entry(id, |cm, t| {
        let e = &cm.ids[&t];
        if !matches!(e.state, St::Idle | St::Bound) {
            return Err(libc::EINVAL);
        }
        let device = src_dev
            .or(e.device)
            .or_else(|| verbs::route_device(*dst.ip()))
            .ok_or_else(|| {
                log::error!("rdma_resolve_addr: no RDMA device to reach {}", dst.ip());
                libc::ENODEV
            })?;
        let ip = devices()[device].ip;
        let ps = e.ps;
        let port = match (src.map(|s| s.port()).filter(|&p| p != 0), e.local) {
            (Some(p), _) => p,
            (None, Some(l)) if l.port() != 0 => l.port(),
            _ => cm.ephemeral_port(ps, ip).ok_or(libc::EADDRINUSE)?,
        };
        let e = cm.ids.get_mut(&t).expect("checked");
        let local = SocketAddrV4::new(ip, port);
        e.local = Some(local);
        e.remote = Some(dst);
        e.device = Some(device);
        e.state = St::AddrResolved;
        // SAFETY: the application's id; the library fills its route.
        set_route(
            unsafe { &mut *(id as *mut Id) },
            Some(device),
            local,
            Some(dst),
        );
        Ok(device)
    });
    let device = match r {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    // A device that cannot start is an address error, as a failed resolution is.
    let pd = devices()[device].pd();
    // SAFETY: as above; set before the event can be seen.
    unsafe { (*id).pd = pd.unwrap_or(core::ptr::null_mut()) };
    let r = with_entry(id, |cm, t| {
        match pd {
            Ok(_) => cm.queue(t, RDMA_CM_EVENT_ADDR_RESOLVED, 0, |_| {}),
            Err(e) => {
                cm.ids.get_mut(&t).expect("checked").state = St::Idle;
                cm.queue(t, RDMA_CM_EVENT_ADDR_ERROR, -e, |_| {});
            }
        }
        Ok(0)
    });
    match r {
        // SAFETY: a live id.
        Ok(_) => unsafe { complete(id) },
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_resolve_route(id: *mut RdmaCmId, _timeout_ms: c_int) -> c_int {
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        if e.state != St::AddrResolved {
            return Err(libc::EINVAL);
        }
        e.state = St::RouteResolved;
        cm.queue(t, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, |_| {});
        Ok(0)
    });
    match r {
        // SAFETY: a live id.
        Ok(_) => unsafe { complete(id) },
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_listen(id: *mut RdmaCmId, _backlog: c_int) -> c_int {
    crate::reactor::ensure_started();
    ret(with_entry(id, |cm, t| {
        let e = &cm.ids[&t];
        match e.state {
            St::Listening => return Ok(0),
            St::Bound => {}
            _ => return Err(libc::EINVAL),
        }
        let local = e.local.expect("a bound id has an address");
        let ps = e.ps;
        let ips: Vec<Ipv4Addr> = match local.ip().is_unspecified() {
            false => vec![*local.ip()],
            true => devices().iter().map(|d| d.ip).collect(),
        };
        if ips.is_empty() {
            return Err(libc::ENODEV);
        }
        for (i, ip) in ips.iter().enumerate() {
            if let Err(e) = crate::reactor::listen_tcp(cm, *ip) {
                for done in &ips[..i] {
                    if let Some(l) = cm.tcp.get_mut(done) {
                        l.users = l.users.saturating_sub(1);
                    }
                }
                return Err(e);
            }
        }
        let key = (
            (!local.ip().is_unspecified()).then_some(*local.ip()),
            ps,
            local.port(),
        );
        cm.listeners.insert(key, t);
        let e = cm.ids.get_mut(&t).expect("checked");
        e.listening.push(key);
        e.state = St::Listening;
        cm.serve_parked(key);
        crate::reactor::wake();
        Ok(0)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_migrate_id(
    id: *mut RdmaCmId,
    channel: *mut RdmaEventChannel,
) -> c_int {
    // SAFETY: an application channel, or NULL for a new synchronous one.
    let (inner, channel_c, own) = match unsafe { crate::channel::attach(channel) } {
        Ok(c) => c,
        Err(e) => return err(e),
    };
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        for ev in e.channel.take(|ev| ev.token == t && ev.listen != t) {
            inner.push(ev);
        }
        e.channel = Arc::clone(&inner);
        e.channel_c = channel_c;
        let old = core::mem::replace(&mut e.own, own);
        // SAFETY: the application's id.
        unsafe { (*id).channel = channel_c };
        Ok(old)
    });
    match r {
        Ok(old) => {
            if let Some(OwnChannel(ch)) = old {
                // SAFETY: the id's former own channel, no longer referenced.
                drop(unsafe { Box::from_raw(ch) });
            }
            0
        }
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_set_option(
    id: *mut RdmaCmId,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    ret(with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        let byte = || -> Result<u8, c_int> {
            if len != 1 || val.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: one readable byte.
            Ok(unsafe { *(val as *const u8) })
        };
        match (level, name) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => e.tos = byte()?,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => e.ack_timeout = byte()?.min(31),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
                if len != size_of::<c_int>() || val.is_null() {
                    return Err(libc::EINVAL);
                }
            }
            _ => {
                log::warn!("rdma_set_option: level {level} option {name} is not supported");
                return Err(libc::ENOSYS);
            }
        }
        Ok(0)
    }))
}

fn port_at(a: &SockaddrStorage) -> u16 {
    // sin_port and sin6_port both sit at bytes 2..4, in network order.
    u16::from_ne_bytes([a.0[2], a.0[3]])
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_get_src_port(id: *mut RdmaCmId) -> u16 {
    match live(id) {
        // SAFETY: a live id.
        Ok(_) => port_at(unsafe { &(*id).route.addr.src }),
        Err(_) => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_get_dst_port(id: *mut RdmaCmId) -> u16 {
    match live(id) {
        // SAFETY: a live id.
        Ok(_) => port_at(unsafe { &(*id).route.addr.dst }),
        Err(_) => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_get_devices(num: *mut c_int) -> *mut *mut c_void {
    crate::init_log();
    let devs = devices();
    // SAFETY: a NULL-terminated array the application frees with rdma_free_devices.
    let list =
        unsafe { libc::calloc(devs.len() + 1, size_of::<*mut c_void>()) } as *mut *mut c_void;
    if list.is_null() {
        crate::set_errno(libc::ENOMEM);
        return list;
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: `list` has room for every device and the terminator.
        unsafe { *list.add(i) = d.ctx() };
    }
    // SAFETY: the application's counter, or NULL.
    if let Some(n) = unsafe { num.as_mut() } {
        *n = devs.len() as c_int;
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_free_devices(list: *mut *mut c_void) {
    // SAFETY: from rdma_get_devices (calloc); the contexts stay open.
    unsafe { libc::free(list as *mut c_void) };
}

#[no_mangle]
pub extern "C" fn cm_rdma_event_str(event: c_int) -> *const c_char {
    let name = usize::try_from(event)
        .ok()
        .and_then(|i| EVENT_NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN EVENT\0");
    name.as_ptr() as *const c_char
}
