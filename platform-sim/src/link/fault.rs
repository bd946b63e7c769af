//! Seeded fault injection on transmit: drop, duplicate, reorder and corrupt frames.
//!
//! Every decision about a frame is a pure function of the seed, the transmit handle that
//! sends it (the port itself or one of its [`LinkPort::sender`]s, see [`FaultyLink`]) and
//! the frame's position in the sequence that handle transmits ([`FaultConfig::decide`],
//! [`FaultConfig::for_handle`]): the same seed and the same frames on each handle give the
//! same drops, copies, swaps and flipped bytes on every run, whatever the timing and however
//! the handles' threads interleave, and a failing scenario is replayed from the seed alone.
//! Rates come from a string such as `drop=0.05,dup=0.01,reorder=0.02,corrupt=0.001,seed=42`,
//! given on a command line or in the environment variable [`FAULTS_ENV`].
//!
//! What each fault does, in this order (a dropped frame gets no other fault):
//! - **drop**: the frame is not sent.
//! - **corrupt**: one byte of the frame's UDP payload (frame bytes 42.., the RDMA headers and
//!   payload, which no checksum covers on this card: `shared/spec/nic-behaviour.md` 1.4) is
//!   XORed with a non-zero mask. Frames of 42 bytes or less have a byte flipped anywhere.
//!   Headers before byte 42 are left alone so that a corrupted frame still reaches its card.
//! - **dup**: the frame is sent twice in a row.
//! - **reorder**: the frame is held back and sent right after the next frame its handle
//!   transmits, so that frame overtakes it. A frame still held after the hold limit
//!   ([`FaultyLink::with_hold_limit`], 1 ms by default) is sent through its handle at the
//!   port's next `recv_frames` without having been overtaken, so a quiet handle never keeps
//!   a frame while the port polls. A frame that overtakes a held one is not itself held; a
//!   frame still held when its handle is dropped is lost.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{FrameSender, LinkCounter, LinkPort, LinkStats};

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

    /// The decision for the frame at `index` (0-based, counting every frame the handle was
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

    /// The configuration of transmit handle `handle` of a [`FaultyLink`]: handle 0 (the
    /// port itself) uses `self` unchanged; handle k, the port's k-th sender, has the same
    /// rates and a seed mixed from this seed and k, so that its decisions are independent
    /// of the port's and of every other handle's.
    pub fn for_handle(&self, handle: u64) -> FaultConfig {
        if handle == 0 {
            return *self;
        }
        FaultConfig {
            seed: splitmix64(self.seed ^ splitmix64(handle.wrapping_mul(HANDLE_SALT))),
            ..*self
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
/// An odd constant that spreads handle numbers before they are mixed into a seed.
const HANDLE_SALT: u64 = 0xD1B5_4A32_D192_ED03;

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

/// The fault state of one transmit handle: its decisions, its position in its own
/// sequence, and the frame it holds back.
struct FaultStream {
    /// The configuration with this handle's seed ([`FaultConfig::for_handle`]).
    config: FaultConfig,
    /// Position of the next frame in this handle's transmit sequence.
    next_index: u64,
    held: Option<Held>,
}

/// One frame to pass on, in order.
#[derive(Clone, Copy)]
enum Emit {
    /// Frame `i` of the caller's slice, as is.
    Input(usize),
    /// Entry `i` of the call's owned frames (corrupted or released from hold).
    Owned(usize),
}

impl FaultStream {
    fn new(config: FaultConfig) -> Self {
        Self {
            config,
            next_index: 0,
            held: None,
        }
    }

    /// Applies the faults to `frames`, counting them in `stats`, and passes what is left
    /// (if anything) to `send` in one call.
    fn transmit(
        &mut self,
        frames: &[&[u8]],
        stats: &LinkStats,
        send: impl FnOnce(&[&[u8]]) -> io::Result<()>,
    ) -> io::Result<()> {
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
        send(&out)
    }

    /// How long the held frame may still wait (zero once the limit has passed), if any.
    fn hold_left(&self, hold_limit: Duration) -> Option<Duration> {
        self.held
            .as_ref()
            .map(|h| hold_limit.saturating_sub(h.since.elapsed()))
    }

    /// Passes the held frame to `send`, not overtaken, if it has waited `hold_limit`.
    fn release_if_aged(
        &mut self,
        hold_limit: Duration,
        send: impl FnOnce(&[&[u8]]) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.hold_left(hold_limit) != Some(Duration::ZERO) {
            return Ok(());
        }
        match self.held.take() {
            Some(held) => {
                let copies = [held.bytes.as_slice(); 2];
                send(&copies[..held.copies])
            }
            None => Ok(()),
        }
    }
}

/// A sender's fault state together with the handle it transmits through, locked as one so
/// that the port can release a frame the sender holds (see [`FaultyLink::sender`]).
struct SenderCore {
    stream: FaultStream,
    inner: Box<dyn FrameSender>,
}

impl SenderCore {
    fn release_if_aged(&mut self, hold_limit: Duration) -> io::Result<()> {
        let Self { stream, inner } = self;
        stream.release_if_aged(hold_limit, |out| inner.send_frames(out))
    }
}

/// The senders a [`FaultyLink`] has made.
#[derive(Default)]
struct Senders {
    /// How many were made: the last one is handle `made`.
    made: u64,
    /// Those still alive, whose held frames the port releases.
    live: Vec<Weak<Mutex<SenderCore>>>,
}

/// A [`LinkPort`] that applies [`FaultConfig`] to every frame it transmits before handing
/// it to the inner port; received frames pass through untouched. Faults are counted in the
/// inner port's [`LinkStats`].
///
/// Each transmit handle has its own sequence of decisions: the port itself is handle 0 and
/// uses the configuration as given; the k-th [`LinkPort::sender`] is handle k and uses
/// [`FaultConfig::for_handle`]`(k)`. So a frame's fate depends only on the seed, the handle
/// and the frame's position among that handle's frames, never on how the threads of a card
/// happen to interleave: a card whose send-ring thread and receive thread transmit at once
/// replays the same faults from the seed as long as each thread sends the same frames and
/// the senders are made in the same order. A frame held for reordering is overtaken only
/// by the next frame of its own handle; after the hold limit it is released by the port's
/// next `recv_frames`, whichever handle holds it.
pub struct FaultyLink<L: LinkPort> {
    inner: L,
    /// The port's own handle.
    own: FaultStream,
    hold_limit: Duration,
    senders: Mutex<Senders>,
}

impl<L: LinkPort> fmt::Debug for FaultyLink<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyLink")
            .field("config", &self.own.config)
            .field("next_index", &self.own.next_index)
            .field("holding", &self.own.held.is_some())
            .finish_non_exhaustive()
    }
}

