//! The firmware's logic: a loopback self-test of the card, generic over the platform.
//!
//! [`firmware_main`] opens the device, registers one buffer, connects two RC QPs of the
//! same card to each other (the peer address is the card's own IP, so every packet leaves
//! through the card's Ethernet port and comes back in), runs an RDMA WRITE and an RDMA READ,
//! and checks the bytes and the completions. The soft-core runs it with [`crate::Baremetal`];
//! the host tests run the same function on the emulated NIC, so the firmware path is tested
//! on every `cargo test`.
//!
//! The buffer holds three regions: the source, the WRITE target and the READ target, each
//! followed by guard bytes. The targets start at odd offsets and the transfer spans several
//! packets, so the fragmenter's unaligned paths run too; the guards must stay zero.

use core::fmt;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{
    Device, DeviceConfig, EngineStats, QpCaps, SendOp, SendWr, Storage, VerbsError, WcOpcode,
    WcStatus, WorkCompletion,
};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, Platform, PlatformError};
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, QpType, RawQpAttr};
use bluerdma_core::time::{Instant, Nanos};

/// Bytes after each region that no transfer may touch.
const GUARD: usize = 64;
/// Offset of the WRITE target inside its region (odd, so the remote address is unaligned).
const WRITE_SKEW: usize = 3;
/// Offset of the READ target inside its region.
const READ_SKEW: usize = 5;
/// IB path MTU 4096 (`ibv_mtu` 5), the card's.
const PATH_MTU_4096: u32 = 5;

/// What the self-test does.
#[derive(Clone, Debug)]
pub struct FirmwareConfig {
    /// The card's network identity; its IP is also the peer's (loopback).
    pub device: DeviceConfig,
    /// Bytes moved by the WRITE and by the READ.
    pub transfer_len: u32,
    /// How long each completion may take before the test fails with [`Step`] named.
    pub op_timeout: Nanos,
    /// First PSN the requester QP sends (the responder's expected PSN).
    pub psn_a: u32,
    /// First PSN the responder QP sends (the READ's request).
    pub psn_b: u32,
    /// Seed of the byte pattern.
    pub seed: u8,
}

impl FirmwareConfig {
    /// Defaults: 10000 bytes (three 4 KiB packets), one second per operation.
    pub const fn new(device: DeviceConfig) -> Self {
        Self {
            device,
            transfer_len: 10_000,
            op_timeout: Nanos::from_millis(1_000),
            psn_a: 0x10,
            psn_b: 0x2000,
            seed: 0x5A,
        }
    }
}

/// The step of the self-test that failed. The values are part of the firmware's verdict
/// word (`SELFTEST_RESULT` in firmware/src/soft_core.rs), which testbenches and
/// `cargo xtask ci` read: never renumber them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Allocating the data buffer.
    AllocBuffer = 0,
    /// Opening the device (rings, network parameters).
    Open = 1,
    /// Allocating the protection domain.
    AllocPd = 2,
    /// Registering the data buffer.
    RegMr = 3,
    /// Creating the completion queues.
    CreateCq = 4,
    /// Creating the queue pairs.
    CreateQp = 5,
    /// Moving the QPs to RTS, each pointing at the other.
    Connect = 6,
    /// The RDMA WRITE.
    Write = 7,
    /// The RDMA READ.
    Read = 8,
    /// Destroying the objects and closing the device.
    Teardown = 9,
}

impl Step {
    /// The step's name, for logs.
    pub const fn name(self) -> &'static str {
        match self {
            Step::AllocBuffer => "alloc buffer",
            Step::Open => "open",
            Step::AllocPd => "alloc pd",
            Step::RegMr => "reg mr",
            Step::CreateCq => "create cq",
            Step::CreateQp => "create qp",
            Step::Connect => "connect",
            Step::Write => "rdma write",
            Step::Read => "rdma read",
            Step::Teardown => "teardown",
        }
    }
}

