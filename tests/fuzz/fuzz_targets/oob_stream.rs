//! Fuzz target `oob_stream`: [`bluerdma_fuzz::checks::oob::oob_stream`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::oob::oob_stream(data));
