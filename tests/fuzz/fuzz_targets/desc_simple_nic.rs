//! Simple-NIC descriptors (core/src/desc/simple_nic.rs): a TX descriptor as the emulated
//! card reads it and an RX descriptor as the driver reads it from the card.
#![no_main]

use bluerdma_core::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_SLOTS};
use bluerdma_fuzz::{check_desc_bits, descs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some([d]) = descs::<1>(data) else {
        return;
    };
    let tx = SimpleNicTx::decode(&d);
    check_desc_bits("simple-NIC TX", &[d], &tx, &[tx.encode()], |x| {
        Some(SimpleNicTx::decode(&x[0]))
    });
    if let Ok(rx) = SimpleNicRx::decode(&d) {
        assert!(
            rx.slot_idx < RX_SLOTS,
            "slot {} out of the buffer",
            rx.slot_idx
        );
        check_desc_bits("simple-NIC RX", &[d], &rx, &[rx.encode()], |x| {
            SimpleNicRx::decode(&x[0]).ok()
        });
    }
});
