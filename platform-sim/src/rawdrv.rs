//! A minimal raw-ring driver: just enough to exercise an emulated card through its rings
//! with the core's descriptors and ring code, before and beside the real engine (issue C).
//! The tests of the hardware contract and the `cargo xtask sim` raw scenarios use it.
//!
//! It owns the six rings of channel 0, the simple-NIC RX buffer and a PGT staging buffer,
//! and turns commands into synchronous calls with a timeout (an unanswered command is an
//! error, never a hang: correction 4) through the engine's command queue.

use std::fmt;
use std::net::Ipv4Addr;
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::desc::cmd::{
    CmdRequest, ManageQp, SetNetworkParam, SetRawPacketReceiveMeta, UpdateMrTable,
};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::pgt::{stage_pgt_update, DRIVER_ENTRIES_PER_UPDATE};
use bluerdma_core::desc::send::SendRequest;
use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_BUFFER_SIZE, RX_SLOT_SIZE};
use bluerdma_core::desc::{AccessFlags, MacAddr, QpType, RawDesc};
use bluerdma_core::engine::{CommandQueue, VerbsError};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::mtu::Pmtu;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, MemoryResolver, RegisterAccess};
use bluerdma_core::regs::{RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{
    ConsumerRing, Popped, ProducerRing, RingMemory, RingRegs, RING_ALIGN, RING_BYTES,
};
use bluerdma_core::time::{Instant as CoreInstant, Nanos};

/// What went wrong in a raw-ring operation.
#[derive(Debug)]
pub enum RawError {
    /// A platform call failed.
    Platform(bluerdma_core::platform::PlatformError),
    /// A ring buffer was refused.
    Ring(String),
    /// A descriptor could not be built or decoded.
    Desc(bluerdma_core::desc::DescError),
    /// The ring had no room.
    Full,
    /// No response to a command within the timeout.
    CommandTimeout {
        /// The command's op code.
        op: &'static str,
    },
    /// The card answered with is_success = 0.
    CommandFailed {
        /// The command's op code.
        op: &'static str,
    },
}

impl fmt::Display for RawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawError::Platform(e) => write!(f, "platform: {e}"),
            RawError::Ring(e) => write!(f, "ring: {e}"),
            RawError::Desc(e) => write!(f, "descriptor: {e}"),
            RawError::Full => f.write_str("ring full"),
            RawError::CommandTimeout { op } => write!(f, "no response to {op}"),
            RawError::CommandFailed { op } => write!(f, "{op} failed (is_success = 0)"),
        }
    }
}

impl std::error::Error for RawError {}

impl From<bluerdma_core::platform::PlatformError> for RawError {
    fn from(e: bluerdma_core::platform::PlatformError) -> Self {
        RawError::Platform(e)
    }
}

impl From<VerbsError> for RawError {
    fn from(e: VerbsError) -> Self {
        match e {
            VerbsError::CommandTimeout { op } => RawError::CommandTimeout { op },
            VerbsError::CommandFailed { op } => RawError::CommandFailed { op },
            VerbsError::Busy { .. } => RawError::Full,
            other => RawError::Ring(other.to_string()),
        }
    }
}

impl From<bluerdma_core::desc::DescError> for RawError {
    fn from(e: bluerdma_core::desc::DescError) -> Self {
        RawError::Desc(e)
    }
}

fn ring_regs(id: RingId) -> RingRegs {
    // Channel 0 is always decoded.
    RingRegs::of(id, DECODED_CHANNELS).expect("channel 0 rings are decoded")
}

/// The driver side of one card, through raw rings.
pub struct RawDriver<R: RegisterAccess, D: DmaAllocator> {
    regs: R,
    dma: D,
    commands: CommandQueue,
    /// The time base of the command queue's deadlines.
    epoch: Instant,
    send: ProducerRing,
    meta: ConsumerRing,
    sn_tx: ProducerRing,
    sn_rx: ConsumerRing,
    rx_buffer: DmaBuffer,
    staging: DmaBuffer,
    tx_frame: DmaBuffer,
    /// How long a command may take.
    pub command_timeout: Duration,
}

