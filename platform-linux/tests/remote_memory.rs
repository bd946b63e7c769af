//! The card reaches memory of another process (a daemon's client): a forked child fills a
//! heap buffer with a known pattern and serves its parent's requests over pipes (check
//! bytes, send bytes back, take bytes, unmap pages, exit), while the parent maps the
//! child's buffer for the card ([`RemoteMappings`], the backends' [`RemoteMemory`]) and
//! accesses it as the card does.
//!
//! The parent's own copy of the buffer (fork keeps the virtual address) holds another
//! pattern, so a card that reached this process instead of the child would be seen.

#![cfg(all(feature = "emulator", feature = "rtl"))]

use std::alloc::{alloc, dealloc, Layout};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::desc::cmd::{CmdOpcode, CmdRequest, CmdResponse, SetNetworkParam};
use bluerdma_core::desc::{MacAddr, RawDesc, DESC_SIZE};
use bluerdma_core::platform::{PlatformError, RegisterAccess};
use bluerdma_core::regs::{RingId, RingReg};
use bluerdma_linux::backend::emulated::{self, CardMode};
use bluerdma_linux::backend::{rtl, Backend, RemoteMemory, RtlConfig};
use bluerdma_linux::DeviceSpec;
use bluerdma_sim::mem::{AddressMap, DmaFault, DmaPort, RemoteMappings, IOVA_BASE, IOVA_END};
use bluerdma_sim::model::NicConfig;
use bluerdma_sim::serve::{LoopbackLink, ServePorts, ServedCard};

/// The child's buffer: 4 MiB, 2 MiB-aligned (so 2 MiB page offsets can be chosen).
const LEN: usize = 4 << 20;
const ALIGN: usize = 2 << 20;
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// The child's byte at offset `i`.
fn pattern(i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// What the parent writes at offset `i`, and the child checks.
fn written(i: usize) -> u8 {
    !pattern(i)
}

/// A heap buffer the child inherits; the parent's copy holds 0xEE throughout.
struct Buffer(*mut u8);

impl Buffer {
    fn new() -> Self {
        let layout = Layout::from_size_align(LEN, ALIGN).unwrap();
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: `p` is valid for `LEN` bytes.
        unsafe { p.write_bytes(0xEE, LEN) };
        Buffer(p)
    }
    fn va(&self) -> u64 {
        self.0 as u64
    }
    /// The parent's own bytes.
    fn parent_bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= LEN);
        // SAFETY: inside the live buffer; nothing else writes this process's copy.
        unsafe { std::slice::from_raw_parts(self.0.add(off), len) }.to_vec()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.0, Layout::from_size_align(LEN, ALIGN).unwrap()) }
    }
}

/// A forked child serving its buffer.
struct Child {
    pid: i32,
    /// Requests to the child.
    to: i32,
    /// Replies from the child.
    from: i32,
    reaped: bool,
}

fn pipe() -> [i32; 2] {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    fds
}

