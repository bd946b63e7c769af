//! Seeded fault injection on transmit: drop, duplicate, reorder and corrupt frames.
//!
//! Every decision about a frame is a pure function of the seed and the frame's position in
//! the sequence this port transmits ([`FaultConfig::decide`]): the same seed and the same
//! frames give the same drops, copies, swaps and flipped bytes on every run, whatever the
//! timing, and a failing scenario is replayed from the seed alone. Rates come from a string
//! such as `drop=0.05,dup=0.01,reorder=0.02,corrupt=0.001,seed=42`, given on a command line
//! or in the environment variable [`FAULTS_ENV`].
//!
//! What each fault does, in this order (a dropped frame gets no other fault):
//! - **drop**: the frame is not sent.
//! - **corrupt**: one byte of the frame's UDP payload (frame bytes 42.., the RDMA headers and
//!   payload, which no checksum covers on this card: `shared/spec/nic-behaviour.md` 1.4) is
//!   XORed with a non-zero mask. Frames of 42 bytes or less have a byte flipped anywhere.
//!   Headers before byte 42 are left alone so that a corrupted frame still reaches its card.
//! - **dup**: the frame is sent twice in a row.
//! - **reorder**: the frame is held back and sent right after the next frame this port
//!   transmits, so that frame overtakes it. A frame still held after the hold limit
//!   ([`FaultyLink::with_hold_limit`], 1 ms by default) is sent at the port's next
//!   `recv_frames` without having been overtaken, so a quiet port never keeps a frame. A
//!   frame that overtakes a held one is not itself held; a frame still held when the port
//!   is dropped is lost.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::{LinkCounter, LinkPort, LinkStats};

/// The environment variable holding a fault configuration string.
pub const FAULTS_ENV: &str = "BLUERDMA_LINK_FAULTS";

/// First frame byte that corruption may touch: the start of the UDP payload.
const CORRUPT_FROM: usize = 42;

/// Fault rates (each a probability per frame, 0 to 1) and the seed of their decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability that a frame is dropped.
    pub drop: f64,
    /// Probability that a frame is sent twice.
    pub duplicate: f64,
    /// Probability that a frame is overtaken by the next one.
    pub reorder: f64,
    /// Probability that a frame has one byte flipped.
    pub corrupt: f64,
    /// Seed of every decision.
    pub seed: u64,
}

/// What happens to one frame (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultDecision {
    /// The frame is not sent (and no other field applies).
    pub drop: bool,
    /// Byte offset and non-zero XOR mask of the corrupted byte.
    pub corrupt: Option<(usize, u8)>,
    /// The frame is sent twice.
    pub duplicate: bool,
    /// The frame is held back for the next one to overtake.
    pub reorder: bool,
}

/// The independent draws made for every frame, whether or not they are used, so that one
/// frame's fate never shifts another's.
#[derive(Clone, Copy)]
enum Draw {
    Drop,
    Corrupt,
    CorruptOffset,
    CorruptMask,
    Duplicate,
    Reorder,
}
const DRAWS_PER_FRAME: u64 = 6;

impl FaultConfig {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether any rate is non-zero.
    pub fn is_active(&self) -> bool {
        self.rates().iter().any(|(_, rate)| *rate > 0.0)
    }

