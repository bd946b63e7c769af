//! The verbs scenarios of `cargo xtask sim`: the driver engine end to end on two devices,
//! by default two emulated NICs (blue0 = 127.0.0.1, blue1 = 127.0.0.2) on the UDP link,
//! optionally with seeded link faults, plus throughput and latency next to TCP, and a soak
//! of random operations on 64 QPs with every byte verified. With [`Options::devices`] the
//! two devices come from a device list instead (`cargo xtask sim --backend rtl|pci`: cards
//! served by `bluerdma-sim serve` or `pci-serve`), and [`Scale::Small`] fits the sizes to
//! the RTL protocol's speed.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};
use bluerdma_sim::inproc::{device_link, DeviceLinkOptions};
use bluerdma_sim::link::{FaultConfig, FaultyLink, LinkPort, ShmConfig};

use crate::debug::hex_diff;
use crate::perf::{self, ALL};
use crate::{Context, Cq, DeviceSpec, Mr, Pd, Qp};

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// How to run the scenarios.
#[derive(Clone, Debug)]
pub struct Options {
    /// UDP port of the link.
    pub port: u16,
    /// Link faults on both cards (blue1's seed is derived from blue0's).
    pub faults: Option<FaultConfig>,
    /// Run the soak for this long.
    pub soak: Option<Duration>,
    /// Seed of the soak's random choices.
    pub seed: u64,
    /// Measure throughput and latency.
    pub perf: bool,
    /// Use the in-memory link instead of UDP (deterministic; for tests).
    pub in_memory: bool,
    /// Run the fixed scenarios (off: only the soak and the measurements).
    pub scenarios: bool,
    /// Open the first two devices of this inline device list (`BLUERDMA_DEVICES` syntax)
    /// instead of two emulated NICs.
    pub devices: Option<String>,
    /// How much data the scenarios and measurements move.
    pub scale: Scale,
}

/// How much data the scenarios move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scale {
    /// Up to 16 MiB per WRITE, 64 QPs at once, 1 MiB bandwidth writes.
    #[default]
    Full,
    /// Up to 1 MiB per request, 8 QPs, 64 KiB bandwidth writes: for backends whose DMA
    /// moves a few MB/s (the RTL simulator's sockets).
    Small,
}

impl Scale {
    /// The largest WRITE, SEND and READ, in bytes.
    fn max_request(self) -> u32 {
        match self {
            Scale::Full => 16 << 20,
            Scale::Small => 1 << 20,
        }
    }

    /// QPs of the many-QP scenario.
    fn qps(self) -> usize {
        match self {
            Scale::Full => 64,
            Scale::Small => 8,
        }
    }
}

/// The soak's seed when neither `--seed` nor the fault specification names one.
pub const DEFAULT_SEED: u64 = 1;

impl Options {
    /// The options of `cargo run -p bluerdma-linux --example sim -- [--port P] [--faults SPEC]
    /// [--seed N] [--soak SECS] [--no-perf] [--in-memory] [--devices LIST] [--small]`;
    /// `env_faults` is the value of
    /// `BLUERDMA_LINK_FAULTS` (a `--faults` wins over it).
    ///
    /// The seed a user names is the seed that runs: `--seed N` is the seed of blue0's fault
    /// decisions (it replaces SPEC's `seed=`) and of the soak; without it SPEC's seed (0 when
    /// SPEC names none) is both; with neither a SPEC nor `--seed` the soak uses
    /// [`DEFAULT_SEED`]. blue1's fault seed is derived from blue0's ([`run`]).
    pub fn from_args(
        args: impl IntoIterator<Item = String>,
        env_faults: Option<&str>,
    ) -> Result<Options, String> {
        let parse_faults = |spec: &str, from: &str| {
            spec.parse::<FaultConfig>()
                .map_err(|e| format!("{from}: {e}"))
        };
        let mut o = Options {
            port: 4792,
            faults: env_faults
                .map(|s| parse_faults(s, "BLUERDMA_LINK_FAULTS"))
                .transpose()?,
            soak: None,
            seed: DEFAULT_SEED,
            perf: true,
            in_memory: false,
            scenarios: true,
            devices: None,
            scale: Scale::Full,
        };
        let mut seed: Option<u64> = None;
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match a.as_str() {
                "--port" => {
                    o.port = value("--port")?
                        .parse()
                        .map_err(|_| "--port: not a port".to_string())?
                }
                "--faults" => o.faults = Some(parse_faults(&value("--faults")?, "--faults")?),
                "--seed" => {
                    let v = value("--seed")?;
                    let parsed = match v.strip_prefix("0x") {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => v.parse(),
                    };
                    seed = Some(parsed.map_err(|_| format!("--seed {v}: not a u64"))?);
                }
                "--soak" => {
                    o.soak = Some(Duration::from_secs(
                        value("--soak")?
                            .parse()
                            .map_err(|_| "--soak: seconds".to_string())?,
                    ))
                }
                "--no-perf" => o.perf = false,
                "--in-memory" => o.in_memory = true,
                "--devices" => o.devices = Some(value("--devices")?),
                "--small" => o.scale = Scale::Small,
                other => return Err(format!("unknown option {other}")),
            }
        }
        match (seed, o.faults.as_mut()) {
            (Some(s), Some(f)) => {
                f.seed = s;
                o.seed = s;
            }
            (Some(s), None) => o.seed = s,
            (None, Some(f)) => o.seed = f.seed,
            (None, None) => {}
        }
        Ok(o)
    }
}

