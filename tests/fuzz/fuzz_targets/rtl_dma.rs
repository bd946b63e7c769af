//! The RTL simulator's DMA channel lines (platform-sim/src/rtl/dma through `rtl::decode`):
//! a `mem_write`/`mem_read` request as the driver side reads it and a read reply as the card
//! side reads it. A request of a kind the card sends re-encodes to a line that decodes to
//! the same request (as far as its kind carries fields); a reply likewise.
#![no_main]

use bluerdma_sim::rtl::decode::{
    dma_read_reply, dma_read_reply_line, dma_request, dma_request_line, DmaRequest,
};
use libfuzzer_sys::fuzz_target;

/// The fields `request`'s kind carries on the wire (the others default on decode).
fn carried(request: &DmaRequest) -> DmaRequest {
    let mut r = request.clone();
    match r.kind.as_str() {
        "mem_write" => {
            r.start_byte_index = 0;
            r.is_first = true;
            r.is_last = true;
            r.request_id = None;
        }
        _ => r.data = None,
    }
    r
}

fuzz_target!(|line: &[u8]| {
    if let Ok(request) = dma_request(line) {
        if let Some(again) = dma_request_line(&request) {
            let back = dma_request(again.as_bytes()).expect("our own request line");
            assert_eq!(back, carried(&request), "{again}");
        }
    }
    if let Ok(reply) = dma_read_reply(line) {
        let again = dma_read_reply_line(&reply);
        assert_eq!(
            dma_read_reply(again.as_bytes()).ok(),
            Some(reply),
            "{again}"
        );
    }
});
