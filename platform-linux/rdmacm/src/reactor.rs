//! The CM thread: one per process, started with the first id. It polls the TCP listeners on
//! the CM port, every CM connection and a wake-up eventfd; it accepts connections, reads and
//! decodes messages (bounded: one message is at most 520 bytes, a stream that is not the
//! protocol is closed at its first bad byte), sends what the application's calls queued,
//! completes outgoing connects and runs the connection deadlines. It never calls a verb.

use core::ffi::{c_int, c_void};
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::state::{self, Cm, Conn, TcpL, Token};
use crate::wire::{self, DecodeError, Msg};

/// The wake-up eventfd, created with the thread.
static WAKE: OnceLock<RawFd> = OnceLock::new();

/// Starts the CM thread if it is not running.
pub(crate) fn ensure_started() {
    WAKE.get_or_init(|| {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd failed: the CM thread cannot run");
        std::thread::Builder::new()
            .name("bluerdma-cm".into())
            .spawn(move || run(fd))
            .expect("the CM thread starts");
        fd
    });
}

/// Makes the CM thread look at the state again (new bytes to send, new sockets).
pub(crate) fn wake() {
    if let Some(&fd) = WAKE.get() {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
    }
}

/// Binds the TCP listener of `ip` on the CM port, or counts one more user of it.
pub(crate) fn listen_tcp(cm: &mut Cm, ip: Ipv4Addr) -> Result<(), c_int> {
    if let Some(l) = cm.tcp.get_mut(&ip) {
        // Also revives one whose last user left before the CM thread closed it.
        l.users += 1;
        l.idle_since = None;
        return Ok(());
    }
    let port = crate::cm_port();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .and_then(|s| {
            s.set_reuse_address(true)?;
            s.set_cloexec(true)?;
            s.bind(&SocketAddrV4::new(ip, port).into())?;
            s.listen(128)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .map_err(|e| {
            log::error!(
                "rdma_listen: cannot listen on the CM port {ip}:{port} ({e}); another process \
                 may use this device (one process per device), or set BLUERDMA_CM_PORT"
            );
            e.raw_os_error().unwrap_or(libc::EADDRINUSE)
        })?;
    let sock: TcpListener = sock.into();
    cm.tcp.insert(
        ip,
        TcpL {
            sock,
            users: 1,
            idle_since: None,
        },
    );
    wake();
    Ok(())
}

/// Starts a connection from `local` to the peer's CM port; the first message is queued.
pub(crate) fn connect(
    cm: &mut Cm,
    id: Token,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    first: &Msg,
) -> Result<Token, c_int> {
    let to = SocketAddrV4::new(peer, crate::cm_port());
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .and_then(|s| {
            s.set_cloexec(true)?;
            s.set_nonblocking(true)?;
            s.set_tcp_nodelay(true)?;
            s.bind(&SocketAddrV4::new(local, 0).into())?;
            Ok(s)
        })
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let refused = match s.connect(&to.into()) {
        Ok(()) => false,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => true,
        Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let t = cm.token();
    let now = Instant::now();
    let mut tx = Vec::new();
    first.encode(&mut tx);
    // SAFETY: the socket's fd moves into the TcpStream, which owns it from here.
    let sock = unsafe { TcpStream::from_raw_fd(s.into_raw_fd()) };
    cm.conns.insert(
        t,
        Conn {
            sock,
            rx: Vec::new(),
            tx,
            connecting: true,
            id: Some(id),
            deadline: Some(now + crate::cm_timeout()),
            closing: false,
            local_ip: local,
            peer: to,
            opened: now,
            parked: None,
        },
    );
    if refused {
        cm.on_closed(t, libc::ECONNREFUSED);
        cm.conns.remove(&t);
    }
    wake();
    Ok(t)
}

/// What one pollfd entry is.
#[derive(Clone, Copy)]
enum Slot {
    Wake,
    Listener(Ipv4Addr),
    Conn(Token),
}

fn run(wake_fd: RawFd) {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    loop {
        let timeout = {
            let mut cm = state::lock();
            // Listeners whose last id went away are closed here, never under a poll.
            let now = Instant::now();
            cm.tcp
                .retain(|_, l| l.idle_since.is_none_or(|t| now < t + state::LISTEN_GRACE));
            flush_all(&mut cm);
            build(&cm, wake_fd, &mut fds, &mut slots)
        };
        // SAFETY: `fds` is a valid array; only this thread closes the sockets it lists.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            // SAFETY: errno of this thread.
            let e = unsafe { *libc::__errno_location() };
            if e != libc::EINTR {
                log::error!("CM thread: poll failed (errno {e})");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let mut cm = state::lock();
        for (pfd, slot) in fds.iter().zip(&slots) {
            if pfd.revents == 0 {
                continue;
            }
            match *slot {
                Slot::Wake => {
                    let mut v = 0u64;
                    // SAFETY: reads 8 bytes into a live local from our eventfd.
                    unsafe { libc::read(wake_fd, &mut v as *mut u64 as *mut c_void, 8) };
                }
                Slot::Listener(ip) => accept_all(&mut cm, ip),
                Slot::Conn(t) => service(&mut cm, t, pfd.revents),
            }
        }
        expire(&mut cm, Instant::now());
    }
}

/// The pollfd list and the poll timeout (ms) until the nearest deadline.
fn build(cm: &Cm, wake_fd: RawFd, fds: &mut Vec<libc::pollfd>, slots: &mut Vec<Slot>) -> c_int {
    fds.clear();
    slots.clear();
    let mut push = |fd: RawFd, events: i16, slot: Slot| {
        fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
        slots.push(slot);
    };
    push(wake_fd, libc::POLLIN, Slot::Wake);
    for (ip, l) in &cm.tcp {
        push(l.sock.as_raw_fd(), libc::POLLIN, Slot::Listener(*ip));
    }
    let now = Instant::now();
    let mut next: Option<Instant> = cm
        .tcp
        .values()
        .filter_map(|l| l.idle_since.map(|t| t + state::LISTEN_GRACE))
        .min();
    for (t, c) in &cm.conns {
        let mut ev = if c.closing { 0 } else { libc::POLLIN };
        if c.connecting || !c.tx.is_empty() {
            ev |= libc::POLLOUT;
        }
        push(c.sock.as_raw_fd(), ev, Slot::Conn(*t));
        if let Some(d) = c.deadline {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
    }
    match next {
        None => -1,
        Some(d) => d.saturating_duration_since(now).as_millis().min(60_000) as c_int + 1,
    }
}

fn accept_all(cm: &mut Cm, ip: Ipv4Addr) {
    loop {
        let Some(l) = cm.tcp.get(&ip) else { return };
        match l.sock.accept() {
            Ok((sock, SocketAddr::V4(peer))) => {
                if sock.set_nonblocking(true).is_ok() {
                    let _ = sock.set_nodelay(true);
                    cm.add_incoming(sock, ip, peer);
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::warn!("CM port on {ip}: accept failed: {e}");
                return;
            }
        }
    }
}

/// Sends what every connection has queued, as far as the sockets take it.
fn flush_all(cm: &mut Cm) {
    let tokens: Vec<Token> = cm.conns.keys().copied().collect();
    for t in tokens {
        flush(cm, t);
    }
}

fn flush(cm: &mut Cm, t: Token) {
    let Some(c) = cm.conns.get_mut(&t) else {
        return;
    };
    if c.connecting {
        return;
    }
    while !c.tx.is_empty() {
        // SAFETY: the connection's socket; sends from its buffer, never raises SIGPIPE.
        let n = unsafe {
            libc::send(
                c.sock.as_raw_fd(),
                c.tx.as_ptr() as *const c_void,
                c.tx.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            c.tx.drain(..n as usize);
            continue;
        }
        // SAFETY: errno of this thread.
        let e = unsafe { *libc::__errno_location() };
        if e == libc::EAGAIN || e == libc::EINTR {
            return;
        }
        cm.on_closed(t, e);
        cm.conns.remove(&t);
        return;
    }
    if c.closing {
        cm.conns.remove(&t);
    }
}

/// Handles readiness of connection `t`.
fn service(cm: &mut Cm, t: Token, revents: i16) {
    let Some(c) = cm.conns.get_mut(&t) else {
        return;
    };
    if c.connecting {
        if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) == 0 {
            return;
        }
        match c.sock.take_error() {
            Ok(None) => c.connecting = false,
            Ok(Some(e)) | Err(e) => {
                cm.on_closed(t, e.raw_os_error().unwrap_or(libc::EIO));
                cm.conns.remove(&t);
                return;
            }
        }
        flush(cm, t);
        return;
    }
    if revents & libc::POLLOUT != 0 {
        flush(cm, t);
    }
    if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
        read(cm, t);
    }
}

/// Reads what arrived on `t` and hands every whole message to the state.
fn read(cm: &mut Cm, t: Token) {
    let mut buf = [0u8; 2048];
    loop {
        let Some(c) = cm.conns.get_mut(&t) else {
            return;
        };
        match c.sock.read(&mut buf) {
            Ok(0) => {
                cm.on_closed(t, libc::ECONNRESET);
                cm.conns.remove(&t);
                return;
            }
            Ok(n) => {
                if c.closing {
                    continue;
                }
                c.rx.extend_from_slice(&buf[..n]);
                if !parse(cm, t) {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                cm.on_closed(t, e.raw_os_error().unwrap_or(libc::EIO));
                cm.conns.remove(&t);
                return;
            }
        }
    }
}

/// Decodes and dispatches the whole messages in `t`'s buffer; false once `t` is gone.
fn parse(cm: &mut Cm, t: Token) -> bool {
    loop {
        let Some(c) = cm.conns.get_mut(&t) else {
            return false;
        };
        if c.closing {
            c.rx.clear();
            return true;
        }
        match wire::decode(&c.rx) {
            Ok(None) => return true,
            Ok(Some((msg, used))) => {
                c.rx.drain(..used);
                cm.on_msg(t, msg);
            }
            Err(e) => {
                cm.garbage += 1;
                let peer = c.peer;
                if cm.garbage <= 10 {
                    log::warn!("CM port: {e} from {peer}; closing the connection");
                }
                if let DecodeError::Version(_) = e {
                    let rej = wire::Rej {
                        reason: wire::reason::INVALID_CLASS_VERSION,
                        private: vec![],
                    };
                    cm.send(t, &Msg::Rej(rej));
                }
                cm.on_closed(t, libc::EPROTO);
                cm.close(t);
                return false;
            }
        }
    }
}

/// Runs the deadlines that passed.
fn expire(cm: &mut Cm, now: Instant) {
    let due: Vec<(Token, bool)> = cm
        .conns
        .iter()
        .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
        .map(|(t, c)| (*t, c.closing))
        .collect();
    for (t, closing) in due {
        if closing {
            cm.conns.remove(&t);
        } else {
            cm.on_timeout(t);
        }
    }
}