impl<R: RegisterAccess, D: DmaAllocator> RawDriver<R, D> {
    /// Allocates and programs the six rings, the simple-NIC RX buffer and a staging buffer.
    pub fn open(regs: R, dma: D) -> Result<Self, RawError> {
        let ring = |dma: &D| -> Result<RingMemory, RawError> {
            let buf = dma.alloc(RING_BYTES, RING_ALIGN)?;
            RingMemory::new(buf).map_err(|e| RawError::Ring(format!("{:?}", e.error)))
        };
        let mut cmd = ProducerRing::new(ring(&dma)?, ring_regs(RingId::CmdRequest));
        let mut resp = ConsumerRing::new(ring(&dma)?, ring_regs(RingId::CmdResponse));
        let mut send = ProducerRing::new(ring(&dma)?, ring_regs(RingId::Send(0)));
        let mut meta = ConsumerRing::new(ring(&dma)?, ring_regs(RingId::MetaReport(0)));
        let mut sn_tx = ProducerRing::new(ring(&dma)?, ring_regs(RingId::SimpleNicTx));
        let mut sn_rx = ConsumerRing::new(ring(&dma)?, ring_regs(RingId::SimpleNicRx));
        bluerdma_core::ring::program_rings(
            &regs,
            [&mut cmd, &mut send, &mut sn_tx],
            [&mut resp, &mut meta, &mut sn_rx],
        )
        .map_err(|e| RawError::Ring(e.to_string()))?;
        let rx_buffer = dma.alloc(RX_BUFFER_SIZE as usize, 2 << 20)?;
        let staging = dma.alloc(4096, 4096)?;
        let tx_frame = dma.alloc(4096, 4096)?;
        Ok(Self {
            regs,
            dma,
            commands: CommandQueue::new(cmd, resp, Nanos::from_millis(2_000)),
            epoch: Instant::now(),
            send,
            meta,
            sn_tx,
            sn_rx,
            rx_buffer,
            staging,
            tx_frame,
            command_timeout: Duration::from_secs(2),
        })
    }

    /// The register access this driver uses.
    pub fn regs(&self) -> &R {
        &self.regs
    }

    /// Sends a command and waits for its response (matched by user_data).
    pub fn command(&mut self, req: CmdRequest) -> Result<(), RawError> {
        let now = |epoch: Instant| CoreInstant(epoch.elapsed().as_nanos() as u64);
        self.commands
            .set_timeout(Nanos(self.command_timeout.as_nanos() as u64));
        let t = self
            .commands
            .submit(&self.regs, req, now(self.epoch))
            .map_err(RawError::from)?;
        loop {
            self.commands.poll(&self.regs);
            if let Some(r) = self.commands.check(t, now(self.epoch)) {
                return r.map_err(RawError::from);
            }
            thread::sleep(Duration::from_micros(20));
        }
    }

    /// Pushes a raw command descriptor (tests use it for malformed requests).
    pub fn push_command(&mut self, d: &RawDesc) -> Result<(), RawError> {
        self.commands
            .push_raw(&self.regs, d)
            .map_err(|_| RawError::Full)
    }

    /// SetNetworkParam and SetRawPacketReceiveMeta: the card's addresses and RX buffer.
    pub fn configure(&mut self, mac: MacAddr, ip: Ipv4Addr) -> Result<(), RawError> {
        self.command(CmdRequest::SetNetworkParam(SetNetworkParam {
            mac,
            ip,
            netmask: Ipv4Addr::new(255, 0, 0, 0),
            gateway: Ipv4Addr::UNSPECIFIED,
        }))?;
        self.command(CmdRequest::SetRawPacketReceiveMeta(
            SetRawPacketReceiveMeta {
                write_base_addr: self.rx_buffer.device_addr(),
            },
        ))?;
        Ok(())
    }

    /// Registers `[va, va + len)` as MR table entry `key.index()` with its pages at PGT
    /// `pgt_offset..`, pinned and translated by `mem`.
    #[allow(clippy::too_many_arguments)]
    pub fn register_mr(
        &mut self,
        mem: &mut impl MemoryResolver,
        key: MrKey,
        va: VirtAddr,
        len: usize,
        access: AccessFlags,
        pgt_offset: u32,
        page: PageSize,
        pd: u32,
    ) -> Result<(), RawError> {
        let writes = access.intersects(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        mem.pin(va, len, writes)?;
        let pages = page.pages_spanned(va.0, len as u64) as usize;
        let mut done = 0;
        while done < pages {
            let n = (pages - done).min(DRIVER_ENTRIES_PER_UPDATE);
            let mut entries = [DeviceAddr(0); DRIVER_ENTRIES_PER_UPDATE];
            let first_page = VirtAddr(page.base_of(va.0) + done as u64 * page.bytes());
            mem.translate(first_page, page, &mut entries[..n])?;
            // SAFETY: the staging buffer is ours, 4096 bytes, and the card reads it only
            // during the command we wait for below.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(self.staging.cpu().as_ptr(), self.staging.len())
            };
            let cmd = stage_pgt_update(
                buf,
                self.staging.device_addr(),
                pgt_offset + done as u32,
                &entries[..n],
            )?;
            self.command(CmdRequest::UpdatePgt(cmd))?;
            done += n;
        }
        self.command(CmdRequest::UpdateMrTable(UpdateMrTable {
            mr_base_va: va,
            mr_length: len as u32,
            mr_key: key,
            pd,
            acc_flags: access,
            pgt_offset,
        }))?;
        Ok(())
    }

    /// Invalidates MR table entry `key.index()` (mr_length 0).
    pub fn deregister_mr(&mut self, key: MrKey) -> Result<(), RawError> {
        self.command(CmdRequest::UpdateMrTable(UpdateMrTable {
            mr_base_va: VirtAddr(0),
            mr_length: 0,
            mr_key: key,
            pd: 0,
            acc_flags: AccessFlags::empty(),
            pgt_offset: 0,
        }))?;
        Ok(())
    }