    /// Reads [`FAULTS_ENV`]: `Ok(None)` if it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, FaultConfigError> {
        match std::env::var(FAULTS_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(FaultConfigError::Env {
                var: FAULTS_ENV,
                error: Box::new(FaultConfigError::NotUnicode),
            }),
            Ok(text) if text.trim().is_empty() => Ok(None),
            Ok(text) => text.parse().map(Some).map_err(|e| FaultConfigError::Env {
                var: FAULTS_ENV,
                error: Box::new(e),
            }),
        }
    }

    /// Checks that every rate is a number from 0 to 1.
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (key, rate) in self.rates() {
            if !(0.0..=1.0).contains(&rate) {
                return Err(FaultConfigError::BadRate {
                    key,
                    value: rate.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The decision for the frame at `index` (0-based, counting every frame the port was
    /// asked to transmit) of `len` bytes.
    pub fn decide(&self, index: u64, len: usize) -> FaultDecision {
        let hit = |draw: Draw, rate: f64| unit_interval(self.roll(index, draw)) < rate;
        let drop = hit(Draw::Drop, self.drop);
        let corrupt = (hit(Draw::Corrupt, self.corrupt) && len > 0).then(|| {
            let (from, span) = if len > CORRUPT_FROM {
                (CORRUPT_FROM, len - CORRUPT_FROM)
            } else {
                (0, len)
            };
            // `span` fits in u64 and the remainder is below it, so both casts are lossless.
            let offset = from + (self.roll(index, Draw::CorruptOffset) % span as u64) as usize;
            let mask = (self.roll(index, Draw::CorruptMask) % 255) as u8 + 1;
            (offset, mask)
        });
        FaultDecision {
            drop,
            corrupt: corrupt.filter(|_| !drop),
            duplicate: hit(Draw::Duplicate, self.duplicate) && !drop,
            reorder: hit(Draw::Reorder, self.reorder) && !drop,
        }
    }

    /// Draw `draw` of frame `index`: SplitMix64 output number `index * 6 + draw` of the seed.
    fn roll(&self, index: u64, draw: Draw) -> u64 {
        let n = index
            .wrapping_mul(DRAWS_PER_FRAME)
            .wrapping_add(draw as u64)
            .wrapping_add(1);
        splitmix64(self.seed.wrapping_add(n.wrapping_mul(SPLITMIX_GAMMA)))
    }

    fn rates(&self) -> [(&'static str, f64); 4] {
        [
            ("drop", self.drop),
            ("dup", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ]
    }
}

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function (Steele, Lea, Flood 2014).
fn splitmix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from the top 53 bits.
fn unit_interval(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Writes the canonical string, which [`FromStr`] reads back.
impl fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, rate) in self.rates() {
            write!(f, "{key}={rate},")?;
        }
        write!(f, "seed={}", self.seed)
    }
}

/// Parses `key=value` items separated by commas; keys `drop`, `dup` (or `duplicate`),
/// `reorder`, `corrupt` take a rate from 0 to 1, `seed` a decimal or `0x` hexadecimal u64.
/// Missing keys are 0; the empty string is no faults.
impl FromStr for FaultConfig {
    type Err = FaultConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut config = FaultConfig::none();
        let mut seen: Vec<&'static str> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| FaultConfigError::MissingValue {
                    item: item.to_string(),
                })?;
            let (key, slot): (&'static str, Option<&mut f64>) = match key {
                "drop" => ("drop", Some(&mut config.drop)),
                "dup" | "duplicate" => ("dup", Some(&mut config.duplicate)),
                "reorder" => ("reorder", Some(&mut config.reorder)),
                "corrupt" => ("corrupt", Some(&mut config.corrupt)),
                "seed" => ("seed", None),
                other => {
                    return Err(FaultConfigError::UnknownKey {
                        key: other.to_string(),
                    })
                }
            };
            if seen.contains(&key) {
                return Err(FaultConfigError::RepeatedKey { key });
            }
            seen.push(key);
            match slot {
                Some(rate) => *rate = parse_rate(key, value)?,
                None => config.seed = parse_seed(value)?,
            }
        }
        Ok(config)
    }
}

fn parse_rate(key: &'static str, value: &str) -> Result<f64, FaultConfigError> {
    let bad = || FaultConfigError::BadRate {
        key,
        value: value.to_string(),
    };
    let rate: f64 = value.parse().map_err(|_| bad())?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(bad())
    }
}

fn parse_seed(value: &str) -> Result<u64, FaultConfigError> {
    let parsed = match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|_| FaultConfigError::BadSeed {
        value: value.to_string(),
    })
}

/// Why a fault configuration was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultConfigError {
    /// An item without `=`.
    MissingValue {
        /// The item as written.
        item: String,
    },
    /// A key other than drop, dup, duplicate, reorder, corrupt, seed.
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A key given twice.
    RepeatedKey {
        /// The key.
        key: &'static str,
    },
    /// A rate that is not a number from 0 to 1.
    BadRate {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
    },
    /// A seed that is not a decimal or `0x` hexadecimal u64.
    BadSeed {
        /// The value as written.
        value: String,
    },
    /// The environment variable is not valid Unicode.
    NotUnicode,
    /// The configuration came from the environment variable `var`.
    Env {
        /// The variable.
        var: &'static str,
        /// What was wrong with its value.
        error: Box<FaultConfigError>,
    },
}

impl fmt::Display for FaultConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingValue { item } => {
                write!(f, "fault item `{item}` is not of the form key=value")
            }
            Self::UnknownKey { key } => write!(
                f,
                "unknown fault key `{key}` (expected drop, dup, reorder, corrupt or seed)"
            ),
            Self::RepeatedKey { key } => write!(f, "fault key `{key}` given twice"),
            Self::BadRate { key, value } => {
                write!(f, "fault rate {key}={value} is not a number from 0 to 1")
            }
            Self::BadSeed { value } => {
                write!(f, "fault seed `{value}` is not a decimal or 0x-hex u64")
            }
            Self::NotUnicode => write!(f, "fault configuration is not valid Unicode"),
            Self::Env { var, error } => write!(f, "{var}: {error}"),
        }
    }
}

