//! Public entry points to the decoders of the RTL simulator protocol's lines, so that the
//! fuzz targets in `tests/fuzz` (and a developer checking a captured line) reach them. The
//! message types of the channels stay private; these functions run the same decoders
//! (the same serde structs, [`LineReader`], the same base64 engine) and return plain copies
//! of what was decoded. Each decoder has its encoder here too: the exact line the channel
//! writes, so a decoded message can be re-encoded and decoded again.
//!
//! | Channel | Decoder | Encoder |
//! |---|---|---|
//! | CSR, card side | [`csr_request`] | [`csr_line`] |
//! | CSR, driver side | [`csr_reply`] | [`csr_line`] |
//! | DMA, driver side | [`dma_request`] | [`dma_request_line`] |
//! | DMA, card side | [`dma_read_reply`] | [`dma_read_reply_line`] |
//! | Ethernet links | [`frame_line`] | [`encode_frame_line`] |
//! | every channel | [`read_lines`] | one message per `\n` |

use std::io::{self, Read};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::csr::{self, CsrReply, CsrRequest};
use super::dma::{MemReadMsg, MemReadResponse, MemWriteMsg, ReadReply, SimRequest};
use super::line::{trim, Line, LineReader};

pub use super::eth::encode_frame_line;
pub use super::line::MAX_LINE;

/// A CSR request or read reply: `{"is_write", "addr", "value"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsrLine {
    /// A write (requests only; a reply is always a read).
    pub is_write: bool,
    /// The BAR0 offset.
    pub addr: u32,
    /// The value; a read request may leave it out.
    pub value: Option<u32>,
}

/// Decodes a request line as the card side of the CSR channel does.
pub fn csr_request(line: &[u8]) -> Result<CsrLine, serde_json::Error> {
    let r: CsrRequest = serde_json::from_slice(line)?;
    Ok(CsrLine {
        is_write: r.is_write,
        addr: r.addr,
        value: r.value,
    })
}

/// Decodes a read-reply line as the driver side of the CSR channel does.
pub fn csr_reply(line: &[u8]) -> Result<CsrLine, serde_json::Error> {
    let r: CsrReply = serde_json::from_slice(line)?;
    Ok(CsrLine {
        is_write: r.is_write,
        addr: r.addr,
        value: Some(r.value),
    })
}

/// The line (with its `\n`) that both sides write for a request or a reply, as Python's
/// `json.dumps` prints it.
pub fn csr_line(is_write: bool, addr: u32, value: u32) -> String {
    csr::csr_line(is_write, addr, value)
}

/// A request of the DMA channel (`mem_write` or `mem_read`) as the driver side decodes it:
/// every field, whether or not its kind uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaRequest {
    /// `"mem_write"` or `"mem_read"` (anything else is decoded and then refused).
    pub kind: String,
    /// The DMA channel.
    pub channel_id: u32,
    /// The beat's first byte.
    pub address: u64,
    /// The beat's length.
    pub length: usize,
    /// The bytes of a `mem_write`.
    pub data: Option<Vec<u8>>,
    /// `address & 3` on a first read beat.
    pub start_byte_index: u32,
    /// First beat of its access (true when absent).
    pub is_first: bool,
    /// Last beat of its access (true when absent).
    pub is_last: bool,
    /// The `req_<channel>_<n>` of a `mem_read`.
    pub request_id: Option<String>,
}

/// Decodes a request line as the driver side of the DMA channel does.
pub fn dma_request(line: &[u8]) -> Result<DmaRequest, serde_json::Error> {
    let r: SimRequest = serde_json::from_slice(line)?;
    Ok(DmaRequest {
        kind: r.kind,
        channel_id: r.channel_id,
        address: r.address,
        length: r.length,
        data: r.data,
        start_byte_index: r.start_byte_index,
        is_first: r.is_first,
        is_last: r.is_last,
        request_id: r.request_id,
    })
}

