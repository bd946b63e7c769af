//! The scenario runner behind `cargo xtask sim`: two emulated NICs in this process, blue0
//! (127.0.0.1) and blue1 (127.0.0.2), on the UDP link, and a table of scenarios run against
//! them, each checked byte for byte and report for report, with a summary table at the end.
//!
//! Scenarios are rows of [`SCENARIOS`]: a name, the links they need, and a function of the
//! run's [`Sim`]. Issues C, D and G add their rows (the driver engine, verbs, perftest) next
//! to the raw-ring rows of issue B ([`raw`]). On clean links the raw-ring rows expect intact
//! delivery. With fault injection on (`--faults` or `BLUERDMA_LINK_FAULTS`) nothing can
//! expect that until the engine retransmits, so the run takes the [`Links::Faulty`] rows
//! instead ([`faults`]): they report the link and card counters, check the drop count
//! against the rate and replay the same traffic from the seed.
//!
//! `platform-sim/examples/sim.rs` is the command line; `cargo xtask sim` runs it.

pub mod faults;
pub mod raw;
pub mod testbed;

use std::fmt;
use std::io::{IsTerminal, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::link::{FaultConfig, PcapSink};
use testbed::{Testbed, TestbedConfig};

/// The links a scenario needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Runs when no fault is injected: it may expect every frame to arrive intact.
    Clean,
    /// Runs only when faults are injected.
    Faulty,
    /// Runs either way.
    Any,
}

/// One row of the scenario table.
pub struct Scenario {
    /// A short name, shown in the table and matched by `--only`.
    pub name: &'static str,
    /// When it runs.
    pub links: Links,
    /// The scenario: its notes for the table, or why it failed.
    pub run: fn(&mut Sim<'_>) -> Result<Report, Failure>,
}

/// Every scenario, in the order they run.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "WRITE 1 B",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[0]),
    },
    Scenario {
        name: "WRITE 100 B, unaligned both ends",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[1]),
    },
    Scenario {
        name: "WRITE 3 packets at PMTU 1024",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[2]),
    },
    Scenario {
        name: "WRITE 64 KiB + 100, unaligned",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[3]),
    },
    Scenario {
        name: "WRITE 1 MiB at PMTU 4096",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[4]),
    },
    Scenario {
        name: "WRITE across the PSN wrap",
        links: Links::Clean,
        run: |sim| raw::write(sim, &raw::WRITE_CASES[5]),
    },
    Scenario {
        name: "rkey violation",
        links: Links::Clean,
        run: raw::rkey_violation,
    },
    Scenario {
        name: "WRITE past the MR end",
        links: Links::Clean,
        run: raw::out_of_bounds,
    },
    Scenario {
        name: "QP without remote write",
        links: Links::Clean,
        run: raw::qp_access,
    },
    Scenario {
        name: "READ request report",
        links: Links::Clean,
        run: raw::read_request,
    },
    Scenario {
        name: "PSN gap -> NAK",
        links: Links::Clean,
        run: raw::psn_gap,
    },
    Scenario {
        name: "faulty WRITE traffic",
        links: Links::Faulty,
        run: faults::traffic,
    },
    Scenario {
        name: "replay from the seed",
        links: Links::Faulty,
        run: faults::replay,
    },
];

/// What a passing scenario reports.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One line for the table's notes column.
    pub notes: String,
    /// Lines printed under the table (counters, for instance).
    pub details: Vec<String>,
}

impl Report {
    /// A report with `notes` and no details.
    pub fn notes(notes: impl Into<String>) -> Self {
        Self {
            notes: notes.into(),
            details: Vec::new(),
        }
    }
}

/// Why a scenario failed: what was expected and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure(pub String);

impl<E: std::error::Error> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

/// Fails with `message` unless `condition` holds.
pub fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), Failure> {
    if condition {
        Ok(())
    } else {
        Err(Failure(message()))
    }
}

