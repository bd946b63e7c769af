//! The connection calls: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_establish` and `rdma_notify`.
//!
//! Each checks the id's state, queues its CM message for the CM thread and, for a
//! synchronous id, waits for the outcome. The passive side moves its QP to RTR and RTS in
//! `rdma_accept` before the REP leaves (the requester may send as soon as it has the REP);
//! `rdma_disconnect` moves the QP to ERR first, which flushes its work requests. Private
//! data longer than the IB spec allows for the message is refused with EINVAL.

use core::ffi::{c_int, c_void};
use std::time::Instant;

use crate::abi::*;
use crate::api::{ack_sync_event, complete, live, ret, with_entry};
use crate::err;
use crate::state::{Id, St};
use crate::verbs::{self, devices};
use crate::wire::{self, Msg, Params};

/// The private data of a connection parameter block, at most `limit` bytes.
///
/// # Safety
/// `p` is NULL or a readable `rdma_conn_param` whose data pointer covers its length.
unsafe fn private_of(p: *const RdmaConnParam, limit: usize, call: &str) -> Result<Vec<u8>, c_int> {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return Ok(Vec::new());
    };
    private_bytes(p.private_data as *const u8, p.private_data_len, limit, call)
}

pub(crate) fn private_bytes(
    data: *const u8,
    len: u8,
    limit: usize,
    call: &str,
) -> Result<Vec<u8>, c_int> {
    let n = len as usize;
    if n > limit {
        log::error!("{call}: {n} bytes of private data (at most {limit})");
        return Err(libc::EINVAL);
    }
    if n == 0 || data.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the application's data of its stated length.
    Ok(unsafe { std::slice::from_raw_parts(data, n) }.to_vec())
}

/// `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` mean "the device's limit".
fn clamp(v: u8, max: u8) -> u8 {
    if v == RDMA_MAX_RD {
        max
    } else {
        v.min(max)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_connect(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    crate::reactor::ensure_started();
    if let Err(e) = live(id) {
        return err(e);
    }
    // SAFETY: a live id; its QP pointer is the application's or the library's.
    let qp = unsafe { (*id).qp };
    let qpn = match (qp.is_null(), param.is_null()) {
        // SAFETY: a live QP.
        (false, _) => unsafe { (*qp).qp_num },
        // SAFETY: the application's parameters.
        (true, false) => unsafe { (*param).qp_num },
        (true, true) => 0,
    };
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        if e.state != St::RouteResolved {
            log::error!("rdma_connect: the id is {:?}, not route-resolved", e.state);
            return Err(libc::EINVAL);
        }
        let limit = if e.ud {
            wire::SIDR_REQ_PRIVATE
        } else {
            wire::REQ_PRIVATE
        };
        // SAFETY: the application's parameters.
        let private = unsafe { private_of(param, limit, "rdma_connect") }?;
        let (local, remote) = (e.local.expect("resolved"), e.remote.expect("resolved"));
        let dev = &devices()[e.device.expect("resolved")];
        let ps = e.ps as u16;
        let msg = if e.ud {
            Msg::SidrReq(wire::SidrReq {
                ps,
                dst_port: remote.port(),
                src_port: local.port(),
                private,
            })
        } else {
            // SAFETY: the application's parameters.
            let p = unsafe { param.as_ref() };
            let mine = Params {
                qpn,
                psn: e.psn,
                mtu: dev.mtu,
                responder_resources: clamp(
                    p.map_or(RDMA_MAX_RD, |p| p.responder_resources),
                    dev.max_responder,
                ),
                initiator_depth: clamp(
                    p.map_or(RDMA_MAX_RD, |p| p.initiator_depth),
                    dev.max_initiator,
                ),
                flow_control: p.map_or(1, |p| p.flow_control),
                retry_count: p.map_or(7, |p| p.retry_count),
                rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count),
                srq: p.map_or(0, |p| p.srq),
            };
            e.mine = mine;
            Msg::Req(wire::Req {
                ps,
                dst_port: remote.port(),
                src_port: local.port(),
                params: mine,
                private,
            })
        };
        e.state = St::Connecting;
        let conn = crate::reactor::connect(cm, t, *local.ip(), *remote.ip(), &msg)?;
        if cm.conns.contains_key(&conn) {
            cm.ids.get_mut(&t).expect("checked").conn = Some(conn);
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
pub unsafe extern "C" fn cm_rdma_accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    if let Err(e) = live(id) {
        return err(e);
    }
    // SAFETY: a live id.
    let qp = unsafe { (*id).qp };
    // SAFETY: the application's parameters.
    let p = unsafe { param.as_ref() }.copied();
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        if e.state != St::ReqReceived {
            return Err(if e.state == St::Failed {
                libc::ECONNRESET
            } else {
                libc::EINVAL
            });
        }
        let limit = if e.ud {
            wire::SIDR_REP_PRIVATE
        } else {
            wire::REP_PRIVATE
        };
        let private = match p {
            Some(p) => private_bytes(
                p.private_data as *const u8,
                p.private_data_len,
                limit,
                "rdma_accept",
            )?,
            None => Vec::new(),
        };
        let qpn = match (qp.is_null(), p) {
            // SAFETY: a live QP.
            (false, _) => unsafe { (*qp).qp_num },
            (true, Some(p)) => p.qp_num,
            (true, None) => 0,
        };
        if !e.ud {
            let req = e.peer.expect("a request carries parameters");
            let dev = &devices()[e.device.expect("a request has a device")];
            e.mine = Params {
                qpn,
                psn: e.psn,
                mtu: dev.mtu.min(req.mtu),
                responder_resources: clamp(
                    p.map_or(req.initiator_depth, |p| p.responder_resources),
                    dev.max_responder,
                ),
                initiator_depth: clamp(
                    p.map_or(req.responder_resources, |p| p.initiator_depth),
                    dev.max_initiator,
                ),
                flow_control: p.map_or(1, |p| p.flow_control),
                retry_count: req.retry_count,
                rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count),
                srq: p.map_or(0, |p| p.srq),
            };
        }
        Ok((private, qpn, e.ud, crate::qp::plan(e)))
    });
    let (private, qpn, ud, plan) = match r {
        Ok(v) => v,
        Err(e) => return err(e),
    };
    if !ud && !qp.is_null() {
        // SAFETY: the id's live QP.
        if let Err(e) = unsafe { verbs::transition(qp, &plan, &[IBV_QPS_RTR, IBV_QPS_RTS]) } {
            return err(e);
        }
    }
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        let Some(conn) = e.conn.filter(|_| e.state == St::ReqReceived) else {
            return Err(libc::ECONNRESET);
        };
        if ud {
            e.state = St::Connected;
            let rep = wire::SidrRep {
                status: wire::sidr::SUCCESS,
                qpn,
                qkey: RDMA_UDP_QKEY,
                private,
            };
            cm.send(conn, &Msg::SidrRep(rep));
            cm.close(conn);
        } else {
            e.state = St::Accepted;
            let mine = e.mine;
            cm.send(
                conn,
                &Msg::Rep(wire::Rep {
                    params: mine,
                    private,
                }),
            );
            if let Some(c) = cm.conns.get_mut(&conn) {
                c.deadline = Some(Instant::now() + crate::cm_timeout() * 12);
            }
        }
        crate::reactor::wake();
        Ok(0)
    });
    match r {
        // SAFETY: a live id.
        Ok(_) if ud => {
            // SAFETY: a live id.
            ack_sync_event(unsafe { &mut *(id as *mut Id) });
            0
        }
        // SAFETY: a live id.
        Ok(_) => unsafe { complete(id) },
        Err(e) => err(e),
    }
}

