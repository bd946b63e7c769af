//! The UDP transport's datagram: several Ethernet frames in one UDP payload.
//!
//! Sending one frame per datagram costs one system call and one trip through the kernel per
//! frame, which caps a loopback link far below the bandwidth goal; so frames for the same
//! card are packed together (version 1, all integers big-endian):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..1 | magic `0x42 0x4C` ("BL") |
//! | 2 | version, 1 |
//! | 3 | flags, 0 (reserved) |
//! | 4..5 | frame count N, at least 1 |
//! | 6.. | N records: frame length L (u16, at least 1), then the L frame bytes |
//!
//! Nothing follows the last record. A datagram that breaks any of these rules is rejected
//! whole, before any of its frames is delivered.

use std::fmt;

/// First two bytes of every datagram.
pub const MAGIC: [u8; 2] = *b"BL";
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the first record.
pub const HEADER_LEN: usize = 6;
/// Bytes before each frame.
pub const RECORD_HEADER_LEN: usize = 2;
/// The largest UDP payload over IPv4 (65 535 − 20 − 8).
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Why a received datagram was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatagramError {
    /// Shorter than the 6-byte header; the length is given.
    TooShort(usize),
    /// The first two bytes are not [`MAGIC`].
    BadMagic([u8; 2]),
    /// A version this code does not read.
    UnknownVersion(u8),
    /// Reserved flag bits are set.
    ReservedFlags(u8),
    /// The header announces no frames.
    NoFrames,
    /// Record `index` has length 0.
    EmptyFrame {
        /// Position of the record (0-based).
        index: u16,
    },
    /// Record `index` runs past the end of the datagram.
    Truncated {
        /// Position of the record (0-based).
        index: u16,
    },
    /// Bytes remain after the last announced record.
    TrailingBytes(usize),
}

impl fmt::Display for DatagramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort(len) => write!(f, "datagram of {len} bytes is shorter than its header"),
            Self::BadMagic(m) => write!(f, "bad magic {:02x}{:02x}", m[0], m[1]),
            Self::UnknownVersion(v) => write!(f, "unknown datagram version {v}"),
            Self::ReservedFlags(flags) => write!(f, "reserved flags {flags:#04x} set"),
            Self::NoFrames => write!(f, "datagram announces no frames"),
            Self::EmptyFrame { index } => write!(f, "frame {index} has length 0"),
            Self::Truncated { index } => write!(f, "frame {index} runs past the datagram's end"),
            Self::TrailingBytes(n) => write!(f, "{n} bytes after the last frame"),
        }
    }
}

impl std::error::Error for DatagramError {}

/// The frames of a received datagram, checked whole on construction.
#[derive(Clone, Copy, Debug)]
pub struct DatagramFrames<'a> {
    records: &'a [u8],
    count: u16,
}

impl<'a> DatagramFrames<'a> {
    /// Checks `datagram` against the format and returns its frames.
    pub fn parse(datagram: &'a [u8]) -> Result<Self, DatagramError> {
        let (header, records) = datagram
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(DatagramError::TooShort(datagram.len()))?;
        let [m0, m1, version, flags, c0, c1] = *header;
        if [m0, m1] != MAGIC {
            return Err(DatagramError::BadMagic([m0, m1]));
        }
        if version != VERSION {
            return Err(DatagramError::UnknownVersion(version));
        }
        if flags != 0 {
            return Err(DatagramError::ReservedFlags(flags));
        }
        let count = u16::from_be_bytes([c0, c1]);
        if count == 0 {
            return Err(DatagramError::NoFrames);
        }
        let mut rest = records;
        for index in 0..count {
            let (_, tail) = next_record(rest, index)?;
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(DatagramError::TrailingBytes(rest.len()));
        }
        Ok(Self { records, count })
    }

    /// How many frames the datagram carries.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Always false: a valid datagram carries at least one frame.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The frames, in the order they were packed.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> {
        let mut rest = self.records;
        (0..self.count).map_while(move |index| {
            // `parse` checked every record, so this never stops early.
            let (frame, tail) = next_record(rest, index).ok()?;
            rest = tail;
            Some(frame)
        })
    }
}

/// Splits the record at the start of `bytes` into its frame and the bytes after it.
fn next_record(bytes: &[u8], index: u16) -> Result<(&[u8], &[u8]), DatagramError> {
    let (len, tail) = bytes
        .split_first_chunk::<RECORD_HEADER_LEN>()
        .ok_or(DatagramError::Truncated { index })?;
    let len = usize::from(u16::from_be_bytes(*len));
    if len == 0 {
        return Err(DatagramError::EmptyFrame { index });
    }
    if tail.len() < len {
        return Err(DatagramError::Truncated { index });
    }
    Ok(tail.split_at(len))
}

/// Packs frames into one datagram of at most `max_len` bytes.
#[derive(Debug)]
pub struct DatagramBuilder {
    buf: Vec<u8>,
    count: u16,
    max_len: usize,
}

impl DatagramBuilder {
    /// An empty datagram that will not grow past `max_len` bytes (capped at
    /// [`MAX_UDP_PAYLOAD`]).
    pub fn new(max_len: usize) -> Self {
        let max_len = max_len.min(MAX_UDP_PAYLOAD);
        let mut buf = Vec::with_capacity(max_len);
        buf.extend_from_slice(&Self::header(0));
        Self {
            buf,
            count: 0,
            max_len,
        }
    }

