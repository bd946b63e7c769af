//! The RDMA WRITE, through `ibverbs-sys` (the raw bindings of the rust-ibverbs project).
//!
//! rust-ibverbs 0.9 (the newest on crates.io) posts only SENDs and RECVs: its `QueuePair`
//! has no WRITE and no access to the `ibv_qp` it wraps. So this half makes its own
//! context, PD, CQ, QP and MR on each device with the same bindings the crate is built on,
//! and posts the WRITE the way the crate posts its SEND (through `context->ops.post_send`,
//! the dispatch of verbs.h's inline `ibv_post_send`).

use std::ffi::CStr;
use std::ptr;

use eco_common::wait_for;
use ibverbs_sys as ffi;

const PORT: u8 = 1;
const GID_INDEX: u8 = 0;

/// One device's objects, destroyed in reverse order on drop.
pub struct RawSide {
    pub name: String,
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    mr: *mut ffi::ibv_mr,
    /// The registered bytes (the MR's memory; never reallocated while `mr` lives).
    pub buf: Vec<u8>,
    gid: ffi::ibv_gid,
    mtu: ffi::ibv_mtu,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl RawSide {
    /// Opens `name` and makes a PD, a CQ, an RC QP and an MR over `buf`.
    pub fn open(name: &str, buf: Vec<u8>) -> Result<RawSide, String> {
        let mut side = RawSide {
            name: name.to_string(),
            ctx: ptr::null_mut(),
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            mr: ptr::null_mut(),
            buf,
            gid: ffi::ibv_gid::default(),
            mtu: ffi::IBV_MTU_1024,
        };
        // SAFETY: plain libibverbs calls; every pointer passed is either one the library
        // returned (checked non-null) or a live local; `side`'s Drop releases what exists.
        unsafe {
            let mut n = 0;
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() {
                return Err(format!("raw: ibv_get_device_list: {}", errno()));
            }
            let devs = std::slice::from_raw_parts(list, n.max(0) as usize);
            let dev = devs.iter().copied().find(|&d| {
                CStr::from_ptr(ffi::ibv_get_device_name(d)).to_bytes() == name.as_bytes()
            });
            side.ctx = dev.map_or(ptr::null_mut(), |d| ffi::ibv_open_device(d));
            ffi::ibv_free_device_list(list);
            if side.ctx.is_null() {
                return Err(format!("raw: cannot open {name}"));
            }
            let mut port = ffi::ibv_port_attr::default();
            let rc = ffi::ibv_query_port(side.ctx, PORT, &mut port as *mut _ as *mut _);
            if rc != 0 {
                return Err(format!("raw: {name}: ibv_query_port: errno {rc}"));
            }
            side.mtu = port.active_mtu;
            if ffi::ibv_query_gid(side.ctx, PORT, GID_INDEX.into(), &mut side.gid) != 0 {
                return Err(format!("raw: {name}: ibv_query_gid: {}", errno()));
            }
            side.pd = ffi::ibv_alloc_pd(side.ctx);
            if side.pd.is_null() {
                return Err(format!("raw: {name}: ibv_alloc_pd: {}", errno()));
            }
            side.cq = ffi::ibv_create_cq(side.ctx, 8, ptr::null_mut(), ptr::null_mut(), 0);
            if side.cq.is_null() {
                return Err(format!("raw: {name}: ibv_create_cq: {}", errno()));
            }
            let mut init = ffi::ibv_qp_init_attr {
                qp_context: ptr::null_mut(),
                send_cq: side.cq,
                recv_cq: side.cq,
                srq: ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            side.qp = ffi::ibv_create_qp(side.pd, &mut init);
            if side.qp.is_null() {
                return Err(format!("raw: {name}: ibv_create_qp: {}", errno()));
            }
            let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
            side.mr = ffi::ibv_reg_mr(
                side.pd,
                side.buf.as_mut_ptr().cast(),
                side.buf.len(),
                access.0 as i32,
            );
            if side.mr.is_null() {
                return Err(format!("raw: {name}: ibv_reg_mr: {}", errno()));
            }
        }
        Ok(side)
    }

    /// The QP number, the GID, the buffer's address and the MR's rkey: what the peer needs.
    pub fn endpoint(&self) -> (u32, ffi::ibv_gid, u64, u32) {
        // SAFETY: `qp` and `mr` are live objects `open` created.
        unsafe {
            (
                (*self.qp).qp_num,
                self.gid,
                self.buf.as_ptr() as u64,
                (*self.mr).rkey,
            )
        }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        step: &str,
    ) -> Result<(), String> {
        // SAFETY: `qp` is live; `attr` is a live local.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!(
                "raw: {}: modify_qp to {step}: errno {rc}",
                self.name
            ))
        }
    }

    /// INIT, RTR towards the peer's QPN/GID (its send PSN is `peer_psn`), RTS with `psn`.
    pub fn connect(
        &self,
        peer_qpn: u32,
        peer_gid: ffi::ibv_gid,
        peer_psn: u32,
        psn: u32,
    ) -> Result<(), String> {
        use ffi::ibv_qp_attr_mask as m;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            port_num: PORT,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0,
            ..Default::default()
        };
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut attr, mask, "INIT")?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.mtu,
            dest_qp_num: peer_qpn,
            rq_psn: peer_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.ah_attr.port_num = PORT;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = peer_gid;
        attr.ah_attr.grh.sgid_index = GID_INDEX;
        attr.ah_attr.grh.hop_limit = 64;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "RTR")?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "RTS")
    }

    /// Posts a signaled RDMA WRITE of the first `len` bytes of `buf` to `remote_addr`/`rkey`.
    pub fn post_write(
        &mut self,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
    ) -> Result<(), String> {
        let mut sge = ffi::ibv_sge {
            addr: self.buf.as_ptr() as u64,
            length: len.min(self.buf.len()) as u32,
            // SAFETY: `mr` is live.
            lkey: unsafe { (*self.mr).lkey },
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            __bindgen_anon_1: Default::default(),
            wr: ffi::ibv_send_wr__bindgen_ty_2 {
                rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey },
            },
            qp_type: Default::default(),
            __bindgen_anon_2: Default::default(),
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` and its context are live; `wr` and `sge` outlive the call (the library
        // copies the WR); the SGE lies inside `mr`, which outlives the WRITE's completion.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            match ops.post_send {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => return Err(format!("raw: {}: context has no post_send", self.name)),
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("raw: {}: post_send WRITE: errno {rc}", self.name))
        }
    }

    /// Waits for one completion on the CQ.
    pub fn completion(&self) -> Result<ffi::ibv_wc, String> {
        // SAFETY: `cq` and its context are live; `wc` is a live local the library fills.
        let poll = || unsafe {
            let mut wc = ffi::ibv_wc::default();
            let ops = &(*(*self.cq).context).ops;
            let n = ops.poll_cq.map_or(-1, |p| p(self.cq, 1, &mut wc));
            match n {
                0 => Ok(None),
                1 => Ok(Some(wc)),
                _ => Err(format!("raw: {}: poll_cq returned {n}", self.name)),
            }
        };
        wait_for(&format!("WRITE completion on {}", self.name), poll)
    }
}

impl Drop for RawSide {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or an object `open` created and nothing else frees;
        // destroyed children first.
        unsafe {
            if !self.mr.is_null() {
                ffi::ibv_dereg_mr(self.mr);
            }
            if !self.qp.is_null() {
                ffi::ibv_destroy_qp(self.qp);
            }
            if !self.cq.is_null() {
                ffi::ibv_destroy_cq(self.cq);
            }
            if !self.pd.is_null() {
                ffi::ibv_dealloc_pd(self.pd);
            }
            if !self.ctx.is_null() {
                ffi::ibv_close_device(self.ctx);
            }
        }
    }
}
