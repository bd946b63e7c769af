//! RC WRITE and WRITE_WITH_IMM of 1 MiB..5 MiB (256..1280 packets at PMTU 4096, far more
//! than the card's 128-PSN receive window) over a link that drops frames: after every
//! completion, on either side, every byte of the target must hold the new data. A PSN
//! acknowledged before its packet was placed, or a late retransmission of an earlier WRITE
//! landing after its completion, shows up as a run of old bytes.

use std::io;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::{RecvWr, SendOp, WcOpcode, WcStatus};
use bluerdma_core::keys::MrKey;
use bluerdma_linux::{Context, DeviceSpec};
use bluerdma_sim::link::{FaultConfig, FaultyLink, FrameSender, LinkPort, LinkStats, MemHub};
use bluerdma_tests::{connect_pair, fill_pattern, pattern_mismatch, wr, ALL};

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);
/// The old contents of the target before each write.
const MARKER: u8 = 0x5A;

/// Drops received data frames (longer than 1000 bytes) in bursts, as a socket buffer that
/// overflows does: of every `period` data frames, frames `start..start + len` are lost. A
/// burst longer than the card's 128-PSN window makes it jump.
///
/// An overflow lasts a while, not forever: a burst is over `span` after its first lost
/// frame even if fewer than `len` frames came in that time. Without that, a burst that
/// starts within the last 17 packets of a message swallows every go-back-N retransmission
/// of that tail, one per ACK timeout, (1 + retry_cnt 7) × 17 < 140 frames however far
/// apart, and the WRITE rightly fails with RETRY_EXC_ERR: see
/// `a_burst_over_a_messages_tail_outlasting_every_retry_fails_the_write`.
struct BurstDrop<L> {
    inner: L,
    seen: u64,
    period: u64,
    start: u64,
    len: u64,
    span: Option<Duration>,
    /// When the burst under way lost its first frame.
    began: Option<Instant>,
}

impl<L: LinkPort> LinkPort for BurstDrop<L> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.inner.send_frames(frames)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let (seen, period, start, len) = (&mut self.seen, self.period, self.start, self.len);
        let (span, began) = (self.span, &mut self.began);
        self.inner.recv_frames(timeout, &mut |f: &[u8]| {
            if f.len() > 1000 {
                *seen += 1;
                let k = *seen % period;
                if k >= start && k < start + len {
                    let now = Instant::now();
                    let t0 = *began.get_or_insert(now);
                    if span.is_none_or(|s| now.duration_since(t0) <= s) {
                        return;
                    }
                    // The burst under way is over.
                    *seen += start + len - k;
                }
                *began = None;
            }
            on_frame(f)
        })
    }

    fn stats(&self) -> &LinkStats {
        self.inner.stats()
    }

    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        self.inner.sender()
    }
}

fn bursty_devices(period: u64, start: u64, len: u64, span: Option<Duration>) -> (Context, Context) {
    let hub = MemHub::new();
    let l0 = hub.attach(IP0).unwrap();
    let l1 = BurstDrop {
        inner: hub.attach(IP1).unwrap(),
        seen: 0,
        period,
        start,
        len,
        span,
        began: None,
    };
    let a = Context::open_emulated(DeviceSpec::new("blue0", IP0), Box::new(l0)).unwrap();
    let b = Context::open_emulated(DeviceSpec::new("blue1", IP1), Box::new(l1)).unwrap();
    (a, b)
}

fn lossy_devices(spec: &str) -> (Context, Context) {
    let hub = MemHub::new();
    let faults: FaultConfig = spec.parse().unwrap();
    let mut f1 = faults;
    f1.seed ^= 0x5555;
    let l0 = FaultyLink::new(hub.attach(IP0).unwrap(), faults).unwrap();
    let l1 = FaultyLink::new(hub.attach(IP1).unwrap(), f1).unwrap();
    let a = Context::open_emulated(DeviceSpec::new("blue0", IP0), Box::new(l0)).unwrap();
    let b = Context::open_emulated(DeviceSpec::new("blue1", IP1), Box::new(l1)).unwrap();
    (a, b)
}

/// Where the first 4 KiB run of `buf` that still holds the marker starts, if any.
fn first_unwritten_page(buf: &[u8]) -> Option<usize> {
    buf.chunks(4096)
        .position(|p| p.len() == 4096 && p.iter().all(|x| *x == MARKER))
        .map(|k| k * 4096)
}

/// Every byte of target `d` holds round `round`'s data at `who`'s completion.
fn check(what: &str, who: &str, d: &[u8], round: u32, (a, b): (&Context, &Context)) {
    assert_eq!(
        (
            first_unwritten_page(d),
            pattern_mismatch(d, round * 7 + 1, 0)
        ),
        (None, None),
        "{what}: data missing at the {who}'s completion; a {:?} b {:?} card b {}",
        a.stats(),
        b.stats(),
        b.card_stats()
    );
}

/// Rounds of large writes, each of new data over a target reset to the marker; checked
/// right at each completion (the writer's, and the receiver's for WRITE_WITH_IMM).
fn rounds(spec: &str, imm: bool) {
    let (a, b) = lossy_devices(spec);
    rounds_on(a, b, spec, imm)
}

