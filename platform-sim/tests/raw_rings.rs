//! The emulated card driven through raw rings with the core's descriptors (no engine):
//! what a WRITE, a READ request, a key violation and a PSN gap do, as the hardware contract
//! says. Two cards on an in-memory link (deterministic) unless a test says otherwise.
//!
//! Every test runs twice, once per way of attaching the driver (module `in_process` and
//! module `rtl_protocol`): in-process calls, and the RTL simulator's socket protocol against
//! served cards (JSON register lines, one DMA line per bus beat answered from the driver's
//! own memory). The last tests link two served cards with the simulator's two-card link and
//! run the `bluerdma-sim serve` command.

mod raw;

use bluerdma_core::regs::Counter;
use raw::*;

fn write_lands_in_the_peers_memory_with_the_reports_the_contract_describes(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let len = 64 * 1024 + 100;
    let src = buffer(len, |i| (i * 7 + 3) as u8);
    let dst = vec![0u8; len + 4096];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    // Unaligned remote start: 100 bytes into the buffer.
    let raddr = dst.as_ptr() as u64 + 100;
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            rkey,
            len as u32,
            0x10,
        )])
        .unwrap();
    // Until the LAST packet's report and the quiet-timer report are in: on the RTL path
    // every DMA beat is a line over TCP, and a loaded machine can pause longer than any
    // fixed quiet period between two reports.
    let mut reports = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        reports.extend(s1.drv.collect_meta(pair.quiet(), MAX));
        let last = packets(&reports)
            .iter()
            .any(|(op, _)| *op == RdmaOpcode::WriteLast);
        let quiet = reports
            .iter()
            .any(|r| matches!(r, MetaReport::Ack(a) if a.is_send_by_local_hw));
        if last && quiet || std::time::Instant::now() > deadline {
            break;
        }
    }
    let differs = dst[100..100 + len]
        .iter()
        .zip(&src)
        .position(|(d, s)| d != s);
    assert_eq!(
        differs, None,
        "payload arrived intact (first differing byte)"
    );
    assert!(
        dst[..100].iter().all(|b| *b == 0),
        "nothing written before the range"
    );
    assert!(
        dst[100 + len..].iter().all(|b| *b == 0),
        "nothing written after the range"
    );
    // Packets split at 4 KiB-aligned remote addresses: an unaligned start adds one packet.
    let n = ((raddr + len as u64 - 1) / 4096 - raddr / 4096 + 1) as u32;
    let pk = packets(&reports);
    assert_eq!(
        pk,
        vec![
            (RdmaOpcode::WriteFirst, 0x10),
            (RdmaOpcode::WriteLast, 0x10 + n - 1)
        ],
        "FIRST and LAST are reported, MIDDLE is not: {reports:?}"
    );
    // The quiet timer reports the receive window; its last report holds every PSN.
    let ack = reports
        .iter()
        .rev()
        .find_map(|r| match r {
            MetaReport::Ack(a) if a.is_send_by_local_hw => Some(*a),
            _ => None,
        })
        .expect("a quiet-timer report");
    for psn in 0x10..0x10 + n {
        let bit = psn.wrapping_sub(ack.psn_now.wrapping_sub(112)) & 0xFF_FFFF;
        assert!(
            bit < 128 && ack.now_bitmap >> bit & 1 == 1,
            "psn {psn:#x} in the bitmap"
        );
    }
    assert_eq!(ack.qpn.get(), QPN1);
    let stats = pair.cards[1].nic().stats().snapshot();
    assert_eq!(stats.rx_payload_bytes, len as u64, "{stats}");
    assert_eq!(stats.naks_sent, 0);
    if let Card::Rtl { driver, .. } = &pair.cards[1] {
        // Every payload byte crossed the DMA socket as 32-byte beats.
        let beats = driver.dma_client.stats();
        assert!(
            beats.bytes_written >= len as u64 && beats.write_beats >= (len / 32) as u64,
            "{beats:?}"
        );
        assert_eq!(beats.faults, 0, "{beats:?}");
    }
}

