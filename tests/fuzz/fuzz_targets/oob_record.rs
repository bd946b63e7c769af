//! Fuzz target `oob_record`: [`bluerdma_fuzz::checks::oob::oob_record`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::oob::oob_record(data));
