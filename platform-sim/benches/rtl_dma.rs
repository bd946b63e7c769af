//! The RTL simulator's DMA socket (`shared/spec/rtl-sim-protocol.md`): how fast the card
//! side ([`DmaServer`], what `bluerdma-sim serve` runs and the cocotb testbench speaks) can
//! read and write the driver's memory through a [`DmaClient`] in this process, 4 KiB per
//! access (one packet's payload). This is the ceiling of every backend that talks the RTL
//! protocol: reads are one JSON line per 32-byte beat and a round trip each, writes one
//! line per beat without a reply.
//!
//! `cargo bench -p bluerdma-sim --bench rtl_dma [-- --seconds S]` (default 2 s per
//! direction); under `cargo test --benches` each runs 50 ms as a smoke test.

use std::time::{Duration, Instant};

use bluerdma_core::addr::DeviceAddr;
use bluerdma_sim::mem::{AddressMap, DmaPort};
use bluerdma_sim::rtl::{DmaClient, DmaClientConfig, DmaServer, DmaServerConfig, RetryPolicy};

const ACCESS: usize = 4096;
const BASE: u64 = 0x4000_0000_0000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<f64>().ok());
    let bench = args.iter().any(|a| a == "--bench");
    let run = Duration::from_secs_f64(secs.unwrap_or(if bench { 2.0 } else { 0.05 }));

    let mut server = DmaServer::bind(DmaServerConfig {
        port: 0,
        ..DmaServerConfig::default()
    })
    .expect("bind the DMA server");
    let map = AddressMap::new();
    let mut memory = vec![0x5Au8; 1 << 20];
    // SAFETY: `memory` outlives the client and the server (both dropped before it).
    unsafe { map.insert(DeviceAddr(BASE), memory.as_mut_ptr(), memory.len()) };
    let client = DmaClient::connect(
        &DmaClientConfig {
            port: server.local_addr().port(),
            retry: RetryPolicy::fixed(Duration::from_millis(10), Duration::from_secs(5)),
        },
        map,
    )
    .expect("connect the DMA client");
    assert!(server.wait_for_driver(Duration::from_secs(5)));
    let mut buf = vec![0u8; ACCESS];
    for (what, write) in [("read", false), ("write", true)] {
        let start = Instant::now();
        let mut bytes = 0u64;
        let mut k = 0u64;
        while start.elapsed() < run {
            let addr = DeviceAddr(BASE + (k * ACCESS as u64) % (1 << 20));
            let r = if write {
                server.write(addr, &buf)
            } else {
                server.read(addr, &mut buf)
            };
            r.expect("DMA access");
            bytes += ACCESS as u64;
            k += 1;
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "rtl_dma {what} 4 KiB: {:.2} MB/s ({k} accesses in {s:.2} s, {:.0} us each)",
            bytes as f64 / s / 1e6,
            s * 1e6 / k as f64
        );
    }
    drop(client);
    drop(server);
    drop(memory);
}
