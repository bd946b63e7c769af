//! The libibverbs ABI on x86_64 / LP64: the structures applications and the inline verbs of
//! `<infiniband/verbs.h>` (rdma-core 44) read and write, with every offset checked at
//! compile time against the values measured with `offsetof` (reference: ibverbs-abi.md
//! section 2). Only the fields this library uses are named; the rest are reserved bytes of
//! the right size.

#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub struct IbvDevice {
    pub _ops: [usize; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// Index of each data-path pointer in `struct ibv_context_ops` (byte offset / 8).
pub mod ops {
    pub const ALLOC_MW: usize = 56 / 8;
    pub const BIND_MW: usize = 64 / 8;
    pub const DEALLOC_MW: usize = 72 / 8;
    pub const POLL_CQ: usize = 88 / 8;
    pub const REQ_NOTIFY_CQ: usize = 96 / 8;
    pub const POST_SRQ_RECV: usize = 160 / 8;
    pub const POST_SEND: usize = 200 / 8;
    pub const POST_RECV: usize = 208 / 8;
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    /// `struct ibv_context_ops`: 32 function pointers (see [`ops`]).
    pub ops: [usize; 32],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub _pad: u32,
    pub mutex: [u8; 40],
    /// `(void *)UINTPTR_MAX` marks a `struct verbs_context` around this one.
    pub abi_compat: *mut c_void,
}

/// Index of each extended op in the part of `struct verbs_context` before the embedded
/// `ibv_context` (byte offset / 8).
pub mod ext {
    pub const QUERY_PORT: usize = 0;
    pub const ALLOC_PARENT_DOMAIN: usize = 112 / 8;
    pub const ALLOC_TD: usize = 128 / 8;
    pub const CREATE_CQ_EX: usize = 200 / 8;
    pub const QUERY_DEVICE_EX: usize = 216 / 8;
    pub const CREATE_QP_EX: usize = 264 / 8;
    /// Words before the embedded context: 39 op slots, then `sz`.
    pub const WORDS: usize = 39;
    /// `sizeof(struct verbs_context)`.
    pub const SIZE: usize = 648;
}

/// `struct ibv_pd` (16 bytes).
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
    pub _pad: u32,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
    pub _pad: u32,
}

/// `struct ibv_comp_channel` (16 bytes).
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: [u8; 40],
    pub cond: [u8; 48],
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: [u8; 40],
    pub cond: [u8; 48],
    pub events_completed: u32,
    pub _pad: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub _pad: u32,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub _pad: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub _pad: u8,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub _pad: u8,
    pub rate_limit: u32,
    pub _pad2: u32,
}

/// `struct ibv_ah` (24 bytes).
#[repr(C)]
pub struct IbvAh {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub _pad: u32,
}

/// `struct ibv_grh` (40 bytes; the area before a UD receive's payload).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGrh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
}

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Immediate data in network byte order (or the rkey to invalidate).
    pub imm_data: u32,
    /// `wr.rdma`: `remote_addr` (word 0) and `rkey` (low half of word 1); `wr.atomic`:
    /// `remote_addr`, `compare_add`, `swap` (words 0..=2) and `rkey` (low half of word 3);
    /// `wr.ud` overlays the same 32 bytes.
    pub wr: [u64; 4],
    pub qp_type: [u32; 2],
    pub _tail: [u64; 6],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub _pad: u32,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order (or, with IBV_WC_WITH_INV, the invalidated rkey in host order).
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub _pad: u16,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    pub _pad: u32,
}

/// `struct ibv_port_attr` (52 bytes; the exported IBVERBS_1.1 `ibv_query_port` writes only
/// the first 48, the size of the old `_compat_ibv_port_attr`).
#[repr(C)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub _pad: u16,
}

/// The size the IBVERBS_1.1 `ibv_query_port` may write.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `struct ibv_gid_entry` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGidEntry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
pub struct IbvAsyncEvent {
    pub element: *mut c_void,
    pub event_type: u32,
    pub _pad: u32,
}