/// One row of the summary.
#[derive(Clone, Debug)]
pub struct Row {
    /// Scenario name.
    pub name: String,
    /// Passed?
    pub ok: bool,
    /// Wall time.
    pub time: Duration,
    /// What was checked or measured, or why it failed.
    pub notes: String,
}

struct Pair {
    a: Context,
    b: Context,
}

/// The link of a device at `ip`, as devices get theirs ([`device_link`]): the shared-memory
/// link to cards of this host over UDP unless `BLUERDMA_LINK_SHM` turns it off
/// ([`link_name`]), the faults (if any, their seed salted per device) in front of it.
fn link(ip: Ipv4Addr, opts: &Options, salt: u64) -> Result<Box<dyn LinkPort>, String> {
    let link_opts = DeviceLinkOptions {
        port: Some(opts.port),
        faults: opts.faults.map(|mut f| {
            f.seed ^= salt;
            f
        }),
        capture: None,
        shm: ShmConfig::from_env(),
    };
    device_link(ip, &link_opts).map_err(|e| e.to_string())
}

/// The link the devices of a run without a device list get: `shared memory over UDP`, or
/// `UDP` when `BLUERDMA_LINK_SHM` turns the shared memory off.
pub fn link_name() -> &'static str {
    if ShmConfig::from_env().is_some() {
        "shared-memory link (over UDP)"
    } else {
        "UDP link"
    }
}

/// The OOB port of a run: 60000 by the spec on the default link port, else one derived
/// from the link port so that a test run does not need the well-known port.
fn oob_port(opts: &Options) -> u16 {
    if opts.port == 4792 {
        crate::oob::OOB_PORT
    } else {
        opts.port.wrapping_add(55_209)
    }
}

/// The first two devices of an inline device list, opened on their backends.
fn listed_pair(text: &str, opts: &Options) -> Result<Pair, String> {
    let list = crate::devices::DeviceList::parse_inline(text).map_err(|e| e.to_string())?;
    let mut settings = crate::devices::Settings::from_vars(&|_| None)?;
    settings.oob_port = oob_port(opts);
    let open = |i: usize| -> Result<Context, String> {
        let e = list
            .entries()
            .get(i)
            .ok_or_else(|| format!("the device list `{text}` has fewer than two devices"))?;
        crate::devices::open(&list, e, e.spec(), &settings).map_err(|e| e.to_string())
    };
    Ok(Pair {
        a: open(0)?,
        b: open(1)?,
    })
}

