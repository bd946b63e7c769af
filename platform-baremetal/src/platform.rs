//! The soft-core's platform bundle for the engine: memory-mapped registers, the static DMA
//! pool, identity memory, and no out-of-band transport yet (README "The OOB channel on the
//! soft-core").

use core::marker::PhantomData;

use bluerdma_core::platform::{NoOob, Platform};

use crate::dma::DmaPool;
use crate::memory::IdentityMemory;
use crate::regs::MmioRegs;

/// The bare-metal platform: `Device<Baremetal<'a>, S>` is the driver on the soft-core,
/// drawing DMA memory from a pool that lives for `'a`.
pub struct Baremetal<'a>(PhantomData<&'a DmaPool>);

impl<'a> Platform for Baremetal<'a> {
    type Regs = MmioRegs;
    type Dma = &'a DmaPool;
    type Mem = IdentityMemory;
    type Oob = NoOob;
}
