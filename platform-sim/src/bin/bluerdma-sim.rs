//! `bluerdma-sim`: the emulated blue-rdma NIC from the command line.
//!
//! `bluerdma-sim serve` runs one card in serve mode ([`bluerdma_sim::serve`]): it listens on
//! the RTL simulator's CSR and DMA ports, so a driver built for the simulator talks to the
//! model unchanged, and joins the Ethernet link named by `--link`. It runs until SIGINT or
//! SIGTERM, then stops cleanly and prints the card's counters. `bluerdma-sim pci-serve`
//! serves a fake PCI card under a root directory instead ([`bluerdma_sim::pci`]): the
//! driver opens it as `+pci;root=DIR`. `bluerdma-sim help` prints the options.

use std::fmt;
use std::io::{self, Write as _};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bluerdma_sim::link::{LinkPort, UdpLink, UdpLinkConfig};
use bluerdma_sim::model::{NicConfig, RtlStopPolicy};
use bluerdma_sim::pci::{FakePciCard, FakePciConfig};
use bluerdma_sim::rtl::eth::{SOFT_SWITCH_PORT, TWO_CARD_PORT, TWO_CARD_RETRY};
use bluerdma_sim::rtl::{BusWidth, DmaServerConfig, RetryPolicy, SoftSwitchLink, TwoCardLink};
use bluerdma_sim::serve::{LoopbackLink, ServePorts, ServedCard};

const USAGE: &str = "\
usage: bluerdma-sim serve [OPTIONS]
       bluerdma-sim pci-serve --root DIR [OPTIONS]
       bluerdma-sim help

serve: runs the emulated NIC behind the RTL simulator's sockets (127.0.0.1 only) until
SIGINT or SIGTERM.

pci-serve: builds a fake PCI card's sysfs tree under DIR (BAR0 `resource0` and a u-dma-buf
buffer, files the driver maps) and runs the emulated NIC behind it, doing DMA by physical
address into the driver process (root only). The driver opens it as `+pci;root=DIR`.
  --root DIR           the tree's root (required)
  --bdf ADDRESS        the card's PCI address (default 0000:3b:00.0)
  --udmabuf-mib N      the u-dma-buf buffer's size in MiB (default 8)
  --link, --name, --strict, --rtl-stops, --log as for serve

serve options:
  --inst N             simulator instance (default 1): CSR port 7700+N, DMA port 7002+N
  --csr-port P         CSR port instead of 7700+N (0 picks a free one)
  --dma-port P         DMA port instead of 7002+N (0 picks a free one)
  --link SPEC          the card's Ethernet (default loopback):
                         loopback                 every frame sent comes back (1-card bench)
                         two-card-listen[:PORT]   card 1 of the two-card bench (port 7777)
                         two-card-connect[:PORT]  card 2 of the two-card bench (port 7777)
                         soft-switch[:PORT]       node N of the soft switch (port 8100)
                         udp:IP[:PORT]            the emulator's UDP link at IP in 127/8
                                                  (port 4791)
  --name NAME          card name in logs (default blueN)
  --strict             add the protection-domain check the card lacks
  --rtl-stops POLICY   where the RTL freezes or its simulation ends (an lkey without a
                       valid MR entry, a failed UpdatePGT, an undecoded register, a stale
                       PSN, ...): freeze (the card stops, as the RTL; the default, or
                       $BLUERDMA_RTL_STOPS), fail (freeze, and exit with an error at the
                       end) or continue (log and carry on)
  --bus 256|512        data bus width in bits: 32- or 64-byte DMA beats (default 256)
  --driver-wait SECS   how long a DMA access waits for the driver to connect (default 10)
  --log LEVEL          off, error, warn, info (default), debug or trace
";

