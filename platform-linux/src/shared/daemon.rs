//! The device's daemon (`bluerdma-devd`): owns the backend, the card's one ring set
//! ([`super::mux`]), the card's link and the out-of-band listener; serves clients on a
//! Unix socket; exits a while after its last client.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::addr::PageSize;
use bluerdma_core::desc::cmd::SetNetworkParam;
use bluerdma_core::engine::TableWindows;

use super::mux::{Mapping, Mux, MuxClient};
use super::page::{HubLayout, Page, PageLayout, PAGE_LEN, PAGE_MAGIC};
use super::proto::{frame_len, read_frame, write_frame, Reply, Request, Welcome, VERSION};
use super::sys::{futex_wait, peer_pid, send_with_fd, Segment};
use crate::backend::{BackendHandle, BackendKind};
use crate::devices::Settings;
use crate::oob::relay::RelayHub;

/// Clients one device serves at once (the card's tables are split among them).
pub const SLOTS: usize = 8;

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The device's name in the device list.
    pub device: String,
    /// The socket to listen on.
    pub socket: PathBuf,
    /// How long it stays after its last client.
    pub linger: Duration,
}

struct Conn {
    sock: UnixStream,
    buf: Vec<u8>,
    slot: usize,
    token: u64,
    relay: Option<crate::oob::relay::ClientId>,
}

