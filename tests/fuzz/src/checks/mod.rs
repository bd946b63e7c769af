//! What the fuzz targets in `fuzz_targets/` share: the checks that go beyond "no panic".
//!
//! - [`check_desc_bits`]: a descriptor decoder and its encoder agree bit for bit: every bit
//!   where the re-encoded descriptor differs from the input is one the decoder ignores.
//! - [`check_frame_bytes`]: the same for frames, byte by byte, with the IPv4 checksum (and a
//!   UD frame's ICRC) recomputed so that a substituted byte reaches the field it is in.
//! - [`Chunks`]: a reader (and a splitter) that hands out a byte stream in pseudo-random
//!   chunks, for the stream decoders' "fed in pieces = fed whole" checks.
//!
//! One function per fuzz target, grouped by where the decoder lives ([`desc`], [`wire`],
//! [`oob`], [`sim`], [`devices`]); [`TARGETS`] names them all. The fuzz targets in
//! `fuzz_targets/` call these (nightly, libFuzzer), and tests/tests/fuzz_fallback.rs runs
//! them on stable over the seeds and pseudo-random mutations of them, so the checks run
//! in every `cargo test` and `cargo xtask ci` has a FALLBACK where nightly is missing.
//!
//! A check that fails panics with the input and what differed, which libFuzzer reports as a
//! crash and saves under `target/fuzz/artifacts/<target>/`.

pub mod desc;
pub mod devices;
pub mod oob;
pub mod sim;
pub mod wire;

use std::fmt::Debug;
use std::io::{self, Read};

use bluerdma_core::desc::RawDesc;
use bluerdma_core::wire::ipv4::ipv4_checksum;

/// Takes `N` descriptors from the front of `data` (`None` if it is shorter).
pub fn descs<const N: usize>(data: &[u8]) -> Option<[RawDesc; N]> {
    let mut out = [RawDesc::ZERO; N];
    for (i, d) in out.iter_mut().enumerate() {
        d.0.copy_from_slice(data.get(i * 32..(i + 1) * 32)?);
    }
    Some(out)
}

/// Checks a descriptor codec on `input` (one or more descriptors) whose decoding gave
/// `value`, re-encoded as `encoded`:
/// - `encoded` decodes to `value` again;
/// - every bit where `encoded` differs from `input` is ignored by the decoder: flipping that
///   bit of the input alone decodes to `value` too.
///
/// `decode` returns `None` where the input is refused.
pub fn check_desc_bits<T: PartialEq + Debug>(
    what: &str,
    input: &[RawDesc],
    value: &T,
    encoded: &[RawDesc],
    decode: impl Fn(&[RawDesc]) -> Option<T>,
) {
    assert_eq!(
        input.len(),
        encoded.len(),
        "{what}: descriptor count changed"
    );
    let again = decode(encoded);
    assert_eq!(
        again.as_ref(),
        Some(value),
        "{what}: re-encoded {encoded:?} of {input:?} decodes differently"
    );
    for (k, (a, b)) in input.iter().zip(encoded).enumerate() {
        for bit in 0..256u32 {
            if a.bit(bit) == b.bit(bit) {
                continue;
            }
            let mut flipped = input.to_vec();
            flipped[k].set_bit(bit, b.bit(bit));
            assert_eq!(
                decode(&flipped).as_ref(),
                Some(value),
                "{what}: descriptor {k} bit {bit} is read by the decoder but not re-encoded \
                 (input {input:?}, re-encoded {encoded:?})"
            );
        }
    }
}

/// Where the IPv4 header of a frame lies.
const IPV4: std::ops::Range<usize> = 14..34;
/// The IPv4 checksum within the frame.
const IPV4_CHECKSUM: std::ops::Range<usize> = 24..26;

/// Recomputes the IPv4 header checksum of an Ethernet frame (if it is long enough).
pub fn refresh_ipv4_checksum(frame: &mut [u8]) {
    if let Some(header) = frame.get(IPV4) {
        let mut h = [0u8; 20];
        h.copy_from_slice(header);
        let sum = ipv4_checksum(&h);
        frame[IPV4_CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
}

/// Checks a frame codec on `input` whose parse gave `value`, re-emitted as `emitted`:
/// - `emitted` has the input's length and parses to `value`;
/// - every byte where `emitted` differs from `input` is ignored by the parser: putting the
///   emitted byte into the input alone (and then `refresh` for checksums) parses to `value`.
///
/// The IPv4 checksum bytes are left out of the second check (they follow the others).
pub fn check_frame_bytes<T: PartialEq + Debug>(
    what: &str,
    input: &[u8],
    value: &T,
    emitted: &[u8],
    parse: impl Fn(&[u8]) -> Option<T>,
    refresh: impl Fn(&mut [u8]),
) {
    assert_eq!(
        emitted.len(),
        input.len(),
        "{what}: re-emitted {} bytes for a {}-byte input {input:02x?}",
        emitted.len(),
        input.len()
    );
    assert_eq!(
        parse(emitted).as_ref(),
        Some(value),
        "{what}: re-emitted {emitted:02x?} of {input:02x?} parses differently"
    );
    for (i, (a, b)) in input.iter().zip(emitted).enumerate() {
        if a == b || IPV4_CHECKSUM.contains(&i) {
            continue;
        }
        let mut t = input.to_vec();
        t[i] = *b;
        refresh(&mut t);
        assert_eq!(
            parse(&t).as_ref(),
            Some(value),
            "{what}: byte {i} ({a:#04x} in, {b:#04x} re-emitted) is read by the parser but \
             not re-emitted (input {input:02x?})"
        );
    }
}

/// A byte stream handed out in chunks of 1..=`max` bytes, their lengths drawn from `seed`
/// (xorshift), as a slow socket delivers it.
pub struct Chunks<'a> {
    data: &'a [u8],
    state: u64,
    max: usize,
}

impl<'a> Chunks<'a> {
    /// `data` in chunks of at most `max` bytes (at least 1).
    pub fn new(data: &'a [u8], seed: u8, max: usize) -> Self {
        Chunks {
            data,
            state: 0x9E37_79B9_7F4A_7C15 ^ u64::from(seed),
            max: max.max(1),
        }
    }

    fn next_len(&mut self) -> usize {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        1 + (x % self.max as u64) as usize
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.data.is_empty() {
            return None;
        }
        let n = self.next_len().min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.data.is_empty() || buf.is_empty() {
            return Ok(0);
        }
        let n = self.next_len().min(self.data.len()).min(buf.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// A fuzz target's check: panics when the input shows a decoder bug.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the binary in `fuzz_targets/` and the seed directory under
/// `seeds/`) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("desc_cmd", desc::desc_cmd),
    ("desc_send", desc::desc_send),
    ("desc_meta", desc::desc_meta),
    ("desc_simple_nic", desc::desc_simple_nic),
    ("wire_headers", wire::wire_headers),
    ("wire_frame", wire::wire_frame),
    ("wire_ack", wire::wire_ack),
    ("wire_ud", wire::wire_ud),
    ("oob_hello", oob::oob_hello),
    ("oob_record", oob::oob_record),
    ("oob_stream", oob::oob_stream),
    ("link_datagram", sim::link_datagram),
    ("rtl_csr", sim::rtl_csr),
    ("rtl_dma", sim::rtl_dma),
    ("rtl_lines", sim::rtl_lines),
    ("devices", devices::devices),
];
