//! Fuzz target `rtl_csr`: [`bluerdma_fuzz::checks::sim::rtl_csr`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::sim::rtl_csr(data));
