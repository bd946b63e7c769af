//! The RTL simulator's socket protocol end to end on loopback: both sides of the CSR and DMA
//! channels against each other and against hand-written peers that check the exact bytes,
//! and the Ethernet links (`shared/spec/rtl-sim-protocol.md`, `nic-behaviour.md` section 8).
//!
//! Every test uses its own port in 27700..27799 (below Linux's ephemeral range, far from the
//! simulator's 7xxx/8100), so tests never collide with each other or a real simulator.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Reg, RingId, RingReg, UndecodedAccess, DECODED_CHANNELS};
use bluerdma_sim::link::LinkPort;
use bluerdma_sim::mem::{AddressMap, DmaPort};
use bluerdma_sim::rtl::csr::{DEAD_DEVICE_READ, UNDECODED_READ};
use bluerdma_sim::rtl::dma::{beats, DmaLinkError};
use bluerdma_sim::rtl::eth::TWO_CARD_RETRY;
use bluerdma_sim::rtl::soft_switch::node_ip;
use bluerdma_sim::rtl::{
    BusWidth, CsrClient, CsrClientConfig, CsrError, CsrServer, CsrTarget, DmaChannel, DmaClient,
    DmaClientConfig, DmaServer, DmaServerConfig, RetryPolicy, SoftSwitch, SoftSwitchConfig,
    SoftSwitchLink, TwoCardLink,
};
use serde_json::Value;

const QUICK_RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(20),
    max_interval: Duration::from_millis(100),
    give_up_after: Duration::from_secs(10),
};

/// Polls `cond` for up to 5 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn raw_connect(port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    line
}

// ---------------------------------------------------------------------------------------
// CSR
// ---------------------------------------------------------------------------------------

/// A card with a register file: decoded offsets (one channel) hold what was written.
#[derive(Default)]
struct RegisterFile {
    regs: Mutex<HashMap<u32, u32>>,
}

impl CsrTarget for RegisterFile {
    fn csr_read(&self, offset: u32) -> Result<u32, UndecodedAccess> {
        Reg::decode(offset, DECODED_CHANNELS).ok_or(UndecodedAccess {
            offset,
            is_write: false,
        })?;
        Ok(*self.regs.lock().unwrap().get(&offset).unwrap_or(&0))
    }

    fn csr_write(&self, offset: u32, value: u32) -> Result<(), UndecodedAccess> {
        Reg::decode(offset, DECODED_CHANNELS).ok_or(UndecodedAccess {
            offset,
            is_write: true,
        })?;
        self.regs.lock().unwrap().insert(offset, value);
        Ok(())
    }
}

fn ring_reg(ring: RingId, reg: RingReg) -> Reg {
    ring.reg(reg, DECODED_CHANNELS).unwrap()
}

fn csr_client(port: u16) -> CsrClient {
    CsrClient::connect(&CsrClientConfig {
        port,
        retry: QUICK_RETRY,
        reply_timeout: Duration::from_secs(5),
    })
    .unwrap()
}

#[test]
fn csr_writes_then_reads_round_trip() {
    let target = Arc::new(RegisterFile::default());
    let server = CsrServer::bind(27711, target.clone()).unwrap();
    let client = csr_client(27711);
    let regs = [
        (ring_reg(RingId::CmdRequest, RingReg::BaseLo), 0x1234_5000),
        (ring_reg(RingId::CmdRequest, RingReg::BaseHi), 0x0000_00AB),
        (ring_reg(RingId::Send(0), RingReg::Head), 7),
        (ring_reg(RingId::SimpleNicRx, RingReg::Tail), u32::MAX),
    ];
    for (reg, value) in regs {
        client.write32(reg, value);
    }
    for (reg, value) in regs {
        assert_eq!(client.read32(reg), value, "register {:#x}", reg.offset());
    }
    assert_eq!(target.regs.lock().unwrap().get(&0x100), Some(&0x1234_5000));
    let head = ring_reg(RingId::CmdRequest, RingReg::Head);
    client
        .write32_confirmed(head, 3, Duration::from_secs(1))
        .unwrap();
    let stats = server.stats();
    assert_eq!((stats.writes, stats.reads), (5, 5));
    assert_eq!(stats.malformed_lines + stats.undecoded_accesses, 0);
    assert!(client.error().is_none());
}

