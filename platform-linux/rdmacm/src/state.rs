//! The connection manager's state: every id, the listeners and the TCP connections, behind
//! one lock, and what each CM message, timeout and closed connection does to an id.
//!
//! An id moves Idle → Bound/AddrResolved → RouteResolved → Connecting → RepReceived →
//! Connected on the active side and ReqReceived → Accepted → Connected on the passive side;
//! Connected → DisconnectSent/Disconnected. Failed ends a connection attempt. Exactly one
//! DISCONNECTED event is reported per connection, however it ends (DREQ, DREP, timeout, the
//! peer's TCP connection closing). The CM thread ([`crate::reactor`]) owns the sockets; the
//! application's threads only queue bytes, mark connections for closing and wake it.

use core::ffi::c_int;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::channel::{ChannelBox, ChannelInner, EventBox, Post};
use crate::wire::{self, Msg, Params};

/// Names an id or a connection.
pub(crate) type Token = u64;

/// Where an id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    RepReceived,
    ReqReceived,
    Accepted,
    Connected,
    DisconnectSent,
    Disconnected,
    Failed,
}

/// The C id and what the library keeps beside it; `c` must stay the first field.
#[repr(C)]
pub(crate) struct Id {
    pub(crate) c: RdmaCmId,
    pub(crate) token: Token,
    pub(crate) path: IbvSaPathRec,
    /// The CQs and completion channels `rdma_create_qp` made (destroyed with the QP).
    pub(crate) own_cqs: bool,
}

/// A raw id pointer the CM state may hold across threads.
#[derive(Clone, Copy)]
pub(crate) struct IdPtr(pub(crate) *mut Id);

// SAFETY: an id is only dereferenced by the application's calls and by the thread that
// made it before it was published; the state keeps the address, not a reference.
unsafe impl Send for IdPtr {}

/// A sync id's own channel (made by the library, destroyed with the id).
pub(crate) struct OwnChannel(pub(crate) *mut ChannelBox);

// SAFETY: owned by one id entry; freed once, by rdma_destroy_id or rdma_migrate_id.
unsafe impl Send for OwnChannel {}

/// The library's record of one id.
pub(crate) struct IdEntry {
    pub(crate) cid: IdPtr,
    pub(crate) channel: Arc<ChannelInner>,
    /// `id->channel` as the application sees it.
    pub(crate) channel_c: *mut RdmaEventChannel,
    /// Set for ids in synchronous mode (made with a NULL channel).
    pub(crate) own: Option<OwnChannel>,
    pub(crate) ps: u32,
    pub(crate) ud: bool,
    /// Made by a connect request (the listening side of the connection).
    pub(crate) passive: bool,
    pub(crate) device: Option<usize>,
    /// The bound or resolved source; the address is UNSPECIFIED for a wildcard bind.
    pub(crate) local: Option<SocketAddrV4>,
    pub(crate) remote: Option<SocketAddrV4>,
    pub(crate) state: St,
    pub(crate) conn: Option<Token>,
    pub(crate) psn: u32,
    /// What this side offered (REQ) or granted (REP).
    pub(crate) mine: Params,
    /// The peer's REQ (passive) or REP (active).
    pub(crate) peer: Option<Params>,
    /// The connection closed while a CONNECT_RESPONSE waited for the application.
    pub(crate) peer_gone: Option<c_int>,
    pub(crate) disconnect_reported: bool,
    pub(crate) tos: u8,
    pub(crate) ack_timeout: u8,
    /// The listener keys this id holds.
    pub(crate) listening: Vec<ListenKey>,
    /// `rdma_create_ep` on a passive endpoint: the QP every request gets.
    pub(crate) ep_qp: Option<(IbvQpInitAttr, usize)>,
}

// SAFETY: the raw pointers name objects owned by the application or the library; see IdPtr.
unsafe impl Send for IdEntry {}

/// A listener: its address (None = every device), port space and port.
pub(crate) type ListenKey = (Option<Ipv4Addr>, u32, u16);

