//! The device table: the devices of this process ([`bluerdma_linux::devices::discover`]:
//! the device list, or the network namespace's own address), as ibv_get_device_list hands
//! them out, and their names and GUIDs. There is no sysfs behind them.

use core::ffi::{c_char, c_int};
use std::ptr;
use std::sync::atomic::AtomicBool;
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
    /// Whether a failure to open the device was printed (the reason and the fix are
    /// printed once; later attempts fail with the same errno quietly).
    pub(crate) open_failure_shown: AtomicBool,
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

/// The device list of this process, read once (`None` if it has an error, which is
/// logged).
pub(crate) fn list() -> Option<&'static DeviceList> {
    static LIST: OnceLock<Option<DeviceList>> = OnceLock::new();
    LIST.get_or_init(|| {
        init_log();
        bluerdma_linux::devices::discover()
            .inspect_err(|e| log::error!("{e}"))
            .ok()
    })
    .as_ref()
}

/// The devices of this process, made once from the device list.
fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let Some(list) = list() else {
            return Vec::new();
        };
        list.entries()
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
                log::debug!(
                    "{name}: {} at {} ({})",
                    entry.name,
                    entry.ip,
                    entry.backend.kind()
                );
                Device {
                    ibv,
                    index,
                    entry: entry.clone(),
                    engine: Mutex::new(std::sync::Weak::new()),
                    open_failure_shown: AtomicBool::new(false),
                }
            })
            .collect()
    })
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
