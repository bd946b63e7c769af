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

use bluerdma_linux::BackendKind;
use bluerdma_tests::served::Served;
use bluerdma_tests::shared::{open, setup, SharedPair};

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

    let mut pair = SharedPair::connect(env!("CARGO_BIN_EXE_verbs_peer"), (&a, "ra"), &b, 14);
    pair.write_both_ways(STEP);
    pair.child.quit();
}
