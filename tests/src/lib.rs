//! End-to-end tests across crates live in `tests/tests/`; this library holds their helpers:
//! opening two emulated devices, connecting QP pairs, building work requests, and
//! deterministic byte patterns with a comparison that names the first differing byte.
#![deny(missing_docs)]

pub mod raw;
pub mod served;
pub mod shared;

use std::net::Ipv4Addr;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr};
use bluerdma_core::keys::MrKey;
use bluerdma_linux::{Context, Cq, DeviceSpec, Mr, Pd, Qp};
use bluerdma_sim::link::MemHub;

/// The first card's address.
pub const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The second card's address.
pub const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Every access an MR in these tests usually needs.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Two emulated devices (`blue0` at [`IP0`], `blue1` at [`IP1`]) on one in-memory hub.
pub fn two_devices() -> (Context, Context) {
    two_devices_from(0)
}

/// [`two_devices`] whose connections start on the wire at PSN `wire_psn_start`
/// (0xFFFFF0: their traffic crosses the 24-bit wrap).
pub fn two_devices_from(wire_psn_start: u32) -> (Context, Context) {
    let hub = MemHub::new();
    let open = |name, ip| {
        let mut spec = DeviceSpec::new(name, ip);
        spec.wire_psn_start = wire_psn_start;
        Context::open_emulated(spec, Box::new(hub.attach(ip).unwrap())).unwrap()
    };
    (open("blue0", IP0), open("blue1", IP1))
}

/// The wire PSN of [`two_devices_from`] that makes a connection cross the 24-bit wrap
/// within its first 16 packets.
pub const NEAR_WRAP: u32 = 0xFF_FFF0;

/// One end of a connected QP pair: the QP, its CQ (send and receive) and its PD.
pub struct Side {
    /// The queue pair.
    pub qp: Qp,
    /// Its send and receive completion queue.
    pub cq: Cq,
    /// Its protection domain (allocate the MRs the QP uses here).
    pub pd: Pd,
}

/// Connects a fresh QP on `a` to a fresh QP on `b`: `a` sends from PSN `psn_a`, `b` from
/// `psn_b`, both with IB `timeout` exponent and `retries`.
pub fn connect_pair(
    a: &Context,
    b: &Context,
    (psn_a, psn_b): (u32, u32),
    timeout: u8,
    retries: u8,
) -> (Side, Side) {
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();
    qa.connect(qb.endpoint(psn_b), psn_a, timeout, retries)
        .unwrap();
    qb.connect(qa.endpoint(psn_a), psn_b, timeout, retries)
        .unwrap();
    (
        Side {
            qp: qa,
            cq: ca,
            pd: pa,
        },
        Side {
            qp: qb,
            cq: cb,
            pd: pb,
        },
    )
}

/// A signaled work request of `op` moving `len` bytes between `local + off` and
/// `remote + roff`.
pub fn wr(
    wr_id: u64,
    op: SendOp,
    local: &Mr,
    off: usize,
    len: usize,
    remote: &Mr,
    roff: usize,
) -> SendWr {
    raw_wr(
        wr_id,
        op,
        (local.addr() + off as u64, local.key()),
        len,
        (remote.addr() + roff as u64, remote.key()),
    )
}

/// A signaled work request from raw `(address, key)` pairs, for requests that must break
/// a rule the [`Mr`] handles would keep.
pub fn raw_wr(
    wr_id: u64,
    op: SendOp,
    (laddr, lkey): (u64, MrKey),
    len: usize,
    (raddr, rkey): (u64, MrKey),
) -> SendWr {
    SendWr {
        wr_id,
        op,
        laddr: VirtAddr(laddr),
        len: u32::try_from(len).expect("a work request is shorter than 4 GiB"),
        lkey,
        raddr: VirtAddr(raddr),
        rkey,
        signaled: true,
        solicited: false,
    }
}

/// Byte `i` of the deterministic pattern `seed`: no short period, so a shifted or
/// misplaced copy does not match by accident.
pub fn pattern_byte(seed: u32, i: u64) -> u8 {
    let x = (i as u32 ^ (i >> 32) as u32 ^ seed.rotate_left(16))
        .wrapping_mul(2_654_435_761)
        .wrapping_add(seed);
    (x >> 13) as u8
}

/// Fills `buf` with pattern `seed` starting at pattern offset `start`.
pub fn fill_pattern(buf: &mut [u8], seed: u32, start: u64) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = pattern_byte(seed, start + i as u64);
    }
}

/// The index of the first byte of `buf` that differs from pattern `seed` at `start`.
pub fn pattern_mismatch(buf: &[u8], seed: u32, start: u64) -> Option<usize> {
    buf.iter()
        .enumerate()
        .position(|(i, x)| *x != pattern_byte(seed, start + i as u64))
}

/// Asserts `got == want`; on failure prints a hex diff (first differing offset, how many
/// bytes differ, a few rows around them), never megabytes of output.
#[track_caller]
pub fn assert_bytes_eq(what: &str, got: &[u8], want: &[u8]) {
    if let Some(diff) = bluerdma_linux::debug::hex_diff(want, got, 8) {
        panic!("{what}: bytes differ\n{diff}");
    }
}

/// Asserts every byte of `buf` is zero (nothing was written); names the first one that
/// is not.
#[track_caller]
pub fn assert_untouched(what: &str, buf: &[u8]) {
    if let Some(i) = buf.iter().position(|x| *x != 0) {
        let n = buf.iter().filter(|x| **x != 0).count();
        panic!("{what}: {n} bytes written, the first at {i}");
    }
}

/// The value of `key=value` in a line of whitespace-separated fields (the line protocol of
/// the `verbs_peer` helper binary).
pub fn line_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// A `0x`-prefixed (or plain) hexadecimal number.
pub fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}
