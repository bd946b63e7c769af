//! The emulated NIC's targets: the UDP link's datagrams from another card
//! (platform-sim/src/link/datagram.rs) and the RTL simulator's lines (platform-sim/src/rtl,
//! through `rtl::decode`).

use super::Chunks;
use bluerdma_sim::link::datagram::{DatagramBuilder, DatagramFrames, MAX_UDP_PAYLOAD};
use bluerdma_sim::rtl::decode::{csr_line, csr_reply, csr_request, CsrLine};
use bluerdma_sim::rtl::decode::{
    dma_read_reply, dma_read_reply_line, dma_request, dma_request_line, DmaRequest,
};
use bluerdma_sim::rtl::decode::{encode_frame_line, frame_line, read_lines, LineItem};

/// The emulated link's UDP datagram (platform-sim/src/link/datagram.rs): several frames in
/// one datagram from another card. A datagram that parses is rebuilt, frame by frame, by
/// [`DatagramBuilder`] into exactly its bytes.
pub fn link_datagram(data: &[u8]) {
    let Ok(frames) = DatagramFrames::parse(data) else {
        return;
    };
    assert!(!frames.is_empty());
    let list: Vec<&[u8]> = frames.iter().collect();
    assert_eq!(list.len(), frames.len(), "iter stopped early");
    if data.len() > MAX_UDP_PAYLOAD {
        return; // cannot come from a socket, nor be built
    }
    let mut b = DatagramBuilder::new(MAX_UDP_PAYLOAD);
    for f in &list {
        assert!(
            b.push(f),
            "a parsed frame of {} bytes does not fit again",
            f.len()
        );
    }
    assert_eq!(b.bytes(), data, "rebuilt datagram differs");
}

/// The RTL simulator's CSR channel lines (platform-sim/src/rtl/csr.rs through
/// `rtl::decode`): a request as the card side reads it and a read reply as the driver side
/// reads it. What decodes re-encodes (as `json.dumps` would print it) to a line that decodes
/// to the same access.
pub fn rtl_csr(line: &[u8]) {
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
}

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

/// The RTL simulator's DMA channel lines (platform-sim/src/rtl/dma through `rtl::decode`):
/// a `mem_write`/`mem_read` request as the driver side reads it and a read reply as the card
/// side reads it. A request of a kind the card sends re-encodes to a line that decodes to
/// the same request (as far as its kind carries fields); a reply likewise.
pub fn rtl_dma(line: &[u8]) {
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
}

/// The line reader of every RTL simulator channel (platform-sim/src/rtl/line.rs through
/// `rtl::decode::read_lines`), fed the same stream whole and in pseudo-random chunks: the
/// same lines and over-long-line reports. Each line that decodes as an Ethernet link's
/// frame (base64) re-encodes to exactly that line. Byte 0 sets the line bound (1..=256),
/// byte 1 the chunk seed, byte 2 the largest chunk; the rest is the stream.
pub fn rtl_lines(data: &[u8]) {
    let [max, seed, chunk, stream @ ..] = data else {
        return;
    };
    let max = usize::from(*max) + 1;
    let whole = read_lines(stream, max).expect("reading a slice cannot fail");
    let pieces = read_lines(Chunks::new(stream, *seed, usize::from(*chunk)), max)
        .expect("reading chunks cannot fail");
    assert_eq!(pieces, whole, "lines differ when fed in chunks");
    let mut total = 0;
    for item in &whole {
        match item {
            LineItem::Text(t) => {
                assert!(
                    t.len() <= max,
                    "a line of {} bytes passed the bound {max}",
                    t.len()
                );
                assert!(!t.contains(&b'\n'));
                total += t.len();
                if let Ok(frame) = frame_line(t) {
                    let trimmed = t.trim_ascii();
                    let again = encode_frame_line(&frame);
                    assert_eq!(
                        again.trim_end().as_bytes(),
                        trimmed,
                        "base64 of {frame:02x?}"
                    );
                }
            }
            LineItem::TooLong(n) => {
                assert!(
                    *n > max,
                    "a line of {n} bytes reported over the bound {max}"
                );
                total += n;
            }
        }
    }
    let newlines = stream.iter().filter(|&&b| b == b'\n').count();
    assert_eq!(total + newlines, stream.len(), "bytes lost between lines");
}