/// One TCP connection of the CM exchange.
pub(crate) struct Conn {
    pub(crate) sock: TcpStream,
    pub(crate) rx: Vec<u8>,
    pub(crate) tx: Vec<u8>,
    /// An outgoing connection whose `connect` has not completed.
    pub(crate) connecting: bool,
    pub(crate) id: Option<Token>,
    pub(crate) deadline: Option<Instant>,
    /// Send what is queued, then close; input is ignored.
    pub(crate) closing: bool,
    pub(crate) local_ip: Ipv4Addr,
    pub(crate) peer: SocketAddrV4,
    pub(crate) opened: Instant,
    /// A request for a port nobody listens on yet.
    pub(crate) parked: Option<Request>,
}

/// A connect request as it arrived (`params` is None for a SIDR request).
pub(crate) struct Request {
    pub(crate) ps: u32,
    pub(crate) port: u16,
    pub(crate) src_port: u16,
    pub(crate) params: Option<Params>,
    pub(crate) private: Vec<u8>,
}

/// How long a request for a port nobody listens on waits for a listener before REJ 8, and
/// how long a TCP listener stays open after its last listening id: a program may close its
/// listener and listen again on the port (perftest `-R` does, between its two connections)
/// while its peer is already connecting.
pub(crate) const LISTEN_GRACE: Duration = Duration::from_secs(1);

/// One TCP listener on `<device ip>:<CM port>`, shared by the ids listening on it.
pub(crate) struct TcpL {
    pub(crate) sock: std::net::TcpListener,
    pub(crate) users: usize,
    /// When the last user left (the CM thread closes it [`LISTEN_GRACE`] later).
    pub(crate) idle_since: Option<Instant>,
}

/// Incoming connections that have not yet sent a request, at most: beyond this the oldest
/// is closed (a flood of half-open connections cannot exhaust the process).
const MAX_UNBOUND: usize = 64;

pub(crate) struct Cm {
    pub(crate) ids: HashMap<Token, IdEntry>,
    /// The address of every live id's `struct rdma_cm_id`, and its token.
    pub(crate) addrs: HashMap<usize, Token>,
    pub(crate) listeners: HashMap<ListenKey, Token>,
    pub(crate) tcp: HashMap<Ipv4Addr, TcpL>,
    pub(crate) conns: HashMap<Token, Conn>,
    next: Token,
    rng: u64,
    /// Streams refused as garbage (bad magic, version, kind or body), for the log.
    pub(crate) garbage: u64,
}

static CM: LazyLock<Mutex<Cm>> = LazyLock::new(|| {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ ((std::process::id() as u64) << 32);
    Mutex::new(Cm {
        ids: HashMap::new(),
        addrs: HashMap::new(),
        listeners: HashMap::new(),
        tcp: HashMap::new(),
        conns: HashMap::new(),
        next: 1,
        rng: seed | 1,
        garbage: 0,
    })
});

/// The CM state, locked.
pub(crate) fn lock() -> MutexGuard<'static, Cm> {
    CM.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `rdma_conn_param` of an event from a peer's parameters.
pub(crate) fn conn_param(p: &Params) -> RdmaConnParam {
    RdmaConnParam {
        private_data: core::ptr::null(),
        private_data_len: 0,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        _pad: 0,
        qp_num: p.qpn,
        _pad2: 0,
    }
}

impl Cm {
    pub(crate) fn token(&mut self) -> Token {
        self.next += 1;
        self.next
    }

    /// A pseudo-random number (xorshift64*): PSNs and ephemeral ports.
    pub(crate) fn random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Whether `port` in port space `ps` is taken at `ip` (UNSPECIFIED overlaps everything)
    /// by a bound or listening id. Connected ids, a listener's among them, do not hold their
    /// port: a program may listen on it again once the listener is gone.
    pub(crate) fn port_taken(&self, ps: u32, ip: Ipv4Addr, port: u16) -> bool {
        self.ids.values().any(|e| {
            e.ps == ps
                && matches!(e.state, St::Bound | St::Listening)
                && e.local.is_some_and(|l| {
                    l.port() == port
                        && (l.ip() == &ip || l.ip().is_unspecified() || ip.is_unspecified())
                })
        })
    }