#[test]
fn csr_read_reply_is_the_benchs_exact_line_and_undecoded_reads_get_aaaaaaaa() {
    let target = Arc::new(RegisterFile::default());
    target.regs.lock().unwrap().insert(0x104, 0xDEAD_BEEF);
    let server = CsrServer::bind(27712, target).unwrap();
    let (mut s, mut r) = raw_connect(27712);

    s.write_all(b"{\"is_write\": false, \"addr\": 260, \"value\": 0}\n")
        .unwrap();
    assert_eq!(
        read_line(&mut r),
        "{\"is_write\": false, \"addr\": 260, \"value\": 3735928559}\n"
    );
    // Compact JSON without a value is a valid read too.
    s.write_all(b"{\"is_write\":false,\"addr\":512}\n").unwrap();
    assert_eq!(
        read_line(&mut r),
        format!("{{\"is_write\": false, \"addr\": 512, \"value\": {UNDECODED_READ}}}\n")
    );
    assert_eq!(UNDECODED_READ, 0xAAAA_AAAA);
    // An undecoded write is counted and gets no reply; the next read is answered normally.
    s.write_all(b"{\"is_write\": true, \"addr\": 514, \"value\": 1}\n")
        .unwrap();
    s.write_all(b"{\"is_write\": false, \"addr\": 260, \"value\": 0}\n")
        .unwrap();
    assert!(read_line(&mut r).contains("\"value\": 3735928559"));
    let stats = server.stats();
    assert_eq!(stats.undecoded_accesses, 2);
    assert_eq!((stats.reads, stats.writes), (3, 1));
}

#[test]
fn csr_garbage_lines_are_counted_and_the_server_keeps_serving() {
    let server = CsrServer::bind(27713, Arc::new(RegisterFile::default())).unwrap();
    let (mut s, mut r) = raw_connect(27713);
    s.write_all(b"not json at all\n").unwrap();
    s.write_all(b"{\"is_write\": true}\n").unwrap();
    s.write_all(b"{\"is_write\": true, \"addr\": 4}\n").unwrap();
    s.write_all(b"{\"is_write\": false, \"addr\": -4}\n")
        .unwrap();
    s.write_all(&vec![b'x'; 100_000]).unwrap();
    s.write_all(b"\n\n   \n").unwrap();
    s.write_all(b"{\"is_write\": true, \"addr\": 8, \"value\": 99}\n")
        .unwrap();
    s.write_all(b"{\"is_write\": false, \"addr\": 8, \"value\": 0}\n")
        .unwrap();
    assert_eq!(
        read_line(&mut r),
        "{\"is_write\": false, \"addr\": 8, \"value\": 99}\n"
    );
    assert_eq!(server.stats().malformed_lines, 5);
}

#[test]
fn csr_second_client_is_refused_while_the_first_lives() {
    let server = CsrServer::bind(27714, Arc::new(RegisterFile::default())).unwrap();
    let first = csr_client(27714);
    let reg = ring_reg(RingId::CmdResponse, RingReg::Tail);
    first.write32(reg, 5);
    assert_eq!(first.read32(reg), 5);

    let (mut second, _) = raw_connect(27714);
    let mut buf = [0u8; 16];
    // Closed at once: end of stream (or a reset), never a reply.
    let n = second.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    eventually("the refusal to be counted", || {
        server.stats().clients_refused == 1
    });
    assert_eq!(first.read32(reg), 5, "the first client is unaffected");

    drop(first);
    eventually("the first client to be gone", || {
        !server.stats().client_connected
    });
    let third = csr_client(27714);
    assert_eq!(third.read32(reg), 5);
    assert_eq!(server.stats().clients_accepted, 2);
}

#[test]
fn csr_client_started_before_the_server_still_connects() {
    let client = thread::spawn(|| csr_client(27715));
    thread::sleep(Duration::from_millis(300));
    let target = Arc::new(RegisterFile::default());
    target.regs.lock().unwrap().insert(0x10C, 42);
    let _server = CsrServer::bind(27715, target).unwrap();
    let client = client.join().unwrap();
    assert_eq!(
        client.read32(ring_reg(RingId::CmdRequest, RingReg::Tail)),
        42
    );
}

#[test]
fn csr_client_gives_up_after_the_configured_time() {
    let started = Instant::now();
    let err = CsrClient::connect(&CsrClientConfig {
        port: 27716,
        retry: QUICK_RETRY.giving_up_after(Duration::from_millis(300)),
        reply_timeout: Duration::from_secs(1),
    })
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.to_string().contains("127.0.0.1:27716"), "{err}");
}

#[test]
fn csr_broken_connection_reads_as_a_dead_device_with_a_sticky_error() {
    let server = CsrServer::bind(27717, Arc::new(RegisterFile::default())).unwrap();
    let client = csr_client(27717);
    let reg = ring_reg(RingId::Send(0), RingReg::BaseLo);
    client.write32(reg, 1);
    assert_eq!(client.read32(reg), 1);
    server.shutdown();
    assert_eq!(client.read32(reg), DEAD_DEVICE_READ);
    let err = client.error().expect("a sticky error");
    assert!(err.breaks_connection());
    assert_eq!(client.read32(reg), DEAD_DEVICE_READ);
    assert_eq!(client.try_read32(reg), Err(err));
}

