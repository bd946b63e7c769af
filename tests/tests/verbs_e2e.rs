//! End to end on two emulated NICs in one process, through the verbs API: bytes arrive
//! intact, completions say what happened, errors name the problem.

use std::time::Duration;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::{SendOp, SendWr, WcOpcode, WcStatus};
use bluerdma_linux::{Context, DeviceSpec, Mr, Qp};
use bluerdma_sim::link::MemHub;
use bluerdma_tests::{connect_pair, two_devices, Side, ALL, IP0, IP1};

/// Connects a QP pair with the given IB `timeout` exponent and retry count.
fn connect_with(a: &Context, b: &Context, timeout: u8, retries: u8) -> (Side, Side) {
    connect_pair(a, b, (100, 500), timeout, retries)
}

/// A QP pair with the IB default-ish timeout (14: 67 ms) and 7 retries.
fn connect(a: &Context, b: &Context) -> (Side, Side) {
    connect_with(a, b, 14, 7)
}

fn write_wr(wr_id: u64, src: &Mr, off: usize, len: usize, dst: &Mr, roff: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write,
        laddr: VirtAddr(src.addr() + off as u64),
        len: len as u32,
        lkey: src.key(),
        raddr: VirtAddr(dst.addr() + roff as u64),
        rkey: dst.key(),
        signaled: true,
        solicited: false,
    }
}

#[test]
fn write_of_many_sizes_arrives_intact_and_completes_in_order() {
    let (a, b) = two_devices();
    let (sa, sb) = connect(&a, &b);
    let size = 1 << 20;
    let mut src = sa.pd.alloc_mr(size + 8, ALL).unwrap();
    for (i, x) in src.bytes_mut().unwrap().iter_mut().enumerate() {
        *x = (i * 131 + 7) as u8;
    }
    let dst = sb.pd.alloc_mr(size + 8, ALL).unwrap();
    let cases = [
        (0usize, 1usize, 0usize),
        (3, 4096, 5),
        (0, 4097, 0),
        (1, 65536 + 3, 7),
        (0, size, 0),
    ];
    for (k, &(off, len, roff)) in cases.iter().enumerate() {
        // SAFETY: both MRs outlive the completion we wait for.
        unsafe {
            sa.qp
                .post_send(&[write_wr(k as u64, &src, off, len, &dst, roff)])
                .unwrap()
        };
        let wc = sa.cq.wait(1, Duration::from_secs(10)).unwrap();
        assert_eq!(
            wc.len(),
            1,
            "case {k}: completion within 10 s; stats {:?}",
            a.stats()
        );
        assert_eq!(wc[0].wr_id, k as u64);
        assert_eq!(
            wc[0].status,
            WcStatus::Success,
            "case {k}: a {:?} b {:?} card b {}",
            a.stats(),
            b.stats(),
            b.card_stats()
        );
        assert_eq!(wc[0].opcode, WcOpcode::RdmaWrite);
        let s = &src.bytes().unwrap()[off..off + len];
        let d = &dst.bytes().unwrap()[roff..roff + len];
        assert!(s == d, "case {k}: {len} bytes at +{roff} differ");
    }
}

#[test]
fn chained_writes_complete_in_posting_order() {
    let (a, b) = two_devices();
    let (sa, sb) = connect(&a, &b);
    let src = sa.pd.alloc_mr(64 * 1024, ALL).unwrap();
    let dst = sb.pd.alloc_mr(64 * 1024, ALL).unwrap();
    let wrs: Vec<SendWr> = (0..16)
        .map(|k| write_wr(k, &src, k as usize * 4096, 4096, &dst, k as usize * 4096))
        .collect();
    // SAFETY: the MRs outlive the completions.
    unsafe { sa.qp.post_send(&wrs).unwrap() };
    let wc = sa.cq.wait(16, Duration::from_secs(10)).unwrap();
    let ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..16).collect::<Vec<_>>());
}

