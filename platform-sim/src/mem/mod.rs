//! Memory as the emulated card sees it.
//!
//! The card reaches host memory only through a [`DmaPort`]. In-process, device addresses
//! are the process's own virtual addresses, and every access is checked against an
//! [`AddressMap`] of the regions the driver handed to the card (ring buffers, staging
//! buffers, registered MRs), so a wrong address from a buggy driver is a counted DMA fault,
//! not a crash. Over the RTL protocol the same map translates the simulator's DMA requests.

mod address_map;
mod host;
pub mod mappings;

pub use address_map::{AddressMap, DmaFault, Region};
pub use host::{device_addr_of, HostDma, HostMemory, DEVICE_OFFSET};

use bluerdma_core::addr::DeviceAddr;

/// The card's bus-master port: DMA reads and writes of host memory.
pub trait DmaPort: Send {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault>;
}
