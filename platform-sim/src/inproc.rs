//! Attaching a driver to an emulated card in the same process (the default, fastest way):
//! register access is a call into the card's register file, DMA buffers come from the heap,
//! and device addresses are the process's virtual addresses plus
//! [`crate::mem::DEVICE_OFFSET`].

use std::io;
use std::sync::Arc;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Reg;

use crate::link::LinkPort;
use crate::mem::{AddressMap, HostDma, HostMemory};
use crate::model::regs::RegisterFile;
use crate::model::{Nic, NicConfig};

pub use bluerdma_core::regs::UNDECODED_READ;

/// Register access to an in-process card: a call, not a socket.
#[derive(Clone)]
pub struct SimRegs(Arc<RegisterFile>);

impl SimRegs {
    /// Access to `file`.
    pub fn new(file: Arc<RegisterFile>) -> Self {
        Self(file)
    }
}

impl RegisterAccess for SimRegs {
    fn read32(&self, reg: Reg) -> u32 {
        // A `Reg` is always decoded, so the error arm is unreachable in practice; it keeps
        // the hardware's answer rather than panicking.
        self.0.read(reg.offset() as u32).unwrap_or(UNDECODED_READ)
    }

    fn write32(&self, reg: Reg, value: u32) {
        let _ = self.0.write(reg.offset() as u32, value);
    }
}

/// An emulated card running in this process, with the platform services a driver needs.
pub struct InProcessCard {
    /// The running card.
    pub nic: Nic,
    /// Register access.
    pub regs: SimRegs,
    /// DMA buffers the card can reach.
    pub dma: HostDma,
    /// User-memory registration for the card.
    pub mem: HostMemory,
    /// The card's view of host memory.
    pub map: AddressMap,
}

impl InProcessCard {
    /// Starts a card on `link`.
    pub fn start(config: NicConfig, link: Box<dyn LinkPort>) -> io::Result<Self> {
        let map = AddressMap::new();
        let file = Arc::new(RegisterFile::new());
        let nic = Nic::spawn(
            config,
            Arc::clone(&file),
            Box::new(map.clone()),
            Box::new(map.clone()),
            link,
        )?;
        Ok(Self {
            nic,
            regs: SimRegs::new(file),
            dma: HostDma::new(map.clone()),
            mem: HostMemory::new(map.clone()),
            map,
        })
    }
}
