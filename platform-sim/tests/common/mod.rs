//! What the engine_pair_* tests share: a connected pair, buffers with known bytes, and work
//! request builders.
#![allow(dead_code)]

use std::time::Duration;

use bluerdma_sim::core::desc::AccessFlags;
use bluerdma_sim::core::engine::{RecvWr, SendOp, SendWr, WorkCompletion};
use bluerdma_sim::pair::{Conn, Mr, Pair, PairConfig, QpOptions, Side};

pub use bluerdma_sim::pair::Side::{A, B};

/// Every access right an MR can grant.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// `n` milliseconds.
pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` microseconds.
pub const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// The IB local ACK timeout of exponent `t`: 4.096 us * 2^t, in ns.
pub const fn ib_timeout_ns(t: u8) -> u64 {
    4096 << t
}

/// A pair with `cfg`, connected with `o`.
pub fn connected_with(cfg: PairConfig, o: &QpOptions) -> (Pair, Conn) {
    let mut p = Pair::with_config(cfg).expect("pair");
    let c = p.connect(o).expect("connect");
    (p, c)
}

/// A default pair connected with `o`.
pub fn connected(o: &QpOptions) -> (Pair, Conn) {
    connected_with(PairConfig::default(), o)
}

/// A default pair connected with the default options.
pub fn default_pair() -> (Pair, Conn) {
    connected(&QpOptions::default())
}

/// `len` bytes that differ from their neighbours and from other seeds.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8 ^ seed)
        .collect()
}

/// An MR of `len` bytes on `side` on the connection's PD, all access.
pub fn buffer(p: &mut Pair, c: &Conn, side: Side, len: usize) -> Mr {
    p.reg_mr(side, c.pd[side.index()], len, ALL)
        .expect("reg_mr")
}

/// An MR of `len` bytes on `side` filled with `pattern(len, seed)`.
pub fn filled(p: &mut Pair, c: &Conn, side: Side, len: usize, seed: u8) -> Mr {
    let m = buffer(p, c, side, len);
    p.bytes_mut(&m).copy_from_slice(&pattern(len, seed));
    m
}

fn wr(wr_id: u64, op: SendOp, src: &Mr, soff: usize, len: usize) -> SendWr {
    SendWr {
        wr_id,
        op,
        laddr: src.at(soff),
        len: len as u32,
        lkey: src.key,
        raddr: src.at(0),
        rkey: src.key,
        signaled: true,
        solicited: false,
    }
}

/// A signaled WRITE of `len` bytes from `src + soff` to `dst + doff`.
pub fn write(wr_id: u64, src: &Mr, soff: usize, dst: &Mr, doff: usize, len: usize) -> SendWr {
    SendWr {
        raddr: dst.at(doff),
        rkey: dst.key,
        ..wr(wr_id, SendOp::Write, src, soff, len)
    }
}

/// A signaled WRITE_WITH_IMM.
pub fn write_imm(
    wr_id: u64,
    src: &Mr,
    soff: usize,
    dst: &Mr,
    doff: usize,
    len: usize,
    imm: u32,
) -> SendWr {
    SendWr {
        op: SendOp::WriteWithImm(imm),
        ..write(wr_id, src, soff, dst, doff, len)
    }
}

/// A signaled READ of `len` bytes from `source + off` into `sink + soff`.
pub fn read(wr_id: u64, sink: &Mr, soff: usize, source: &Mr, off: usize, len: usize) -> SendWr {
    SendWr {
        raddr: source.at(off),
        rkey: source.key,
        ..wr(wr_id, SendOp::Read, sink, soff, len)
    }
}

/// A signaled SEND (with immediate data if `imm` is given) of `len` bytes at `src + off`.
pub fn send(wr_id: u64, src: &Mr, off: usize, len: usize, imm: Option<u32>) -> SendWr {
    let op = match imm {
        Some(i) => SendOp::SendWithImm(i),
        None => SendOp::Send,
    };
    wr(wr_id, op, src, off, len)
}

/// A receive WR for `len` bytes at `buf + off`.
pub fn recv(wr_id: u64, buf: &Mr, off: usize, len: usize) -> RecvWr {
    RecvWr {
        wr_id,
        addr: buf.at(off),
        len: len as u32,
        lkey: buf.key,
    }
}

/// Waits (at most `max` of virtual time) for `n` completions on `cq` of `side`; panics
/// with the pair's state dump if they do not come.
pub fn completions(
    p: &mut Pair,
    side: Side,
    cq: u32,
    n: usize,
    max: Duration,
) -> Vec<WorkCompletion> {
    match p.wait_completions(side, cq, n, max) {
        Ok(w) => w,
        Err(e) => panic!("{n} completions on {side:?} CQ {cq}: {e}\n{}", p.dump()),
    }
}

/// The send completions of `side` (waits for `n`).
pub fn send_wcs(
    p: &mut Pair,
    c: &Conn,
    side: Side,
    n: usize,
    max: Duration,
) -> Vec<WorkCompletion> {
    completions(p, side, c.send_cq[side.index()], n, max)
}

/// The receive completions of `side` (waits for `n`).
pub fn recv_wcs(
    p: &mut Pair,
    c: &Conn,
    side: Side,
    n: usize,
    max: Duration,
) -> Vec<WorkCompletion> {
    completions(p, side, c.recv_cq[side.index()], n, max)
}

/// Posts `wrs` on `side`'s QP, panicking with the reason if one is refused.
pub fn post(p: &mut Pair, c: &Conn, side: Side, wrs: &[SendWr]) {
    if let Err((i, e)) = p.post_send(side, c.qp(side), wrs) {
        panic!("post_send refused WR {i}: {e}");
    }
}

/// Posts receive WRs on `side`'s QP.
pub fn post_recvs(p: &mut Pair, c: &Conn, side: Side, wrs: &[RecvWr]) {
    if let Err((i, e)) = p.post_recv(side, c.qp(side), wrs) {
        panic!("post_recv refused WR {i}: {e}");
    }
}

/// `n` signaled WRITEs of `len` bytes each with wr_ids `first..`: the k-th from
/// `src + k * len` to `dst + k * len`.
pub fn writes(first: u64, n: usize, src: &Mr, dst: &Mr, len: usize) -> Vec<SendWr> {
    (0..n)
        .map(|k| write(first + k as u64, src, k * len, dst, k * len, len))
        .collect()
}

/// `n` receive WRs with wr_ids `0..n`, each `len` bytes at `buf + k * stride`.
pub fn recvs(n: usize, buf: &Mr, stride: usize, len: usize) -> Vec<RecvWr> {
    (0..n)
        .map(|k| recv(k as u64, buf, k * stride, len))
        .collect()
}
