//! Meta-report descriptors (core/src/desc/meta.rs), what the driver reads from the card
//! about every received packet and ACK: one descriptor (32-63 bytes of input) or a pair
//! (64 bytes and more).
#![no_main]

use bluerdma_core::desc::meta::MetaReport;
use bluerdma_fuzz::{check_desc_bits, descs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (input, report) = match (descs::<2>(data), descs::<1>(data)) {
        (Some([a, b]), _) => (vec![a, b], MetaReport::decode(&a, Some(&b))),
        (None, Some([a])) => (vec![a], MetaReport::decode(&a, None)),
        _ => return,
    };
    let Ok(report) = report else {
        return;
    };
    let encoded: Vec<_> = match report.encode() {
        (first, Some(second)) => vec![first, second],
        (first, None) => vec![first],
    };
    check_desc_bits("meta report", &input, &report, &encoded, |x| {
        MetaReport::decode(&x[0], x.get(1)).ok()
    });
});
