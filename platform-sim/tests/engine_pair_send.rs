//! SEND, SEND_WITH_IMM and WRITE_WITH_IMM on the two-card harness: receive WRs consumed in
//! posting order (announced over the out-of-band channel), byte_len and immediate data,
//! RNR waits and their exhaustion, too-long SENDs, and a delayed or lost channel.

mod common;

use std::time::Duration;

use bluerdma_sim::core::engine::{WcOpcode, WcStatus, WC_WITH_IMM};
use bluerdma_sim::core::qp::{QpAttrMask, QpState, RawQpAttr};
use bluerdma_sim::core::time::Nanos;
use bluerdma_sim::pair::{Pair, QpOptions};
use common::*;

#[test]
fn send_with_imm_consumes_receive_wrs_in_posting_order_with_byte_len_and_imm() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 3 * 8192);
    post_recvs(
        &mut p,
        &c,
        B,
        &[
            recv(1, &rbuf, 0, 8192),
            recv(2, &rbuf, 8192, 8192),
            recv(3, &rbuf, 16384, 8192),
        ],
    );
    let sizes = [10usize, 8192, 1];
    let src = filled(&mut p, &c, A, 8192 + 11, 1);
    let wrs = [
        send(11, &src, 0, sizes[0], Some(0xA0)),
        send(12, &src, 10, sizes[1], Some(0xA1)),
        send(13, &src, 8202, sizes[2], Some(0xA2)),
    ];
    post(&mut p, &c, A, &wrs);
    let sent = send_wcs(&mut p, &c, A, 3, ms(100));
    assert_eq!(
        sent.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (11, WcStatus::Success, WcOpcode::Send),
            (12, WcStatus::Success, WcOpcode::Send),
            (13, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let got = recv_wcs(&mut p, &c, B, 3, ms(100));
    for (k, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (k as u64 + 1, WcStatus::Success, WcOpcode::Recv),
            "{wc:?}"
        );
        assert_eq!(
            (wc.byte_len, wc.imm_data, wc.wc_flags),
            (sizes[k] as u32, 0xA0 + k as u32, WC_WITH_IMM)
        );
        assert_eq!((wc.qp_num, wc.src_qp), (c.qp(B).get(), c.qp(A).get()));
    }
    let data = pattern(8192 + 11, 1);
    let b = p.bytes(&rbuf).to_vec();
    assert!(b[..10] == data[..10] && b[10..8192].iter().all(|&x| x == 0));
    assert!(b[8192..16384] == data[10..8202]);
    assert!(b[16384] == data[8202] && b[16385..].iter().all(|&x| x == 0));
}

#[test]
fn a_plain_send_completes_without_immediate_data() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 100);
    post_recvs(&mut p, &c, B, &[recv(5, &rbuf, 0, 100)]);
    let src = filled(&mut p, &c, A, 60, 2);
    post(&mut p, &c, A, &[send(1, &src, 0, 60, None)]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data, wc.wc_flags),
        (5, WcStatus::Success, 60, 0, 0)
    );
    assert!(p.bytes(&rbuf)[..60] == pattern(60, 2)[..]);
}

#[test]
fn a_multi_packet_send_arrives_whole_in_one_receive() {
    let o = QpOptions {
        pmtu: bluerdma_sim::core::mtu::Pmtu::Mtu1024,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let rbuf = buffer(&mut p, &c, B, 20_000);
    post_recvs(&mut p, &c, B, &[recv(1, &rbuf, 0, 20_000)]);
    let src = filled(&mut p, &c, A, 10_000, 3);
    post(&mut p, &c, A, &[send(1, &src, 0, 10_000, Some(7))]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.status, wc.byte_len, wc.imm_data),
        (WcStatus::Success, 10_000, 7)
    );
    assert!(p.bytes(&rbuf)[..10_000] == pattern(10_000, 3)[..]);
    assert_eq!(
        p.sent_by(A).filter(|f| f.is_data()).count(),
        10,
        "ten 1 KiB packets"
    );
}

