//! Receive-side bookkeeping of one QP slot, driven report by report in the orders the card
//! can produce: no PSN that ends a message is acknowledged before that message's completion
//! is recorded.

use std::vec::Vec;

use super::*;
use crate::addr::VirtAddr;
use crate::engine::config::SEND_WINDOW_CAP;
use crate::engine::requester::packets_of;
use crate::keys::MrKey;
use crate::mtu::Pmtu;
use crate::transport::Chunk;
use crate::wire::RdmaOpcode;

const RQ_PSN: u32 = 5;

/// The responder as `modify_qp` leaves it at RTR with `rq_psn`.
fn slot(rq_psn: u32) -> Responder {
    let mut q = Responder::default();
    q.reset(Psn::from_raw(rq_psn));
    q.card_reset();
    q
}

fn info(opcode: RdmaOpcode, psn: u32, total_len: u32, raddr: u64) -> PacketInfo {
    PacketInfo {
        opcode,
        psn,
        msn: 0,
        dqpn: Qpn::from_raw(0x100),
        raddr: VirtAddr(raddr),
        rkey: MrKey::from_raw(0x100),
        total_len,
        imm_data: 0,
        is_retry: false,
        ack_req: true,
        solicited: false,
        ecn_marked: false,
    }
}

/// The report intake of a packet (what `on_report` calls).
fn packet(q: &mut Responder, p: PacketInfo) {
    q.on_packet(&p);
}

/// One delivery round of `deliver_and_ack`: the messages completed and the ACK sent.
fn deliver(q: &mut Responder) -> (Vec<MsgEnd>, Psn) {
    let (_, ack) = q.deliverable();
    let mut done = Vec::new();
    while let Some(m) = q.next_ready(ack) {
        done.push(m);
    }
    q.set_acked(ack);
    (done, ack)
}

fn psn(x: u32) -> Psn {
    Psn::from_raw(x)
}

/// The card's window after a QP reset starts at stride 0xFFFFF with every bit set. With
/// rq_psn 5, PSNs 0..=4 of stride 0 never arrive, so when PSN 0x80 slides stride 0 out the
/// card reports a loss; that report's new bitmap already holds 0x80, and it reaches the
/// meta ring before 0x80's own packet report. When a delivery round runs between the two
/// (the driver read the ring between the card's two writes, or its 256-report batch ended
/// there), the ACK used to cover 0x80 and its late report was dropped as a duplicate: the
/// sender's SEND succeeded and the receive WR never completed.
#[test]
fn a_card_loss_report_ahead_of_the_packet_report_does_not_ack_its_message() {
    let mut q = slot(RQ_PSN);
    for p in RQ_PSN..0x80 {
        packet(&mut q, info(RdmaOpcode::SendOnly, p, 100, 0x1000));
        let (done, ack) = deliver(&mut q);
        assert_eq!((done.len(), ack), (1, psn(p + 1)));
    }
    // The loss report of the slide from stride 7 to stride 8 (nic-behaviour.md 3.3-3.4):
    // before, bit i = PSN i (0..=4 missing); after, bit i = PSN 16 + i, bit 112 = 0x80.
    let pre_bitmap = !0u128 << RQ_PSN;
    let report = AckReport {
        now_bitmap: (pre_bitmap >> 16) | 1 << 112,
        msn: 0,
        qpn: Qpn::from_raw(0x100),
        psn_now: 0x80,
        psn_before_slide: 0x70,
        is_packet_lost: true,
        is_window_slided: true,
        is_send_by_driver: false,
        is_send_by_local_hw: true,
    };
    on_card_loss(&mut q, &report, pre_bitmap);
    let (done, ack) = deliver(&mut q);
    assert!(done.is_empty());
    assert_eq!(q.rx.base(), psn(0x81), "the card says 0x80 arrived");
    assert_eq!(ack, psn(0x80), "but its message is not recorded yet");
    // Its packet report follows: now it completes, and is acknowledged.
    packet(&mut q, info(RdmaOpcode::SendOnly, 0x80, 77, 0x1000));
    let (done, ack) = deliver(&mut q);
    assert_eq!(ack, psn(0x81));
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].psn, done[0].len), (psn(0x80), 77));
}

