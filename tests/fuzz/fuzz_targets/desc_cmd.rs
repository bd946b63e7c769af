//! Fuzz target `desc_cmd`: [`bluerdma_fuzz::checks::desc::desc_cmd`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::desc::desc_cmd(data));