fn rkey_violation_writes_nothing_and_bumps_the_right_counter(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(8192, |i| i as u8 | 1);
    let dst = vec![0u8; 8192];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let bad_key = MrKey::new(2, 0x23).unwrap();
    let raddr = dst.as_ptr() as u64;
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            bad_key,
            8192,
            0,
        )])
        .unwrap();
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
    assert!(
        reports.is_empty(),
        "no report for a dropped packet: {reports:?}"
    );
    assert!(dst.iter().all(|b| *b == 0), "not one byte written");
    let regs = pair.cards[1].nic().regs();
    let n = (raddr + 8191) / 4096 - raddr / 4096 + 1;
    // The quiet period says no report came; the card's counters are read once they have
    // counted (a loaded machine may run the card's receive thread later than that).
    let counted = |c: Counter, want: u64| wait_for(|| regs.counter(c) as u64 >= want);
    counted(Counter::InvalidMrKey, n);
    assert_eq!(
        regs.counter(Counter::InvalidMrKey) as u64,
        n,
        "every packet counted"
    );
    assert_eq!(regs.counter(Counter::MemOutOfBounds), 0);

    // Out of bounds: one byte past the MR.
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr + 1,
            rkey,
            8192,
            2,
        )])
        .unwrap();
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
    assert!(packets(&reports)
        .iter()
        .all(|(op, _)| *op != RdmaOpcode::WriteLast));
    counted(Counter::MemOutOfBounds, 1);
    assert!(regs.counter(Counter::MemOutOfBounds) >= 1);
    assert_eq!(dst[8191], 0, "the last byte of the MR is untouched");
}

fn qp_without_remote_write_refuses_writes(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(AccessFlags::LOCAL_WRITE);
    let src = buffer(100, |_| 9);
    let dst = vec![0u8; 100];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            dst.as_ptr() as u64,
            rkey,
            100,
            0,
        )])
        .unwrap();
    s1.drv.collect_meta(pair.quiet(), MAX);
    assert_eq!(
        pair.cards[1].nic().regs().counter(Counter::InvalidQpAccess),
        1
    );
    assert!(dst.iter().all(|b| *b == 0));
}

fn read_request_is_reported_with_its_extension_descriptor(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let sink = vec![0u8; 4096];
    let lkey = MrKey::new(1, 0x11).unwrap();
    register(&mut s0, &pair.cards[0], &sink, lkey, ALL, 0);
    let raddr = 0x7000_1234_5000u64;
    let rkey = MrKey::new(9, 0x99).unwrap();
    let mut req = write_req(WorkReqOpcode::Read, &sink, lkey, raddr, rkey, 4096, 0x42);
    req.seg1.len = 4096;
    s0.drv.post_send(&[req]).unwrap();
    let reports = s1.drv.collect_meta(pair.quiet(), MAX);
    let (info, ext) = reports
        .iter()
        .find_map(|r| match r {
            MetaReport::ReadRequest(i, e) => Some((*i, *e)),
            _ => None,
        })
        .expect("a READ request report");
    assert_eq!(info.opcode, RdmaOpcode::ReadRequest);
    assert_eq!(info.psn, 0x42);
    assert_eq!(info.raddr.0, raddr);
    assert_eq!(
        info.rkey, rkey,
        "the card does not check a READ's rkey (12a)"
    );
    assert_eq!(info.total_len, 4096);
    assert_eq!(ext.laddr.0, sink.as_ptr() as u64);
    assert_eq!(ext.lkey, lkey);
    assert_eq!(ext.total_len, 4096);
}

