//! rust-ibverbs (crates.io `ibverbs` 0.9, jonhoo/rust-ibverbs) over the blue-rdma
//! libibverbs.so.1 stand-in.
//!
//! One process opens bluerdma0 (requester) and bluerdma1 (responder) with the crate (which
//! checks the port is ACTIVE and reads the GID table with `_ibv_query_gid_table`), creates a
//! CQ, a PD and an RC QP on each, exchanges the endpoints (QPN, LID, GID) in-process,
//! connects them with the crate's `handshake`, and SENDs [`SEND_LEN`] bytes into a posted
//! receive in an MR from `ProtectionDomain::allocate`. The crate has no RDMA WRITE, so
//! [`raw`] does the WRITE of [`WRITE_LEN`] bytes with the project's raw bindings
//! (`ibverbs-sys`). Bytes, guard bytes and completions are checked; one line is printed and
//! any mismatch exits non-zero.
//!
//! `ibverbs-sys` runs rdma-core's cmake only to generate headers for bindgen and links
//! `-libverbs` dynamically, so `LD_LIBRARY_PATH` selects the stand-in.

mod raw;

use std::process::ExitCode;
use std::time::Instant;

use eco_common::{
    device_names, pattern, target, wait_for, Report, FIRST_PSN, GUARD, SEND_LEN, WRITE_LEN,
    WR_RECV, WR_SEND, WR_WRITE,
};
use ibverbs::{
    ibv_qp_type, ibv_wc, ibv_wc_opcode, CompletionQueue, Context, PreparedQueuePair,
    ProtectionDomain,
};

const GID_INDEX: u32 = 0;

fn open(name: &str) -> Result<Context, String> {
    let list = ibverbs::devices().map_err(|e| format!("ibverbs::devices: {e}"))?;
    let dev = list
        .iter()
        .find(|d| d.name().is_some_and(|n| n.to_bytes() == name.as_bytes()))
        .ok_or_else(|| format!("device {name} not in ibverbs::devices()"))?;
    dev.open().map_err(|e| format!("open {name}: {e}"))
}

/// Waits for one completion on `cq`.
fn completion(cq: &CompletionQueue<'_>, what: &str) -> Result<ibv_wc, String> {
    let mut wc = [ibv_wc::default(); 1];
    wait_for(what, || {
        let got = cq.poll(&mut wc).map_err(|e| format!("{what}: poll: {e}"))?;
        Ok(got.first().copied())
    })
}

/// Checks a completion's status, wr_id and opcode (and byte count for a receive).
fn check_wc(
    report: &mut Report,
    what: &str,
    wc: &ibv_wc,
    wr_id: u64,
    opcode: u32,
    len: Option<usize>,
) {
    report.check(wc.error().is_none(), || {
        format!("{what}: error {:?}", wc.error())
    });
    report.field(what, "wr_id", wc.wr_id(), wr_id);
    report.field(what, "opcode", wc.opcode(), opcode);
    if let Some(len) = len {
        report.field(what, "byte_len", wc.len(), len);
    }
}

/// An RC QP on `pd` over `cq`, using GID [`GID_INDEX`].
fn build_qp<'r>(
    ctx: &Context,
    pd: &'r ProtectionDomain<'r>,
    cq: &'r CompletionQueue<'r>,
    name: &str,
) -> Result<PreparedQueuePair<'r>, String> {
    // The crate asserts the index is inside the GID table it read at open.
    if ctx.gid_table().len() <= GID_INDEX as usize {
        return Err(format!("{name}: the GID table has no entry {GID_INDEX}"));
    }
    // The crate's default local ACK timeout is 4 (65 us, 7 tries): a card ACKs in a few us,
    // but the emulated card on a loaded 2-core machine misses that now and then and the SEND
    // completes RETRY_EXC_ERR although it arrived. 14 (67 ms) is what perftest and
    // ibv_rc_pingpong use.
    pd.create_qp(cq, cq, ibv_qp_type::IBV_QPT_RC)
        .set_gid_index(GID_INDEX)
        .set_timeout(14)
        .build()
        .map_err(|e| format!("{name}: build QP: {e}"))
}