#[test]
fn csr_read_without_reply_times_out_instead_of_hanging() {
    let listener = TcpListener::bind(("127.0.0.1", 27718)).unwrap();
    let silent = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    let client = CsrClient::connect(&CsrClientConfig {
        port: 27718,
        retry: QUICK_RETRY,
        reply_timeout: Duration::from_millis(200),
    })
    .unwrap();
    let reg = ring_reg(RingId::Send(0), RingReg::Tail);
    assert_eq!(client.read32(reg), DEAD_DEVICE_READ);
    assert!(matches!(
        client.error(),
        Some(CsrError::ReplyTimeout { offset: 0x00C, .. })
    ));
    silent.join().unwrap();
}

// ---------------------------------------------------------------------------------------
// DMA
// ---------------------------------------------------------------------------------------

const DMA_BASE: u64 = 0x10_0000;
const DMA_LEN: usize = 3 * 4096;

/// Host memory for the driver: a leaked buffer (so it outlives the client thread) reached
/// only through raw pointers, since the client writes it from another thread.
#[derive(Clone, Copy)]
struct HostMemory {
    ptr: *mut u8,
}

impl HostMemory {
    /// A copy of the whole buffer. Call only while no DMA is in flight.
    fn snapshot(self) -> Vec<u8> {
        let mut out = vec![0u8; DMA_LEN];
        // SAFETY: `ptr` is a leaked DMA_LEN-byte buffer; no DMA is in flight.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), DMA_LEN) };
        out
    }

    /// Copies `bytes` to offset `at`. Call only while no DMA is in flight.
    fn set(self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= DMA_LEN);
        // SAFETY: in bounds of the leaked buffer (checked above); no DMA is in flight.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
    }
}

fn host_memory() -> (AddressMap, HostMemory) {
    let backing: &'static mut [u8] = Box::leak(vec![0u8; DMA_LEN].into_boxed_slice());
    let ptr = backing.as_mut_ptr();
    let map = AddressMap::new();
    // SAFETY: the buffer is leaked, so it stays valid for the rest of the process.
    unsafe { map.insert(DeviceAddr(DMA_BASE), ptr, DMA_LEN) };
    (map, HostMemory { ptr })
}

fn dma_server(port: u16) -> DmaServer {
    DmaServer::bind(DmaServerConfig {
        port,
        bus: BusWidth::Bits256,
        reply_timeout: Duration::from_secs(5),
        driver_wait: Duration::from_secs(5),
    })
    .unwrap()
}

