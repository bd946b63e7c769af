//! The link between emulated NICs: UDP transport, memory hub, fault injection and pcap
//! capture, driven with RoCE frames built by hand (`shared/spec/nic-behaviour.md` 1.4-1.5).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_sim::link::{
    CaptureDirection, CapturingLink, FaultConfig, FaultyLink, LinkPort, LinkStatsSnapshot, MemHub,
    PcapSink, UdpLink, UdpLinkConfig,
};

const CARD_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const CARD_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

const OP_WRITE_FIRST: u8 = 0x06;
const OP_WRITE_MIDDLE: u8 = 0x07;
const OP_WRITE_LAST: u8 = 0x08;

/// The fields of a hand-built RoCE frame that the tests vary.
struct Roce<'a> {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    opcode: u8,
    psn: u32,
    dqpn: u32,
    /// RETH: virtual address, R_Key, DMA length.
    reth: Option<(u64, u32, u32)>,
    payload: &'a [u8],
}

/// A frame as the card builds it: Ethernet, IPv4, UDP to 4791, BTH, the 42-byte extension
/// area (RETH first, zero-filled), then the payload; no ICRC, no FCS.
fn roce_frame(r: &Roce<'_>) -> Vec<u8> {
    let udp_payload_len = 54 + r.payload.len();
    let mut f = Vec::with_capacity(42 + udp_payload_len);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, r.dst.octets()[3]]);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, r.src.octets()[3]]);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total_len = (udp_payload_len + 28) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total_len.to_be_bytes());
    ip[4..6].copy_from_slice(&1u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&r.src.octets());
    ip[16..20].copy_from_slice(&r.dst.octets());
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xFFFF) + (sum >> 16);
    let checksum = !(((folded & 0xFFFF) + (folded >> 16)) as u16);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&(r.dqpn as u16).to_be_bytes()); // UDP source port: sqpn & 0xFFFF
    f.extend_from_slice(&4791u16.to_be_bytes());
    f.extend_from_slice(&((udp_payload_len + 8) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    let mut bth = [0u8; 12];
    bth[0] = r.opcode; // RC: transport bits 0
    bth[5..8].copy_from_slice(&r.dqpn.to_be_bytes()[1..]);
    bth[8] = if r.opcode == OP_WRITE_LAST { 0x80 } else { 0 };
    bth[9..12].copy_from_slice(&r.psn.to_be_bytes()[1..]);
    f.extend_from_slice(&bth);
    let mut ext = [0u8; 42];
    if let Some((va, rkey, len)) = r.reth {
        ext[0..8].copy_from_slice(&va.to_be_bytes());
        ext[8..12].copy_from_slice(&rkey.to_be_bytes());
        ext[12..16].copy_from_slice(&len.to_be_bytes());
    }
    f.extend_from_slice(&ext);
    f.extend_from_slice(r.payload);
    f
}

/// A numbered frame from `src` to `dst`: the number is the PSN, the payload `len` bytes
/// derived from it.
fn numbered_frame(src: Ipv4Addr, dst: Ipv4Addr, n: u32, len: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ n) as u8).collect();
    roce_frame(&Roce {
        src,
        dst,
        opcode: 0x04, // SEND_ONLY
        psn: n,
        dqpn: 0x0101,
        reth: None,
        payload: &payload,
    })
}

fn psn_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes([0, frame[51], frame[52], frame[53]])
}

fn refs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
    frames.iter().map(Vec::as_slice).collect()
}

/// Receives until `want` frames arrived or two seconds passed.
fn recv_frames_until(port: &mut (impl LinkPort + ?Sized), want: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        port.recv_frames(Duration::from_millis(20), &mut |f| got.push(f.to_vec()))
            .expect("recv_frames");
    }
    got
}

/// Two UDP ports at 127.0.0.1 and 127.0.0.2 on a port the kernel chose free.
fn udp_pair() -> (UdpLink, UdpLink) {
    udp_pair_with(|config| config)
}

/// As [`udp_pair`], with B's configuration adjusted by `adjust_b`.
fn udp_pair_with(adjust_b: impl Fn(UdpLinkConfig) -> UdpLinkConfig) -> (UdpLink, UdpLink) {
    for _ in 0..20 {
        let a = UdpLink::bind(UdpLinkConfig::new(CARD_A).with_port(0)).expect("bind A");
        let port = a.local_addr().port();
        if let Ok(b) = UdpLink::bind(adjust_b(UdpLinkConfig::new(CARD_B).with_port(port))) {
            return (a, b);
        }
    }
    panic!("no UDP port free on both 127.0.0.1 and 127.0.0.2");
}

