//! The librdmacm ABI on x86_64 / LP64: the structures of `<rdma/rdma_cma.h>` (rdma-core 44)
//! that applications and the inline helpers of `<rdma/rdma_verbs.h>` read and write, and
//! the few verbs structures this library passes to libibverbs. Every size and offset is
//! checked at compile time against the values measured with `offsetof`; the test
//! `tests/abi_layout.rs` measures them again from the installed headers.

#![allow(missing_docs)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

/// `struct sockaddr_storage`: 128 bytes, 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct SockaddrStorage(pub [u8; 128]);

impl Default for SockaddrStorage {
    fn default() -> Self {
        SockaddrStorage([0; 128])
    }
}

/// `struct rdma_ib_addr` (40 bytes): the GIDs and P_Key of a route.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RdmaIbAddr {
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    /// Big-endian.
    pub pkey: u16,
    pub _pad: [u8; 6],
}

/// `struct rdma_addr` (296 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RdmaAddr {
    pub src: SockaddrStorage,
    pub dst: SockaddrStorage,
    pub ib: RdmaIbAddr,
}

/// `struct ibv_sa_path_rec` (64 bytes, `<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSaPathRec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub _pad0: u16,
    pub reversible: c_int,
    pub numb_path: u8,
    pub _pad1: u8,
    /// Big-endian.
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route` (312 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaRoute {
    pub addr: RdmaAddr,
    pub path_rec: *mut IbvSaPathRec,
    pub num_paths: c_int,
    pub _pad: u32,
}

/// `struct rdma_event_channel` (4 bytes): the fd applications poll.
#[repr(C)]
pub struct RdmaEventChannel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
pub struct RdmaCmId {
    pub verbs: *mut c_void,
    pub channel: *mut RdmaEventChannel,
    pub context: *mut c_void,
    pub qp: *mut IbvQp,
    pub route: RdmaRoute,
    pub ps: u32,
    pub port_num: u8,
    pub event: *mut RdmaCmEvent,
    pub send_cq_channel: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq_channel: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub pd: *mut c_void,
    pub qp_type: u32,
}

/// `struct rdma_conn_param` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RdmaConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub _pad: u8,
    pub qp_num: u32,
    pub _pad2: u32,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
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
#[derive(Clone, Copy, Default, Debug)]
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

/// `struct rdma_ud_param` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RdmaUdParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub _pad: [u8; 7],
    pub ah_attr: IbvAhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union RdmaEventParam {
    pub conn: RdmaConnParam,
    pub ud: RdmaUdParam,
}

/// `struct rdma_cm_event` (80 bytes).
#[repr(C)]
pub struct RdmaCmEvent {
    pub id: *mut RdmaCmId,
    pub listen_id: *mut RdmaCmId,
    pub event: c_int,
    pub status: c_int,
    pub param: RdmaEventParam,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
pub struct RdmaAddrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut RdmaAddrinfo,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub _pad: u32,
}

/// `struct ibv_qp_init_attr_ex` (136 bytes): the part up to `pd` is read; a mask bit past
/// `IBV_QP_INIT_ATTR_PD` is refused.
#[repr(C)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
    pub _rest: [u64; 8],
}

/// The head of `struct ibv_qp` (160 bytes): the fields this library reads.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut c_void,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
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

/// `struct ibv_srq_init_attr` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub _pad: u32,
}

/// `struct ibv_srq_init_attr_ex` (64 bytes).
#[repr(C)]
pub struct IbvSrqInitAttrEx {
    pub srq_context: *mut c_void,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub _pad: u32,
    pub pd: *mut c_void,
    pub xrcd: *mut c_void,
    pub cq: *mut c_void,
    pub tm_cap: [u32; 2],
}

/// `struct ibv_port_attr` (52 bytes, 4-aligned).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub _rest: [u32; 9],
}

/// `struct ibv_device_attr` (232 bytes): the read-atomic limits this library clamps to.
#[repr(C)]
pub struct IbvDeviceAttr {
    pub _head: [u64; 18],
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub _tail: [u64; 9],
}

// Event types (`enum rdma_cm_event_type`).
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_int = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_int = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_int = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

// Port spaces (`enum rdma_port_space`).
pub const RDMA_PS_IPOIB: u32 = 0x0002;
pub const RDMA_PS_TCP: u32 = 0x0106;
pub const RDMA_PS_UDP: u32 = 0x0111;
pub const RDMA_PS_IB: u32 = 0x013F;

/// The Q_Key of RDMA_PS_UDP and RDMA_PS_IPOIB QPs.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

// `rdma_set_option` levels and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`: "as many as the device allows".
pub const RDMA_MAX_RD: u8 = 0xFF;

