//! RDMA READ on the two-card harness: response bytes and completion, lost requests and
//! responses recovered, requests the responder refuses.

mod common;

use bluerdma_sim::core::desc::AccessFlags;
use bluerdma_sim::core::engine::{SendWr, WcOpcode, WcStatus};
use bluerdma_sim::core::qp::{QpAccessFlags, QpState};
use bluerdma_sim::core::wire::RdmaOpcode;
use bluerdma_sim::pair::{Fault, FrameInfo, Pair, QpOptions};
use common::*;

const PKT: usize = 4096;

fn read_once(len: usize) {
    let (mut p, c) = default_pair();
    let source = filled(&mut p, &c, B, len, 1);
    let sink = buffer(&mut p, &c, A, len + 16);
    post(&mut p, &c, A, &[read(3, &sink, 8, &source, 0, len)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(500));
    let wc = wcs[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (3, WcStatus::Success, WcOpcode::RdmaRead, len as u32)
    );
    let got = p.bytes(&sink).to_vec();
    assert!(got[8..8 + len] == pattern(len, 1)[..], "{len} bytes differ");
    assert!(
        got[..8].iter().chain(&got[8 + len..]).all(|&b| b == 0),
        "written around the sink"
    );
    assert_eq!(p.stats(A).retransmits + p.stats(B).retransmits, 0);
}

#[test]
fn read_of_1_byte_returns_it() {
    read_once(1);
}

#[test]
fn read_of_4_kib_returns_it() {
    read_once(4096);
}

#[test]
fn read_of_1_mib_returns_every_byte() {
    read_once(1 << 20);
}

fn responses(p: &Pair) -> Vec<(u32, bool)> {
    p.sent_by(B)
        .filter(|f| f.opcode().is_some_and(|o| o.is_read_response()))
        .map(|f| (f.psn().unwrap(), f.is_retry()))
        .collect()
}

#[test]
fn a_lost_response_packet_is_resent_and_the_read_completes_with_every_byte() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let source = filled(&mut p, &c, B, 16 * PKT, 2);
    let sink = buffer(&mut p, &c, A, 16 * PKT);
    p.inject(Fault::Drop, Some(1), |f| {
        f.from == B && f.is_data() && f.psn() == Some(5)
    });
    post(&mut p, &c, A, &[read(1, &sink, 0, &source, 0, 16 * PKT)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(
        (wcs[0].status, wcs[0].byte_len),
        (WcStatus::Success, 16 * PKT as u32)
    );
    assert!(p.bytes(&sink) == &pattern(16 * PKT, 2)[..]);
    let resent: Vec<u32> = responses(&p)
        .into_iter()
        .filter(|r| r.1)
        .map(|r| r.0)
        .collect();
    assert_eq!(
        resent,
        (5..16).collect::<Vec<u32>>(),
        "go-back-N on the response from PSN 5"
    );
}

#[test]
fn a_lost_single_packet_response_is_recovered_by_a_timeout() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let source = filled(&mut p, &c, B, 100, 3);
    let sink = buffer(&mut p, &c, A, 100);
    p.inject(Fault::Drop, Some(1), |f| f.from == B && f.is_data());
    post(&mut p, &c, A, &[read(1, &sink, 0, &source, 0, 100)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(&sink) == &pattern(100, 3)[..]);
    assert_eq!(p.now(), ib_timeout_ns(10), "recovered at the first timeout");
    // Both timers run out at once: the requester resends its request (answered by PSN as a
    // resend, not again) and the responder resends its unacknowledged response.
    assert_eq!((p.stats(A).timeouts, p.stats(B).timeouts), (1, 1));
    assert_eq!(
        responses(&p),
        [(0, false), (0, true)],
        "the response went twice, no more"
    );
    p.run_for(ms(50)).unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "one completion for one READ"
    );
}

#[test]
fn a_lost_read_request_is_resent_after_a_timeout() {
    let o = QpOptions {
        timeout: 10,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let source = filled(&mut p, &c, B, 5000, 4);
    let sink = buffer(&mut p, &c, A, 5000);
    p.inject(Fault::Drop, Some(1), |f| {
        f.opcode() == Some(RdmaOpcode::ReadRequest)
    });
    post(&mut p, &c, A, &[read(1, &sink, 0, &source, 0, 5000)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(&sink) == &pattern(5000, 4)[..]);
    assert_eq!(p.stats(A).timeouts, 1);
    let requests: Vec<bool> = p
        .sent_by(A)
        .filter(|f| f.opcode() == Some(RdmaOpcode::ReadRequest))
        .map(FrameInfo::is_retry)
        .collect();
    assert_eq!(requests, [false, true]);
}

fn refused_read(o: &QpOptions, source_access: AccessFlags, bad_key: bool) {
    let o = QpOptions {
        timeout: 8,
        retry_cnt: 2,
        ..*o
    };
    let (mut p, c) = connected(&o);
    let source = p.reg_mr(B, c.pd[1], 4096, source_access).unwrap();
    p.bytes_mut(&source).copy_from_slice(&pattern(4096, 5));
    let sink = buffer(&mut p, &c, A, 4096);
    let mut wr = read(1, &sink, 0, &source, 0, 4096);
    if bad_key {
        wr.rkey = bluerdma_sim::core::keys::MrKey::from_raw(source.key.get() ^ 0x1);
    }
    // The READ behind it (PSN 1) leaves no mark in the card's bitmap either, so the
    // responder's receive window shows no hole that would NAK and restart the timer.
    // (It is refused for the same reason.)
    let behind = SendWr {
        rkey: wr.rkey,
        ..read(2, &sink, 0, &source, 0, 16)
    };
    post(&mut p, &c, A, &[wr, behind]);
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        p.now(),
        3 * ib_timeout_ns(8),
        "after retry_cnt + 1 timeouts"
    );
    assert!(p.bytes(&sink).iter().all(|&b| b == 0), "nothing read");
    assert!(p.stats(B).read_refused >= 1);
    assert!(responses(&p).is_empty(), "the responder sent no data");
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
}

#[test]
fn a_read_with_a_bad_rkey_is_refused_by_the_responder_and_fails_retry_exceeded() {
    refused_read(&QpOptions::default(), ALL, true);
}

#[test]
fn a_read_of_an_mr_without_remote_read_is_refused() {
    refused_read(
        &QpOptions::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        false,
    );
}

#[test]
fn a_read_from_a_qp_without_remote_read_is_refused() {
    let o = QpOptions {
        access: QpAccessFlags::LOCAL_WRITE | QpAccessFlags::REMOTE_WRITE,
        ..QpOptions::default()
    };
    refused_read(&o, ALL, false);
}

#[test]
fn a_write_then_a_read_of_the_same_bytes_returns_what_was_written_in_posting_order() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 20_000, 6);
    let remote = buffer(&mut p, &c, B, 20_000);
    let sink = buffer(&mut p, &c, A, 20_000);
    post(
        &mut p,
        &c,
        A,
        &[
            write(1, &src, 0, &remote, 0, 20_000),
            read(2, &sink, 0, &remote, 0, 20_000),
            write(3, &src, 0, &remote, 0, 10),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 3, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
        [
            (1, WcOpcode::RdmaWrite),
            (2, WcOpcode::RdmaRead),
            (3, WcOpcode::RdmaWrite)
        ]
    );
    assert!(p.bytes(&sink) == &pattern(20_000, 6)[..]);
}

#[test]
fn a_zero_length_read_completes_as_a_read_of_nothing_in_posting_order() {
    // IB allows a READ of zero bytes (rdma-core's test_qp_ex_rc_rdma_read_zero_size posts
    // one). It moves nothing: on the wire it is the card's zero-length WRITE, and it
    // completes as RDMA_READ with byte_len 0, after the WRITE posted before it.
    let (mut p, c) = default_pair();
    let source = filled(&mut p, &c, B, 64, 2);
    let sink = buffer(&mut p, &c, A, 64);
    let src = filled(&mut p, &c, A, 32, 3);
    post(
        &mut p,
        &c,
        A,
        &[
            write(1, &src, 0, &source, 32, 32),
            read(2, &sink, 0, &source, 0, 0),
        ],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(500));
    let got: Vec<_> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 32),
            (2, WcStatus::Success, WcOpcode::RdmaRead, 0)
        ]
    );
    assert!(p.bytes(&sink).iter().all(|&b| b == 0), "nothing read");
    assert!(
        !p.sent_by(A)
            .any(|f| f.opcode().is_some_and(|o| o.is_read_request())),
        "no READ request on the wire"
    );
}