    /// Writes (or with `valid = false` invalidates) a QP context.
    #[allow(clippy::too_many_arguments)]
    pub fn manage_qp(
        &mut self,
        valid: bool,
        qpn: Qpn,
        peer_qpn: Qpn,
        peer_ip: Ipv4Addr,
        peer_mac: MacAddr,
        access: AccessFlags,
        pmtu: Pmtu,
    ) -> Result<(), RawError> {
        self.command(CmdRequest::ManageQp(ManageQp {
            is_valid: valid,
            is_error: false,
            pd: 1,
            qpn,
            peer_qpn,
            rq_access_flags: access,
            qp_type: QpType::Rc,
            pmtu,
            local_udp_port: 0x100,
            peer_mac,
            peer_ip,
        }))
    }

    /// Posts send requests (Seg0 + Seg1 each) with one doorbell.
    pub fn post_send(&mut self, reqs: &[SendRequest]) -> Result<(), RawError> {
        let mut descs = Vec::with_capacity(reqs.len() * 2);
        for r in reqs {
            descs.extend_from_slice(&r.encode());
        }
        self.send
            .push_batch(&self.regs, &descs)
            .map_err(|_| RawError::Full)
    }

    /// Transmits one raw frame through the simple NIC and waits until the card fetched it.
    pub fn send_raw_frame(&mut self, frame: &[u8]) -> Result<(), RawError> {
        let len = frame.len().min(self.tx_frame.len());
        // SAFETY: the frame buffer is ours; the previous frame was fetched (we wait below).
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), self.tx_frame.cpu().as_ptr(), len);
        }
        let d = SimpleNicTx {
            addr: self.tx_frame.device_addr(),
            len: len as u32,
        }
        .encode();
        self.sn_tx
            .push_batch(&self.regs, &[d])
            .map_err(|_| RawError::Full)?;
        let deadline = Instant::now() + self.command_timeout;
        while self
            .sn_tx
            .refresh_tail(&self.regs)
            .map(|free| free < 4096)
            .unwrap_or(true)
        {
            if Instant::now() >= deadline {
                return Err(RawError::CommandTimeout { op: "SimpleNicTx" });
            }
            thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// Collects meta reports until `quiet` passes with none new, or `max_wait` in all.
    pub fn collect_meta(&mut self, quiet: Duration, max_wait: Duration) -> Vec<MetaReport> {
        let mut out = Vec::new();
        let start = Instant::now();
        let mut last = Instant::now();
        loop {
            let mut got = false;
            while let Some(p) = self.meta.pop() {
                got = true;
                let decoded = match p {
                    Popped::One(d) => MetaReport::decode(&d, None),
                    Popped::Pair(a, b) => MetaReport::decode(&a, Some(&b)),
                    _ => continue,
                };
                if let Ok(r) = decoded {
                    out.push(r);
                }
            }
            self.meta.sync_tail(&self.regs);
            if got {
                last = Instant::now();
            }
            if last.elapsed() >= quiet || start.elapsed() >= max_wait {
                return out;
            }
            thread::sleep(Duration::from_micros(50));
        }
    }

    /// Frames that arrived on the simple-NIC RX ring.
    pub fn collect_raw_frames(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(p) = self.sn_rx.pop() {
            if let Popped::One(d) = p {
                if let Ok(rx) = SimpleNicRx::decode(&d) {
                    let len = (rx.len as usize).min(RX_SLOT_SIZE as usize);
                    let off = rx.buffer_offset() as usize;
                    let mut frame = vec![0u8; len];
                    // SAFETY: the offset is within the 2 MiB RX buffer (slot < 1024, length
                    // capped at a slot), which the card wrote before the descriptor.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.rx_buffer.cpu().as_ptr().add(off),
                            frame.as_mut_ptr(),
                            len,
                        )
                    };
                    out.push(frame);
                }
            }
        }
        self.sn_rx.sync_tail(&self.regs);
        out
    }
}

impl<R: RegisterAccess, D: DmaAllocator> Drop for RawDriver<R, D> {
    fn drop(&mut self) {
        // The rings' buffers are released with the card's address map when the process
        // (or test) ends; only the plain buffers are returned here.
        for buf in [
            std::mem::replace(&mut self.rx_buffer, dangling()),
            std::mem::replace(&mut self.staging, dangling()),
            std::mem::replace(&mut self.tx_frame, dangling()),
        ] {
            if !buf.is_empty() {
                // SAFETY: each buffer came from `self.dma` and nothing uses it afterwards.
                unsafe { self.dma.free(buf) };
            }
        }
    }
}

fn dangling() -> DmaBuffer {
    // SAFETY: a zero-length buffer is never dereferenced.
    unsafe { DmaBuffer::new(std::ptr::NonNull::dangling(), DeviceAddr(0), 0) }
}
