//! What the CM tests share: the two stand-ins built in this test's profile and loaded into
//! the test process with `dlopen` (libibverbs first, so that librdmacm's `libibverbs.so.1`
//! is ours), the calls they make through the C ABI, and helpers that wait for events with
//! a bound.
//!
//! Each test binary uses its own device addresses (`BLUERDMA_DEVICES`, set before the
//! libraries are loaded), so that it never meets another test's devices or CM port.

#![allow(dead_code)]

#[path = "../../src/abi.rs"]
pub mod abi;

use abi::*;
use core::ffi::{c_int, c_void};
use std::ffi::CString;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a test waits for one event before it fails (the CM answers in milliseconds; this
/// only keeps a broken build from hanging the suite).
pub const EVENT_WAIT: Duration = Duration::from_secs(30);

/// `struct ibv_sge`.
#[repr(C)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub _wr: [u64; 11],
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub _pad: u32,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub _rest: [u32; 4],
}

/// `struct ibv_mr` (48 bytes): the keys.
#[repr(C)]
pub struct Mr {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

const _: () = {
    assert!(size_of::<SendWr>() == 128 && size_of::<RecvWr>() == 32);
    assert!(size_of::<Wc>() == 48 && size_of::<Sge>() == 16);
};

macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The C calls of both libraries.
        pub struct Api { $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)* }
        impl Api {
            fn resolve() -> Api {
                Api { $($name: {
                    let name = CString::new(stringify!($name)).unwrap();
                    // SAFETY: both libraries are loaded RTLD_GLOBAL.
                    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                    assert!(!p.is_null(), "{} is not exported", stringify!($name));
                    // SAFETY: the symbol is that C function (its prototype is above).
                    unsafe { core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                },)* }
            }
        }
    };
}

api! {
    rdma_create_event_channel: fn() -> *mut RdmaEventChannel;
    rdma_destroy_event_channel: fn(*mut RdmaEventChannel) -> ();
    rdma_create_id: fn(*mut RdmaEventChannel, *mut *mut RdmaCmId, *mut c_void, u32) -> c_int;
    rdma_destroy_id: fn(*mut RdmaCmId) -> c_int;
    rdma_bind_addr: fn(*mut RdmaCmId, *const libc::sockaddr) -> c_int;
    rdma_resolve_addr: fn(*mut RdmaCmId, *const libc::sockaddr, *const libc::sockaddr, c_int) -> c_int;
    rdma_resolve_route: fn(*mut RdmaCmId, c_int) -> c_int;
    rdma_listen: fn(*mut RdmaCmId, c_int) -> c_int;
    rdma_connect: fn(*mut RdmaCmId, *const RdmaConnParam) -> c_int;
    rdma_accept: fn(*mut RdmaCmId, *const RdmaConnParam) -> c_int;
    rdma_reject: fn(*mut RdmaCmId, *const c_void, u8) -> c_int;
    rdma_disconnect: fn(*mut RdmaCmId) -> c_int;
    rdma_migrate_id: fn(*mut RdmaCmId, *mut RdmaEventChannel) -> c_int;
    rdma_get_cm_event: fn(*mut RdmaEventChannel, *mut *mut RdmaCmEvent) -> c_int;
    rdma_ack_cm_event: fn(*mut RdmaCmEvent) -> c_int;
    rdma_create_qp: fn(*mut RdmaCmId, *mut c_void, *mut IbvQpInitAttr) -> c_int;
    rdma_destroy_qp: fn(*mut RdmaCmId) -> ();
    ibv_reg_mr: fn(*mut c_void, *mut c_void, usize, c_int) -> *mut Mr;
    ibv_dereg_mr: fn(*mut Mr) -> c_int;
    ibv_query_qp: fn(*mut IbvQp, *mut IbvQpAttr, c_int, *mut IbvQpInitAttr) -> c_int;
}

/// Builds both stand-ins in this test's profile and target directory.
pub fn build() -> PathBuf {
    // This test runs as <target dir>/<profile dir>/deps/<name>.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("a target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("no profile directory in {}", exe.display()),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "-p",
        "bluerdma-ibverbs",
        "-p",
        "bluerdma-rdmacm",
        "--profile",
        &profile,
    ])
    .arg("--target-dir")
    .arg(target_dir);
    let out = output(cmd, Duration::from_secs(900), "cargo runs this test");
    assert!(
        out.status.success(),
        "building the stand-ins failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir
}