fn dma_client(port: u16, map: AddressMap) -> DmaClient {
    DmaClient::connect(
        &DmaClientConfig {
            port,
            retry: QUICK_RETRY,
        },
        map,
    )
    .unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

#[test]
fn dma_server_sends_the_benchs_per_beat_messages() {
    let server = dma_server(27721);
    let (mut s, mut r) = raw_connect(27721);
    assert!(server.wait_for_driver(Duration::from_secs(5)));

    // A fake driver: answers each read beat with bytes (address + i) and records messages.
    let driver = thread::spawn(move || {
        let mut seen = Vec::new();
        loop {
            let line = read_line(&mut r);
            if line.is_empty() {
                return seen;
            }
            let msg: Value = serde_json::from_str(&line).unwrap();
            if msg["type"] == "mem_read" {
                let addr = msg["address"].as_u64().unwrap();
                let len = msg["length"].as_u64().unwrap();
                let data: Vec<u8> = (0..len).map(|i| (addr + i) as u8).collect();
                let reply = serde_json::json!({
                    "type": "mem_read_response",
                    "channel_id": msg["channel_id"],
                    "request_id": msg["request_id"],
                    "data": data,
                });
                s.write_all(format!("{reply}\n").as_bytes()).unwrap();
            }
            seen.push(msg);
        }
    });

    let ch1 = DmaChannel::new(1).unwrap();
    let mut buf = vec![0u8; 100];
    server.read_on(ch1, DeviceAddr(0x1001), &mut buf).unwrap();
    let expected: Vec<u8> = (0..100u64).map(|i| (0x1001 + i) as u8).collect();
    assert_eq!(buf, expected);
    let data: Vec<u8> = (0..33).collect();
    server
        .write_on(DmaChannel::new(2).unwrap(), DeviceAddr(0x2003), &data)
        .unwrap();
    let mut one = [0u8; 1];
    server.read_on(ch1, DeviceAddr(0x3003), &mut one).unwrap();
    assert_eq!(one, [0x03]);
    let stats = server.stats();
    assert_eq!(
        (stats.read_beats, stats.write_beats, stats.errors),
        (5, 2, 0)
    );
    server.shutdown();

    let seen = driver.join().unwrap();
    let read_keys = [
        "address",
        "channel_id",
        "is_first",
        "is_last",
        "length",
        "request_id",
        "start_byte_index",
        "type",
    ];
    let reads: Vec<_> = seen.iter().filter(|m| m["type"] == "mem_read").collect();
    let got: Vec<_> = reads
        .iter()
        .map(|m| {
            assert_eq!(keys(m), read_keys);
            assert_eq!(m["channel_id"], 1);
            (
                m["address"].as_u64().unwrap(),
                m["length"].as_u64().unwrap(),
                m["start_byte_index"].as_u64().unwrap(),
                m["is_first"].as_bool().unwrap(),
                m["is_last"].as_bool().unwrap(),
                m["request_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0x1001, 31, 1, true, false, "req_1_0"),
            (0x1020, 32, 0, false, false, "req_1_1"),
            (0x1040, 32, 0, false, false, "req_1_2"),
            (0x1060, 5, 0, false, true, "req_1_3"),
            (0x3003, 1, 3, true, true, "req_1_4"),
        ]
    );
    let writes: Vec<_> = seen.iter().filter(|m| m["type"] == "mem_write").collect();
    assert_eq!(writes.len(), 2);
    for w in &writes {
        assert_eq!(keys(w), ["address", "channel_id", "data", "length", "type"]);
        assert_eq!(w["channel_id"], 2);
    }
    assert_eq!(writes[0]["address"], 0x2003);
    assert_eq!(writes[0]["length"], 29);
    assert_eq!(
        writes[0]["data"],
        serde_json::json!((0..29).collect::<Vec<u8>>())
    );
    assert_eq!(writes[1]["address"], 0x2020);
    assert_eq!(writes[1]["length"], 4);
    assert_eq!(writes[1]["data"], serde_json::json!([29, 30, 31, 32]));
}

#[test]
fn dma_unaligned_accesses_of_every_size_round_trip_through_the_client() {
    let server = dma_server(27722);
    let (map, memory) = host_memory();
    let client = dma_client(27722, map);
    let mut port = server.channel(DmaChannel::new(3).unwrap());
    let (mut read_beats, mut write_beats) = (0u64, 0u64);
    for len in [1usize, 31, 32, 33, 100, 4096] {
        for misalign in 0..4u64 {
            let addr = DeviceAddr(DMA_BASE + 0x1000 + misalign);
            let at = 0x1000 + misalign as usize;
            let split: Vec<_> = beats(addr.0, len, BusWidth::Bits256).collect();
            assert_eq!(split.iter().map(|b| b.length).sum::<usize>(), len);
            assert_eq!(split[0].start_byte_index, misalign as u8);
            assert!(split.iter().all(|b| b.length <= 32));
            assert!(split.iter().skip(1).all(|b| b.address % 4 == 0));

            // Card writes land in host memory, and nothing around them changes.
            memory.set(0, &[0xEE; DMA_LEN]);
            let data: Vec<u8> = (0..len)
                .map(|i| (i * 7 + len + misalign as usize) as u8)
                .collect();
            port.write(addr, &data).unwrap();
            write_beats += split.len() as u64;
            eventually("the write beats to be executed", || {
                client.stats().write_beats == write_beats
            });
            let after = memory.snapshot();
            assert_eq!(
                &after[at..at + len],
                &data[..],
                "write of {len} at +{misalign}"
            );
            assert!(after[..at].iter().all(|&b| b == 0xEE));
            assert!(after[at + len..].iter().all(|&b| b == 0xEE));

            // Card reads see host memory.
            let pattern: Vec<u8> = (0..DMA_LEN).map(|i| (i % 251) as u8).collect();
            memory.set(0, &pattern);
            let mut buf = vec![0u8; len];
            port.read(addr, &mut buf).unwrap();
            read_beats += split.len() as u64;
            assert_eq!(
                &buf[..],
                &pattern[at..at + len],
                "read of {len} at +{misalign}"
            );
        }
    }
    let stats = client.stats();
    assert_eq!(
        (stats.read_beats, stats.write_beats),
        (read_beats, write_beats)
    );
    assert_eq!((stats.faults, stats.malformed_lines), (0, 0));
    assert_eq!(server.stats().read_beats, read_beats);
    client.shutdown();
}

#[test]
fn dma_outside_the_map_reads_zeros_and_counts_faults_without_hanging() {
    let server = dma_server(27723);
    let (map, memory) = host_memory();
    let client = dma_client(27723, map);
    let mut buf = vec![0x55u8; 40];
    server
        .read_on(DmaChannel::ZERO, DeviceAddr(0xDEAD_0000), &mut buf)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a faulting read answers zeros");
    assert_eq!(client.stats().faults, 2, "one per beat");
    // Straddling the end of the region faults too.
    let end = DMA_BASE + DMA_LEN as u64;
    let mut tail = [0x55u8; 8];
    server
        .read_on(DmaChannel::ZERO, DeviceAddr(end - 4), &mut tail)
        .unwrap();
    assert_eq!(tail, [0; 8]);
    server
        .write_on(DmaChannel::ZERO, DeviceAddr(0xDEAD_0000), &[1, 2, 3])
        .unwrap();
    eventually("the faulting write to be counted", || {
        client.stats().faults == 4
    });
    // The channel still works.
    memory.set(0, &[9, 8, 7, 6]);
    let mut ok = [0u8; 4];
    server
        .read_on(DmaChannel::ZERO, DeviceAddr(DMA_BASE), &mut ok)
        .unwrap();
    assert_eq!(ok, [9, 8, 7, 6]);
    assert_eq!(client.stats().bytes_written, 0);
}

#[test]
fn dma_client_started_before_the_server_still_connects() {
    let (map, memory) = host_memory();
    memory.set(0, &[1, 2, 3]);
    let client = thread::spawn(move || dma_client(27724, map));
    thread::sleep(Duration::from_millis(300));
    let server = dma_server(27724);
    let client = client.join().unwrap();
    let mut buf = [0u8; 3];
    server
        .read_on(DmaChannel::ZERO, DeviceAddr(DMA_BASE), &mut buf)
        .unwrap();
    assert_eq!(buf, [1, 2, 3]);
    assert!(client.stats().running);
}

#[test]
fn dma_client_skips_malformed_requests_and_answers_in_the_benchs_format() {
    let listener = TcpListener::bind(("127.0.0.1", 27725)).unwrap();
    let (map, memory) = host_memory();
    memory.set(4, &[0xA0, 0xA1, 0xA2, 0xA3]);
    let client = dma_client(27725, map);
    let (mut sim, _) = listener.accept().unwrap();
    sim.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(sim.try_clone().unwrap());
    let garbage = [
        "this is not json\n",
        "{\"type\": \"mem_read\"}\n",
        "{\"type\": \"mem_write\", \"channel_id\": 0, \"address\": 1048576, \"data\": [1, 2], \"length\": 3}\n",
        "{\"type\": \"mem_flush\", \"channel_id\": 0}\n",
        "\n",
    ];
    for g in garbage {
        sim.write_all(g.as_bytes()).unwrap();
    }
    sim.write_all(
        b"{\"type\": \"mem_read\", \"channel_id\": 2, \"address\": 1048581, \"length\": 3, \
          \"start_byte_index\": 1, \"is_first\": true, \"is_last\": true, \"request_id\": \"req_2_0\"}\n",
    )
    .unwrap();
    let reply: Value = serde_json::from_str(&read_line(&mut r)).unwrap();
    assert_eq!(
        reply,
        serde_json::json!({
            "type": "mem_read_response",
            "channel_id": 2,
            "request_id": "req_2_0",
            "data": [0xA1, 0xA2, 0xA3],
            "start_byte_index": 1,
            "is_first": true,
            "is_last": true,
        })
    );
    let stats = client.stats();
    assert_eq!(stats.malformed_lines, 4);
    assert_eq!(
        memory.snapshot()[0],
        0,
        "the malformed write was not executed"
    );
    // The simulator going away ends the service thread.
    drop((sim, r));
    eventually("the client to notice", || !client.stats().running);
}

/// A fake driver that answers the first read beat with `reply(request)`.
fn misbehaving_driver(port: u16, reply: fn(&Value) -> Option<Value>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let (mut s, mut r) = raw_connect(port);
        let line = read_line(&mut r);
        let msg: Value = serde_json::from_str(&line).unwrap();
        if let Some(answer) = reply(&msg) {
            s.write_all(format!("{answer}\n").as_bytes()).unwrap();
        }
        // Hold the connection until the server drops it.
        let _ = read_line(&mut r);
    })
}

#[test]
fn dma_server_rejects_wrong_replies_and_drops_the_connection() {
    let server = DmaServer::bind(DmaServerConfig {
        port: 27726,
        bus: BusWidth::Bits256,
        reply_timeout: Duration::from_millis(300),
        driver_wait: Duration::from_secs(5),
    })
    .unwrap();
    let mut buf = [0u8; 4];
    let at = DeviceAddr(0x1000);

    let driver = misbehaving_driver(27726, |m| {
        Some(
            serde_json::json!({"channel_id": 0, "request_id": "req_0_9", "data": [0, 0, 0, 0],
                                "expected": m["request_id"]}),
        )
    });
    let err = server.read_on(DmaChannel::ZERO, at, &mut buf).unwrap_err();
    assert!(
        matches!(&err, DmaLinkError::UnexpectedReply { expected, .. } if expected == "req_0_0"),
        "{err}"
    );
    assert!(!server.stats().driver_connected);
    driver.join().unwrap();

    let driver = misbehaving_driver(27726, |m| {
        Some(serde_json::json!({"channel_id": 0, "request_id": m["request_id"], "data": [1, 2]}))
    });
    let err = server.read_on(DmaChannel::ZERO, at, &mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            DmaLinkError::WrongLength {
                expected: 4,
                got: 2,
                ..
            }
        ),
        "{err}"
    );
    driver.join().unwrap();

    let driver = misbehaving_driver(27726, |_| None);
    let err = server.read_on(DmaChannel::ZERO, at, &mut buf).unwrap_err();
    assert!(matches!(err, DmaLinkError::ReplyTimeout { .. }), "{err}");
    driver.join().unwrap();

    // Through the DmaPort trait the same failure is a DmaFault naming the access.
    let driver = misbehaving_driver(27726, |_| Some(Value::from("garbage")));
    let mut port = server.channel(DmaChannel::ZERO);
    let fault = port.read(at, &mut buf).unwrap_err();
    assert_eq!((fault.addr, fault.len, fault.is_write), (at, 4, false));
    driver.join().unwrap();

    let stats = server.stats();
    assert_eq!((stats.errors, stats.clients_accepted), (4, 4));
}