/// Compile-time checks of a structure's size and field offsets (also used by `abi_ex`).
macro_rules! check {
    ($t:ty, $size:expr, $($field:ident = $off:expr),* $(,)?) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        $(const _: () = assert!(core::mem::offset_of!($t, $field) == $off);)*
    };
}
pub(crate) use check;

check!(
    IbvDevice,
    664,
    node_type = 16,
    transport_type = 20,
    name = 24,
    dev_name = 88,
    dev_path = 152,
    ibdev_path = 408
);
check!(
    IbvContext,
    328,
    device = 0,
    ops = 8,
    cmd_fd = 264,
    async_fd = 268,
    num_comp_vectors = 272,
    mutex = 280,
    abi_compat = 320
);
check!(IbvPd, 16, context = 0, handle = 8);
check!(
    IbvMr,
    48,
    context = 0,
    pd = 8,
    addr = 16,
    length = 24,
    handle = 32,
    lkey = 36,
    rkey = 40
);
check!(IbvCompChannel, 16, context = 0, fd = 8, refcnt = 12);
check!(
    IbvCq,
    128,
    context = 0,
    channel = 8,
    cq_context = 16,
    handle = 24,
    cqe = 28,
    mutex = 32,
    cond = 72,
    comp_events_completed = 120,
    async_events_completed = 124
);
check!(
    IbvQp,
    160,
    context = 0,
    qp_context = 8,
    pd = 16,
    send_cq = 24,
    recv_cq = 32,
    srq = 40,
    handle = 48,
    qp_num = 52,
    state = 56,
    qp_type = 60,
    mutex = 64,
    cond = 104,
    events_completed = 152
);
check!(
    IbvQpInitAttr,
    64,
    qp_context = 0,
    send_cq = 8,
    recv_cq = 16,
    srq = 24,
    cap = 32,
    qp_type = 52,
    sq_sig_all = 56
);
check!(
    IbvAhAttr,
    32,
    grh = 0,
    dlid = 24,
    sl = 26,
    src_path_bits = 27,
    static_rate = 28,
    is_global = 29,
    port_num = 30
);
check!(
    IbvGlobalRoute,
    24,
    dgid = 0,
    flow_label = 16,
    sgid_index = 20,
    hop_limit = 21,
    traffic_class = 22
);
check!(
    IbvQpAttr,
    144,
    qp_state = 0,
    cur_qp_state = 4,
    path_mtu = 8,
    path_mig_state = 12,
    qkey = 16,
    rq_psn = 20,
    sq_psn = 24,
    dest_qp_num = 28,
    qp_access_flags = 32,
    cap = 36,
    ah_attr = 56,
    alt_ah_attr = 88,
    pkey_index = 120,
    alt_pkey_index = 122,
    en_sqd_async_notify = 124,
    sq_draining = 125,
    max_rd_atomic = 126,
    max_dest_rd_atomic = 127,
    min_rnr_timer = 128,
    port_num = 129,
    timeout = 130,
    retry_cnt = 131,
    rnr_retry = 132,
    alt_port_num = 133,
    alt_timeout = 134,
    rate_limit = 136
);
check!(IbvSge, 16, addr = 0, length = 8, lkey = 12);
check!(
    IbvSendWr,
    128,
    wr_id = 0,
    next = 8,
    sg_list = 16,
    num_sge = 24,
    opcode = 28,
    send_flags = 32,
    imm_data = 36,
    wr = 40,
    qp_type = 72,
    _tail = 80
);
check!(
    IbvRecvWr,
    32,
    wr_id = 0,
    next = 8,
    sg_list = 16,
    num_sge = 24
);
check!(
    IbvWc,
    48,
    wr_id = 0,
    status = 8,
    opcode = 12,
    vendor_err = 16,
    byte_len = 20,
    imm_data = 24,
    qp_num = 28,
    src_qp = 32,
    wc_flags = 36,
    pkey_index = 40,
    slid = 42,
    sl = 44,
    dlid_path_bits = 45
);
check!(
    IbvDeviceAttr,
    232,
    fw_ver = 0,
    node_guid = 64,
    sys_image_guid = 72,
    max_mr_size = 80,
    page_size_cap = 88,
    vendor_id = 96,
    vendor_part_id = 100,
    hw_ver = 104,
    max_qp = 108,
    max_qp_wr = 112,
    device_cap_flags = 116,
    max_sge = 120,
    max_sge_rd = 124,
    max_cq = 128,
    max_cqe = 132,
    max_mr = 136,
    max_pd = 140,
    max_qp_rd_atom = 144,
    max_ee_rd_atom = 148,
    max_res_rd_atom = 152,
    max_qp_init_rd_atom = 156,
    atomic_cap = 164,
    max_srq = 212,
    max_srq_wr = 216,
    max_pkeys = 224,
    local_ca_ack_delay = 226,
    phys_port_cnt = 227
);
check!(
    IbvPortAttr,
    52,
    state = 0,
    max_mtu = 4,
    active_mtu = 8,
    gid_tbl_len = 12,
    port_cap_flags = 16,
    max_msg_sz = 20,
    bad_pkey_cntr = 24,
    qkey_viol_cntr = 28,
    pkey_tbl_len = 32,
    lid = 34,
    sm_lid = 36,
    lmc = 38,
    max_vl_num = 39,
    sm_sl = 40,
    subnet_timeout = 41,
    init_type_reply = 42,
    active_width = 43,
    active_speed = 44,
    phys_state = 45,
    link_layer = 46,
    flags = 47,
    port_cap_flags2 = 48
);
check!(
    IbvGidEntry,
    32,
    gid = 0,
    gid_index = 16,
    port_num = 20,
    gid_type = 24,
    ndev_ifindex = 28
);
check!(IbvAsyncEvent, 16, element = 0, event_type = 8);
check!(IbvAh, 24, context = 0, pd = 8, handle = 16);
check!(IbvGrh, 40, paylen = 4, sgid = 8, dgid = 24);

