//! Event channels and events.
//!
//! A channel is a queue of events and a Unix socket pair: each queued event is one byte
//! written to our end, so the application's end (`channel->fd`) is readable exactly while
//! events wait, and `poll`/`epoll` on it work. `rdma_get_cm_event` reads one byte (blocking
//! unless the application made the fd non-blocking, then EAGAIN) and pops one event. Events
//! of a destroyed id are removed together with their bytes.
//!
//! An event is a heap [`EventBox`] whose first field is the `struct rdma_cm_event` the
//! application sees; its private data lives in the box. `rdma_ack_cm_event` frees it.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::state::{OwnChannel, Token};

/// What `rdma_get_cm_event` does with an event before the application sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Post {
    None,
    /// Give the new id its context and protection domain.
    ConnectRequest,
    /// Move the id's QP to RTR and RTS and answer RTU: ESTABLISHED, or CONNECT_RESPONSE
    /// when the application manages its own QP.
    ConnectResponse,
}

/// One event; `ev` must stay the first field (the application holds `&ev`).
#[repr(C)]
pub(crate) struct EventBox {
    pub(crate) ev: RdmaCmEvent,
    /// The id the event is about, and the listener of a connect request (else 0).
    pub(crate) token: Token,
    pub(crate) listen: Token,
    pub(crate) post: Post,
    data: [u8; 256],
}

// SAFETY: the raw pointers in an event name ids and private data that the library owns;
// an event is handed between threads whole (queued by one, retrieved by another).
unsafe impl Send for EventBox {}

impl EventBox {
    pub(crate) fn new(token: Token, id: *mut RdmaCmId, event: c_int, status: c_int) -> Box<Self> {
        Box::new(EventBox {
            ev: RdmaCmEvent {
                id,
                listen_id: core::ptr::null_mut(),
                event,
                status,
                param: RdmaEventParam {
                    ud: RdmaUdParam {
                        private_data: core::ptr::null(),
                        private_data_len: 0,
                        _pad: [0; 7],
                        ah_attr: IbvAhAttr::default(),
                        qp_num: 0,
                        qkey: 0,
                    },
                },
            },
            token,
            listen: 0,
            post: Post::None,
            data: [0; 256],
        })
    }

    /// Connection parameters with `private` as their private data.
    pub(crate) fn set_conn(&mut self, mut conn: RdmaConnParam, private: &[u8]) {
        let n = private.len().min(self.data.len()).min(255);
        self.data[..n].copy_from_slice(&private[..n]);
        conn.private_data = if n > 0 {
            self.data.as_ptr() as *const c_void
        } else {
            core::ptr::null()
        };
        conn.private_data_len = n as u8;
        self.ev.param.conn = conn;
    }

    /// UD parameters with `private` as their private data.
    pub(crate) fn set_ud(&mut self, ah: IbvAhAttr, qpn: u32, qkey: u32, private: &[u8]) {
        let n = private.len().min(self.data.len()).min(255);
        self.data[..n].copy_from_slice(&private[..n]);
        self.ev.param.ud = RdmaUdParam {
            private_data: if n > 0 {
                self.data.as_ptr() as *const c_void
            } else {
                core::ptr::null()
            },
            private_data_len: n as u8,
            _pad: [0; 7],
            ah_attr: ah,
            qp_num: qpn,
            qkey,
        };
    }
}

/// A queued event (owned by the queue until popped).
struct Queued(NonNull<EventBox>);

// SAFETY: see EventBox.
unsafe impl Send for Queued {}

/// The shared part of a channel: both ends of the socket pair and the queue.
pub(crate) struct ChannelInner {
    app_fd: c_int,
    our_fd: c_int,
    queue: Mutex<VecDeque<Queued>>,
}