/// The Ethernet link of the served card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkSpec {
    Loopback,
    TwoCardListen(u16),
    TwoCardConnect(u16),
    SoftSwitch(u16),
    Udp(Ipv4Addr, u16),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ServeArgs {
    inst: u8,
    csr_port: Option<u16>,
    dma_port: Option<u16>,
    link: LinkSpec,
    name: Option<String>,
    strict: bool,
    rtl_stops: RtlStopPolicy,
    bus: BusWidth,
    driver_wait: Duration,
    log: log::LevelFilter,
}

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs {
            inst: 1,
            csr_port: None,
            dma_port: None,
            link: LinkSpec::Loopback,
            name: None,
            strict: false,
            rtl_stops: RtlStopPolicy::from_env(),
            bus: BusWidth::Bits256,
            driver_wait: Duration::from_secs(10),
            log: log::LevelFilter::Info,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct PciServeArgs {
    root: PathBuf,
    bdf: String,
    udmabuf_mib: u64,
    link: LinkSpec,
    name: String,
    strict: bool,
    rtl_stops: RtlStopPolicy,
    log: log::LevelFilter,
}

#[derive(Debug, PartialEq, Eq)]
enum Command {
    Serve(ServeArgs),
    PciServe(PciServeArgs),
    Help,
}

fn number<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{what}: {text:?} is not a valid number"))
}

/// `name` or `name:PORT`; `None` if `spec` is neither.
fn with_port(spec: &str, name: &str, default: u16) -> Option<Result<u16, String>> {
    let rest = spec.strip_prefix(name)?;
    if rest.is_empty() {
        return Some(Ok(default));
    }
    let port = rest.strip_prefix(':')?;
    Some(number("--link port", port))
}

fn parse_link(spec: &str) -> Result<LinkSpec, String> {
    if spec == "loopback" {
        return Ok(LinkSpec::Loopback);
    }
    if let Some(port) = with_port(spec, "two-card-listen", TWO_CARD_PORT) {
        return port.map(LinkSpec::TwoCardListen);
    }
    if let Some(port) = with_port(spec, "two-card-connect", TWO_CARD_PORT) {
        return port.map(LinkSpec::TwoCardConnect);
    }
    if let Some(port) = with_port(spec, "soft-switch", SOFT_SWITCH_PORT) {
        return port.map(LinkSpec::SoftSwitch);
    }
    if let Some(addr) = spec.strip_prefix("udp:") {
        let (ip, port) = match addr.split_once(':') {
            Some((ip, port)) => (ip, number("--link port", port)?),
            None => (addr, bluerdma_sim::link::udp::DEFAULT_PORT),
        };
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("--link: {ip:?} is not an IPv4 address"))?;
        return Ok(LinkSpec::Udp(ip, port));
    }
    Err(format!(
        "--link: unknown link {spec:?} (see `bluerdma-sim help`)"
    ))
}