#[test]
fn udp_links_exchange_batches_intact_and_in_order() {
    let (mut a, mut b) = udp_pair();
    let sizes = [0usize, 1, 3, 64, 1000, 4096, 4099, 2048];
    let to_b: Vec<Vec<u8>> = (0..400u32)
        .map(|n| numbered_frame(CARD_A, CARD_B, n, sizes[n as usize % sizes.len()]))
        .collect();
    for chunk in to_b.chunks(100) {
        a.send_frames(&refs(chunk)).unwrap();
    }
    let to_a = vec![numbered_frame(CARD_B, CARD_A, 7, 10)];
    b.send_frames(&refs(&to_a)).unwrap();

    let got_b = recv_frames_until(&mut b, to_b.len());
    assert_eq!(got_b.len(), to_b.len(), "stats of B: {:?}", b.stats());
    assert!(got_b == to_b, "frames changed or reordered on the way");
    assert_eq!(recv_frames_until(&mut a, 1), to_a);

    let sa = a.stats().snapshot();
    assert_eq!(sa.frames_sent, 400);
    assert_eq!(sa.frames_received, 1);
    // 400 frames of ~1.7 KiB on average: batching packs them into a few dozen datagrams.
    assert!(sa.datagrams_sent < 40, "{sa:?}");
    let sb = b.stats().snapshot();
    assert_eq!(
        (sb.frames_received, sb.datagrams_received),
        (400, sa.datagrams_sent)
    );
    assert_eq!(sb.bad_datagrams + sb.rx_queue_drops, 0);
}

#[test]
fn udp_link_drops_what_it_must_not_send() {
    let (mut a, mut b) = udp_pair();
    let outside = numbered_frame(CARD_A, Ipv4Addr::new(10, 0, 0, 2), 1, 10);
    let mut arp = numbered_frame(CARD_A, CARD_B, 2, 10);
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    let runt = numbered_frame(CARD_A, CARD_B, 3, 0)[..20].to_vec();
    let huge = numbered_frame(CARD_A, CARD_B, 4, 70_000);
    let good = numbered_frame(CARD_A, CARD_B, 5, 10);
    a.send_frames(&[&outside, &arp, &runt, &huge, &good])
        .unwrap();
    assert_eq!(recv_frames_until(&mut b, 1), [good]);
    let s = a.stats().snapshot();
    assert_eq!(
        (s.frames_unroutable, s.frames_oversize, s.frames_sent),
        (3, 1, 1)
    );

    let err = UdpLink::bind(UdpLinkConfig::new(Ipv4Addr::new(192, 168, 1, 1))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("not in 127.0.0.0/8"), "{err}");
}

#[test]
fn malformed_datagrams_are_counted_and_the_link_keeps_working() {
    let (mut a, mut b) = udp_pair();
    let raw = UdpSocket::bind((CARD_A, 0)).unwrap();
    let target = b.local_addr();
    let bad: [&[u8]; 4] = [
        b"hello",                               // shorter than the header
        &[0x00, 0x00, 1, 0, 0, 1, 0, 1, 9],     // bad magic
        &[0x42, 0x4C, 1, 0, 0, 2, 0, 1, 9],     // second record missing
        &[0x42, 0x4C, 1, 0, 0, 1, 0, 40, 1, 2], // record longer than the datagram
    ];
    for datagram in bad {
        raw.send_to(datagram, target).unwrap();
    }
    let good = numbered_frame(CARD_A, CARD_B, 9, 100);
    a.send_frames(&[&good]).unwrap();
    assert_eq!(recv_frames_until(&mut b, 1), [good]);
    // The bad datagrams were sent first, so they were all read before the good one.
    assert_eq!(b.stats().snapshot().bad_datagrams, 4);
    assert_eq!(b.stats().snapshot().frames_received, 1);
}

#[test]
fn udp_recv_waits_at_most_its_timeout() {
    let (_a, mut b) = udp_pair();
    let start = Instant::now();
    assert_eq!(b.recv_frames(Duration::ZERO, &mut |_| {}).unwrap(), 0);
    // A zero timeout does not wait: far below the 30 ms wait measured next, and below
    // what a loaded machine's scheduling adds.
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "zero timeout does not wait: {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    assert_eq!(
        b.recv_frames(Duration::from_millis(30), &mut |_| {})
            .unwrap(),
        0
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(25) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}

/// How long one `recv_frames(timeout)` on `port` took; it must deliver no frame.
fn empty_wait(port: &mut UdpLink, timeout: Duration) -> Duration {
    let start = Instant::now();
    assert_eq!(port.recv_frames(timeout, &mut |_| {}).unwrap(), 0);
    start.elapsed()
}