impl std::error::Error for FaultConfigError {}

/// A frame held back for the next one to overtake.
struct Held {
    /// Its bytes (corruption already applied).
    bytes: Vec<u8>,
    /// 2 if it was also chosen for duplication.
    copies: usize,
    since: Instant,
}

/// A [`LinkPort`] that applies [`FaultConfig`] to every frame it transmits before handing
/// it to the inner port; received frames pass through untouched. Faults are counted in the
/// inner port's [`LinkStats`].
pub struct FaultyLink<L: LinkPort> {
    inner: L,
    config: FaultConfig,
    /// Position of the next frame in this port's transmit sequence.
    next_index: u64,
    held: Option<Held>,
    hold_limit: Duration,
}

impl<L: LinkPort> fmt::Debug for FaultyLink<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyLink")
            .field("config", &self.config)
            .field("next_index", &self.next_index)
            .field("holding", &self.held.is_some())
            .finish()
    }
}

/// One frame to pass on, in order.
#[derive(Clone, Copy)]
enum Emit {
    /// Frame `i` of the caller's slice, as is.
    Input(usize),
    /// Entry `i` of the call's owned frames (corrupted or released from hold).
    Owned(usize),
}

impl<L: LinkPort> FaultyLink<L> {
    /// Wraps `inner`; fails if a rate in `config` is not from 0 to 1.
    pub fn new(inner: L, config: FaultConfig) -> Result<Self, FaultConfigError> {
        config.validate()?;
        log::info!("link faults: {config}");
        Ok(Self {
            inner,
            config,
            next_index: 0,
            held: None,
            hold_limit: Duration::from_millis(1),
        })
    }

    /// Sets how long a frame chosen for reordering may wait for another frame to overtake it.
    pub fn with_hold_limit(self, hold_limit: Duration) -> Self {
        Self { hold_limit, ..self }
    }

    /// The configuration in force.
    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// How many frames the port has been asked to transmit (the index of the next one).
    pub fn frames_offered(&self) -> u64 {
        self.next_index
    }

    /// The wrapped port.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped port, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Sends a held frame now, not overtaken.
    fn release_held(&mut self) -> io::Result<()> {
        match self.held.take() {
            Some(held) => {
                let copies = [held.bytes.as_slice(); 2];
                self.inner.send_frames(&copies[..held.copies])
            }
            None => Ok(()),
        }
    }
}

