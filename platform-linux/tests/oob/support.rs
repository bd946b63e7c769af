//! What the OOB tests share: a log that tests can search, pairs of transports on
//! 127.0.0.1 and 127.0.0.2 with the tests' key, and a hand-made peer ([`RawPeer`]) that
//! sends any bytes from any 127.0.0.x address, or does the version-2 handshake with a key
//! of its choosing, computing the proofs itself from the wire format.

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_core::oob::{Capabilities, Hello, RecvWr, HELLO_LEN, PROOF_LEN};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};
use bluerdma_linux::oob::{OobKey, OobSecret, TcpOob, TcpOobConfig};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use socket2::{Domain, Protocol, Socket, Type};

pub const IP_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The secret of every transport and honest hand-made peer of these tests.
pub const SECRET: &[u8] = b"the OOB integration tests' secret";

pub fn test_key() -> OobKey {
    OobKey::Secret(OobSecret::new(SECRET).unwrap())
}

/// Every log line of the process, so tests can check that errors name the problem.
pub static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub struct CaptureLogger;

impl log::Log for CaptureLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {}", record.level(), record.args());
        LOG.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn flush(&self) {}
}

pub fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        log::set_logger(&CaptureLogger).unwrap();
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// The captured lines that contain all of `needles`.
pub fn logged(needles: &[&str]) -> Vec<String> {
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    log.iter()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .cloned()
        .collect()
}

pub fn config(ip: Ipv4Addr, port: u16) -> TcpOobConfig {
    let mut cfg = TcpOobConfig::new(ip);
    cfg.port = port;
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.hello_timeout = Duration::from_secs(2);
    cfg.key = test_key();
    cfg
}

/// A on 127.0.0.1 and B on 127.0.0.2, listening on the same free port.
pub fn pair_with(tweak: impl Fn(&mut TcpOobConfig)) -> (TcpOob, TcpOob) {
    capture_logs();
    for _ in 0..20 {
        let mut a = config(IP_A, 0);
        tweak(&mut a);
        let a = TcpOob::bind(a).unwrap();
        let mut b = config(IP_B, a.local_addr().port());
        tweak(&mut b);
        if let Ok(b) = TcpOob::bind(b) {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

pub fn pair() -> (TcpOob, TcpOob) {
    pair_with(|_| {})
}

pub fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

pub fn next_event(oob: &mut TcpOob, what: &str) -> OobEvent {
    wait_until(what, || oob.poll())
}

pub fn record(i: u64) -> RecvWr {
    RecvWr {
        wr_id: i,
        addr: 0x7f00_0000_0000 + i * 4096,
        length: (i as u32).wrapping_mul(7),
        lkey: 0x100 | (i as u32 & 0xff),
        qpn: (i as u32 % 1000) << 8 | 0x2a,
    }
}

/// Sends, retrying while the transport says its queue is full.
pub fn send(oob: &mut TcpOob, peer: Ipv4Addr, wr: &RecvWr) {
    loop {
        match oob.send(peer, wr) {
            Ok(()) => return,
            Err(PlatformError::WouldBlock) => thread::sleep(Duration::from_micros(100)),
            Err(e) => panic!("send to {peer} failed: {e}"),
        }
    }
}

/// Established TCP connections between `a` and `b` whose listening end is on `port`,
/// from /proc/net/tcp (one line per socket; the listening end's line counts each once).
pub fn connections(a: Ipv4Addr, b: Ipv4Addr, port: u16) -> usize {
    let parse = |field: &str| {
        let (ip, port) = field.split_once(':').unwrap();
        // The kernel prints the address as the u32 in host (little-endian) order.
        let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).unwrap().to_le_bytes());
        (ip, u16::from_str_radix(port, 16).unwrap())
    };
    let text = fs::read_to_string("/proc/net/tcp").unwrap();
    text.lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (parse(fields[1]), parse(fields[2]));
            fields[3] == "01"
                && local.1 == port
                && ((local.0 == a && remote.0 == b) || (local.0 == b && remote.0 == a))
        })
        .count()
}

pub fn wait_one_connection(a: &TcpOob, b: &TcpOob) {
    let port = a.local_addr().port();
    wait_until("exactly one connection in /proc/net/tcp", || {
        let both_open = a.stats().open_connections == 1 && b.stats().open_connections == 1;
        (both_open && connections(IP_A, IP_B, port) == 1).then_some(())
    });
}

/// A hand-made client: any bytes, from any 127.0.0.x source address.
pub struct RawPeer(pub TcpStream);

impl RawPeer {
    pub fn connect(from: Ipv4Addr, to: SocketAddrV4) -> RawPeer {
        Self::try_connect(from, to).unwrap_or_else(|e| panic!("connect {from} -> {to}: {e}"))
    }