/// The port's waker ends a receive wait at once and delivers no frame; a wake that was
/// taken does not keep the next wait from waiting; wakes rung together end one wait, and a
/// wake rung while nobody waits ends the next wait.
#[test]
fn the_waker_ends_a_receive_wait_once_per_wake() {
    let (_a, mut b) = udp_pair();
    let wake = b.waker().expect("a UDP port has a waker");
    let (long, short) = (Duration::from_secs(5), Duration::from_millis(30));
    let waiter_wake = wake.clone();
    let ringer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        waiter_wake();
    });
    let woken = empty_wait(&mut b, long);
    assert!(
        woken < Duration::from_secs(4),
        "the wake did not end the wait"
    );
    ringer.join().unwrap();
    // Taken: the next wait waits its whole timeout.
    let waited = empty_wait(&mut b, short);
    assert!(waited >= Duration::from_millis(25), "{waited:?}");
    // Rung three times before anybody waits: the next wait ends at once, the one after waits.
    for _ in 0..3 {
        wake();
    }
    let woken = empty_wait(&mut b, long);
    assert!(
        woken < Duration::from_secs(4),
        "a wake rung before the wait was lost"
    );
    let waited = empty_wait(&mut b, short);
    assert!(waited >= Duration::from_millis(25), "{waited:?}");
}

#[test]
fn udp_receive_queue_overflow_is_counted() {
    let (mut a, mut b) = udp_pair_with(|config| UdpLinkConfig {
        socket_buffer_bytes: 8 << 10,
        ..config
    });
    let frames: Vec<Vec<u8>> = (0..50)
        .map(|n| numbered_frame(CARD_A, CARD_B, n, 4096))
        .collect();
    for frame in &frames {
        a.send_frames(&[frame]).unwrap(); // one datagram each
    }
    let mut queued = 0;
    loop {
        match b
            .recv_frames(Duration::from_millis(50), &mut |_| {})
            .unwrap()
        {
            0 => break,
            n => queued += n,
        }
    }
    assert!(queued < 50, "an 8 KiB receive buffer cannot hold 200 KiB");
    // The kernel reports its drop count with the next datagram that arrives after them.
    a.send_frames(&[&frames[0]]).unwrap();
    assert_eq!(recv_frames_until(&mut b, 1).len(), 1);
    let s = b.stats().snapshot();
    assert_eq!(s.frames_received + s.rx_queue_drops, 51, "{s:?}");
}

/// Sends frames numbered 0..count from A to B through a `FaultyLink` over a memory hub,
/// in batches of `batch`; returns the PSNs B received, in order, and A's counters.
fn run_faulty(config: FaultConfig, count: u32, batch: usize) -> (Vec<u32>, LinkStatsSnapshot) {
    let hub = MemHub::new();
    let mut a = FaultyLink::new(hub.attach(CARD_A).unwrap(), config).unwrap();
    let mut b = hub.attach(CARD_B).unwrap();
    let frames: Vec<Vec<u8>> = (0..count)
        .map(|n| numbered_frame(CARD_A, CARD_B, n, 16))
        .collect();
    for chunk in frames.chunks(batch) {
        a.send_frames(&refs(chunk)).unwrap();
    }
    // Let a frame still held for reordering go (after the default 1 ms hold limit).
    std::thread::sleep(Duration::from_millis(2));
    a.recv_frames(Duration::ZERO, &mut |_| {}).unwrap();
    let mut psns = Vec::new();
    b.recv_frames(Duration::ZERO, &mut |f| psns.push(psn_of(f)))
        .unwrap();
    (psns, a.stats().snapshot())
}

fn missing(psns: &[u32], count: u32) -> BTreeSet<u32> {
    let seen: BTreeSet<u32> = psns.iter().copied().collect();
    (0..count).filter(|n| !seen.contains(n)).collect()
}

#[test]
fn five_percent_drop_is_counted_and_replays_from_its_seed() {
    let config: FaultConfig = "drop=0.05,seed=42".parse().unwrap();
    let (psns, stats) = run_faulty(config, 1000, 37);
    let dropped = missing(&psns, 1000);
    assert_eq!(stats.frames_dropped, dropped.len() as u64);
    assert_eq!(stats.frames_sent + stats.frames_dropped, 1000);
    // 5 % of 1000 is 50; a binomial spread of 4 standard deviations is about +-28.
    assert!(
        (22..=78).contains(&dropped.len()),
        "dropped {}",
        dropped.len()
    );
    assert!(
        psns.windows(2).all(|w| w[0] < w[1]),
        "drop alone never reorders"
    );

    // Same seed, other batching: exactly the same frames are lost.
    let (again, _) = run_faulty(config, 1000, 1000);
    assert_eq!(missing(&again, 1000), dropped);
    let other_seed = FaultConfig { seed: 43, ..config };
    let (other, _) = run_faulty(other_seed, 1000, 37);
    assert_ne!(missing(&other, 1000), dropped);
}

