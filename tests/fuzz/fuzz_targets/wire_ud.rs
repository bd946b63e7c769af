//! Fuzz target `wire_ud`: [`bluerdma_fuzz::checks::wire::wire_ud`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::wire::wire_ud(data));
