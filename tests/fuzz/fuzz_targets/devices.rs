//! Fuzz target `devices`: [`bluerdma_fuzz::checks::devices::devices`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::devices::devices(data));