/// How to run the scenarios.
#[derive(Clone, Debug)]
pub struct Options {
    /// The UDP port of both cards.
    pub port: u16,
    /// Fault injection on both cards' links (`None` or all rates zero: clean links).
    pub faults: Option<FaultConfig>,
    /// Where to record every frame on the wire.
    pub pcap: Option<PathBuf>,
    /// The seed of fault decisions and payload patterns; overrides the fault
    /// configuration's own seed.
    pub seed: Option<u64>,
    /// Run only the scenarios whose name contains one of these (all if empty).
    pub only: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            port: crate::link::udp::DEFAULT_PORT,
            faults: None,
            pcap: None,
            seed: None,
            only: Vec::new(),
        }
    }
}

/// What the command line asked for.
#[derive(Clone, Debug)]
pub enum Command {
    /// Run the scenarios.
    Run(Options),
    /// List the scenarios.
    List,
    /// Print the usage.
    Help,
}

/// The usage of the command line that [`Command::parse`] reads.
pub const USAGE: &str = "\
cargo xtask sim [options]
  two emulated NICs in one process (blue0 = 127.0.0.1, blue1 = 127.0.0.2) on the UDP link,
  the scenarios run against them, a summary table; exits non-zero on any mismatch

options:
  --port N         UDP port of both cards (default 4791)
  --faults SPEC    inject faults, e.g. drop=0.05,dup=0.01,reorder=0.01,corrupt=0.001,seed=7
                   (default: the BLUERDMA_LINK_FAULTS environment variable); with faults the
                   run checks the counters and the replay from the seed instead of delivery
  --pcap FILE      record every frame on the wire (after fault injection) into FILE
  --seed N         seed of the fault decisions and payload patterns (overrides SPEC's seed)
  --only TEXT      run only the scenarios whose name contains TEXT (repeatable)
  --list           list the scenarios
  --help           this text";

impl Command {
    /// Reads the arguments (without the program name); the fault configuration defaults
    /// to the `BLUERDMA_LINK_FAULTS` environment variable.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
        let mut opts = Options::default();
        let mut faults_given = false;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .ok_or_else(|| format!("{name} needs a value (see --help)"))
            };
            match arg.as_str() {
                "--help" | "-h" => return Ok(Command::Help),
                "--list" => return Ok(Command::List),
                "--port" => {
                    let v = value("--port")?;
                    opts.port = v.parse().map_err(|_| format!("--port {v}: not a port"))?;
                }
                "--faults" => {
                    let v = value("--faults")?;
                    opts.faults = Some(v.parse().map_err(|e| format!("--faults {v}: {e}"))?);
                    faults_given = true;
                }
                "--pcap" => opts.pcap = Some(PathBuf::from(value("--pcap")?)),
                "--seed" => {
                    let v = value("--seed")?;
                    let seed = match v.strip_prefix("0x") {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => v.parse(),
                    };
                    opts.seed = Some(seed.map_err(|_| format!("--seed {v}: not a u64"))?);
                }
                "--only" => opts.only.push(value("--only")?),
                other => return Err(format!("unknown option `{other}` (see --help)")),
            }
        }
        if !faults_given {
            opts.faults = FaultConfig::from_env().map_err(|e| e.to_string())?;
        }
        Ok(Command::Run(opts))
    }
}

impl Options {
    /// The fault configuration in force, with `--seed` applied; `None` on clean links.
    pub fn effective_faults(&self) -> Option<FaultConfig> {
        let mut faults = self.faults.filter(FaultConfig::is_active)?;
        if let Some(seed) = self.seed {
            faults.seed = seed;
        }
        Some(faults)
    }

    /// The seed of this run: `--seed`, else the fault configuration's, else 0.
    pub fn effective_seed(&self) -> u64 {
        self.seed
            .or(self.faults.map(|f| f.seed))
            .unwrap_or_default()
    }

    fn selects(&self, scenario: &Scenario) -> bool {
        let links_match = match scenario.links {
            Links::Any => true,
            Links::Clean => self.effective_faults().is_none(),
            Links::Faulty => self.effective_faults().is_some(),
        };
        links_match
            && (self.only.is_empty()
                || self.only.iter().any(|o| scenario.name.contains(o.as_str())))
    }
}