impl ChannelInner {
    /// Queues `ev` and makes the application's fd readable.
    pub(crate) fn push(&self, ev: Box<EventBox>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Queued(NonNull::from(Box::leak(ev))));
        let b = 1u8;
        // SAFETY: our end of the pair; one byte from a live local. A full buffer (hundreds
        // of thousands of unread events) loses the byte, never the event.
        let n = unsafe {
            libc::send(
                self.our_fd,
                &b as *const u8 as *const c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n != 1 {
            log::warn!(
                "event channel fd {}: could not signal an event",
                self.app_fd
            );
        }
    }

    /// Waits for the next event, as `rdma_get_cm_event` does; the errno on failure.
    pub(crate) fn pop(&self) -> Result<Box<EventBox>, c_int> {
        loop {
            let mut b = 0u8;
            // SAFETY: the application's end; blocking unless the application set O_NONBLOCK.
            let n = unsafe { libc::recv(self.app_fd, &mut b as *mut u8 as *mut c_void, 1, 0) };
            if n < 0 {
                // SAFETY: errno of this thread.
                return Err(unsafe { *libc::__errno_location() });
            }
            if n == 0 {
                return Err(libc::EBADF);
            }
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(Queued(p)) = q.pop_front() {
                // SAFETY: leaked by push, owned by the queue until now.
                return Ok(unsafe { Box::from_raw(p.as_ptr()) });
            }
            // The event of this byte was removed with its id; wait for the next one.
        }
    }

    /// Removes the events `pick` selects, with their bytes, and returns them (boxed: the
    /// application knows events by address).
    #[allow(clippy::vec_box)]
    pub(crate) fn take(&self, mut pick: impl FnMut(&EventBox) -> bool) -> Vec<Box<EventBox>> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = VecDeque::with_capacity(q.len());
        let mut out = Vec::new();
        for Queued(p) in q.drain(..) {
            // SAFETY: owned by the queue.
            if pick(unsafe { p.as_ref() }) {
                // SAFETY: as above; it leaves the queue.
                out.push(unsafe { Box::from_raw(p.as_ptr()) });
            } else {
                kept.push_back(Queued(p));
            }
        }
        *q = kept;
        let mut left = out.len();
        let mut buf = [0u8; 64];
        while left > 0 {
            // SAFETY: the application's end; never blocks (MSG_DONTWAIT).
            let n = unsafe {
                libc::recv(
                    self.app_fd,
                    buf.as_mut_ptr() as *mut c_void,
                    left.min(buf.len()),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                // A reader holds the byte; it will find the queue without this event.
                break;
            }
            left -= n as usize;
        }
        out
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        let q = self.queue.get_mut().unwrap_or_else(|e| e.into_inner());
        for Queued(p) in q.drain(..) {
            // SAFETY: owned by the queue, which is going away.
            drop(unsafe { Box::from_raw(p.as_ptr()) });
        }
        // SAFETY: both fds belong to this channel.
        unsafe {
            libc::close(self.app_fd);
            libc::close(self.our_fd);
        }
    }
}

/// The addresses of the live channels: a pointer the library did not make (or already
/// freed) is refused with EINVAL, not followed.
static LIVE_CHANNELS: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(Default::default);

fn set(
    s: &'static LazyLock<Mutex<HashSet<usize>>>,
) -> std::sync::MutexGuard<'static, HashSet<usize>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// An event the application holds: the ids it is about and the thread it went to.
struct Held {
    token: Token,
    listen: Token,
    thread: ThreadId,
}

/// The events handed to the application and not yet acknowledged, by address (an address
/// that is not here is no event of this library, or one already acknowledged); the condvar
/// is signalled at every acknowledgement.
static HANDED_OUT: LazyLock<(Mutex<HashMap<usize, Held>>, Condvar)> =
    LazyLock::new(Default::default);

fn handed_out() -> std::sync::MutexGuard<'static, HashMap<usize, Held>> {
    HANDED_OUT.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// Gives an event to the application (until [`take_back`]).
pub(crate) fn hand_out(ev: Box<EventBox>) -> *mut RdmaCmEvent {
    let held = Held {
        token: ev.token,
        listen: ev.listen,
        thread: std::thread::current().id(),
    };
    let p = Box::into_raw(ev);
    handed_out().insert(p as usize, held);
    p as *mut RdmaCmEvent
}

/// The event the application gives back, if it is one [`hand_out`] gave.
pub(crate) fn take_back(p: *mut RdmaCmEvent) -> Option<Box<EventBox>> {
    let held = handed_out().remove(&(p as usize));
    HANDED_OUT.1.notify_all();
    // SAFETY: the address was handed out by hand_out and not yet taken back.
    held.map(|_| unsafe { Box::from_raw(p as *mut EventBox) })
}

/// Waits until the application has acknowledged every event about the id `token` (or of
/// the listener `token`) it was handed, as `rdma_destroy_id` does before it frees the id:
/// a thread still in its event handler reads the id through `event->id`. Events held by
/// the calling thread cannot be acknowledged meanwhile and are not waited for; after
/// `limit` the id is freed anyway. Returns how many were left unacknowledged.
pub(crate) fn wait_acknowledged(token: Token, limit: Duration) -> usize {
    let me = std::thread::current().id();
    let deadline = Instant::now() + limit;
    let mut held = handed_out();
    loop {
        let about = |h: &Held| h.token == token || h.listen == token;
        let others = held.values().filter(|h| about(h) && h.thread != me).count();
        let mine = held.values().filter(|h| about(h) && h.thread == me).count();
        let now = Instant::now();
        if others == 0 || now >= deadline {
            return others + mine;
        }
        held = HANDED_OUT
            .1
            .wait_timeout(held, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// What `rdma_create_event_channel` returns; `c` must stay the first field.
#[repr(C)]
pub(crate) struct ChannelBox {
    pub(crate) c: RdmaEventChannel,
    pub(crate) inner: Arc<ChannelInner>,
}

impl ChannelBox {
    /// A new channel, or the errno of `socketpair`.
    pub(crate) fn new() -> Result<Box<ChannelBox>, c_int> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: `fds` has room for both ends.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            // SAFETY: errno of this thread.
            return Err(unsafe { *libc::__errno_location() });
        }
        let inner = Arc::new(ChannelInner {
            app_fd: fds[0],
            our_fd: fds[1],
            queue: Mutex::new(VecDeque::new()),
        });
        let b = Box::new(ChannelBox {
            c: RdmaEventChannel { fd: fds[0] },
            inner,
        });
        set(&LIVE_CHANNELS).insert(&*b as *const ChannelBox as usize);
        Ok(b)
    }

    /// The channel behind an application's pointer; None for NULL and for a pointer that
    /// is not a live channel of this library.
    ///
    /// # Safety
    /// The channel is not destroyed while the reference is used.
    pub(crate) unsafe fn from_c<'a>(p: *mut RdmaEventChannel) -> Option<&'a ChannelBox> {
        if !set(&LIVE_CHANNELS).contains(&(p as usize)) {
            return None;
        }
        // SAFETY: a live ChannelBox, whose first field is `c`.
        unsafe { (p as *const ChannelBox).as_ref() }
    }
}

impl Drop for ChannelBox {
    fn drop(&mut self) {
        set(&LIVE_CHANNELS).remove(&(self as *const ChannelBox as usize));
    }
}

/// The channel of an id: the application's `channel`, or for NULL (synchronous mode) a new
/// one the id owns; EINVAL for a pointer that is no channel of this library.
///
/// # Safety
/// `channel` is not destroyed meanwhile.
pub(crate) unsafe fn attach(
    channel: *mut RdmaEventChannel,
) -> Result<(Arc<ChannelInner>, *mut RdmaEventChannel, Option<OwnChannel>), c_int> {
    // SAFETY: per the contract.
    if let Some(ch) = unsafe { ChannelBox::from_c(channel) } {
        return Ok((Arc::clone(&ch.inner), channel, None));
    }
    if !channel.is_null() {
        log::error!("{channel:p} is not an event channel of this library (destroyed?)");
        return Err(libc::EINVAL);
    }
    let b = ChannelBox::new()?;
    let inner = Arc::clone(&b.inner);
    let p = Box::into_raw(b);
    Ok((inner, p as *mut RdmaEventChannel, Some(OwnChannel(p))))
}

#[no_mangle]
pub extern "C" fn cm_rdma_create_event_channel() -> *mut RdmaEventChannel {
    crate::init_log();
    if crate::verbs::devices().is_empty() {
        // As the real library does: no device, no CM.
        crate::set_errno(libc::ENODEV);
        return core::ptr::null_mut();
    }
    match ChannelBox::new() {
        Ok(b) => Box::into_raw(b) as *mut RdmaEventChannel,
        Err(e) => {
            log::error!("rdma_create_event_channel: socketpair failed: errno {e}");
            crate::set_errno(e);
            core::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_destroy_event_channel(channel: *mut RdmaEventChannel) {
    // SAFETY: a live channel (checked), which the application gives up. Ids that still use
    // it keep the queue alive (their events go nowhere).
    if unsafe { ChannelBox::from_c(channel) }.is_some() {
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(channel as *mut ChannelBox) });
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_get_cm_event(
    channel: *mut RdmaEventChannel,
    event: *mut *mut RdmaCmEvent,
) -> c_int {
    // SAFETY: the application passes a live channel.
    let Some(ch) = (unsafe { ChannelBox::from_c(channel) }) else {
        return crate::err(libc::EINVAL);
    };
    if event.is_null() {
        return crate::err(libc::EINVAL);
    }
    let inner = Arc::clone(&ch.inner);
    let mut ev = match inner.pop() {
        Ok(ev) => ev,
        Err(e) => return crate::err(e),
    };
    crate::api::deliver(&mut ev);
    // SAFETY: `event` is writable; the box stays allocated until rdma_ack_cm_event.
    unsafe { *event = hand_out(ev) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_ack_cm_event(event: *mut RdmaCmEvent) -> c_int {
    match take_back(event) {
        Some(ev) => {
            drop(ev);
            0
        }
        None => {
            log::error!("rdma_ack_cm_event: {event:p} is no unacknowledged event of this library");
            crate::err(libc::EINVAL)
        }
    }
}
