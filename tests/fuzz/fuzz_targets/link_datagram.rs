//! Fuzz target `link_datagram`: [`bluerdma_fuzz::checks::sim::link_datagram`] on libFuzzer's input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bluerdma_fuzz::checks::sim::link_datagram(data));
