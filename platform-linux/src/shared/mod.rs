//! Many processes on one device (README, "Many processes on one device").
//!
//! The card has one ring set. A per-device daemon (`bluerdma-devd`, started by the first
//! process that opens the device) owns it together with the backend, the card's link and
//! the out-of-band listener; every process runs its own engine, unchanged, on a virtual
//! ring set of its own:
//!
//! - [`page`]: the client's register page (a memfd both map): the engine's BAR.
//! - [`mux`]: the daemon's multiplexer between the clients' rings and the card's.
//! - [`client`]: the client's backend parts (registers, DMA buffers and user memory
//!   mapped for the card by the daemon, or on the PCI card pinned by the client and
//!   claimed) and its relay of out-of-band records.
//! - [`claim`]: the daemon's check of a claim against the client's page map.
//! - [`daemon`]: the daemon's loop, its socket and its clients' lifecycle.
//! - [`proto`]: the control messages; [`sys`]: memfd, descriptor passing, futexes,
//!   another process's memory.
//!
//! Posting and polling stay in the client's process: a post writes the client's own ring
//! and its doorbell in the page; the daemon moves the batch to the card. Completions are the
//! client's engine's, from the reports the daemon hands it.

pub mod claim;
pub mod client;
pub mod daemon;
pub mod mux;
pub mod page;
pub mod proto;
pub mod sys;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::OpenError;
use crate::devices::{DeviceEntry, Settings};
use crate::verbs::{Context, DeviceSpec};

/// Set to 1 to open devices through their daemon (many processes per device); 0 or unset
/// opens them in this process alone.
pub const SHARED_ENV: &str = "BLUERDMA_SHARED";

/// Where the daemons' sockets are (default: `/run/bluerdma` for root, else
/// `$XDG_RUNTIME_DIR/bluerdma`, else `/tmp/bluerdma-<uid>`).
pub const RUN_DIR_ENV: &str = "BLUERDMA_RUN_DIR";

/// The daemon's program (default: `bluerdma-devd` beside this library or program, then
/// on `PATH`).
pub const DEVD_ENV: &str = "BLUERDMA_DEVD";

/// Whether `entry` is opened through its daemon.
pub fn wanted(entry: &DeviceEntry) -> bool {
    let _ = entry;
    matches!(
        std::env::var(SHARED_ENV).as_deref(),
        Ok("1") | Ok("yes") | Ok("on")
    )
}

/// The directory of the daemons' sockets.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(RUN_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/bluerdma");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("bluerdma");
    }
    PathBuf::from(format!("/tmp/bluerdma-{uid}"))
}

/// The socket of `entry`'s daemon (named by the device and its IP: two lists that give
/// one name to two devices do not meet).
pub fn socket_path(entry: &DeviceEntry) -> PathBuf {
    run_dir().join(format!("{}-{}.sock", entry.name, entry.ip))
}

/// Opens `entry` through its daemon, starting the daemon if none runs.
pub fn open(
    entry: &DeviceEntry,
    mut spec: DeviceSpec,
    settings: &Settings,
) -> Result<Context, OpenError> {
    let _ = settings;
    let name = spec.name.clone();
    let fail = |errno: i32, msg: String| OpenError::new(&name, errno, msg);
    let path = socket_path(entry);
    let sock = connect_or_start(entry, &path).map_err(|e| {
        fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("the device's daemon ({}): {e}", path.display()),
        )
    })?;
    let session = client::Session::start(&spec.name, sock, spec.page_size).map_err(|e| {
        let errno = match e.kind() {
            std::io::ErrorKind::TimedOut => libc::ETIMEDOUT,
            _ => libc::EIO,
        };
        fail(
            e.raw_os_error().unwrap_or(errno),
            format!("joining the device's daemon: {e}"),
        )
    })?;
    if session.welcome.ip != spec.ip {
        return Err(fail(
            libc::EINVAL,
            format!(
                "the daemon serves {}, this list says {}",
                session.welcome.ip, spec.ip
            ),
        ));
    }
    // Each client of the device starts its key bytes elsewhere (its slot's QPNs and keys
    // are those of the process before it otherwise).
    spec.key_seed = (session.welcome.token >> 16) as u32;
    let oob = relay_connection(&path, &session).map_err(|e| {
        fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("the daemon's out-of-band relay: {e}"),
        )
    })?;
    let pci = match &entry.backend {
        crate::devices::BackendSpec::Pci(cfg) => Some(cfg),
        _ => None,
    };
    let backend = session.backend(&spec.name, spec.page_size, pci)?;
    let windows = session.windows();
    log::info!(
        "{}: shared {} device at {} (slot {}, QP indices {:?})",
        spec.name,
        backend.kind,
        spec.ip,
        session.welcome.slot,
        windows.qp_index
    );
    let oob = WakingOob {
        inner: oob,
        hub: std::sync::Arc::clone(&session.hub),
    };
    Context::open_backend_in(spec, backend, Some(Box::new(oob)), windows)
}

/// The relay, waking the daemon after each record it is handed (a sleeping daemon reads
/// its relay sockets only when woken).
struct WakingOob {
    inner: crate::oob::relay::RelayClient,
    hub: std::sync::Arc<page::Page<page::HubLayout>>,
}

impl WakingOob {
    fn woke<T>(&self, r: T) -> T {
        page::wake_daemon(&self.hub);
        r
    }
}