/// The same order with the quiet-timer report, whose bitmap holds a PSN whose report has
/// not been read: a message of several packets is acknowledged through its FIRST and
/// MIDDLE packets (they have no report of their own) but not its LAST.
#[test]
fn a_quiet_report_acks_middles_of_a_known_message_but_never_its_last() {
    let mut q = slot(0x100);
    // Three packets at 4 KiB PMTU: FIRST 0x100, MIDDLE 0x101, LAST 0x102.
    packet(
        &mut q,
        info(RdmaOpcode::SendFirst, 0x100, 3 * 4096, 0x10_0000),
    );
    let quiet = AckReport {
        now_bitmap: 0b111 << 112,
        msn: 0,
        qpn: Qpn::from_raw(0x100),
        psn_now: 0x100,
        psn_before_slide: 0,
        is_packet_lost: false,
        is_window_slided: false,
        is_send_by_driver: false,
        is_send_by_local_hw: true,
    };
    on_card_quiet(&mut q, &quiet);
    let (done, ack) = deliver(&mut q);
    assert!(done.is_empty());
    assert_eq!(ack, psn(0x102), "FIRST and MIDDLE acknowledged, LAST not");
    packet(&mut q, info(RdmaOpcode::SendLast, 0x102, 4096, 0x10_2000));
    let (done, ack) = deliver(&mut q);
    assert_eq!(ack, psn(0x103));
    assert_eq!((done.len(), done[0].len), (1, 3 * 4096));
}

#[test]
fn a_message_whose_first_report_is_missing_is_not_acknowledged() {
    let mut q = slot(0x200);
    // The card's bitmap says FIRST and LAST arrived; only the LAST was reported.
    q.rx.set_range(PsnRange::new(psn(0x200), 2));
    packet(&mut q, info(RdmaOpcode::SendLast, 0x201, 10, 0x10_1000));
    let (done, ack) = deliver(&mut q);
    assert!(done.is_empty());
    assert_eq!(ack, psn(0x200));
    packet(&mut q, info(RdmaOpcode::SendFirst, 0x200, 4106, 0x10_0000));
    let (done, ack) = deliver(&mut q);
    assert_eq!((done.len(), done[0].len, ack), (1, 4106, psn(0x202)));
}

/// More messages wait behind a gap than the queue holds: the ones with the highest PSNs
/// are dropped and never acknowledged, an earlier one (the resend that fills the gap)
/// always finds room, and every message completes once resent, in PSN order.
#[test]
fn messages_beyond_the_queue_are_not_acknowledged_until_resent() {
    let start = 0x300u32;
    let n = MSG_QUEUE as u32 + 20;
    let mut q = slot(start);
    // PSN `start` is lost; 1..=n arrive and are reported.
    for k in 1..=n {
        packet(&mut q, info(RdmaOpcode::SendOnly, start + k, k, 0x1000));
    }
    assert!(q.reports_dropped);
    let (done, ack) = deliver(&mut q);
    assert_eq!((done.len(), ack), (0, psn(start)));
    // The resend of the lost one finds room (the highest entry gives way).
    packet(&mut q, info(RdmaOpcode::SendOnly, start, 1000, 0x1000));
    let (done, ack) = deliver(&mut q);
    let queued = MSG_QUEUE as u32 - 1;
    assert_eq!(done.len() as u32, queued + 1);
    assert_eq!(
        ack,
        psn(start + queued + 1),
        "stops at the first dropped message"
    );
    // Go-back-N from the ACK: the rest arrives again.
    for k in queued + 1..=n {
        packet(&mut q, info(RdmaOpcode::SendOnly, start + k, k, 0x1000));
    }
    let (rest, ack) = deliver(&mut q);
    assert_eq!(ack, psn(start + n + 1));
    let lens: Vec<u32> = done.iter().chain(&rest).map(|m| m.len).collect();
    let want: Vec<u32> = core::iter::once(1000).chain(1..=n).collect();
    assert_eq!(lens, want);
}

/// A LAST resent after a later message's report: completions still come in PSN order,
/// each with its own length.
#[test]
fn message_ends_reported_out_of_order_complete_in_psn_order() {
    let mut q = slot(0x400);
    packet(&mut q, info(RdmaOpcode::SendFirst, 0x400, 5000, 0x10_0000));
    packet(&mut q, info(RdmaOpcode::SendOnly, 0x402, 7, 0x20_0000));
    packet(&mut q, info(RdmaOpcode::SendLast, 0x401, 904, 0x10_1000));
    let (done, ack) = deliver(&mut q);
    assert_eq!(ack, psn(0x403));
    let got: Vec<(Psn, u32)> = done.iter().map(|m| (m.psn, m.len)).collect();
    assert_eq!(got, [(psn(0x401), 5000), (psn(0x402), 7)]);
}