#[test]
fn five_percent_drop_over_udp_shows_in_the_counters() {
    let (a, mut b) = udp_pair();
    let config: FaultConfig = "drop=0.05,seed=42".parse().unwrap();
    let mut a = FaultyLink::new(a, config).unwrap();
    let frames: Vec<Vec<u8>> = (0..1000)
        .map(|n| numbered_frame(CARD_A, CARD_B, n, 64))
        .collect();
    for chunk in frames.chunks(50) {
        a.send_frames(&refs(chunk)).unwrap();
    }
    let sa = a.stats().snapshot();
    let got = recv_frames_until(&mut b, (1000 - sa.frames_dropped) as usize);
    let psns: Vec<u32> = got.iter().map(|f| psn_of(f)).collect();
    // The memory hub run with the same seed lost exactly these frames.
    let (reference, _) = run_faulty(config, 1000, 1000);
    assert_eq!(missing(&psns, 1000), missing(&reference, 1000));
    assert_eq!(sa.frames_sent, 1000 - sa.frames_dropped);
    assert_eq!(b.stats().snapshot().frames_received, sa.frames_sent);
}

#[test]
fn duplicates_and_reordering_show_in_the_stream_and_the_counters() {
    let config: FaultConfig = "dup=0.05,reorder=0.05,seed=7".parse().unwrap();
    let (psns, stats) = run_faulty(config, 1000, 10);
    assert_eq!(missing(&psns, 1000), BTreeSet::new(), "nothing lost");
    assert_eq!(psns.len() as u64, 1000 + stats.frames_duplicated);
    // Adjacent repeats are the duplicates; descents are frames overtaken by the next one.
    let mut deduped = psns.clone();
    deduped.dedup();
    assert_eq!((psns.len() - deduped.len()) as u64, stats.frames_duplicated);
    let descents = deduped.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    assert_eq!(descents, stats.frames_reordered);
    assert!(
        stats.frames_duplicated > 20 && stats.frames_reordered > 20,
        "{stats:?}"
    );
    assert_eq!(
        run_faulty(config, 1000, 10).0,
        psns,
        "same seed, same stream"
    );
}

/// The hold limit of the tests that wait for a held frame's release: long enough that the
/// frame is still held when the port's wait begins on a loaded machine. A frame whose limit
/// passed before is released at once, and the port then rightly waits its whole timeout
/// with nothing to receive (5 ms flaked so under ci --stress).
const HOLD: Duration = Duration::from_secs(2);

#[test]
fn a_held_frame_is_released_when_the_port_polls() {
    let hub = MemHub::new();
    let config: FaultConfig = "reorder=1,seed=1".parse().unwrap();
    let mut a = FaultyLink::new(hub.attach(CARD_A).unwrap(), config)
        .unwrap()
        .with_hold_limit(HOLD);
    let mut b = hub.attach(CARD_B).unwrap();
    let only = numbered_frame(CARD_A, CARD_B, 1, 8);
    a.send_frames(&[&only]).unwrap();
    assert_eq!(
        b.recv_frames(Duration::ZERO, &mut |_| {}).unwrap(),
        0,
        "held"
    );
    let start = Instant::now();
    // recv_frames waits no longer than the hold limit (HOLD; not its own 120 s, half of
    // which is the bound), then lets the frame go.
    a.recv_frames(Duration::from_secs(120), &mut |_| {})
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(recv_frames_until(&mut b, 1), [only]);
    assert_eq!(
        a.stats().snapshot().frames_reordered,
        0,
        "released, not overtaken"
    );
}

#[test]
fn corruption_flips_one_byte_after_the_udp_header() {
    let config: FaultConfig = "corrupt=1,seed=99".parse().unwrap();
    let hub = MemHub::new();
    let mut a = FaultyLink::new(hub.attach(CARD_A).unwrap(), config).unwrap();
    let mut b = hub.attach(CARD_B).unwrap();
    let frames: Vec<Vec<u8>> = (0..100)
        .map(|n| numbered_frame(CARD_A, CARD_B, n, 32))
        .collect();
    a.send_frames(&refs(&frames)).unwrap();
    let got = recv_frames_until(&mut b, 100);
    assert_eq!(got.len(), 100);
    let mut offsets = BTreeSet::new();
    for (sent, received) in frames.iter().zip(&got) {
        let diffs: Vec<usize> = (0..sent.len())
            .filter(|&i| sent[i] != received[i])
            .collect();
        assert_eq!(diffs.len(), 1, "exactly one byte differs");
        assert!(
            diffs[0] >= 42,
            "byte {} is in the Ethernet/IP/UDP headers",
            diffs[0]
        );
        offsets.insert(diffs[0]);
    }
    assert!(
        offsets.len() > 20,
        "the flipped byte moves around: {offsets:?}"
    );
    assert_eq!(a.stats().snapshot().frames_corrupted, 100);
}

