//! The emulated card as a backend (feature `emulator`): a card of `bluerdma-sim` in this
//! process on an Ethernet link, reached by calls instead of MMIO. The link (UDP at the
//! device's address, faults, capture) is built by [`bluerdma_sim::inproc::device_link`].
//!
//! The card runs in the driver's own threads by default ([`InlineNic`]: doorbells, polls
//! and the progress thread step it); `BLUERDMA_CARD=threads` ([`CARD_ENV`]) gives it two
//! threads of its own instead ([`Nic`], an [`InProcessCard`]), as the card works beside the
//! host.

use std::sync::Arc;
use std::time::Duration;

use bluerdma_sim::inproc::{
    card_counters, device_link, DeviceLinkOptions, InProcessCard, InlineCard as SimInlineCard,
};
use bluerdma_sim::link::LinkPort;
use bluerdma_sim::model::{inline, InlineNic, Nic, NicConfig, CARD_ENV};

use super::{
    Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs, InlineCard,
    OpenError, Tuning,
};
use crate::verbs::DeviceSpec;

/// Keeps the card's threads running while the device is open.
struct Handle(Nic);

impl BackendHandle for Handle {
    fn card_stats(&self) -> String {
        card_counters(self.0.shared())
    }
}

/// Keeps the inline card (and its link) while the device is open.
struct InlineHandle(Arc<InlineNic>);

impl BackendHandle for InlineHandle {
    fn card_stats(&self) -> String {
        card_counters(self.0.shared())
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
pub fn open(spec: &DeviceSpec, link: Box<dyn LinkPort>) -> Result<Backend, OpenError> {
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
    if inline::threaded_from_env() {
        log::debug!("{}: threaded emulated card ({CARD_ENV})", spec.name);
        let InProcessCard {
            nic,
            regs,
            dma,
            mem,
            ..
        } = InProcessCard::start(config, link).map_err(failed)?;
        return Ok(backend(regs, dma, mem, Box::new(Handle(nic)), None));
    }
    let SimInlineCard {
        nic,
        regs,
        dma,
        mem,
    } = SimInlineCard::start(config, link).map_err(failed)?;
    let card: Arc<dyn InlineCard> = nic.clone();
    Ok(backend(
        regs,
        dma,
        mem,
        Box::new(InlineHandle(nic)),
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