/// The most READs of `p`'s log waiting for their responses at once: requests A sent
/// minus responses B finished, in transmission order.
fn most_reads_outstanding(p: &Pair) -> usize {
    use bluerdma_sim::core::wire::RdmaOpcode as O;
    let (mut out, mut most) = (0usize, 0usize);
    for e in p.log() {
        match e.info.opcode() {
            Some(O::ReadRequest) if e.info.from == A => out += 1,
            Some(O::ReadResponseOnly | O::ReadResponseLast) if e.info.from == B => {
                out = out.saturating_sub(1)
            }
            _ => {}
        }
        most = most.max(out);
    }
    most
}

fn many_reads(max_rd_atomic: u8) -> usize {
    let o = QpOptions {
        max_rd_atomic,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let n = 40;
    let len = 1000;
    let source = filled(&mut p, &c, B, n * len, 9);
    let sink = buffer(&mut p, &c, A, n * len);
    let wrs: Vec<SendWr> = (0..n)
        .map(|k| read(k as u64, &sink, k * len, &source, k * len, len))
        .collect();
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, n, ms(500));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..n as u64).collect::<Vec<_>>()
    );
    assert!(p.bytes(&sink) == &pattern(n * len, 9)[..], "bytes differ");
    assert_eq!(p.stats(A).retransmits + p.stats(B).retransmits, 0);
    most_reads_outstanding(&p)
}