#[test]
fn fault_configuration_from_the_environment() {
    // The only test that touches this variable.
    std::env::set_var(bluerdma_sim::link::FAULTS_ENV, "drop=0.05,seed=0x2A");
    let config = FaultConfig::from_env().unwrap().unwrap();
    assert_eq!((config.drop, config.seed), (0.05, 42));
    std::env::set_var(bluerdma_sim::link::FAULTS_ENV, "drop=5%");
    let err = FaultConfig::from_env().unwrap_err();
    assert_eq!(
        err.to_string(),
        "BLUERDMA_LINK_FAULTS: fault rate drop=5% is not a number from 0 to 1"
    );
    std::env::remove_var(bluerdma_sim::link::FAULTS_ENV);
    assert_eq!(FaultConfig::from_env().unwrap(), None);
}

/// A 3-packet RDMA WRITE of 2.5 KiB at PMTU 1024: FIRST (with RETH), MIDDLE, LAST.
fn write_packets() -> Vec<Vec<u8>> {
    let data: Vec<u8> = (0..2560u32).map(|i| i as u8).collect();
    let packet = |opcode, psn, reth, payload| {
        roce_frame(&Roce {
            src: CARD_A,
            dst: CARD_B,
            opcode,
            psn,
            dqpn: 0x0203,
            reth,
            payload,
        })
    };
    vec![
        packet(
            OP_WRITE_FIRST,
            100,
            Some((0x7f00_0000_1000, 0x1234_5601, 2560)),
            &data[..1024],
        ),
        packet(OP_WRITE_MIDDLE, 101, None, &data[1024..2048]),
        packet(OP_WRITE_LAST, 102, None, &data[2048..]),
    ]
}

/// A capture file of this process (two test runs at once must not write each other's).
fn capture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{name}", std::process::id()))
}

/// The records of a classic pcap file written on this machine: (incl_len, orig_len, bytes).
fn read_pcap(bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(word(0), 0xA1B2_C3D4, "magic");
    assert_eq!(word(20), 1, "LINKTYPE_ETHERNET");
    let mut records = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let (incl, orig) = (word(at + 8), word(at + 12));
        let start = at + 16;
        records.push((incl, orig, bytes[start..start + incl as usize].to_vec()));
        at = start + incl as usize;
    }
    records
}

#[test]
fn pcap_of_a_write_decodes_in_tshark() {
    let path = capture_path("link-write.pcap");
    let packets = write_packets();
    {
        let sink = PcapSink::create(&path).unwrap();
        let (a, b) = udp_pair();
        let mut a = CapturingLink::new(a, sink.clone(), CaptureDirection::Transmit);
        let mut b = CapturingLink::new(b, sink.clone(), CaptureDirection::Transmit);
        a.send_frames(&refs(&packets)).unwrap();
        assert_eq!(recv_frames_until(&mut b, 3), packets);
        assert_eq!(sink.frames().unwrap(), 3);
    } // The last clone of the sink is dropped here, which flushes the file.
    let records = read_pcap(&std::fs::read(&path).unwrap());
    let frames: Vec<Vec<u8>> = records.iter().map(|r| r.2.clone()).collect();
    assert_eq!(frames, packets);
    assert!(records
        .iter()
        .all(|(incl, orig, f)| *incl == *orig && *orig as usize == f.len()));

    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.psn",
        "infiniband.reth.dmalen",
    ];
    let Some(lines) = tshark_fields(&path, &fields) else {
        println!("SKIPPED: tshark not installed");
        return;
    };
    assert_eq!(lines, ["6\t100\t2560", "7\t101\t", "8\t102\t"]);
}

#[test]
fn a_shared_sink_records_both_directions_once_each() {
    let path = capture_path("link-both-ways.pcap");
    {
        let sink = PcapSink::create(&path).unwrap();
        let hub = MemHub::new();
        let mut a = CapturingLink::new(
            hub.attach(CARD_A).unwrap(),
            sink.clone(),
            CaptureDirection::Transmit,
        );
        let mut b = CapturingLink::new(
            hub.attach(CARD_B).unwrap(),
            sink,
            CaptureDirection::Transmit,
        );
        let request = numbered_frame(CARD_A, CARD_B, 1, 8);
        let reply = numbered_frame(CARD_B, CARD_A, 2, 8);
        a.send_frames(&[&request]).unwrap();
        recv_frames_until(&mut b, 1);
        b.send_frames(&[&reply]).unwrap();
        recv_frames_until(&mut a, 1);
    }
    let psns: Vec<u32> = read_pcap(&std::fs::read(&path).unwrap())
        .iter()
        .map(|r| psn_of(&r.2))
        .collect();
    assert_eq!(psns, [1, 2]);
}

/// Runs tshark on `path` and returns one tab-separated line of `fields` per frame, or
/// `None` if tshark is not installed.
fn tshark_fields(path: &std::path::Path, fields: &[&str]) -> Option<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(path)
        .args(["-d", "udp.port==4791,infiniband", "-T", "fields"]);
    for field in fields {
        cmd.args(["-e", field]);
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running tshark: {e}"),
    };
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------
// Second transmit handles (LinkPort::sender)
// ---------------------------------------------------------------------------------------