fn pair(opts: &Options) -> Result<Pair, String> {
    if let Some(text) = &opts.devices {
        return listed_pair(text, opts);
    }
    let (la, lb) = if opts.in_memory {
        let hub = bluerdma_sim::link::MemHub::new();
        let mem = |ip, salt: u64| -> Result<Box<dyn LinkPort>, String> {
            let port = hub.attach(ip).map_err(|e| e.to_string())?;
            Ok(match opts.faults {
                Some(mut f) => {
                    f.seed ^= salt;
                    Box::new(FaultyLink::new(port, f).map_err(|e| format!("faults: {e}"))?)
                }
                None => Box::new(port),
            })
        };
        (mem(IP0, 0)?, mem(IP1, 0x5EED)?)
    } else {
        (link(IP0, opts, 0)?, link(IP1, opts, 0x5EED)?)
    };
    // The out-of-band channel for SEND/RECV: TCP on the device IPs (port 60000 by the spec;
    // `opts.port + 55209` so a test run does not need the well-known port), or the in-process
    // hub with the in-memory link.
    // The TCP channel's records arrive on its own thread: its notifiers wake each device's
    // progress thread (as `devices::open` does), or a record waits for the next wake-up.
    type Oob = Box<dyn bluerdma_core::platform::OobTransport + Send>;
    let (oa, ob, notifiers): (Oob, Oob, Option<[crate::oob::OobNotifier; 2]>) = if opts.in_memory {
        let hub = crate::oob_hub::OobHub::new();
        (Box::new(hub.attach(IP0)), Box::new(hub.attach(IP1)), None)
    } else {
        let port = oob_port(opts);
        let tcp = |ip| {
            let mut cfg = crate::oob::TcpOobConfig::new(ip);
            cfg.port = port;
            crate::oob::TcpOob::bind(cfg).map_err(|e| e.to_string())
        };
        let (ta, tb) = (tcp(IP0)?, tcp(IP1)?);
        let n = [ta.notifier(), tb.notifier()];
        (Box::new(ta), Box::new(tb), Some(n))
    };
    let a = Context::open_emulated_with_oob(DeviceSpec::new("blue0", IP0), la, Some(oa))
        .map_err(|e| e.to_string())?;
    let b = Context::open_emulated_with_oob(DeviceSpec::new("blue1", IP1), lb, Some(ob))
        .map_err(|e| e.to_string())?;
    if let Some([na, nb]) = notifiers {
        na.set(a.waker());
        nb.set(b.waker());
    }
    Ok(Pair { a, b })
}

struct Conn {
    pd_a: Pd,
    pd_b: Pd,
    cq_a: Cq,
    cq_b: Cq,
    qps: Vec<(Qp, Qp)>,
}

fn connect(p: &Pair, n: usize, timeout: u8, retries: u8) -> Result<Conn, String> {
    let e = |x: crate::Error| x.to_string();
    let (pd_a, pd_b) = (p.a.alloc_pd().map_err(e)?, p.b.alloc_pd().map_err(e)?);
    let (cq_a, cq_b) = (p.a.create_cq().map_err(e)?, p.b.create_cq().map_err(e)?);
    let mut qps = Vec::new();
    for k in 0..n {
        let qa = pd_a.create_qp(&cq_a, &cq_a).map_err(e)?;
        let qb = pd_b.create_qp(&cq_b, &cq_b).map_err(e)?;
        let (pa, pb) = (k as u32 * 7 % 100, k as u32 * 13 % 100);
        qa.connect(qb.endpoint(pb), pa, timeout, retries)
            .map_err(e)?;
        qb.connect(qa.endpoint(pa), pb, timeout, retries)
            .map_err(e)?;
        qps.push((qa, qb));
    }
    Ok(Conn {
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qps,
    })
}

