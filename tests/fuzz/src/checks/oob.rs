//! The out-of-band targets: what a peer driver sends over TCP (core/src/oob).

use super::Chunks;
use bluerdma_core::oob::{AccessCheck, AccessVerdict};
use bluerdma_core::oob::{AtomicReply, AtomicRequest, Record, RecvTooShort, RecvWr};
use bluerdma_core::oob::{Hello, HELLO_LEN};
use bluerdma_core::oob::{OobDecoder, OobError, OobMessage};

/// The out-of-band hello (core/src/oob/codec.rs), the first 16 bytes a peer sends. A hello
/// that decodes re-encodes to exactly the bytes it was decoded from.
pub fn oob_hello(data: &[u8]) {
    let Ok((hello, rest)) = Hello::parse(data) else {
        return;
    };
    assert_eq!(rest, &data[HELLO_LEN..], "bytes after the hello");
    assert_eq!(
        hello.to_bytes()[..],
        data[..HELLO_LEN],
        "{hello:?} re-encodes differently"
    );
}

/// The out-of-band records (core/src/oob/codec.rs, atomic.rs, check.rs), 32 bytes each (an atomic
/// request is two): [`Record::parse`] and the per-kind parsers agree (exactly one takes a
/// record that decodes, none what it refuses), and a record that decodes re-encodes to
/// exactly its bytes.
pub fn oob_record(data: &[u8]) {
    let any = Record::parse(data);
    let wr = RecvWr::parse(data).map(|(r, rest)| (Record::RecvWr(r), rest));
    let short = RecvTooShort::parse(data).map(|(r, rest)| (Record::RecvTooShort(r), rest));
    let request = AtomicRequest::parse(data).map(|(r, rest)| (Record::AtomicRequest(r), rest));
    let reply = AtomicReply::parse(data).map(|(r, rest)| (Record::AtomicReply(r), rest));
    let check = AccessCheck::parse(data).map(|(r, rest)| (Record::AccessCheck(r), rest));
    let verdict = AccessVerdict::parse(data).map(|(r, rest)| (Record::AccessVerdict(r), rest));
    let kinds = [wr, short, request, reply, check, verdict];
    match any {
        Ok((record, rest)) => {
            let bytes = record
                .to_bytes()
                .unwrap_or_else(|e| panic!("decoded {record:?} does not encode: {e}"));
            assert_eq!(rest, &data[bytes.len()..], "bytes after the record");
            assert_eq!(
                bytes[..],
                data[..bytes.len()],
                "{record:?} re-encodes differently"
            );
            let takers: Vec<_> = kinds.iter().filter_map(|k| k.as_ref().ok()).collect();
            assert_eq!(takers, [&(record, rest)], "the kinds' parsers disagree");
        }
        Err(_) => {
            assert!(
                kinds.iter().all(Result::is_err),
                "a kind's parser takes what Record refuses"
            );
        }
    }
}

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

/// The out-of-band stream decoder (core/src/oob/decoder.rs) fed the same bytes whole and in
/// pseudo-random chunks: the same messages, then the same end (the same error, or the same
/// verdict at close). Byte 0: bit 0 = a peer without hello (the reference driver), bits 1..
/// = the largest chunk; byte 1: the chunk seed; the rest is the stream.
pub fn oob_stream(data: &[u8]) {
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
}
