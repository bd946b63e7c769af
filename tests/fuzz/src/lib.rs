//! The checks of the fuzz targets (`fuzz_targets/`, one binary each): see [`checks`].

pub mod checks;

pub use checks::TARGETS;
