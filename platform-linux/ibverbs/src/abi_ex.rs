//! The extended verbs' ABI (rdma-core 44, x86_64 / LP64): `struct ibv_qp_ex` and
//! `struct ibv_cq_ex` (an `ibv_qp` or `ibv_cq` followed by fields and function pointers the
//! inline `ibv_wr_*`, `ibv_start_poll` and `ibv_wc_read_*` of `<infiniband/verbs.h>` call
//! through), and the attribute structures of `ibv_create_qp_ex`, `ibv_create_cq_ex` and
//! `ibv_query_device_ex`. Offsets are checked at compile time against `offsetof` on
//! `/usr/include/infiniband/verbs.h`.
//!
//! A QP or CQ of this library is a box whose first field is the `ibv_qp` / `ibv_cq`; the
//! extended part ([`IbvQpExTail`], [`IbvCqExTail`]) is its second field, so the box starts
//! with a whole `ibv_qp_ex` / `ibv_cq_ex`. Fields the application writes after creation
//! (`wr_id`, `wr_flags`) and fields this library writes while the application reads them
//! (`status`, `wr_id` of a CQ) are `UnsafeCell`s.

#![allow(missing_docs)]

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};

use crate::abi::{check, IbvCq, IbvDeviceAttr, IbvPd, IbvQp, IbvQpCap};

/// `struct ibv_qp_ex` after its `ibv_qp` (192 bytes, at offset 160 of the QP).
#[repr(C)]
pub struct IbvQpExTail {
    pub comp_mask: u64,
    /// Set by the application before each `ibv_wr_<op>`.
    pub wr_id: UnsafeCell<u64>,
    /// `enum ibv_send_flags`, set by the application before each `ibv_wr_<op>`.
    pub wr_flags: UnsafeCell<u32>,
    pub _pad: u32,
    /// The `wr_*` function pointers (see [`qpx`]).
    pub ops: [usize; qpx::COUNT],
}

/// Index of each function pointer in [`IbvQpExTail::ops`] ((byte offset - 184) / 8).
pub mod qpx {
    pub const ATOMIC_CMP_SWP: usize = 0;
    pub const ATOMIC_FETCH_ADD: usize = 1;
    pub const BIND_MW: usize = 2;
    pub const LOCAL_INV: usize = 3;
    pub const RDMA_READ: usize = 4;
    pub const RDMA_WRITE: usize = 5;
    pub const RDMA_WRITE_IMM: usize = 6;
    pub const SEND: usize = 7;
    pub const SEND_IMM: usize = 8;
    pub const SEND_INV: usize = 9;
    pub const SEND_TSO: usize = 10;
    pub const SET_UD_ADDR: usize = 11;
    pub const SET_XRC_SRQN: usize = 12;
    pub const SET_INLINE_DATA: usize = 13;
    pub const SET_INLINE_DATA_LIST: usize = 14;
    pub const SET_SGE: usize = 15;
    pub const SET_SGE_LIST: usize = 16;
    pub const START: usize = 17;
    pub const COMPLETE: usize = 18;
    pub const ABORT: usize = 19;
    pub const ATOMIC_WRITE: usize = 20;
    pub const COUNT: usize = 21;
}

/// `struct ibv_qp_ex` (352 bytes), for the layout checks.
#[repr(C)]
pub struct IbvQpEx {
    pub qp_base: IbvQp,
    pub tail: IbvQpExTail,
}

/// `struct ibv_cq_ex` after its `ibv_cq` (160 bytes, at offset 128 of the CQ).
#[repr(C)]
pub struct IbvCqExTail {
    pub comp_mask: u32,
    /// `enum ibv_wc_status` of the current completion (start_poll / next_poll set it).
    pub status: UnsafeCell<u32>,
    /// The current completion's `wr_id`.
    pub wr_id: UnsafeCell<u64>,
    /// The polling function pointers (see [`cqx`]).
    pub ops: [usize; cqx::COUNT],
}

/// Index of each function pointer in [`IbvCqExTail::ops`] ((byte offset - 144) / 8).
pub mod cqx {
    pub const START_POLL: usize = 0;
    pub const NEXT_POLL: usize = 1;
    pub const END_POLL: usize = 2;
    pub const READ_OPCODE: usize = 3;
    pub const READ_VENDOR_ERR: usize = 4;
    pub const READ_BYTE_LEN: usize = 5;
    pub const READ_IMM_DATA: usize = 6;
    pub const READ_QP_NUM: usize = 7;
    pub const READ_SRC_QP: usize = 8;
    pub const READ_WC_FLAGS: usize = 9;
    pub const READ_SLID: usize = 10;
    pub const READ_SL: usize = 11;
    pub const READ_DLID_PATH_BITS: usize = 12;
    pub const READ_COMPLETION_TS: usize = 13;
    pub const READ_CVLAN: usize = 14;
    pub const READ_FLOW_TAG: usize = 15;
    pub const READ_TM_INFO: usize = 16;
    pub const READ_COMPLETION_WALLCLOCK_NS: usize = 17;
    pub const COUNT: usize = 18;
}

/// `struct ibv_cq_ex` (288 bytes), for the layout checks.
#[repr(C)]
pub struct IbvCqEx {
    pub cq_base: IbvCq,
    pub tail: IbvCqExTail,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes); its first 60 bytes are `ibv_qp_init_attr`'s.
