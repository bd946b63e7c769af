//! What an exported but unsupported verb does: log once that it is not supported, set
//! errno to EOPNOTSUPP and fail (NULL for pointer-returning verbs, EOPNOTSUPP otherwise).
//! build.rs generates one per symbol of the installed libibverbs this crate does not
//! implement; most of them (the `ibv_cmd_*` provider ABI) exist only so that provider
//! libraries such as libmlx5, which perftest links, can load.

use std::collections::HashSet;
use std::sync::Mutex;

pub(crate) fn unsupported(name: &'static str) {
    crate::logging::init_log();
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(name) {
        log::warn!("{name} is not supported by the blue-rdma libibverbs");
    }
    crate::errors::set_errno(libc::EOPNOTSUPP);
}

macro_rules! stub {
    (ptr $f:ident, $name:literal) => {
        #[no_mangle]
        pub extern "C" fn $f() -> *mut core::ffi::c_void {
            $crate::stubs::unsupported($name);
            core::ptr::null_mut()
        }
    };
    (noop $f:ident, $name:literal) => {
        #[no_mangle]
        pub extern "C" fn $f() {}
    };
    (int $f:ident, $name:literal) => {
        #[no_mangle]
        pub extern "C" fn $f() -> core::ffi::c_int {
            $crate::stubs::unsupported($name);
            libc::EOPNOTSUPP
        }
    };
}
pub(crate) use stub;