/// Byte 10 (inside the source MAC, before anything fault injection touches) says which
/// handle of card A sent a frame.
const HANDLE_BYTE: usize = 10;

/// Frame `n` of handle `handle` of card A, for B.
fn handle_frame(handle: u8, n: u32, len: usize) -> Vec<u8> {
    let mut f = numbered_frame(CARD_A, CARD_B, n, len);
    f[HANDLE_BYTE] = handle;
    f
}

/// The frames of `handle`, in the order they arrived.
fn of_handle(frames: &[Vec<u8>], handle: u8) -> Vec<Vec<u8>> {
    frames
        .iter()
        .filter(|f| f[HANDLE_BYTE] == handle)
        .cloned()
        .collect()
}

/// A's port waits in `recv_frames` on one thread while A's sender transmits 300 frames
/// from another; B gets every one intact and in order while A still waits, then answers,
/// which wakes A's receive thread. Both directions count in A's one set of counters.
fn sender_transmits_while_the_port_waits(mut a: Box<dyn LinkPort>, mut b: Box<dyn LinkPort>) {
    let mut tx = a.sender().expect("sender");
    let receiver = thread::spawn(move || {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.is_empty() && Instant::now() < deadline {
            a.recv_frames(Duration::from_secs(10), &mut |f| got.push(f.to_vec()))
                .expect("recv_frames on A");
        }
        (a, got)
    });
    // Let the receive thread reach its wait.
    thread::sleep(Duration::from_millis(20));
    let frames: Vec<Vec<u8>> = (0..300).map(|n| handle_frame(1, n, 700)).collect();
    let to_send = frames.clone();
    let sending = thread::spawn(move || {
        for chunk in to_send.chunks(30) {
            tx.send_frames(&refs(chunk))
                .expect("send through the sender");
        }
        tx
    });
    let tx = sending.join().unwrap();
    let got_b = recv_frames_until(&mut b, frames.len());
    assert!(
        !receiver.is_finished(),
        "A's receive thread is still waiting for its frame"
    );
    assert_eq!(got_b.len(), frames.len(), "stats of B: {:?}", b.stats());
    assert!(got_b == frames, "frames changed or reordered on the way");

    let reply = numbered_frame(CARD_B, CARD_A, 9, 10);
    b.send_frames(&[&reply]).unwrap();
    let (a, got_a) = receiver.join().unwrap();
    assert_eq!(got_a, [reply]);
    let s = a.stats().snapshot();
    assert_eq!((s.frames_sent, s.frames_received), (300, 1), "{s:?}");
    assert_eq!(b.stats().snapshot().frames_received, 300);
    drop(tx);
}

#[test]
fn udp_sender_transmits_while_the_port_waits_in_recv() {
    let (a, b) = udp_pair();
    sender_transmits_while_the_port_waits(Box::new(a), Box::new(b));
}

#[test]
fn mem_sender_transmits_while_the_port_waits_in_recv() {
    let hub = MemHub::new();
    let a = hub.attach(CARD_A).unwrap();
    let b = hub.attach(CARD_B).unwrap();
    sender_transmits_while_the_port_waits(Box::new(a), Box::new(b));
}

#[test]
fn wrapped_sender_transmits_while_the_port_waits_in_recv() {
    let (a, b) = udp_pair();
    let sink = PcapSink::new(std::io::sink()).unwrap();
    let a = CapturingLink::new(
        FaultyLink::new(a, FaultConfig::none()).unwrap(),
        sink.clone(),
        CaptureDirection::Both,
    );
    sender_transmits_while_the_port_waits(Box::new(a), Box::new(b));
    // 300 frames sent through the sender, 1 received by the port.
    assert_eq!(sink.frames().unwrap(), 301);
}

/// The port (handle 0) and its sender (handle 1) each send `count` frames from their own
/// thread at once, in batches of 25, while B receives on a third; returns what B got.
fn both_handles_at_once(a: &mut dyn LinkPort, b: &mut dyn LinkPort, count: u32) -> Vec<Vec<u8>> {
    let frames =
        |handle: u8| -> Vec<Vec<u8>> { (0..count).map(|n| handle_frame(handle, n, 200)).collect() };
    let (port_frames, sender_frames) = (frames(0), frames(1));
    let mut sender = a.sender().unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            for chunk in port_frames.chunks(25) {
                a.send_frames(&refs(chunk)).expect("send through the port");
            }
        });
        s.spawn(|| {
            for chunk in sender_frames.chunks(25) {
                sender
                    .send_frames(&refs(chunk))
                    .expect("send through the sender");
            }
        });
        recv_frames_until(b, 2 * count as usize)
    })
}

