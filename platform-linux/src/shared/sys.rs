//! The system calls of a shared device: memfd segments mapped by two processes, file
//! descriptors passed over a Unix socket, futex words in shared memory, another process's
//! memory moved with `process_vm_readv`/`writev`, and the credentials of a socket's peer.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A shared mapping of a memfd, unmapped on drop.
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics
// (the register page) or explicit copies, so sharing the handle between threads is sound.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// A new zeroed segment of `len` bytes, named `name` in /proc/*/fd listings.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: a valid NUL-terminated name; the flags are memfd_create's.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on the descriptor just made.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Segment::map(fd, len)
    }

    /// Maps `len` bytes of `fd` (a segment received from the other process).
    pub fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let mut st: libc::stat = unsafe_zeroed_stat();
        // SAFETY: fstat fills `st` for an open descriptor.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared segment of {} bytes, {len} expected", st.st_size),
            ));
        }
        // SAFETY: a fresh shared mapping of an open file at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))?;
        Ok(Segment { ptr, len, fd })
    }

    /// The first byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never, for a mapped segment).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor (to pass to the other process).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; nothing borrows it past the
        // segment (its users hold the segment).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn unsafe_zeroed_stat() -> libc::stat {
    // SAFETY: `stat` is a plain C struct for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// Sends `bytes` with `fd` attached (SCM_RIGHTS).
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header of CMSG_SPACE(sizeof fd) bytes, so the
    // first header and its data are inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` describes live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes, and the descriptor attached to them if any.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` describes live buffers for the duration of the call.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection",
        ));
    }
    let mut fd = None;
    // SAFETY: the kernel filled the control buffer; the CMSG macros walk it within
    // msg_controllen, and an SCM_RIGHTS header's data holds one descriptor we now own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(fd)
}

/// The process id of the socket's peer (SO_PEERCRED: the kernel's word, not the peer's).
pub fn peer_pid(sock: &UnixStream) -> io::Result<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

/// Waits while `word` holds `expected`, up to `timeout` (a shared, not process-private,
/// futex: the waker is another process).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which lives as long as the
    // call; a spurious return is harmless to every caller (they re-check).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Copies `buf.len()` bytes from `va` in process `pid`; a short copy is an error.
pub fn read_remote(pid: i32, va: u64, buf: &mut [u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: va as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec is `buf`; the remote one is only an address in the other
    // process, which the kernel checks.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    transferred(n, buf.len())
}

/// Copies the pieces of `parts` to their addresses in process `pid`, in order (one system
/// call; the kernel copies the pieces in order, so a later piece, a descriptor's valid
/// byte, is not visible before an earlier one on a host with ordered stores).
pub fn write_remote(pid: i32, parts: &[(u64, &[u8])]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.1.len()).sum();
    if total == 0 {
        return Ok(());
    }
    let mut local = Vec::with_capacity(parts.len());
    let mut remote = Vec::with_capacity(parts.len());
    for (va, bytes) in parts {
        local.push(libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        });
        remote.push(libc::iovec {
            iov_base: *va as *mut libc::c_void,
            iov_len: bytes.len(),
        });
    }
    // SAFETY: process_vm_writev only reads the local buffers, which live for the call.
    let n = unsafe {
        libc::process_vm_writev(
            pid,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    transferred(n, total)
}

fn transferred(n: isize, want: usize) -> io::Result<()> {
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != want {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{n} of {want} bytes moved"),
        ));
    }
    Ok(())
}
