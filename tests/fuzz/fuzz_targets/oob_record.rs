//! The out-of-band records (core/src/oob/codec.rs), 32 bytes each: [`Record::parse`] and
//! the per-kind parsers agree, and a record that decodes re-encodes to exactly its bytes.
#![no_main]

use bluerdma_core::oob::{Record, RecvTooShort, RecvWr, RECV_WR_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let any = Record::parse(data);
    let wr = RecvWr::parse(data);
    let short = RecvTooShort::parse(data);
    match any {
        Ok((record, rest)) => {
            assert_eq!(rest, &data[RECV_WR_LEN..], "bytes after the record");
            let bytes = record
                .to_bytes()
                .unwrap_or_else(|e| panic!("decoded {record:?} does not encode: {e}"));
            assert_eq!(
                bytes[..],
                data[..RECV_WR_LEN],
                "{record:?} re-encodes differently"
            );
            match record {
                Record::RecvWr(r) => {
                    assert_eq!(wr, Ok((r, rest)));
                    assert!(short.is_err());
                }
                Record::RecvTooShort(r) => {
                    assert_eq!(short, Ok((r, rest)));
                    assert!(wr.is_err());
                }
            }
        }
        Err(_) => {
            assert!(
                wr.is_err() && short.is_err(),
                "a kind's parser takes what Record refuses"
            );
        }
    }
});
