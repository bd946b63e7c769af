//! Every wire header on its own (core/src/wire): the first byte picks Ethernet, IPv4, UDP,
//! BTH, RETH, RRETH, ImmDt, IETH, AETH, NRETH or DETH, the rest is parsed as that header.
//! A parsed header emits, the emitted bytes parse to the same header with the same bytes
//! after it, and every byte the emitter changed is one the parser ignores.
#![no_main]

use std::fmt::Debug;

use bluerdma_core::wire::ipv4::ipv4_checksum;
use bluerdma_core::wire::{
    Aeth, Bth, Deth, EthernetHeader, Header, Ieth, ImmDt, Ipv4Header, Nreth, Reth, Rreth, UdpHeader,
};
use libfuzzer_sys::fuzz_target;

fn check<H: Header + PartialEq + Debug>(bytes: &[u8], refresh: fn(&mut [u8])) {
    let Ok((h, rest)) = H::parse(bytes) else {
        return;
    };
    let kind = H::KIND;
    let mut out = bytes.to_vec();
    let n = h
        .emit(&mut out)
        .unwrap_or_else(|e| panic!("{kind}: parsed {h:?} does not emit: {e}"));
    assert_eq!(n, H::LEN, "{kind}: emitted length");
    let parse = |b: &[u8]| H::parse(b).ok().map(|(h, rest)| (h, rest.to_vec()));
    let want = Some((h, rest.to_vec()));
    assert_eq!(parse(&out), want, "{kind}: {out:02x?} parses differently");
    for i in 0..H::LEN {
        if out[i] == bytes[i] {
            continue;
        }
        let mut t = bytes.to_vec();
        t[i] = out[i];
        refresh(&mut t);
        assert_eq!(
            parse(&t),
            want,
            "{kind}: byte {i} is read by the parser but not re-emitted (input {bytes:02x?})"
        );
    }
}

fn no_checksum(_: &mut [u8]) {}

fn ipv4_refresh(b: &mut [u8]) {
    let mut h = [0u8; 20];
    h.copy_from_slice(&b[..20]);
    b[10..12].copy_from_slice(&ipv4_checksum(&h).to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 11 {
        0 => check::<EthernetHeader>(bytes, no_checksum),
        1 => check::<Ipv4Header>(bytes, ipv4_refresh),
        2 => check::<UdpHeader>(bytes, no_checksum),
        3 => check::<Bth>(bytes, no_checksum),
        4 => check::<Reth>(bytes, no_checksum),
        5 => check::<Rreth>(bytes, no_checksum),
        6 => check::<ImmDt>(bytes, no_checksum),
        7 => check::<Ieth>(bytes, no_checksum),
        8 => check::<Aeth>(bytes, no_checksum),
        9 => check::<Nreth>(bytes, no_checksum),
        _ => check::<Deth>(bytes, no_checksum),
    }
});
