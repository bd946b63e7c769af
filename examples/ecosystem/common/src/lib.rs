//! What the ecosystem examples share: the two device names, the payloads and their checks,
//! the completion bookkeeping and the one-line result.
//!
//! Each example opens two devices in one process (bluerdma0 as the requester, bluerdma1 as
//! the responder), connects an RC QP pair, RDMA-WRITEs [`WRITE_LEN`] bytes into the
//! responder's MR and SENDs [`SEND_LEN`] bytes into a posted receive, then checks the bytes,
//! the guard bytes around them and every completion. Any mismatch is a [`Report`] failure and
//! a non-zero exit.

use std::fmt::Display;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Bytes of the RDMA WRITE: several pages, not a multiple of the MTU.
pub const WRITE_LEN: usize = 12_345;
/// Bytes of the SEND: more than one MTU-sized packet.
pub const SEND_LEN: usize = 3_000;
/// Untouched bytes the responder's buffers keep after the payload; a WRITE or SEND that
/// spills past its length changes them.
pub const GUARD: usize = 64;
/// The guard bytes' value.
pub const GUARD_BYTE: u8 = 0xA5;
/// The longest the examples wait for one completion. Generous on purpose (a loaded 2-core
/// machine); a working device completes in milliseconds, and a lost completion must end the
/// program with a message instead of hanging it.
pub const COMPLETION_WAIT: Duration = Duration::from_secs(30);

/// The requester's first send PSN: a few packets before the 24-bit wrap, so the WRITE and
/// the SEND cross it (outside 0x7FFFF0..0xFFFF7F, the first PSNs the card cannot take).
pub const FIRST_PSN: u32 = 0xFF_FFFD;

/// The work-request ids the examples post.
pub const WR_WRITE: u64 = 0x5752_4954; // "WRIT"
/// The SEND's work-request id.
pub const WR_SEND: u64 = 0x5345_4e44; // "SEND"
/// The RECV's work-request id.
pub const WR_RECV: u64 = 0x5245_4356; // "RECV"

/// The requester's and the responder's device names: the first two arguments, or
/// `bluerdma0` and `bluerdma1`.
pub fn device_names() -> (String, String) {
    let mut args = std::env::args().skip(1);
    let a = args.next().unwrap_or_else(|| "bluerdma0".into());
    let b = args.next().unwrap_or_else(|| "bluerdma1".into());
    (a, b)
}

/// `len` bytes no two positions of which a shifted or truncated copy would match.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}

/// A responder buffer: `len` zero bytes the payload lands in, then [`GUARD`] guard bytes.
pub fn target(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len + GUARD];
    v[len..].fill(GUARD_BYTE);
    v
}

/// The first problem of each kind an example found, and how many checks passed.
#[derive(Default)]
pub struct Report {
    passed: usize,
    failures: Vec<String>,
}

impl Report {
    /// Records a check.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if ok {
            self.passed += 1;
        } else {
            let w = what();
            eprintln!("MISMATCH: {w}");
            self.failures.push(w);
        }
    }

    /// Checks that `got[..want.len()]` equals `want` and the [`GUARD`] bytes after it are
    /// untouched; names the first differing offset otherwise.
    pub fn bytes(&mut self, what: &str, got: &[u8], want: &[u8]) {
        let n = want.len();
        let first_bad = got
            .iter()
            .take(n)
            .zip(want)
            .position(|(g, w)| g != w)
            .or((got.len() < n).then_some(got.len()));
        self.check(first_bad.is_none(), || {
            let i = first_bad.unwrap_or(0);
            format!(
                "{what}: byte {i} of {n} is {:#04x}, expected {:#04x}",
                got.get(i).copied().unwrap_or(0),
                want[i]
            )
        });
        let guard = got.get(n..n + GUARD).unwrap_or(&[]);
        let spilled = guard.iter().position(|&b| b != GUARD_BYTE);
        self.check(guard.len() == GUARD && spilled.is_none(), || {
            format!(
                "{what}: the guard byte at {} after the payload changed (written past {n} bytes)",
                n + spilled.unwrap_or(0)
            )
        });
    }

    /// Checks one field of a completion.
    pub fn field<T: PartialEq + Display>(&mut self, wc: &str, field: &str, got: T, want: T) {
        self.check(got == want, || {
            format!("{wc}: {field} is {got}, expected {want}")
        });
    }

    /// Records a failure that ends the example early (an error of the crate's API).
    pub fn fail(&mut self, what: impl Display) {
        self.check(false, || what.to_string());
    }

    /// Prints the one-line result and returns the exit code: `ok` with `summary`, or the
    /// number of mismatches and the first.
    pub fn finish(&self, program: &str, summary: &str, start: Instant) -> ExitCode {
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match self.failures.first() {
            None => {
                println!(
                    "{program}: ok: {summary}; {} checks passed in {ms:.0} ms",
                    self.passed
                );
                ExitCode::SUCCESS
            }
            Some(first) => {
                println!(
                    "{program}: FAILED: {} of {} checks failed, first: {first}",
                    self.failures.len(),
                    self.failures.len() + self.passed
                );
                ExitCode::FAILURE
            }
        }
    }
}

/// Polls `poll` until it returns `Some`, or [`COMPLETION_WAIT`] passes (then an error naming
/// `what`).
pub fn wait_for<T>(
    what: &str,
    mut poll: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + COMPLETION_WAIT;
    loop {
        if let Some(v) = poll()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("no {what} within {} s", COMPLETION_WAIT.as_secs()));
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spilled_or_short_payload_is_named() {
        let want = pattern(3, 100);
        let mut got = target(100);
        got[..100].copy_from_slice(&want);
        let mut ok = Report::default();
        ok.bytes("w", &got, &want);
        assert!(ok.failures.is_empty());
        got[100] = 0;
        got[7] ^= 1;
        let mut bad = Report::default();
        bad.bytes("w", &got, &want);
        assert_eq!(bad.failures.len(), 2, "{:?}", bad.failures);
        assert!(
            bad.failures[0].contains("byte 7 of 100"),
            "{}",
            bad.failures[0]
        );
        assert!(
            bad.failures[1].contains("guard byte at 100"),
            "{}",
            bad.failures[1]
        );
    }

    #[test]
    fn patterns_differ_by_seed_and_offset() {
        let a = pattern(1, 4096);
        assert_ne!(a, pattern(2, 4096));
        assert_ne!(&a[1..], &a[..4095]);
    }
}