/// Runs `cmd` to its end, killed (and the test failed) after `limit`; `install` says what
/// provides the program when it cannot be started.
pub fn output(mut cmd: Command, limit: Duration, install: &str) -> std::process::Output {
    use std::process::Stdio;
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what} ({e}): {install}"));
    // Read both pipes on their own threads so a chatty child never blocks on a full pipe.
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut so, &mut v).map(|_| v)
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut se, &mut v).map(|_| v)
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap().unwrap_or_default(),
        stderr: err.join().unwrap().unwrap_or_default(),
    }
}

fn dlopen(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: loads a library of this workspace; it is never unloaded.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror describes the failure just seen.
        let msg = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        panic!("dlopen {}: {}", path.display(), msg.to_string_lossy());
    }
}

/// The libraries, loaded once per test binary with `devices` (`name=ip,...`) and the CM
/// timeout `timeout_ms`.
pub fn api(devices: &str, timeout_ms: u64) -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let dir = build();
        // Set while no thread of the libraries runs: they read it when they start.
        std::env::set_var("BLUERDMA_DEVICES", devices);
        std::env::set_var("BLUERDMA_CM_TIMEOUT_MS", timeout_ms.to_string());
        dlopen(&dir.join("libibverbs.so"));
        dlopen(&dir.join("librdmacm.so"));
        Api::resolve()
    })
}

/// A `struct sockaddr_in`.
pub fn sin(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

pub fn sa(s: &libc::sockaddr_in) -> *const libc::sockaddr {
    s as *const libc::sockaddr_in as *const libc::sockaddr
}

/// errno of this thread.
pub fn errno() -> c_int {
    // SAFETY: errno of this thread.
    unsafe { *libc::__errno_location() }
}

/// Whether `fd` becomes readable within `wait`.
pub fn readable(fd: c_int, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, wait.as_millis() as c_int) };
    n == 1
}

/// An event, copied out of the library's structure (and acknowledged).
#[derive(Debug, Clone)]
pub struct Event {
    pub id: *mut RdmaCmId,
    pub listen_id: *mut RdmaCmId,
    pub event: c_int,
    pub status: c_int,
    pub private: Vec<u8>,
    pub conn: Option<RdmaConnParam>,
    pub ud: Option<RdmaUdParam>,
}

