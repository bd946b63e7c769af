//! Fuzz target `wire_headers`: [`bluerdma_fuzz::checks::wire::wire_headers`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::wire::wire_headers(data));
