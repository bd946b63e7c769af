//! Contexts: an opened device (`struct verbs_context` around `ibv_context`), the engine it
//! starts on the device's backend on first use ([`bluerdma_linux::devices::open`]) and
//! shares with the device's other contexts, and its asynchronous events (none are
//! generated yet).
//!
//! The function tables a context carries are the entry layer's (`ops.rs`), which opens and
//! closes contexts through [`Ctx::open`] and [`Ctx::take`].

use core::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bluerdma_linux::devices::Settings;
use bluerdma_linux::verbs::{Context, DeviceSpec};

use crate::abi::*;
use crate::caps;
use crate::device::{device, Device};

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
    /// `async_fd` is the read end of this pipe; nothing writes to it yet (no async events
    /// are generated), so it never becomes readable.
    async_pipe: [c_int; 2],
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
        let ctx = Box::new(Ctx {
            ext: ext_ops,
            sz: ext::SIZE,
            ibv: IbvContext {
                device: dev,
                ops,
                cmd_fd: -1,
                async_fd: fds[0],
                num_comp_vectors: 1,
                _pad: 0,
                mutex: [0; 40],
                abi_compat: usize::MAX as *mut c_void,
            },
            dev: d,
            engine: Mutex::new(None),
            async_pipe: fds,
        });
        let ctx = Box::into_raw(ctx);
        // SAFETY: just allocated; the application gets the embedded ibv_context.
        unsafe { ptr::addr_of_mut!((*ctx).ibv) }
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
        *shared = Arc::downgrade(&c);
        *e = Some(Arc::clone(&c));
        Ok(c)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        for fd in self.async_pipe {
            // SAFETY: our pipe's descriptors.
            unsafe { libc::close(fd) };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_async_event(
    ctx: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -1;
    };
    let mut b = [0u8; 8];
    // Blocks (or fails with EAGAIN on a non-blocking fd) like the real call: no
    // asynchronous event is generated by this device yet.
    // SAFETY: reading into a local buffer.
    let n = unsafe { libc::read(c.ibv.async_fd, b.as_mut_ptr() as *mut c_void, 8) };
    if n != 8 || event.is_null() {
        return -1;
    }
    -1
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_ack_async_event(_event: *mut IbvAsyncEvent) {}
