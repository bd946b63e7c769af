//! The verbs API over the RTL simulator's socket protocol: devices `+rtl:CSR/DMA` of the
//! device list, served by `bluerdma-sim serve` processes (the emulated card behind the
//! CSR and DMA sockets, on the UDP link), exactly as the cocotb simulation of the RTL
//! would serve them. WRITE, READ and SEND/RECV from 4 KiB to 1 MiB, every byte checked;
//! then a mixed pair: one RTL-protocol card and one emulated card in this process; and a
//! driver that closes right after sending: the card still reads the frames it was handed.
//!
//! Each test uses its own addresses in 127.0.7.0/24, so other test binaries may run at
//! the same time.

use std::net::Ipv4Addr;

use bluerdma_core::wire::ud::UD_MAX_PAYLOAD;
use bluerdma_linux::BackendKind;
use bluerdma_tests::connect_pair;
use bluerdma_tests::raw::{collect_raw, send_raw, ud_frame, WAIT};
use bluerdma_tests::served::{exercise, open_all, Served};

#[test]
fn write_read_and_send_over_two_served_cards_move_every_byte() {
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 7, 1), Ipv4Addr::new(127, 0, 7, 2));
    let (card_a, card_b) = (Served::rtl(ip_a, "rtl-a"), Served::rtl(ip_b, "rtl-b"));
    let devs = open_all(&format!(
        "blue0={ip_a}{},blue1={ip_b}{}",
        card_a.rtl_backend(),
        card_b.rtl_backend()
    ));
    let (a, b) = (&devs[0], &devs[1]);
    assert_eq!(
        (a.backend(), b.backend()),
        (BackendKind::Rtl, BackendKind::Rtl)
    );
    let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
    exercise(a, b, (&sa, &sb), 1);
    // The card's side moved the bytes through the DMA socket.
    assert!(a.card_stats().contains("bytes_read"), "{}", a.card_stats());
}

#[test]
fn a_mixed_pair_of_an_rtl_card_and_an_emulated_card_works_both_ways() {
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 7, 3), Ipv4Addr::new(127, 0, 7, 4));
    let card_a = Served::rtl(ip_a, "rtl-c");
    // The emulated card answers at once, but its peer's DMA socket absorbs about 2 MB/s: a
    // 1 MiB READ response takes half a second to land, far beyond the 67 ms of timeout 14.
    // The fast side of a mixed pair takes the slow side's ACK-timeout floor and window.
    let devs = open_all(&format!(
        "blue0={ip_a}{},blue1={ip_b};ack_timeout_min=2;send_window=16",
        card_a.rtl_backend()
    ));
    let (a, b) = (&devs[0], &devs[1]);
    assert_eq!(
        (a.backend(), b.backend()),
        (BackendKind::Rtl, BackendKind::Emulated)
    );
    let (sa, sb) = connect_pair(a, b, (0, 0), 14, 7);
    exercise(a, b, (&sa, &sb), 7);
    exercise(b, a, (&sb, &sa), 9);
}

#[test]
fn frames_sent_just_before_close_still_leave_the_card() {
    // A UD SEND completes when posted, and ibv_ud_pingpong's server exits right after its
    // last one: the card has fetched the descriptors then, but reads each frame from the
    // driver's memory over the DMA socket afterwards. Closing waits for those reads.
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 7, 5), Ipv4Addr::new(127, 0, 7, 6));
    let (card_a, card_b) = (Served::rtl(ip_a, "rtl-e"), Served::rtl(ip_b, "rtl-f"));
    let mut devs = open_all(&format!(
        "blue0={ip_a}{},blue1={ip_b}{}",
        card_a.rtl_backend(),
        card_b.rtl_backend()
    ));
    let b = devs.pop().expect("two devices");
    let a = devs.pop().expect("two devices");
    let rx = collect_raw(&b);
    let sent: Vec<Vec<u8>> = (0..8u8)
        .map(|i| ud_frame(ip_a, ip_b, i, UD_MAX_PAYLOAD - usize::from(i)))
        .collect();
    for f in &sent {
        send_raw(&a, f);
    }
    drop(a);
    for (i, f) in sent.iter().enumerate() {
        let got = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("frame {i} of {} never arrived", sent.len()));
        assert!(
            got == *f,
            "frame {i}: {} bytes, not the {} sent",
            got.len(),
            f.len()
        );
    }
}