    /// Whether a frame of `len` bytes fits in a datagram of this builder's size at all.
    pub fn fits_alone(&self, len: usize) -> bool {
        len > 0
            && len <= usize::from(u16::MAX)
            && HEADER_LEN + RECORD_HEADER_LEN + len <= self.max_len
    }

    /// Appends `frame` if it fits; returns false (and changes nothing) if it does not.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        let Ok(len) = u16::try_from(frame.len()) else {
            return false;
        };
        if len == 0
            || self.count == u16::MAX
            || self.buf.len() + RECORD_HEADER_LEN + frame.len() > self.max_len
        {
            return false;
        }
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(frame);
        self.count += 1;
        self.buf[4..HEADER_LEN].copy_from_slice(&self.count.to_be_bytes());
        true
    }

    /// How many frames have been packed.
    pub fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// The datagram's bytes so far (a valid datagram once at least one frame is packed).
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Empties the datagram, keeping its buffer.
    pub fn clear(&mut self) {
        self.buf.truncate(HEADER_LEN);
        self.count = 0;
        self.buf[4..HEADER_LEN].copy_from_slice(&0u16.to_be_bytes());
    }

    fn header(count: u16) -> [u8; HEADER_LEN] {
        let [c0, c1] = count.to_be_bytes();
        [MAGIC[0], MAGIC[1], VERSION, 0, c0, c1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_frames_encode_to_the_documented_bytes() {
        let mut b = DatagramBuilder::new(100);
        assert!(b.push(&[0xAA, 0xBB, 0xCC]));
        assert!(b.push(&[0x11]));
        assert_eq!(
            b.bytes(),
            &[0x42, 0x4C, 1, 0, 0, 2, 0, 3, 0xAA, 0xBB, 0xCC, 0, 1, 0x11]
        );
        let frames: Vec<&[u8]> = DatagramFrames::parse(b.bytes()).unwrap().iter().collect();
        assert_eq!(frames, [&[0xAA, 0xBB, 0xCC][..], &[0x11][..]]);
    }

    #[test]
    fn builder_refuses_what_does_not_fit_and_clears() {
        let mut b = DatagramBuilder::new(HEADER_LEN + 2 + 10);
        assert!(!b.push(&[]), "empty frame");
        assert!(b.fits_alone(10) && !b.fits_alone(11));
        assert!(b.push(&[7; 6]));
        assert!(!b.push(&[7; 3]), "6+2+2+3 > 10+2");
        assert!(b.push(&[7; 2]));
        assert_eq!(b.count(), 2);
        b.clear();
        assert_eq!(b.count(), 0);
        assert_eq!(b.bytes(), &[0x42, 0x4C, 1, 0, 0, 0]);
        assert_eq!(
            DatagramFrames::parse(b.bytes()).unwrap_err(),
            DatagramError::NoFrames
        );
    }

    #[test]
    fn malformed_datagrams_name_the_problem() {
        let good = [0x42, 0x4C, 1, 0, 0, 1, 0, 2, 9, 9];
        assert!(DatagramFrames::parse(&good).is_ok());
        let cases: [(&[u8], DatagramError); 8] = [
            (&good[..5], DatagramError::TooShort(5)),
            (
                &[0x42, 0x4D, 1, 0, 0, 1, 0, 1, 9],
                DatagramError::BadMagic([0x42, 0x4D]),
            ),
            (
                &[0x42, 0x4C, 2, 0, 0, 1, 0, 1, 9],
                DatagramError::UnknownVersion(2),
            ),
            (
                &[0x42, 0x4C, 1, 4, 0, 1, 0, 1, 9],
                DatagramError::ReservedFlags(4),
            ),
            (&good[..9], DatagramError::Truncated { index: 0 }),
            (
                &[0x42, 0x4C, 1, 0, 0, 2, 0, 1, 9, 0],
                DatagramError::Truncated { index: 1 },
            ),
            (
                &[0x42, 0x4C, 1, 0, 0, 1, 0, 0],
                DatagramError::EmptyFrame { index: 0 },
            ),
            (
                &[0x42, 0x4C, 1, 0, 0, 1, 0, 1, 9, 8, 7],
                DatagramError::TrailingBytes(2),
            ),
        ];
        for (bytes, err) in cases {
            assert_eq!(
                DatagramFrames::parse(bytes).unwrap_err(),
                err,
                "{bytes:02x?}"
            );
        }
    }

    proptest! {
        #[test]
        fn packed_frames_come_back_in_order(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 1..40),
            max_len in 400usize..70_000,
        ) {
            let mut b = DatagramBuilder::new(max_len);
            let mut packed = Vec::new();
            for f in &frames {
                if !b.push(f) {
                    break;
                }
                packed.push(f.as_slice());
            }
            prop_assert!(b.bytes().len() <= max_len.min(MAX_UDP_PAYLOAD));
            let parsed = DatagramFrames::parse(b.bytes()).unwrap();
            prop_assert_eq!(parsed.len(), packed.len());
            prop_assert_eq!(parsed.iter().collect::<Vec<_>>(), packed);
        }

        #[test]
        fn parse_never_panics(
            valid_header in any::<bool>(),
            tail in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            // Half the inputs start like a real datagram, so the record walk is exercised.
            let mut bytes = if valid_header { vec![0x42, 0x4C, 1, 0] } else { Vec::new() };
            bytes.extend_from_slice(&tail);
            if let Ok(frames) = DatagramFrames::parse(&bytes) {
                let total: usize = frames.iter().map(|f| f.len() + RECORD_HEADER_LEN).sum();
                prop_assert_eq!(total + HEADER_LEN, bytes.len());
            }
        }
    }
}
