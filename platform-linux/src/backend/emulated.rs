//! The emulated card as a backend (feature `emulator`): an [`InProcessCard`] of
//! `bluerdma-sim` on an Ethernet link, reached by calls instead of MMIO. The link (UDP at
//! the device's address, faults, capture) is built by [`bluerdma_sim::inproc::device_link`].

use std::sync::Arc;

use bluerdma_sim::inproc::{card_counters, device_link, DeviceLinkOptions, InProcessCard};
use bluerdma_sim::link::LinkPort;
use bluerdma_sim::model::{Nic, NicConfig};

use super::{
    Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs, OpenError, Tuning,
};
use crate::verbs::DeviceSpec;

/// Keeps the card's threads running while the device is open.
struct Handle(Nic);

impl BackendHandle for Handle {
    fn card_stats(&self) -> String {
        card_counters(&self.0)
    }
}

/// Starts an emulated card for `spec` on `link`.
pub fn open(spec: &DeviceSpec, link: Box<dyn LinkPort>) -> Result<Backend, OpenError> {
    let card = InProcessCard::start(
        NicConfig {
            name: spec.name.clone(),
            page_size: spec.page_size,
            strict: spec.strict_pd,
            ..NicConfig::default()
        },
        link,
    )
    .map_err(|e| {
        OpenError::new(
            &spec.name,
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("the emulated card could not start: {e}"),
        )
    })?;
    let InProcessCard {
        nic,
        regs,
        dma,
        mem,
        ..
    } = card;
    Ok(Backend {
        kind: BackendKind::Emulated,
        regs: DynRegs(Arc::new(regs)),
        dma: DynDma(Box::new(dma)),
        mem: DynMem(Box::new(mem)),
        tuning: Tuning::EMULATED,
        buffers: BufferKind::Heap,
        handle: Box::new(Handle(nic)),
    })
}

/// Starts an emulated card for `spec` on the link `opts` describes (the UDP link at the
/// device's address by default).
pub fn open_on_udp(spec: &DeviceSpec, opts: &DeviceLinkOptions) -> Result<Backend, OpenError> {
    let link = device_link(spec.ip, opts)
        .map_err(|e| OpenError::new(&spec.name, e.errno(), e.to_string()))?;
    open(spec, link)
}
