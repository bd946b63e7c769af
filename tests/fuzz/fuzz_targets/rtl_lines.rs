//! The line reader of every RTL simulator channel (platform-sim/src/rtl/line.rs through
//! `rtl::decode::read_lines`), fed the same stream whole and in pseudo-random chunks: the
//! same lines and over-long-line reports. Each line that decodes as an Ethernet link's
//! frame (base64) re-encodes to exactly that line. Byte 0 sets the line bound (1..=256),
//! byte 1 the chunk seed, byte 2 the largest chunk; the rest is the stream.
#![no_main]

use bluerdma_fuzz::Chunks;
use bluerdma_sim::rtl::decode::{encode_frame_line, frame_line, read_lines, LineItem};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
