//! The out-of-band hello (core/src/oob/codec.rs), the first 16 bytes a peer sends. A hello
//! that decodes re-encodes to exactly the bytes it was decoded from.
#![no_main]

use bluerdma_core::oob::{Hello, HELLO_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((hello, rest)) = Hello::parse(data) else {
        return;
    };
    assert_eq!(rest, &data[HELLO_LEN..], "bytes after the hello");
    assert_eq!(
        hello.to_bytes()[..],
        data[..HELLO_LEN],
        "{hello:?} re-encodes differently"
    );
});
