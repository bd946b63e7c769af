//! The OOB channel's I/O thread: non-blocking sockets and one `poll(2)` loop that feed
//! the connection state machine ([`super::machine::Machine`]) and carry out what it asks.
//!
//! Nothing here decides anything about the protocol. The loop accepts connections, starts
//! the dials the machine asks for, writes the bytes it has for each connection (one
//! `send(2)` for everything queued where the socket takes it), reads what arrives into
//! it, and publishes its events to the caller's side under the queues' lock. Reading
//! pauses while the event queue is full, so TCP pushes back on the peer.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use super::auth::Auth;
use super::machine::{Action, Closed, Machine, Token};
use super::{Shared, TcpOobConfig};

/// How long the I/O thread sleeps at most when nothing happens.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// How long accepting pauses after an accept error such as EMFILE (which would otherwise
/// leave the listener readable and spin the loop).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Bytes read per `read(2)`; at most [`READS_PER_WAKE`] reads per connection per wake-up.
const READ_CHUNK: usize = 64 * 1024;
const READS_PER_WAKE: usize = 4;
/// Keepalive, so a peer whose host vanished is noticed even when nothing is sent.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 4;

/// The listener: SO_REUSEADDR so a restarted driver can bind while old connections linger
/// in TIME_WAIT; without SO_REUSEPORT a second listener on the same address still fails.
pub(super) fn listen(addr: SocketAddrV4) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// `poll(2)` over `fds`, waiting at most `timeout` (rounded up to a millisecond).
pub(super) fn sys_poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs,
    // which poll only reads and writes within that length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Keepalive and no Nagle delay on a connection's socket (errors only cost the feature).
fn tune(socket: &Socket) {
    let _ = socket.set_tcp_nodelay(true);
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let _ = socket.set_tcp_keepalive(&keepalive);
}

/// The I/O thread's state: the sockets by the machine's tokens.
pub(super) struct IoLoop {
    shared: Arc<Shared>,
    machine: Machine,
    local: SocketAddrV4,
    peer_port: u16,
    listener: Socket,
    accept_paused_until: Option<Instant>,
    sockets: HashMap<Token, Socket>,
    read_buf: Vec<u8>,
}

impl IoLoop {
    pub(super) fn new(
        shared: Arc<Shared>,
        cfg: TcpOobConfig,
        auth: Auth,
        local: SocketAddrV4,
        listener: Socket,
    ) -> Self {
        let peer_port = cfg.peer_port.unwrap_or(local.port());
        let counters = Arc::clone(&shared.counters);
        IoLoop {
            shared,
            machine: Machine::new(cfg, local, auth, counters, Instant::now()),
            local,
            peer_port,
            listener,
            accept_paused_until: None,
            sockets: HashMap::new(),
            read_buf: vec![0; READ_CHUNK],
        }
    }

    pub(super) fn run(mut self) {
        let mut pollfds: Vec<libc::pollfd> = Vec::new();
        let mut tokens: Vec<Token> = Vec::new();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.shared.waker.clear();
            {
                let mut q = self.shared.lock();
                self.machine.take_outbox(&mut q.outbox, Instant::now());
            }
            self.carry_out();
            self.flush_all();
            let now = Instant::now();
            let deadline = self.machine.next_deadline().into_iter();
            let timeout = deadline
                .chain(self.accept_paused_until)
                .min()
                .map_or(IDLE_POLL, |d| {
                    d.saturating_duration_since(now).min(IDLE_POLL)
                });
            self.fill_pollfds(&mut pollfds, &mut tokens, now);
            if let Err(e) = sys_poll(&mut pollfds, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("OOB {}: poll failed: {e}", self.local);
                    thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            if pollfds.get(1).is_some_and(|p| p.revents != 0) {
                self.accept_all();
            }
            for (pfd, &token) in pollfds.iter().skip(2).zip(&tokens) {
                if pfd.revents != 0 {
                    self.on_ready(token, pfd.revents);
                    self.carry_out();
                }
            }
            self.machine.on_tick(Instant::now());
            self.carry_out();
        }
        log::info!("OOB {}: stopped", self.local);
    }

