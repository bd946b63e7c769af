//! Fuzz target `desc_meta`: [`bluerdma_fuzz::checks::desc::desc_meta`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::desc::desc_meta(data));
