//! Raw frames for the tests of the simple NIC: numbered UD frames, a send that retries
//! while every TX slot waits for the card, and a handler that collects what arrives.

use std::net::Ipv4Addr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bluerdma_core::engine::VerbsError;
use bluerdma_core::wire::ud::{Deth, UdFrame, UdPart, DEFAULT_PKEY};
use bluerdma_core::wire::MacAddr;
use bluerdma_linux::Context;

/// How long a send retries, and how long the tests wait for a frame.
pub const WAIT: Duration = Duration::from_secs(10);

/// A UD frame from `src` to `dst` with `len` payload bytes numbered from `seed`.
pub fn ud_frame(src: Ipv4Addr, dst: Ipv4Addr, seed: u8, len: usize) -> Vec<u8> {
    let [_, _, c, d] = src.octets();
    let f = UdFrame {
        src_mac: MacAddr([2, 0, 127, 0, c, d]),
        dst_mac: MacAddr::BROADCAST,
        src_ip: src,
        dst_ip: dst,
        udp_src_port: 0xC000,
        pkey: DEFAULT_PKEY,
        solicited: false,
        dst_qpn: 0x80_0001,
        psn: 0,
        deth: Deth {
            qkey: 0x1234,
            src_qpn: 0x80_0002,
        },
        imm: None,
        part: UdPart::Only,
    };
    let mut out = vec![0u8; f.frame_len(len)];
    let h = f.header_len();
    for (i, b) in out[h..h + len].iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    let n = f
        .emit(&mut out, len)
        .expect("a UD payload within one frame");
    out.truncate(n);
    out
}

/// Sends `f`, retrying for [`WAIT`] while every TX slot waits for the card.
pub fn send_raw(ctx: &Context, f: &[u8]) {
    let deadline = Instant::now() + WAIT;
    loop {
        match ctx.send_raw(f) {
            Ok(()) => return,
            Err(e) if matches!(e.kind, VerbsError::Busy { .. }) && Instant::now() < deadline => {
                std::thread::yield_now()
            }
            Err(e) => panic!("send_raw: {e}"),
        }
    }
}

/// Makes `ctx`'s raw handler send each frame it gets down a channel.
pub fn collect_raw(ctx: &Context) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    ctx.set_raw_handler(Some(Box::new(move |f: &[u8]| {
        let _ = tx.send(f.to_vec());
    })));
    rx
}