fn psn_gap_produces_the_nak_packet_and_the_local_report(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    let src = buffer(4096, |i| i as u8);
    let dst = vec![0u8; 4096];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src, lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let raddr = dst.as_ptr() as u64;
    // PSN 0 arrives, then PSN 200: PSNs 1..199 were lost and slide out of the window.
    s0.drv
        .post_send(&[
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 0),
            write_req(WorkReqOpcode::Write, &src, lkey, raddr, rkey, 64, 200),
        ])
        .unwrap();
    let local = s1.drv.collect_meta(pair.quiet(), MAX);
    let (nak, extra) = local
        .iter()
        .find_map(|r| match r {
            MetaReport::Nak(a, e) => Some((*a, *e)),
            _ => None,
        })
        .expect("a local NAK report");
    assert!(nak.is_send_by_local_hw && nak.is_packet_lost && nak.is_window_slided);
    assert_eq!(
        nak.psn_now,
        200 & !0xF,
        "psn_now is the newest stride's first PSN"
    );
    assert_eq!(nak.qpn.get(), QPN1);
    assert_eq!(nak.msn, 0, "first NAK of this QP");
    assert_ne!(extra.pre_bitmap, 0);
    // The NAK packet went to the requester, whose card reports it (NakRemoteHw).
    let remote = s0.drv.collect_meta(pair.quiet(), MAX);
    let (rnak, _) = remote
        .iter()
        .find_map(|r| match r {
            MetaReport::Nak(a, e) => Some((*a, *e)),
            _ => None,
        })
        .expect("the requester sees the NAK");
    assert!(!rnak.is_send_by_local_hw && !rnak.is_send_by_driver && rnak.is_packet_lost);
    assert_eq!(
        rnak.qpn.get(),
        QPN0,
        "addressed to the peer QP from the QP context"
    );
    assert_eq!(rnak.psn_now, nak.psn_now);
    assert_eq!(pair.cards[1].nic().stats().snapshot().naks_sent, 1);
}
/// The card reads a WQE's payload into its frames packet by packet; a read that faults
/// half-way (the WQE runs past what the host mapped) sends none of the WQE's packets, as
/// when the card read the whole payload first: no half message on the wire.
fn a_payload_read_fault_sends_none_of_the_wqes_packets(pair: &Pair) {
    let (mut s0, mut s1) = pair.open(ALL);
    // Only the first 4 KiB of `src` are registered (mapped for the card); the WQE asks for
    // three packets' worth.
    let src = buffer(64 * 1024, |i| i as u8);
    let dst = vec![0u8; 16 * 1024];
    let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
    register(&mut s0, &pair.cards[0], &src[..4096], lkey, ALL, 0);
    register(&mut s1, &pair.cards[1], &dst, rkey, ALL, 0);
    let raddr = dst.as_ptr() as u64;
    let faults = || pair.cards[0].nic().stats().snapshot().dma_faults;
    let before = faults();
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            rkey,
            3 * 4096,
            0x20,
        )])
        .unwrap();
    wait_for(|| faults() > before);
    assert_eq!(faults(), before + 1, "one payload read fault");
    // A WRITE that fits goes out after it, and only its packet arrives.
    s0.drv
        .post_send(&[write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            raddr,
            rkey,
            64,
            0x30,
        )])
        .unwrap();
    let mut reports = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !packets(&reports).iter().any(|(_, psn)| *psn == 0x30)
        && std::time::Instant::now() < deadline
    {
        reports.extend(s1.drv.collect_meta(pair.quiet(), MAX));
    }
    assert_eq!(
        packets(&reports),
        vec![(RdmaOpcode::WriteOnly, 0x30)],
        "none of the faulted WQE's packets: {reports:?}"
    );
    assert_eq!(&dst[..64], &src[..64]);
    assert!(dst[64..].iter().all(|b| *b == 0), "nothing else written");
}

/// In process only: over the RTL protocol a read outside the map answers zeros and counts
/// the fault in the DMA client, not in the card (`rtl_protocol.rs`).
#[test]
fn in_process_a_payload_read_fault_sends_none_of_the_wqes_packets() {
    a_payload_read_fault_sends_none_of_the_wqes_packets(&Pair::in_memory(Attach::InProcess));
}

on_both_attaches!(
    write_lands_in_the_peers_memory_with_the_reports_the_contract_describes,
    rkey_violation_writes_nothing_and_bumps_the_right_counter,
    qp_without_remote_write_refuses_writes,
    read_request_is_reported_with_its_extension_descriptor,
    psn_gap_produces_the_nak_packet_and_the_local_report,
);