#[test]
fn read_fetches_the_remote_bytes() {
    let (a, b) = two_devices();
    let (sa, sb) = connect(&a, &b);
    let sink = sa.pd.alloc_mr(100_000, ALL).unwrap();
    let mut source = sb.pd.alloc_mr(100_000, ALL).unwrap();
    for (i, x) in source.bytes_mut().unwrap().iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let wr = SendWr {
        wr_id: 77,
        op: SendOp::Read,
        laddr: VirtAddr(sink.addr() + 10),
        len: 90_000,
        lkey: sink.key(),
        raddr: VirtAddr(source.addr() + 3),
        rkey: source.key(),
        signaled: true,
        solicited: false,
    };
    // SAFETY: the MRs outlive the completion.
    unsafe { sa.qp.post_send(&[wr]).unwrap() };
    let wc = sa.cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(
        wc.len(),
        1,
        "READ completes; stats {:?} / {:?}",
        a.stats(),
        b.stats()
    );
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (77, WcStatus::Success, WcOpcode::RdmaRead),
        "{}\n{}",
        a.dump(),
        b.dump()
    );
    assert!(sink.bytes().unwrap()[10..90_010] == source.bytes().unwrap()[3..90_003]);
}

#[test]
fn identical_reads_in_flight_are_each_answered() {
    // perftest's ib_read_bw: 16 READs of the same remote bytes into the same buffer at once.
    // The responder told a resent request from a new one by its addresses, so it answered
    // only the first: with retry_cnt 0 the others failed with RETRY_EXC_ERR.
    let (a, b) = two_devices();
    let (sa, sb) = connect_with(&a, &b, 14, 0);
    let sink = sa.pd.alloc_mr(65536, ALL).unwrap();
    let mut source = sb.pd.alloc_mr(65536, ALL).unwrap();
    for (i, x) in source.bytes_mut().unwrap().iter_mut().enumerate() {
        *x = (i % 253) as u8;
    }
    let wrs: Vec<SendWr> = (0..16)
        .map(|k| SendWr {
            wr_id: k,
            op: SendOp::Read,
            laddr: VirtAddr(sink.addr()),
            len: 65536,
            lkey: sink.key(),
            raddr: VirtAddr(source.addr()),
            rkey: source.key(),
            signaled: true,
            solicited: false,
        })
        .collect();
    // SAFETY: the MRs outlive the completions.
    unsafe { sa.qp.post_send(&wrs).unwrap() };
    let wc = sa.cq.wait(16, Duration::from_secs(10)).unwrap();
    let got: Vec<(u64, WcStatus)> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<(u64, WcStatus)> = (0..16).map(|k| (k, WcStatus::Success)).collect();
    assert_eq!(got, want, "{}\n{}", a.dump(), b.dump());
    assert!(sink.bytes().unwrap() == source.bytes().unwrap());
    assert_eq!(a.stats().timeouts, 0, "no READ waited for its timer");
}

#[test]
fn write_with_bad_rkey_fails_with_retry_exceeded_and_writes_nothing() {
    let (a, b) = two_devices();
    let (sa, sb) = connect_with(&a, &b, 10, 7);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    let dst = sb.pd.alloc_mr(4096, ALL).unwrap();
    let mut wr = write_wr(5, &src, 0, 4096, &dst, 0);
    wr.rkey = bluerdma_core::keys::MrKey::from_raw(dst.key().get() ^ 1);
    // timeout 10 = 4 ms, retry_cnt 7: RETRY_EXC_ERR within ~35 ms.
    // SAFETY: the MRs outlive the completion.
    unsafe {
        sa.qp
            .post_send(&[wr, write_wr(6, &src, 0, 8, &dst, 0)])
            .unwrap()
    };
    let wc = sa.cq.wait(2, Duration::from_secs(5)).unwrap();
    assert_eq!(wc.len(), 2);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::RetryExcErr));
    assert_eq!((wc[1].wr_id, wc[1].status), (6, WcStatus::WrFlushErr));
    assert!(
        dst.bytes().unwrap().iter().all(|x| *x == 0),
        "not one byte written"
    );
    assert_eq!(
        sa.qp.query().unwrap().state,
        bluerdma_core::qp::QpState::Err
    );
}

fn faulty_devices(spec: &str) -> (Context, Context) {
    use bluerdma_sim::link::{FaultConfig, FaultyLink};
    let hub = MemHub::new();
    let faults: FaultConfig = spec.parse().unwrap();
    let l0 = FaultyLink::new(hub.attach(IP0).unwrap(), faults).unwrap();
    let mut f1 = faults;
    f1.seed ^= 0x5555;
    let l1 = FaultyLink::new(hub.attach(IP1).unwrap(), f1).unwrap();
    let a = Context::open_emulated(DeviceSpec::new("blue0", IP0), Box::new(l0)).unwrap();
    let b = Context::open_emulated(DeviceSpec::new("blue1", IP1), Box::new(l1)).unwrap();
    (a, b)
}

