//! The device's daemon (`bluerdma-devd`): owns the backend, the card's one ring set
//! ([`super::mux`]), the card's link and the out-of-band listener; serves clients on a
//! Unix socket; exits a while after its last client.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::addr::PageSize;
use bluerdma_core::desc::cmd::SetNetworkParam;
use bluerdma_core::engine::TableWindows;

use super::claim;
use super::mux::{Mapping, Mux, MuxClient};
use super::page::{HubLayout, Page, PageLayout, PAGE_LEN, PAGE_MAGIC};
use super::proto::{frame_len, read_frame, write_frame, Reply, Request, Welcome, VERSION};
use super::sys::{futex_wait, peer_pid, send_with_fd, Segment};
use crate::backend::{BackendHandle, BackendKind};
use crate::devices::Settings;
use crate::oob::relay::RelayHub;

/// Clients one device serves at once (the card's tables are split among them).
pub const SLOTS: usize = 8;

/// How often the daemon starts checking every claim again (the PCI card:
/// [`claim::audit`]); a pass reads up to [`AUDIT_BUDGET`] page-map entries each 10 ms, so it
/// ends within this while the clients claim less than about 6 GiB.
pub const AUDIT_EVERY: Duration = Duration::from_secs(1);

/// Base pages an audit reads in one go (128 KiB of page map, 64 MiB of memory).
pub const AUDIT_BUDGET: u64 = 16384;

/// Where the audit of the claims stands.
struct AuditCursor {
    /// The slot and bus address to go on from, during a pass.
    next: Option<(usize, u64)>,
    /// When the last pass started.
    pass: Instant,
}

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
    /// The client's page map, opened at its hello, where it claims memory (the PCI card):
    /// tied to that process, so a claim is never checked against another one that took
    /// its pid.
    pagemap: Option<File>,
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
    // The PCI card reaches memory by physical address: each client pins and translates its
    // own and claims it; the other backends reach clients' memory through the daemon.
    let remote = backend.handle.remote_memory();
    if remote.is_none() && backend.kind != BackendKind::Pci {
        return Err(format!(
            "the {} backend cannot reach other processes' memory: it cannot be shared",
            backend.kind
        ));
    }
    let kind = backend.kind;
    // The entry's timers, as a device opened alone takes them.
    let mut tuning = backend.tuning;
    let o = &entry.options;
    tuning.command_timeout = o.command_timeout.unwrap_or(tuning.command_timeout);
    tuning.ack_timeout_min = o.ack_timeout_min.unwrap_or(tuning.ack_timeout_min);
    tuning.send_window = o.send_window.unwrap_or(tuning.send_window);
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
    let (oob, notifier) =
        crate::devices::open_oob_of(&list, &entry, &spec, &settings).map_err(|e| e.to_string())?;
    let mut relay = RelayHub::new(oob, crate::oob::relay::RelayHubConfig::default());
    let hub = Arc::new(
        Page::<HubLayout>::new(
            Segment::create("bluerdma-hub", PAGE_LEN).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?,
    );
    hub.get().magic.store(PAGE_MAGIC, Ordering::Release);
    // What wakes the daemon when it sleeps: clients' doorbells (in their pages), records
    // from peers (the OOB channel's I/O thread) and, where the card can tell, its reports.
    // Where it cannot (the RTL simulator, the PCI card), the daemon naps briefly instead.
    let waker = {
        let hub = Arc::clone(&hub);
        move || super::page::wake_daemon(&hub)
    };
    notifier.set(Arc::new(waker.clone()));
    let card_wakes = handle_wakes(&*handle, Box::new(waker));
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
    let mut last_work = Instant::now();
    let mut last_mirror = Instant::now();
    let mut audit_cursor = AuditCursor {
        next: None,
        pass: Instant::now(),
    };
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
            match serve_control(&mut mux, c, &cfg.device) {
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
        if relay.pump() {
            work = true;
            // Records for some client arrived: its progress thread may sleep in its page.
            mux.notify_clients();
        }
        // Counters are read for dumps only; on the RTL backend each is a CSR round trip.
        if last_mirror.elapsed() > Duration::from_millis(500) {
            mux.mirror_counters();
            audit(&mut mux, &conns, &cfg.device, &mut audit_cursor);
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
            last_work = Instant::now();
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
        let nap = if card_wakes {
            // Nothing but a new connection arrives unannounced (a client's requests, its
            // relay records and doorbells, peers' records and the card's reports all wake
            // the daemon): the nap bounds how long a hello waits, 2 ms while the device is
            // busy, 20 ms once it has been idle for a while (an idle daemon costs little).
            if last_work.elapsed() < Duration::from_millis(200) {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(20)
            }
        } else {
            Duration::from_micros(50u64 << ((idle - 256) / 64).min(4))
        };
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
            let pagemap = if base.claims() {
                match File::open(format!("/proc/{pid}/pagemap")) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        return refuse(
                            &sock,
                            libc::EACCES,
                            format!(
                                "the daemon cannot open the page map of process {pid} ({e}), \
                                 which it needs to check the memory the process claims"
                            ),
                        )
                    }
                }
            } else {
                None
            };
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
                pagemap,
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
                pagemap: None,
            }))
        }
        Request::Status => {
            write_frame(&mut &sock, &Reply::Status { text: status() }.encode())?;
            Ok(None)
        }
        other => refuse(&sock, libc::EPROTO, format!("{other:?} before a hello")),
    }
}

