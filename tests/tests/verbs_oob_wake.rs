//! An out-of-band record wakes a responder whose application does not poll: devices opened
//! as the libibverbs stand-in opens them (`devices::open`, which hands the channel the
//! device's waker), fetch-and-adds from `a` to `b` after pauses long enough for `b`'s
//! progress thread to sleep in its inline card's link. The waker used to signal only the
//! condition variable of the threaded card's wait, so each request waited in `b` for the
//! sleep's cap (200 ms) and `a`'s retransmission timer (67 ms) fired with nothing lost:
//! `ib_atomic_bw` ran at 3,000-8,000 operations/s instead of 26,000-29,000.

use std::time::Duration;

use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, WcOpcode, WcStatus};
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::qp::{QpAccessFlags, QpAttrMask, QpState, RawQpAttr};
use bluerdma_tests::served::open_all;
use bluerdma_tests::{connect_pair, raw_wr, ALL};

/// Long enough for an idle progress thread to go from its spin to its sleep in the link.
const PAUSE: Duration = Duration::from_millis(20);
const ROUNDS: u64 = 12;

#[test]
fn an_atomic_request_wakes_a_responder_that_does_not_poll() {
    let devs = open_all("a=127.0.12.1,b=127.0.12.2");
    let (a, b) = (&devs[0], &devs[1]);
    // IB timeout 14 (67 ms), as perftest asks; 7 retries.
    let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
    let attr = RawQpAttr {
        qp_state: QpState::Rts.to_ibv(),
        qp_access_flags: QpAccessFlags::all().bits(),
        ..RawQpAttr::default()
    };
    sb.qp
        .modify(&attr, QpAttrMask::ACCESS_FLAGS)
        .expect("RTS -> RTS with REMOTE_ATOMIC");
    let sink = sa.pd.alloc_mr(8, ALL).unwrap();
    let target = sb
        .pd
        .alloc_mr(8, ALL.union(AccessFlags::REMOTE_ATOMIC))
        .unwrap();
    for k in 0..ROUNDS {
        std::thread::sleep(PAUSE);
        let wr = raw_wr(
            k,
            SendOp::Atomic(AtomicOp::FetchAdd { add: 1 }),
            (sink.addr(), sink.key()),
            8,
            (target.addr(), target.key()),
        );
        // SAFETY: both MRs outlive the completion waited for below.
        unsafe { sa.qp.post_send(&[wr]).expect("post the fetch-and-add") };
        let got = sa.cq.wait(1, Duration::from_secs(10)).unwrap();
        assert_eq!(got.len(), 1, "fetch-and-add {k}: no completion");
        assert_eq!(
            (got[0].status, got[0].opcode),
            (WcStatus::Success, WcOpcode::FetchAdd),
            "fetch-and-add {k}"
        );
        assert_eq!(value(&sink), k, "fetch-and-add {k} returned the old value");
    }
    assert_eq!(value(&target), ROUNDS, "each add applied once");
    let s = a.stats();
    assert_eq!(
        s.timeouts, 0,
        "the requester's timer fired with nothing lost: the responder slept through its \
         requests ({s:?})"
    );
}

/// The u64 an MR of 8 bytes holds, as the CPU reads it.
fn value(mr: &bluerdma_linux::Mr) -> u64 {
    let b = mr.bytes().expect("an owned buffer");
    u64::from_ne_bytes(b[..8].try_into().unwrap())
}
