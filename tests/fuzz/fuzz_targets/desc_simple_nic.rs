//! Fuzz target `desc_simple_nic`: [`bluerdma_fuzz::checks::desc::desc_simple_nic`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::desc::desc_simple_nic(data));
