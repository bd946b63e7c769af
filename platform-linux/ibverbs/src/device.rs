//! Devices, contexts and the queries: what ibv_devices and ibv_devinfo see.

use core::ffi::{c_char, c_int, c_void};
use std::collections::HashMap;
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use bluerdma_linux::devices::{DeviceEntry, DeviceList};
use bluerdma_linux::verbs::{Context, DeviceSpec};

use crate::abi::*;
use crate::{init_log, set_errno};

/// Limits reported to applications; they are the emulated device's real ones.
pub(crate) mod caps {
    use bluerdma_linux::storage::Capacity;

    pub fn capacity() -> Capacity {
        Capacity::default()
    }
    /// Receive WRs per QP (the engine's software receive queue).
    pub const MAX_RECV_WR: u32 = bluerdma_core::engine::RECV_QUEUE as u32;
    /// Outstanding RDMA READs a QP may have (initiator and responder).
    pub const MAX_RD_ATOM: u8 = 16;
    /// The largest message (the card's 32-bit length).
    pub const MAX_MSG: u32 = 1 << 31;
}

/// A device of the list, as handed to applications: `ibv_device` first.
#[repr(C)]
pub(crate) struct Device {
    pub ibv: IbvDevice,
    pub index: usize,
    pub entry: DeviceEntry,
    /// The device's emulated card and engine while any context or object of this process
    /// uses it: every context of one device shares it (a second card could not bind the
    /// device's address).
    engine: Mutex<std::sync::Weak<Context>>,
}

// SAFETY: the raw pointers in `ibv` are all null; the rest is plain data.
unsafe impl Send for Device {}
// SAFETY: as above; devices are never mutated after creation.
unsafe impl Sync for Device {}

impl Device {
    pub fn guid(&self) -> u64 {
        // EUI-64 from the MAC, as RoCE devices derive their node GUID.
        let m = self.entry.mac.0;
        u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]])
    }

    pub fn gid(&self) -> [u8; 16] {
        bluerdma_core::qp::Gid::from_ipv4(self.entry.ip).0
    }
}

fn fill(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as c_char;
    }
}

/// The devices of this process, read once from the device list.
fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        init_log();
        let configured =
            std::env::var(bluerdma_linux::devices::DEVICES_ENV).is_ok_and(|v| !v.trim().is_empty());
        let entries = match (configured, namespace_address()) {
            (false, Some(ip)) => {
                log::info!("bluerdma0 at {ip}: the only IPv4 address of this network namespace");
                vec![DeviceEntry::new("bluerdma0", ip)]
            }
            _ => match DeviceList::from_env() {
                Ok(l) => l.entries().to_vec(),
                Err(e) => {
                    log::error!("{e}");
                    return Vec::new();
                }
            },
        };
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let mut ibv = IbvDevice {
                    _ops: [0; 2],
                    node_type: IBV_NODE_CA,
                    transport_type: IBV_TRANSPORT_IB,
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                };
                let name = format!("bluerdma{index}");
                fill(&mut ibv.name, &name);
                fill(&mut ibv.dev_name, &format!("uverbs{index}"));
                fill(
                    &mut ibv.dev_path,
                    &format!("/sys/class/infiniband_verbs/uverbs{index}"),
                );
                fill(
                    &mut ibv.ibdev_path,
                    &format!("/sys/class/infiniband/{name}"),
                );
                log::debug!("{name}: {} at {}", entry.name, entry.ip);
                Device {
                    ibv,
                    index,
                    entry: entry.clone(),
                    engine: Mutex::new(std::sync::Weak::new()),
                }
            })
            .collect()
    })
}

/// A node's own address, found without configuration: when this process runs in a network
/// namespace other than the machine's first one (a node of `cargo xtask cluster`, a
/// container) and that namespace has exactly one IPv4 address outside 127.0.0.0/8, that is
/// the device's address. In the machine's own namespace the device list applies (by default
/// bluerdma0 = 127.0.0.1, bluerdma1 = 127.0.0.2).
fn namespace_address() -> Option<std::net::Ipv4Addr> {
    if !in_own_netns() {
        return None;
    }
    let mut found = None;
    let mut ifs: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: getifaddrs fills `ifs` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut p = ifs;
    let mut count = 0;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs made; its address, when set, is a sockaddr
        // whose family says its type.
        unsafe {
            let a = (*p).ifa_addr;
            if !a.is_null() && (*a).sa_family as i32 == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    count += 1;
                    found = Some(ip);
                }
            }
            p = (*p).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs made.
    unsafe { libc::freeifaddrs(ifs) };
    (count == 1).then_some(found).flatten()
}