#[test]
fn a_qp_keeps_at_most_max_rd_atomic_reads_outstanding_and_every_read_completes() {
    // ib_read_bw posts 128 READs at once and relies on the QP to hold back all but
    // max_rd_atomic of them; sent all at once, their responses overran the requester's
    // message queue and the QP failed with RETRY_EXC_ERR under load.
    assert_eq!(many_reads(3), 3);
    assert_eq!(many_reads(1), 1);
    // Never set (0): as many as the peer has room for.
    assert_eq!(many_reads(0), 16);
}

#[test]
fn a_lost_read_request_among_others_is_answered_when_resent() {
    // The card takes the requests after a lost one; the lost one, resent, must still be
    // answered (a responder that took every request at or below the newest answered for
    // a resend never answered it: ib_read_bw failed with RETRY_EXC_ERR).
    let o = QpOptions {
        timeout: 8,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let len = 8192;
    let source = filled(&mut p, &c, B, 4 * len, 5);
    let sink = buffer(&mut p, &c, A, 4 * len);
    p.inject(Fault::Drop, Some(1), |f| {
        f.opcode() == Some(RdmaOpcode::ReadRequest) && f.psn() == Some(1)
    });
    let wrs: Vec<SendWr> = (0..4)
        .map(|k| read(k as u64, &sink, k * len, &source, k * len, len))
        .collect();
    post(&mut p, &c, A, &wrs);
    let wcs = send_wcs(&mut p, &c, A, 4, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..4).map(|k| (k, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert!(p.bytes(&sink) == &pattern(4 * len, 5)[..], "bytes differ");
}

#[test]
fn reads_into_one_buffer_complete_through_random_loss_and_duplication() {
    // perftest's ib_read_bw: 64 KiB READs of one source into one sink, 16 at a time, with
    // 2 % of all frames (requests, responses, ACKs) lost and 2 % duplicated.
    for seed in 1..12u64 {
        let o = QpOptions {
            timeout: 8,
            ..QpOptions::default()
        };
        let (mut p, c) = connected(&o);
        let (n, len) = (16, 65536);
        let source = filled(&mut p, &c, B, len, 9);
        let sink = buffer(&mut p, &c, A, len);
        for (k, fault) in [Fault::Drop, Fault::Duplicate].into_iter().enumerate() {
            let mut x = seed * 1000 + k as u64;
            p.inject(fault, None, move |_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % 100 < 2
            });
        }
        for round in 0..6 {
            let wrs: Vec<SendWr> = (0..n)
                .map(|k| read(k as u64, &sink, 0, &source, 0, len))
                .collect();
            post(&mut p, &c, A, &wrs);
            let wcs = send_wcs(&mut p, &c, A, n, ms(20_000));
            assert!(
                wcs.iter().all(|w| w.status == WcStatus::Success),
                "seed {seed} round {round}: {wcs:?}"
            );
        }
        assert!(
            p.bytes(&sink) == &pattern(len, 9)[..],
            "seed {seed}: bytes differ"
        );
    }
}

#[test]
fn a_read_request_overtaken_by_many_others_is_answered_without_a_retransmission() {
    // Frames overtake each other when a link moves from UDP to shared memory: ib_read_bw's
    // first request arrived after 40 later ones. The responder remembers 32 answers until
    // their acknowledgement is due, which waits for the late request; requests past that
    // were dropped for the timer (67 ms with nothing lost), and the late one itself was
    // refused at every resend while the memory was full (RETRY_EXC_ERR). The requester
    // now sends no more READs ahead of their acknowledgement than the responder remembers.
    let (mut p, c) = default_pair();
    let (n, len) = (60, 64);
    let source = filled(&mut p, &c, B, n * len, 8);
    let sink = buffer(&mut p, &c, A, n * len);
    p.inject(Fault::Hold, Some(1), |f| {
        f.opcode() == Some(RdmaOpcode::ReadRequest) && f.psn() == Some(0)
    });
    let wrs: Vec<SendWr> = (0..n)
        .map(|k| read(k as u64, &sink, k * len, &source, k * len, len))
        .collect();
    post(&mut p, &c, A, &wrs);
    p.run_for(ms(5)).unwrap();
    let sent = p
        .log()
        .iter()
        .filter(|e| e.info.from == A && e.info.opcode() == Some(RdmaOpcode::ReadRequest))
        .count();
    assert_eq!(
        sent, 32,
        "READs sent ahead of the late one's acknowledgement"
    );
    assert_eq!(p.release_held(), 1);
    let wcs = send_wcs(&mut p, &c, A, n, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..n as u64)
            .map(|k| (k, WcStatus::Success))
            .collect::<Vec<_>>()
    );
    assert!(p.bytes(&sink) == &pattern(n * len, 8)[..], "bytes differ");
    assert_eq!(p.stats(A).timeouts + p.stats(A).retransmits, 0);
}
