//! The card does not enforce protection domains (hardware-contract.md correction 10): a QP
//! can write into an MR of another PD of the same device. The emulated NIC's strict mode
//! adds the check, so the gap is visible and tested.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr, WcStatus};
use bluerdma_linux::{Context, DeviceSpec};
use bluerdma_sim::link::MemHub;

const IP0: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IP1: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Writes into an MR of the responder's second PD through a QP of its first PD; returns
/// the completion status and whether any byte arrived.
fn cross_pd_write(strict: bool) -> (WcStatus, bool, String) {
    let hub = MemHub::new();
    let a = Context::open_emulated(
        DeviceSpec::new("blue0", IP0),
        Box::new(hub.attach(IP0).unwrap()),
    )
    .unwrap();
    let mut spec = DeviceSpec::new("blue1", IP1);
    spec.strict_pd = strict;
    let b = Context::open_emulated(spec, Box::new(hub.attach(IP1).unwrap())).unwrap();
    let (pa, pb_qp, pb_mr) = (
        a.alloc_pd().unwrap(),
        b.alloc_pd().unwrap(),
        b.alloc_pd().unwrap(),
    );
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb = pb_qp.create_qp(&cb, &cb).unwrap();
    // The default 67 ms timeout and 7 retries: a loaded machine may delay the ACK by far
    // more than 4 ms (timeout 10, which this test used and which failed under load); the
    // strict card's silent drop still fails within 8 x 67 ms.
    qa.connect(qb.endpoint(0), 0, 14, 7).unwrap();
    qb.connect(qa.endpoint(0), 0, 14, 7).unwrap();
    let mut src = pa.alloc_mr(4096, ALL).unwrap();
    src.bytes_mut().unwrap().fill(0x5A);
    let dst = pb_mr.alloc_mr(4096, ALL).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write,
        laddr: VirtAddr(src.addr()),
        len: 4096,
        lkey: src.key(),
        raddr: VirtAddr(dst.addr()),
        rkey: dst.key(),
        signaled: true,
        solicited: false,
    };
    // SAFETY: the MRs outlive the completion.
    unsafe { qa.post_send(&[wr]).unwrap() };
    let wc = ca.wait(1, Duration::from_secs(5)).unwrap();
    let arrived = dst.bytes().unwrap().contains(&0x5A);
    (wc[0].status, arrived, b.card_stats())
}

#[test]
fn default_card_lets_a_qp_write_into_another_pds_mr_like_the_hardware() {
    let (status, arrived, _) = cross_pd_write(false);
    assert_eq!(status, WcStatus::Success);
    assert!(arrived, "the hardware gap: the PD is not checked");
}

#[test]
fn strict_card_refuses_a_write_across_protection_domains() {
    let (status, arrived, card) = cross_pd_write(true);
    assert_eq!(status, WcStatus::RetryExcErr);
    assert!(!arrived, "not one byte written");
    assert!(card.contains("strict_pd_drops="), "{card}");
}
