//! Fuzz target `desc_send`: [`bluerdma_fuzz::checks::desc::desc_send`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::desc::desc_send(data));