/// SEND/RECV through the crate's safe API; returns the two QP numbers.
fn send_recv(report: &mut Report, a_name: &str, b_name: &str) -> Result<(u32, u32), String> {
    let a = open(a_name)?;
    let b = open(b_name)?;
    let a_cq = a
        .create_cq(8, 0)
        .map_err(|e| format!("{a_name}: create_cq: {e}"))?;
    let b_cq = b
        .create_cq(8, 0)
        .map_err(|e| format!("{b_name}: create_cq: {e}"))?;
    let a_pd = a
        .alloc_pd()
        .map_err(|e| format!("{a_name}: alloc_pd: {e}"))?;
    let b_pd = b
        .alloc_pd()
        .map_err(|e| format!("{b_name}: alloc_pd: {e}"))?;
    let a_qp = build_qp(&a, &a_pd, &a_cq, a_name)?;
    let b_qp = build_qp(&b, &b_pd, &b_cq, b_name)?;
    let (a_end, b_end) = (a_qp.endpoint(), b_qp.endpoint());
    let qpns = (a_end.num, b_end.num);
    let mut a_qp = a_qp
        .handshake(b_end)
        .map_err(|e| format!("{a_name}: handshake: {e}"))?;
    let mut b_qp = b_qp
        .handshake(a_end)
        .map_err(|e| format!("{b_name}: handshake: {e}"))?;

    let send_src = pattern(0x33, SEND_LEN);
    let mut a_mr = a_pd
        .allocate::<u8>(SEND_LEN)
        .map_err(|e| format!("{a_name}: allocate: {e}"))?;
    a_mr.copy_from_slice(&send_src);
    let mut b_mr = b_pd
        .allocate::<u8>(SEND_LEN + GUARD)
        .map_err(|e| format!("{b_name}: allocate: {e}"))?;
    b_mr.copy_from_slice(&target(SEND_LEN));

    // SAFETY (both posts): the MRs outlive the completions waited for below.
    unsafe { b_qp.post_receive(&mut b_mr, .., WR_RECV) }
        .map_err(|e| format!("{b_name}: post_receive: {e}"))?;
    unsafe { a_qp.post_send(&mut a_mr, .., WR_SEND) }
        .map_err(|e| format!("{a_name}: post_send: {e}"))?;
    let sent = completion(&a_cq, &format!("SEND completion on {a_name}"))?;
    let recv = completion(&b_cq, &format!("RECV completion on {b_name}"))?;
    check_wc(
        report,
        "SEND completion",
        &sent,
        WR_SEND,
        ibv_wc_opcode::IBV_WC_SEND,
        None,
    );
    check_wc(
        report,
        "RECV completion",
        &recv,
        WR_RECV,
        ibv_wc_opcode::IBV_WC_RECV,
        Some(SEND_LEN),
    );
    report.field("RECV completion", "qp_num", recv.qp_num, qpns.1);
    report.bytes("RECV buffer", &b_mr, &send_src);
    Ok(qpns)
}

/// The WRITE through `ibverbs-sys`.
fn write(report: &mut Report, a_name: &str, b_name: &str) -> Result<(), String> {
    let write_src = pattern(0x44, WRITE_LEN);
    let mut a = raw::RawSide::open(a_name, write_src.clone())?;
    let b = raw::RawSide::open(b_name, target(WRITE_LEN))?;
    let (a_qpn, a_gid, _, _) = a.endpoint();
    let (b_qpn, b_gid, b_addr, b_rkey) = b.endpoint();
    let (a_psn, b_psn) = (FIRST_PSN, 0x00_0100);
    a.connect(b_qpn, b_gid, b_psn, a_psn)?;
    b.connect(a_qpn, a_gid, a_psn, b_psn)?;
    a.post_write(WRITE_LEN, b_addr, b_rkey, WR_WRITE)?;
    let wc = a.completion()?;
    check_wc(
        report,
        "WRITE completion",
        &wc,
        WR_WRITE,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        None,
    );
    report.field("WRITE completion", "qp_num", wc.qp_num, a_qpn);
    report.bytes("WRITE target", &b.buf, &write_src);
    Ok(())
}

fn run(report: &mut Report) -> Result<String, String> {
    let (a_name, b_name) = device_names();
    let (a_qpn, b_qpn) = send_recv(report, &a_name, &b_name)?;
    write(report, &a_name, &b_name)?;
    Ok(format!(
        "{a_name} -> {b_name}: SEND {SEND_LEN} B through the crate (QPN {a_qpn:#x} -> {b_qpn:#x}), \
         RDMA WRITE {WRITE_LEN} B through ibverbs-sys (the crate has no WRITE)"
    ))
}

fn main() -> ExitCode {
    let start = Instant::now();
    let mut report = Report::default();
    let summary = run(&mut report).unwrap_or_else(|e| {
        report.fail(&e);
        e
    });
    report.finish("rust-ibverbs 0.9", &summary, start)
}