impl bluerdma_core::platform::OobTransport for WakingOob {
    fn send(
        &mut self,
        peer: std::net::Ipv4Addr,
        wr: &bluerdma_core::oob::RecvWr,
    ) -> Result<(), bluerdma_core::platform::PlatformError> {
        let r = self.inner.send(peer, wr);
        self.woke(r)
    }
    fn send_too_short(
        &mut self,
        peer: std::net::Ipv4Addr,
        rec: &bluerdma_core::oob::RecvTooShort,
    ) -> Result<(), bluerdma_core::platform::PlatformError> {
        let r = self.inner.send_too_short(peer, rec);
        self.woke(r)
    }
    fn send_atomic(
        &mut self,
        peer: std::net::Ipv4Addr,
        msg: &bluerdma_core::oob::AtomicMessage,
    ) -> Result<(), bluerdma_core::platform::PlatformError> {
        let r = self.inner.send_atomic(peer, msg);
        self.woke(r)
    }
    fn send_check(
        &mut self,
        peer: std::net::Ipv4Addr,
        msg: &bluerdma_core::oob::CheckMessage,
    ) -> Result<(), bluerdma_core::platform::PlatformError> {
        let r = self.inner.send_check(peer, msg);
        self.woke(r)
    }
    fn peer_capabilities(
        &self,
        peer: std::net::Ipv4Addr,
    ) -> Option<bluerdma_core::oob::Capabilities> {
        self.inner.peer_capabilities(peer)
    }
    fn poll(&mut self) -> Option<bluerdma_core::platform::OobEvent> {
        self.inner.poll()
    }
    fn bind(
        &mut self,
        local: bluerdma_core::keys::Qpn,
        peer: std::net::Ipv4Addr,
        peer_qpn: bluerdma_core::keys::Qpn,
    ) {
        bluerdma_core::platform::OobTransport::bind(&mut self.inner, local, peer, peer_qpn);
        page::wake_daemon(&self.hub);
    }
    fn unbind(&mut self, local: bluerdma_core::keys::Qpn) {
        bluerdma_core::platform::OobTransport::unbind(&mut self.inner, local);
        page::wake_daemon(&self.hub);
    }
}

fn relay_connection(
    path: &Path,
    s: &client::Session,
) -> std::io::Result<crate::oob::relay::RelayClient> {
    let sock = UnixStream::connect(path)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    proto::write_frame(
        &mut &sock,
        &proto::Request::OobHello {
            version: proto::VERSION,
            slot: s.welcome.slot,
            token: s.welcome.token,
        }
        .encode(),
    )?;
    match proto::Reply::decode(&proto::read_frame(&mut &sock)?)? {
        proto::Reply::Done => {}
        other => {
            return Err(std::io::Error::other(format!(
                "the relay answered {other:?}"
            )))
        }
    }
    sock.set_read_timeout(None)?;
    crate::oob::relay::RelayClient::new(sock, crate::oob::relay::RelayClientConfig::default())
}

fn connect_or_start(entry: &DeviceEntry, path: &Path) -> std::io::Result<UnixStream> {
    if let Ok(s) = UnixStream::connect(path) {
        return Ok(s);
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    let devd = find_devd()?;
    log::info!("{}: starting {} for it", entry.name, devd.display());
    // Its log goes to a file beside the socket, not to this process's stdout and stderr: a
    // daemon that outlives the program must not hold them open (mpirun waits for them).
    let log_path = path.with_extension("log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", log_path.display())))?;
    let mut child = std::process::Command::new(&devd)
        .arg(&entry.name)
        .arg("--socket")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", devd.display())))?;
    let start = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(path) {
            // The daemon outlives this process; its exit is reaped by init.
            std::mem::forget(child);
            return Ok(s);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another process's daemon may have won the race for the lock.
            if let Ok(s) = UnixStream::connect(path) {
                return Ok(s);
            }
            if start.elapsed() > Duration::from_secs(2) {
                return Err(std::io::Error::other(format!(
                    "the daemon exited ({status})"
                )));
            }
        }
        if start.elapsed() > Duration::from_secs(15) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the daemon did not start listening in 15 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Where `bluerdma-devd` is.
pub fn find_devd() -> std::io::Result<PathBuf> {
    if let Some(p) = std::env::var_os(DEVD_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut dirs = Vec::new();
    if let Some(d) = library_dir() {
        dirs.push(d.clone());
        if let Some(p) = d.parent() {
            dirs.push(p.to_path_buf());
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if let Some(p) = d.parent() {
                dirs.push(p.to_path_buf());
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join("bluerdma-devd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("bluerdma-devd not found beside this program or library, nor on PATH; set {DEVD_ENV}"),
            )
        })
}

/// The directory of the object this code is in (the ibverbs stand-in, or the program).
fn library_dir() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an address of our code.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads only its arguments.
    let ok = unsafe { libc::dladdr(library_dir as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated path that lives as long as the object.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let p = PathBuf::from(std::ffi::OsStr::from_bytes_compat(name.to_bytes()));
    p.parent().map(Path::to_path_buf)
}

trait FromBytesCompat {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytesCompat for std::ffi::OsStr {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b)
    }
}

/// The state text of `entry`'s daemon, if one runs ([`proto::Request::Status`]).
pub fn status(entry: &DeviceEntry) -> std::io::Result<String> {
    let sock = UnixStream::connect(socket_path(entry))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    proto::write_frame(&mut &sock, &proto::Request::Status.encode())?;
    match proto::Reply::decode(&proto::read_frame(&mut &sock)?)? {
        proto::Reply::Status { text } => Ok(text),
        other => Err(std::io::Error::other(format!(
            "the daemon answered {other:?}"
        ))),
    }
}
