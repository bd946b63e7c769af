//! Fuzz target `wire_ack`: [`bluerdma_fuzz::checks::wire::wire_ack`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::wire::wire_ack(data));