/// Whether this process runs in a network namespace of its own: one named by `ip netns`
/// (its file in /run/netns is this namespace), or one that differs from PID 1's when that
/// can be read.
fn in_own_netns() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(own) = std::fs::metadata("/proc/self/ns/net") else {
        return false;
    };
    let named = std::fs::read_dir("/run/netns").is_ok_and(|dir| {
        dir.flatten().any(|e| {
            std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == own.ino() && m.dev() == own.dev())
        })
    });
    named || std::fs::metadata("/proc/1/ns/net").is_ok_and(|first| first.ino() != own.ino())
}

/// # Safety
/// `dev` must come from [`bv_ibv_get_device_list`].
unsafe fn device<'a>(dev: *mut IbvDevice) -> Option<&'a Device> {
    // SAFETY: `ibv` is the first field of a `Device` that lives for the process.
    (!dev.is_null()).then(|| unsafe { &*(dev as *const Device) })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_device_list(num: *mut c_int) -> *mut *mut IbvDevice {
    let devs = devices();
    let mut list: Vec<*mut IbvDevice> = devs
        .iter()
        .map(|d| &d.ibv as *const IbvDevice as *mut IbvDevice)
        .collect();
    list.push(ptr::null_mut());
    if !num.is_null() {
        // SAFETY: the caller passes a valid int pointer or NULL.
        unsafe { *num = devs.len() as c_int };
    }
    Box::into_raw(list.into_boxed_slice()) as *mut *mut IbvDevice
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_free_device_list(list: *mut *mut IbvDevice) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (made by ibv_get_device_list).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: allocated as a boxed slice of n + 1 pointers.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_device_name(dev: *mut IbvDevice) -> *const c_char {
    // SAFETY: a device pointer from the list.
    match unsafe { device(dev) } {
        Some(d) => d.ibv.name.as_ptr(),
        None => ptr::null(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_device_guid(dev: *mut IbvDevice) -> u64 {
    // SAFETY: a device pointer from the list.
    unsafe { device(dev) }.map_or(0, |d| d.guid().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_device_index(dev: *mut IbvDevice) -> c_int {
    // SAFETY: a device pointer from the list.
    unsafe { device(dev) }.map_or(-1, |d| d.index as c_int)
}

/// An opened device: `struct verbs_context` (extended ops, `sz`, then `ibv_context`), then
/// our state. Applications hold `&ibv`.
#[repr(C)]
pub(crate) struct Ctx {
    ext: [usize; ext::WORDS],
    sz: usize,
    pub ibv: IbvContext,
    pub dev: &'static Device,
    /// The device's emulated card and engine ([`Device`] shares it between contexts),
    /// started by the first object made on the context.
    engine: Mutex<Option<Arc<Context>>>,
    /// QPs attached to a shared receive queue, by QP number: a poll that returns one of
    /// their receive completions hands the QP its next WR (see `srq.rs`).
    pub srq_qps: Mutex<HashMap<u32, Arc<crate::srq::Shared>>>,
    /// `async_fd` is the read end of this pipe; nothing writes to it yet (no async events
    /// are generated), so it never becomes readable.
    async_pipe: [c_int; 2],
}

const _: () = assert!(core::mem::offset_of!(Ctx, ibv) == 320);

impl Ctx {
    /// # Safety
    /// `ctx` must come from [`bv_ibv_open_device`] and not be closed.
    pub unsafe fn from_ibv<'a>(ctx: *mut IbvContext) -> Option<&'a Ctx> {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: `ibv` sits at offset 320 of a live `Ctx`.
        Some(unsafe { &*((ctx as *mut u8).sub(320) as *const Ctx) })
    }

    /// The engine, started on first use.
    pub fn engine(&self) -> Result<Arc<Context>, c_int> {
        let mut e = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = e.as_ref() {
            return Ok(Arc::clone(c));
        }
        let mut shared = self.dev.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = shared.upgrade() {
            *e = Some(Arc::clone(&c));
            return Ok(c);
        }
        let port = match std::env::var("BLUERDMA_OOB_PORT") {
            Ok(p) => p.parse().map_err(|_| {
                log::error!("BLUERDMA_OOB_PORT=`{p}` is not a port number");
                libc::EINVAL
            })?,
            Err(_) => bluerdma_linux::oob::OOB_PORT,
        };
        let mut spec: DeviceSpec = self.dev.entry.spec();
        spec.name = format!("bluerdma{}", self.dev.index);
        spec.capacity = caps::capacity();
        // Where every connection starts on the wire (both ends must agree; the C tests use
        // 0xFFFFF0 to cross the 24-bit wrap).
        if let Ok(v) = std::env::var("BLUERDMA_WIRE_PSN_START") {
            let t = v.trim();
            let parsed = match t.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => t.parse(),
            };
            spec.wire_psn_start = parsed.map_err(|_| {
                log::error!("BLUERDMA_WIRE_PSN_START=`{v}` is not a PSN");
                libc::EINVAL
            })?;
        }
        let c = Context::open(spec, port).map_err(|err| {
            log::error!(
                "bluerdma{} ({} at {}): {err}",
                self.dev.index,
                self.dev.entry.name,
                self.dev.entry.ip
            );
            libc::EADDRINUSE
        })?;
        let c = Arc::new(c);
        *shared = Arc::downgrade(&c);
        *e = Some(Arc::clone(&c));
        Ok(c)
    }
}

/// The ibv_context ops every context carries.
fn context_ops() -> [usize; 32] {
    let mut o = [0usize; 32];
    o[ops::POLL_CQ] = crate::objects::op_poll_cq as *const () as usize;
    o[ops::REQ_NOTIFY_CQ] = crate::objects::op_req_notify_cq as *const () as usize;
    o[ops::POST_SEND] = crate::post::op_post_send as *const () as usize;
    o[ops::POST_RECV] = crate::objects::op_post_recv as *const () as usize;
    o[ops::POST_SRQ_RECV] = crate::srq::op_post_srq_recv as *const () as usize;
    o
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    init_log();
    // SAFETY: a device pointer from the list.
    let Some(d) = (unsafe { device(dev) }) else {
        set_errno(libc::ENODEV);
        return ptr::null_mut();
    };
    let mut fds = [-1; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return ptr::null_mut();
    }
    let mut ext_ops = [0usize; ext::WORDS];
    ext_ops[ext::QUERY_PORT] = ext_query_port as *const () as usize;
    let ctx = Box::new(Ctx {
        ext: ext_ops,
        sz: ext::SIZE,
        ibv: IbvContext {
            device: dev,
            ops: context_ops(),
            cmd_fd: -1,
            async_fd: fds[0],
            num_comp_vectors: 1,
            _pad: 0,
            mutex: [0; 40],
            abi_compat: usize::MAX as *mut c_void,
        },
        dev: d,
        engine: Mutex::new(None),
        srq_qps: Mutex::new(HashMap::new()),
        async_pipe: fds,
    });
    let ctx = Box::into_raw(ctx);
    // SAFETY: just allocated; the application gets the embedded ibv_context.
    unsafe { ptr::addr_of_mut!((*ctx).ibv) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_close_device(ctx: *mut IbvContext) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    let c = c as *const Ctx as *mut Ctx;
    // SAFETY: allocated by Box in ibv_open_device; the caller gives it up.
    let c = unsafe { Box::from_raw(c) };
    if let Some(e) = c.engine.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        log::info!("bluerdma{} closed: {:?}", c.dev.index, e.stats());
        log::info!("bluerdma{} card: {}", c.dev.index, e.card_stats());
        if let Some([malformed, no_qp, qkey, no_buffer]) = crate::ud::drops(e) {
            log::info!(
                "bluerdma{} UD datagrams dropped: {malformed} malformed, {no_qp} for no ready \
                 QP, {qkey} for a wrong Q_Key, {no_buffer} for no receive buffer",
                c.dev.index
            );
        }
    }
    for fd in c.async_pipe {
        // SAFETY: our pipe's descriptors.
        unsafe { libc::close(fd) };
    }
    0
}

fn device_attr(d: &Device) -> IbvDeviceAttr {
    let cap = caps::capacity();
    let mut a = IbvDeviceAttr {
        fw_ver: [0; 64],
        node_guid: d.guid().to_be(),
        sys_image_guid: d.guid().to_be(),
        max_mr_size: 1 << 40,
        page_size_cap: 0x1000 | 0x20_0000,
        // Xilinx's vendor id and a part id no tool knows: perftest then uses the classic
        // post path and no inline data (ibverbs-abi.md 3.2).
        vendor_id: 0x10ee,
        vendor_part_id: 0xb1e0,
        hw_ver: 1,
        max_qp: cap.qps as c_int - 1,
        max_qp_wr: cap.sq_depth as c_int,
        // IBV_DEVICE_RC_RNR_NAK_GEN.
        device_cap_flags: 1 << 12,
        // Send requests: several SGEs (split or gathered by the library); receive WRs: one.
        max_sge: crate::post::MAX_SGE as c_int,
        max_sge_rd: crate::post::MAX_SGE as c_int,
        max_cq: cap.cqs as c_int,
        max_cqe: cap.cq_depth as c_int,
        max_mr: cap.mrs as c_int,
        max_pd: 1 << 16,
        max_qp_rd_atom: caps::MAX_RD_ATOM as c_int,
        max_ee_rd_atom: 0,
        max_res_rd_atom: caps::MAX_RD_ATOM as c_int * cap.qps as c_int,
        max_qp_init_rd_atom: caps::MAX_RD_ATOM as c_int,
        max_ee_init_rd_atom: 0,
        atomic_cap: 0,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: crate::ud::MAX_AH,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: cap.qps as c_int,
        max_srq_wr: crate::srq::MAX_SRQ_WR as c_int,
        max_srq_sge: 1,
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        _pad: 0,
    };
    fill(
        &mut a.fw_ver,
        concat!("bluerdma-emu ", env!("CARGO_PKG_VERSION")),
    );
    a
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_device(
    ctx: *mut IbvContext,
    attr: *mut IbvDeviceAttr,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes room for an ibv_device_attr.
    unsafe { attr.write(device_attr(c.dev)) };
    0
}

fn port_attr() -> IbvPortAttr {
    IbvPortAttr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_4096,
        gid_tbl_len: GID_TABLE_LEN as c_int,
        // IBV_PORT_CM_SUP is not claimed (no rdma_cm); nothing else applies to RoCE.
        port_cap_flags: 0,
        max_msg_sz: caps::MAX_MSG,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X at 25 Gb/s (EDR): 100 Gb/s, the card's line rate.
        active_width: 2,
        active_speed: 32,
        // LinkUp.
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
        _pad: 0,
    }
}

/// The IBVERBS_1.1 entry: writes the 48-byte compat structure only.
#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || attr.is_null() {
        return libc::EINVAL;
    }
    if port != 1 {
        return libc::EINVAL;
    }
    let a = port_attr();
    // SAFETY: the caller passes at least the 48-byte compat structure.
    unsafe {
        ptr::copy_nonoverlapping(
            &a as *const IbvPortAttr as *const u8,
            attr as *mut u8,
            COMPAT_PORT_ATTR_LEN,
        )
    };
    0
}

/// `verbs_context.query_port`, which the inline `ibv_query_port` calls with the caller's
/// structure size.
unsafe extern "C" fn ext_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
    len: usize,
) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    let a = port_attr();
    let n = len.min(size_of::<IbvPortAttr>());
    // SAFETY: the caller passes `len` writable bytes.
    unsafe { ptr::copy_nonoverlapping(&a as *const IbvPortAttr as *const u8, attr as *mut u8, n) };
    0
}

/// GID table: indexes 0 and 3 (the one NCCL picks on RoCE v2 / IPv4 hosts) hold the
/// device's IPv4-mapped address; 1 and 2 are empty.
pub(crate) const GID_TABLE_LEN: u32 = 4;

fn gid_at(d: &Device, index: c_int) -> Option<[u8; 16]> {
    matches!(index, 0 | 3).then(|| d.gid())
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_gid(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -1;
    };
    if port != 1 || gid.is_null() || !(0..GID_TABLE_LEN as c_int).contains(&index) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a 16-byte GID.
    unsafe { gid.write(gid_at(c.dev, index).unwrap_or([0; 16])) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_gid_type(
    ctx: *mut IbvContext,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if port != 1 || ty.is_null() || gid_at(c.dev, index as c_int).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes an int.
    unsafe { ty.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
    0
}

fn gid_entry(d: &Device, index: u32) -> Option<IbvGidEntry> {
    Some(IbvGidEntry {
        gid: gid_at(d, index as c_int)?,
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn bv__ibv_query_gid_ex(
    ctx: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if port != 1 || entry.is_null() || flags != 0 || index >= GID_TABLE_LEN {
        return libc::EINVAL;
    }
    let Some(e) = gid_entry(c.dev, index) else {
        return libc::ENODATA;
    };
    let n = entry_size.min(size_of::<IbvGidEntry>());
    // SAFETY: the caller passes `entry_size` writable bytes.
    unsafe { ptr::copy_nonoverlapping(&e as *const IbvGidEntry as *const u8, entry as *mut u8, n) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv__ibv_query_gid_table(
    ctx: *mut IbvContext,
    entries: *mut u8,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || (entries.is_null() && max_entries > 0) {
        return -(libc::EINVAL as isize);
    }
    let n = entry_size.min(size_of::<IbvGidEntry>());
    let mut out = 0usize;
    for index in 0..GID_TABLE_LEN {
        let Some(e) = gid_entry(c.dev, index) else {
            continue;
        };
        if out >= max_entries {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: the caller passes `max_entries` entries of `entry_size` bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                &e as *const IbvGidEntry as *const u8,
                entries.add(out * entry_size),
                n,
            )
        };
        out += 1;
    }
    out as isize
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_pkey(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a u16; the default P_Key, big-endian.
    unsafe { pkey.write(0xFFFFu16.to_be()) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_pkey_index(ctx: *mut IbvContext, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || port != 1 {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey) == 0xFFFF {
        0
    } else {
        -libc::ENOENT
    }
}

/// There is no sysfs for these devices: every read fails with ENOENT, as for a missing
/// attribute.
#[no_mangle]
pub unsafe extern "C" fn bv_ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_async_event(
    ctx: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -1;
    };
    let mut b = [0u8; 8];
    // Blocks (or fails with EAGAIN on a non-blocking fd) like the real call: no
    // asynchronous event is generated by this device yet.
    // SAFETY: reading into a local buffer.
    let n = unsafe { libc::read(c.ibv.async_fd, b.as_mut_ptr() as *mut c_void, 8) };
    if n != 8 || event.is_null() {
        return -1;
    }
    -1
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_ack_async_event(_event: *mut IbvAsyncEvent) {}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_fork_init() -> c_int {
    // Registered memory is the process's own and the emulated card runs in it: a child
    // after fork has its own copy and no card, so there is nothing to protect.
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_is_fork_initialized() -> c_int {
    // IBV_FORK_UNNEEDED.
    2
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

fn cstr(s: &'static std::ffi::CStr) -> *const c_char {
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn bv_ibv_wc_status_str(status: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    NAMES
        .get(status as usize)
        .map_or(cstr(c"unknown"), |s| s.as_ptr())
}

#[no_mangle]
pub extern "C" fn bv_ibv_node_type_str(t: c_int) -> *const c_char {
    match t {
        1 => cstr(c"InfiniBand channel adapter"),
        2 => cstr(c"InfiniBand switch"),
        3 => cstr(c"InfiniBand router"),
        4 => cstr(c"iWARP NIC"),
        5 => cstr(c"usNIC"),
        6 => cstr(c"usNIC UDP"),
        7 => cstr(c"unspecified"),
        _ => cstr(c"unknown"),
    }
}

#[no_mangle]
pub extern "C" fn bv_ibv_port_state_str(s: u32) -> *const c_char {
    match s {
        0 => cstr(c"PORT_NOP"),
        1 => cstr(c"PORT_DOWN"),
        2 => cstr(c"PORT_INIT"),
        3 => cstr(c"PORT_ARMED"),
        4 => cstr(c"PORT_ACTIVE"),
        5 => cstr(c"PORT_ACTIVE_DEFER"),
        _ => cstr(c"invalid state"),
    }
}

#[no_mangle]
pub extern "C" fn bv_ibv_event_type_str(e: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 22] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
        c"unknown",
        c"unknown",
    ];
    NAMES
        .get(e as usize)
        .map_or(cstr(c"unknown"), |s| s.as_ptr())
}

/// `ibv_rate` -> multiple of 2.5 Gb/s, and back (IBTA static rate encoding).
const RATES: [(c_int, c_int, c_int); 18] = [
    // (ibv_rate, mult of 2.5 Gb/s, Mb/s)
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 160, 412500),
];

#[no_mangle]
pub extern "C" fn bv_ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn bv_mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

#[no_mangle]
pub extern "C" fn bv_ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn bv_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