impl Api {
    /// The next event of `ch`; panics if none comes within [`EVENT_WAIT`].
    pub fn next_event(&self, ch: *mut RdmaEventChannel, ud: bool) -> Event {
        // SAFETY: a live channel.
        let fd = unsafe { (*ch).fd };
        assert!(
            readable(fd, EVENT_WAIT),
            "no CM event within {EVENT_WAIT:?}"
        );
        let mut ev: *mut RdmaCmEvent = core::ptr::null_mut();
        // SAFETY: a live channel; `ev` receives the event.
        let rc = unsafe { (self.rdma_get_cm_event)(ch, &mut ev) };
        assert_eq!(rc, 0, "rdma_get_cm_event: errno {}", errno());
        // SAFETY: the event stays valid until acknowledged below.
        let e = unsafe { &*ev };
        // SAFETY: the union member the port space uses; private data as long as stated.
        let (private, conn, udp) = unsafe {
            let (p, n) = (
                e.param.conn.private_data as *const u8,
                e.param.conn.private_data_len as usize,
            );
            let private = if p.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p, n).to_vec()
            };
            if ud {
                (private, None, Some(e.param.ud))
            } else {
                (private, Some(e.param.conn), None)
            }
        };
        let out = Event {
            id: e.id,
            listen_id: e.listen_id,
            event: e.event,
            status: e.status,
            private,
            conn,
            ud: udp,
        };
        // SAFETY: from rdma_get_cm_event.
        assert_eq!(unsafe { (self.rdma_ack_cm_event)(ev) }, 0);
        out
    }

    /// The next event of `ch`, which must be `want`.
    pub fn expect(&self, ch: *mut RdmaEventChannel, want: c_int, ud: bool) -> Event {
        let e = self.next_event(ch, ud);
        assert_eq!(
            (e.event, e.status),
            (want, 0),
            "expected event {want}, got {} status {} ({e:?})",
            e.event,
            e.status
        );
        e
    }

    pub fn channel(&self) -> *mut RdmaEventChannel {
        // SAFETY: plain creation.
        let ch = unsafe { (self.rdma_create_event_channel)() };
        assert!(
            !ch.is_null(),
            "rdma_create_event_channel: errno {}",
            errno()
        );
        ch
    }

    pub fn id(&self, ch: *mut RdmaEventChannel, ps: u32) -> *mut RdmaCmId {
        let mut id = core::ptr::null_mut();
        // SAFETY: a live channel (or NULL for a synchronous id).
        let rc = unsafe { (self.rdma_create_id)(ch, &mut id, core::ptr::null_mut(), ps) };
        assert_eq!(rc, 0);
        id
    }

    /// A listener on `at`.
    pub fn listener(&self, ch: *mut RdmaEventChannel, ps: u32, at: SocketAddrV4) -> *mut RdmaCmId {
        let id = self.id(ch, ps);
        let a = sin(*at.ip(), at.port());
        // SAFETY: a new id and a valid address.
        unsafe {
            assert_eq!(
                (self.rdma_bind_addr)(id, sa(&a)),
                0,
                "bind {at}: errno {}",
                errno()
            );
            assert_eq!(
                (self.rdma_listen)(id, 16),
                0,
                "listen {at}: errno {}",
                errno()
            );
        }
        id
    }

    /// A new id on `ch` whose address and route to `dst` from `src` are resolved.
    pub fn resolved(
        &self,
        ch: *mut RdmaEventChannel,
        ps: u32,
        src: Ipv4Addr,
        dst: SocketAddrV4,
    ) -> *mut RdmaCmId {
        let id = self.id(ch, ps);
        let (s, d) = (sin(src, 0), sin(*dst.ip(), dst.port()));
        // SAFETY: a new id and valid addresses.
        let rc = unsafe { (self.rdma_resolve_addr)(id, sa(&s), sa(&d), 2000) };
        assert_eq!(rc, 0);
        self.expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, false);
        // SAFETY: as above.
        assert_eq!(unsafe { (self.rdma_resolve_route)(id, 2000) }, 0);
        self.expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, false);
        id
    }

    /// A QP on `id` with the library's CQs.
    pub fn qp(&self, id: *mut RdmaCmId, ud: bool) -> *mut IbvQp {
        let mut attr = IbvQpInitAttr {
            qp_context: core::ptr::null_mut(),
            send_cq: core::ptr::null_mut(),
            recv_cq: core::ptr::null_mut(),
            srq: core::ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: if ud { IBV_QPT_UD } else { IBV_QPT_RC },
            sq_sig_all: 1,
            _pad: 0,
        };
        // SAFETY: a resolved id; NULL PD and CQs are the library's.
        let rc = unsafe { (self.rdma_create_qp)(id, core::ptr::null_mut(), &mut attr) };
        assert_eq!(rc, 0, "rdma_create_qp: errno {}", errno());
        // SAFETY: the id now has its QP.
        unsafe { (*id).qp }
    }

    /// QP state, destination QPN, send PSN and receive PSN.
    pub fn qp_numbers(&self, qp: *mut IbvQp) -> (u32, u32, u32, u32) {
        // SAFETY: all-zero is valid for both.
        let (mut a, mut i): (IbvQpAttr, IbvQpInitAttr) = unsafe { core::mem::zeroed() };
        // SAFETY: a live QP; both structures are writable.
        assert_eq!(unsafe { (self.ibv_query_qp)(qp, &mut a, 0, &mut i) }, 0);
        (a.qp_state, a.dest_qp_num, a.sq_psn, a.rq_psn)
    }
}

/// Connection parameters with `private` as private data (kept alive by the caller).
pub fn conn_param(private: &[u8]) -> RdmaConnParam {
    RdmaConnParam {
        private_data: private.as_ptr() as *const c_void,
        private_data_len: private.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        _pad: 0,
        qp_num: 0,
        _pad2: 0,
    }
}

