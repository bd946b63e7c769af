//! The device table: the devices of this process (from the device list, or the network
//! namespace's own address), as ibv_get_device_list hands them out, and their names and
//! GUIDs. There is no sysfs behind them.

use core::ffi::{c_char, c_int};
use std::ptr;
use std::sync::{Mutex, OnceLock};

use bluerdma_linux::devices::{DeviceEntry, DeviceList};
use bluerdma_linux::verbs::Context;

use crate::abi::*;
use crate::errors::set_errno;
use crate::logging::init_log;

/// A device of the list, as handed to applications: `ibv_device` first.
#[repr(C)]
pub(crate) struct Device {
    pub ibv: IbvDevice,
    pub index: usize,
    pub entry: DeviceEntry,
    /// The device's emulated card and engine while any context or object of this process
    /// uses it: every context of one device shares it (a second card could not bind the
    /// device's address).
    pub(crate) engine: Mutex<std::sync::Weak<Context>>,
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

/// Copies `s` and a NUL into `dst`, as much as fits.
pub(crate) fn fill(dst: &mut [c_char], s: &str) {
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

/// The device behind an application's pointer.
///
/// # Safety
/// `dev` must come from [`bv_ibv_get_device_list`].
pub(crate) unsafe fn device<'a>(dev: *mut IbvDevice) -> Option<&'a Device> {
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