#[test]
fn write_with_imm_places_the_bytes_and_consumes_one_receive_wr() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 64), recv(2, &rbuf, 0, 64)],
    );
    let src = filled(&mut p, &c, A, 5000, 4);
    let dst = buffer(&mut p, &c, B, 5000);
    post(
        &mut p,
        &c,
        A,
        &[write_imm(9, &src, 0, &dst, 0, 5000, 0xDEAD_BEEF)],
    );
    let sent = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (9, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let wcs = recv_wcs(&mut p, &c, B, 1, ms(100));
    let wc = wcs[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data, wc.wc_flags),
        (1, WcOpcode::RecvRdmaWithImm, 5000, 0xDEAD_BEEF, WC_WITH_IMM)
    );
    assert!(p.bytes(&dst) == &pattern(5000, 4)[..]);
    assert!(
        p.bytes(&rbuf).iter().all(|&x| x == 0),
        "the receive buffer is not written"
    );
    p.run_for(ms(10)).unwrap();
    assert!(
        p.poll_cq(B, c.recv_cq[1]).is_empty(),
        "the second receive WR is still posted"
    );
}

#[test]
fn a_zero_length_write_with_imm_delivers_only_the_immediate() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(&mut p, &c, B, &[recv(3, &rbuf, 0, 64)]);
    let src = filled(&mut p, &c, A, 64, 5);
    let dst = buffer(&mut p, &c, B, 64);
    post(&mut p, &c, A, &[write_imm(1, &src, 0, &dst, 0, 0, 42)]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (3, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0, 42)
    );
    assert!(p.bytes(&dst).iter().all(|&x| x == 0));
}

#[test]
fn receives_posted_before_the_qp_connects_are_announced_when_it_does() {
    let mut p = Pair::new().unwrap();
    let o = QpOptions::default();
    let mut qps = Vec::new();
    let mut pds = Vec::new();
    let mut cqs = Vec::new();
    for s in [A, B] {
        let pd = p.engine(s).alloc_pd().unwrap();
        let cq = p.engine(s).create_cq(1024).unwrap();
        qps.push(p.create_qp(s, pd, cq, cq).unwrap());
        pds.push(pd);
        cqs.push(cq);
    }
    let init = RawQpAttr {
        qp_state: QpState::Init.to_ibv(),
        qp_access_flags: o.access.bits(),
        ..RawQpAttr::default()
    };
    p.modify_qp(
        B,
        qps[1],
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let rbuf = p.reg_mr(B, pds[1], 256, ALL).unwrap();
    p.post_recv(B, qps[1], &[recv(77, &rbuf, 0, 256)]).unwrap();
    assert_eq!(p.oob_sent(B), 0, "nothing announced before RTR");
    p.bring_up(A, qps[0], qps[1], &o).unwrap();
    p.bring_up(B, qps[1], qps[0], &o).unwrap();
    assert_eq!(p.oob_sent(B), 1);
    let src = p.reg_mr(A, pds[0], 256, ALL).unwrap();
    p.bytes_mut(&src).copy_from_slice(&pattern(256, 6));
    p.post_send(A, qps[0], &[send(1, &src, 0, 256, None)])
        .unwrap();
    let wc = completions(&mut p, B, cqs[1], 1, ms(100))[0];
    assert_eq!((wc.wr_id, wc.byte_len), (77, 256));
    assert!(p.bytes(&rbuf) == &pattern(256, 6)[..]);
}

#[test]
fn a_send_without_a_receive_waits_for_one_and_then_succeeds() {
    let o = QpOptions {
        min_rnr_timer: 14,
        rnr_retry: 7,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 300, 7);
    post(&mut p, &c, A, &[send(1, &src, 0, 300, None)]);
    p.run_for(ms(20)).unwrap();
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty(), "still waiting");
    assert!(
        p.sent_by(A).all(|f| !f.is_data()),
        "nothing sent without a receive WR"
    );
    let waits = p.stats(A).rnr_waits;
    let timer = Nanos::ib_rnr_timer(14).0;
    assert_eq!(
        waits,
        ms(20).as_nanos() as u64 / timer,
        "one wait per min_rnr_timer (1.28 ms)"
    );
    let rbuf = buffer(&mut p, &c, B, 300);
    let posted = p.now();
    post_recvs(&mut p, &c, B, &[recv(2, &rbuf, 0, 300)]);
    let sent = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(recv_wcs(&mut p, &c, B, 1, ms(10))[0].wr_id, 2);
    assert!(p.bytes(&rbuf) == &pattern(300, 7)[..]);
    assert!(p
        .sent_by(A)
        .filter(|f| f.is_data())
        .all(|f| f.sent_ns >= posted));
}