/// Why the self-test failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirmwareError {
    /// A verb failed.
    Verbs {
        /// Where.
        step: Step,
        /// The engine's error.
        error: VerbsError,
    },
    /// A platform service failed.
    Platform {
        /// Where.
        step: Step,
        /// The platform's error.
        error: PlatformError,
    },
    /// No completion arrived within the configured time.
    Timeout {
        /// Where.
        step: Step,
    },
    /// The completion names the wrong request, opcode or length, or a failure status.
    BadCompletion {
        /// Where.
        step: Step,
        /// The completion as polled.
        wc: WorkCompletion,
    },
    /// A completion arrived on the CQ that should have stayed empty.
    StrayCompletion {
        /// Where.
        step: Step,
        /// The completion as polled.
        wc: WorkCompletion,
    },
    /// The bytes at the target (or a guard byte after it) are wrong.
    DataMismatch {
        /// Where.
        step: Step,
        /// Offset of the first wrong byte in the data buffer.
        offset: u32,
        /// What should be there.
        expected: u8,
        /// What is there.
        found: u8,
    },
}

impl FirmwareError {
    /// The step that failed.
    pub const fn step(&self) -> Step {
        match *self {
            FirmwareError::Verbs { step, .. }
            | FirmwareError::Platform { step, .. }
            | FirmwareError::Timeout { step }
            | FirmwareError::BadCompletion { step, .. }
            | FirmwareError::StrayCompletion { step, .. }
            | FirmwareError::DataMismatch { step, .. } => step,
        }
    }
}

impl FirmwareError {
    /// Why, in two static strings (a kind and its detail, possibly empty), so that a
    /// firmware can log the reason without linking `core::fmt`.
    pub fn reason(&self) -> (&'static str, &'static str) {
        match *self {
            FirmwareError::Verbs { error, .. } => verbs_reason(error),
            FirmwareError::Platform { error, .. } => platform_reason(error),
            FirmwareError::Timeout { .. } => ("no completion in time", ""),
            FirmwareError::BadCompletion { .. } => ("bad completion", ""),
            FirmwareError::StrayCompletion { .. } => ("completion on the other QP's CQ", ""),
            FirmwareError::DataMismatch { .. } => ("wrong bytes", ""),
        }
    }
}

fn verbs_reason(error: VerbsError) -> (&'static str, &'static str) {
    match error {
        VerbsError::CommandTimeout { op } => ("command timeout", op),
        VerbsError::CommandFailed { op } => ("command failed", op),
        VerbsError::OutOfResources { what } => ("out of resources", what),
        VerbsError::InvalidArgument { what } => ("invalid argument", what),
        VerbsError::Unsupported { what } => ("unsupported", what),
        VerbsError::WrongQpState { op, .. } => ("wrong QP state", op),
        VerbsError::Platform(p) => platform_reason(p),
        _ => ("engine error", ""),
    }
}

fn platform_reason(error: PlatformError) -> (&'static str, &'static str) {
    match error {
        PlatformError::OutOfMemory { .. } => ("platform", "out of DMA memory"),
        PlatformError::NotMapped { .. } => ("platform", "memory outside the card's window"),
        _ => ("platform", "error"),
    }
}

impl fmt::Display for FirmwareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = self.step().name();
        match self {
            FirmwareError::Verbs { error, .. } => write!(f, "{step}: {error}"),
            FirmwareError::Platform { error, .. } => write!(f, "{step}: {error}"),
            FirmwareError::Timeout { .. } => write!(f, "{step}: no completion in time"),
            FirmwareError::BadCompletion { wc, .. } => write!(f, "{step}: bad completion {wc:?}"),
            FirmwareError::StrayCompletion { wc, .. } => {
                write!(f, "{step}: completion on the wrong CQ {wc:?}")
            }
            FirmwareError::DataMismatch {
                offset,
                expected,
                found,
                ..
            } => write!(
                f,
                "{step}: byte {offset} is {found:#04x}, expected {expected:#04x}"
            ),
        }
    }
}