    /// A free ephemeral port (49152..65535) of `ps` at `ip`.
    pub(crate) fn ephemeral_port(&mut self, ps: u32, ip: Ipv4Addr) -> Option<u16> {
        for _ in 0..1024 {
            let p = 49152 + (self.random() % 16384) as u16;
            if !self.port_taken(ps, ip, p) {
                return Some(p);
            }
        }
        None
    }

    /// Queues an event about id `token` on its channel; `fill` sets its parameters.
    pub(crate) fn queue(
        &mut self,
        token: Token,
        event: c_int,
        status: c_int,
        fill: impl FnOnce(&mut EventBox),
    ) {
        if let Some(e) = self.ids.get(&token) {
            let mut ev = EventBox::new(token, e.cid.0 as *mut RdmaCmId, event, status);
            fill(&mut ev);
            log::debug!("id {token}: event {event} status {status}");
            e.channel.push(ev);
        }
    }

    /// Queues `msg` on connection `conn` (the CM thread sends it).
    pub(crate) fn send(&mut self, conn: Token, msg: &Msg) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.closing {
                msg.encode(&mut c.tx);
            }
        }
    }

    /// Detaches connection `conn` from its id; what is queued is still sent.
    pub(crate) fn close(&mut self, conn: Token) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(id) = c.id.take() {
                if let Some(e) = self.ids.get_mut(&id) {
                    e.conn = None;
                }
            }
            c.closing = true;
            c.deadline = Some(Instant::now() + crate::cm_timeout());
        }
    }

    /// Registers an accepted connection; closes the oldest one that never sent a request
    /// when there are too many.
    pub(crate) fn add_incoming(&mut self, sock: TcpStream, local_ip: Ipv4Addr, peer: SocketAddrV4) {
        let unbound: Vec<(Instant, Token)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.id.is_none() && !c.closing && !c.connecting)
            .map(|(t, c)| (c.opened, *t))
            .collect();
        if unbound.len() >= MAX_UNBOUND {
            if let Some((_, oldest)) = unbound.iter().min() {
                log::warn!("CM port: more than {MAX_UNBOUND} connections sent no request; closing the oldest");
                self.conns.remove(oldest);
            }
        }
        let t = self.token();
        let now = Instant::now();
        self.conns.insert(
            t,
            Conn {
                sock,
                rx: Vec::new(),
                tx: Vec::new(),
                connecting: false,
                id: None,
                deadline: Some(now + crate::cm_timeout()),
                closing: false,
                local_ip,
                peer,
                opened: now,
                parked: None,
            },
        );
    }

    /// A message arrived on connection `conn`.
    pub(crate) fn on_msg(&mut self, conn: Token, msg: Msg) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        match (c.id, msg) {
            (None, Msg::Req(r)) if c.parked.is_none() => {
                let req = Request {
                    ps: r.ps as u32,
                    port: r.dst_port,
                    src_port: r.src_port,
                    params: Some(r.params),
                    private: r.private,
                };
                self.on_request(conn, req, true)
            }
            (None, Msg::SidrReq(r)) if c.parked.is_none() => {
                let req = Request {
                    ps: r.ps as u32,
                    port: r.dst_port,
                    src_port: r.src_port,
                    params: None,
                    private: r.private,
                };
                self.on_request(conn, req, true)
            }
            (None, m) => self.protocol_error(conn, &format!("{m:?} before a request")),
            (Some(id), m) => self.on_id_msg(id, conn, m),
        }
    }

    fn protocol_error(&mut self, conn: Token, what: &str) {
        log::warn!("CM connection {conn}: unexpected {what}; closing it");
        self.on_closed(conn, libc::EPROTO);
        self.conns.remove(&conn);
    }

    /// A request for a listener: a new id and CONNECT_REQUEST; with nobody listening, held
    /// for [`LISTEN_GRACE`] when `may_wait`, else a rejection.
    fn on_request(&mut self, conn: Token, req: Request, may_wait: bool) {
        let Request {
            ps,
            port,
            src_port,
            params,
            ref private,
        } = req;
        let c = &self.conns[&conn];
        let (local_ip, peer) = (c.local_ip, *c.peer.ip());
        let listener = self
            .listeners
            .get(&(Some(local_ip), ps, port))
            .or_else(|| self.listeners.get(&(None, ps, port)))
            .copied();
        let l = listener.and_then(|l| self.ids.get(&l).map(|e| (l, e)));
        let device = crate::verbs::device_at(local_ip);
        let (Some((lid, le)), Some(device)) = (l, device) else {
            if may_wait {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.deadline = Some(Instant::now() + LISTEN_GRACE);
                    c.parked = Some(req);
                }
                return;
            }
            log::info!(
                "CM: request from {peer} for port {port} (port space {ps:#x}): nobody listens"
            );
            let rej = match params {
                Some(_) => Msg::Rej(wire::Rej {
                    reason: wire::reason::INVALID_SERVICE_ID,
                    private: vec![],
                }),
                None => Msg::SidrRep(wire::SidrRep {
                    status: wire::sidr::UNSUPPORTED,
                    qpn: 0,
                    qkey: 0,
                    private: vec![],
                }),
            };
            self.send(conn, &rej);
            self.close(conn);
            return;
        };
        let sync = le.own.is_some();
        let (listen_cid, ud, lchannel, lchannel_c) =
            (le.cid, le.ud, Arc::clone(&le.channel), le.channel_c);
        if ud != params.is_none() {
            self.send(
                conn,
                &Msg::Rej(wire::Rej {
                    reason: 9,
                    private: vec![],
                }),
            );
            self.close(conn);
            return;
        }
        let (channel, channel_c, own) = if sync {
            // SAFETY: NULL asks for a new channel of the id's own.
            match unsafe { crate::channel::attach(core::ptr::null_mut()) } {
                Ok(c) => c,
                Err(e) => {
                    log::error!("CM: no channel for a new connection (errno {e}); rejecting it");
                    self.send(
                        conn,
                        &Msg::Rej(wire::Rej {
                            reason: wire::reason::NO_RESOURCES,
                            private: vec![],
                        }),
                    );
                    self.close(conn);
                    return;
                }
            }
        } else {
            (Arc::clone(&lchannel), lchannel_c, None)
        };
        let token = self.token();
        let local = SocketAddrV4::new(local_ip, port);
        let remote = SocketAddrV4::new(peer, src_port);
        // SAFETY: reads the listener's ps and qp_type, which only the library writes.
        let (ps_c, qp_type) = unsafe { ((*listen_cid.0).c.ps, (*listen_cid.0).c.qp_type) };
        let cid = crate::api::new_id(token, channel_c, core::ptr::null_mut(), ps_c, qp_type);
        // SAFETY: the id was just made and is not yet published.
        unsafe { crate::api::set_route(&mut *cid, Some(device), local, Some(remote)) };
        let psn = (self.random() & 0xFF_FFFF) as u32;
        self.addrs.insert(cid as usize, token);
        self.ids.insert(
            token,
            IdEntry {
                cid: IdPtr(cid),
                channel,
                channel_c,
                own,
                ps,
                ud,
                passive: true,
                device: Some(device),
                local: Some(local),
                remote: Some(remote),
                state: St::ReqReceived,
                conn: Some(conn),
                psn,
                mine: Params::default(),
                peer: params,
                peer_gone: None,
                disconnect_reported: false,
                tos: 0,
                ack_timeout: crate::verbs::DEFAULT_ACK_TIMEOUT,
                listening: Vec::new(),
                ep_qp: None,
            },
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.id = Some(token);
            // The requester times out; this side waits for its application.
            c.deadline = None;
        }
        if !ud {
            self.send(conn, &Msg::Mra);
        }
        let mut ev = EventBox::new(
            token,
            cid as *mut RdmaCmId,
            RDMA_CM_EVENT_CONNECT_REQUEST,
            0,
        );
        ev.ev.listen_id = listen_cid.0 as *mut RdmaCmId;
        ev.listen = lid;
        ev.post = Post::ConnectRequest;
        match params {
            Some(p) => {
                // The requester's depth is what this side must answer, and the reverse.
                let mut cp = conn_param(&p);
                cp.responder_resources = p.initiator_depth;
                cp.initiator_depth = p.responder_resources;
                ev.set_conn(cp, private);
            }
            None => ev.set_ud(crate::verbs::ah_to(peer, 0), 0, 0, private),
        }
        lchannel.push(ev);
    }

    /// A message for id `id` on its connection.
    fn on_id_msg(&mut self, id: Token, conn: Token, msg: Msg) {
        let Some(e) = self.ids.get_mut(&id) else {
            return;
        };
        let timeout = crate::cm_timeout();
        match (e.state, msg) {
            (St::Connecting, Msg::Mra) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.deadline = Some(Instant::now() + timeout * 12);
                }
            }
            (St::Connecting, Msg::Rep(r)) if !e.ud => {
                e.peer = Some(r.params);
                e.state = St::RepReceived;
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.deadline = None;
                }
                self.queue(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, |ev| {
                    ev.post = Post::ConnectResponse;
                    ev.set_conn(conn_param(&r.params), &r.private);
                });
            }
            (St::Connecting, Msg::SidrRep(r)) if e.ud => {
                let peer = e.remote.map(|a| *a.ip()).unwrap_or(Ipv4Addr::UNSPECIFIED);
                let tos = e.tos;
                if r.status == wire::sidr::SUCCESS {
                    e.state = St::Connected;
                    self.queue(id, RDMA_CM_EVENT_ESTABLISHED, 0, |ev| {
                        ev.set_ud(crate::verbs::ah_to(peer, tos), r.qpn, r.qkey, &r.private)
                    });
                } else {
                    e.state = St::Failed;
                    self.queue(id, RDMA_CM_EVENT_UNREACHABLE, r.status as c_int, |ev| {
                        ev.set_ud(IbvAhAttr::default(), 0, 0, &r.private)
                    });
                }
                self.close(conn);
            }
            (St::Connecting | St::Accepted | St::ReqReceived, Msg::Rej(r)) => {
                e.state = St::Failed;
                self.queue(id, RDMA_CM_EVENT_REJECTED, r.reason as c_int, |ev| {
                    ev.set_conn(conn_param(&Params::default()), &r.private)
                });
                self.close(conn);
            }
            (St::Accepted, Msg::Rtu) => {
                e.state = St::Connected;
                let mine = e.mine;
                self.queue(id, RDMA_CM_EVENT_ESTABLISHED, 0, |ev| {
                    ev.set_conn(conn_param(&mine), &[])
                });
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.deadline = None;
                }
            }
            (St::Connected | St::Accepted | St::RepReceived | St::DisconnectSent, Msg::Dreq) => {
                e.state = St::Disconnected;
                self.send(conn, &Msg::Drep);
                self.report_disconnect(id);
                self.close(conn);
            }
            (St::DisconnectSent, Msg::Drep) => {
                e.state = St::Disconnected;
                self.report_disconnect(id);
                self.close(conn);
            }
            (_, Msg::Mra) => {}
            (state, m) => {
                let what = format!("{m:?} for an id in state {state:?}");
                self.protocol_error(conn, &what);
            }
        }
    }

    /// Hands the held requests that `key` now serves to its listener.
    pub(crate) fn serve_parked(&mut self, key: ListenKey) {
        let waiting: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.parked.as_ref().is_some_and(|r| {
                    (r.ps, r.port) == (key.1, key.2) && key.0.is_none_or(|ip| ip == c.local_ip)
                })
            })
            .map(|(t, _)| *t)
            .collect();
        for t in waiting {
            if let Some(req) = self.conns.get_mut(&t).and_then(|c| c.parked.take()) {
                self.on_request(t, req, false);
            }
        }
    }

    /// Queues the one DISCONNECTED event of a connection.
    pub(crate) fn report_disconnect(&mut self, id: Token) {
        if let Some(e) = self.ids.get_mut(&id) {
            if !e.disconnect_reported {
                e.disconnect_reported = true;
                self.queue(id, RDMA_CM_EVENT_DISCONNECTED, 0, |_| {});
            }
        }
    }

    /// Connection `conn` closed or failed with `errno` (its entry is removed by the caller).
    pub(crate) fn on_closed(&mut self, conn: Token, errno: c_int) {
        let Some(id) = self.conns.get_mut(&conn).and_then(|c| c.id.take()) else {
            return;
        };
        let Some(e) = self.ids.get_mut(&id) else {
            return;
        };
        e.conn = None;
        match e.state {
            St::Connecting if errno == libc::ECONNREFUSED => {
                // No CM listens on the peer's device: nobody serves the port.
                e.state = St::Failed;
                if e.ud {
                    self.queue(
                        id,
                        RDMA_CM_EVENT_UNREACHABLE,
                        wire::sidr::UNSUPPORTED as c_int,
                        |_| {},
                    );
                } else {
                    let reason = wire::reason::INVALID_SERVICE_ID as c_int;
                    self.queue(id, RDMA_CM_EVENT_REJECTED, reason, |_| {});
                }
            }
            St::Connecting | St::ReqReceived | St::Accepted => {
                e.state = St::Failed;
                self.queue(id, RDMA_CM_EVENT_UNREACHABLE, -errno, |_| {});
            }
            St::RepReceived => e.peer_gone = Some(errno),
            St::Connected | St::DisconnectSent => {
                e.state = St::Disconnected;
                if !e.ud {
                    self.report_disconnect(id);
                }
            }
            _ => {}
        }
    }

    /// The deadline of connection `conn` passed.
    pub(crate) fn on_timeout(&mut self, conn: Token) {
        let id = self.conns.get(&conn).and_then(|c| c.id);
        match id.and_then(|id| self.ids.get_mut(&id).map(|e| (id, e))) {
            Some((id, e)) => match e.state {
                St::DisconnectSent => {
                    e.state = St::Disconnected;
                    self.report_disconnect(id);
                    self.close(conn);
                }
                St::Connecting | St::Accepted => {
                    log::info!("id {id}: the peer's CM did not answer in time");
                    e.state = St::Failed;
                    self.queue(id, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT, |_| {});
                    self.close(conn);
                }
                _ => {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.deadline = None;
                    }
                }
            },
            // A request nobody listened for in time, a connection that never sent a
            // request, or one done sending.
            None => match self.conns.get_mut(&conn).and_then(|c| c.parked.take()) {
                Some(req) => self.on_request(conn, req, false),
                None => {
                    self.conns.remove(&conn);
                }
            },
        }
    }

    /// Removes id `token`: its listeners, its events, the children of its unretrieved
    /// connect requests; its connection is told (REJ, DREQ) and closed.
    pub(crate) fn forget(&mut self, token: Token) -> Option<IdEntry> {
        let e = self.ids.remove(&token)?;
        self.addrs.remove(&(e.cid.0 as usize));
        for key in &e.listening {
            self.listeners.remove(key);
            let ips: Vec<Ipv4Addr> = match key.0 {
                Some(ip) => vec![ip],
                None => crate::verbs::devices().iter().map(|d| d.ip).collect(),
            };
            for ip in ips {
                if let Some(l) = self.tcp.get_mut(&ip) {
                    // The CM thread closes it once unused for a while (it may be polling it).
                    l.users = l.users.saturating_sub(1);
                    if l.users == 0 {
                        l.idle_since = Some(Instant::now());
                    }
                }
            }
        }
        if let Some(conn) = e.conn {
            let farewell = match (e.state, e.ud) {
                (St::ReqReceived, false) => Some(Msg::Rej(wire::Rej {
                    reason: wire::reason::CONSUMER_DEFINED,
                    private: vec![],
                })),
                (St::ReqReceived, true) => Some(Msg::SidrRep(wire::SidrRep {
                    status: wire::sidr::REJECT,
                    qpn: 0,
                    qkey: 0,
                    private: vec![],
                })),
                (St::Connected | St::Accepted | St::RepReceived | St::DisconnectSent, false) => {
                    Some(Msg::Dreq)
                }
                _ => None,
            };
            if let Some(m) = farewell {
                self.send(conn, &m);
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.id = None;
            }
            self.close(conn);
        }
        let gone = e.channel.take(|ev| ev.token == token || ev.listen == token);
        for ev in gone {
            if ev.listen == token && ev.token != token {
                // A request nobody saw: its id goes too.
                if let Some(child) = self.forget(ev.token) {
                    crate::api::free_id(child);
                }
            }
        }
        Some(e)
    }
}