    /// As `connect`, returning the error. A flood client can see the server's refusal
    /// (accept, then close) as a reset before its own `connect` returns.
    pub fn try_connect(from: Ipv4Addr, to: SocketAddrV4) -> std::io::Result<RawPeer> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        socket.bind(&SocketAddrV4::new(from, 0).into())?;
        socket.connect(&to.into())?;
        let stream: TcpStream = socket.into();
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(RawPeer(stream))
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).unwrap();
    }

    /// Everything the other side sends until it closes.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut got = vec![];
        let mut buf = [0u8; 256];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                // A reset also ends the connection (data that arrived first was read).
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
                Err(e) => panic!("raw peer read: {e}"),
            }
        }
    }
}

/// A's listening address; after the garbage, A and B still exchange records both ways.
pub fn still_works(a: &mut TcpOob, b: &mut TcpOob, tag: u64) {
    send(a, IP_B, &record(tag));
    send(b, IP_A, &record(tag + 1));
    assert_eq!(
        next_event(b, "record at B after the garbage"),
        OobEvent::RecvWr {
            from: IP_A,
            wr: record(tag)
        }
    );
    assert_eq!(
        next_event(a, "record at A after the garbage"),
        OobEvent::RecvWr {
            from: IP_B,
            wr: record(tag + 1)
        }
    );
}

pub fn hello_with_version(ip: Ipv4Addr, version: u16) -> [u8; HELLO_LEN] {
    let mut hello = Hello::new(ip).to_bytes();
    hello[4..6].copy_from_slice(&version.to_be_bytes());
    hello
}

/// HMAC-SHA256 of the label and both hellos: the proofs of protocol version 2, written
/// from the wire format rather than taken from the driver.
pub fn proof(secret: &[u8], dialer: bool, hellos: &[u8]) -> [u8; PROOF_LEN] {
    let label: &[u8] = if dialer {
        b"bluerdma OOB v2 dialer"
    } else {
        b"bluerdma OOB v2 listener"
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(label);
    mac.update(hellos);
    mac.finalize().into_bytes().into()
}

impl RawPeer {
    /// Sends a hello from `from` announcing `caps`, reads the listener's hello and sends
    /// the dialer's proof made with `secret`. Returns the listener's hello and every
    /// byte this side sent (for a replay).
    pub fn handshake(
        &mut self,
        from: Ipv4Addr,
        caps: Capabilities,
        secret: &[u8],
    ) -> (Hello, Vec<u8>) {
        static HANDSHAKES: AtomicU64 = AtomicU64::new(0);
        let mut nonce = [0u8; 16];
        nonce[..4].copy_from_slice(&from.octets());
        let n = HANDSHAKES.fetch_add(1, Ordering::Relaxed);
        nonce[4..12].copy_from_slice(&n.to_be_bytes());
        let hello = Hello {
            capabilities: caps,
            ..Hello::new(from).with_nonce(nonce)
        };
        self.send(&hello.to_bytes());
        let mut theirs = [0u8; HELLO_LEN];
        self.0.read_exact(&mut theirs).unwrap();
        let (listener, _) = Hello::parse(&theirs).unwrap();
        let hellos = [hello.to_bytes(), theirs].concat();
        let ours = proof(secret, true, &hellos);
        self.send(&ours);
        (listener, [&hello.to_bytes()[..], &ours].concat())
    }

    /// [`RawPeer::handshake`] with the tests' secret, then the listener's proof, checked.
    pub fn handshake_accepted(&mut self, from: Ipv4Addr, caps: Capabilities) -> Hello {
        let (listener, sent) = self.handshake(from, caps, SECRET);
        let mut theirs = [0u8; PROOF_LEN];
        self.0.read_exact(&mut theirs).unwrap();
        let hellos = [&sent[..HELLO_LEN], &listener.to_bytes()].concat();
        assert_eq!(
            theirs,
            proof(SECRET, false, &hellos),
            "the listener's proof"
        );
        listener
    }
}

/// A hand-made peer at `from` whose hello announces `caps`, connected to `a` (A answers
/// with its own hello, which announces LENGTH_ERRORS).
pub fn raw_peer_with(a: &TcpOob, from: Ipv4Addr, caps: Capabilities) -> RawPeer {
    let mut raw = RawPeer::connect(from, a.local_addr());
    let theirs = raw.handshake_accepted(from, caps);
    assert_eq!(theirs.capabilities, Capabilities::OURS);
    assert!(Capabilities::OURS.contains(Capabilities::LENGTH_ERRORS));
    raw
}
