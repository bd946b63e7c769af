//! The verbs API over the RTL simulator's socket protocol: devices `+rtl:CSR/DMA` of the
//! device list, served by `bluerdma-sim serve` processes (the emulated card behind the
//! CSR and DMA sockets, on the UDP link), exactly as the cocotb simulation of the RTL
//! would serve them. WRITE, READ and SEND/RECV from 4 KiB to 1 MiB, every byte checked;
//! then a mixed pair: one RTL-protocol card and one emulated card in this process.
//!
//! Each test uses its own addresses in 127.0.7.0/24, so other test binaries may run at
//! the same time.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::engine::{RecvWr, SendOp, WcOpcode, WcStatus};
use bluerdma_linux::devices::{self, DeviceList, Settings};
use bluerdma_linux::{BackendKind, Context};
use bluerdma_tests::served::Served;
use bluerdma_tests::{assert_bytes_eq, connect_pair, fill_pattern, wr, Side, ALL};

const WAIT: Duration = Duration::from_secs(60);
const SIZES: [usize; 3] = [4096, 65536 + 17, 1 << 20];

/// Opens every device of the inline list `text`.
fn open_all(text: &str) -> Vec<Context> {
    let list = DeviceList::parse_inline(text).unwrap();
    let settings = Settings::from_vars(&|_| None).unwrap();
    list.entries()
        .iter()
        .map(|e| devices::open(&list, e, e.spec(), &settings).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn one(cq: &bluerdma_linux::Cq, what: &str) -> bluerdma_core::engine::WorkCompletion {
    let got = cq.wait(1, WAIT).unwrap();
    assert_eq!(got.len(), 1, "{what}: no completion within {WAIT:?}");
    got[0]
}

/// WRITE and READ from `a` to `b`, and SEND from `a` into a receive WR of `b`, at each
/// size, every byte checked.
fn exercise(a: &Context, b: &Context, (sa, sb): (&Side, &Side), seed: u32) {
    let len_max = *SIZES.iter().max().unwrap();
    let mut src = sa.pd.alloc_mr(len_max, ALL).unwrap();
    let dst = sb.pd.alloc_mr(len_max, ALL).unwrap();
    let sink = sa.pd.alloc_mr(len_max, ALL).unwrap();
    for (k, len) in SIZES.into_iter().enumerate() {
        let k = k as u64;
        fill_pattern(src.bytes_mut().unwrap(), seed + k as u32, 0);
        // SAFETY: the MRs outlive the completion waited for.
        unsafe {
            sa.qp
                .post_send(&[wr(k, SendOp::Write, &src, 0, len, &dst, 0)])
        }
        .unwrap();
        let w = one(&sa.cq, "WRITE");
        assert_eq!(
            (w.wr_id, w.status),
            (k, WcStatus::Success),
            "WRITE {len} B\n{}\n{}",
            a.dump(),
            b.dump()
        );
        assert_bytes_eq(
            &format!("WRITE {len} B"),
            &dst.bytes().unwrap()[..len],
            &src.bytes().unwrap()[..len],
        );

        // SAFETY: as above.
        unsafe {
            sa.qp
                .post_send(&[wr(10 + k, SendOp::Read, &sink, 0, len, &dst, 0)])
        }
        .unwrap();
        let r = one(&sa.cq, "READ");
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (10 + k, WcStatus::Success, WcOpcode::RdmaRead),
            "READ {len} B\n{}\n{}",
            a.dump(),
            b.dump()
        );
        assert_bytes_eq(
            &format!("READ {len} B"),
            &sink.bytes().unwrap()[..len],
            &dst.bytes().unwrap()[..len],
        );

        fill_pattern(src.bytes_mut().unwrap(), seed + 100 + k as u32, 0);
        let recv = RecvWr {
            wr_id: 20 + k,
            addr: bluerdma_core::addr::VirtAddr(dst.addr()),
            len: len_max as u32,
            lkey: dst.key(),
        };
        // SAFETY: the MR outlives the completion.
        unsafe { sb.qp.post_recv(&[recv]) }.unwrap();
        let mut send = wr(30 + k, SendOp::Send, &src, 0, len, &dst, 0);
        send.raddr = bluerdma_core::addr::VirtAddr(0);
        // SAFETY: as above.
        unsafe { sa.qp.post_send(&[send]) }.unwrap();
        let s = one(&sa.cq, "SEND");
        let r = one(&sb.cq, "RECV");
        assert_eq!(
            (s.status, r.status, r.opcode, r.byte_len, r.wr_id),
            (
                WcStatus::Success,
                WcStatus::Success,
                WcOpcode::Recv,
                len as u32,
                20 + k
            ),
            "SEND {len} B\n{}\n{}",
            a.dump(),
            b.dump()
        );
        assert_bytes_eq(
            &format!("SEND {len} B"),
            &dst.bytes().unwrap()[..len],
            &src.bytes().unwrap()[..len],
        );
    }
}

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
    // The fast side of a mixed pair needs the slow side's ACK-timeout floor.
    let devs = open_all(&format!(
        "blue0={ip_a}{},blue1={ip_b};ack_timeout_min=1",
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