#[repr(C)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    /// `enum ibv_qp_init_attr_mask`.
    pub comp_mask: u32,
    pub pd: *mut IbvPd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub _pad: u16,
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf` (unused: no RSS).
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub _pad2: u32,
    /// `enum ibv_qp_create_send_ops_flags`.
    pub send_ops_flags: u64,
}

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
pub struct IbvCqInitAttrEx {
    pub cqe: u32,
    pub _pad: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut crate::abi::IbvCompChannel,
    pub comp_vector: u32,
    pub _pad2: u32,
    /// `enum ibv_create_cq_wc_flags`.
    pub wc_flags: u64,
    /// `enum ibv_cq_init_attr_mask`.
    pub comp_mask: u32,
    /// `enum ibv_create_cq_attr_flags` (with IBV_CQ_INIT_ATTR_MASK_FLAGS).
    pub flags: u32,
    pub parent_domain: *mut IbvPd,
}

/// `struct ibv_device_attr_ex` (400 bytes). The capability groups this device has none of
/// (ODP, TSO, RSS, packet pacing, tag matching, CQ moderation, device memory, PCI atomics)
/// are plain words, reported as zero.
#[repr(C)]
pub struct IbvDeviceAttrEx {
    pub orig_attr: IbvDeviceAttr,
    pub comp_mask: u32,
    pub _pad: u32,
    /// `struct ibv_odp_caps`.
    pub odp_caps: [u64; 3],
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    /// `struct ibv_tso_caps`.
    pub tso_caps: [u32; 2],
    /// `struct ibv_rss_caps`.
    pub rss_caps: [u64; 4],
    pub max_wq_type_rq: u32,
    /// `struct ibv_packet_pacing_caps`.
    pub packet_pacing_caps: [u32; 3],
    pub raw_packet_caps: u32,
    /// `struct ibv_tm_caps`.
    pub tm_caps: [u32; 5],
    /// `struct ibv_cq_moderation_caps`.
    pub cq_mod_caps: [u16; 2],
    pub _pad2: u32,
    pub max_dm_size: u64,
    /// `struct ibv_pci_atomic_caps`.
    pub pci_atomic_caps: [u16; 3],
    pub _pad3: u16,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_data_buf` (16 bytes): one buffer of `ibv_wr_set_inline_data_list`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvDataBuf {
    pub addr: *mut c_void,
    pub length: usize,
}

check!(IbvQpEx, 352, qp_base = 0, tail = 160);
check!(
    IbvQpExTail,
    192,
    comp_mask = 0,
    wr_id = 8,
    wr_flags = 16,
    ops = 24
);
check!(IbvCqEx, 288, cq_base = 0, tail = 128);
check!(
    IbvCqExTail,
    160,
    comp_mask = 0,
    status = 4,
    wr_id = 8,
    ops = 16
);
check!(
    IbvQpInitAttrEx,
    136,
    qp_context = 0,
    send_cq = 8,
    recv_cq = 16,
    srq = 24,
    cap = 32,
    qp_type = 52,
    sq_sig_all = 56,
    comp_mask = 60,
    pd = 64,
    xrcd = 72,
    create_flags = 80,
    max_tso_header = 84,
    rwq_ind_tbl = 88,
    rx_hash_conf = 96,
    source_qpn = 120,
    send_ops_flags = 128
);
check!(
    IbvCqInitAttrEx,
    56,
    cqe = 0,
    cq_context = 8,
    channel = 16,
    comp_vector = 24,
    wc_flags = 32,
    comp_mask = 40,
    flags = 44,
    parent_domain = 48
);
check!(
    IbvDeviceAttrEx,
    400,
    orig_attr = 0,
    comp_mask = 232,
    odp_caps = 240,
    completion_timestamp_mask = 264,
    hca_core_clock = 272,
    device_cap_flags_ex = 280,
    tso_caps = 288,
    rss_caps = 296,
    max_wq_type_rq = 328,
    packet_pacing_caps = 332,
    raw_packet_caps = 344,
    tm_caps = 348,
    cq_mod_caps = 368,
    max_dm_size = 376,
    pci_atomic_caps = 384,
    xrc_odp_caps = 392,
    phys_port_cnt_ex = 396
);
check!(IbvDataBuf, 16, addr = 0, length = 8);
// The fields of an `ibv_qp_init_attr` come first, at the same offsets.
const _: () =
    assert!(offset_of!(IbvQpInitAttrEx, comp_mask) == size_of::<crate::abi::IbvQpInitAttr>() - 4);

// `enum ibv_qp_init_attr_mask`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
pub const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 1 << 4;
pub const IBV_QP_INIT_ATTR_RX_HASH: u32 = 1 << 5;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

// `enum ibv_qp_create_send_ops_flags`.
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;

// `enum ibv_create_cq_wc_flags`: the standard fields (byte_len, imm, qp_num, src_qp, slid,
// sl, dlid_path_bits) are bits 0..=6; 7 and up are timestamps, cvlan, flow tag, tag
// matching.
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7F;
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;

// `enum ibv_cq_init_attr_mask` and `enum ibv_create_cq_attr_flags`.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
pub const IBV_CQ_INIT_ATTR_MASK_PD: u32 = 1 << 1;
pub const IBV_CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;
