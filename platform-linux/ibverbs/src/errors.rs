//! How a verb reports failure: an errno (set, or returned as the C API says), a log line
//! naming the problem, NULL from a verb that makes an object, and the first request not
//! posted (`bad_wr`).

use core::ffi::c_int;
use std::ptr;

/// Sets `errno` for the calling thread.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The errno for an engine error: what rdma-core's verbs return for the same failure
/// (EFAULT for memory the kernel could not pin, ENOMEM for a full table or queue).
pub(crate) fn errno_of(e: &bluerdma_linux::verbs::Error) -> c_int {
    use bluerdma_core::engine::VerbsError as V;
    use bluerdma_core::platform::PlatformError as P;
    match e.kind {
        V::InvalidArgument { .. }
        | V::Attribute(_)
        | V::Transition(_)
        | V::WrongQpState { .. }
        | V::LocalProtection { .. }
        | V::Fragment(_)
        | V::Descriptor(_) => libc::EINVAL,
        V::NoSuchObject { .. } => libc::EINVAL,
        V::OutOfResources { .. } | V::SendQueueFull => libc::ENOMEM,
        V::Busy { .. } => libc::EBUSY,
        V::Unsupported { .. } => libc::EOPNOTSUPP,
        V::CommandTimeout { .. } => libc::ETIMEDOUT,
        V::CommandFailed { .. } | V::RingRegister(_) => libc::EIO,
        V::Platform(p) => match p {
            P::NotMapped { .. } | P::ReadOnly { .. } => libc::EFAULT,
            P::OutOfMemory { .. } | P::PinFailed { .. } => libc::ENOMEM,
            P::NotPermitted => libc::EPERM,
            P::Disconnected { .. } => libc::ENOTCONN,
            P::WouldBlock => libc::EAGAIN,
            P::Unsupported => libc::EOPNOTSUPP,
            P::Os(e) if e > 0 => e,
            P::Os(_) => libc::EIO,
        },
    }
}

/// Logs `e`, sets errno and returns it.
pub(crate) fn fail(e: bluerdma_linux::verbs::Error) -> c_int {
    log::error!("{e}");
    let errno = errno_of(&e);
    set_errno(errno);
    errno
}

/// Reports a failed object-creating verb: errno set, NULL returned.
pub(crate) fn null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    ptr::null_mut()
}

/// The object a creating verb made, or NULL with errno set to why it did not.
pub(crate) fn or_null<T>(made: Result<*mut T, c_int>) -> *mut T {
    made.unwrap_or_else(null)
}

/// Names `wr` as the first request of a chain not posted.
///
/// # Safety
/// `bad` is NULL or the caller's writable `bad_wr` slot.
pub(crate) unsafe fn set_bad<T>(bad: *mut *mut T, wr: *mut T) {
    if !bad.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *bad = wr };
    }
}

/// The result of a verb that returns an errno: a failure also sets `errno`, as
/// rdma-core's verbs do (their commands fail in the kernel, which sets it).
pub(crate) fn errno_rc(rc: c_int) -> c_int {
    if rc > 0 {
        set_errno(rc);
    }
    rc
}