    /// Carries out the machine's actions, then hands its events to the caller's side.
    fn carry_out(&mut self) {
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Dial { token, peer } => self.dial(token, peer),
                Action::Close { token, last_words } => {
                    if let Some(socket) = self.sockets.remove(&token) {
                        if !last_words.is_empty() {
                            let _ = socket.send_with_flags(&last_words, libc::MSG_NOSIGNAL);
                        }
                    }
                }
            }
        }
        self.publish();
    }

    /// The machine's events and peer set, and the purge of lost peers' queues, under one
    /// lock, so `poll` never sees a `PeerLost` before the records that preceded it.
    fn publish(&mut self) {
        let events = self.machine.take_events();
        let links_changed = self.machine.take_links_changed();
        if events.is_empty() && !links_changed {
            return;
        }
        let arrived = !events.is_empty();
        let mut q = self.shared.lock();
        self.machine.purge(&mut q.outbox);
        q.events.extend(events);
        self.shared
            .events_len
            .store(q.events.len(), Ordering::SeqCst);
        if links_changed {
            q.connected = self.machine.connected_caps().collect();
        }
        drop(q);
        if arrived {
            self.shared.notifier.notify();
        }
    }

    fn fill_pollfds(&mut self, fds: &mut Vec<libc::pollfd>, tokens: &mut Vec<Token>, now: Instant) {
        let shared = &self.shared;
        let mut events_full = shared.events_len.load(Ordering::SeqCst) >= shared.max_events;
        if events_full {
            shared.reading_paused.store(true, Ordering::SeqCst);
            // `poll` may have drained the queue between the load and the store; it wakes
            // this thread only if it saw the flag, so look again.
            events_full = shared.events_len.load(Ordering::SeqCst) >= shared.max_events;
        }
        if self.accept_paused_until.is_some_and(|t| t <= now) {
            self.accept_paused_until = None;
        }
        let pollfd = |fd, events| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        fds.clear();
        tokens.clear();
        fds.push(pollfd(shared.waker.raw_fd(), libc::POLLIN));
        let listener_fd = match self.accept_paused_until {
            Some(_) => -1,
            None => self.listener.as_raw_fd(),
        };
        fds.push(pollfd(listener_fd, libc::POLLIN));
        for (&token, socket) in &self.sockets {
            let Some(interest) = self.machine.interest(token) else {
                continue;
            };
            let events = if interest.connecting {
                libc::POLLOUT
            } else {
                let read = if interest.open && events_full {
                    0
                } else {
                    libc::POLLIN
                };
                read | if interest.has_output {
                    libc::POLLOUT
                } else {
                    0
                }
            };
            fds.push(pollfd(socket.as_raw_fd(), events));
            tokens.push(token);
        }
    }

    fn flush_all(&mut self) {
        let ready: Vec<Token> = self
            .sockets
            .keys()
            .copied()
            .filter(|&t| !self.machine.output(t).is_empty())
            .collect();
        for token in ready {
            self.flush(token);
        }
    }

    /// Starts the non-blocking connect the machine asked for, from the device IP.
    fn dial(&mut self, token: Token, peer: Ipv4Addr) {
        match self.start_connect(peer) {
            Ok((socket, connected)) => {
                self.sockets.insert(token, socket);
                if connected {
                    self.finish_connect(token);
                }
            }
            Err(e) => self.machine.on_connect_failed(token, &e, Instant::now()),
        }
    }

    /// A non-blocking connect from the device IP; `true` if it completed at once.
    fn start_connect(&self, peer: Ipv4Addr) -> io::Result<(Socket, bool)> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.set_nonblocking(true)?;
        tune(&socket);
        socket.bind(&SocketAddrV4::new(*self.local.ip(), 0).into())?;
        let target: SockAddr = SocketAddrV4::new(peer, self.peer_port).into();
        match socket.connect(&target) {
            Ok(()) => Ok((socket, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok((socket, false)),
            Err(e) => Err(e),
        }
    }

    fn finish_connect(&mut self, token: Token) {
        let Some(socket) = self.sockets.get(&token) else {
            return;
        };
        let now = Instant::now();
        match socket.take_error() {
            Ok(None) => {
                self.machine.on_connected(token, now);
                self.flush(token);
            }
            Ok(Some(e)) | Err(e) => self.machine.on_connect_failed(token, &e, now),
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((socket, addr)) => self.on_accept(socket, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    log::error!("OOB {}: accept failed: {e}; pausing accepts", self.local);
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    break;
                }
            }
        }
    }

    fn on_accept(&mut self, socket: Socket, addr: SockAddr) {
        let Some(src) = addr.as_socket_ipv4().map(|a| *a.ip()) else {
            return;
        };
        let now = Instant::now();
        let Some(token) = self.machine.on_accepted(src, now) else {
            // Reset rather than close: nothing to say, and no TIME_WAIT left behind.
            let _ = socket.set_linger(Some(Duration::ZERO));
            return;
        };
        if let Err(e) = socket.set_nonblocking(true) {
            self.machine.on_closed(token, Closed::Read(&e), now);
            return;
        }
        tune(&socket);
        self.sockets.insert(token, socket);
    }

    fn on_ready(&mut self, token: Token, revents: libc::c_short) {
        let Some(interest) = self.machine.interest(token) else {
            return;
        };
        if interest.connecting {
            if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0 {
                self.finish_connect(token);
            }
            return;
        }
        if revents & libc::POLLOUT != 0 {
            self.flush(token);
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            self.read(token);
        }
    }

    /// Writes what the machine has for the connection, until done or the socket is full.
    fn flush(&mut self, token: Token) {
        loop {
            let Some(socket) = self.sockets.get(&token) else {
                return;
            };
            let pending = self.machine.output(token);
            if pending.is_empty() {
                return;
            }
            // MSG_NOSIGNAL: a broken connection is an error here, not a SIGPIPE in the
            // application that loaded the driver.
            match socket.send_with_flags(pending, libc::MSG_NOSIGNAL) {
                Ok(n) if n > 0 => self.machine.on_written(token, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                result => {
                    let e = result
                        .err()
                        .unwrap_or_else(|| io::ErrorKind::WriteZero.into());
                    self.machine
                        .on_closed(token, Closed::Write(&e), Instant::now());
                    return;
                }
            }
        }
    }

    fn read(&mut self, token: Token) {
        let mut buf = std::mem::take(&mut self.read_buf);
        for _ in 0..READS_PER_WAKE {
            let Some(socket) = self.sockets.get(&token) else {
                break;
            };
            let result = (&*socket).read(&mut buf);
            let now = Instant::now();
            match result {
                Ok(0) => {
                    self.machine.on_closed(token, Closed::Eof, now);
                    break;
                }
                Ok(n) => {
                    let alive = self
                        .machine
                        .on_bytes(token, buf.get(..n).unwrap_or(&[]), now);
                    if !alive || n < buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.machine.on_closed(token, Closed::Read(&e), now);
                    break;
                }
            }
        }
        self.read_buf = buf;
    }
}