/// What a scenario is given: the run's options, the shared testbed and the progress line.
pub struct Sim<'a> {
    options: &'a Options,
    capture: Option<PcapSink>,
    bed: Option<Testbed>,
    progress: &'a mut dyn FnMut(Event<'_>),
    current: &'static str,
    /// Fault-mode runs so far, for the replay to compare against.
    fault_runs: Vec<faults::FaultRun>,
}

impl Sim<'_> {
    /// The run's options.
    pub fn options(&self) -> &Options {
        self.options
    }

    /// The seed of this run (see [`Options::effective_seed`]).
    pub fn seed(&self) -> u64 {
        self.options.effective_seed()
    }

    /// The testbed the clean-link scenarios share, started on first use on the run's port
    /// with the run's faults and capture.
    pub fn bed(&mut self) -> Result<&mut Testbed, Failure> {
        if self.bed.is_none() {
            let bed = Testbed::start(self.bed_config())?;
            self.bed = Some(bed);
        }
        self.bed
            .as_mut()
            .ok_or_else(|| Failure("testbed did not start".into()))
    }

    /// A testbed of the scenario's own, on the run's port and capture, built from the
    /// run's configuration after `adjust`. The shared testbed is stopped first (it holds
    /// the port); the next [`Sim::bed`] starts it again.
    pub fn fresh_bed(
        &mut self,
        adjust: impl FnOnce(&mut TestbedConfig),
    ) -> Result<Testbed, Failure> {
        self.close_bed();
        let mut config = self.bed_config();
        adjust(&mut config);
        Ok(Testbed::start(config)?)
    }

    /// Stops the shared testbed, freeing the run's port for a scenario that starts cards
    /// of its own (the next [`Sim::bed`] starts it again).
    pub fn close_bed(&mut self) {
        self.bed = None;
    }

    /// The run's pcap sink, for a scenario that builds its own links.
    pub fn capture(&self) -> Option<&PcapSink> {
        self.capture.as_ref()
    }

    fn bed_config(&self) -> TestbedConfig {
        let mut config = TestbedConfig::new(self.options.port);
        config.capture = self.capture.clone();
        if let Some(faults) = self.options.effective_faults() {
            config.faults = faults::per_card(faults);
        }
        config
    }

    /// Shows what the current scenario is doing on the progress line.
    pub fn step(&mut self, what: &str) {
        (self.progress)(Event::Step {
            name: self.current,
            what,
        });
    }
}

/// Progress of a run, for [`ProgressLine`] or any other display.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// Scenario `index` (from 1) of `total` starts.
    Started {
        /// Its position.
        index: usize,
        /// How many run.
        total: usize,
        /// Its name.
        name: &'a str,
    },
    /// The current scenario reached a step.
    Step {
        /// The scenario.
        name: &'a str,
        /// What it is doing.
        what: &'a str,
    },
    /// Scenario `index` of `total` ended.
    Finished {
        /// Its position.
        index: usize,
        /// How many run.
        total: usize,
        /// Its row of the summary.
        row: &'a Row,
    },
}

/// One row of the summary table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The scenario.
    pub scenario: &'static str,
    /// `Ok(report)` or the failure.
    pub result: Result<Report, Failure>,
    /// How long it took.
    pub time: Duration,
}