/// Calls the data-path verb at index `op` of the context's ops table (what the inline
/// `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` of verbs.h do).
///
/// # Safety
/// `ctx` is an open context; `F` is the prototype of that op.
pub unsafe fn op<F: Copy>(ctx: *mut c_void, op: usize) -> F {
    // SAFETY: `struct ibv_context` has `ops` (32 pointers) at offset 8.
    unsafe {
        core::mem::transmute_copy(&*((ctx as *const u8).add(8 + op * 8) as *const *const c_void))
    }
}

pub const OP_POLL_CQ: usize = 11;
pub const OP_POST_SEND: usize = 25;
pub const OP_POST_RECV: usize = 26;

type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut IbvQp, *mut RecvWr, *mut *mut RecvWr) -> c_int;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;

/// Posts a receive of `len` bytes at the start of `mr`.
pub fn post_recv(qp: *mut IbvQp, mr: *mut Mr, len: u32) {
    // SAFETY: a live MR of this test.
    let mut sge = unsafe {
        Sge {
            addr: (*mr).addr as u64,
            length: len,
            lkey: (*mr).lkey,
        }
    };
    let mut wr = RecvWr {
        wr_id: 7,
        next: core::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
        _pad: 0,
    };
    let mut bad = core::ptr::null_mut();
    // SAFETY: a live QP and the post_recv op of its context; the WR lives across the call.
    let rc = unsafe { op::<PostRecv>((*qp).context, OP_POST_RECV)(qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_recv");
}

/// Posts a signaled SEND of the first `len` bytes of `mr`.
pub fn post_send(qp: *mut IbvQp, mr: *mut Mr, len: u32) {
    // SAFETY: a live MR of this test.
    let mut sge = unsafe {
        Sge {
            addr: (*mr).addr as u64,
            length: len,
            lkey: (*mr).lkey,
        }
    };
    let mut wr = SendWr {
        wr_id: 9,
        next: core::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
        opcode: 2,     // IBV_WR_SEND
        send_flags: 2, // IBV_SEND_SIGNALED
        imm_data: 0,
        _wr: [0; 11],
    };
    let mut bad = core::ptr::null_mut();
    // SAFETY: as in post_recv.
    let rc = unsafe { op::<PostSend>((*qp).context, OP_POST_SEND)(qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_send");
}

/// The next completion of `cq`; panics if none comes within [`EVENT_WAIT`].
pub fn poll_one(cq: *mut c_void) -> Wc {
    let start = std::time::Instant::now();
    let mut wc = Wc::default();
    loop {
        // SAFETY: a live CQ (its context is its first field) and one writable completion.
        let n = unsafe { op::<PollCq>(*(cq as *const *mut c_void), OP_POLL_CQ)(cq, 1, &mut wc) };
        assert!(n >= 0, "poll_cq failed");
        if n == 1 {
            return wc;
        }
        assert!(
            start.elapsed() < EVENT_WAIT,
            "no completion within {EVENT_WAIT:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A registered buffer of `len` bytes on `pd` (leaked; freed with the MR's address).
pub fn buffer(api: &Api, pd: *mut c_void, len: usize) -> *mut Mr {
    let buf = Box::leak(vec![0u8; len].into_boxed_slice());
    // SAFETY: a live PD and a buffer that outlives the MR.
    let mr = unsafe {
        (api.ibv_reg_mr)(
            pd,
            buf.as_mut_ptr() as *mut c_void,
            len,
            IBV_ACCESS_LOCAL_WRITE,
        )
    };
    assert!(!mr.is_null(), "ibv_reg_mr: errno {}", errno());
    mr
}

/// Deregisters a buffer from [`buffer`] and frees it.
pub fn free_buffer(api: &Api, mr: *mut Mr) {
    // SAFETY: from buffer(): the MR and its leaked slice.
    unsafe {
        let (addr, len) = ((*mr).addr as *mut u8, (*mr).length);
        assert_eq!((api.ibv_dereg_mr)(mr), 0);
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(addr, len)));
    }
}

/// The bytes of a buffer from [`buffer`].
pub fn bytes<'a>(mr: *mut Mr) -> &'a mut [u8] {
    // SAFETY: from buffer(): `length` bytes at `addr`, owned by the test.
    unsafe { std::slice::from_raw_parts_mut((*mr).addr as *mut u8, (*mr).length) }
}