/// A request cut by the send window goes out in pieces that split its chunks at packet
/// boundaries: the pieces keep the chunk's addresses, PSNs and FIRST/LAST flags.
#[test]
fn a_chunk_is_cut_at_packet_boundaries() {
    let c = Chunk {
        laddr: VirtAddr(0x10_0003),
        raddr: VirtAddr(0x20_0005),
        len: 5 * 4096,
        psn: psn(7),
        packets: 6,
        is_first: true,
        is_last: true,
        is_retry: false,
    };
    let pmtu = Pmtu::Mtu4096;
    assert_eq!(packets_of(&c, pmtu, 7, (0, 6), false), Some(c));
    assert_eq!(packets_of(&c, pmtu, 7, (6, 9), false), None);
    let head = packets_of(&c, pmtu, 7, (0, 2), false).unwrap();
    assert_eq!(
        (head.raddr.0, head.laddr.0, head.len, head.psn, head.packets),
        (0x20_0005, 0x10_0003, 2 * 4096 - 5, psn(7), 2)
    );
    assert!(head.is_first && !head.is_last);
    let tail = packets_of(&c, pmtu, 7, (2, 6), false).unwrap();
    assert_eq!(
        (tail.raddr.0, tail.laddr.0, tail.len, tail.psn, tail.packets),
        (0x20_2000, 0x10_1ffe, 3 * 4096 + 5, psn(9), 4)
    );
    assert!(!tail.is_first && tail.is_last);
    assert_eq!(head.len + tail.len, c.len);
}

/// The send window never lets more PSNs out than fit below the peer card's window top:
/// a resend from the oldest unacknowledged PSN is never stale there.
#[test]
fn the_send_window_fits_the_card_window() {
    assert_eq!(SEND_WINDOW_CAP, 112);
}

/// PSN `k` after [`RQ_PSN`].
fn nth(k: u32) -> Psn {
    Psn::from_raw(RQ_PSN + k)
}

/// A responder that answered the READ requests at PSNs 1..=READS_TRACKED after `rq_psn`
/// (its memory of answers full), PSN 0 not arrived.
fn answered_after_a_hole() -> Responder {
    let mut q = slot(RQ_PSN);
    for k in 1..=READS_TRACKED as u32 {
        assert_eq!(
            q.on_read_request(nth(k), 64, 0x1000),
            ReadRequest::Answer,
            "request {k}"
        );
    }
    q
}

/// A READ request missing below a full list of later answers (its first copy lost) is
/// answered when it comes again: every delivery waits for its PSN, and answers are
/// forgotten only as deliveries pass them, so refusing it for the full list refused it at
/// every resend (ib_read_bw failed with RETRY_EXC_ERR in about 1 run of 12).
#[test]
fn a_read_request_missing_below_a_full_list_of_answers_is_answered() {
    let mut q = answered_after_a_hole();
    let n = READS_TRACKED as u32;
    assert_eq!(
        q.deliverable().0,
        nth(0),
        "nothing delivers past the missing request"
    );
    assert_eq!(q.on_read_request(nth(0), 64, 0x1000), ReadRequest::Answer);
    // The other answers are still known: their requests again draw no second response.
    assert_eq!(q.on_read_request(nth(1), 64, 0x1000), ReadRequest::Resent);
    assert_eq!(
        q.on_read_request(nth(n - 1), 64, 0x1000),
        ReadRequest::Resent
    );
    // Everything arrived: the receive window moves past all of it.
    assert_eq!(q.deliverable().0, nth(n + 1));
    let mut delivered = 0;
    while q.next_ready(nth(n + 1)).is_some() {
        delivered += 1;
    }
    assert_eq!(delivered, n + 1, "every READ request is delivered once");
}

/// A new request after every answered one still waits for room when the list is full.
#[test]
fn a_read_request_after_a_full_list_of_answers_waits_for_room() {
    let mut q = answered_after_a_hole();
    let n = READS_TRACKED as u32;
    assert_eq!(
        q.on_read_request(nth(n + 1), 64, 0x1000),
        ReadRequest::Resent
    );
}
