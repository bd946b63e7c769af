//! End-to-end tests across crates live in `tests/tests/`; this library holds their helpers.
#![deny(missing_docs)]