impl<L: LinkPort> LinkPort for FaultyLink<L> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        let stats = self.inner.stats().clone();
        let mut owned: Vec<Vec<u8>> = Vec::new();
        let mut plan: Vec<(Emit, usize)> = Vec::with_capacity(frames.len() + 1);
        for (i, frame) in frames.iter().enumerate() {
            let decision = self.config.decide(self.next_index, frame.len());
            self.next_index += 1;
            if decision.drop {
                stats.add(LinkCounter::FramesDropped, 1);
                continue;
            }
            let mut emit = Emit::Input(i);
            if let Some((offset, mask)) = decision.corrupt {
                let mut copy = frame.to_vec();
                if let Some(byte) = copy.get_mut(offset) {
                    *byte ^= mask;
                }
                owned.push(copy);
                emit = Emit::Owned(owned.len() - 1);
                stats.add(LinkCounter::FramesCorrupted, 1);
            }
            let copies = if decision.duplicate { 2 } else { 1 };
            if decision.duplicate {
                stats.add(LinkCounter::FramesDuplicated, 1);
            }
            if let Some(held) = self.held.take() {
                // This frame overtakes the held one.
                plan.push((emit, copies));
                owned.push(held.bytes);
                plan.push((Emit::Owned(owned.len() - 1), held.copies));
                stats.add(LinkCounter::FramesReordered, 1);
            } else if decision.reorder {
                let bytes = match emit {
                    Emit::Input(i) => frames[i].to_vec(),
                    Emit::Owned(o) => std::mem::take(&mut owned[o]),
                };
                self.held = Some(Held {
                    bytes,
                    copies,
                    since: Instant::now(),
                });
            } else {
                plan.push((emit, copies));
            }
        }
        let mut out: Vec<&[u8]> = Vec::with_capacity(plan.len() * 2);
        for (emit, copies) in plan {
            let bytes: &[u8] = match emit {
                Emit::Input(i) => frames[i],
                Emit::Owned(o) => &owned[o],
            };
            out.extend(std::iter::repeat_n(bytes, copies));
        }
        if out.is_empty() {
            return Ok(());
        }
        self.inner.send_frames(&out)
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let Some(since) = self.held.as_ref().map(|h| h.since) else {
            return self.inner.recv_frames(timeout, on_frame);
        };
        let remaining = self.hold_limit.saturating_sub(since.elapsed());
        if remaining.is_zero() {
            self.release_held()?;
            return self.inner.recv_frames(timeout, on_frame);
        }
        // Wake up in time to release the held frame if nothing overtakes it.
        let received = self.inner.recv_frames(timeout.min(remaining), on_frame)?;
        if self
            .held
            .as_ref()
            .is_some_and(|h| h.since.elapsed() >= self.hold_limit)
        {
            self.release_held()?;
        }
        Ok(received)
    }

    fn stats(&self) -> &LinkStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let c: FaultConfig = "drop=0.05,dup=0.01,reorder=0.02,corrupt=0.001,seed=42"
            .parse()
            .unwrap();
        assert_eq!(
            c,
            FaultConfig {
                drop: 0.05,
                duplicate: 0.01,
                reorder: 0.02,
                corrupt: 0.001,
                seed: 42
            }
        );
        assert_eq!(c.to_string().parse::<FaultConfig>().unwrap(), c);
        let spaced: FaultConfig = " duplicate = 1 , seed=0xFF ,".parse().unwrap();
        assert_eq!(
            (spaced.duplicate, spaced.seed, spaced.drop),
            (1.0, 255, 0.0)
        );
        assert_eq!("".parse::<FaultConfig>().unwrap(), FaultConfig::none());
        assert!(!FaultConfig::none().is_active() && c.is_active());
    }

    #[test]
    fn bad_strings_name_the_problem() {
        let cases = [
            (
                "drop=0.1,loss=0.2",
                "unknown fault key `loss` (expected drop, dup, reorder, corrupt or seed)",
            ),
            ("drop", "fault item `drop` is not of the form key=value"),
            (
                "drop=1.5",
                "fault rate drop=1.5 is not a number from 0 to 1",
            ),
            (
                "corrupt=-0.1",
                "fault rate corrupt=-0.1 is not a number from 0 to 1",
            ),
            (
                "reorder=NaN",
                "fault rate reorder=NaN is not a number from 0 to 1",
            ),
            ("dup=abc", "fault rate dup=abc is not a number from 0 to 1"),
            ("seed=-1", "fault seed `-1` is not a decimal or 0x-hex u64"),
            ("drop=0.1,drop=0.2", "fault key `drop` given twice"),
            ("dup=0.1,duplicate=0.2", "fault key `dup` given twice"),
        ];
        for (text, message) in cases {
            let err = text.parse::<FaultConfig>().unwrap_err();
            assert_eq!(err.to_string(), message, "{text}");
        }
    }

    #[test]
    fn validate_rejects_rates_built_by_hand() {
        let c = FaultConfig {
            reorder: f64::NAN,
            ..FaultConfig::none()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "fault rate reorder=NaN is not a number from 0 to 1"
        );
    }

    #[test]
    fn decisions_depend_only_on_seed_and_index() {
        let a = FaultConfig {
            drop: 0.3,
            corrupt: 0.3,
            duplicate: 0.3,
            reorder: 0.3,
            seed: 7,
        };
        let b = FaultConfig { drop: 0.0, ..a };
        for i in 0..500 {
            let (da, db) = (a.decide(i, 100), b.decide(i, 100));
            assert_eq!(da, a.decide(i, 100));
            if !da.drop {
                // Changing the drop rate changes nothing else about a frame it keeps.
                assert_eq!(da, db, "frame {i}");
            }
        }
    }

    #[test]
    fn rates_zero_and_one_are_never_and_always() {
        let always = FaultConfig {
            corrupt: 1.0,
            duplicate: 1.0,
            reorder: 1.0,
            ..FaultConfig::none()
        };
        for i in 0..200 {
            let d = always.decide(i, 60);
            let (offset, mask) = d.corrupt.unwrap();
            assert!((42..60).contains(&offset) && mask != 0, "{offset} {mask}");
            assert!(d.duplicate && d.reorder && !d.drop);
            assert_eq!(
                FaultConfig::none().decide(i, 60),
                FaultDecision {
                    drop: false,
                    corrupt: None,
                    duplicate: false,
                    reorder: false
                }
            );
        }
        let short = always.decide(0, 10).corrupt.unwrap();
        assert!(short.0 < 10);
    }
}