#[test]
fn served_cards_carry_a_write_and_a_nak_over_the_simulators_two_card_link() {
    let pair = Pair::two_card_link();
    write_lands_in_the_peers_memory_with_the_reports_the_contract_describes(&pair);
    let [sent, received] = [pair.links[0].snapshot(), pair.links[1].snapshot()];
    assert!(sent.frames_sent >= 17, "the WRITE's packets: {sent:?}");
    assert_eq!(
        received.frames_received, sent.frames_sent,
        "every base64 line arrived"
    );
    assert_eq!(
        sent.frames_unroutable, 0,
        "none sent before the link was up"
    );
    drop(pair);

    // The NAK travels back from card 1 to card 0: both directions of the link.
    let pair = Pair::two_card_link();
    psn_gap_produces_the_nak_packet_and_the_local_report(&pair);
    let [s0, s1] = [pair.links[0].snapshot(), pair.links[1].snapshot()];
    assert_eq!(s1.frames_sent, 1, "card 1 sent the NAK and nothing else");
    assert_eq!(s0.frames_received, 1);
    assert_eq!(s1.frames_received, s0.frames_sent);
}

/// The `bluerdma-sim serve` command: a driver attached over the simulator's sockets writes
/// through the loopback bench's link into its own memory, and SIGTERM stops the card
/// cleanly.
#[test]
fn serve_command_runs_a_card_a_simulator_driver_can_use() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Child, Command, Stdio};

    /// Kills the server if the test fails before it is stopped.
    struct Server(Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_bluerdma-sim"))
            .args([
                "serve",
                "--csr-port",
                "0",
                "--dma-port",
                "0",
                "--log",
                "warn",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(server.0.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    let port = |label: &str| -> u16 {
        let at = ready
            .find(label)
            .unwrap_or_else(|| panic!("{label} in {ready:?}"));
        let digits: String = ready[at + label.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    let ports = ServePorts {
        csr: port("CSR 127.0.0.1:"),
        dma: port("DMA 127.0.0.1:"),
    };
    {
        let driver = RtlAttach::connect(ports).unwrap();
        let mut drv = RawDriver::open(Regs::Rtl(&driver.regs), &driver.dma).unwrap();
        drv.configure(MAC0, IP0).unwrap();
        let q0 = Qpn::from_raw(QPN0);
        drv.manage_qp(true, q0, q0, IP0, MAC0, ALL, Pmtu::Mtu4096)
            .unwrap();
        let src = buffer(5000, |i| (i * 13) as u8);
        let dst = vec![0u8; 5000];
        let (lkey, rkey) = (MrKey::new(1, 0x11).unwrap(), MrKey::new(2, 0x22).unwrap());
        for (buf, key, pgt) in [(&src, lkey, 0), (&dst, rkey, 1)] {
            let mut mem = HostMemory::new(driver.map.clone());
            drv.register_mr(
                &mut mem,
                key,
                VirtAddr(buf.as_ptr() as u64),
                buf.len(),
                ALL,
                pgt,
                PageSize::Size2M,
                1,
            )
            .unwrap();
        }
        let mut req = write_req(
            WorkReqOpcode::Write,
            &src,
            lkey,
            dst.as_ptr() as u64,
            rkey,
            5000,
            0,
        );
        req.seg0.dqpn = q0;
        req.seg0.dqp_ip = IP0;
        req.seg1.mac = MAC0;
        drv.post_send(&[req]).unwrap();
        let reports = drv.collect_meta(Attach::Rtl.quiet(), MAX);
        assert_eq!(dst, src, "the WRITE came back through the loopback link");
        // One packet per 4 KiB page of the destination touched.
        let raddr = dst.as_ptr() as u64;
        let last_psn = ((raddr + 4999) / 4096 - raddr / 4096) as u32;
        assert!(
            packets(&reports).contains(&(RdmaOpcode::WriteLast, last_psn)),
            "{reports:?}"
        );
    }
    // SAFETY: kill(2) on our own child's pid has no memory effects.
    let sent = unsafe { libc::kill(server.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM delivered");
    let status = server.0.wait().unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    // configure (2), ManageQp, and UpdatePgt + UpdateMrTable per MR (4).
    assert!(
        rest.contains(" commands=7 ") && rest.contains(" rx_payload_bytes=5000 "),
        "final counters: {rest}"
    );
}

/// Polls `done` until it holds, for at most 30 s (what the card counts on its own threads
/// arrives when they run; the assertion after the wait says what was expected).
fn wait_for(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