impl<L: LinkPort> FaultyLink<L> {
    /// Wraps `inner`; fails if a rate in `config` is not from 0 to 1.
    pub fn new(inner: L, config: FaultConfig) -> Result<Self, FaultConfigError> {
        config.validate()?;
        log::info!("link faults: {config}");
        Ok(Self {
            inner,
            own: FaultStream::new(config),
            hold_limit: Duration::from_millis(1),
            senders: Mutex::new(Senders::default()),
        })
    }

    /// Sets how long a frame chosen for reordering may wait for another frame of its
    /// handle to overtake it (for the port and every sender).
    pub fn with_hold_limit(self, hold_limit: Duration) -> Self {
        Self { hold_limit, ..self }
    }

    /// The configuration in force (that of handle 0, the port itself).
    pub fn config(&self) -> &FaultConfig {
        &self.own.config
    }

    /// How many frames the port itself has been asked to transmit (the index of its next
    /// one); frames offered through its senders are not included.
    pub fn frames_offered(&self) -> u64 {
        self.own.next_index
    }

    /// The wrapped port.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped port, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    fn senders(&self) -> io::Result<MutexGuard<'_, Senders>> {
        self.senders
            .lock()
            .map_err(|_| io::Error::other("fault injector poisoned by a panic"))
    }

    /// The time until the first held frame (of any handle) reaches the hold limit. A
    /// sender busy transmitting is skipped: its next frame overtakes what it holds.
    fn next_release(&self) -> io::Result<Option<Duration>> {
        let mut next = self.own.hold_left(self.hold_limit);
        for core in self.senders()?.live.iter().filter_map(Weak::upgrade) {
            if let Ok(core) = core.try_lock() {
                next = next
                    .into_iter()
                    .chain(core.stream.hold_left(self.hold_limit))
                    .min();
            }
        }
        Ok(next)
    }

    /// Sends every held frame (of any handle) that has waited the hold limit, each
    /// through its own handle.
    fn release_aged(&mut self) -> io::Result<()> {
        let Self {
            inner,
            own,
            hold_limit,
            ..
        } = self;
        own.release_if_aged(*hold_limit, |out| inner.send_frames(out))?;
        let live: Vec<_> = {
            let mut senders = self.senders()?;
            senders.live.retain(|s| s.strong_count() > 0);
            senders.live.iter().filter_map(Weak::upgrade).collect()
        };
        for core in live {
            // A sender busy transmitting is skipped; a poisoned one panicked mid-send and
            // is left alone.
            if let Ok(mut core) = core.try_lock() {
                core.release_if_aged(self.hold_limit)?;
            }
        }
        Ok(())
    }
}