/// What a passing self-test measured.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// Bytes moved by each of the WRITE and the READ.
    pub bytes: u32,
    /// The requester QP (posts the WRITE).
    pub qp_a: Qpn,
    /// The responder QP (posts the READ).
    pub qp_b: Qpn,
    /// The data buffer's key.
    pub mr_key: MrKey,
    /// The WRITE's completion.
    pub write: WorkCompletion,
    /// The READ's completion.
    pub read: WorkCompletion,
    /// From post to completion of the WRITE.
    pub write_time: Nanos,
    /// From post to completion of the READ.
    pub read_time: Nanos,
    /// From the start to the closed device.
    pub total_time: Nanos,
    /// The engine's counters at close.
    pub stats: EngineStats,
}

/// The source byte at `i`.
fn pattern(seed: u8, i: usize) -> u8 {
    ((i as u32).wrapping_mul(0x9E37_79B1) >> 24) as u8 ^ seed
}

/// Where the three regions lie in the data buffer.
#[derive(Clone, Copy)]
struct Layout {
    len: usize,
    stride: usize,
}

impl Layout {
    fn new(len: u32) -> Option<Self> {
        let len = len as usize;
        // Regions start on cache lines, so the skews alone decide the targets' alignment.
        let stride = len.checked_add(READ_SKEW.max(WRITE_SKEW) + GUARD + 63)? & !63;
        stride.checked_mul(3)?;
        Some(Self { len, stride })
    }
    fn total(self) -> usize {
        self.stride * 3
    }
    fn source(self) -> usize {
        0
    }
    fn write_target(self) -> usize {
        self.stride + WRITE_SKEW
    }
    fn read_target(self) -> usize {
        2 * self.stride + READ_SKEW
    }
}

