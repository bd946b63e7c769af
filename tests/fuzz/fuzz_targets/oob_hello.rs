//! Fuzz target `oob_hello`: [`bluerdma_fuzz::checks::oob::oob_hello`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::oob::oob_hello(data));
