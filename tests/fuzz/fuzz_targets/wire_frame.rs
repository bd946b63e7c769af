//! Fuzz target `wire_frame`: [`bluerdma_fuzz::checks::wire::wire_frame`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::wire::wire_frame(data));
