//! The device's limits: what ibv_query_device reports and the verbs enforce. They are the
//! emulated card's real ones, or the library's where the library does the work (several
//! SGEs, inline data, SRQs, UD).

use core::ffi::c_int;

use bluerdma_linux::storage::Capacity;

/// The card's table sizes, and the shared queue tables.
pub(crate) fn capacity() -> Capacity {
    Capacity::default()
}

/// Send requests and receive WRs one QP may ask for (`max_qp_wr`): with 6 SGEs per request
/// the send queue of the deepest QP still fits the device's send table.
pub(crate) const MAX_QP_WR: u32 = 8192;
/// Completions one CQ may ask for (`max_cqe`); the device's completion table holds two.
pub(crate) const MAX_CQE: u32 = 65536;
/// Outstanding RDMA READs a QP may have (initiator and responder).
pub(crate) const MAX_RD_ATOM: u8 = bluerdma_core::qp::MAX_RD_ATOMIC;
/// The largest message (the card's 32-bit length).
pub(crate) const MAX_MSG: u32 = 1 << 31;

/// Inline data up to this many bytes per RC send request (what UCX asks for).
pub(crate) const MAX_INLINE: u32 = 64;
/// SGEs per RC send request (split or gathered by the library; receive WRs take one).
pub(crate) const MAX_SGE: usize = 6;

/// Protection domains (the engine's table: 1..=255).
pub(crate) const MAX_PD: u32 = 255;
/// Shared receive queues (pools of this library; a limit it enforces).
pub(crate) const MAX_SRQ: u32 = 1024;

/// Receive WRs an SRQ holds.
pub(crate) const MAX_SRQ_WR: u32 = 16384;

/// SGEs per UD work request, both ways.
pub(crate) const UD_MAX_SGE: u32 = 8;
/// Receive WRs a UD QP may hold.
pub(crate) const UD_MAX_RECV_WR: u32 = 16384;
/// Address handles per process (each is a small box; a limit this library enforces).
pub(crate) const MAX_AH: c_int = 1 << 16;

/// GID table: indexes 0 and 3 (the one NCCL picks on RoCE v2 / IPv4 hosts) hold the
/// device's IPv4-mapped address; 1 and 2 are empty.
pub(crate) const GID_TABLE_LEN: u32 = 4;
/// The indexes of the GID table that hold the device's GID.
pub(crate) const GID_INDEXES: [u32; 2] = [0, 3];