impl Row {
    /// Whether the scenario passed.
    pub fn passed(&self) -> bool {
        self.result.is_ok()
    }
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct Summary {
    /// How the cards were linked, for the heading.
    pub setup: String,
    /// One row per scenario run.
    pub rows: Vec<Row>,
    /// Frames recorded in the pcap file, if one was asked for.
    pub pcap_frames: Option<u64>,
}

impl Summary {
    /// How many scenarios failed.
    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| !r.passed()).count()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.scenario.len())
            .chain([8])
            .max()
            .unwrap_or(8);
        writeln!(f, "{}", self.setup)?;
        writeln!(
            f,
            "{:<width$}  {:<6}  {:>8}  notes",
            "scenario", "result", "time"
        )?;
        writeln!(f, "{}", "-".repeat(width + 40))?;
        for row in &self.rows {
            let (result, notes) = match &row.result {
                Ok(r) => ("ok", r.notes.as_str()),
                Err(e) => ("FAILED", e.0.as_str()),
            };
            writeln!(
                f,
                "{:<width$}  {result:<6}  {:>7.3}s  {notes}",
                row.scenario,
                row.time.as_secs_f64()
            )?;
        }
        writeln!(f, "{}", "-".repeat(width + 40))?;
        for row in &self.rows {
            if let Ok(report) = &row.result {
                if !report.details.is_empty() {
                    writeln!(f, "{}:", row.scenario)?;
                    for line in &report.details {
                        writeln!(f, "  {line}")?;
                    }
                }
            }
        }
        if let Some(n) = self.pcap_frames {
            writeln!(f, "pcap: {n} frames recorded")?;
        }
        let failed = self.failed();
        write!(
            f,
            "sim: {} passed, {failed} failed",
            self.rows.len() - failed
        )
    }
}

/// Why a run could not start.
#[derive(Debug)]
pub enum RunError {
    /// The pcap file could not be created.
    Pcap(std::io::Error),
    /// No scenario matches the options.
    NothingToRun,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Pcap(e) => write!(f, "cannot create the pcap file: {e}"),
            RunError::NothingToRun => f.write_str("no scenario matches the options (try --list)"),
        }
    }
}

impl std::error::Error for RunError {}

