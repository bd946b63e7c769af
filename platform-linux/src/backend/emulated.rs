//! The emulated card as a backend (feature `emulator`): a card of `bluerdma-sim` in this
//! process on an Ethernet link, reached by calls instead of MMIO. The link (UDP at the
//! device's address, faults, capture) is built by [`bluerdma_sim::inproc::device_link`].
//!
//! The card runs in the driver's own threads by default ([`InlineNic`]: doorbells, polls
//! and the progress thread step it); `BLUERDMA_CARD=threads` ([`CARD_ENV`]) gives it two
//! threads of its own instead ([`Nic`], an [`InProcessCard`]), as the card works beside the
//! host ([`open_as`] chooses regardless of the environment).
//!
//! Either card reaches memory of other processes through its address map
//! ([`BackendHandle::remote_memory`]).
//!
//! [`CARD_ENV`]: bluerdma_sim::model::CARD_ENV

use std::sync::Arc;
use std::time::Duration;

use bluerdma_sim::inproc::{
    card_counters, device_link, DeviceLinkOptions, InProcessCard, InlineCard as SimInlineCard,
};
use bluerdma_sim::link::LinkPort;
use bluerdma_sim::mem::RemoteMappings;
use bluerdma_sim::model::{inline, InlineNic, Nic, NicConfig};

use super::{
    Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs, InlineCard,
    OpenError, RemoteMemory, Tuning,
};
use crate::verbs::DeviceSpec;

/// Keeps the card's threads running while the device is open.
struct Handle {
    nic: Nic,
    remote: Arc<RemoteMappings>,
}

impl BackendHandle for Handle {
    fn card_stats(&self) -> String {
        card_counters(self.nic.shared())
    }

    fn set_report_notify(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.nic.regs().set_host_notify(f)
    }

    fn valid_entries(&self) -> Option<(usize, usize)> {
        Some(self.nic.shared().state().tables.valid_counts())
    }

    fn remote_memory(&self) -> Option<Arc<dyn RemoteMemory>> {
        Some(self.remote.clone())
    }
}

/// Keeps the inline card (and its link) while the device is open.
struct InlineHandle {
    nic: Arc<InlineNic>,
    remote: Arc<RemoteMappings>,
}

impl BackendHandle for InlineHandle {
    fn card_stats(&self) -> String {
        card_counters(self.nic.shared())
    }

    fn valid_entries(&self) -> Option<(usize, usize)> {
        Some(self.nic.shared().state().tables.valid_counts())
    }

    fn remote_memory(&self) -> Option<Arc<dyn RemoteMemory>> {
        Some(self.remote.clone())
    }
}

/// How an emulated card runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CardMode {
    /// In the driver's own threads ([`InlineNic`]).
    Inline,
    /// In two threads of its own ([`Nic`]).
    Threaded,
}

impl CardMode {
    /// The mode [`CARD_ENV`] asks for (inline unless it says `threads`).
    ///
    /// [`CARD_ENV`]: bluerdma_sim::model::CARD_ENV
    pub fn from_env() -> Self {
        if inline::threaded_from_env() {
            CardMode::Threaded
        } else {
            CardMode::Inline
        }
    }
}

impl InlineCard for InlineNic {
    fn receive(&self) -> bool {
        InlineNic::receive(self)
    }
    fn step(&self) -> bool {
        InlineNic::step(self)
    }
    fn flush_tx(&self) -> bool {
        InlineNic::flush_tx(self)
    }
    fn tx_pending(&self) -> bool {
        InlineNic::tx_pending(self)
    }
    fn wait(&self, timeout: Duration, announced: bool) -> bool {
        InlineNic::wait(self, timeout, announced)
    }
    fn app_spins(&self, spinning: bool) {
        InlineNic::app_spins(self, spinning)
    }
    fn raw_frames(&self) -> u64 {
        InlineNic::raw_frames(self)
    }
    fn wake(&self) {
        InlineNic::wake(self)
    }
}

/// Starts an emulated card for `spec` on `link`: inline, unless [`CARD_ENV`] asks for the
/// threaded card.
///
/// [`CARD_ENV`]: bluerdma_sim::model::CARD_ENV
pub fn open(spec: &DeviceSpec, link: Box<dyn LinkPort>) -> Result<Backend, OpenError> {
    open_as(spec, link, CardMode::from_env())
}

/// Starts an emulated card for `spec` on `link`, running as `mode` says.
pub fn open_as(
    spec: &DeviceSpec,
    link: Box<dyn LinkPort>,
    mode: CardMode,
) -> Result<Backend, OpenError> {
    let config = NicConfig {
        name: spec.name.clone(),
        page_size: spec.page_size,
        strict: spec.strict_pd,
        ..NicConfig::default()
    };
    let failed = |e: std::io::Error| {
        OpenError::new(
            &spec.name,
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("the emulated card could not start: {e}"),
        )
    };
    let backend = |regs, dma, mem, handle, inline| Backend {
        kind: BackendKind::Emulated,
        regs: DynRegs(Arc::new(regs)),
        dma: DynDma(Box::new(dma)),
        mem: DynMem(Box::new(mem)),
        tuning: Tuning::EMULATED,
        buffers: BufferKind::Heap,
        handle,
        inline,
    };
    if mode == CardMode::Threaded {
        log::debug!("{}: threaded emulated card", spec.name);
        let InProcessCard {
            nic,
            regs,
            dma,
            mem,
            map,
        } = InProcessCard::start(config, link).map_err(failed)?;
        let remote = Arc::new(RemoteMappings::new(map));
        return Ok(backend(
            regs,
            dma,
            mem,
            Box::new(Handle { nic, remote }),
            None,
        ));
    }
    let SimInlineCard {
        nic,
        regs,
        dma,
        mem,
    } = SimInlineCard::start(config, link).map_err(failed)?;
    // The card's map: the one its DMA and user memory are entered into.
    let remote = Arc::new(RemoteMappings::new(mem.map().clone()));
    let card: Arc<dyn InlineCard> = nic.clone();
    Ok(backend(
        regs,
        dma,
        mem,
        Box::new(InlineHandle { nic, remote }),
        Some(card),
    ))
}

/// Starts an emulated card for `spec` on the link `opts` describes (the UDP link at the
/// device's address by default).
pub fn open_on_udp(spec: &DeviceSpec, opts: &DeviceLinkOptions) -> Result<Backend, OpenError> {
    let link = device_link(spec.ip, opts)
        .map_err(|e| OpenError::new(&spec.name, e.errno(), e.to_string()))?;
    open(spec, link)
}