#[test]
fn port_and_sender_transmit_at_once_each_in_order() {
    let count = 1000;
    let (mut a, mut b) = udp_pair();
    let got = both_handles_at_once(&mut a, &mut b, count);
    let hub = MemHub::new();
    let mut mem_a = hub.attach(CARD_A).unwrap();
    let mut mem_b = hub.attach(CARD_B).unwrap();
    let mem_got = both_handles_at_once(&mut mem_a, &mut mem_b, count);
    for (got, stats) in [(got, a.stats()), (mem_got, mem_a.stats())] {
        assert_eq!(got.len(), 2 * count as usize, "{stats:?}");
        for handle in [0, 1] {
            let expected: Vec<Vec<u8>> = (0..count).map(|n| handle_frame(handle, n, 200)).collect();
            assert!(
                of_handle(&got, handle) == expected,
                "handle {handle}: frames changed or reordered"
            );
        }
        assert_eq!(stats.snapshot().frames_sent, 2 * u64::from(count));
    }
}

/// What B receives from one handle whose frames `frames` meet the decisions of `config`,
/// as the fault module documents them; a frame still held at the end is released last.
fn expected_under_faults(config: &FaultConfig, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut held: Option<(Vec<u8>, usize)> = None;
    for (i, frame) in frames.iter().enumerate() {
        let d = config.decide(i as u64, frame.len());
        if d.drop {
            continue;
        }
        let mut bytes = frame.clone();
        if let Some((offset, mask)) = d.corrupt {
            bytes[offset] ^= mask;
        }
        let copies = if d.duplicate { 2 } else { 1 };
        if let Some((h, h_copies)) = held.take() {
            out.extend(std::iter::repeat_n(bytes, copies));
            out.extend(std::iter::repeat_n(h, h_copies));
        } else if d.reorder {
            held = Some((bytes, copies));
        } else {
            out.extend(std::iter::repeat_n(bytes, copies));
        }
    }
    out.extend(
        held.into_iter()
            .flat_map(|(h, n)| std::iter::repeat_n(h, n)),
    );
    out
}

/// Port and sender of a `FaultyLink` send 400 frames each from two threads at once.
/// Returns what B got from each handle and A's counters.
fn faulty_handles_at_once(config: FaultConfig) -> ([Vec<Vec<u8>>; 2], LinkStatsSnapshot) {
    let count = 400;
    let hub = MemHub::new();
    let mut a = FaultyLink::new(hub.attach(CARD_A).unwrap(), config).unwrap();
    let mut b = hub.attach(CARD_B).unwrap();
    let mut sender = a.sender().unwrap();
    let handle_frames =
        |handle: u8| -> Vec<Vec<u8>> { (0..count).map(|n| handle_frame(handle, n, 64)).collect() };
    let (port_frames, sender_frames) = (handle_frames(0), handle_frames(1));
    thread::scope(|s| {
        s.spawn(|| {
            for chunk in port_frames.chunks(7) {
                a.send_frames(&refs(chunk)).unwrap();
            }
        });
        s.spawn(|| {
            for chunk in sender_frames.chunks(11) {
                sender.send_frames(&refs(chunk)).unwrap();
                thread::yield_now();
            }
        });
    });
    // Frames still held by either handle go at the port's first poll after the hold limit.
    thread::sleep(Duration::from_millis(2));
    a.recv_frames(Duration::ZERO, &mut |_| {}).unwrap();
    let mut got = Vec::new();
    b.recv_frames(Duration::ZERO, &mut |f| got.push(f.to_vec()))
        .unwrap();
    (
        [of_handle(&got, 0), of_handle(&got, 1)],
        a.stats().snapshot(),
    )
}

#[test]
fn faults_apply_to_the_sender_with_its_own_seeded_sequence() {
    let config: FaultConfig = "drop=0.1,dup=0.05,reorder=0.05,corrupt=0.05,seed=2024"
        .parse()
        .unwrap();
    let ([port_got, sender_got], stats) = faulty_handles_at_once(config);
    let frames =
        |handle: u8| -> Vec<Vec<u8>> { (0..400).map(|n| handle_frame(handle, n, 64)).collect() };
    // Each handle meets exactly the decisions of its own sequence, however the two
    // threads interleaved: the port those of the seed, the sender those of handle 1.
    assert!(
        port_got == expected_under_faults(&config, &frames(0)),
        "port"
    );
    let sender_config = config.for_handle(1);
    assert_eq!(sender_config.drop, config.drop);
    assert_ne!(sender_config.seed, config.seed);
    assert!(
        sender_got == expected_under_faults(&sender_config, &frames(1)),
        "sender"
    );
    // The sender's faults count in the port's counters.
    let decided = |c: &FaultConfig| -> [u64; 3] {
        let ds: Vec<_> = (0..400).map(|i| c.decide(i, 64)).collect();
        [
            ds.iter().filter(|d| d.drop).count() as u64,
            ds.iter().filter(|d| d.duplicate).count() as u64,
            ds.iter().filter(|d| d.corrupt.is_some()).count() as u64,
        ]
    };
    let (p, s) = (decided(&config), decided(&sender_config));
    assert_eq!(
        [
            stats.frames_dropped,
            stats.frames_duplicated,
            stats.frames_corrupted
        ],
        [p[0] + s[0], p[1] + s[1], p[2] + s[2]]
    );
    assert!(
        s[0] > 10 && s[1] > 5 && s[2] > 5,
        "the sender met faults: {s:?}"
    );
    assert_eq!(
        stats.frames_sent,
        (port_got.len() + sender_got.len()) as u64
    );
    // And the same seed replays the same streams.
    let (again, _) = faulty_handles_at_once(config);
    assert!(again == [port_got, sender_got], "same seed, same streams");
}

