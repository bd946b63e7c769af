//! Both ways of running the emulated card (`BLUERDMA_CARD`): inline, in the driver's own
//! threads (the default), and threaded (two threads per card), on the link emulated devices
//! use (UDP with shared-memory rings between the cards of this host). Each moves a WRITE of
//! 1 MiB and a READ of 64 KiB intact, with completions that say so, the application
//! spinning on its CQ (the inline card's receive side then runs in the application's
//! thread).
//!
//! One test in this binary: it sets the process's environment.

use std::net::Ipv4Addr;
use std::time::Duration;

use bluerdma_core::engine::{SendOp, SendWr, WcOpcode, WcStatus};
use bluerdma_linux::backend::emulated::open_on_udp;
use bluerdma_linux::{Context, DeviceSpec};
use bluerdma_sim::inproc::DeviceLinkOptions;
use bluerdma_sim::link::ShmConfig;
use bluerdma_sim::model::CARD_ENV;
use bluerdma_tests::{assert_bytes_eq, connect_pair, fill_pattern, wr, ALL};

const WAIT: Duration = Duration::from_secs(20);

fn open(name: &str, ip: Ipv4Addr, opts: &DeviceLinkOptions) -> Context {
    let spec = DeviceSpec::new(name, ip);
    let backend = open_on_udp(&spec, opts).unwrap();
    Context::open_backend(spec, backend, None).unwrap()
}

fn write_and_read(mode: &str, ips: [Ipv4Addr; 2], port: u16, shm: &std::path::Path) {
    let opts = DeviceLinkOptions {
        port: Some(port),
        shm: Some(ShmConfig::in_dir(shm)),
        ..DeviceLinkOptions::default()
    };
    let (a, b) = (open("blue0", ips[0], &opts), open("blue1", ips[1], &opts));
    let (sa, sb) = connect_pair(&a, &b, (100, 500), 14, 7);
    let len = 1 << 20;
    let mut src = sa.pd.alloc_mr(len, ALL).unwrap();
    fill_pattern(src.bytes_mut().unwrap(), 0x51, 0);
    let mut dst = sb.pd.alloc_mr(len, ALL).unwrap();
    let run = |w: SendWr, opcode: WcOpcode| {
        // SAFETY: both MRs outlive the completion waited for here.
        unsafe { sa.qp.post_send(&[w]) }.unwrap();
        let wc = sa.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc.len(), 1, "{mode}: {opcode:?} completion; {}", a.dump());
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode),
            (w.wr_id, WcStatus::Success, opcode),
            "{mode}"
        );
    };
    run(
        wr(1, SendOp::Write, &src, 0, len, &dst, 0),
        WcOpcode::RdmaWrite,
    );
    assert_bytes_eq(mode, dst.bytes().unwrap(), src.bytes().unwrap());

    // READ back the first 64 KiB of a new pattern written into the responder's MR.
    let part = 64 << 10;
    fill_pattern(&mut dst.bytes_mut().unwrap()[..part], 0x77, 0);
    run(
        wr(2, SendOp::Read, &src, 0, part, &dst, 0),
        WcOpcode::RdmaRead,
    );
    assert_bytes_eq(
        mode,
        &src.bytes().unwrap()[..part],
        &dst.bytes().unwrap()[..part],
    );
}

#[test]
fn inline_and_threaded_cards_move_bytes_intact() {
    let shm = std::env::temp_dir().join(format!("bluerdma-card-modes-{}", std::process::id()));
    let port = 40_000 + (std::process::id() % 20_000) as u16;
    std::env::remove_var(CARD_ENV);
    write_and_read(
        "inline",
        [Ipv4Addr::new(127, 0, 6, 1), Ipv4Addr::new(127, 0, 6, 2)],
        port,
        &shm,
    );
    std::env::set_var(CARD_ENV, "threads");
    write_and_read(
        "threads",
        [Ipv4Addr::new(127, 0, 6, 3), Ipv4Addr::new(127, 0, 6, 4)],
        port,
        &shm,
    );
    std::env::remove_var(CARD_ENV);
    let _ = std::fs::remove_dir_all(&shm);
}
