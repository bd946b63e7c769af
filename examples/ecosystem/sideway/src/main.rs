//! sideway (crates.io `sideway`, RDMA-Rust) over the blue-rdma libibverbs.so.1 stand-in.
//!
//! One process opens bluerdma0 (requester) and bluerdma1 (responder) through sideway (and
//! queries them: `ibv_query_device_ex`, `ibv_query_port`, `ibv_query_gid_ex`, `ibv_query_gid`,
//! `ibv_query_gid_table`, which must agree on GID 0, a RoCEv2 GID), makes
//! an extended CQ (`ibv_create_cq_ex`) and an extended RC QP (`ibv_create_qp_ex`) on each,
//! connects them with the QPN, PSN and GID exchanged in-process, and posts one batch of two
//! work requests through sideway's `ibv_wr_*` guard: an RDMA WRITE of
//! [`WRITE_LEN`](eco_common::WRITE_LEN) bytes and a SEND of [`SEND_LEN`](eco_common::SEND_LEN)
//! bytes into a posted receive. It checks the bytes, the guard bytes after them and every
//! completion (status, opcode, byte count, QP number), prints one line and exits non-zero on
//! any mismatch.
//!
//! sideway's sys crate (rdma-mummy-sys) links a small static shim that `dlopen`s
//! `libibverbs.so.1` at start-up, so `LD_LIBRARY_PATH` selects the stand-in.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use eco_common::{
    device_names, pattern, target, wait_for, Report, FIRST_PSN, SEND_LEN, WRITE_LEN, WR_RECV,
    WR_SEND, WR_WRITE,
};
use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::{
    ExtendedCompletionQueue, GenericCompletionQueue, PollCompletionQueueError,
    WorkCompletionOperationType, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

const PORT: u8 = 1;
const GID_INDEX: u8 = 0;

/// One device's objects. Field order is drop order: the QP before its CQ and PD.
struct Side {
    name: String,
    qp: ExtendedQueuePair,
    cq: Arc<ExtendedCompletionQueue>,
    pd: Arc<ProtectionDomain>,
    _ctx: Arc<DeviceContext>,
    gid: Gid,
    lid: u16,
    mtu: Mtu,
    psn: u32,
}

/// A completion's fields, copied out of the poller.
struct Wc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
}

fn open(list: &DeviceList, name: &str, psn: u32) -> Result<Side, String> {
    let dev = list
        .iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| format!("device {name} not in ibv_get_device_list"))?;
    let ctx = dev.open().map_err(|e| format!("open {name}: {e}"))?;
    let dattr = ctx
        .query_device()
        .map_err(|e| format!("{name}: query_device: {e}"))?;
    if dattr.phys_port_cnt() < PORT {
        return Err(format!(
            "{name}: phys_port_cnt {} has no port {PORT}",
            dattr.phys_port_cnt()
        ));
    }
    let port = ctx
        .query_port(PORT)
        .map_err(|e| format!("{name}: query_port: {e}"))?;
    if port.port_state() != PortState::Active {
        return Err(format!("{name}: port {PORT} is not ACTIVE"));
    }
    let entry = ctx
        .query_gid_ex(PORT, GID_INDEX.into())
        .map_err(|e| format!("{name}: query_gid_ex: {e}"))?;
    if entry.gid_type() != GidType::RoceV2 {
        return Err(format!("{name}: GID {GID_INDEX} is not RoCEv2"));
    }
    let gid = ctx
        .query_gid(PORT, GID_INDEX.into())
        .map_err(|e| format!("{name}: query_gid: {e}"))?;
    if gid != entry.gid() {
        return Err(format!(
            "{name}: query_gid {gid} != query_gid_ex {}",
            entry.gid()
        ));
    }
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("{name}: alloc_pd: {e}"))?;
    let cq = ctx
        .create_cq_builder()
        .setup_cqe(16)
        .build_ex()
        .map_err(|e| format!("{name}: create_cq_ex: {e}"))?;
    let handle = GenericCompletionQueue::from(Arc::clone(&cq));
    let qp = pd
        .create_qp_builder()
        .setup_send_cq(handle.clone())
        .setup_recv_cq(handle)
        .setup_max_send_wr(4)
        .setup_max_recv_wr(4)
        .build_ex()
        .map_err(|e| format!("{name}: create_qp_ex: {e}"))?;
    Ok(Side {
        name: name.to_string(),
        qp,
        cq,
        pd,
        _ctx: ctx,
        gid,
        lid: port.lid(),
        mtu: port.active_mtu(),
        psn,
    })
}