#[test]
fn rnr_retry_exhaustion_fails_the_send_after_rnr_retry_plus_one_timers() {
    let o = QpOptions {
        min_rnr_timer: 14,
        rnr_retry: 2,
        ..QpOptions::default()
    };
    let (mut p, c) = connected(&o);
    let src = filled(&mut p, &c, A, 300, 8);
    let dst = buffer(&mut p, &c, B, 300);
    let posted = p.now();
    post(
        &mut p,
        &c,
        A,
        &[send(1, &src, 0, 300, None), write(2, &src, 0, &dst, 0, 300)],
    );
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        p.now() - posted,
        3 * Nanos::ib_rnr_timer(14).0,
        "(rnr_retry + 1) x 1.28 ms"
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert!(
        p.bytes(&dst).iter().all(|&x| x == 0),
        "the WRITE behind it never went"
    );
}

#[test]
fn a_send_longer_than_the_receive_fails_both_sides_and_writes_nothing() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 200);
    post_recvs(
        &mut p,
        &c,
        B,
        &[recv(1, &rbuf, 0, 100), recv(2, &rbuf, 100, 100)],
    );
    let src = filled(&mut p, &c, A, 150, 9);
    post(&mut p, &c, A, &[send(1, &src, 0, 150, None)]);
    let sent = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!(sent[0].status, WcStatus::RemInvReqErr);
    let got = recv_wcs(&mut p, &c, B, 2, ms(100));
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(p.qp_state(B, c.qp(B)).unwrap(), QpState::Err);
    assert!(p.bytes(&rbuf).iter().all(|&x| x == 0));
}

#[test]
fn a_delayed_announcement_delays_the_send_by_as_much() {
    let (mut p, c) = default_pair();
    p.set_oob_delay(A, ms(5));
    let rbuf = buffer(&mut p, &c, B, 64);
    let posted = p.now();
    post_recvs(&mut p, &c, B, &[recv(1, &rbuf, 0, 64)]);
    let src = filled(&mut p, &c, A, 64, 10);
    post(&mut p, &c, A, &[send(1, &src, 0, 64, None)]);
    let wc = recv_wcs(&mut p, &c, B, 1, ms(100))[0];
    assert_eq!(wc.status, WcStatus::Success);
    let first_data = p.sent_by(A).find(|f| f.is_data()).unwrap().sent_ns;
    assert_eq!(
        first_data - posted,
        ms(5).as_nanos() as u64,
        "sent when the receive WR was known"
    );
    assert!(p.bytes(&rbuf) == &pattern(64, 10)[..]);
}

/// How long a QP of the default options goes on after its out-of-band peer is lost: the
/// time a real card's requester takes to give up, ACK timeout x (retry_cnt + 1).
fn peer_lost_grace() -> u64 {
    let o = QpOptions::default();
    ib_timeout_ns(o.timeout) * (u64::from(o.retry_cnt) + 1)
}

#[test]
fn losing_the_channel_while_a_send_waits_fails_that_qp_with_flushes_after_the_grace() {
    let (mut p, c) = default_pair();
    let src = filled(&mut p, &c, A, 64, 11);
    post(
        &mut p,
        &c,
        A,
        &[send(1, &src, 0, 64, None), send(2, &src, 0, 64, None)],
    );
    p.run_for(us(100)).unwrap();
    let cut = p.now();
    p.cut_oob();
    p.run_for(Duration::from_nanos(peer_lost_grace() - 1_000_000))
        .unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "nothing fails before a real card's requester would give up"
    );
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Rts);
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(p.now() - cut <= peer_lost_grace() + 1_000_000);
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert!(p.stats(A).peers_lost >= 1);
}