/// Asks the card to wake the daemon after its reports; whether it will.
fn handle_wakes(handle: &dyn BackendHandle, f: Box<dyn Fn() + Send + Sync>) -> bool {
    handle.set_report_notify(f)
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
fn serve_control(mux: &mut Mux, c: &mut Conn, device: &str) -> io::Result<bool> {
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
        let reply = match (Request::decode(&body)?, c.pagemap.as_ref()) {
            (
                Request::Map {
                    va,
                    len,
                    page_shift,
                    dma,
                },
                None,
            ) => map(mux, c.slot, va, len, page_shift, dma),
            (Request::Unmap { dev }, _) => {
                if let Some(cl) = mux.clients[c.slot].as_mut() {
                    if cl.maps.remove(&dev).is_some() {
                        if let Some(remote) = mux.remote() {
                            remote.unmap(bluerdma_core::addr::DeviceAddr(dev));
                        }
                    }
                }
                Reply::Done
            }
            (Request::Claim { va, len, dev, dma }, Some(pagemap)) => {
                claim_memory(mux, c.slot, pagemap, (va, len, dev, dma), device)
            }
            (Request::Unclaim { dev, len }, Some(_)) => unclaim(mux, c.slot, dev, len),
            (Request::Map { .. }, Some(_)) => Reply::Fail {
                errno: libc::EOPNOTSUPP,
                msg: "this card reaches memory by physical address: claim it instead".into(),
            },
            (Request::Claim { .. } | Request::Unclaim { .. }, None) => Reply::Fail {
                errno: libc::EOPNOTSUPP,
                msg: "this card reaches memory through the daemon's mappings: map it instead"
                    .into(),
            },
            (other, _) => Reply::Fail {
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
    let Some(remote) = mux.remote() else {
        return Reply::Fail {
            errno: libc::EOPNOTSUPP,
            msg: "this card reaches memory by physical address: claim it instead".into(),
        };
    };
    match remote.map(pid, va, len as usize, page) {
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

/// Whether a mapping of `maps` shares a byte with `[start, end)` (the mappings never
/// overlap one another, so the one before `start` is the only other candidate).
fn overlaps(maps: &BTreeMap<u64, Mapping>, start: u64, end: u64) -> bool {
    maps.range(start..end).next().is_some()
        || maps
            .range(..start)
            .next_back()
            .is_some_and(|(&s, m)| s.saturating_add(m.len) > start)
}

/// A claim (`va`, `len`, `dev`, `dma`) of the client in `slot`, checked against its page
/// map: a DMA buffer is recorded as it is, user memory as the pages of the card's size it
/// touches (a page already claimed stays as it is).
fn claim_memory(
    mux: &mut Mux,
    slot: usize,
    pagemap: &File,
    (va, len, dev, dma): (u64, u64, u64, bool),
    device: &str,
) -> Reply {
    let page = mux.page_size().bytes();
    let Some(c) = mux.clients[slot].as_mut() else {
        return Reply::Fail {
            errno: libc::ENODEV,
            msg: "no such client".into(),
        };
    };
    let (id, pid) = (c.id, c.pid);
    let refuse = |errno: i32, msg: String| {
        log::warn!(
            "{device}: client {id} (pid {pid}): claim of {len} bytes at {va:#x} as bus \
             address {dev:#x} refused: {msg}"
        );
        Reply::Fail { errno, msg }
    };
    let checked = claim::pages(va, len, dev, page).and_then(|pages| {
        claim::verify(pagemap, va, len, dev, page, crate::umem::base_page_size()).map(|()| pages)
    });
    let (first, dev_first, bytes) = match checked {
        Ok(p) => p,
        Err(e) => return refuse(e.errno(), e.to_string()),
    };
    if dma {
        if overlaps(&c.maps, dev, dev + len) {
            return refuse(libc::EEXIST, "it overlaps memory claimed before".into());
        }
        c.maps.insert(dev, Mapping { va, len, dma: true });
        return Reply::Done;
    }
    let mut new = Vec::new();
    for k in 0..bytes / page {
        let at = dev_first + k * page;
        match c.maps.get(&at) {
            Some(m) if !m.dma && m.len == page => {}
            _ if overlaps(&c.maps, at, at + page) => {
                return refuse(
                    libc::EEXIST,
                    format!("its page at {at:#x} overlaps a DMA buffer claimed before"),
                )
            }
            _ => new.push((
                at,
                Mapping {
                    va: first + k * page,
                    len: page,
                    dma: false,
                },
            )),
        }
    }
    c.maps.extend(new);
    Reply::Done
}

/// Drops the client's claims of user memory in the pages of `[dev, dev + len)`.
fn unclaim(mux: &mut Mux, slot: usize, dev: u64, len: u64) -> Reply {
    let page = mux.page_size().bytes();
    let Some(end) = dev
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(page))
    else {
        return Reply::Fail {
            errno: libc::EINVAL,
            msg: format!("{len} bytes at {dev:#x}"),
        };
    };
    if let Some(c) = mux.clients[slot].as_mut() {
        let gone: Vec<u64> = c
            .maps
            .range(dev - dev % page..end)
            .filter(|(_, m)| !m.dma)
            .map(|(&d, _)| d)
            .collect();
        for d in gone {
            c.maps.remove(&d);
        }
    }
    Reply::Done
}

/// Checks clients' claims again, [`AUDIT_BUDGET`] pages at a time, a pass every
/// [`AUDIT_EVERY`]; a client whose claimed pages no longer have those frames (it unmapped
/// memory it still claims) is dropped.
fn audit(mux: &mut Mux, conns: &HashMap<u64, Conn>, device: &str, cursor: &mut AuditCursor) {
    let (mut slot, mut from) = match cursor.next {
        Some(next) => next,
        None if cursor.pass.elapsed() >= AUDIT_EVERY => {
            cursor.pass = Instant::now();
            (0, 0)
        }
        None => return,
    };
    let page = mux.page_size().bytes();
    let base = crate::umem::base_page_size();
    let mut budget = AUDIT_BUDGET;
    while slot < mux.clients.len() {
        let pagemap = conns
            .values()
            .filter(|c| c.slot == slot)
            .find_map(|c| c.pagemap.as_ref());
        if let (Some(pagemap), Some(cl)) = (pagemap, mux.clients[slot].as_mut()) {
            if !cl.broken {
                let maps = cl.maps.range(from..).map(|(&d, m)| (d, m.va, m.len));
                match claim::audit(pagemap, maps, page, base, &mut budget) {
                    claim::Audit::Done => {}
                    claim::Audit::Stopped { at } => {
                        cursor.next = Some((slot, at));
                        return;
                    }
                    claim::Audit::Failed { dev, why } => {
                        log::error!(
                            "{device}: client {} (pid {}): its claim at bus address {dev:#x} \
                             no longer holds ({why}); dropping it",
                            cl.id,
                            cl.pid
                        );
                        cl.broken = true;
                    }
                }
            }
        }
        slot += 1;
        from = 0;
    }
    cursor.next = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_overlaps_a_mapping_that_starts_inside_it_or_reaches_into_it() {
        let mut maps = BTreeMap::new();
        let m = |len, dma| Mapping { va: 0, len, dma };
        maps.insert(0x1000, m(0x1000, true));
        maps.insert(0x4000, m(0x2000, false));
        assert!(overlaps(&maps, 0x1800, 0x1900), "inside the first");
        assert!(overlaps(&maps, 0x0, 0x1001), "reaching into the first");
        assert!(overlaps(&maps, 0x5fff, 0x7000), "the second's last byte");
        assert!(overlaps(&maps, 0x0, 0x10000), "both");
        assert!(!overlaps(&maps, 0x2000, 0x4000), "between them");
        assert!(!overlaps(&maps, 0x6000, 0x7000), "after them");
        assert!(!overlaps(&BTreeMap::new(), 0, u64::MAX));
    }
}
