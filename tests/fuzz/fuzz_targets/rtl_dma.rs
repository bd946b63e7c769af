//! Fuzz target `rtl_dma`: [`bluerdma_fuzz::checks::sim::rtl_dma`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::sim::rtl_dma(data));