// Verbs constants.
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPT_UD: u32 = 4;
pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;
pub const IBV_MTU_4096: u32 = 5;
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 2;
pub const IBV_SRQT_BASIC: u32 = 0;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;

/// `enum ibv_qp_attr_mask` bits.
pub mod mask {
    use core::ffi::c_int;
    pub const STATE: c_int = 1;
    pub const ACCESS_FLAGS: c_int = 8;
    pub const PKEY_INDEX: c_int = 16;
    pub const PORT: c_int = 32;
    pub const QKEY: c_int = 64;
    pub const AV: c_int = 128;
    pub const PATH_MTU: c_int = 256;
    pub const TIMEOUT: c_int = 512;
    pub const RETRY_CNT: c_int = 1024;
    pub const RNR_RETRY: c_int = 2048;
    pub const RQ_PSN: c_int = 4096;
    pub const MAX_QP_RD_ATOMIC: c_int = 8192;
    pub const MIN_RNR_TIMER: c_int = 32768;
    pub const SQ_PSN: c_int = 65536;
    pub const MAX_DEST_RD_ATOMIC: c_int = 131072;
    pub const DEST_QPN: c_int = 1 << 20;
}

/// The name of every `rdma_cm_event_type`, as `rdma_event_str` returns them.
pub const EVENT_NAMES: [&str; 16] = [
    "RDMA_CM_EVENT_ADDR_RESOLVED\0",
    "RDMA_CM_EVENT_ADDR_ERROR\0",
    "RDMA_CM_EVENT_ROUTE_RESOLVED\0",
    "RDMA_CM_EVENT_ROUTE_ERROR\0",
    "RDMA_CM_EVENT_CONNECT_REQUEST\0",
    "RDMA_CM_EVENT_CONNECT_RESPONSE\0",
    "RDMA_CM_EVENT_CONNECT_ERROR\0",
    "RDMA_CM_EVENT_UNREACHABLE\0",
    "RDMA_CM_EVENT_REJECTED\0",
    "RDMA_CM_EVENT_ESTABLISHED\0",
    "RDMA_CM_EVENT_DISCONNECTED\0",
    "RDMA_CM_EVENT_DEVICE_REMOVAL\0",
    "RDMA_CM_EVENT_MULTICAST_JOIN\0",
    "RDMA_CM_EVENT_MULTICAST_ERROR\0",
    "RDMA_CM_EVENT_ADDR_CHANGE\0",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
];

/// Every size and offset this module promises, as `(C expression, ours, measured)`: the
/// value measured with `sizeof`/`offsetof` on Debian 12 (rdma-core 44, x86_64) is checked
/// here at compile time, and the layout test evaluates each C expression again against the
/// installed headers.
macro_rules! layout {
    ($($c:literal $t:ty $(= $size:literal)? { $($cf:literal $f:ident = $off:literal),* $(,)? })*) => {
        pub const LAYOUT: &[(&str, usize, usize)] = &[$(
            $((concat!("sizeof(struct ", $c, ")"), size_of::<$t>(), $size),)?
            $((concat!("offsetof(struct ", $c, ", ", $cf, ")"), offset_of!($t, $f), $off),)*
        )*];
    };
}