/// INIT, RTR (towards `peer`), RTS.
fn connect(side: &mut Side, peer: (u32, u32, Gid, u16)) -> Result<(), String> {
    let (peer_qpn, peer_psn, peer_gid, peer_lid) = peer;
    let name = side.name.clone();
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(PORT)
        .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
    side.qp
        .modify(&attr)
        .map_err(|e| format!("{name}: INIT: {e}"))?;

    let mut av = AddressHandleAttribute::new();
    av.setup_dest_lid(peer_lid)
        .setup_port(PORT)
        .setup_service_level(0)
        .setup_grh_src_gid_index(GID_INDEX)
        .setup_grh_dest_gid(&peer_gid)
        .setup_grh_hop_limit(64);
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(side.mtu)
        .setup_dest_qp_num(peer_qpn)
        .setup_rq_psn(peer_psn)
        .setup_max_dest_read_atomic(1)
        .setup_min_rnr_timer(12)
        .setup_address_vector(&av);
    side.qp
        .modify(&attr)
        .map_err(|e| format!("{name}: RTR: {e}"))?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(side.psn)
        .setup_timeout(14)
        .setup_retry_cnt(7)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(1);
    side.qp
        .modify(&attr)
        .map_err(|e| format!("{name}: RTS: {e}"))
}

/// Everything on `cq` now (none: `Ok(None)`).
fn poll(cq: &ExtendedCompletionQueue) -> Result<Option<Vec<Wc>>, String> {
    match cq.start_poll() {
        Ok(poller) => Ok(Some(
            poller
                .map(|wc| Wc {
                    wr_id: wc.wr_id(),
                    status: wc.status(),
                    opcode: wc.opcode(),
                    byte_len: wc.byte_len(),
                })
                .collect(),
        )),
        Err(PollCompletionQueueError::CompletionQueueEmpty) => Ok(None),
        Err(e) => Err(format!("start_poll: {e}")),
    }
}

/// Collects `n` completions from `cq`.
fn completions(side: &Side, n: usize) -> Result<Vec<Wc>, String> {
    let mut got = Vec::new();
    while got.len() < n {
        let what = format!("completion {} of {n} on {}", got.len() + 1, side.name);
        got.extend(wait_for(&what, || poll(&side.cq))?);
    }
    Ok(got)
}

fn reg(
    pd: &Arc<ProtectionDomain>,
    buf: &mut [u8],
    what: &str,
) -> Result<Arc<MemoryRegion>, String> {
    let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite;
    // SAFETY: `buf` is a live heap buffer of `buf.len()` bytes that outlives the MR (every
    // MR is dropped in `run` before the buffers, and no WR is outstanding then).
    unsafe { pd.reg_mr(buf.as_mut_ptr() as usize, buf.len(), access) }
        .map_err(|e| format!("reg_mr {what}: {e}"))
}

