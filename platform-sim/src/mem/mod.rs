//! Memory as the emulated card sees it.
//!
//! The card reaches host memory only through a [`DmaPort`]. In-process, device addresses
//! are the process's own virtual addresses, and every access is checked against an
//! [`AddressMap`] of the regions the driver handed to the card (ring buffers, staging
//! buffers, registered MRs), so a wrong address from a buggy driver is a counted DMA fault,
//! not a crash. Over the RTL protocol the same map translates the simulator's DMA requests.
//!
//! The map may also hold regions of other processes ([`RemoteRegion`], reached with
//! `process_vm_readv`/`process_vm_writev`): a daemon that owns the card serves clients
//! whose memory it maps with [`RemoteMappings`], at device addresses of an IOVA window
//! ([`IovaWindow`]) above every local one.

mod address_map;
mod host;
mod iova;
pub mod mappings;
mod remote;

pub use address_map::{AddressMap, DmaFault, Region};
pub use host::{device_addr_of, HostDma, HostMemory, DEVICE_OFFSET};
pub use iova::{IovaWindow, IOVA_BASE, IOVA_END};
pub use remote::{RemoteMappings, RemoteRegion};

use bluerdma_core::addr::DeviceAddr;

/// The card's bus-master port: DMA reads and writes of host memory.
pub trait DmaPort: Send {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault>;
}
