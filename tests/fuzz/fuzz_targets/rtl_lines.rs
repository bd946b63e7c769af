//! Fuzz target `rtl_lines`: [`bluerdma_fuzz::checks::sim::rtl_lines`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::sim::rtl_lines(data));