layout! {
    "rdma_cm_id" RdmaCmId = 416 {
        "qp" qp = 24, "route" route = 32, "ps" ps = 344, "port_num" port_num = 348,
        "event" event = 352, "send_cq" send_cq = 368, "recv_cq" recv_cq = 384, "srq" srq = 392,
        "pd" pd = 400, "qp_type" qp_type = 408,
    }
    "rdma_route" RdmaRoute = 312 { "path_rec" path_rec = 296, "num_paths" num_paths = 304 }
    "rdma_addr" RdmaAddr = 296 { "dst_addr" dst = 128, "addr" ib = 256 }
    "rdma_ib_addr" RdmaIbAddr = 40 { "pkey" pkey = 32 }
    "ibv_sa_path_rec" IbvSaPathRec = 64 {
        "dlid" dlid = 32, "flow_label" flow_label = 40, "reversible" reversible = 48,
        "pkey" pkey = 54, "mtu" mtu = 58, "preference" preference = 63,
    }
    "rdma_event_channel" RdmaEventChannel = 4 {}
    "rdma_conn_param" RdmaConnParam = 24 {
        "private_data_len" private_data_len = 8, "rnr_retry_count" rnr_retry_count = 13,
        "srq" srq = 14, "qp_num" qp_num = 16,
    }
    "rdma_ud_param" RdmaUdParam = 56 { "ah_attr" ah_attr = 16, "qp_num" qp_num = 48, "qkey" qkey = 52 }
    "rdma_cm_event" RdmaCmEvent = 80 {
        "listen_id" listen_id = 8, "event" event = 16, "status" status = 20, "param" param = 24,
    }
    "rdma_addrinfo" RdmaAddrinfo = 96 {
        "ai_src_len" ai_src_len = 16, "ai_src_addr" ai_src_addr = 24, "ai_dst_addr" ai_dst_addr = 32,
        "ai_route_len" ai_route_len = 56, "ai_connect" ai_connect = 80, "ai_next" ai_next = 88,
    }
    "ibv_ah_attr" IbvAhAttr = 32 { "is_global" is_global = 29, "port_num" port_num = 30 }
    "ibv_global_route" IbvGlobalRoute = 24 { "sgid_index" sgid_index = 20, "traffic_class" traffic_class = 22 }
    "ibv_qp_attr" IbvQpAttr = 144 {
        "qkey" qkey = 16, "qp_access_flags" qp_access_flags = 32, "ah_attr" ah_attr = 56,
        "pkey_index" pkey_index = 120, "max_rd_atomic" max_rd_atomic = 126,
        "min_rnr_timer" min_rnr_timer = 128, "rnr_retry" rnr_retry = 132, "rate_limit" rate_limit = 136,
    }
    "ibv_qp_init_attr" IbvQpInitAttr = 64 { "cap" cap = 32, "qp_type" qp_type = 52, "sq_sig_all" sq_sig_all = 56 }
    "ibv_qp_init_attr_ex" IbvQpInitAttrEx = 136 { "comp_mask" comp_mask = 60, "pd" pd = 64 }
    "ibv_qp" IbvQp { "qp_num" qp_num = 52, "qp_type" qp_type = 60 }
    "ibv_srq_init_attr" IbvSrqInitAttr = 24 {}
    "ibv_srq_init_attr_ex" IbvSrqInitAttrEx = 64 { "comp_mask" comp_mask = 20, "pd" pd = 32, "cq" cq = 48 }
    "ibv_port_attr" IbvPortAttr = 52 { "active_mtu" active_mtu = 8 }
    "ibv_device_attr" IbvDeviceAttr = 232 {
        "max_qp_rd_atom" max_qp_rd_atom = 144, "max_qp_init_rd_atom" max_qp_init_rd_atom = 156,
    }
}

const _: () = {
    let mut i = 0;
    while i < LAYOUT.len() {
        assert!(
            LAYOUT[i].1 == LAYOUT[i].2,
            "a structure does not match rdma-core 44"
        );
        i += 1;
    }
};