fn run(report: &mut Report) -> Result<String, String> {
    let (a_name, b_name) = device_names();
    let list = DeviceList::new().map_err(|e| format!("ibv_get_device_list: {e}"))?;
    let mut a = open(&list, &a_name, FIRST_PSN)?;
    let mut b = open(&list, &b_name, 0x00_1234)?;

    let write_src = pattern(0x11, WRITE_LEN);
    let send_src = pattern(0x22, SEND_LEN);
    let mut a_write = write_src.clone();
    let mut a_send = send_src.clone();
    let mut b_write = target(WRITE_LEN);
    let mut b_recv = target(SEND_LEN);
    let a_write_mr = reg(&a.pd, &mut a_write, "write source")?;
    let a_send_mr = reg(&a.pd, &mut a_send, "send source")?;
    let b_write_mr = reg(&b.pd, &mut b_write, "write target")?;
    let b_recv_mr = reg(&b.pd, &mut b_recv, "receive buffer")?;

    let a_end = (a.qp.qp_number(), a.psn, a.gid, a.lid);
    let b_end = (b.qp.qp_number(), b.psn, b.gid, b.lid);
    connect(&mut a, b_end)?;
    connect(&mut b, a_end)?;

    let mut guard = b.qp.start_post_recv();
    let wr = guard.construct_wr(WR_RECV);
    // SAFETY: the SGE is inside `b_recv_mr`, which outlives the receive's completion.
    unsafe {
        wr.setup_sge(
            b_recv_mr.lkey(),
            b_recv.as_mut_ptr() as u64,
            b_recv.len() as u32,
        )
    };
    guard
        .post()
        .map_err(|e| format!("{b_name}: post_recv: {e}"))?;

    // One ibv_wr_start .. ibv_wr_complete batch: the WRITE, then the SEND.
    let mut guard = a.qp.start_post_send();
    let wr = guard
        .construct_wr(WR_WRITE, WorkRequestFlags::Signaled)
        .setup_write(b_write_mr.rkey(), b_write.as_ptr() as u64);
    // SAFETY: the SGE is inside `a_write_mr`, which outlives the WRITE's completion.
    unsafe { wr.setup_sge(a_write_mr.lkey(), a_write.as_ptr() as u64, WRITE_LEN as u32) };
    let wr = guard
        .construct_wr(WR_SEND, WorkRequestFlags::Signaled)
        .setup_send();
    // SAFETY: as above, inside `a_send_mr`.
    unsafe { wr.setup_sge(a_send_mr.lkey(), a_send.as_ptr() as u64, SEND_LEN as u32) };
    guard
        .post()
        .map_err(|e| format!("{a_name}: ibv_wr_complete: {e}"))?;

    let sends = completions(&a, 2)?;
    let recvs = completions(&b, 1)?;
    let success = WorkCompletionStatus::Success as u32;
    let expect = [
        (
            &sends[0],
            "WRITE completion",
            WR_WRITE,
            WorkCompletionOperationType::Write,
            None,
        ),
        (
            &sends[1],
            "SEND completion",
            WR_SEND,
            WorkCompletionOperationType::Send,
            None,
        ),
        (
            &recvs[0],
            "RECV completion",
            WR_RECV,
            WorkCompletionOperationType::Receive,
            Some(SEND_LEN as u32),
        ),
    ];
    for (wc, what, wr_id, opcode, len) in expect {
        report.field(what, "status", wc.status, success);
        report.field(what, "wr_id", wc.wr_id, wr_id);
        report.field(what, "opcode", wc.opcode, opcode as u32);
        if let Some(len) = len {
            report.field(what, "byte_len", wc.byte_len, len);
        }
    }
    report.bytes("WRITE target", &b_write, &write_src);
    report.bytes("RECV buffer", &b_recv, &send_src);
    drop((a_write_mr, a_send_mr, b_write_mr, b_recv_mr));
    Ok(format!(
        "{a_name} -> {b_name}: RDMA WRITE {WRITE_LEN} B and SEND {SEND_LEN} B via ibv_wr_*, \
         QPN {:#x} -> {:#x}, completions WRITE, SEND, RECV {} B",
        a.qp.qp_number(),
        b.qp.qp_number(),
        recvs[0].byte_len
    ))
}

fn main() -> ExitCode {
    let start = Instant::now();
    let mut report = Report::default();
    let summary = run(&mut report).unwrap_or_else(|e| {
        report.fail(&e);
        e
    });
    report.finish("sideway 0.4", &summary, start)
}
