//! A device shared between processes on the RTL simulator's socket protocol: two
//! `bluerdma-sim serve` cards (`+rtl:CSR/DMA`), each owned by its `bluerdma-devd`, which
//! answers the card's DMA beats from every client's memory. This process and a
//! `verbs_peer` child share card A; each WRITEs to card B and the bytes are checked; then
//! B WRITEs into each of them.
//!
//! Addresses 127.0.7.21 and .22 (backend_rtl uses 127.0.7.1..), so other test binaries may
//! run at the same time.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::engine::{SendOp, WcStatus};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_linux::{BackendKind, Endpoint};
use bluerdma_tests::served::Served;
use bluerdma_tests::shared::{open, setup, Peer};
use bluerdma_tests::{fill_pattern, line_field, parse_hex, pattern_mismatch, raw_wr, ALL};

const KIB: usize = 1024;
const STEP: Duration = Duration::from_secs(60);

#[test]
fn two_processes_share_an_rtl_protocol_card() {
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 7, 21), Ipv4Addr::new(127, 0, 7, 22));
    let (card_a, card_b) = (Served::rtl(ip_a, "rtl-sa"), Served::rtl(ip_b, "rtl-sb"));
    let devices = format!(
        "ra={ip_a}{},rb={ip_b}{}",
        card_a.rtl_backend(),
        card_b.rtl_backend()
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("verbs_shared_rtl-{}", std::process::id()));
    setup(&devices, &dir);
    let a = open("ra").expect("open ra through its daemon");
    let b = open("rb").expect("open rb through its daemon");
    assert_eq!(
        (a.backend(), b.backend()),
        (BackendKind::Rtl, BackendKind::Rtl)
    );

    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let qa = pa.create_qp(&ca, &ca).unwrap();
    let qb1 = pb.create_qp(&cb, &cb).unwrap();
    let qb2 = pb.create_qp(&cb, &cb).unwrap();
    let mut ma = pa.alloc_mr(64 * KIB, ALL).unwrap();
    let mut mb = pb.alloc_mr(256 * KIB, ALL).unwrap();
    let ep = |qpn: Qpn, ip| Endpoint { qpn, ip, psn: 0 };
    qa.connect(ep(qb1.qpn(), ip_b), 0, 14, 7).unwrap();
    qb1.connect(ep(qa.qpn(), ip_a), 0, 14, 7).unwrap();

    let (mut child, ready) = Peer::spawn(env!("CARGO_BIN_EXE_verbs_peer"), "ra", 64 * KIB);
    let hex = |k| {
        line_field(&ready, k)
            .and_then(parse_hex)
            .expect("READY field")
    };
    let (child_qpn, child_addr, child_key) = (hex("qpn"), hex("addr"), hex("key"));
    let r = child.ask(&format!(
        "CONNECT qpn={:#x} ip={ip_b} psn=0 mypsn=0 timeout=14 retries=7",
        qb2.qpn().get()
    ));
    assert_eq!(r, "OK");
    qb2.connect(ep(Qpn::from_raw(child_qpn as u32), ip_a), 0, 14, 7)
        .unwrap();

    // A WRITE from each process on the shared card A into B's memory.
    fill_pattern(ma.bytes_mut().unwrap(), 11, 0);
    let w = raw_wr(
        1,
        SendOp::Write,
        (ma.addr(), ma.key()),
        64 * KIB,
        (mb.addr(), mb.key()),
    );
    // SAFETY: the MRs outlive the WRITE (its completion is awaited).
    unsafe { qa.post_send(&[w]) }.unwrap();
    assert_eq!(ca.wait(1, STEP).unwrap()[0].status, WcStatus::Success);
    assert_eq!(child.ask("FILL off=0 len=65536 seed=12"), "OK");
    let r = child.ask(&format!(
        "WRITE raddr={:#x} rkey={:#x} off=0 len=65536",
        mb.addr() + 128 * 1024,
        mb.key().get()
    ));
    assert_eq!(r, "DONE status=0");
    let got = mb.bytes().unwrap();
    assert_eq!(
        pattern_mismatch(&got[..64 * KIB], 11, 0),
        None,
        "this process's bytes"
    );
    assert_eq!(
        pattern_mismatch(&got[128 * KIB..192 * KIB], 12, 0),
        None,
        "the child's bytes"
    );

    // And B WRITEs into the memory of each process on A.
    fill_pattern(&mut mb.bytes_mut().unwrap()[..16 * KIB], 13, 0);
    for (qp, addr, key) in [
        (&qb1, ma.addr(), ma.key()),
        (&qb2, child_addr, MrKey::from_raw(child_key as u32)),
    ] {
        let w = raw_wr(
            2,
            SendOp::Write,
            (mb.addr(), mb.key()),
            16 * KIB,
            (addr, key),
        );
        // SAFETY: as above.
        unsafe { qp.post_send(&[w]) }.unwrap();
        assert_eq!(cb.wait(1, STEP).unwrap()[0].status, WcStatus::Success);
    }
    assert_eq!(
        pattern_mismatch(&ma.bytes().unwrap()[..16 * KIB], 13, 0),
        None
    );
    assert_eq!(child.ask("CHECK off=0 len=16384 seed=13"), "OK");
    child.quit();
}