#[test]
fn dma_server_without_a_driver_fails_after_the_wait() {
    let server = DmaServer::bind(DmaServerConfig {
        port: 27727,
        driver_wait: Duration::from_millis(100),
        ..DmaServerConfig::default()
    })
    .unwrap();
    let err = server
        .write_on(DmaChannel::ZERO, DeviceAddr(0), &[1])
        .unwrap_err();
    assert!(matches!(err, DmaLinkError::NoDriver { .. }), "{err}");
    let err = server
        .read_on(DmaChannel::ZERO, DeviceAddr(u64::MAX), &mut [0u8; 2])
        .unwrap_err();
    assert!(matches!(err, DmaLinkError::AddressOverflow { .. }), "{err}");
}

// ---------------------------------------------------------------------------------------
// Ethernet
// ---------------------------------------------------------------------------------------

/// Receives exactly `n` frames within 5 s.
fn recv_n(link: &mut dyn LinkPort, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n {
        assert!(Instant::now() < deadline, "got {} of {n} frames", got.len());
        link.recv_frames(Duration::from_millis(50), &mut |f| got.push(f.to_vec()))
            .unwrap();
    }
    assert_eq!(got.len(), n);
    got
}

/// An IPv4-over-Ethernet frame of `len` bytes (>= 34) from `src` to `dst`.
fn ip_frame(src: Ipv4Addr, dst: Ipv4Addr, len: usize, seed: u8) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[26..30].copy_from_slice(&src.octets());
    f[30..34].copy_from_slice(&dst.octets());
    f
}

