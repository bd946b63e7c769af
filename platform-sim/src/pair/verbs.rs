//! The verbs a [`Pair`] wraps for its tests: buffers registered on a side (owned by the pair
//! until it is dropped), QPs created, modified and destroyed through the command clock
//! ([`super::with_command_clock`]), a whole connection in one call, posting and polling.

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{
    QpCaps, RecvWr, SendWr, VerbsError, WorkCompletion, READ_RESPONSE_ROOM,
};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::platform::DmaAllocator;
use bluerdma_core::qp::{Gid, QpAccessFlags, QpAttrMask, QpState, QpType, RawQpAttr};

use super::storage::PAIR_RECV_WRS;
use super::{Pair, PairError, Side, PAIR_IPS};

/// A registered buffer on one side, owned by the pair until it is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// The side it lives on.
    pub side: Side,
    /// Its key (lkey on its side, rkey for the peer).
    pub key: MrKey,
    /// Virtual address of its first byte.
    pub va: u64,
    /// Length in bytes.
    pub len: usize,
    buf: usize,
}

impl Mr {
    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> VirtAddr {
        VirtAddr(self.va + offset as u64)
    }
}

/// The attributes [`Pair::connect`] brings both QPs up with.
#[derive(Clone, Copy, Debug)]
pub struct QpOptions {
    /// Path MTU.
    pub pmtu: Pmtu,
    /// IB local ACK timeout exponent (4.096 us * 2^timeout; 0 = none).
    pub timeout: u8,
    /// Retransmissions before RETRY_EXC_ERR.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// IB RNR timer code (table 45).
    pub min_rnr_timer: u8,
    /// The first PSN each side sends (the peer's rq_psn).
    pub psn: [u32; 2],
    /// QP access flags.
    pub access: QpAccessFlags,
    /// READs each QP keeps outstanding (`max_rd_atomic`; 0: the peer's room, 16).
    pub max_rd_atomic: u8,
}

impl Default for QpOptions {
    fn default() -> Self {
        Self {
            pmtu: Pmtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            psn: [0, 0],
            access: QpAccessFlags::LOCAL_WRITE
                | QpAccessFlags::REMOTE_WRITE
                | QpAccessFlags::REMOTE_READ,
            max_rd_atomic: 0,
        }
    }
}

/// A connected QP pair and its objects, indexed by [`Side::index`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn {
    /// Protection domains.
    pub pd: [u32; 2],
    /// Send CQs.
    pub send_cq: [u32; 2],
    /// Receive CQs.
    pub recv_cq: [u32; 2],
    /// QPs.
    pub qp: [Qpn; 2],
}

impl Conn {
    /// The QP of `side`.
    pub fn qp(&self, side: Side) -> Qpn {
        self.qp[side.index()]
    }
}