/// ibv_srq_pingpong: a side posts a SEND per completion it sees, so its peer may exit with
/// one more SEND of it waiting for a receive WR while the one before is delivered and its
/// ACK on the way. The channel closes with the peer: the delivered SEND still completes
/// successfully, and the one that cannot go fails only after the grace, not next to it.
#[test]
fn a_delivered_send_completes_when_the_channel_is_lost_before_its_ack() {
    let (mut p, c) = default_pair();
    let rbuf = buffer(&mut p, &c, B, 64);
    post_recvs(&mut p, &c, B, &[recv(7, &rbuf, 0, 64)]);
    let src = filled(&mut p, &c, A, 64, 14);
    p.pause(A, true);
    post(
        &mut p,
        &c,
        A,
        &[send(1, &src, 0, 64, None), send(2, &src, 0, 64, None)],
    );
    let got = recv_wcs(&mut p, &c, B, 1, ms(100));
    assert_eq!((got[0].wr_id, got[0].status), (7, WcStatus::Success));
    assert!(p.bytes(&rbuf) == &pattern(64, 14)[..]);
    let cut = p.now();
    p.cut_oob();
    p.run_for(ms(1)).unwrap();
    assert!(
        p.poll_cq(A, c.send_cq[0]).is_empty(),
        "the delivered SEND's ACK is still held"
    );
    p.pause(A, false);
    let first = send_wcs(&mut p, &c, A, 1, ms(10));
    assert_eq!(
        first
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
    p.run_for(Duration::from_nanos(
        peer_lost_grace() - (p.now() - cut) - 1_000_000,
    ))
    .unwrap();
    assert!(p.poll_cq(A, c.send_cq[0]).is_empty());
    let last = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((last[0].wr_id, last[0].status), (2, WcStatus::WrFlushErr));
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
}

#[test]
fn without_the_channel_writes_still_work_and_a_new_send_fails_after_the_grace() {
    let (mut p, c) = default_pair();
    p.cut_oob();
    p.run_for(us(10)).unwrap();
    let src = filled(&mut p, &c, A, 64, 12);
    let dst = buffer(&mut p, &c, B, 64);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 64)]);
    assert_eq!(
        send_wcs(&mut p, &c, A, 1, ms(100))[0].status,
        WcStatus::Success
    );
    assert!(p.bytes(&dst) == &pattern(64, 12)[..]);
    let before = p.now();
    post(&mut p, &c, A, &[send(2, &src, 0, 64, None)]);
    let wc = send_wcs(&mut p, &c, A, 1, ms(1000))[0];
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(
        p.now() - before,
        peer_lost_grace(),
        "no RNR retries (nothing can announce a receive WR): the grace from the post"
    );
}

#[test]
fn receives_refused_by_a_full_channel_are_announced_once_it_drains() {
    let (mut p, c) = default_pair();
    p.set_oob_capacity(A, Some(2));
    let rbuf = buffer(&mut p, &c, B, 4 * 100);
    post_recvs(&mut p, &c, B, &recvs(4, &rbuf, 100, 100));
    let src = filled(&mut p, &c, A, 400, 13);
    post(&mut p, &c, A, &writes_as_sends(4, &src, 100));
    let got = recv_wcs(&mut p, &c, B, 4, ms(100));
    assert_eq!(
        got.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(p.bytes(&rbuf) == &pattern(400, 13)[..]);
}

/// `n` SENDs of `len` bytes from consecutive pieces of `src`, wr_ids `0..n`.
fn writes_as_sends(
    n: usize,
    src: &bluerdma_sim::pair::Mr,
    len: usize,
) -> Vec<bluerdma_sim::core::engine::SendWr> {
    (0..n)
        .map(|k| send(k as u64, src, k * len, len, None))
        .collect()
}
