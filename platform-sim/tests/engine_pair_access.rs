//! Access checks on the two-card harness (`core/src/engine/access_check.rs`): what the card
//! refuses without a word, the requester learns from the responder's driver after its
//! first timeout, when both sides answer checks:
//! - a WRITE with a bad rkey: REM_ACCESS_ERR after one timeout (not RETRY_EXC_ERR after
//!   every retry), the WR behind it flushed, not a byte written, the responder unharmed;
//! - a READ from an MR without REMOTE_READ: REM_ACCESS_ERR;
//! - a SEND into a receive WR whose MR is on another PD (posted, announced under key 0):
//!   REM_OP_ERR, the receive WR LOC_PROT_ERR, both QPs in ERR, nothing written;
//! - a WRITE whose packets are lost, not refused: the check is accepted and the
//!   retransmission delivers it;
//! - a responder that does not answer checks: RETRY_EXC_ERR as before.

mod common;

use bluerdma_sim::core::desc::AccessFlags;
use bluerdma_sim::core::engine::{SendWr, WcStatus};
use bluerdma_sim::core::keys::MrKey;
use bluerdma_sim::core::qp::QpState;
use bluerdma_sim::pair::{Fault, QpOptions, Side};
use common::*;

fn quick() -> QpOptions {
    QpOptions {
        timeout: 8,
        retry_cnt: 3,
        ..QpOptions::default()
    }
}

/// A pair whose sides answer access checks.
fn checking() -> (bluerdma_sim::pair::Pair, bluerdma_sim::pair::Conn) {
    let (mut p, c) = connected(&quick());
    p.set_oob_access_checks(A, true);
    p.set_oob_access_checks(B, true);
    (p, c)
}

#[test]
fn a_write_with_a_bad_rkey_fails_remote_access_after_one_timeout() {
    let (mut p, c) = checking();
    let src = filled(&mut p, &c, A, 4096, 2);
    let dst = buffer(&mut p, &c, B, 4096);
    let mut wr = write(1, &src, 0, &dst, 0, 4096);
    wr.rkey = MrKey::from_raw(dst.key.get() ^ 0x01);
    let behind = SendWr { wr_id: 2, ..wr };
    let posted = p.now();
    post(&mut p, &c, A, &[wr, behind]);
    let wcs = send_wcs(&mut p, &c, A, 2, ms(100));
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(
        p.now() - posted < 2 * ib_timeout_ns(8),
        "one timeout, then the verdict: {} ns",
        p.now() - posted
    );
    assert!(p.bytes(&dst).iter().all(|&b| b == 0), "nothing written");
    let (sa, sb) = (p.stats(A), p.stats(B));
    assert_eq!((sa.access_checks, sa.access_refused), (1, 1));
    assert_eq!(sb.access_checks, 0);
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(p.qp_state(B, c.qp(B)).unwrap(), QpState::Rts);
}

#[test]
fn a_read_the_responder_refuses_fails_remote_access() {
    let (mut p, c) = checking();
    let sink = buffer(&mut p, &c, A, 4096);
    let src = p
        .reg_mr(B, c.pd[1], 4096, AccessFlags::LOCAL_WRITE)
        .expect("reg_mr");
    post(&mut p, &c, A, &[read(5, &sink, 0, &src, 0, 100)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::RemAccessErr));
    assert!(p.bytes(&sink).iter().all(|&b| b == 0));
}

