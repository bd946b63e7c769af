//! Test setup shared by the integration tests: system settings changed for one test and
//! restored afterwards (hugepage pool, vm sysctls), and test memory.
#![allow(dead_code)]

pub mod fake_sysfs;

use std::fs;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

/// Serialises tests that change system settings.
static SYSTEM: Mutex<()> = Mutex::new(());

/// Says why a test did nothing, past the test harness's output capture (which would hide
/// it for a passing test).
pub fn skip(msg: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read_u64(path: &str) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The file whose lock serialises such tests across processes: the settings are the
/// machine's, and two test runs at once (`cargo xtask ci --stress`) would undo each
/// other's (one restored `compact_unevictable_allowed` while the other relied on it).
const SYSTEM_LOCK_FILE: &str = "/run/lock/bluerdma-tests-system.lock";

/// System settings for one test, restored on drop. Holding one serialises such tests, in
/// this process (a mutex) and across processes (an flock on [`SYSTEM_LOCK_FILE`]).
pub struct System {
    restore: Vec<(PathBuf, String)>,
    // Field order: the settings are restored in `drop` before either lock is released.
    _file_lock: Option<fs::File>,
    _lock: MutexGuard<'static, ()>,
}

/// Takes the cross-process lock (blocking); `None` if the lock file cannot be opened (the
/// in-process mutex still holds).
fn lock_file() -> Option<fs::File> {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(SYSTEM_LOCK_FILE)
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; it is released when the file is
    // closed.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    (r == 0).then_some(f)
}

impl System {
    /// Takes the settings lock; `None` (with a message) when not root.
    pub fn take(why: &str) -> Option<System> {
        if !is_root() {
            skip(format_args!("SKIPPED: {why} needs root (CI runs as root)"));
            return None;
        }
        let lock = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
        Some(System {
            restore: Vec::new(),
            _file_lock: lock_file(),
            _lock: lock,
        })
    }

    fn set(&mut self, path: &str, value: &str) -> bool {
        let Ok(old) = fs::read_to_string(path) else {
            return false;
        };
        if fs::write(path, value).is_err() {
            return false;
        }
        self.restore
            .push((PathBuf::from(path), old.trim().to_owned()));
        true
    }

    /// Makes at least `pages` 2 MiB hugepages free; `false` (with a message) if the
    /// kernel cannot.
    pub fn reserve_hugepages(&mut self, pages: u64) -> bool {
        let free = read_u64(&format!("{POOL}/free_hugepages"));
        if free >= pages {
            return true;
        }
        let nr = read_u64(&format!("{POOL}/nr_hugepages"));
        let want = nr + (pages - free);
        if !self.set(&format!("{POOL}/nr_hugepages"), &want.to_string()) {
            skip(format_args!("SKIPPED: cannot write {POOL}/nr_hugepages"));
            return false;
        }
        let got = read_u64(&format!("{POOL}/free_hugepages"));
        if got < pages {
            skip(format_args!(
                "SKIPPED: only {got} of {pages} hugepages could be reserved"
            ));
            return false;
        }
        true
    }

    /// `len` bytes of 2 MiB hugepages, reserved (one page more) and mapped; `None` (with a
    /// message) if the kernel cannot reserve them. Another process that maps hugepages
    /// (the second test run of `cargo xtask ci --stress`) can take the free ones between
    /// the reservation and the mapping: it reserves again, up to five times.
    pub fn hugetlb_buf(&mut self, len: usize) -> Option<Buf> {
        let pages = len.div_ceil(2 << 20) as u64 + 1;
        for _ in 0..5 {
            if !self.reserve_hugepages(pages) {
                return None;
            }
            if let Some(b) = Buf::hugetlb(len) {
                return Some(b);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("{len} bytes of hugepages: mapping failed after reserving them five times");
    }

    /// Sets `/proc/sys/vm/<name>` for the test.
    pub fn vm_sysctl(&mut self, name: &str, value: &str) -> bool {
        self.set(&format!("/proc/sys/vm/{name}"), value)
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for (path, old) in self.restore.drain(..).rev() {
            let _ = fs::write(&path, &old);
        }
    }
}

/// Test memory from mmap, unmapped on drop.
pub struct Buf {
    pub ptr: NonNull<u8>,
    pub len: usize,
}

// SAFETY: owned memory.
unsafe impl Send for Buf {}

impl Buf {
    fn map(len: usize, extra: i32) -> Option<Buf> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Buf {
            ptr: NonNull::new(p.cast())?,
            len,
        })
    }

    /// 2 MiB hugetlb pages, touched.
    pub fn hugetlb(len: usize) -> Option<Buf> {
        let b = Self::map(len, libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT))?;
        b.touch();
        Some(b)
    }

    /// Ordinary 4 KiB pages (no transparent hugepages), touched.
    pub fn ordinary(len: usize) -> Buf {
        let b = Self::map(len, 0).expect("mmap");
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(b.ptr.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE) };
        b.touch();
        b
    }

    /// Ordinary pages, never touched (no frames yet).
    pub fn ordinary_untouched(len: usize) -> Buf {
        Self::map(len, 0).expect("mmap")
    }

    fn touch(&self) {
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside the mapping.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(off as u8 | 1) };
        }
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Locked memory of this process in KiB (`VmLck` in /proc/self/status).
pub fn locked_kib() -> u64 {
    fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