/// Runs every selected scenario in table order, reporting progress to `progress`. A
/// scenario that panics is a failed row, not the end of the run.
pub fn run(options: &Options, progress: &mut dyn FnMut(Event<'_>)) -> Result<Summary, RunError> {
    let selected: Vec<&Scenario> = SCENARIOS.iter().filter(|s| options.selects(s)).collect();
    if selected.is_empty() {
        return Err(RunError::NothingToRun);
    }
    let capture = match &options.pcap {
        Some(path) => Some(PcapSink::create(path).map_err(RunError::Pcap)?),
        None => None,
    };
    let setup = setup_line(options);
    let mut sim = Sim {
        options,
        capture: capture.clone(),
        bed: None,
        progress,
        current: "",
        fault_runs: Vec::new(),
    };
    let total = selected.len();
    let mut rows = Vec::with_capacity(total);
    for (i, scenario) in selected.into_iter().enumerate() {
        let index = i + 1;
        sim.current = scenario.name;
        (sim.progress)(Event::Started {
            index,
            total,
            name: scenario.name,
        });
        let start = Instant::now();
        let mut result = panic::catch_unwind(AssertUnwindSafe(|| (scenario.run)(&mut sim)))
            .unwrap_or_else(|panic| Err(Failure(format!("panicked: {}", panic_text(&*panic)))));
        // A card of the shared testbed that froze fails the scenario that froze it; the
        // next scenario gets fresh cards.
        let stops = sim
            .bed
            .as_ref()
            .map(Testbed::take_rtl_stops)
            .unwrap_or_default();
        if !stops.is_empty() {
            sim.close_bed();
            let stops = stops.join("; ");
            result = Err(Failure(match result {
                Ok(report) => format!("{stops} (after: {})", report.notes),
                Err(Failure(e)) => format!("{stops}; {e}"),
            }));
        }
        let row = Row {
            scenario: scenario.name,
            result,
            time: start.elapsed(),
        };
        (sim.progress)(Event::Finished {
            index,
            total,
            row: &row,
        });
        rows.push(row);
    }
    // Stop the cards before counting what the capture holds.
    drop(sim);
    let pcap_frames = match capture {
        Some(sink) => {
            sink.flush().map_err(RunError::Pcap)?;
            Some(sink.frames().map_err(RunError::Pcap)?)
        }
        None => None,
    };
    Ok(Summary {
        setup,
        rows,
        pcap_frames,
    })
}

fn setup_line(options: &Options) -> String {
    let faults = match options.effective_faults() {
        Some(f) => format!("faults {f} (blue1's seed derived from it)"),
        None => "no faults".into(),
    };
    let pcap = match &options.pcap {
        Some(p) => format!(", pcap {}", p.display()),
        None => String::new(),
    };
    format!(
        "sim: blue0 = {} and blue1 = {} on the UDP link, port {}; {faults}; seed {}{pcap}",
        testbed::CARD_IPS[0],
        testbed::CARD_IPS[1],
        options.port,
        options.effective_seed()
    )
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Shows [`Event`]s on standard output: one line rewritten in place on a terminal, plain
/// lines otherwise (logs, CI). Failures always stay on screen.
pub struct ProgressLine {
    tty: bool,
}

impl ProgressLine {
    /// A progress display on standard output.
    pub fn stdout() -> Self {
        Self {
            tty: std::io::stdout().is_terminal(),
        }
    }

    /// Shows one event.
    pub fn show(&mut self, event: Event<'_>) {
        let mut out = std::io::stdout().lock();
        // Progress output is best effort: a closed stdout must not fail the run.
        let _ = match (event, self.tty) {
            (Event::Started { index, total, name }, true) => {
                write!(out, "\r\x1b[2K[{index}/{total}] {name} ...")
            }
            (Event::Started { index, total, name }, false) => {
                writeln!(out, "[{index}/{total}] {name} ...")
            }
            (Event::Step { name, what }, true) => write!(out, "\r\x1b[2K{name}: {what}"),
            (Event::Step { .. }, false) => Ok(()),
            (Event::Finished { index, total, row }, tty) => {
                let verdict = match &row.result {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("FAILED: {}", e.0),
                };
                let line = format!(
                    "[{index}/{total}] {} {verdict} ({:.3}s)",
                    row.scenario,
                    row.time.as_secs_f64()
                );
                match (tty, row.passed(), index == total) {
                    (true, true, false) => write!(out, "\r\x1b[2K{line}"),
                    (true, _, _) => writeln!(out, "\r\x1b[2K{line}"),
                    (false, _, _) => writeln!(out, "{line}"),
                }
            }
        };
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        Command::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn options_are_read_and_the_seed_overrides_the_spec() {
        let Ok(Command::Run(o)) = parse(&[
            "--port",
            "5000",
            "--faults",
            "drop=0.05,seed=3",
            "--seed",
            "0x10",
            "--only",
            "WRITE",
        ]) else {
            panic!("not a run");
        };
        assert_eq!(o.port, 5000);
        assert_eq!(
            o.effective_faults().map(|f| (f.drop, f.seed)),
            Some((0.05, 16))
        );
        assert_eq!(o.effective_seed(), 16);
        assert_eq!(o.only, vec!["WRITE".to_string()]);
        // The spec's own seed runs as named (nothing is mixed into it).
        let Ok(Command::Run(o)) = parse(&["--faults", "drop=0.05,seed=1"]) else {
            panic!("not a run");
        };
        assert_eq!(o.effective_faults().map(|f| f.seed), Some(1));
        assert_eq!(o.effective_seed(), 1);
        assert!(parse(&["--port"]).unwrap_err().contains("needs a value"));
        assert!(parse(&["--faults", "drop=2"]).unwrap_err().contains("drop"));
        assert!(parse(&["--bogus"]).unwrap_err().contains("--bogus"));
    }

    #[test]
    fn faults_select_the_faulty_rows_and_zero_rates_count_as_clean() {
        let clean = Options::default();
        let faulty = Options {
            faults: Some("drop=0.05".parse().unwrap()),
            ..Options::default()
        };
        let zero = Options {
            faults: Some("seed=5".parse().unwrap()),
            ..Options::default()
        };
        let names = |o: &Options| -> Vec<Links> {
            SCENARIOS
                .iter()
                .filter(|s| o.selects(s))
                .map(|s| s.links)
                .collect()
        };
        assert!(names(&clean).iter().all(|l| *l != Links::Faulty));
        assert!(names(&faulty).iter().all(|l| *l != Links::Clean));
        assert!(!names(&faulty).is_empty() && !names(&clean).is_empty());
        assert_eq!(names(&zero), names(&clean));
    }
}