#[test]
fn five_percent_loss_with_duplication_and_reordering_still_delivers_every_byte() {
    let (a, b) = faulty_devices("drop=0.05,dup=0.02,reorder=0.02,seed=7");
    let (sa, sb) = connect_with(&a, &b, 12, 7);
    let size = 4 << 20;
    let mut src = sa.pd.alloc_mr(size, ALL).unwrap();
    for (i, x) in src.bytes_mut().unwrap().iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1];
    }
    let dst = sb.pd.alloc_mr(size, ALL).unwrap();
    let chunk = 256 * 1024;
    let wrs: Vec<SendWr> = (0..size / chunk)
        .map(|k| write_wr(k as u64, &src, k * chunk, chunk, &dst, k * chunk))
        .collect();
    // SAFETY: the MRs outlive the completions.
    unsafe { sa.qp.post_send(&wrs).unwrap() };
    let wc = sa.cq.wait(wrs.len(), Duration::from_secs(60)).unwrap();
    assert_eq!(
        wc.len(),
        wrs.len(),
        "all complete; a {:?} b {:?}",
        a.stats(),
        b.stats()
    );
    for (k, w) in wc.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status),
            (k as u64, WcStatus::Success),
            "a {:?}",
            a.stats()
        );
    }
    assert!(
        src.bytes().unwrap() == dst.bytes().unwrap(),
        "every byte verified"
    );
    assert!(
        a.stats().retransmits > 0,
        "the loss was real: {:?}",
        a.stats()
    );
}

#[test]
fn peer_stopped_gives_retry_exceeded_within_the_configured_time() {
    let (a, b) = two_devices();
    let (sa, sb) = connect_with(&a, &b, 12, 3);
    let src = sa.pd.alloc_mr(4096, ALL).unwrap();
    let dst_key = sb.pd.alloc_mr(4096, ALL).unwrap();
    let wr = write_wr(9, &src, 0, 4096, &dst_key, 0);
    drop(sb);
    drop(dst_key);
    drop(b);
    let start = std::time::Instant::now();
    // SAFETY: `src` outlives the completion; the remote is gone, nothing is written there.
    unsafe { sa.qp.post_send(&[wr]).unwrap() };
    let wc = sa.cq.wait(1, Duration::from_secs(10)).unwrap();
    let took = start.elapsed();
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::RetryExcErr));
    // timeout 12 = 16.8 ms; 1 try + 3 retries = 4 timeouts = 67 ms.
    let expected = Duration::from_nanos(4096 << 12) * 4;
    assert!(
        took >= expected.mul_f32(0.9),
        "not before the configured time: {took:?}"
    );
    assert!(took < expected * 3, "and not long after: {took:?}");
}

#[test]
fn state_dump_shows_rings_qps_mrs_and_counters() {
    let (a, b) = two_devices();
    let (sa, sb) = connect(&a, &b);
    let src = sa.pd.alloc_mr(8192, ALL).unwrap();
    let dst = sb.pd.alloc_mr(8192, ALL).unwrap();
    // SAFETY: the MRs outlive the completion.
    unsafe {
        sa.qp
            .post_send(&[write_wr(1, &src, 0, 8192, &dst, 0)])
            .unwrap()
    };
    assert_eq!(sa.cq.wait(1, Duration::from_secs(10)).unwrap().len(), 1);
    let d = a.dump();
    assert!(
        d.contains(&format!("qp {:#08x} RTS", sa.qp.qpn().get())),
        "{d}"
    );
    assert!(d.contains(&format!("key {:#010x}", src.key().get())), "{d}");
    assert!(d.contains("send "), "{d}");
    assert!(d.contains("chunks: 1"), "{d}");
    assert!(d.contains("card: "), "{d}");
}

#[test]
fn verbs_objects_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Context>();
    check::<bluerdma_linux::Pd>();
    check::<Mr>();
    check::<bluerdma_linux::Cq>();
    check::<Qp>();
}
