//! The RTL simulator's socket protocol (`shared/spec/rtl-sim-protocol.md`, corrected by
//! `shared/spec/nic-behaviour.md` section 8.6). Filled in by issue B's RTL-protocol work.
