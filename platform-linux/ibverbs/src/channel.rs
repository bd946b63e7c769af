//! Completion channels: a pipe per channel; a CQ armed with ibv_req_notify_cq writes its
//! `ibv_cq` pointer to the pipe when a completion arrives, and ibv_get_cq_event (`cq.rs`)
//! reads it.

use core::ffi::c_int;
use std::ptr;

use crate::abi::*;
use crate::errors::{errno_rc, null};
use crate::live::{self, Kind};

#[repr(C)]
pub(crate) struct Channel {
    pub ibv: IbvCompChannel,
    /// The pipe's write end; each event is one `ibv_cq` pointer.
    pub write_fd: c_int,
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_comp_channel(ctx: *mut IbvContext) -> *mut IbvCompChannel {
    if live::check(Kind::Ctx, ctx, "create_comp_channel").is_err() {
        return null(libc::EINVAL);
    }
    let mut fds = [-1; 2];
    // SAFETY: room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return ptr::null_mut();
    }
    let b = Box::new(Channel {
        ibv: IbvCompChannel {
            context: ctx,
            fd: fds[0],
            refcnt: 0,
        },
        write_fd: fds[1],
    });
    let ch = Box::into_raw(b);
    live::add(Kind::Channel, ch, ctx);
    ch as *mut IbvCompChannel
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_destroy_comp_channel(ch) })
}

/// The work of [`bv_ibv_destroy_comp_channel`]: 0, or the errno it returns (and sets).
unsafe fn ibv_destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    if let Err(e) = live::check(Kind::Channel, ch, "destroy_comp_channel") {
        return e;
    }
    // SAFETY: made by ibv_create_comp_channel.
    let c = unsafe { &*(ch as *const Channel) };
    if c.ibv.refcnt != 0 {
        log::error!("destroy_comp_channel: {} CQs still use it", c.ibv.refcnt);
        return libc::EBUSY;
    }
    live::take(Kind::Channel, ch);
    // SAFETY: made by ibv_create_comp_channel; the caller gives it up.
    let c = unsafe { Box::from_raw(ch as *mut Channel) };
    // SAFETY: the channel's own descriptors.
    unsafe {
        libc::close(c.ibv.fd);
        libc::close(c.write_fd);
    }
    0
}