fn frames_of_many_sizes(seed: u8) -> Vec<Vec<u8>> {
    [1usize, 14, 60, 61, 62, 1514, 9018]
        .iter()
        .map(|&len| (0..len).map(|i| (i as u8) ^ seed).collect())
        .collect()
}

#[test]
fn two_card_link_carries_frames_intact_both_ways() {
    let mut card1 = TwoCardLink::listen(27731).unwrap();
    card1.send_frames(&[&[1, 2, 3]]).unwrap();
    assert_eq!(card1.status().dropped_before_connect, 1);
    let mut card2 = TwoCardLink::connect(27731, &TWO_CARD_RETRY).unwrap();
    assert!(card1.wait_connected(Duration::from_secs(5)));

    let to2 = frames_of_many_sizes(0x5A);
    let to1 = frames_of_many_sizes(0xC3);
    let refs: Vec<&[u8]> = to2.iter().map(Vec::as_slice).collect();
    card1.send_frames(&refs).unwrap();
    let refs: Vec<&[u8]> = to1.iter().map(Vec::as_slice).collect();
    card2.send_frames(&refs).unwrap();
    assert_eq!(recv_n(&mut card2, to2.len()), to2);
    assert_eq!(recv_n(&mut card1, to1.len()), to1);
    assert_eq!(card1.status().frames_sent, to2.len() as u64);
    assert_eq!(card2.status().frames_received, to2.len() as u64);

    // Card 2 leaving takes the link down on card 1.
    drop(card2);
    eventually("card 1 to see the link down", || !card1.status().connected);
    assert!(card1.send_frames(&[&[0u8; 60]]).is_err());
    assert!(card1
        .recv_frames(Duration::from_millis(10), &mut |_| {})
        .is_err());
}