#[test]
fn a_send_into_a_receive_wr_of_another_pd_fails_on_both_sides() {
    let (mut p, c) = checking();
    let src = filled(&mut p, &c, A, 4096, 7);
    let other = p.engine(B).alloc_pd().expect("alloc_pd");
    let rbuf = p.reg_mr(B, other, 4096, ALL).expect("reg_mr");
    post_recvs(&mut p, &c, B, &[recv(8, &rbuf, 0, 4096)]);
    post(&mut p, &c, A, &[send(9, &src, 0, 1000, None)]);
    let sent = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((sent[0].wr_id, sent[0].status), (9, WcStatus::RemOpErr));
    let got = recv_wcs(&mut p, &c, B, 1, ms(100));
    assert_eq!((got[0].wr_id, got[0].status), (8, WcStatus::LocProtErr));
    assert!(p.bytes(&rbuf).iter().all(|&b| b == 0), "nothing written");
    assert_eq!(p.qp_state(A, c.qp(A)).unwrap(), QpState::Err);
    assert_eq!(p.qp_state(B, c.qp(B)).unwrap(), QpState::Err);
}

#[test]
fn a_lost_write_is_accepted_by_the_check_and_resent() {
    let (mut p, c) = checking();
    let src = filled(&mut p, &c, A, 4096, 3);
    let dst = buffer(&mut p, &c, B, 4096);
    // The first transmission is lost; the check finds nothing wrong.
    p.inject(Fault::Drop, Some(1), |f| f.from == Side::A);
    post(&mut p, &c, A, &[write(1, &src, 0, &dst, 0, 4096)]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(p.bytes(&dst), &pattern(4096, 3)[..]);
    let s = p.stats(A);
    assert_eq!((s.access_checks, s.access_refused), (1, 0));
}

#[test]
fn a_lost_send_on_a_qp_without_remote_access_is_accepted_by_the_check_and_resent() {
    // ibv_rc_pingpong gives its QPs no access flags: a SEND needs none (IB 10.6.1), only
    // the receive buffer's LOCAL_WRITE. A check after a lost SEND refused it for the QP's
    // missing REMOTE_WRITE and put both QPs in ERR (a CI run of ibv_rc_pingpong -e).
    let o = QpOptions {
        access: bluerdma_sim::core::qp::QpAccessFlags::empty(),
        ..quick()
    };
    let (mut p, c) = connected(&o);
    p.set_oob_access_checks(A, true);
    p.set_oob_access_checks(B, true);
    let src = filled(&mut p, &c, A, 4096, 4);
    let rbuf = buffer(&mut p, &c, B, 4096);
    post_recvs(&mut p, &c, B, &[recv(8, &rbuf, 0, 4096)]);
    p.inject(Fault::Drop, Some(1), |f| f.from == Side::A && f.is_data());
    post(&mut p, &c, A, &[send(9, &src, 0, 4096, None)]);
    let sent = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((sent[0].wr_id, sent[0].status), (9, WcStatus::Success));
    let got = recv_wcs(&mut p, &c, B, 1, ms(100));
    assert_eq!((got[0].wr_id, got[0].status), (8, WcStatus::Success));
    assert_eq!(p.bytes(&rbuf), &pattern(4096, 4)[..]);
    assert_eq!(p.stats(A).access_checks, 1, "the check ran");
    assert_eq!(p.stats(A).access_refused, 0);
    assert_eq!(p.qp_state(B, c.qp(B)).unwrap(), QpState::Rts);
}

#[test]
fn without_checks_a_refused_write_still_ends_in_retry_exceeded() {
    let (mut p, c) = connected(&quick());
    let src = filled(&mut p, &c, A, 4096, 2);
    let dst = buffer(&mut p, &c, B, 4096);
    let mut wr = write(1, &src, 0, &dst, 0, 4096);
    wr.rkey = MrKey::from_raw(dst.key.get() ^ 0x01);
    post(&mut p, &c, A, &[wr]);
    let wcs = send_wcs(&mut p, &c, A, 1, ms(100));
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!(p.stats(A).access_refused, 0);
}

/// Both QPs of `c` through RESET and up again (after an error put one in ERR).
fn restart(p: &mut bluerdma_sim::pair::Pair, c: &bluerdma_sim::pair::Conn) {
    for side in [A, B] {
        p.set_state(side, c.qp(side), QpState::Reset).unwrap();
    }
    for side in [A, B] {
        p.bring_up(side, c.qp(side), c.qp(side.peer()), &quick())
            .unwrap();
    }
}

/// A WRITE of `len` bytes from `src` to `raddr`/`rkey`, and its completion status.
fn write_status(
    p: &mut bluerdma_sim::pair::Pair,
    c: &bluerdma_sim::pair::Conn,
    src: &bluerdma_sim::pair::Mr,
    raddr: u64,
    rkey: MrKey,
    len: usize,
) -> WcStatus {
    let mut wr = write(21, src, 0, src, 0, len);
    wr.raddr = bluerdma_sim::core::addr::VirtAddr(raddr);
    wr.rkey = rkey;
    post(p, c, A, &[wr]);
    send_wcs(p, c, A, 1, ms(100))[0].status
}

#[test]
fn a_window_admits_writes_inside_it_and_refuses_them_outside_and_once_invalidated() {
    let (mut p, c) = checking();
    let src = filled(&mut p, &c, A, 4096, 4);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let target = p.reg_mr(B, c.pd[1], 8192, access).expect("reg_mr");
    let mw = p.alloc_mw(B, c.pd[1]).expect("alloc_mw");
    let key = MrKey::new(mw.index(), mw.key().wrapping_add(1)).unwrap();
    // The MR itself grants no remote access: only the window does.
    assert_eq!(
        write_status(&mut p, &c, &src, target.va, target.key, 64),
        WcStatus::RemAccessErr
    );
    restart(&mut p, &c);
    p.bind_mw(mw, key, &target, (1000, 3000), AccessFlags::REMOTE_WRITE)
        .expect("bind_mw");
    let at = target.va + 1000;
    assert_eq!(
        write_status(&mut p, &c, &src, at, key, 3000),
        WcStatus::Success
    );
    let bytes = p.bytes(&target).to_vec();
    assert_eq!(&bytes[1000..4000], &pattern(4096, 4)[..3000]);
    assert!(bytes[..1000].iter().chain(&bytes[4000..]).all(|&b| b == 0));
    // One byte past the window's end.
    assert_eq!(
        write_status(&mut p, &c, &src, at + 1, key, 3000),
        WcStatus::RemAccessErr
    );
    restart(&mut p, &c);
    p.invalidate_mw(B, key).expect("invalidate_mw");
    assert_eq!(
        write_status(&mut p, &c, &src, at, key, 8),
        WcStatus::RemAccessErr
    );
    assert!(
        p.invalidate_mw(B, key).is_err(),
        "an unbound window cannot be invalidated"
    );
}

#[test]
fn rereg_keeps_the_key_for_new_access_and_changes_it_for_a_new_pd() {
    let (mut p, c) = checking();
    let src = filled(&mut p, &c, A, 4096, 5);
    let mut target = p
        .reg_mr(B, c.pd[1], 4096, AccessFlags::LOCAL_WRITE)
        .expect("reg_mr");
    let key = target.key;
    assert_eq!(
        write_status(&mut p, &c, &src, target.va, key, 100),
        WcStatus::RemAccessErr
    );
    restart(&mut p, &c);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    p.rereg_mr(&mut target, c.pd[1], rw).expect("rereg access");
    assert_eq!(target.key, key, "new access, same key");
    assert_eq!(
        write_status(&mut p, &c, &src, target.va, key, 100),
        WcStatus::Success
    );
    assert_eq!(&p.bytes(&target)[..100], &pattern(4096, 5)[..100]);
    let other = p.engine(B).alloc_pd().expect("alloc_pd");
    p.rereg_mr(&mut target, other, rw).expect("rereg PD");
    assert_ne!(target.key, key, "a new PD, a new key");
    assert_eq!(target.key.index(), key.index());
    assert_eq!(
        write_status(&mut p, &c, &src, target.va, key, 100),
        WcStatus::RemAccessErr,
        "the old PD's key is refused"
    );
}