/// Reads exactly `len` bytes at `p`; whether it did. Async-signal-safe (used in the child).
///
/// # Safety
/// `p` must be valid for writes of `len` bytes.
unsafe fn read_exact(fd: i32, p: *mut u8, len: usize) -> bool {
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's promise; `done < len`.
        let n = unsafe { libc::read(fd, p.add(done).cast(), len - done) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// Writes `len` bytes at `p`; whether it did. Async-signal-safe (used in the child).
///
/// # Safety
/// `p` must be valid for reads of `len` bytes.
unsafe fn write_all(fd: i32, p: *const u8, len: usize) -> bool {
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's promise; `done < len`.
        let n = unsafe { libc::write(fd, p.add(done).cast(), len - done) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// The child: fills its buffer, announces its address and serves requests of 17 bytes
/// (op, offset, length), each answered with a status byte (1: done). Only system calls
/// and plain memory accesses: the parent's other threads may hold locks (malloc's) that
/// the child must never wait for.
///
/// # Safety
/// Only in the child of a fork; `buf` valid for `LEN` bytes.
unsafe fn serve_child(buf: *mut u8, from: i32, to: i32) -> ! {
    // Nothing of the parent's (sockets, other tests' pipes) stays open in the child.
    for fd in 3..4096 {
        if fd != from && fd != to {
            // SAFETY: closing descriptors of this (forked) process only.
            unsafe { libc::close(fd) };
        }
    }
    for i in 0..LEN {
        // SAFETY: inside the buffer.
        unsafe { *buf.add(i) = pattern(i) };
    }
    let va = (buf as u64).to_le_bytes();
    // SAFETY: `va` is 8 bytes; `_exit` ends the child without the parent's destructors.
    unsafe {
        if !write_all(to, va.as_ptr(), 8) {
            libc::_exit(2);
        }
    }
    loop {
        let mut msg = [0u8; 17];
        // SAFETY: `msg` is 17 bytes.
        if !unsafe { read_exact(from, msg.as_mut_ptr(), 17) } {
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(1) };
        }
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        a.copy_from_slice(&msg[1..9]);
        b.copy_from_slice(&msg[9..17]);
        let (off, len) = (
            u64::from_le_bytes(a) as usize,
            u64::from_le_bytes(b) as usize,
        );
        let mut status = [1u8];
        let inside = off.checked_add(len).is_some_and(|end| end <= LEN);
        match msg[0] {
            b'Q' => {
                // SAFETY: as above.
                unsafe { libc::_exit(0) }
            }
            _ if !inside => status[0] = 0,
            b'C' => {
                for i in off..off + len {
                    // SAFETY: inside the buffer (checked).
                    if unsafe { *buf.add(i) } != written(i) {
                        status[0] = 0;
                    }
                }
            }
            b'S' => {
                // SAFETY: the status byte, then the bytes asked for (inside the buffer).
                unsafe {
                    if !write_all(to, status.as_ptr(), 1) || !write_all(to, buf.add(off), len) {
                        libc::_exit(3);
                    }
                }
                continue;
            }
            b'P' => {
                // SAFETY: inside the buffer (checked).
                if !unsafe { read_exact(from, buf.add(off), len) } {
                    // SAFETY: as above.
                    unsafe { libc::_exit(4) };
                }
            }
            b'U' => {
                // SAFETY: unmaps pages of this child's copy of the buffer, which it never
                // touches again (the parent asks for no access there afterwards).
                status[0] = (unsafe { libc::munmap(buf.add(off).cast(), len) } == 0) as u8;
            }
            _ => status[0] = 0,
        }
        // SAFETY: one byte.
        if !unsafe { write_all(to, status.as_ptr(), 1) } {
            // SAFETY: as above.
            unsafe { libc::_exit(5) };
        }
    }
}

impl Child {
    /// Forks a child that serves `buf` (its own copy of it).
    fn spawn(buf: &Buffer) -> Child {
        let (requests, replies) = (pipe(), pipe());
        // SAFETY: the child runs only `serve_child` (system calls and plain memory
        // accesses) and ends with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: in the child; the buffer is inherited.
            unsafe { serve_child(buf.0, requests[0], replies[1]) };
        }
        // SAFETY: the child's ends, not used by the parent.
        unsafe {
            libc::close(requests[0]);
            libc::close(replies[1]);
        }
        let mut child = Child {
            pid,
            to: requests[1],
            from: replies[0],
            reaped: false,
        };
        let va = u64::from_le_bytes(child.recv(8).try_into().unwrap());
        assert_eq!(va, buf.va(), "fork keeps the address");
        child
    }

    /// `n` bytes from the child, waiting at most [`REPLY_WAIT`].
    fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        let mut done = 0;
        while done < n {
            let mut pfd = libc::pollfd {
                fd: self.from,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            let ready = unsafe { libc::poll(&mut pfd, 1, REPLY_WAIT.as_millis() as i32) };
            assert_eq!(ready, 1, "the child did not answer");
            // SAFETY: `out[done..]` is writable.
            let r = unsafe { libc::read(self.from, out[done..].as_mut_ptr().cast(), n - done) };
            assert!(r > 0, "the child went away");
            done += r as usize;
        }
        out
    }

    fn send(&mut self, op: u8, off: usize, len: usize, data: &[u8]) {
        let mut msg = vec![op];
        msg.extend_from_slice(&(off as u64).to_le_bytes());
        msg.extend_from_slice(&(len as u64).to_le_bytes());
        msg.extend_from_slice(data);
        // SAFETY: `msg` is valid for its length.
        assert!(unsafe { write_all(self.to, msg.as_ptr(), msg.len()) });
    }

    fn status(&mut self) -> bool {
        self.recv(1)[0] == 1
    }

    /// Whether the child's bytes at `off..off + len` are [`written`].
    fn holds_written(&mut self, off: usize, len: usize) -> bool {
        self.send(b'C', off, len, &[]);
        self.status()
    }

    /// The child's bytes at `off..off + len`.
    fn bytes(&mut self, off: usize, len: usize) -> Vec<u8> {
        self.send(b'S', off, len, &[]);
        assert!(self.status());
        self.recv(len)
    }

    /// Stores `data` at `off` in the child.
    fn put(&mut self, off: usize, data: &[u8]) {
        self.send(b'P', off, data.len(), data);
        assert!(self.status());
    }

    /// Unmaps the child's pages at `off..off + len` (page-aligned).
    fn unmap_pages(&mut self, off: usize, len: usize) {
        self.send(b'U', off, len, &[]);
        assert!(self.status(), "munmap in the child");
    }

    /// Ends the child and reaps it.
    fn exit(mut self) {
        self.send(b'Q', 0, 0, &[]);
        self.reap();
    }

    fn reap(&mut self) {
        let mut status = 0;
        // SAFETY: our own child.
        let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        assert_eq!(r, self.pid);
        self.reaped = true;
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: our own child, not yet reaped, so the pid is still its.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let mut status = 0;
            // SAFETY: as above.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
        }
        // SAFETY: our ends of the pipes.
        unsafe {
            libc::close(self.to);
            libc::close(self.from);
        }
    }
}

fn expected(off: usize, len: usize) -> Vec<u8> {
    (off..off + len).map(pattern).collect()
}

fn fault(addr: u64, len: usize, is_write: bool) -> Result<(), DmaFault> {
    Err(DmaFault {
        addr: DeviceAddr(addr),
        len,
        is_write,
    })
}

#[test]
fn the_card_reads_and_writes_a_child_process_through_the_map() {
    let buf = Buffer::new();
    let mut child = Child::spawn(&buf);
    let map = AddressMap::new();
    let remote = RemoteMappings::new(map.clone());
    let base = 0x1_0000;
    let len = 256 << 10;
    let dev = remote
        .map(child.pid, buf.va() + base as u64, len, PageSize::Size4K)
        .unwrap();
    assert!(dev.0 >= IOVA_BASE && dev.0 + len as u64 <= IOVA_END);
    assert_eq!(
        map.lookup_remote(dev, len).map(|r| (r.pid, r.va, r.len)),
        Some((child.pid, buf.va() + base as u64, len))
    );

    // The card's bus-master port is the map itself.
    let mut port: Box<dyn DmaPort> = Box::new(map.clone());
    for (off, n) in [(0, 32), (4093, 7), (100_000, 4096), (len - 1, 1), (0, len)] {
        let mut got = vec![0u8; n];
        port.read(DeviceAddr(dev.0 + off as u64), &mut got).unwrap();
        assert!(got == expected(base + off, n), "read of {n} at {off}");
    }
    assert_eq!(buf.parent_bytes(base, 4), [0xEE; 4], "the parent's copy");

    let (off, n) = (5000, 70_000);
    let data: Vec<u8> = (base + off..base + off + n).map(written).collect();
    port.write(DeviceAddr(dev.0 + off as u64), &data).unwrap();
    assert!(
        child.holds_written(base + off, n),
        "the child sees the card's write"
    );
    assert!(!child.holds_written(base + off - 1, n + 2), "and only it");
    assert_eq!(buf.parent_bytes(base + off, 4), [0xEE; 4]);
    // Zero bytes inside the mapping: nothing to move, not a fault.
    assert_eq!(port.read(dev, &mut []), Ok(()));

    // A local region in the same map works beside the remote one.
    let mut local = vec![0u8; 64];
    // SAFETY: `local` outlives its use through the map; removed below.
    unsafe { map.insert(DeviceAddr(0x4000_0000_1000), local.as_mut_ptr(), 64) };
    port.write(DeviceAddr(0x4000_0000_1010), &[9; 4]).unwrap();
    map.remove(DeviceAddr(0x4000_0000_1000));
    assert_eq!(local[0x10..0x14], [9; 4]);
    assert!(format!("{map:?}").contains("1 remote"), "{map:?}");
    child.exit();
}

#[test]
fn accesses_past_a_mapping_after_unmap_or_after_the_process_exits_fault() {
    let buf = Buffer::new();
    let mut child = Child::spawn(&buf);
    let map = AddressMap::new();
    let remote = RemoteMappings::new(map.clone());
    let mut card_port = map.clone();
    let port: &mut dyn DmaPort = &mut card_port;
    let len = 8192;
    let a = remote
        .map(child.pid, buf.va(), len, PageSize::Size4K)
        .unwrap();
    // Past the end, straddling it, and in the guard page after it: even though the child's
    // buffer goes on there and a second mapping follows.
    let b = remote
        .map(child.pid, buf.va() + len as u64, len, PageSize::Size4K)
        .unwrap();
    let end = a.0 + len as u64;
    let mut two = [0u8; 2];
    assert_eq!(
        port.read(DeviceAddr(end - 1), &mut two),
        fault(end - 1, 2, false)
    );
    assert_eq!(port.write(DeviceAddr(end), &two), fault(end, 2, true));
    assert_eq!(
        port.read(DeviceAddr(a.0 - 1), &mut two),
        fault(a.0 - 1, 2, false)
    );
    assert!(b.0 >= end + 4096, "a guard page between mappings");
    port.read(b, &mut two).unwrap();
    assert_eq!(two[..], expected(len, 2)[..]);

    // After unmap, the same address faults; unknown addresses are ignored.
    assert!(remote.unmap(a));
    assert!(!remote.unmap(a));
    assert!(!remote.unmap(DeviceAddr(12345)));
    assert_eq!(port.read(a, &mut two), fault(a.0, 2, false));
    assert!(map.lookup_remote(a, 1).is_none());

    // Memory the child unmapped while it is still mapped for the card: the kernel's EFAULT
    // is a fault of the access, for reads and writes.
    child.unmap_pages(len, 4096);
    assert_eq!(port.read(b, &mut two), fault(b.0, 2, false));
    assert_eq!(port.write(b, &two), fault(b.0, 2, true));
    let second_page = DeviceAddr(b.0 + 4096);
    port.read(second_page, &mut two).unwrap();
    assert_eq!(two[..], expected(len + 4096, 2)[..], "the rest still reads");
    // A read that runs from a gone page into a live one moves nothing useful: a fault.
    assert!(port.read(DeviceAddr(b.0 + 4000), &mut [0u8; 200]).is_err());

    // Registering what the child does not have mapped, or a process that does not exist.
    let unmapped = buf.va() + len as u64;
    assert_eq!(
        remote.map(child.pid, unmapped, 100, PageSize::Size4K),
        Err(PlatformError::NotMapped {
            va: VirtAddr(unmapped)
        })
    );
    let gone = remote
        .map(child.pid, buf.va() + 0x10_0000, 4096, PageSize::Size4K)
        .unwrap();
    let pid = child.pid;
    child.exit();
    assert_eq!(
        remote.map(pid, buf.va(), 4096, PageSize::Size4K),
        Err(PlatformError::Os(libc::ESRCH))
    );
    assert_eq!(
        remote.map(0, buf.va(), 4096, PageSize::Size4K),
        Err(PlatformError::Os(libc::EINVAL))
    );
    // The child has exited and been reaped: its regions fault, whoever gets its pid.
    assert_eq!(port.read(gone, &mut two), fault(gone.0, 2, false));
    assert_eq!(port.write(gone, &two), fault(gone.0, 2, true));
    assert!(remote.unmap(gone));
    drop(remote);
    assert!(
        map.lookup_remote(second_page, 1).is_none(),
        "dropping unmaps"
    );
}

#[test]
fn device_addresses_keep_the_offset_within_4k_64k_and_2m_pages() {
    let buf = Buffer::new();
    let child = Child::spawn(&buf);
    let map = AddressMap::new();
    let remote = RemoteMappings::new(map.clone());
    for page in [PageSize::Size4K, PageSize::Size64K, PageSize::Size2M] {
        let size = page.bytes() as usize;
        for off in [0, 1, 0xFFF, 0x1234, 0xA_BCDE, 0x1F_FFFF, 0x20_0010] {
            let va = buf.va() + off as u64;
            let len = (LEN - off).min(3 * size);
            let dev = remote.map(child.pid, va, len, page).unwrap();
            assert_eq!(
                dev.0 % page.bytes(),
                va % page.bytes(),
                "{page:?} at {off:#x}"
            );
            assert!(dev.0 >= IOVA_BASE && dev.0 + len as u64 <= IOVA_END);
            // The card's page walk: page k of the mapping starts at the device page base
            // plus k pages, and holds the child's page k.
            for k in 0..page.pages_spanned(va, len as u64) {
                let byte = page.base_of(dev.0) + k * page.bytes();
                let child_off = (page.base_of(va) + k * page.bytes() - buf.va()) as usize;
                let at = byte.max(dev.0);
                let child_at = child_off.max(off);
                if child_at >= off + len {
                    continue;
                }
                let mut got = [0u8; 1];
                map.read(DeviceAddr(at), &mut got).unwrap();
                assert_eq!(got[0], pattern(child_at), "{page:?} {off:#x} page {k}");
            }
            assert!(remote.unmap(dev));
            // Freed ranges are reused: the same request gets the same address.
            assert_eq!(remote.map(child.pid, va, len, page), Ok(dev));
            assert!(remote.unmap(dev));
        }
    }
    child.exit();
}

/// Opens the backend `which` names; the served card behind an RTL backend comes along.
fn open(which: &str) -> (Backend, Option<ServedCard>) {
    let spec = DeviceSpec::new("blue0", Ipv4Addr::new(127, 0, 9, 1));
    let link = || Box::new(LoopbackLink::new());
    match which {
        "inline" => (
            emulated::open_as(&spec, link(), CardMode::Inline).unwrap(),
            None,
        ),
        "threaded" => (
            emulated::open_as(&spec, link(), CardMode::Threaded).unwrap(),
            None,
        ),
        _ => {
            let card = ServedCard::start(NicConfig::default(), ServePorts::ANY, link()).unwrap();
            let cfg = RtlConfig {
                csr_port: card.ports().csr,
                dma_port: card.ports().dma,
                connect_timeout: Some(Duration::from_secs(10)),
                ..RtlConfig::default()
            };
            (rtl::open("blue0", &cfg).unwrap(), Some(card))
        }
    }
}

/// The command ring and the response ring of the card live in the child: the card fetches
/// a command the child holds and writes its response into the child, on every backend
/// that has remote memory.
#[test]
fn every_emulated_backend_takes_commands_from_a_child_and_answers_into_it() {
    const CMD: usize = 0;
    const RESP: usize = 64 << 10;
    for which in ["inline", "threaded", "rtl"] {
        let (backend, _card) = open(which);
        let remote: Arc<dyn RemoteMemory> = backend.handle.remote_memory().expect(which);
        let buf = Buffer::new();
        let mut child = Child::spawn(&buf);
        let pid = child.pid;
        let map = |off: usize| {
            remote
                .map(pid, buf.va() + off as u64, 4096, PageSize::Size4K)
                .unwrap()
        };
        let (cmd, resp) = (map(CMD), map(RESP));
        let request = CmdRequest::SetNetworkParam(SetNetworkParam {
            mac: MacAddr([2, 0, 127, 0, 9, 1]),
            ip: Ipv4Addr::new(127, 0, 9, 1),
            netmask: Ipv4Addr::new(255, 0, 0, 0),
            gateway: Ipv4Addr::UNSPECIFIED,
        })
        .encode(0x5C);
        child.put(CMD, &request.0);
        child.put(RESP, &[0; DESC_SIZE]);

        let regs = &backend.regs;
        let reg = |ring: RingId, r: RingReg| ring.reg(r, 1).unwrap();
        for (ring, dev) in [(RingId::CmdRequest, cmd), (RingId::CmdResponse, resp)] {
            regs.write32(reg(ring, RingReg::BaseLo), dev.0 as u32);
            regs.write32(reg(ring, RingReg::BaseHi), (dev.0 >> 32) as u32);
        }
        regs.write32(reg(RingId::CmdRequest, RingReg::Head), 1);

        let started = Instant::now();
        let answer = loop {
            let mut d = RawDesc([0; DESC_SIZE]);
            d.0.copy_from_slice(&child.bytes(RESP, DESC_SIZE));
            if d.valid() {
                break d;
            }
            assert!(
                started.elapsed() < REPLY_WAIT,
                "{which}: no response in the child; {}",
                backend.handle.card_stats()
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let answer = CmdResponse::decode(&answer).unwrap();
        assert_eq!(
            (answer.op, answer.user_data, answer.is_success),
            (CmdOpcode::SetNetworkParam, 0x5C, true),
            "{which}"
        );
        assert_eq!(
            regs.read32(reg(RingId::CmdRequest, RingReg::Tail)),
            1,
            "{which}: fetched"
        );
        assert_eq!(
            buf.parent_bytes(RESP, 4),
            [0xEE; 4],
            "{which}: not in the parent"
        );

        // Every call gives the same mappings: what one maps, another unmaps, and the
        // address is given out again.
        let again = backend.handle.remote_memory().unwrap();
        again.unmap(resp);
        again.unmap(resp);
        assert_eq!(map(RESP), resp, "{which}");
        remote.unmap(resp);
        remote.unmap(cmd);
        child.exit();
    }
}