fn reject(id: *mut RdmaCmId, data: *const c_void, len: u8, reason: u16) -> c_int {
    ret(with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        let (Some(conn), St::ReqReceived) = (e.conn, e.state) else {
            return Err(libc::EINVAL);
        };
        let ud = e.ud;
        let limit = if ud {
            wire::SIDR_REP_PRIVATE
        } else {
            wire::REJ_PRIVATE
        };
        let private = private_bytes(data as *const u8, len, limit, "rdma_reject")?;
        e.state = St::Failed;
        let msg = if ud {
            Msg::SidrRep(wire::SidrRep {
                status: wire::sidr::REJECT,
                qpn: 0,
                qkey: 0,
                private,
            })
        } else {
            Msg::Rej(wire::Rej { reason, private })
        };
        cm.send(conn, &msg);
        cm.close(conn);
        crate::reactor::wake();
        Ok(0)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_reject(id: *mut RdmaCmId, data: *const c_void, len: u8) -> c_int {
    reject(id, data, len, wire::reason::CONSUMER_DEFINED)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_reject_ece(
    id: *mut RdmaCmId,
    data: *const c_void,
    len: u8,
) -> c_int {
    reject(id, data, len, wire::reason::VENDOR_OPTION_NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    let ud = match with_entry(id, |cm, t| Ok(cm.ids[&t].ud)) {
        Ok(ud) => ud,
        Err(e) => return err(e),
    };
    // SAFETY: a live id (checked above).
    let qp = unsafe { (*id).qp };
    if !ud && !qp.is_null() {
        // Flush the QP's work requests, as the real library does before its DREQ.
        // SAFETY: the id's live QP.
        if let Err(e) = unsafe { verbs::transition(qp, &verbs::QpPlan::default(), &[IBV_QPS_ERR]) }
        {
            log::warn!("rdma_disconnect: moving the QP to ERR failed (errno {e})");
        }
    }
    let r = with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        match (e.state, e.conn) {
            (St::Connected | St::Accepted | St::RepReceived, Some(conn)) if !e.ud => {
                e.state = St::DisconnectSent;
                cm.send(conn, &Msg::Dreq);
                if let Some(c) = cm.conns.get_mut(&conn) {
                    c.deadline = Some(Instant::now() + crate::cm_timeout());
                }
                crate::reactor::wake();
                Ok(true)
            }
            (St::Connected | St::Accepted | St::RepReceived, None) if !e.ud => {
                e.state = St::Disconnected;
                cm.report_disconnect(t);
                Ok(true)
            }
            (St::Connected | St::DisconnectSent | St::Disconnected, _) => Ok(false),
            _ => Err(libc::EINVAL),
        }
    });
    match r {
        // SAFETY: a live id.
        Ok(true) => unsafe { complete(id) },
        Ok(false) => 0,
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_establish(id: *mut RdmaCmId) -> c_int {
    ret(with_entry(id, |cm, t| {
        let e = cm.ids.get_mut(&t).expect("checked");
        match (e.state, e.conn) {
            (St::RepReceived, Some(conn)) => {
                e.state = St::Connected;
                cm.send(conn, &Msg::Rtu);
                crate::reactor::wake();
                Ok(0)
            }
            (St::RepReceived, None) => Err(e.peer_gone.unwrap_or(libc::ECONNRESET)),
            _ => Err(libc::EINVAL),
        }
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_notify(id: *mut RdmaCmId, _event: c_int) -> c_int {
    // The RTU always arrives over the CM connection: nothing to learn from QP events.
    ret(with_entry(id, |_, _| Ok(0)))
}