fn rounds_on(a: Context, b: Context, spec: &str, imm: bool) {
    let (sa, sb) = connect_pair(&a, &b, (100, 500), 14, 7);
    let max = 5 * MIB;
    let mut src = sa.pd.alloc_mr(max, ALL).unwrap();
    let mut dst = sb.pd.alloc_mr(max, ALL).unwrap();
    for round in 0..10u32 {
        let len = (1 + round as usize % 5) * MIB;
        let what = format!("round {round}: {len} B, imm {imm}, faults {spec}");
        fill_pattern(&mut src.bytes_mut().unwrap()[..len], round * 7 + 1, 0);
        dst.bytes_mut().unwrap().fill(MARKER);
        if imm {
            let r = RecvWr {
                wr_id: 1000 + u64::from(round),
                addr: VirtAddr(0),
                len: 0,
                lkey: MrKey::from_raw(0),
            };
            // SAFETY: the receive has no buffer.
            unsafe { sb.qp.post_recv(&[r]).unwrap() };
        }
        let op = if imm {
            SendOp::WriteWithImm(round)
        } else {
            SendOp::Write
        };
        // SAFETY: both MRs outlive the completions waited for below.
        unsafe {
            sa.qp
                .post_send(&[wr(u64::from(round), op, &src, 0, len, &dst, 0)])
        }
        .unwrap_or_else(|e| {
            panic!(
                "{what}: post_send: {e:?}; completions {:?}; a {:?}\n{}",
                sa.cq.wait(4, Duration::from_millis(10)),
                a.stats(),
                a.dump()
            )
        });
        if imm {
            let rc = sb.cq.wait(1, WAIT).unwrap();
            assert_eq!(
                rc.len(),
                1,
                "{what}: receiver completion; the writer's: {:?}; a {:?} b {:?}",
                sa.cq.wait(1, Duration::from_millis(10)),
                a.stats(),
                b.stats()
            );
            assert_eq!(
                (rc[0].status, rc[0].opcode, rc[0].imm_data),
                (WcStatus::Success, WcOpcode::RecvRdmaWithImm, round),
                "{what}: receiver"
            );
            check(
                &what,
                "receiver",
                &dst.bytes().unwrap()[..len],
                round,
                (&a, &b),
            );
        }
        let wc = sa.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc.len(), 1, "{what}: writer completion; {:?}", a.stats());
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode),
            (u64::from(round), WcStatus::Success, WcOpcode::RdmaWrite),
            "{what}: writer; a {:?} b {:?}",
            a.stats(),
            b.stats()
        );
        check(
            &what,
            "writer",
            &dst.bytes().unwrap()[..len],
            round,
            (&a, &b),
        );
    }
}

#[test]
fn large_writes_under_loss_complete_only_once_every_byte_is_placed() {
    for seed in [1, 2, 3] {
        rounds(&format!("drop=0.01,seed={seed}"), false);
    }
}

#[test]
fn large_writes_with_imm_under_loss_complete_only_once_every_byte_is_placed() {
    for seed in [4, 5, 6] {
        rounds(&format!("drop=0.01,seed={seed}"), true);
    }
}

/// Bursts of 140 lost data frames in every 1000: the receiving card's window jumps past
/// whole strides, and the requester goes back N over them. A burst lasts at most 100 ms
/// ([`BurstDrop`]): a retransmission after one ACK timeout (67 ms) may still be lost in it,
/// the one after the second is not.
///
/// It was ignored as a liveness defect (about 2 runs in 5 ended in RETRY_EXC_ERR, or in a
/// missing receive completion while the writer was in RETRY_EXC_ERR): that was bursts
/// without an end in time eating every retransmission of a message's tail (see
/// [`BurstDrop`]). 20 runs in a row pass now.
#[test]
fn large_writes_under_burst_loss_complete_only_once_every_byte_is_placed() {
    for imm in [false, true] {
        let (a, b) = bursty_devices(1000, 300, 140, Some(SPAN));
        rounds_on(a, b, "bursts of 140 in 1000", imm);
    }
}

/// How long a burst of [`BurstDrop`] lasts at most.
const SPAN: Duration = Duration::from_millis(100);

/// One 1 MiB WRITE (256 packets) whose last 3 data frames, and the next 137, are lost:
/// its completion's status, and where the first unwritten page of the target starts.
fn write_with_lost_tail(span: Option<Duration>) -> (WcStatus, Option<usize>) {
    let (a, b) = bursty_devices(1000, 254, 140, span);
    let (sa, sb) = connect_pair(&a, &b, (100, 500), 14, 7);
    let mut src = sa.pd.alloc_mr(MIB, ALL).unwrap();
    let mut dst = sb.pd.alloc_mr(MIB, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), 1, 0);
    dst.bytes_mut().unwrap().fill(MARKER);
    // SAFETY: both MRs outlive the completion waited for below.
    unsafe {
        sa.qp
            .post_send(&[wr(1, SendOp::Write, &src, 0, MIB, &dst, 0)])
            .unwrap()
    };
    let wc = sa.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc.len(), 1, "writer completion; a {:?}", a.stats());
    (wc[0].status, first_unwritten_page(dst.bytes().unwrap()))
}

/// A link that loses every data frame the requester sends in 1 + retry_cnt ACK timeouts is
/// down: the WRITE fails with RETRY_EXC_ERR (IB go-back-N resends only from the oldest
/// unacknowledged PSN, here the message's last 3 packets, 8 × 3 frames in all), and the
/// lost pages stay unwritten. This is what the burst test saw about 2 runs in 5 before its
/// bursts had an end in time: a burst that began within a message's last 17 packets.
#[test]
fn a_burst_over_a_messages_tail_outlasting_every_retry_fails_the_write() {
    assert_eq!(
        write_with_lost_tail(None),
        (WcStatus::RetryExcErr, Some(253 * 4096))
    );
}

/// The same burst, over after 100 ms: a later retransmission gets through and the WRITE
/// completes with every byte placed.
#[test]
fn a_burst_over_a_messages_tail_that_ends_in_time_is_recovered() {
    assert_eq!(write_with_lost_tail(Some(SPAN)), (WcStatus::Success, None));
}
