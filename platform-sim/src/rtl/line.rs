//! Newline-delimited messages with a bounded line length.
//!
//! Every simulator channel carries one message per `\n`-terminated line. A peer that never
//! sends a newline must not make us buffer without limit, so a line longer than the bound is
//! skipped up to its newline and reported, and the stream carries on.

use std::io::{self, BufRead, BufReader, Read};

/// The longest line accepted: a base64 jumbo frame (9018 bytes) is about 12 KiB, a DMA beat
/// message well under 1 KiB.
pub const MAX_LINE: usize = 64 * 1024;

/// One line, or the length of one that exceeded the bound.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// The line's bytes without the `\n` (other whitespace is the caller's business).
    Text(&'a [u8]),
    /// A line of this many bytes was longer than the bound and was skipped.
    TooLong(usize),
}

/// Reads `\n`-terminated lines of at most `max` bytes. A partial line survives a read
/// timeout and is completed by the next call.
pub(crate) struct LineReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
    max: usize,
    /// Bytes of an over-long line skipped so far (`Some` while skipping).
    skipping: Option<usize>,
}

impl<R: Read> LineReader<R> {
    /// Lines of at most [`MAX_LINE`] bytes from `inner`.
    pub(crate) fn new(inner: R) -> Self {
        Self::with_max(inner, MAX_LINE)
    }

    /// Lines of at most `max` bytes from `inner`.
    pub(crate) fn with_max(inner: R, max: usize) -> Self {
        LineReader {
            inner: BufReader::new(inner),
            line: Vec::new(),
            max,
            skipping: None,
        }
    }

    /// Whether a complete line is already buffered, i.e. the next call will not block.
    pub(crate) fn has_buffered_line(&self) -> bool {
        self.inner.buffer().contains(&b'\n')
    }

    /// The next line; `None` at end of stream (a final line without `\n` is returned first).
    /// Errors (including read timeouts) leave a partial line in place for the next call.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        // `self.line` holds the previous line until the next call starts.
        if self.skipping.is_none() && self.line.last() == Some(&b'\n') {
            self.line.clear();
        }
        loop {
            let available = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                if let Some(skipped) = self.skipping.take() {
                    return Ok(Some(Line::TooLong(skipped)));
                }
                if self.line.is_empty() {
                    return Ok(None);
                }
                // Mark the line complete so the next call starts afresh.
                self.line.push(b'\n');
                return Ok(Some(Line::Text(self.line_text())));
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let content = newline.unwrap_or(take);
            match self.skipping.as_mut() {
                Some(skipped) => *skipped += take,
                None if self.line.len() + content > self.max => {
                    self.skipping = Some(self.line.len() + take);
                    self.line.clear();
                }
                None => self.line.extend_from_slice(&available[..take]),
            }
            self.inner.consume(take);
            if newline.is_some() {
                if let Some(skipped) = self.skipping.take() {
                    // The newline itself is not part of the line.
                    return Ok(Some(Line::TooLong(skipped - 1)));
                }
                return Ok(Some(Line::Text(self.line_text())));
            }
        }
    }

    fn line_text(&self) -> &[u8] {
        self.line.strip_suffix(b"\n").unwrap_or(&self.line)
    }
}

/// A received line shortened for a log message or an error.
pub(crate) fn excerpt(line: &[u8]) -> String {
    const MAX: usize = 120;
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX)]).into_owned();
    if line.len() > MAX {
        format!("{text}... ({} bytes)", line.len())
    } else {
        text
    }
}

/// `bytes` without leading and trailing ASCII whitespace (Python's `str.strip()` for the
/// messages these protocols carry).
pub(crate) fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Result<String, usize>> {
        let mut r = LineReader::with_max(input, max);
        let mut out = Vec::new();
        while let Some(line) = r.next_line().unwrap() {
            out.push(match line {
                Line::Text(t) => Ok(String::from_utf8(t.to_vec()).unwrap()),
                Line::TooLong(n) => Err(n),
            });
        }
        out
    }

    #[test]
    fn splits_lines_and_skips_overlong_ones() {
        let got = lines(b"ab\n\nabcdefgh\nxyz\nlast", 4);
        assert_eq!(
            got,
            vec![
                Ok("ab".into()),
                Ok("".into()),
                Err(8),
                Ok("xyz".into()),
                Ok("last".into())
            ]
        );
        assert_eq!(lines(b"abcd\nabcde", 4), vec![Ok("abcd".into()), Err(5)]);
    }

    #[test]
    fn a_line_split_across_reads_is_joined() {
        // A reader that hands out one byte per read, like a slow socket.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let Some((&b, rest)) = self.0.split_first() else {
                    return Ok(0);
                };
                buf[0] = b;
                self.0 = rest;
                Ok(1)
            }
        }
        let mut r = LineReader::new(Trickle(b"{\"a\": 1}\n{}\n"));
        assert_eq!(r.next_line().unwrap(), Some(Line::Text(b"{\"a\": 1}")));
        assert_eq!(r.next_line().unwrap(), Some(Line::Text(b"{}")));
        assert_eq!(r.next_line().unwrap(), None);
    }

    #[test]
    fn trim_strips_ascii_whitespace_only() {
        assert_eq!(trim(b" \tab c\r\n"), b"ab c");
        assert_eq!(trim(b"\r\n"), b"");
        assert_eq!(trim(b""), b"");
    }
}