fn parse_pci(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut root = None;
    let mut a = PciServeArgs {
        root: PathBuf::new(),
        bdf: "0000:3b:00.0".into(),
        udmabuf_mib: 8,
        link: LinkSpec::Loopback,
        name: "blue-pci".into(),
        strict: false,
        rtl_stops: RtlStopPolicy::from_env(),
        log: log::LevelFilter::Info,
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--root" => root = Some(PathBuf::from(value()?)),
            "--bdf" => a.bdf = value()?,
            "--udmabuf-mib" => {
                a.udmabuf_mib = number("--udmabuf-mib", &value()?)?;
                if !(4..=1024).contains(&a.udmabuf_mib) {
                    return Err("--udmabuf-mib: 4 to 1024 (the engine needs about 4 MiB)".into());
                }
            }
            "--link" => a.link = parse_link(&value()?)?,
            "--name" => a.name = value()?,
            "--strict" => a.strict = true,
            "--rtl-stops" => a.rtl_stops = RtlStopPolicy::parse(&value()?)?,
            "--log" => {
                let level = value()?;
                a.log = level
                    .parse()
                    .map_err(|_| format!("--log: unknown level {level:?}"))?;
            }
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    a.root = root.ok_or("pci-serve needs --root DIR")?;
    Ok(Command::PciServe(a))
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    match args.next().as_deref() {
        Some("serve") => {}
        Some("pci-serve") => return parse_pci(args),
        Some("help" | "-h" | "--help") | None => return Ok(Command::Help),
        Some(other) => return Err(format!("unknown command {other:?}")),
    }
    let mut serve = ServeArgs::default();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--inst" => serve.inst = number("--inst", &value()?)?,
            "--csr-port" => serve.csr_port = Some(number("--csr-port", &value()?)?),
            "--dma-port" => serve.dma_port = Some(number("--dma-port", &value()?)?),
            "--link" => serve.link = parse_link(&value()?)?,
            "--name" => serve.name = Some(value()?),
            "--strict" => serve.strict = true,
            "--rtl-stops" => serve.rtl_stops = RtlStopPolicy::parse(&value()?)?,
            "--bus" => {
                serve.bus = match value()?.as_str() {
                    "256" => BusWidth::Bits256,
                    "512" => BusWidth::Bits512,
                    other => return Err(format!("--bus: {other:?} is neither 256 nor 512")),
                }
            }
            "--driver-wait" => {
                let secs: f64 = number("--driver-wait", &value()?)?;
                serve.driver_wait = Duration::try_from_secs_f64(secs)
                    .map_err(|_| format!("--driver-wait: {secs} is not a duration"))?;
            }
            "--log" => {
                let level = value()?;
                serve.log = level
                    .parse()
                    .map_err(|_| format!("--log: unknown level {level:?}"))?;
            }
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(Command::Serve(serve))
}

/// Log lines on stderr, with the time since start and the thread's name.
struct StderrLogger {
    start: Instant,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let t = self.start.elapsed().as_secs_f64();
            let thread = thread::current();
            let _ = writeln!(
                io::stderr().lock(),
                "{t:10.6} {:5} [{}] {}",
                record.level(),
                thread.name().unwrap_or("?"),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and
        // lives for the whole program.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

fn open_link(spec: LinkSpec, inst: u8) -> io::Result<Box<dyn LinkPort>> {
    Ok(match spec {
        LinkSpec::Loopback => Box::new(LoopbackLink::new()),
        LinkSpec::TwoCardListen(port) => Box::new(TwoCardLink::listen(port)?),
        LinkSpec::TwoCardConnect(port) => {
            log::info!("connecting to card 1 on 127.0.0.1:{port}");
            Box::new(TwoCardLink::connect(port, &TWO_CARD_RETRY)?)
        }
        LinkSpec::SoftSwitch(port) => {
            log::info!("joining the soft switch on 127.0.0.1:{port} as node {inst}");
            Box::new(SoftSwitchLink::connect(
                port,
                inst,
                &RetryPolicy::SIMULATOR,
            )?)
        }
        LinkSpec::Udp(ip, port) => Box::new(UdpLink::bind(UdpLinkConfig::new(ip).with_port(port))?),
    })
}

/// A line on stdout; a reader that went away is no reason to fail.
fn say(line: fmt::Arguments<'_>) {
    let _ = writeln!(io::stdout().lock(), "bluerdma-sim: {line}");
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let defaults = ServePorts::for_instance(args.inst);
    let ports = ServePorts {
        csr: args.csr_port.unwrap_or(defaults.csr),
        dma: args.dma_port.unwrap_or(defaults.dma),
    };
    let config = NicConfig {
        name: args.name.unwrap_or_else(|| format!("blue{}", args.inst)),
        strict: args.strict,
        rtl_stops: binary_policy(args.rtl_stops),
        ..NicConfig::default()
    };
    let dma = DmaServerConfig {
        port: ports.dma,
        bus: args.bus,
        driver_wait: args.driver_wait,
        ..DmaServerConfig::for_instance(args.inst)
    };
    let link = open_link(args.link, args.inst).map_err(|e| format!("link: {e}"))?;
    let card = ServedCard::start_with(config, ports.csr, dma, link)
        .map_err(|e| format!("cannot serve: {e}"))?;
    // One line on stdout that a script can wait for.
    say(format_args!(
        "instance {} serving {} (link {:?})",
        args.inst,
        card.ports(),
        args.link
    ));
    run_until_stopped(|| card.nic().stats().snapshot());
    let stats = card.nic().stats().snapshot();
    let (csr, dma) = (card.csr_stats(), card.dma_stats());
    let stop = card.nic().shared().rtl_stop();
    drop(card);
    say(format_args!("card counters: {stats}"));
    say(format_args!("CSR {csr:?}"));
    say(format_args!("DMA {dma:?}"));
    rtl_stop_verdict(args.rtl_stops, stop)
}

/// The card's policy for `policy`: `fail` is `freeze` plus [`rtl_stop_verdict`] at the end
/// (the binary exits with an error rather than panicking as a dropped card would).
fn binary_policy(policy: RtlStopPolicy) -> RtlStopPolicy {
    match policy {
        RtlStopPolicy::Fail => RtlStopPolicy::Freeze,
        p => p,
    }
}

/// Under `fail`, an RTL stop the card reached is the run's error.
fn rtl_stop_verdict(
    policy: RtlStopPolicy,
    stop: Option<bluerdma_sim::model::RtlStop>,
) -> Result<(), String> {
    match stop {
        Some(stop) if policy == RtlStopPolicy::Fail => {
            Err(format!("the card froze at an RTL stop: {stop}"))
        }
        Some(stop) => {
            say(format_args!("the card reached an RTL stop: {stop}"));
            Ok(())
        }
        None => Ok(()),
    }
}

/// Waits for SIGINT or SIGTERM, logging the card's counters when they change.
fn run_until_stopped(stats: impl Fn() -> bluerdma_sim::model::NicStatsSnapshot) {
    let mut last = stats();
    let mut last_report = Instant::now();
    while !STOP.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(100));
        if last_report.elapsed() >= Duration::from_secs(10) {
            let now = stats();
            if now != last {
                log::info!("counters: {now}");
                last = now;
            }
            last_report = Instant::now();
        }
    }
    log::info!("stopping");
}

fn pci_serve(args: PciServeArgs) -> Result<(), String> {
    let mut cfg = FakePciConfig::new(args.root);
    cfg.bdf = args.bdf;
    cfg.udmabuf_len = args.udmabuf_mib << 20;
    cfg.nic = NicConfig {
        name: args.name,
        strict: args.strict,
        rtl_stops: binary_policy(args.rtl_stops),
        ..NicConfig::default()
    };
    let link = open_link(args.link, 1).map_err(|e| format!("link: {e}"))?;
    let card = FakePciCard::start(&cfg, link).map_err(|e| format!("cannot serve: {e}"))?;
    let tree = card.tree();
    say(format_args!(
        "fake PCI card {} serving under {} (u-dma-buf {:#x}, {} bytes; link {:?})",
        tree.bdf,
        tree.root.display(),
        tree.udmabuf_phys,
        tree.udmabuf_len,
        args.link
    ));
    run_until_stopped(|| card.nic().stats().snapshot());
    let stats = card.nic().stats().snapshot();
    let stop = card.nic().shared().rtl_stop();
    drop(card);
    say(format_args!("card counters: {stats}"));
    rtl_stop_verdict(args.rtl_stops, stop)
}

fn main() -> ExitCode {
    let command = match parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bluerdma-sim: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let level = match &command {
        Command::Help => {
            let _ = io::stdout().write_all(USAGE.as_bytes());
            return ExitCode::SUCCESS;
        }
        Command::Serve(args) => args.log,
        Command::PciServe(args) => args.log,
    };
    let logger = Box::leak(Box::new(StderrLogger {
        start: Instant::now(),
    }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
    install_signal_handlers();
    let result = match command {
        Command::Serve(args) => serve(args),
        Command::PciServe(args) => pci_serve(args),
        Command::Help => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bluerdma-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<Command, String> {
        parse(words.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn serve_defaults_to_the_loopback_bench() {
        assert_eq!(
            parse_words("serve"),
            Ok(Command::Serve(ServeArgs::default()))
        );
        assert_eq!(parse_words(""), Ok(Command::Help));
        assert_eq!(parse_words("serve --help"), Ok(Command::Help));
    }

    #[test]
    fn every_option_is_parsed() {
        let Ok(Command::Serve(a)) = parse_words(
            "serve --inst 2 --csr-port 0 --dma-port 9004 --link two-card-connect:7778 \
             --name x --strict --rtl-stops continue --bus 512 --driver-wait 0.5 --log debug",
        ) else {
            panic!("not parsed");
        };
        assert_eq!(a.inst, 2);
        assert_eq!((a.csr_port, a.dma_port), (Some(0), Some(9004)));
        assert_eq!(a.link, LinkSpec::TwoCardConnect(7778));
        assert_eq!(a.name.as_deref(), Some("x"));
        assert!(a.strict);
        assert_eq!(a.rtl_stops, RtlStopPolicy::Continue);
        assert_eq!(a.bus, BusWidth::Bits512);
        assert_eq!(a.driver_wait, Duration::from_millis(500));
        assert_eq!(a.log, log::LevelFilter::Debug);
    }

    #[test]
    fn link_specs_take_the_benchs_default_ports() {
        assert_eq!(
            parse_link("two-card-listen"),
            Ok(LinkSpec::TwoCardListen(7777))
        );
        assert_eq!(parse_link("soft-switch"), Ok(LinkSpec::SoftSwitch(8100)));
        assert_eq!(
            parse_link("soft-switch:9000"),
            Ok(LinkSpec::SoftSwitch(9000))
        );
        assert_eq!(
            parse_link("udp:127.0.0.3"),
            Ok(LinkSpec::Udp(Ipv4Addr::new(127, 0, 0, 3), 4791))
        );
        assert_eq!(
            parse_link("udp:127.0.0.3:5000"),
            Ok(LinkSpec::Udp(Ipv4Addr::new(127, 0, 0, 3), 5000))
        );
    }

    #[test]
    fn bad_arguments_are_named() {
        let err = |w: &str| parse_words(w).unwrap_err();
        assert!(err("serve --inst 300").contains("--inst"));
        assert!(err("serve --inst").contains("needs a value"));
        assert!(err("serve --link two-card-listenx").contains("unknown link"));
        assert!(err("serve --link soft-switch:x").contains("not a valid number"));
        assert!(err("serve --link udp:localhost").contains("IPv4"));
        assert!(err("serve --bus 128").contains("--bus"));
        assert!(err("serve --rtl-stops strict").contains("freeze, fail, continue"));
        assert!(err("serve --driver-wait -1").contains("--driver-wait"));
        assert!(err("serve --frobnicate").contains("--frobnicate"));
        assert!(err("launch").contains("launch"));
        assert!(err("pci-serve").contains("needs --root"));
        assert!(err("pci-serve --root /x --udmabuf-mib 2").contains("4 to 1024"));
    }

    #[test]
    fn pci_serve_takes_its_root_and_the_link() {
        let Ok(Command::PciServe(a)) =
            parse_words("pci-serve --root /tmp/card --link udp:127.0.0.9 --udmabuf-mib 16")
        else {
            panic!("not parsed");
        };
        assert_eq!(a.root, PathBuf::from("/tmp/card"));
        assert_eq!(a.link, LinkSpec::Udp(Ipv4Addr::new(127, 0, 0, 9), 4791));
        assert_eq!((a.udmabuf_mib, a.bdf.as_str()), (16, "0000:3b:00.0"));
    }
}
