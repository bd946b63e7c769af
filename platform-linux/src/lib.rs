//! Linux platform of the blue-rdma driver (issue E / C / D fill this in): PCI BAR0 through
//! sysfs `resource0`, DMA memory (u-dma-buf, hugepages), pinning and `/proc/self/pagemap`
//! translation, the out-of-band channel over TCP, and the thread-safe verbs API.
#![deny(missing_docs)]

pub use bluerdma_core as core;