/// The line (without its `\n`) the card side writes for `request`: a `mem_write` with its
/// data or a `mem_read` with its request id, and only the fields that kind carries. `None`
/// for a request the card never sends (another kind, a missing field, a channel id or
/// start index wider than a byte).
pub fn dma_request_line(request: &DmaRequest) -> Option<String> {
    let channel_id = u8::try_from(request.channel_id).ok()?;
    let line = match (request.kind.as_str(), &request.data, &request.request_id) {
        ("mem_write", Some(data), _) => serde_json::to_string(&MemWriteMsg {
            kind: "mem_write",
            channel_id,
            address: request.address,
            data,
            length: request.length,
        }),
        ("mem_read", _, Some(id)) => serde_json::to_string(&MemReadMsg {
            kind: "mem_read",
            channel_id,
            address: request.address,
            length: request.length,
            start_byte_index: u8::try_from(request.start_byte_index).ok()?,
            is_first: request.is_first,
            is_last: request.is_last,
            request_id: id,
        }),
        _ => return None,
    };
    line.ok()
}

/// The fields of a `mem_read_response` that the card side checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaReadReply {
    /// The channel of the read.
    pub channel_id: u32,
    /// The request it answers.
    pub request_id: String,
    /// The bytes read.
    pub data: Vec<u8>,
}

/// Decodes a read-reply line as the card side of the DMA channel does.
pub fn dma_read_reply(line: &[u8]) -> Result<DmaReadReply, serde_json::Error> {
    let r: ReadReply = serde_json::from_slice(line)?;
    Ok(DmaReadReply {
        channel_id: r.channel_id,
        request_id: r.request_id,
        data: r.data,
    })
}

/// The line (without its `\n`) the driver side writes for a read reply of a first and last
/// beat at start index 0.
pub fn dma_read_reply_line(reply: &DmaReadReply) -> String {
    serde_json::to_string(&MemReadResponse {
        kind: "mem_read_response",
        channel_id: reply.channel_id,
        request_id: &reply.request_id,
        data: &reply.data,
        start_byte_index: 0,
        is_first: true,
        is_last: true,
    })
    // Serializing strings, integers and byte lists cannot fail.
    .unwrap_or_default()
}

/// Decodes one line of an Ethernet link (surrounding ASCII whitespace stripped, as the
/// links do) into its frame.
pub fn frame_line(line: &[u8]) -> Result<Vec<u8>, base64::DecodeError> {
    STANDARD.decode(trim(line))
}

/// One line as [`read_lines`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineItem {
    /// The line's bytes without the `\n`.
    Text(Vec<u8>),
    /// A line of this many bytes was longer than the bound and was skipped.
    TooLong(usize),
}

/// Every line of `reader`, split as each channel's reader splits them: at most `max` bytes a
/// line, longer ones skipped and reported. Reads until the end of the stream (or an error).
pub fn read_lines(reader: impl Read, max: usize) -> io::Result<Vec<LineItem>> {
    let mut lines = LineReader::with_max(reader, max);
    let mut out = Vec::new();
    while let Some(line) = lines.next_line()? {
        out.push(match line {
            Line::Text(t) => LineItem::Text(t.to_vec()),
            Line::TooLong(n) => LineItem::TooLong(n),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_decoder_reads_what_its_encoder_writes() {
        let line = csr_line(false, 0x104, 7);
        assert_eq!(
            csr_reply(line.trim_end().as_bytes()).unwrap(),
            CsrLine {
                is_write: false,
                addr: 0x104,
                value: Some(7)
            }
        );
        let write = dma_request(
            br#"{"type": "mem_write", "channel_id": 1, "address": 16, "data": [1, 255], "length": 2}"#,
        )
        .unwrap();
        let again = dma_request(dma_request_line(&write).unwrap().as_bytes()).unwrap();
        assert_eq!(again, write);
        let reply = DmaReadReply {
            channel_id: 3,
            request_id: "req_3_9".into(),
            data: vec![0, 1, 2],
        };
        assert_eq!(
            dma_read_reply(dma_read_reply_line(&reply).as_bytes()).unwrap(),
            reply
        );
        assert_eq!(
            frame_line(encode_frame_line(b"abc").as_bytes()).unwrap(),
            b"abc"
        );
        assert_eq!(
            read_lines(&b"ab\nabcdef\nx"[..], 4).unwrap(),
            [
                LineItem::Text(b"ab".to_vec()),
                LineItem::TooLong(6),
                LineItem::Text(b"x".to_vec())
            ]
        );
    }
}
