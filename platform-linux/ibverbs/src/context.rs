//! Contexts: an opened device (`struct verbs_context` around `ibv_context`), the engine it
//! starts on the device's backend on first use ([`bluerdma_linux::devices::open`]) and
//! shares with the device's other contexts, and its asynchronous event file (`async_fd`):
//! events are written to it as 16-byte records (the object, the event type) and read back
//! by ibv_get_async_event.
//!
//! The function tables a context carries and the routing of the engine's events to the
//! context that owns the object are the entry layer's (`ops.rs`, `async_events.rs`), which
//! opens and closes contexts through [`Ctx::open`] and [`Ctx::take`].

use core::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bluerdma_core::engine::AsyncEvent;
use bluerdma_linux::devices::Settings;
use bluerdma_linux::verbs::{Context, DeviceSpec};

use crate::abi::*;
use crate::caps;
use crate::device::{device, Device};
use crate::errors::{errno_rc, set_errno};
use crate::live::{self, Kind};

/// Where the events of a device's engine go (called on its progress thread).
pub(crate) type EventSink = fn(&'static Device, AsyncEvent);

/// An opened device: `struct verbs_context` (extended ops, `sz`, then `ibv_context`), then
/// our state. Applications hold `&ibv`.
#[repr(C)]
pub(crate) struct Ctx {
    ext: [usize; ext::WORDS],
    sz: usize,
    pub ibv: IbvContext,
    pub dev: &'static Device,
    /// The device's emulated card and engine ([`Device`] shares it between contexts),
    /// started by the first object made on the context.
    engine: Mutex<Option<Arc<Context>>>,
    /// `async_fd` is the read end of this pipe; [`Ctx::post_event`] writes to the other
    /// (non-blocking: an event that finds the pipe full is dropped and logged).
    async_pipe: [c_int; 2],
    /// `cmd_fd`: this library sends no commands through a file, but programs expect a valid
    /// descriptor there (they dup, poll or fstat it; pyverbs dups it for
    /// ibv_import_device, which then fails with EOPNOTSUPP): `/dev/null`, or -1 if it
    /// cannot be opened.
    cmd_fd: c_int,
    /// Where the events of the engine this context starts go.
    on_event: EventSink,
}

const _: () = assert!(core::mem::offset_of!(Ctx, ibv) == 320);

impl Ctx {
    /// # Safety
    /// `ctx` must come from [`Ctx::open`] and not be closed.
    pub unsafe fn from_ibv<'a>(ctx: *mut IbvContext) -> Option<&'a Ctx> {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: `ibv` sits at offset 320 of a live `Ctx`.
        Some(unsafe { &*((ctx as *mut u8).sub(320) as *const Ctx) })
    }

    /// A new context on `dev` whose `ibv_context` carries `ops` ([`ops`] indexes) and whose
    /// `verbs_context` carries `ext_ops` ([`ext`] indexes); NULL with errno set when `dev`
    /// is not a device (ENODEV) or no pipe could be made.
    ///
    /// # Safety
    /// `dev` is NULL or a device pointer from ibv_get_device_list.
    pub unsafe fn open(
        dev: *mut IbvDevice,
        ops: [usize; 32],
        ext_ops: [usize; ext::WORDS],
        on_event: EventSink,
    ) -> *mut IbvContext {
        // SAFETY: the caller's contract.
        let Some(d) = (unsafe { device(dev) }) else {
            crate::errors::set_errno(libc::ENODEV);
            return ptr::null_mut();
        };
        let mut fds = [-1; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return ptr::null_mut();
        }
        // SAFETY: our pipe's write end.
        unsafe {
            let fl = libc::fcntl(fds[1], libc::F_GETFL);
            libc::fcntl(fds[1], libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        // SAFETY: a NUL-terminated path; the descriptor is ours until Drop.
        let cmd_fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        let ctx = Box::new(Ctx {
            ext: ext_ops,
            sz: ext::SIZE,
            ibv: IbvContext {
                device: dev,
                ops,
                cmd_fd,
                async_fd: fds[0],
                num_comp_vectors: 1,
                _pad: 0,
                mutex: [0; 40],
                abi_compat: usize::MAX as *mut c_void,
            },
            dev: d,
            engine: Mutex::new(None),
            async_pipe: fds,
            cmd_fd,
            on_event,
        });
        let ctx = Box::into_raw(ctx);
        // SAFETY: just allocated; the application gets the embedded ibv_context.
        let ibv = unsafe { ptr::addr_of_mut!((*ctx).ibv) };
        live::add(Kind::Ctx, ibv, ibv);
        ibv
    }

    /// Writes an event about `element` (an `ibv_cq`, `ibv_qp`, ...) to the async file.
    pub fn post_event(&self, element: *mut c_void, event_type: u32) {
        let mut rec = [0u8; 16];
        rec[..8].copy_from_slice(&(element as u64).to_ne_bytes());
        rec[8..12].copy_from_slice(&event_type.to_ne_bytes());
        // SAFETY: writes 16 bytes from a local buffer to our pipe.
        let n = unsafe { libc::write(self.async_pipe[1], rec.as_ptr() as *const c_void, 16) };
        if n != 16 {
            log::error!(
                "async event {event_type} for {element:p} lost: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Takes back a context the application closes; dropping it closes its descriptors.
    ///
    /// # Safety
    /// `ctx` is NULL or an open context, which the caller gives up.
    pub unsafe fn take(ctx: *mut IbvContext) -> Option<Box<Ctx>> {
        // SAFETY: the caller passes an open context.
        let c = unsafe { Ctx::from_ibv(ctx) }? as *const Ctx as *mut Ctx;
        // SAFETY: allocated by Box in Ctx::open; the caller gives it up.
        Some(unsafe { Box::from_raw(c) })
    }

    /// The engine, if an object made on this context started it.
    pub fn started_engine(&self) -> Option<Arc<Context>> {
        self.engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The engine, started on first use.
    pub fn engine(&self) -> Result<Arc<Context>, c_int> {
        let mut e = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = e.as_ref() {
            return Ok(Arc::clone(c));
        }
        let mut shared = self.dev.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = shared.upgrade() {
            *e = Some(Arc::clone(&c));
            return Ok(c);
        }
        let settings = Settings::from_env().map_err(|e| {
            log::error!("{e}");
            libc::EINVAL
        })?;
        let list = crate::device::list().ok_or(libc::ENODEV)?;
        let mut spec: DeviceSpec = self.dev.entry.spec();
        spec.name = format!("bluerdma{}", self.dev.index);
        spec.capacity = caps::capacity();
        // Where every connection starts on the wire (both ends must agree; the C tests use
        // 0xFFFFF0 to cross the 24-bit wrap).
        settings.apply(&mut spec);
        let c = bluerdma_linux::devices::open(list, &self.dev.entry, spec, &settings).map_err(
            |err| {
                // The reason and the fix once; later attempts fail with the same errno.
                if !self.dev.open_failure_shown.swap(true, Ordering::Relaxed) {
                    log::error!(
                        "{err} ({} device {} at {}; fails with {})",
                        self.dev.entry.backend.kind(),
                        self.dev.entry.name,
                        self.dev.entry.ip,
                        err.errno_name()
                    );
                }
                err.errno
            },
        )?;
        let c = Arc::new(c);
        let (dev, sink) = (self.dev, self.on_event);
        c.set_event_handler(Some(Box::new(move |e| sink(dev, e))));
        *shared = Arc::downgrade(&c);
        *e = Some(Arc::clone(&c));
        Ok(c)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        for fd in self
            .async_pipe
            .into_iter()
            .chain([self.cmd_fd])
            .filter(|fd| *fd >= 0)
        {
            // SAFETY: our pipe's descriptors and our /dev/null.
            unsafe { libc::close(fd) };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_async_event(
    ctx: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_get_async_event(ctx, event) })
}

/// The work of [`bv_ibv_get_async_event`]: 0, or the errno it returns (and sets).
unsafe fn ibv_get_async_event(ctx: *mut IbvContext, event: *mut IbvAsyncEvent) -> c_int {
    // SAFETY: the caller passes an open context.
    let (Some(c), false) = ((unsafe { Ctx::from_ibv(ctx) }), event.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let mut rec = [0u8; 16];
    // Blocks until an event comes (or fails with EAGAIN on a non-blocking fd), like the
    // real call.
    // SAFETY: reading into a local buffer.
    let n = unsafe { libc::read(c.ibv.async_fd, rec.as_mut_ptr() as *mut c_void, 16) };
    if n != 16 {
        return -1;
    }
    let element = u64::from_ne_bytes(rec[..8].try_into().unwrap_or_default()) as *mut c_void;
    let event_type = u32::from_ne_bytes(rec[8..12].try_into().unwrap_or_default());
    // SAFETY: the caller passes room for an ibv_async_event.
    unsafe {
        event.write(IbvAsyncEvent {
            element,
            event_type,
            _pad: 0,
        })
    };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_ack_async_event(event: *mut IbvAsyncEvent) {
    if event.is_null() {
        return;
    }
    // SAFETY: an event ibv_get_async_event filled in; its object is live until the
    // application destroys it, which it does after acknowledging its events.
    unsafe {
        let e = &*event;
        match e.event_type {
            IBV_EVENT_CQ_ERR if live::is(Kind::Cq, e.element) => {
                let cq = e.element as *mut IbvCq;
                (*cq).async_events_completed = (*cq).async_events_completed.wrapping_add(1);
            }
            IBV_EVENT_QP_FATAL if live::is(Kind::Qp, e.element) => {
                let qp = e.element as *mut IbvQp;
                (*qp).events_completed = (*qp).events_completed.wrapping_add(1);
            }
            _ => {}
        }
    }
}