#[test]
fn a_frame_held_by_the_sender_is_released_when_the_port_polls() {
    let hub = MemHub::new();
    let config: FaultConfig = "reorder=1,seed=1".parse().unwrap();
    let mut a = FaultyLink::new(hub.attach(CARD_A).unwrap(), config)
        .unwrap()
        .with_hold_limit(HOLD);
    let mut b = hub.attach(CARD_B).unwrap();
    let mut sender = a.sender().unwrap();
    let only = handle_frame(1, 1, 8);
    // The sender lives on: a frame held by a dropped sender is lost.
    let _sender = thread::spawn(move || {
        sender.send_frames(&[&only]).unwrap();
        sender
    })
    .join()
    .unwrap();
    assert_eq!(
        b.recv_frames(Duration::ZERO, &mut |_| {}).unwrap(),
        0,
        "held"
    );
    let start = Instant::now();
    // The port's wait ends at the sender's hold limit (HOLD), not at its own 120 s, and
    // the frame goes; half the port's wait is the bound.
    a.recv_frames(Duration::from_secs(120), &mut |_| {})
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(recv_frames_until(&mut b, 1), [handle_frame(1, 1, 8)]);
    assert_eq!(a.stats().snapshot().frames_reordered, 0);
}

#[test]
fn senders_of_a_stack_go_through_every_layer_in_order() {
    // Capture above the faults records what the card sent; below them, what went out.
    let hub = MemHub::new();
    let drop_all: FaultConfig = "drop=1,seed=3".parse().unwrap();
    let (above, below) = (
        PcapSink::new(std::io::sink()).unwrap(),
        PcapSink::new(std::io::sink()).unwrap(),
    );
    let a = CapturingLink::new(
        FaultyLink::new(
            CapturingLink::new(
                hub.attach(CARD_A).unwrap(),
                below.clone(),
                CaptureDirection::Transmit,
            ),
            drop_all,
        )
        .unwrap(),
        above.clone(),
        CaptureDirection::Transmit,
    );
    let mut b = hub.attach(CARD_B).unwrap();
    let mut sender = a.sender().unwrap();
    let frames: Vec<Vec<u8>> = (0..5).map(|n| handle_frame(1, n, 32)).collect();
    thread::scope(|s| {
        s.spawn(|| sender.send_frames(&refs(&frames)).unwrap());
    });
    assert_eq!(above.frames().unwrap(), 5);
    assert_eq!(below.frames().unwrap(), 0);
    assert_eq!(b.recv_frames(Duration::ZERO, &mut |_| {}).unwrap(), 0);
    let s = a.stats().snapshot();
    assert_eq!((s.frames_dropped, s.frames_sent), (5, 0));
}

#[test]
fn a_shared_sink_records_the_senders_frames_once_each() {
    let path = capture_path("link-sender.pcap");
    let frames: Vec<Vec<u8>> = (0..20).map(|n| handle_frame(1, n, 40)).collect();
    let reply = numbered_frame(CARD_B, CARD_A, 99, 8);
    {
        let sink = PcapSink::create(&path).unwrap();
        let (a, b) = udp_pair();
        let mut a = CapturingLink::new(a, sink.clone(), CaptureDirection::Transmit);
        let mut b = CapturingLink::new(b, sink.clone(), CaptureDirection::Transmit);
        let mut sender = a.sender().unwrap();
        thread::scope(|s| {
            s.spawn(|| {
                for chunk in frames.chunks(4) {
                    sender.send_frames(&refs(chunk)).unwrap();
                }
            });
            // Meanwhile the port waits for B's answer, which B sends once it has all 20.
            s.spawn(|| {
                assert_eq!(recv_frames_until(&mut b, 20), frames);
                b.send_frames(&[&reply]).unwrap();
            });
            assert_eq!(recv_frames_until(&mut a, 1), std::slice::from_ref(&reply));
        });
        assert_eq!(sink.frames().unwrap(), 21);
    }
    let recorded: Vec<Vec<u8>> = read_pcap(&std::fs::read(&path).unwrap())
        .into_iter()
        .map(|r| r.2)
        .collect();
    let mut expected = frames.clone();
    expected.push(reply);
    assert_eq!(recorded, expected, "each frame once, in the order sent");
}
