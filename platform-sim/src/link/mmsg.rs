//! Many datagrams per system call: safe wrappers around Linux `sendmmsg` and `recvmmsg`.
//!
//! `recvmmsg` with `MSG_WAITFORONE` has exactly the receive semantics of
//! [`super::LinkPort::recv_frames`]: block (up to the socket's `SO_RCVTIMEO`) for the first
//! datagram, then take whatever else is already queued without waiting. Each received
//! datagram also carries the kernel's running count of datagrams it dropped because the
//! receive queue was full (`SO_RXQ_OVFL`).

use std::io;
use std::mem;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

/// Most datagrams handed to one system call.
pub(super) const MAX_BATCH: usize = 16;
/// Room for one `SO_RXQ_OVFL` control message (a `cmsghdr` and a u32, padded), in u64s
/// so that the buffer has the alignment `cmsghdr` needs.
const CONTROL_WORDS: usize = 8;

/// One datagram to send.
pub(super) struct OutDatagram<'a> {
    /// Where it goes.
    pub dst: SocketAddrV4,
    /// Its UDP payload.
    pub bytes: &'a [u8],
}

/// Sends the first [`MAX_BATCH`] of `datagrams` with one `sendmmsg`; returns how many the
/// kernel took (at least 1 unless `datagrams` is empty), or the error of the first one.
pub(super) fn send_batch<'a>(
    fd: BorrowedFd<'_>,
    datagrams: impl IntoIterator<Item = OutDatagram<'a>>,
) -> io::Result<usize> {
    // SAFETY: sockaddr_in, iovec and mmsghdr are plain C structs for which all-zero bytes
    // are a valid value (null pointers, zero lengths).
    let mut addrs: [libc::sockaddr_in; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    let mut n = 0;
    for (i, d) in datagrams.into_iter().take(MAX_BATCH).enumerate() {
        addrs[i] = sockaddr_in(d.dst);
        iovs[i] = libc::iovec {
            iov_base: d.bytes.as_ptr().cast_mut().cast(),
            iov_len: d.bytes.len(),
        };
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_name = ptr::addr_of_mut!(addrs[i]).cast();
        hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        hdr.msg_iov = ptr::addr_of_mut!(iovs[i]);
        hdr.msg_iovlen = 1;
        n = i + 1;
    }
    if n == 0 {
        return Ok(0);
    }
    loop {
        // SAFETY: the first `n` headers point at live addresses and iovecs on this stack
        // frame, whose buffers are borrowed (lifetime 'a) for the whole call; sendmmsg
        // only reads them (iov_base is cast to *mut because the C type has no const).
        let sent = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), n as _, 0) };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn sockaddr_in(addr: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is a plain C struct; all-zero is valid (and zeroes the padding).
    let mut sa: libc::sockaddr_in = unsafe { mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = addr.port().to_be();
    sa.sin_addr = libc::in_addr {
        s_addr: u32::from_ne_bytes(addr.ip().octets()),
    };
    sa
}

/// Receive buffers for [`recv_batch`]: `slots` datagrams of up to `slot_len` bytes.
pub(super) struct RecvBuffers {
    data: Vec<u8>,
    control: Vec<[u64; CONTROL_WORDS]>,
    slot_len: usize,
    lens: [usize; MAX_BATCH],
    truncated: [bool; MAX_BATCH],
    received: usize,
}

impl RecvBuffers {
    /// Buffers for up to `slots` (at most [`MAX_BATCH`]) datagrams of `slot_len` bytes.
    pub(super) fn new(slots: usize, slot_len: usize) -> Self {
        let slots = slots.clamp(1, MAX_BATCH);
        Self {
            data: vec![0; slots * slot_len],
            control: vec![[0; CONTROL_WORDS]; slots],
            slot_len,
            lens: [0; MAX_BATCH],
            truncated: [false; MAX_BATCH],
            received: 0,
        }
    }

    /// The datagrams of the last [`recv_batch`]: `Err(len)` for one cut short because it
    /// was larger than a slot.
    pub(super) fn datagrams(&self) -> impl Iterator<Item = Result<&[u8], usize>> {
        self.data
            .chunks_exact(self.slot_len)
            .zip(self.lens.iter().zip(&self.truncated))
            .take(self.received)
            .map(|(slot, (&len, &truncated))| {
                if truncated {
                    Err(len)
                } else {
                    Ok(slot.get(..len).unwrap_or(slot))
                }
            })
    }
}

/// Receives datagrams into `bufs` with one `recvmmsg`: waits for the first (up to the
/// socket's read timeout, or not at all if `wait` is false), then takes the ones already
/// queued. Returns the kernel's latest running total of datagrams it dropped on this socket
/// because the receive queue was full, if a received datagram reported one.
pub(super) fn recv_batch(
    fd: BorrowedFd<'_>,
    bufs: &mut RecvBuffers,
    wait: bool,
) -> io::Result<Option<u32>> {
    bufs.received = 0;
    let slots = bufs.control.len();
    // SAFETY: iovec and mmsghdr are plain C structs; all-zero is a valid value.
    let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { mem::zeroed() };
    let slot_len = bufs.slot_len;
    for (i, (slot, control)) in bufs
        .data
        .chunks_exact_mut(slot_len)
        .zip(bufs.control.iter_mut())
        .enumerate()
    {
        iovs[i] = libc::iovec {
            iov_base: slot.as_mut_ptr().cast(),
            iov_len: slot.len(),
        };
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_iov = ptr::addr_of_mut!(iovs[i]);
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = mem::size_of_val(control) as _;
    }
    let flags = libc::MSG_WAITFORONE | if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: the first `slots` headers point at iovecs on this stack frame and at the data
    // and control buffers of `bufs`, which is borrowed mutably for the whole call; the
    // kernel writes at most iov_len / msg_controllen bytes into them.
    let got = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            slots as _,
            flags,
            ptr::null_mut(),
        )
    };
    if got < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            // A timeout, nothing queued, or a signal: nothing received this time.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                Ok(None)
            }
            _ => Err(err),
        };
    }
    let count = (got as usize).min(slots);
    let mut queue_drops = None;
    for (i, msg) in msgs.iter().take(count).enumerate() {
        bufs.lens[i] = msg.msg_len as usize;
        bufs.truncated[i] = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        if let Some(drops) = rxq_ovfl(&msg.msg_hdr) {
            queue_drops = Some(drops);
        }
    }
    bufs.received = count;
    Ok(queue_drops)
}

/// The `SO_RXQ_OVFL` value among the control messages of a received `msghdr`, if any.
fn rxq_ovfl(hdr: &libc::msghdr) -> Option<u32> {
    // SAFETY: `hdr` was filled by recvmmsg: msg_control points at our aligned control
    // buffer (still borrowed by the caller) and msg_controllen is what the kernel wrote, so
    // the CMSG_* walk stays inside it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            if c.cmsg_level == libc::SOL_SOCKET
                && c.cmsg_type == libc::SO_RXQ_OVFL
                && c.cmsg_len as usize >= libc::CMSG_LEN(4) as usize
            {
                return Some(ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<u32>()));
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    None
}