#[test]
fn two_card_link_card2_started_first_still_connects() {
    let card2 = thread::spawn(|| TwoCardLink::connect(27732, &TWO_CARD_RETRY).unwrap());
    thread::sleep(Duration::from_millis(250));
    let mut card1 = TwoCardLink::listen(27732).unwrap();
    let mut card2 = card2.join().unwrap();
    assert!(card1.wait_connected(Duration::from_secs(5)));
    card2.send_frames(&[&[7u8; 64]]).unwrap();
    assert_eq!(recv_n(&mut card1, 1), vec![vec![7u8; 64]]);
}

#[test]
fn two_card_link_counts_and_skips_garbage_lines() {
    let mut card1 = TwoCardLink::listen(27733).unwrap();
    let (mut peer, mut peer_r) = raw_connect(27733);
    assert!(card1.wait_connected(Duration::from_secs(5)));
    peer.write_all(b"!!! not base64 !!!\nAQID\n\nAQI\n\r\n//4=\r\n")
        .unwrap();
    assert_eq!(recv_n(&mut card1, 2), vec![vec![1, 2, 3], vec![0xFF, 0xFE]]);
    assert_eq!(
        card1.status().garbage_lines,
        2,
        "bad characters, missing padding"
    );
    // What card 1 sends is one padded base64 line per frame.
    card1.send_frames(&[&[0xFF, 0xFE], &[]]).unwrap();
    assert_eq!(read_line(&mut peer_r), "//4=\n");
    assert_eq!(read_line(&mut peer_r), "\n");
}

#[test]
fn soft_switch_routes_frames_between_nodes_by_destination_ip() {
    let switch = SoftSwitch::bind(SoftSwitchConfig {
        port: 27741,
        hold_unknown: Duration::from_millis(100),
    })
    .unwrap();
    let mut node1 = SoftSwitchLink::connect(27741, 1, &QUICK_RETRY).unwrap();
    let mut node2 = SoftSwitchLink::connect(27741, 2, &QUICK_RETRY).unwrap();
    let (ip1, ip2) = (node_ip(1).unwrap(), node_ip(2).unwrap());
    eventually("both nodes to register", || {
        switch.is_registered(ip1) && switch.is_registered(ip2)
    });

    let to2: Vec<_> = [34usize, 60, 1514, 9018]
        .iter()
        .map(|&n| ip_frame(ip1, ip2, n, 1))
        .collect();
    let to1 = vec![ip_frame(ip2, ip1, 90, 2), ip_frame(ip2, ip1, 96, 3)];
    let refs: Vec<&[u8]> = to2.iter().map(Vec::as_slice).collect();
    node1.send_frames(&refs).unwrap();
    let refs: Vec<&[u8]> = to1.iter().map(Vec::as_slice).collect();
    node2.send_frames(&refs).unwrap();
    assert_eq!(recv_n(&mut node2, to2.len()), to2);
    assert_eq!(recv_n(&mut node1, to1.len()), to1);

    // A wrong source address is forwarded with a warning; an unknown destination is held,
    // then dropped; a short frame cannot be routed.
    let spoofed = ip_frame(Ipv4Addr::new(1, 2, 3, 4), ip2, 60, 4);
    node1
        .send_frames(&[
            &spoofed,
            &ip_frame(ip1, Ipv4Addr::new(17, 34, 51, 99), 60, 5),
            &[0u8; 33],
        ])
        .unwrap();
    assert_eq!(recv_n(&mut node2, 1), vec![spoofed]);
    eventually("the drops to be counted", || {
        let s = switch.stats();
        s.dropped_unknown_destination == 1 && s.dropped_too_short == 1
    });
    let stats = switch.stats();
    assert_eq!(stats.source_mismatches, 1);
    assert_eq!(stats.frames_forwarded, 7);
    assert_eq!(stats.nodes_registered, 2);

    // Garbage from a node is counted by the switch; a bad registration is refused.
    let (mut raw, _) = raw_connect(27741);
    raw.write_all(b"3\nnot*base64\n").unwrap();
    eventually("the garbage to be counted", || {
        switch.stats().garbage_lines == 1
    });
    let (mut bad, mut bad_r) = raw_connect(27741);
    bad.write_all(b"node-four\n").unwrap();
    assert_eq!(read_line(&mut bad_r), "", "closed");
    assert_eq!(switch.stats().bad_registrations, 1);
}

#[test]
fn soft_switch_link_registers_its_instance_and_counts_garbage() {
    // A stand-in switch that checks the registration line and sends raw lines.
    let listener = TcpListener::bind(("127.0.0.1", 27742)).unwrap();
    let mut node = SoftSwitchLink::connect(27742, 5, &QUICK_RETRY).unwrap();
    let (mut sw, _) = listener.accept().unwrap();
    sw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sw_r = BufReader::new(sw.try_clone().unwrap());
    assert_eq!(read_line(&mut sw_r), "5\n");
    sw.write_all(b"@@@@\nAAECAw==\n").unwrap();
    assert_eq!(recv_n(&mut node, 1), vec![vec![0, 1, 2, 3]]);
    assert_eq!(node.status().garbage_lines, 1);
    node.send_frames(&[&[0xFB, 0xFF]]).unwrap();
    assert_eq!(read_line(&mut sw_r), "+/8=\n");
}