impl<L: LinkPort> LinkPort for FaultyLink<L> {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        let stats = self.inner.stats().clone();
        let inner = &mut self.inner;
        self.own
            .transmit(frames, &stats, |out| inner.send_frames(out))
    }

    fn recv_frames(
        &mut self,
        timeout: Duration,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        self.release_aged()?;
        // Wake up in time to release a held frame if nothing overtakes it.
        let wait = match self.next_release()? {
            Some(left) => timeout.min(left),
            None => timeout,
        };
        let received = self.inner.recv_frames(wait, on_frame)?;
        self.release_aged()?;
        Ok(received)
    }

    fn stats(&self) -> &LinkStats {
        self.inner.stats()
    }

    fn waker(&self) -> Option<super::LinkWaker> {
        self.inner.waker()
    }

    /// A sender that applies the same rates with its own sequence of decisions (see
    /// [`FaultyLink`]). Its held frame is released by the port's `recv_frames` after the
    /// hold limit, or lost if the sender is dropped first.
    fn sender(&self) -> io::Result<Box<dyn FrameSender>> {
        let inner = self.inner.sender()?;
        let mut senders = self.senders()?;
        senders.made += 1;
        let config = self.own.config.for_handle(senders.made);
        let core = Arc::new(Mutex::new(SenderCore {
            stream: FaultStream::new(config),
            inner,
        }));
        senders.live.retain(|s| s.strong_count() > 0);
        senders.live.push(Arc::downgrade(&core));
        Ok(Box::new(FaultySender {
            core,
            stats: self.inner.stats().clone(),
        }))
    }
}

/// A second transmit handle on a [`FaultyLink`].
struct FaultySender {
    core: Arc<Mutex<SenderCore>>,
    /// The port's counters.
    stats: LinkStats,
}

impl FrameSender for FaultySender {
    fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        let mut core = self
            .core
            .lock()
            .map_err(|_| io::Error::other("fault injector poisoned by a panic"))?;
        let SenderCore { stream, inner } = &mut *core;
        stream.transmit(frames, &self.stats, |out| inner.send_frames(out))
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
    fn each_handle_has_its_own_sequence_with_the_same_rates() {
        let port: FaultConfig = "drop=0.5,dup=0.25,seed=11".parse().unwrap();
        assert_eq!(port.for_handle(0), port);
        let handles: Vec<FaultConfig> = (1..=3).map(|k| port.for_handle(k)).collect();
        assert_eq!(
            handles[0],
            port.for_handle(1),
            "a pure function of seed and handle"
        );
        let drops =
            |c: &FaultConfig| -> Vec<bool> { (0..64).map(|i| c.decide(i, 80).drop).collect() };
        let mut seen = vec![drops(&port)];
        for h in &handles {
            assert_eq!((h.drop, h.duplicate), (port.drop, port.duplicate));
            let d = drops(h);
            assert!(!seen.contains(&d), "handles share a sequence");
            seen.push(d);
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
