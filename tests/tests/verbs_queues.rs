//! Queue sizes through the verbs API: a QP's queues and a CQ hold what their creator asked
//! for, a send request is refused while `max_send_wr` of them wait (until their completions
//! are polled), and a completion that finds its CQ full is never dropped silently: the CQ
//! raises CQ_ERR, its QPs go to ERR and raise QP_FATAL, and the completions that fitted
//! stay to be polled.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bluerdma_core::engine::{AsyncEvent, QpCaps, SendOp, VerbsError, WcStatus, WorkCompletion};
use bluerdma_core::qp::QpState;
use bluerdma_tests::{two_devices, wr, ALL};

fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        ..QpCaps::default()
    }
}

#[test]
fn a_full_cq_raises_cq_err_and_fails_its_qps() {
    let (a, b) = two_devices();
    let events: Arc<Mutex<Vec<AsyncEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    a.set_event_handler(Some(Box::new(move |e| sink.lock().unwrap().push(e))));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cq = a.create_cq_sized(4).unwrap();
    let cb = b.create_cq().unwrap();
    let qa = pa.create_qp_with(&cq, &cq, caps(16, 1)).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();
    qa.connect(qb.endpoint(0), 0, 14, 7).unwrap();
    qb.connect(qa.endpoint(0), 0, 14, 7).unwrap();
    let (src, dst) = (
        pa.alloc_mr(4096, ALL).unwrap(),
        pb.alloc_mr(4096, ALL).unwrap(),
    );
    let wrs: Vec<_> = (0..6)
        .map(|i| wr(i, SendOp::Write, &src, 0, 64, &dst, 0))
        .collect();
    // SAFETY: the MRs outlive the completions.
    unsafe { qa.post_send(&wrs) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while events.lock().unwrap().len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = events.lock().unwrap().clone();
    assert_eq!(
        got,
        [
            AsyncEvent::CqError { cq: cq.handle() },
            AsyncEvent::QpFatal { qpn: qa.qpn() }
        ]
    );
    assert_eq!(qa.query().unwrap().state, QpState::Err);
    let mut out = [WorkCompletion::EMPTY; 8];
    let n = cq.poll(&mut out).unwrap();
    let ids: Vec<_> = out[..n].iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
        "the four that fitted, in order"
    );
    assert_eq!(
        a.stats().cq_overruns,
        2,
        "the two that did not fit are counted"
    );
}

#[test]
fn a_send_queue_holds_max_send_wr_until_the_completions_are_polled() {
    let (a, b) = two_devices();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp_with(&ca, &ca, caps(3, 2)).unwrap();
    let qb = pb.create_qp(&cb, &cb).unwrap();
    let q = qa.query().unwrap();
    assert_eq!((q.caps.max_send_wr, q.caps.max_recv_wr), (3, 2));
    qa.connect(qb.endpoint(0), 0, 14, 7).unwrap();
    qb.connect(qa.endpoint(0), 0, 14, 7).unwrap();
    let (src, dst) = (
        pa.alloc_mr(4096, ALL).unwrap(),
        pb.alloc_mr(4096, ALL).unwrap(),
    );
    let w = |i| wr(i, SendOp::Write, &src, 0, 8, &dst, 0);
    // SAFETY: the MRs outlive the completions.
    unsafe { qa.post_send(&[w(0), w(1), w(2)]) }.unwrap();
    // Completed or not, the three hold their places until polled.
    let done = ca.wait(0, Duration::from_millis(50)).unwrap();
    assert!(done.is_empty());
    // SAFETY: as above.
    let full = unsafe { qa.post_send(&[w(3)]) };
    assert!(
        matches!(full, Err((0, ref e)) if e.kind == VerbsError::SendQueueFull),
        "{full:?}"
    );
    assert_eq!(ca.wait(1, Duration::from_secs(5)).unwrap()[0].wr_id, 0);
    // SAFETY: as above.
    unsafe { qa.post_send(&[w(3)]) }.expect("polling one completion frees one place");
    let ids: Vec<_> = ca
        .wait(3, Duration::from_secs(5))
        .unwrap()
        .iter()
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(ids, [1, 2, 3]);
}

#[test]
fn a_cq_keeps_its_completions_across_a_resize_and_refuses_to_lose_them() {
    let (a, _b) = two_devices();
    let cq = a.create_cq_sized(8).unwrap();
    for id in 0..5 {
        cq.push(WorkCompletion {
            wr_id: id,
            ..WorkCompletion::EMPTY
        });
    }
    let e = cq.resize(4).unwrap_err();
    assert!(matches!(e.kind, VerbsError::InvalidArgument { .. }), "{e}");
    cq.resize(4096).unwrap();
    cq.resize(6).unwrap();
    let mut out = [WorkCompletion::EMPTY; 8];
    let n = cq.poll(&mut out).unwrap();
    let ids: Vec<_> = out[..n].iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
}
