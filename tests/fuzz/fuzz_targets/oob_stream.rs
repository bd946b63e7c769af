//! The out-of-band stream decoder (core/src/oob/decoder.rs) fed the same bytes whole and in
//! pseudo-random chunks: the same messages, then the same end (the same error, or the same
//! verdict at close). Byte 0: bit 0 = a peer without hello (the reference driver), bits 1..
//! = the largest chunk; byte 1: the chunk seed; the rest is the stream.
#![no_main]

use bluerdma_core::oob::{OobDecoder, OobError, OobMessage};
use bluerdma_fuzz::Chunks;
use libfuzzer_sys::fuzz_target;

/// The messages decoded from `chunks`, then the error that stopped the decoder or the
/// result of `finish`.
fn run<'a>(
    hello: bool,
    chunks: impl Iterator<Item = &'a [u8]>,
) -> (Vec<OobMessage>, Result<(), OobError>) {
    let mut dec = if hello {
        OobDecoder::new()
    } else {
        OobDecoder::without_hello()
    };
    let mut got = Vec::new();
    for chunk in chunks {
        let mut input = chunk;
        loop {
            match dec.decode(&mut input) {
                Ok(Some(m)) => got.push(m),
                Ok(None) => {
                    assert!(
                        input.is_empty(),
                        "need-more with {} bytes left",
                        input.len()
                    );
                    break;
                }
                Err(e) => {
                    assert_eq!(dec.finish(), Err(e), "finish after an error");
                    return (got, Err(e));
                }
            }
        }
    }
    (got, dec.finish())
}

fuzz_target!(|data: &[u8]| {
    let [mode, seed, stream @ ..] = data else {
        return;
    };
    let hello = mode & 1 == 0;
    let max = usize::from(mode >> 1).max(1);
    let whole = run(hello, std::iter::once(stream));
    let pieces = run(hello, Chunks::new(stream, *seed, max));
    assert_eq!(pieces.0, whole.0, "messages differ when fed in chunks");
    match (pieces.1, whole.1) {
        // A bad magic is named as soon as its first wrong byte arrives, so a short chunk
        // names fewer bytes (the rest zero).
        (Err(OobError::BadMagic { found: a }), Err(OobError::BadMagic { found: b })) => {
            assert!(
                a.iter().zip(b).all(|(x, y)| *x == y || *x == 0),
                "bad magic {a:02x?} in chunks, {b:02x?} whole"
            );
        }
        (a, b) => assert_eq!(a, b, "the stream ends differently when fed in chunks"),
    }
});