impl Pair {
    /// Allocates `len` zeroed bytes on `side` and registers them on `pd` with `access`.
    pub fn reg_mr(
        &mut self,
        side: Side,
        pd: u32,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, PairError> {
        let buf = self
            .node(side)
            .dma
            .alloc(len, 4096)
            .map_err(VerbsError::from)?;
        let va = buf.cpu().as_ptr() as u64;
        let key = self.command(side, |dev, c| {
            dev.reg_mr(pd, VirtAddr(va), len as u64, access, c)
        });
        let node = self.node(side);
        match key {
            Ok(key) => {
                node.bufs.push(buf);
                Ok(Mr {
                    side,
                    key,
                    va,
                    len,
                    buf: node.bufs.len() - 1,
                })
            }
            Err(e) => {
                // SAFETY: `buf` came from this allocator and nothing refers to it: the
                // engine refused the registration.
                unsafe { node.dma.free(buf) };
                Err(e.into())
            }
        }
    }

    /// Deregisters `mr` (its bytes stay readable until the pair is dropped).
    pub fn dereg_mr(&mut self, mr: &Mr) -> Result<(), PairError> {
        Ok(self.command(mr.side, |dev, c| dev.dereg_mr(mr.key, c))?)
    }

    /// Re-registers `mr` in place with PD `pd` and `access` (same bytes); its key is the
    /// engine's answer (a new key byte when the PD changes).
    pub fn rereg_mr(&mut self, mr: &mut Mr, pd: u32, access: AccessFlags) -> Result<(), PairError> {
        let (key, va, len) = (mr.key, mr.va, mr.len);
        mr.key = self.command(mr.side, |dev, c| {
            dev.rereg_mr(key, pd, VirtAddr(va), len as u64, access, c)
        })?;
        Ok(())
    }

    /// Allocates a memory window on `side`'s PD `pd`.
    pub fn alloc_mw(&mut self, side: Side, pd: u32) -> Result<MrKey, PairError> {
        Ok(self.node(side).dev.alloc_mw(pd)?)
    }

    /// Binds window `mw` under `new_key` to `len` bytes of `mr` from `off` with `access`.
    pub fn bind_mw(
        &mut self,
        mw: MrKey,
        new_key: MrKey,
        mr: &Mr,
        (off, len): (usize, usize),
        access: AccessFlags,
    ) -> Result<(), PairError> {
        let (key, va) = (mr.key, mr.va + off as u64);
        Ok(self.command(mr.side, |dev, c| {
            dev.bind_mw(mw, new_key, key, va, len as u64, access, c)
        })?)
    }

    /// Invalidates the window bound under `key` on `side`.
    pub fn invalidate_mw(&mut self, side: Side, key: MrKey) -> Result<(), PairError> {
        Ok(self.command(side, |dev, c| dev.invalidate_mw(key, c))?)
    }

    /// The bytes of `mr`.
    pub fn bytes(&mut self, mr: &Mr) -> &[u8] {
        self.node(mr.side).bufs[mr.buf].as_mut_slice()
    }

    /// The bytes of `mr`, to fill.
    pub fn bytes_mut(&mut self, mr: &Mr) -> &mut [u8] {
        self.node(mr.side).bufs[mr.buf].as_mut_slice()
    }

    /// Creates an RC QP on `side`.
    pub fn create_qp(
        &mut self,
        side: Side,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
    ) -> Result<Qpn, PairError> {
        let caps = QpCaps {
            max_send_wr: self.cfg.sq_depth as u32,
            max_recv_wr: PAIR_RECV_WRS as u32,
            read_responses: READ_RESPONSE_ROOM,
        };
        Ok(self.command(side, |dev, c| {
            dev.create_qp(pd, send_cq, recv_cq, QpType::Rc, caps, c)
        })?)
    }

    /// modify_qp on `side`.
    pub fn modify_qp(
        &mut self,
        side: Side,
        qp: Qpn,
        attr: &RawQpAttr,
        mask: QpAttrMask,
    ) -> Result<(), PairError> {
        Ok(self.command(side, |dev, c| dev.modify_qp(qp, attr, mask, c))?)
    }

    /// Moves `qp` of `side` to `state` (no other attribute).
    pub fn set_state(&mut self, side: Side, qp: Qpn, state: QpState) -> Result<(), PairError> {
        let attr = RawQpAttr {
            qp_state: state.to_ibv(),
            ..RawQpAttr::default()
        };
        self.modify_qp(side, qp, &attr, QpAttrMask::STATE)
    }

    /// Destroys `qp` of `side`.
    pub fn destroy_qp(&mut self, side: Side, qp: Qpn) -> Result<(), PairError> {
        Ok(self.command(side, |dev, c| dev.destroy_qp(qp, c))?)
    }

    /// The state of `qp` on `side`.
    pub fn qp_state(&mut self, side: Side, qp: Qpn) -> Result<QpState, PairError> {
        Ok(self.engine(side).query_qp(qp)?.state)
    }

    /// RESET -> INIT -> RTR -> RTS of `qp` on `side` towards `remote` on the other side.
    pub fn bring_up(
        &mut self,
        side: Side,
        qp: Qpn,
        remote: Qpn,
        o: &QpOptions,
    ) -> Result<(), PairError> {
        let init = RawQpAttr {
            qp_state: QpState::Init.to_ibv(),
            qp_access_flags: o.access.bits(),
            ..RawQpAttr::default()
        };
        self.modify_qp(
            side,
            qp,
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        let rtr = RawQpAttr {
            qp_state: QpState::Rtr.to_ibv(),
            path_mtu: o.pmtu.to_ibv() as u32,
            dest_qp_num: remote.get(),
            rq_psn: o.psn[side.peer().index()],
            dgid: Gid::from_ipv4(PAIR_IPS[side.peer().index()]),
            min_rnr_timer: o.min_rnr_timer,
            ..RawQpAttr::default()
        };
        self.modify_qp(
            side,
            qp,
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        let rts = RawQpAttr {
            qp_state: QpState::Rts.to_ibv(),
            sq_psn: o.psn[side.index()],
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..RawQpAttr::default()
        };
        self.modify_qp(
            side,
            qp,
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// A PD, a send and a receive CQ and a QP on each side, both QPs brought up towards
    /// each other with `o`.
    pub fn connect(&mut self, o: &QpOptions) -> Result<Conn, PairError> {
        let mut conn = Conn {
            pd: [0; 2],
            send_cq: [0; 2],
            recv_cq: [0; 2],
            qp: [Qpn::from_raw(0); 2],
        };
        for side in Side::BOTH {
            let i = side.index();
            let cqe = self.cfg.cq_depth as u32;
            let dev = self.engine(side);
            conn.pd[i] = dev.alloc_pd()?;
            conn.send_cq[i] = dev.create_cq(cqe)?;
            conn.recv_cq[i] = dev.create_cq(cqe)?;
            conn.qp[i] = self.create_qp(side, conn.pd[i], conn.send_cq[i], conn.recv_cq[i])?;
        }
        for side in Side::BOTH {
            self.bring_up(side, conn.qp(side), conn.qp(side.peer()), o)?;
        }
        Ok(conn)
    }

    /// Posts send WRs on `qp` of `side` at the current virtual time.
    pub fn post_send(
        &mut self,
        side: Side,
        qp: Qpn,
        wrs: &[SendWr],
    ) -> Result<(), (usize, VerbsError)> {
        let now = self.instant();
        self.engine(side).post_send(qp, wrs, now)
    }

    /// Posts receive WRs on `qp` of `side`.
    pub fn post_recv(
        &mut self,
        side: Side,
        qp: Qpn,
        wrs: &[RecvWr],
    ) -> Result<(), (usize, VerbsError)> {
        self.engine(side).post_recv(qp, wrs)
    }

    /// Every completion `cq` of `side` holds now, oldest first.
    pub fn poll_cq(&mut self, side: Side, cq: u32) -> Vec<WorkCompletion> {
        let mut out = vec![WorkCompletion::EMPTY; 64];
        let mut all = Vec::new();
        while let Ok(n @ 1..) = self.engine(side).poll_cq(cq, &mut out) {
            all.extend_from_slice(&out[..n]);
        }
        all
    }
}