/// Runs the daemon until it has had no client for `linger`.
pub fn run(cfg: &DaemonConfig) -> Result<(), String> {
    let lock = take_lock(&cfg.socket)?;
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.socket.display()))?;
    let _ = set_mode(&cfg.socket, 0o600);
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    // The list its clients see (the same rule: in a network namespace of its own with one
    // address, without BLUERDMA_DEVICES, bluerdma0 at that address), or a client of a
    // namespaced node would start a daemon that does not know its device.
    let list = crate::devices::discover().map_err(|e| e.to_string())?;
    let entry = list
        .get(&cfg.device)
        .ok_or_else(|| format!("no device {} in the device list", cfg.device))?
        .clone();
    let settings = Settings::from_env()?;
    // The daemon's loop does not step an inline card: the card runs in its own threads.
    // SAFETY (of the environment): no other thread runs yet.
    std::env::set_var(bluerdma_sim::model::CARD_ENV, "threads");
    let mut spec = entry.spec();
    settings.apply(&mut spec);
    let backend =
        crate::devices::open_backend_of(&entry, &spec, &settings).map_err(|e| e.to_string())?;
    let remote = backend.handle.remote_memory().ok_or_else(|| {
        format!(
            "the {} backend cannot be shared between processes yet",
            backend.kind
        )
    })?;
    let kind = backend.kind;
    let tuning = backend.tuning;
    let handle: Box<dyn BackendHandle> = backend.handle;
    let net = SetNetworkParam {
        mac: spec.mac,
        ip: spec.ip,
        netmask: std::net::Ipv4Addr::new(255, 255, 255, 0),
        gateway: std::net::Ipv4Addr::UNSPECIFIED,
    };
    let mut mux = Mux::open(
        &cfg.device,
        backend.regs,
        backend.dma,
        remote,
        spec.page_size,
        net,
        SLOTS,
    )?;
    let (oob, _notifier) =
        crate::devices::open_oob_of(&list, &entry, &spec, &settings).map_err(|e| e.to_string())?;
    let mut relay = RelayHub::new(oob, crate::oob::relay::RelayHubConfig::default());
    let hub = Page::<HubLayout>::new(
        Segment::create("bluerdma-hub", PAGE_LEN).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    hub.get().magic.store(PAGE_MAGIC, Ordering::Release);
    log::info!(
        "{}: daemon {} serving {} at {} on {}",
        cfg.device,
        std::process::id(),
        kind,
        spec.ip,
        cfg.socket.display()
    );
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut next_id = 1u64;
    let mut last_client = Instant::now();
    let mut idle = 0u32;
    let mut last_mirror = Instant::now();
    let welcome_base = Welcome {
        slot: 0,
        token: 0,
        qp_index: (0, 0),
        mr_index: (0, 0),
        pgt: (0, 0),
        kind: match kind {
            BackendKind::Emulated => 0,
            BackendKind::Rtl => 1,
            BackendKind::Pci => 2,
        },
        command_timeout_ns: tuning.command_timeout.as_nanos() as u64,
        ack_timeout_min_ns: tuning.ack_timeout_min.as_nanos() as u64,
        send_window: tuning.send_window,
        ip: spec.ip,
        mac: spec.mac.0,
    };
    loop {
        let mut work = false;
        // New connections.
        loop {
            match listener.accept() {
                Ok((sock, _)) => {
                    work = true;
                    let id = next_id;
                    next_id += 1;
                    let text = status_text(&mux, &*handle);
                    match hello(
                        &mut mux,
                        &hub,
                        &welcome_base,
                        sock,
                        id,
                        &mut relay,
                        &conns,
                        &|| text.clone(),
                    ) {
                        Ok(Some(c)) => {
                            conns.insert(id, c);
                        }
                        Ok(None) => {}
                        Err(e) => log::warn!("{}: a client's hello failed: {e}", cfg.device),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("{}: accept: {e}", cfg.device);
                    break;
                }
            }
        }
        // Control messages.
        let mut gone = Vec::new();
        for (&id, c) in conns.iter_mut() {
            if c.relay.is_some() {
                continue;
            }
            match serve_control(&mut mux, c) {
                Ok(w) => work |= w,
                Err(e) => {
                    if e.kind() != io::ErrorKind::UnexpectedEof {
                        log::warn!("{}: client in slot {}: {e}", cfg.device, c.slot);
                    }
                    gone.push(id);
                }
            }
        }
        for (slot, c) in mux.clients.iter().enumerate() {
            if c.as_ref().is_some_and(|c| c.broken) {
                gone.extend(
                    conns
                        .iter()
                        .filter(|(_, k)| k.slot == slot && k.relay.is_none())
                        .map(|(i, _)| *i),
                );
            }
        }
        for id in gone {
            if let Some(c) = conns.remove(&id) {
                mux.leave(c.slot);
                let relays: Vec<u64> = conns
                    .iter()
                    .filter(|(_, k)| k.slot == c.slot && k.relay.is_some())
                    .map(|(i, _)| *i)
                    .collect();
                for r in relays {
                    if let Some(k) = conns.remove(&r) {
                        relay.remove_client(k.relay.expect("relay connection"));
                    }
                }
                work = true;
            }
        }
        work |= mux.round();
        work |= relay.pump();
        if last_mirror.elapsed() > Duration::from_millis(10) {
            mux.mirror_counters();
            last_mirror = Instant::now();
        }
        let any_client = mux.clients.iter().any(Option::is_some) || !conns.is_empty();
        if any_client {
            last_client = Instant::now();
        } else if last_client.elapsed() >= cfg.linger && mux.idle() {
            break;
        }
        if work {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < 256 {
            std::thread::yield_now();
            continue;
        }
        // Sleep until a doorbell or a short while (the card's own reports are looked for
        // then); announce the sleep first, then look once more (a doorbell between the last
        // round and the announcement is seen here, one after it wakes the futex).
        let h = hub.get();
        h.daemon_sleeps.store(1, Ordering::SeqCst);
        let seen = h.wake.load(Ordering::SeqCst);
        if mux.round() {
            h.daemon_sleeps.store(0, Ordering::SeqCst);
            idle = 0;
            continue;
        }
        let nap = Duration::from_micros(50u64 << ((idle - 256) / 64).min(4));
        futex_wait(&h.wake, seen, nap);
        h.daemon_sleeps.store(0, Ordering::SeqCst);
    }
    log::info!(
        "{}: no clients for {:?}: daemon exits",
        cfg.device,
        cfg.linger
    );
    drop(relay);
    // The card stops before the rings' memory goes.
    drop(handle);
    drop(mux);
    let _ = std::fs::remove_file(&cfg.socket);
    drop(lock);
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the daemon's loop state, passed as it is
/// The first message of a connection: a control hello (a new client) or an out-of-band
/// hello (the relay of a client that said hello before).
fn hello(
    mux: &mut Mux,
    hub: &Page<HubLayout>,
    base: &Welcome,
    sock: UnixStream,
    id: u64,
    relay: &mut RelayHub,
    conns: &HashMap<u64, Conn>,
    status: &dyn Fn() -> String,
) -> io::Result<Option<Conn>> {
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let pid = peer_pid(&sock)?;
    let req = Request::decode(&read_frame(&mut &sock)?)?;
    let refuse = |sock: &UnixStream, errno: i32, msg: String| -> io::Result<Option<Conn>> {
        write_frame(
            &mut &*sock,
            &Reply::Fail {
                errno,
                msg: msg.clone(),
            }
            .encode(),
        )?;
        Err(io::Error::other(msg))
    };
    match req {
        Request::Hello {
            version,
            page_shift,
        } => {
            if version != VERSION {
                return refuse(
                    &sock,
                    libc::EPROTO,
                    format!("protocol version {version}, the daemon speaks {VERSION}"),
                );
            }
            if u32::from(page_shift) != mux.page_size().shift() {
                return refuse(
                    &sock,
                    libc::EINVAL,
                    format!(
                        "the engine's pages are 2^{page_shift} bytes, the card's 2^{}",
                        mux.page_size().shift()
                    ),
                );
            }
            let Some(slot) = mux.clients.iter().position(Option::is_none) else {
                return refuse(
                    &sock,
                    libc::EBUSY,
                    format!("{SLOTS} processes use the device already"),
                );
            };
            let windows = TableWindows::split(SLOTS as u32, slot as u32)
                .ok_or_else(|| io::Error::other("no table window"))?;
            let page = Arc::new(Page::<PageLayout>::new(Segment::create(
                "bluerdma-regs",
                PAGE_LEN,
            )?)?);
            page.get().magic.store(PAGE_MAGIC, Ordering::Release);
            let mut token = [0u8; 8];
            getrandom::fill(&mut token).map_err(|e| io::Error::other(e.to_string()))?;
            let token = u64::from_le_bytes(token);
            let w = Welcome {
                slot: slot as u32,
                token,
                qp_index: (windows.qp_index.start, windows.qp_index.end),
                mr_index: (windows.mr_index.start, windows.mr_index.end),
                pgt: (windows.pgt.start, windows.pgt.end),
                ..base.clone()
            };
            write_frame(&mut &sock, &Reply::Welcome(w).encode())?;
            for seg in [page.segment(), hub.segment()] {
                let body = Reply::Fd.encode();
                let mut framed = (body.len() as u32).to_le_bytes().to_vec();
                framed.extend_from_slice(&body);
                // The descriptor rides on the length prefix's bytes.
                send_with_fd(&sock, &framed[..4], seg.fd())?;
                io::Write::write_all(&mut &sock, &framed[4..])?;
            }
            mux.clients[slot] = Some(MuxClient::new(id, pid, page, windows));
            log::info!("client {id} (pid {pid}) in slot {slot}");
            sock.set_nonblocking(true)?;
            Ok(Some(Conn {
                sock,
                buf: Vec::new(),
                slot,
                token,
                relay: None,
            }))
        }
        Request::OobHello {
            version,
            slot,
            token,
        } => {
            let owner = conns
                .values()
                .find(|c| c.relay.is_none() && c.slot == slot as usize && c.token == token);
            let (Some(_), true) = (owner, version == VERSION) else {
                return refuse(
                    &sock,
                    libc::EPERM,
                    "an out-of-band hello with a wrong slot or token".into(),
                );
            };
            let Some(client) = mux.clients.get(slot as usize).and_then(Option::as_ref) else {
                return refuse(&sock, libc::EPERM, "no such client".into());
            };
            let window = client.windows.qp_index.clone();
            write_frame(&mut &sock, &Reply::Done.encode())?;
            sock.set_read_timeout(None)?;
            let stream = sock.try_clone()?;
            let rid = relay.add_client(stream, window)?;
            Ok(Some(Conn {
                sock,
                buf: Vec::new(),
                slot: slot as usize,
                token,
                relay: Some(rid),
            }))
        }
        Request::Status => {
            write_frame(&mut &sock, &Reply::Status { text: status() }.encode())?;
            Ok(None)
        }
        other => refuse(&sock, libc::EPROTO, format!("{other:?} before a hello")),
    }
}

/// The daemon's state: a line per client (slot, pid, QPs and MRs it holds valid in the
/// card), the multiplexer's counters and the card's.
fn status_text(mux: &Mux, handle: &dyn BackendHandle) -> String {
    let mut t = String::new();
    for (slot, pid, qps, mrs) in mux.tables() {
        t.push_str(&format!(
            "client slot={slot} pid={pid} qps={qps} mrs={mrs}\n"
        ));
    }
    t.push_str(&format!("mux {:?}\n", mux.stats));
    if let Some((qps, mrs)) = handle.valid_entries() {
        t.push_str(&format!("card valid_qps={qps} valid_mrs={mrs}\n"));
    }
    t.push_str(&format!("card {}\n", handle.card_stats()));
    t
}

/// Reads and answers a client's control messages (nonblocking); whether it did any.
fn serve_control(mux: &mut Mux, c: &mut Conn) -> io::Result<bool> {
    let mut chunk = [0u8; 4096];
    let mut work = false;
    loop {
        match c.sock.read(&mut chunk) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed")),
            Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    while c.buf.len() >= 4 {
        let n = frame_len(c.buf[..4].try_into().expect("4 bytes"))?;
        if c.buf.len() < 4 + n {
            break;
        }
        let body: Vec<u8> = c.buf.drain(..4 + n).skip(4).collect();
        let reply = match Request::decode(&body)? {
            Request::Map {
                va,
                len,
                page_shift,
                dma,
            } => map(mux, c.slot, va, len, page_shift, dma),
            Request::Unmap { dev } => {
                if let Some(cl) = mux.clients[c.slot].as_mut() {
                    if cl.maps.remove(&dev).is_some() {
                        mux.remote().unmap(bluerdma_core::addr::DeviceAddr(dev));
                    }
                }
                Reply::Done
            }
            other => Reply::Fail {
                errno: libc::EPROTO,
                msg: format!("{other:?} after the hello"),
            },
        };
        c.sock.set_nonblocking(false)?;
        let r = write_frame(&mut c.sock, &reply.encode());
        c.sock.set_nonblocking(true)?;
        r?;
        work = true;
    }
    Ok(work)
}

fn map(mux: &mut Mux, slot: usize, va: u64, len: u64, page_shift: u8, dma: bool) -> Reply {
    let page = match page_shift {
        12 => PageSize::Size4K,
        16 => PageSize::Size64K,
        21 => PageSize::Size2M,
        s => {
            return Reply::Fail {
                errno: libc::EINVAL,
                msg: format!("pages of 2^{s} bytes"),
            }
        }
    };
    let Some(c) = mux.clients[slot].as_ref() else {
        return Reply::Fail {
            errno: libc::ENODEV,
            msg: "no such client".into(),
        };
    };
    if len == 0 || va.checked_add(len).is_none_or(|e| e > 1 << 47) {
        return Reply::Fail {
            errno: libc::EINVAL,
            msg: format!("{len} bytes at {va:#x}"),
        };
    }
    let pid = c.pid;
    match mux.remote().map(pid, va, len as usize, page) {
        Ok(dev) => {
            if let Some(c) = mux.clients[slot].as_mut() {
                c.maps.insert(dev.0, Mapping { va, len, dma });
            }
            Reply::Mapped { dev: dev.0 }
        }
        Err(e) => Reply::Fail {
            errno: libc::ENOMEM,
            msg: format!("mapping {len} bytes: {e:?}"),
        },
    }
}

/// An exclusive lock beside the socket: one daemon per device, however many start.
fn take_lock(socket: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let path = socket.with_extension("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!("another daemon holds {}", path.display()));
    }
    Ok(f)
}

fn set_mode(p: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}