// Enum values (verbs.h).
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_MTU_1024: u32 = 3;
pub const IBV_MTU_4096: u32 = 5;
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UC: u32 = 3;
pub const IBV_QPT_UD: u32 = 4;
/// `enum ibv_event_type`: a CQ overran.
pub const IBV_EVENT_CQ_ERR: u32 = 0;
/// `enum ibv_event_type`: a QP went to ERR on its own.
pub const IBV_EVENT_QP_FATAL: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `ibv_gid_type_sysfs` (the private `ibv_query_gid_type`): RoCE v2.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
/// A SEND that invalidates the responder's window of `invalidate_rkey` (host order, in
/// `imm_data`'s place).
pub const IBV_WR_SEND_WITH_INV: u32 = 9;

/// `enum ibv_atomic_cap`: atomic among the users of this device (and not against the CPU).
pub const IBV_ATOMIC_HCA: u32 = 1;

pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_SEND_SOLICITED: u32 = 4;
pub const IBV_SEND_INLINE: u32 = 8;

/// `wc_flags`: the receive buffer starts with a GRH area.
pub const IBV_WC_GRH: u32 = 1;
/// The GRH area before a UD receive's payload (`struct ibv_grh`).
pub const GRH_LEN: usize = size_of::<IbvGrh>();

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct IbvSrq {
    pub context: *mut IbvContext,
    pub srq_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub _pad: u32,
    pub mutex: [u8; 40],
    pub cond: [u8; 48],
    pub events_completed: u32,
    pub _pad2: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
    pub _pad: u32,
}

check!(
    IbvSrq,
    128,
    context = 0,
    srq_context = 8,
    pd = 16,
    handle = 24,
    mutex = 32,
    cond = 72,
    events_completed = 120
);
check!(IbvSrqAttr, 12, max_wr = 0, max_sge = 4, srq_limit = 8);
check!(IbvSrqInitAttr, 24, srq_context = 0, attr = 8);
