//! How objects are handed to C: each verb object is a `Box` of a `#[repr(C)]` type whose
//! first field is the `ibv_*` structure the application sees, so the application's pointer
//! is the box's.

use core::ffi::c_int;

/// The library object behind an application's pointer.
///
/// # Safety
/// `p` is NULL or a live object of type `T` whose first field is the ibv struct.
pub(crate) unsafe fn own<'a, T, I>(p: *mut I) -> Option<&'a T> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { &*(p as *const T) })
}

/// Frees an object a verb handed out as a box of `T` (EINVAL for NULL).
///
/// # Safety
/// `p` is NULL or a `Box<T>` made by this library, which the caller gives up.
pub(crate) unsafe fn free<T, I>(p: *mut I) -> c_int {
    if p.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p as *mut T) });
    0
}
