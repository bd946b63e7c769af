//! The RTL simulator's CSR channel lines (platform-sim/src/rtl/csr.rs through
//! `rtl::decode`): a request as the card side reads it and a read reply as the driver side
//! reads it. What decodes re-encodes (as `json.dumps` would print it) to a line that decodes
//! to the same access.
#![no_main]

use bluerdma_sim::rtl::decode::{csr_line, csr_reply, csr_request, CsrLine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    if let Ok(req) = csr_request(line) {
        // A read's value is ignored; the card side writes none, the simulator 0.
        let value = req.value.unwrap_or(0);
        let again = csr_line(req.is_write, req.addr, value);
        let back = csr_request(again.trim_end().as_bytes()).expect("our own request line");
        assert_eq!(
            back,
            CsrLine {
                value: Some(value),
                ..req
            },
            "{again:?}"
        );
    }
    if let Ok(reply) = csr_reply(line) {
        let again = csr_line(
            reply.is_write,
            reply.addr,
            reply.value.expect("replies carry one"),
        );
        assert_eq!(csr_reply(again.as_bytes()).ok(), Some(reply), "{again:?}");
    }
});