/// Runs the loopback self-test on the card behind `regs`; see the module documentation.
///
/// `clock` is the engine's clock (nanoseconds, monotonic). On failure the device is left
/// open: firmware halts and reports, and a host test drops the card.
pub fn firmware_main<P: Platform, S: Storage>(
    regs: P::Regs,
    dma: P::Dma,
    mem: P::Mem,
    storage: S,
    cfg: &FirmwareConfig,
    clock: &mut dyn FnMut() -> Instant,
) -> Result<Report, FirmwareError> {
    let start = clock();
    let layout = Layout::new(cfg.transfer_len).ok_or(FirmwareError::Platform {
        step: Step::AllocBuffer,
        error: PlatformError::OutOfMemory {
            requested: usize::MAX,
        },
    })?;
    // Allocated before `open` takes the allocator; returned after `close` gives it back.
    let mut data = dma
        .alloc(layout.total(), 4096)
        .map_err(|error| FirmwareError::Platform {
            step: Step::AllocBuffer,
            error,
        })?;
    let verbs = |step: Step| move |error: VerbsError| FirmwareError::Verbs { step, error };

    let mut dev = Device::<P, S>::open(regs, dma, mem, storage, cfg.device.clone(), clock)
        .map_err(verbs(Step::Open))?;
    fw_info!("self-test: device open");
    let pd = dev.alloc_pd().map_err(verbs(Step::AllocPd))?;
    let base = data.cpu().as_ptr() as u64;
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let key = dev
        .reg_mr(pd, VirtAddr(base), layout.total() as u64, all, clock)
        .map_err(verbs(Step::RegMr))?;
    let cq_a = dev.create_cq(4).map_err(verbs(Step::CreateCq))?;
    let cq_b = dev.create_cq(4).map_err(verbs(Step::CreateCq))?;
    // One WRITE and one READ each way: a few requests, and room for the READ response.
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        read_responses: 4,
    };
    let qp_a = dev
        .create_qp(pd, cq_a, cq_a, QpType::Rc, caps, clock)
        .map_err(verbs(Step::CreateQp))?;
    let qp_b = dev
        .create_qp(pd, cq_b, cq_b, QpType::Rc, caps, clock)
        .map_err(verbs(Step::CreateQp))?;
    let ip = cfg.device.ip;
    connect(&mut dev, qp_a, qp_b, cfg.psn_a, cfg.psn_b, ip, clock)?;
    connect(&mut dev, qp_b, qp_a, cfg.psn_b, cfg.psn_a, ip, clock)?;
    fw_info!("self-test: QPs {} and {} connected", qp_a.get(), qp_b.get());

    // The card is idle on this buffer until the first post: the CPU owns every byte.
    let len = layout.len;
    for (i, b) in data.as_mut_slice()[..len].iter_mut().enumerate() {
        *b = pattern(cfg.seed, i);
    }

    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write,
        laddr: VirtAddr(base + layout.source() as u64),
        len: cfg.transfer_len,
        lkey: key,
        raddr: VirtAddr(base + layout.write_target() as u64),
        rkey: key,
        signaled: true,
        solicited: false,
    };
    let t = clock();
    let write = run_one(
        &mut dev,
        qp_a,
        wr,
        cq_a,
        cq_b,
        WcOpcode::RdmaWrite,
        cfg,
        clock,
    )?;
    let write_time = clock() - t;
    check_copy(
        &mut data,
        layout,
        layout.write_target(),
        cfg.seed,
        Step::Write,
    )?;
    fw_info!("self-test: WRITE of {} bytes verified", cfg.transfer_len);

    let wr = SendWr {
        wr_id: 2,
        op: SendOp::Read,
        laddr: VirtAddr(base + layout.read_target() as u64),
        len: cfg.transfer_len,
        lkey: key,
        raddr: VirtAddr(base + layout.write_target() as u64),
        rkey: key,
        signaled: true,
        solicited: false,
    };
    let t = clock();
    let read = run_one(
        &mut dev,
        qp_b,
        wr,
        cq_b,
        cq_a,
        WcOpcode::RdmaRead,
        cfg,
        clock,
    )?;
    let read_time = clock() - t;
    check_copy(
        &mut data,
        layout,
        layout.read_target(),
        cfg.seed,
        Step::Read,
    )?;
    fw_info!("self-test: READ of {} bytes verified", cfg.transfer_len);

    let teardown = verbs(Step::Teardown);
    dev.destroy_qp(qp_a, clock).map_err(teardown)?;
    dev.destroy_qp(qp_b, clock).map_err(teardown)?;
    dev.dereg_mr(key, clock).map_err(teardown)?;
    dev.destroy_cq(cq_a).map_err(teardown)?;
    dev.destroy_cq(cq_b).map_err(teardown)?;
    dev.dealloc_pd(pd).map_err(teardown)?;
    let stats = dev.stats();
    let (_regs, dma, _mem, _storage) = dev.close();
    // SAFETY: the MR is deregistered and both QPs are destroyed, so neither the card nor
    // any pointer of ours uses the buffer any more.
    unsafe { dma.free(data) };
    Ok(Report {
        bytes: cfg.transfer_len,
        qp_a,
        qp_b,
        mr_key: key,
        write,
        read,
        write_time,
        read_time,
        total_time: clock() - start,
        stats,
    })
}