/// `port`'s sender transmits `frames` from another thread while `port` waits in
/// `recv_frames` on a third; `peer` receives them all while `port` still waits, then
/// answers with `reply`, which wakes it. Returns `port`.
fn sender_transmits_while_the_port_waits<P: LinkPort + 'static>(
    mut port: P,
    peer: &mut dyn LinkPort,
    frames: &[Vec<u8>],
    reply: &[u8],
) -> P {
    let mut tx = port.sender().unwrap();
    let receiver = thread::spawn(move || {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.is_empty() && Instant::now() < deadline {
            port.recv_frames(Duration::from_secs(10), &mut |f| got.push(f.to_vec()))
                .unwrap();
        }
        (port, got)
    });
    thread::sleep(Duration::from_millis(20));
    let to_send = frames.to_vec();
    let tx = thread::spawn(move || {
        for chunk in to_send.chunks(3) {
            let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            tx.send_frames(&refs).unwrap();
        }
        tx
    })
    .join()
    .unwrap();
    assert_eq!(recv_n(peer, frames.len()), frames);
    assert!(!receiver.is_finished(), "the port is still waiting");
    peer.send_frames(&[reply]).unwrap();
    let (port, got) = receiver.join().unwrap();
    assert_eq!(got, [reply.to_vec()]);
    drop(tx);
    port
}

#[test]
fn two_card_link_sender_transmits_while_the_port_waits_and_shares_its_state() {
    let card1 = TwoCardLink::listen(0).unwrap();
    let port = card1.local_addr().unwrap().port();
    let mut early = card1.sender().unwrap();
    early.send_frames(&[&[1, 2, 3], &[4]]).unwrap();
    assert_eq!(card1.status().dropped_before_connect, 2, "not up yet");
    let mut card2 = TwoCardLink::connect(port, &TWO_CARD_RETRY).unwrap();
    assert!(card1.wait_connected(Duration::from_secs(5)));

    let frames = frames_of_many_sizes(0x33);
    let card1 = sender_transmits_while_the_port_waits(card1, &mut card2, &frames, &[9; 60]);
    let status = card1.status();
    assert_eq!(
        (status.frames_sent, status.frames_received),
        (frames.len() as u64, 1)
    );
    let s = card1.stats().snapshot();
    assert_eq!(
        (s.frames_sent, s.frames_received, s.frames_unroutable),
        (frames.len() as u64, 1, 2)
    );

    // The sender made before the link came up now reaches card 2.
    early.send_frames(&[&[5; 64]]).unwrap();
    assert_eq!(recv_n(&mut card2, 1), vec![vec![5u8; 64]]);
    // Card 2 leaving takes the link down for the sender too; so does dropping the port.
    drop(card2);
    eventually("card 1 to see the link down", || !card1.status().connected);
    assert!(early.send_frames(&[&[0u8; 60]]).is_err());
    let listening = TwoCardLink::listen(0).unwrap();
    let mut orphan = listening.sender().unwrap();
    drop(listening);
    let err = orphan.send_frames(&[&[0u8; 60]]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotConnected, "{err}");
}

#[test]
fn soft_switch_link_sender_transmits_while_the_port_waits() {
    let switch = SoftSwitch::bind(SoftSwitchConfig {
        port: 0,
        hold_unknown: Duration::from_millis(100),
    })
    .unwrap();
    let port = switch.local_addr().port();
    let node1 = SoftSwitchLink::connect(port, 1, &QUICK_RETRY).unwrap();
    let mut node2 = SoftSwitchLink::connect(port, 2, &QUICK_RETRY).unwrap();
    let (ip1, ip2) = (node_ip(1).unwrap(), node_ip(2).unwrap());
    eventually("both nodes to register", || {
        switch.is_registered(ip1) && switch.is_registered(ip2)
    });
    let frames: Vec<_> = (0..40u8)
        .map(|n| ip_frame(ip1, ip2, 34 + usize::from(n) * 37, n))
        .collect();
    let reply = ip_frame(ip2, ip1, 90, 0xEE);
    let node1 = sender_transmits_while_the_port_waits(node1, &mut node2, &frames, &reply);
    let s = node1.stats().snapshot();
    assert_eq!((s.frames_sent, s.frames_received), (40, 1));
    assert_eq!(node1.status().frames_sent, 40);
}
