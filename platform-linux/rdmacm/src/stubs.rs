//! What an exported but unsupported call does: log once that it is not supported, set
//! errno to ENOSYS and return -1. build.rs generates one per symbol of the installed
//! librdmacm this crate does not implement: the rsocket calls (`rsocket`, `rsend`, ...),
//! multicast (`rdma_join_multicast*`, `rdma_leave_multicast`) and ECE
//! (`rdma_set_local_ece`, `rdma_get_remote_ece`). Every one of them returns an int, a
//! `ssize_t` or an `off_t`; -1 in a 64-bit register is -1 in each.

use std::collections::HashSet;
use std::sync::Mutex;

pub(crate) fn unsupported(name: &'static str) -> isize {
    crate::init_log();
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(name) {
        log::warn!("{name} is not supported by the blue-rdma librdmacm");
    }
    crate::set_errno(libc::ENOSYS);
    -1
}

macro_rules! stub {
    ($f:ident, $name:literal) => {
        #[no_mangle]
        pub extern "C" fn $f() -> isize {
            $crate::stubs::unsupported($name)
        }
    };
}
pub(crate) use stub;
