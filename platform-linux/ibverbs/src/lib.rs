//! `libibverbs.so.1` for the blue-rdma driver: unmodified ibverbs programs (ibv_devinfo,
//! ibv_rc_pingpong, perftest, anything that links libibverbs) run on the driver and its
//! emulated NIC, with no kernel module, found through `LD_LIBRARY_PATH`.
//!
//! - Devices are the list of [`bluerdma_linux::devices`] (`BLUERDMA_DEVICES`; by default
//!   `bluerdma0` at 127.0.0.1 and `bluerdma1` at 127.0.0.2), each on its backend: the
//!   emulated card (no suffix), the RTL simulator (`+rtl`) or the PCI card (`+pci`).
//!   Opening one costs nothing; its engine (and the emulated card's UDP link on
//!   `<ip>:4791`, the out-of-band listener on `<ip>:60000` or `BLUERDMA_OOB_PORT`) starts
//!   with the first object made on it, so `ibv_devinfo` works while another process uses
//!   the device. A device that cannot open prints why and the fix once, and the verb fails
//!   with the errno of [`bluerdma_linux::OpenError`] (EACCES, ENODEV, ENOMEM, ...).
//! - The port is RoCE: Ethernet link layer, ACTIVE, LID 0, GID 0 and 3 are the device's
//!   IPv4-mapped address (RoCE v2). Connect QPs with a GID (`ibv_rc_pingpong -g 0`).
//! - RC QPs with up to 6 SGEs per send request: RDMA WRITE (with immediate), READ, SEND
//!   (with immediate); atomic compare-and-swap and fetch-and-add (IBV_ATOMIC_HCA: executed
//!   by the responder's driver); completion channels; shared receive queues; UD QPs and address
//!   handles (datagrams of up to 1978 bytes through the simple NIC).
//! - Parent domains (`parent_domain`), ibv_rereg_mr in place (`mr`), memory windows of
//!   type 1 and 2 (`mw`), UC QPs carried as RC (`uc`), raw packet QPs on the simple NIC
//!   (`raw_qp`); remote access errors the card does not report come from the engine's
//!   access checks (REM_ACCESS_ERR, REM_OP_ERR after one timeout).
//! - The extended verbs: ibv_create_qp_ex with the `ibv_wr_*` post API (the same post path
//!   as ibv_post_send), ibv_create_cq_ex with ibv_start_poll / ibv_next_poll /
//!   ibv_end_poll and the standard `ibv_wc_read_*` fields, ibv_query_device_ex (no ODP,
//!   TSO, PCI atomics or timestamps; the device says so). Everything else the
//!   installed libibverbs exports is present (programs and provider libraries are
//!   BIND_NOW) and fails with EOPNOTSUPP and a log line when called.
//! - `BLUERDMA_LOG=error|warn|info|debug` sets what is printed on stderr (default warn).
//!
//! The exported names and version nodes come from the installed libibverbs at build time
//! (see build.rs); the structures' layout is checked at compile time ([`abi`]).
//!
//! # Layers
//!
//! Each module uses only modules of the layers above it in this list (and earlier ones of
//! its own layer); none reaches up.
//!
//! 1. The C ABI and how a verb fails:
//!    - [`abi`]: the structures and constants of `<infiniband/verbs.h>`, offsets checked.
//!    - [`abi_ex`]: the extended verbs' structures (`ibv_qp_ex`, `ibv_cq_ex`, the `_ex`
//!      attributes), offsets checked.
//!    - `errors`: errno, the engine error -> errno map, NULL and `bad_wr` reporting.
//!    - `logging`: the stderr logger (`BLUERDMA_LOG`).
//!    - `handle`: verb objects are boxes whose first field is the `ibv_*` structure.
//!    - `live`: the objects handed out and not taken back (stale pointers are refused,
//!      ibv_close_device destroys what a context left).
//!    - `sge`: reading scatter/gather lists and copying their bytes.
//!    - `caps`: the device's limits, reported and enforced.
//!    - `av`: address vectors: the peer they name, and the seed driver's habits.
//!    - `names`: the `*_str` verbs and the static rate conversions.
//!    - `stubs`: the exported verbs this library does not implement (build.rs lists them).
//! 2. The device table:
//!    - `device`: the devices of this process and the device-list verbs.
//!    - `context`: an opened device, the engine it starts on its backend, async events.
//!    - `port`: the device, port, GID and P_Key queries.
//!    - `device_ex`: ibv_query_device_ex, and the thread domains it refuses.
//! 3. Objects:
//!    - `pd`: protection domains and their table of registered regions.
//!    - `parent_domain`: parent domains (a PD with the application's allocators).
//!    - `mr`: memory regions (and the fork verbs).
//!    - `channel`: completion channels.
//!    - `srq`: shared receive queues: the pool, the QPs it feeds, the SRQ verbs.
//!    - `rc_scatter`: RC receive WRs of several SGEs, through a bounce ring.
//!    - `cq`: completion queues and their channel events.
//!    - `qp_base`: what RC and UD QPs share (type, CQs, initial `ibv_qp`).
//!    - `wr_batch`: a QP's `ibv_qp_ex` part and the requests `ibv_wr_*` build.
//!    - `rc_rings`: an RC QP's inline and gather rings.
//!    - `uc`: UC QPs, carried as RC (the card reports no UC packet).
//!    - `rc_qp`: RC and UC QPs: create, modify, query (the one reader of the engine's QP
//!      query).
//!    - `ah`: address handles.
//!    - `ud_reassembly`: UD datagrams of several frames put back together.
//!    - `ud_rx`: the UD receive side: the per-engine frame dispatcher, a QP's receive queue.
//!    - `ud_qp`: UD QPs: create, modify, query.
//!    - `raw_qp`: raw packet QPs: whole Ethernet frames through the simple NIC.
//! 4. The post and poll paths:
//!    - `mw`: memory windows, their binds and invalidations (local operations of the RC
//!      send queue).
//!    - `rc_post`: ibv_post_send (split, gathered, inline) and ibv_post_recv on RC QPs.
//!    - `srq_post`: ibv_post_srq_recv.
//!    - `ud_post`: ibv_post_send (one datagram each) and ibv_post_recv on UD QPs.
//!    - `poll`: ibv_poll_cq and ibv_req_notify_cq.
//!    - `cq_ex`: ibv_create_cq_ex and the extended CQ's start/next/end poll and read_*.
//! 5. The entries that choose between RC and UD:
//!    - `qp`: the QP verbs (create, destroy, modify, query) and the post entries.
//!    - `qp_ex`: ibv_create_qp_ex and the `ibv_wr_*` functions of an extended QP.
//!    - `async_events`: the engine's events, to the async file of the context that owns
//!      the object.
//!    - `ops`: ibv_open_device / ibv_close_device and the context's function tables.

// Exported functions take raw pointers from C callers; each documents its contract in the
// verbs man pages rather than in Rust `# Safety` sections.
#![allow(clippy::missing_safety_doc)]

// 1. The C ABI and how a verb fails.
pub mod abi;
pub mod abi_ex;
mod av;
mod caps;
mod errors;
mod handle;
mod live;
mod logging;
mod names;
mod sge;
mod stubs;
// 2. The device table.
mod context;
mod device;
mod device_ex;
mod port;
// 3. Objects.
mod ah;
mod channel;
mod cq;
mod mr;
mod mw;
mod parent_domain;
mod pd;
mod qp_base;
mod raw_qp;
mod rc_qp;
mod rc_rings;
mod rc_scatter;
mod srq;
mod uc;
mod ud_qp;
mod ud_reassembly;
mod ud_rx;
mod wr_batch;
// 4. The post and poll paths.
mod cq_ex;
mod poll;
mod rc_post;
mod srq_post;
mod ud_post;
// 5. The entries that choose between RC and UD.
mod async_events;
mod ops;
mod qp;
mod qp_ex;

std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));
include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
