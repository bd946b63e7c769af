//! A card behind the RTL simulator's sockets as a backend (feature `rtl`;
//! `shared/spec/rtl-sim-protocol.md`): registers over the CSR socket, host memory served to
//! the card over the DMA socket from this process's address map
//! ([`bluerdma_sim::serve::RtlAttach`]). The same client talks to the cocotb simulation of
//! the RTL and to the emulated card of `bluerdma-sim serve`. The map may hold memory of
//! other processes too ([`BackendHandle::remote_memory`]).

use std::sync::Arc;
use std::time::Duration;

use bluerdma_core::addr::DeviceAddr;
use bluerdma_sim::mem::RemoteMappings;
use bluerdma_sim::rtl::{CsrClientConfig, DmaClient, DmaClientConfig, RetryPolicy};
use bluerdma_sim::serve::RtlAttach;

use super::{
    register_counters, Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs,
    OpenError, RemoteMemory, RtlConfig,
};

/// Keeps the DMA client's thread answering the card, and reads the card's counters.
struct Handle {
    dma: DmaClient,
    regs: DynRegs,
    /// Other processes' memory in the map the DMA client answers from.
    remote: Arc<RemoteMappings>,
}

impl BackendHandle for Handle {
    fn card_stats(&self) -> String {
        format!(
            "{:?} {}",
            self.dma.stats(),
            register_counters(self.regs.0.as_ref())
        )
    }

    fn watch_tx_frames(&self, buffers: &[(DeviceAddr, usize)]) {
        self.dma.watch_reads(buffers);
    }

    fn tx_frame_bytes_read(&self) -> Option<u64> {
        Some(self.dma.stats().watched_bytes_read)
    }

    fn remote_memory(&self) -> Option<Arc<dyn RemoteMemory>> {
        Some(self.remote.clone())
    }
}

/// Connects to the simulator for device `name`.
pub fn open(name: &str, cfg: &RtlConfig) -> Result<Backend, OpenError> {
    let give_up = cfg
        .connect_timeout
        .unwrap_or_else(|| cfg.simulator.connect_timeout());
    let retry = RetryPolicy::SIMULATOR.giving_up_after(give_up);
    let tuning = cfg.simulator.tuning();
    let csr = CsrClientConfig {
        port: cfg.csr_port,
        retry,
        reply_timeout: tuning.command_timeout.max(Duration::from_secs(30)),
    };
    let dma = DmaClientConfig {
        port: cfg.dma_port,
        retry,
    };
    let attach = RtlAttach::connect_with(&csr, &dma).map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(match e.kind() {
            std::io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
            std::io::ErrorKind::TimedOut => libc::ETIMEDOUT,
            _ => libc::EIO,
        });
        OpenError::new(
            name,
            errno,
            format!(
                "the RTL simulator (CSR 127.0.0.1:{}, DMA 127.0.0.1:{}): {e}; start it (the \
                 cocotb testbench, or `bluerdma-sim serve --csr-port {} --dma-port {}`) or fix \
                 the ports in the device entry (`+rtl:CSR/DMA`)",
                cfg.csr_port, cfg.dma_port, cfg.csr_port, cfg.dma_port
            ),
        )
    })?;
    let RtlAttach {
        regs,
        dma,
        mem,
        map,
        dma_client,
    } = attach;
    let regs = DynRegs(Arc::new(regs));
    Ok(Backend {
        kind: BackendKind::Rtl,
        regs: regs.clone(),
        dma: DynDma(Box::new(dma)),
        mem: DynMem(Box::new(mem)),
        tuning,
        buffers: BufferKind::Heap,
        handle: Box::new(Handle {
            dma: dma_client,
            regs,
            remote: Arc::new(RemoteMappings::new(map)),
        }),
        inline: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_listening_is_econnrefused_naming_the_ports_and_the_server() {
        // Port 1 on loopback is never listening in a test environment.
        let cfg = RtlConfig {
            csr_port: 1,
            dma_port: 1,
            connect_timeout: Some(Duration::from_millis(150)),
            ..RtlConfig::default()
        };
        let e = open("blue0", &cfg).unwrap_err();
        assert_eq!(e.errno, libc::ECONNREFUSED, "{e}");
        let text = e.to_string();
        assert!(text.starts_with("blue0: the RTL simulator"), "{text}");
        assert!(text.contains("bluerdma-sim serve --csr-port 1"), "{text}");
        assert!(text.contains("+rtl:CSR/DMA"), "{text}");
    }
}
