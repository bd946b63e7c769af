//! The blue-rdma firmware for the NIC's RISC-V soft-core: a loopback self-test of the card
//! (RDMA WRITE and READ between two QPs of the same card), then halt.
//!
//! Build: `cargo build -p bluerdma-firmware --release --target riscv32imac-unknown-none-elf`.
//! The logic is `bluerdma_baremetal::firmware::firmware_main`, which the host tests run on
//! the emulated NIC (platform-baremetal/tests/firmware_on_emulated_nic.rs). On a host this
//! binary is only a stub, so that workspace-wide builds stay green.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
mod soft_core;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!(
        "bluerdma-firmware runs on the soft-core (riscv32imac-unknown-none-elf); \
         `cargo test -p bluerdma-baremetal` runs its logic on the emulated NIC"
    );
    std::process::exit(2);
}