/// INIT -> RTR -> RTS for `qp`, aimed at `peer` on this card (the sequence of
/// platform-linux's `Qp::connect`).
fn connect<P: Platform, S: Storage>(
    dev: &mut Device<P, S>,
    qp: Qpn,
    peer: Qpn,
    my_psn: u32,
    peer_psn: u32,
    ip: core::net::Ipv4Addr,
    clock: &mut dyn FnMut() -> Instant,
) -> Result<(), FirmwareError> {
    let fail = |error| FirmwareError::Verbs {
        step: Step::Connect,
        error,
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let init = RawQpAttr {
        qp_state: QpState::Init.to_ibv(),
        qp_access_flags: u32::from(access.bits()),
        ..RawQpAttr::default()
    };
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    dev.modify_qp(qp, &init, init_mask, clock).map_err(fail)?;
    let rtr = RawQpAttr {
        qp_state: QpState::Rtr.to_ibv(),
        path_mtu: PATH_MTU_4096,
        dest_qp_num: peer.get(),
        rq_psn: peer_psn,
        dgid: Gid::from_ipv4(ip),
        min_rnr_timer: 12,
        ..RawQpAttr::default()
    };
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    dev.modify_qp(qp, &rtr, rtr_mask, clock).map_err(fail)?;
    let rts = RawQpAttr {
        qp_state: QpState::Rts.to_ibv(),
        sq_psn: my_psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ..RawQpAttr::default()
    };
    let rts_mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    dev.modify_qp(qp, &rts, rts_mask, clock).map_err(fail)
}

/// Posts `wr` on `qp` and polls until its completion arrives on `cq`; `quiet_cq` must stay
/// empty (the other QP's CQ: a WRITE or READ completes only at the requester).
#[allow(clippy::too_many_arguments)]
fn run_one<P: Platform, S: Storage>(
    dev: &mut Device<P, S>,
    qp: Qpn,
    wr: SendWr,
    cq: u32,
    quiet_cq: u32,
    opcode: WcOpcode,
    cfg: &FirmwareConfig,
    clock: &mut dyn FnMut() -> Instant,
) -> Result<WorkCompletion, FirmwareError> {
    let step = if opcode == WcOpcode::RdmaRead {
        Step::Read
    } else {
        Step::Write
    };
    dev.post_send(qp, &[wr], clock())
        .map_err(|(_, error)| FirmwareError::Verbs { step, error })?;
    let deadline = clock() + cfg.op_timeout;
    let mut wc = [WorkCompletion::EMPTY];
    loop {
        let now = clock();
        dev.poll(now);
        let n = dev
            .poll_cq(cq, &mut wc)
            .map_err(|error| FirmwareError::Verbs { step, error })?;
        if n == 1 {
            break;
        }
        if now >= deadline {
            return Err(FirmwareError::Timeout { step });
        }
        core::hint::spin_loop();
    }
    let [wc] = wc;
    let expected = wc.wr_id == wr.wr_id
        && wc.status == WcStatus::Success
        && wc.opcode == opcode
        && wc.byte_len == wr.len
        && wc.qp_num == qp.get();
    if !expected {
        return Err(FirmwareError::BadCompletion { step, wc });
    }
    let mut stray = [WorkCompletion::EMPTY];
    let n = dev
        .poll_cq(quiet_cq, &mut stray)
        .map_err(|error| FirmwareError::Verbs { step, error })?;
    if n != 0 {
        let [wc] = stray;
        return Err(FirmwareError::StrayCompletion { step, wc });
    }
    Ok(wc)
}

/// Checks that the region starting at `target` holds the pattern and that the rest of
/// its stride (skew and guard bytes) is still zero.
fn check_copy(
    data: &mut DmaBuffer,
    layout: Layout,
    target: usize,
    seed: u8,
    step: Step,
) -> Result<(), FirmwareError> {
    // The completion was polled: the card is done with these bytes.
    let bytes = data.as_mut_slice();
    let region = target / layout.stride * layout.stride;
    let end = region + layout.stride;
    for off in region..end {
        let expected = match off.checked_sub(target) {
            Some(i) if i < layout.len => pattern(seed, i),
            _ => 0,
        };
        let found = bytes.get(off).copied().unwrap_or(!expected);
        if found != expected {
            return Err(FirmwareError::DataMismatch {
                step,
                offset: off as u32,
                expected,
                found,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_targets_are_unaligned() {
        let l = Layout::new(10_000).unwrap();
        assert!(l.source() + l.len <= l.write_target());
        assert!(l.write_target() + l.len + GUARD <= l.read_target() - READ_SKEW + l.stride);
        assert!(l.read_target() + l.len + GUARD <= l.total());
        assert_eq!(l.write_target() % 2, 1);
        // A length whose regions cannot be addressed is refused, not wrapped.
        if let Some(l) = Layout::new(u32::MAX) {
            assert!(l.total() >= 3 * u32::MAX as usize);
        }
    }

    #[test]
    fn the_pattern_is_not_a_constant_or_a_counter() {
        let v: [u8; 8] = core::array::from_fn(|i| pattern(0x5A, i));
        assert!(v.windows(2).all(|w| w[0] != w[1]), "{v:?}");
        assert!(v.windows(2).any(|w| w[1] != w[0].wrapping_add(1)), "{v:?}");
    }
}