fn fill(mr: &mut Mr, seed: u64) {
    let mut x = seed | 1;
    for b in mr.bytes_mut().unwrap_or(&mut []) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn wr(wr_id: u64, op: SendOp, src: &Mr, soff: u64, len: u32, dst: &Mr, doff: u64) -> SendWr {
    SendWr {
        wr_id,
        op,
        laddr: VirtAddr(src.addr() + soff),
        len,
        lkey: src.key(),
        raddr: VirtAddr(dst.addr() + doff),
        rkey: dst.key(),
        signaled: true,
        solicited: false,
    }
}

fn wait_one(cq: &Cq, what: &str) -> Result<WorkCompletion, String> {
    let got = cq
        .wait(1, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    got.first()
        .copied()
        .ok_or_else(|| format!("{what}: no completion within 30 s"))
}

fn compare(what: &str, expected: &[u8], actual: &[u8]) -> Result<(), String> {
    match hex_diff(expected, actual, 4) {
        None => Ok(()),
        Some(d) => Err(format!("{what}: bytes differ\n{d}")),
    }
}

fn scenario_writes(p: &Pair, scale: Scale) -> Result<String, String> {
    let c = connect(p, 1, 14, 7)?;
    let size = scale.max_request() as usize;
    let mut src = c.pd_a.alloc_mr(size + 64, ALL).map_err(|e| e.to_string())?;
    fill(&mut src, 1);
    let dst = c.pd_b.alloc_mr(size + 64, ALL).map_err(|e| e.to_string())?;
    let (qa, _) = &c.qps[0];
    let cases = [
        (0u64, 1u32, 0u64),
        (1, 4096, 3),
        (0, 65539, 5),
        (7, (1 << 20).min(size as u32 - 7), 1),
        (0, size as u32, 0),
    ];
    for (k, &(so, len, doff)) in cases.iter().enumerate() {
        // SAFETY: both MRs outlive the completion waited for below.
        unsafe { qa.post_send(&[wr(k as u64, SendOp::Write, &src, so, len, &dst, doff)]) }
            .map_err(|(_, e)| e.to_string())?;
        let w = wait_one(&c.cq_a, "WRITE")?;
        if w.status != WcStatus::Success || w.wr_id != k as u64 {
            return Err(format!(
                "WRITE {len} B: completion {w:?}\n{}\n{}",
                p.a.dump(),
                p.b.dump()
            ));
        }
        let s = &src.bytes().unwrap_or(&[])[so as usize..so as usize + len as usize];
        let d = &dst.bytes().unwrap_or(&[])[doff as usize..doff as usize + len as usize];
        compare(&format!("WRITE {len} B"), s, d)?;
    }
    Ok(format!(
        "1 B, 4 KiB, 64 KiB + 3, 1 MiB, {} MiB at unaligned offsets: bytes intact",
        size >> 20
    ))
}

fn scenario_imm(p: &Pair, _: Scale) -> Result<String, String> {
    let c = connect(p, 1, 14, 7)?;
    let mut src = c.pd_a.alloc_mr(1 << 20, ALL).map_err(|e| e.to_string())?;
    fill(&mut src, 2);
    let dst = c.pd_b.alloc_mr(1 << 20, ALL).map_err(|e| e.to_string())?;
    let (qa, qb) = &c.qps[0];
    for (k, len) in [0u32, 1, 4096, 1 << 20].into_iter().enumerate() {
        let r = RecvWr {
            wr_id: 100 + k as u64,
            addr: VirtAddr(0),
            len: 0,
            lkey: dst.key(),
        };
        // SAFETY: a receive without a buffer.
        unsafe { qb.post_recv(&[r]) }.map_err(|(_, e)| e.to_string())?;
        let imm = 0xC0DE_0000 + k as u32;
        // SAFETY: both MRs outlive the completion.
        unsafe {
            qa.post_send(&[wr(
                k as u64,
                SendOp::WriteWithImm(imm),
                &src,
                0,
                len,
                &dst,
                0,
            )])
        }
        .map_err(|(_, e)| e.to_string())?;
        let w = wait_one(&c.cq_a, "WRITE_WITH_IMM")?;
        let r = wait_one(&c.cq_b, "RECV_RDMA_WITH_IMM")?;
        if w.status != WcStatus::Success || r.status != WcStatus::Success {
            return Err(format!("{len} B: {w:?} / {r:?}"));
        }
        if r.opcode != WcOpcode::RecvRdmaWithImm
            || r.imm_data != imm
            || r.byte_len != len
            || r.wr_id != 100 + k as u64
        {
            return Err(format!("{len} B: receive completion {r:?}"));
        }
        compare(
            &format!("WRITE_WITH_IMM {len} B"),
            &src.bytes().unwrap_or(&[])[..len as usize],
            &dst.bytes().unwrap_or(&[])[..len as usize],
        )?;
    }
    Ok("0 B, 1 B, 4 KiB, 1 MiB: imm, byte_len and wr_id in the receive completion".into())
}

fn scenario_send(p: &Pair, scale: Scale) -> Result<String, String> {
    let c = connect(p, 1, 14, 7)?;
    let big = scale.max_request().min(4 << 20);
    let mut src = c
        .pd_a
        .alloc_mr(big as usize, ALL)
        .map_err(|e| e.to_string())?;
    fill(&mut src, 5);
    let dst = c
        .pd_b
        .alloc_mr(big as usize, ALL)
        .map_err(|e| e.to_string())?;
    let (qa, qb) = &c.qps[0];
    for (k, len) in [0u32, 1, 4096, 65_537, big].into_iter().enumerate() {
        let r = RecvWr {
            wr_id: 50 + k as u64,
            addr: VirtAddr(dst.addr()),
            len: big,
            lkey: dst.key(),
        };
        // SAFETY: the MR outlives the completion.
        unsafe { qb.post_recv(&[r]) }.map_err(|(_, e)| e.to_string())?;
        let op = if k % 2 == 0 {
            SendOp::Send
        } else {
            SendOp::SendWithImm(k as u32)
        };
        let mut w = wr(k as u64, op, &src, 0, len, &dst, 0);
        w.raddr = VirtAddr(0);
        // SAFETY: both MRs outlive the completion.
        unsafe { qa.post_send(&[w]) }.map_err(|(_, e)| e.to_string())?;
        let s = wait_one(&c.cq_a, "SEND")?;
        let r = wait_one(&c.cq_b, "RECV")?;
        if s.status != WcStatus::Success
            || r.status != WcStatus::Success
            || r.byte_len != len
            || r.opcode != WcOpcode::Recv
        {
            return Err(format!("{len} B: {s:?} / {r:?}"));
        }
        compare(
            &format!("SEND {len} B"),
            &src.bytes().unwrap_or(&[])[..len as usize],
            &dst.bytes().unwrap_or(&[])[..len as usize],
        )?;
    }
    Ok(format!(
        "0 B, 1 B, 4 KiB, 64 KiB + 1, {} MiB into announced receive buffers: byte_len and bytes",
        big >> 20
    ))
}

fn scenario_read(p: &Pair, scale: Scale) -> Result<String, String> {
    let c = connect(p, 1, 14, 7)?;
    let len = scale.max_request().min(3 << 20) + 17;
    let sink = c
        .pd_a
        .alloc_mr(len as usize + 16, ALL)
        .map_err(|e| e.to_string())?;
    let mut source = c
        .pd_b
        .alloc_mr(len as usize + 16, ALL)
        .map_err(|e| e.to_string())?;
    fill(&mut source, 3);
    let (qa, _) = &c.qps[0];
    // SAFETY: both MRs outlive the completion.
    unsafe { qa.post_send(&[wr(9, SendOp::Read, &sink, 5, len, &source, 11)]) }
        .map_err(|(_, e)| e.to_string())?;
    let w = wait_one(&c.cq_a, "READ")?;
    if w.status != WcStatus::Success || w.opcode != WcOpcode::RdmaRead {
        return Err(format!("READ: {w:?}"));
    }
    compare(
        "READ",
        &source.bytes().unwrap_or(&[])[11..11 + len as usize],
        &sink.bytes().unwrap_or(&[])[5..5 + len as usize],
    )?;
    Ok(format!("{len} B at unaligned offsets: bytes intact"))
}

fn scenario_multi_qp(p: &Pair, scale: Scale) -> Result<String, String> {
    let n = scale.qps();
    let c = connect(p, n, 14, 7)?;
    let len = 64 * 1024;
    let mut src = c.pd_a.alloc_mr(n * len, ALL).map_err(|e| e.to_string())?;
    fill(&mut src, 4);
    let dst = c.pd_b.alloc_mr(n * len, ALL).map_err(|e| e.to_string())?;
    for (k, (qa, _)) in c.qps.iter().enumerate() {
        let off = (k * len) as u64;
        // SAFETY: both MRs outlive the completions.
        unsafe {
            qa.post_send(&[wr(
                k as u64,
                SendOp::Write,
                &src,
                off,
                len as u32,
                &dst,
                off,
            )])
        }
        .map_err(|(_, e)| e.to_string())?;
    }
    let got = c
        .cq_a
        .wait(n, Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    if got.len() != n || got.iter().any(|w| w.status != WcStatus::Success) {
        return Err(format!(
            "{} of {n} completions, errors: {:?}\n{}\n{}",
            got.len(),
            got.iter()
                .filter(|w| w.status != WcStatus::Success)
                .collect::<Vec<_>>(),
            p.a.dump(),
            p.b.dump()
        ));
    }
    compare(
        "64 QPs",
        src.bytes().unwrap_or(&[]),
        dst.bytes().unwrap_or(&[]),
    )?;
    Ok(format!("{n} QP pairs, 64 KiB each at once: bytes intact"))
}

fn scenario_bad_rkey(p: &Pair, _: Scale) -> Result<String, String> {
    let c = connect(p, 1, 10, 2)?;
    let src = c.pd_a.alloc_mr(4096, ALL).map_err(|e| e.to_string())?;
    let dst = c.pd_b.alloc_mr(4096, ALL).map_err(|e| e.to_string())?;
    let (qa, _) = &c.qps[0];
    let mut w = wr(1, SendOp::Write, &src, 0, 4096, &dst, 0);
    w.rkey = bluerdma_core::keys::MrKey::from_raw(dst.key().get() ^ 0x1);
    let start = Instant::now();
    // SAFETY: both MRs outlive the completion.
    unsafe { qa.post_send(&[w]) }.map_err(|(_, e)| e.to_string())?;
    let w = wait_one(&c.cq_a, "bad rkey")?;
    // The card drops the refused packets without a NAK: after the first timeout the
    // requester asks the responder's driver over the out-of-band channel (REM_ACCESS_ERR);
    // with no channel the retries run out (RETRY_EXC_ERR).
    let how = match w.status {
        WcStatus::RemAccessErr => "REM_ACCESS_ERR (the responder's driver refused the rkey)",
        WcStatus::RetryExcErr => "RETRY_EXC_ERR (3 tries of timeout 10 = 4.2 ms, or the floor)",
        _ => {
            return Err(format!(
                "expected REM_ACCESS_ERR or RETRY_EXC_ERR, got {w:?}"
            ))
        }
    };
    if dst.bytes().unwrap_or(&[]).iter().any(|x| *x != 0) {
        return Err("bytes were written through a bad rkey".into());
    }
    Ok(format!(
        "{how} after {:.0} ms, nothing written",
        start.elapsed().as_secs_f64() * 1e3
    ))
}

/// Random WRITEs, READs and WRITE_WITH_IMMs on 64 QPs for `time`, every byte checked.
fn soak(p: &Pair, time: Duration, seed: u64) -> Result<String, String> {
    let n = 64;
    // Timeout 17 (0.5 s): generous, because the CI soak runs unoptimised on two shared cores.
    let c = connect(p, n, 17, 7)?;
    let slot = 256 * 1024;
    // Each QP cycles through ROTATION regions, so a region is rewritten only several rounds
    // after its last use: this card writes late duplicates (a reordered frame whose
    // retransmission already completed the request) because it does not check PSNs, and
    // a late duplicate must not land on data of a newer round (see the README's hardware
    // limitations).
    const ROTATION: usize = 4;
    let mut a_mem = c
        .pd_a
        .alloc_mr(n * slot * ROTATION, ALL)
        .map_err(|e| e.to_string())?;
    let mut b_mem = c
        .pd_b
        .alloc_mr(n * slot * ROTATION, ALL)
        .map_err(|e| e.to_string())?;
    let mut round = 0usize;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ops, mut bytes) = (0u64, 0u64);
    let end = Instant::now() + time;
    while Instant::now() < end {
        // One operation per QP per round, all in flight together.
        let mut expect = Vec::with_capacity(n);
        round += 1;
        for (k, (qa, qb)) in c.qps.iter().enumerate() {
            let base = ((k * ROTATION + round % ROTATION) * slot) as u64;
            let len = (rnd() % (slot as u64 - 8)) as u32 + 1;
            let off = rnd() % (slot as u64 - len as u64);
            let kind = rnd() % 3;
            let (op, src_is_a) = match kind {
                0 => (SendOp::Write, true),
                1 => (SendOp::Read, false),
                _ => (SendOp::WriteWithImm(k as u32), true),
            };
            // Fresh data at the source range.
            let fillv = rnd() as u8;
            let src = if src_is_a { &mut a_mem } else { &mut b_mem };
            for (i, b) in src.bytes_mut().unwrap_or(&mut [])
                [(base + off) as usize..(base + off) as usize + len as usize]
                .iter_mut()
                .enumerate()
            {
                *b = fillv.wrapping_add(i as u8);
            }
            if matches!(op, SendOp::WriteWithImm(_)) {
                let r = RecvWr {
                    wr_id: k as u64,
                    addr: VirtAddr(0),
                    len: 0,
                    lkey: b_mem.key(),
                };
                // SAFETY: a receive without a buffer.
                unsafe { qb.post_recv(&[r]) }.map_err(|(_, e)| e.to_string())?;
            }
            // WRITEs go from blue0's memory to blue1's, READs fetch blue1's into blue0's:
            // the same work-request fields either way.
            let w = wr(k as u64, op, &a_mem, base + off, len, &b_mem, base + off);
            // SAFETY: both MRs outlive the completions waited for below.
            unsafe { qa.post_send(&[w]) }.map_err(|(_, e)| e.to_string())?;
            expect.push((k, base + off, len, kind));
        }
        let got = c
            .cq_a
            .wait(n, Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        if got.len() != n {
            return Err(format!(
                "round after {ops} ops: {} of {n} completions\n{}",
                got.len(),
                p.a.dump()
            ));
        }
        if let Some(bad) = got.iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("after {ops} ops: {bad:?}\n{}", p.a.dump()));
        }
        let imms = expect.iter().filter(|e| e.3 == 2).count();
        let recv = c
            .cq_b
            .wait(imms, Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        if recv.len() != imms {
            return Err(format!("{} of {imms} receive completions", recv.len()));
        }
        for &(k, off, len, kind) in &expect {
            let (s, d) = (off as usize, off as usize + len as usize);
            let (a, b) = (
                &a_mem.bytes().unwrap_or(&[])[s..d],
                &b_mem.bytes().unwrap_or(&[])[s..d],
            );
            let what = ["WRITE", "READ", "WRITE_WITH_IMM"][kind as usize];
            compare(
                &format!("QP {k} {what} {len} B at {off:#x}"),
                if kind == 1 { b } else { a },
                if kind == 1 { a } else { b },
            )
            .map_err(|e| {
                format!(
                    "{e}engine a {:?}\nengine b {:?}\ncard a {}\ncard b {}",
                    p.a.stats(),
                    p.b.stats(),
                    p.a.card_stats(),
                    p.b.card_stats()
                )
            })?;
            ops += 1;
            bytes += len as u64;
        }
    }
    Ok(format!(
        "{ops} operations, {:.1} MiB on {n} QPs, every byte verified; retransmissions {}",
        bytes as f64 / (1 << 20) as f64,
        p.a.stats().retransmits + p.b.stats().retransmits
    ))
}

fn perf_rows(p: &Pair, scale: Scale, rows: &mut Vec<Row>) {
    let c = match connect(p, 1, 16, 7) {
        Ok(c) => c,
        Err(e) => {
            rows.push(Row {
                name: "perf".into(),
                ok: false,
                time: Duration::ZERO,
                notes: e,
            });
            return;
        }
    };
    let (qa, qb) = c.qps.into_iter().next().expect("one QP pair");
    let a = perf::Side {
        pd: c.pd_a,
        cq: c.cq_a,
        qp: qa,
    };
    let b = perf::Side {
        pd: c.pd_b,
        cq: c.cq_b,
        qp: qb,
    };
    // Small: a few MB/s through the RTL protocol's DMA socket, so fewer and smaller.
    let (bw_len, depth, secs, iters) = match scale {
        Scale::Full => (1u32 << 20, 8, 1.0, 1_000),
        Scale::Small => (64 << 10, 4, 2.0, 100),
    };
    let t = Instant::now();
    let bw = perf::write_bw(&a, &b, bw_len, depth, secs);
    let tcp = perf::tcp_stream_gbps(1.0);
    rows.push(Row {
        name: format!("WRITE {} KiB bandwidth", bw_len >> 10),
        ok: true,
        time: t.elapsed(),
        notes: format!(
            "{bw:.2} Gbit/s vs TCP loopback {tcp:.2} Gbit/s = {:.2}x",
            bw / tcp
        ),
    });
    let t = Instant::now();
    let (sa, sb) = perf::fresh_pair(&p.a, &p.b);
    let rate = perf::send_rate(&sa, &sb, 64, secs);
    let tcp = perf::tcp_message_rate(64, 1.0);
    rows.push(Row {
        name: "SEND 64 B message rate".into(),
        ok: true,
        time: t.elapsed(),
        notes: format!(
            "{:.0} k/s vs TCP 64 B messages {:.0} k/s = {:.2}x",
            rate / 1e3,
            tcp / 1e3,
            rate / tcp
        ),
    });
    let t = Instant::now();
    let (sa, sb) = perf::fresh_pair(&p.a, &p.b);
    let lat = perf::send_latency(&sa, &sb, iters);
    let tcp = perf::tcp_pingpong_us(1_000);
    rows.push(Row {
        name: "8 B SEND latency".into(),
        ok: true,
        time: t.elapsed(),
        notes: format!(
            "{lat:.1} us vs TCP ping-pong {tcp:.1} us (half RTT) = {:.2}x",
            lat / tcp
        ),
    });
    let t = Instant::now();
    let lat = perf::write_latency(&a, &b, 2 * iters);
    let tcp = perf::tcp_pingpong_us(2_000);
    rows.push(Row {
        name: "8 B WRITE latency".into(),
        ok: true,
        time: t.elapsed(),
        notes: format!(
            "{lat:.1} us vs TCP ping-pong {tcp:.1} us (half RTT) = {:.2}x",
            lat / tcp
        ),
    });
}

/// Runs every scenario; `progress` is called with each row as it completes.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&Row)) -> Result<Vec<Row>, String> {
    let p = pair(opts)?;
    let scale = opts.scale;
    type Scenario = fn(&Pair, Scale) -> Result<String, String>;
    let max = scale.max_request() >> 20;
    let table: [(String, Scenario); 6] = [
        (format!("verbs WRITE 1 B .. {max} MiB"), scenario_writes),
        ("verbs WRITE_WITH_IMM".into(), scenario_imm),
        ("verbs SEND/RECV over the OOB channel".into(), scenario_send),
        (format!("verbs READ {} MiB", max.min(3)), scenario_read),
        (
            format!("verbs {} QPs at once", scale.qps()),
            scenario_multi_qp,
        ),
        ("verbs bad rkey -> REM_ACCESS_ERR".into(), scenario_bad_rkey),
    ];
    let mut rows = Vec::new();
    for (name, f) in table.into_iter().filter(|_| opts.scenarios) {
        let t = Instant::now();
        let r = f(&p, scale);
        let row = Row {
            name,
            ok: r.is_ok(),
            time: t.elapsed(),
            notes: r.unwrap_or_else(|e| e),
        };
        progress(&row);
        rows.push(row);
    }
    if let Some(time) = opts.soak {
        let t = Instant::now();
        let r = soak(&p, time, opts.seed);
        let row = Row {
            name: format!("soak {} s, 64 QPs", time.as_secs()),
            ok: r.is_ok(),
            time: t.elapsed(),
            notes: r.unwrap_or_else(|e| e),
        };
        progress(&row);
        rows.push(row);
    }
    if opts.perf && opts.faults.is_none() {
        let before = rows.len();
        perf_rows(&p, scale, &mut rows);
        for r in &rows[before..] {
            progress(r);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str], env: Option<&str>) -> Result<Options, String> {
        Options::from_args(args.iter().map(|s| s.to_string()), env)
    }

    #[test]
    fn the_seed_a_user_names_is_the_seed_that_runs() {
        // The spec's seed alone: the faults and the soak run seed 1 (not 1 ^ 1 = 0).
        let o = opts(&["--faults", "drop=0.05,seed=1"], None).unwrap();
        assert_eq!(o.faults.map(|f| f.seed), Some(1));
        assert_eq!(o.seed, 1);
        let o = opts(&["--faults", "drop=0.05,seed=0x2a"], None).unwrap();
        assert_eq!((o.faults.unwrap().seed, o.seed), (42, 42));
        // --seed wins over the spec's, in either order, for both.
        for args in [
            &["--seed", "7", "--faults", "drop=0.05,seed=1"][..],
            &["--faults", "drop=0.05,seed=1", "--seed", "7"][..],
        ] {
            let o = opts(args, None).unwrap();
            assert_eq!((o.faults.unwrap().seed, o.seed), (7, 7), "{args:?}");
        }
        // From the environment, as from --faults.
        let o = opts(&[], Some("dup=0.1,seed=5")).unwrap();
        assert_eq!((o.faults.unwrap().seed, o.seed), (5, 5));
        // A spec without a seed runs seed 0 (FaultConfig's default); no spec, DEFAULT_SEED.
        let o = opts(&["--faults", "drop=0.1"], None).unwrap();
        assert_eq!((o.faults.unwrap().seed, o.seed), (0, 0));
        assert_eq!(opts(&[], None).unwrap().seed, DEFAULT_SEED);
        let o = opts(&["--seed", "9"], None).unwrap();
        assert_eq!((o.faults.is_none(), o.seed), (true, 9));
    }

    #[test]
    fn bad_options_are_named() {
        assert!(opts(&["--seed"], None)
            .unwrap_err()
            .contains("--seed needs a value"));
        assert!(opts(&["--seed", "-1"], None)
            .unwrap_err()
            .contains("not a u64"));
        assert!(opts(&["--faults", "drop=2"], None)
            .unwrap_err()
            .contains("--faults"));
        assert!(opts(&[], Some("loss=1"))
            .unwrap_err()
            .contains("BLUERDMA_LINK_FAULTS"));
        assert!(opts(&["--bogus"], None).unwrap_err().contains("--bogus"));
        let o = opts(&["--port", "5000", "--soak", "3", "--no-perf"], None).unwrap();
        assert_eq!(
            (o.port, o.soak, o.perf),
            (5000, Some(Duration::from_secs(3)), false)
        );
    }
}
