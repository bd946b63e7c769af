//! The backend part of a device entry: `+kind[:arg]` and `;key=value` options.
//!
//! | text | backend |
//! |---|---|
//! | (none) | the emulated card in this process |
//! | `+rtl` | the RTL simulator on CSR 127.0.0.1:7701, DMA 127.0.0.1:7003 |
//! | `+rtl:CSR/DMA` | the RTL simulator on those ports |
//! | `+pci` | the only PCI device with the card's IDs |
//! | `+pci:BDF` | the PCI device at `BDF` (`0000:3b:00.0`) |
//!
//! Options, each `;key=value` after the backend (or after the address for the emulated
//! card); [`OPTIONS`] lists them with the backends that take them:
//!
//! | key | backends | value |
//! |---|---|---|
//! | `oob` | all | `IP[:PORT]`: the address the out-of-band channel binds (default the device's IP, port 60000) |
//! | `key` | all | the out-of-band channel's key file (`crate::oob::OobKey`; default: `BLUERDMA_OOB_KEY` or the per-user key) |
//! | `command_timeout` | all | seconds a command may take |
//! | `ack_timeout_min` | all | seconds: the least local ACK timeout of every QP |
//! | `send_window` | all | packets in flight per QP (a fast peer of a slow card sends less at once) |
//! | `sim` | rtl | `model` (`bluerdma-sim serve`, default) or `cocotb` (longer timers) |
//! | `connect_timeout` | rtl | seconds to retry connecting to the simulator |
//! | `udmabuf` | pci | the u-dma-buf buffer for DMA memory (`udmabuf0`) |
//! | `hugepages` | pci | take DMA memory from up to N 2 MiB hugepages instead |
//! | `root` | pci | a directory with `sys`, `proc` and `dev` to use instead of the real ones |
//!
//! A new option is one row of [`OPTIONS`] and one arm of `apply`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::pci::PciConfig;
use crate::backend::{BackendKind, RtlConfig, Simulator};
use crate::pci::PciSelector;

/// The backend of a device and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendSpec {
    /// The emulated card in this process (on the UDP link at the device's address).
    #[default]
    Emulated,
    /// The RTL simulator's sockets.
    Rtl(RtlConfig),
    /// The PCI card.
    Pci(PciConfig),
}

impl BackendSpec {
    /// Which backend.
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendSpec::Emulated => BackendKind::Emulated,
            BackendSpec::Rtl(_) => BackendKind::Rtl,
            BackendSpec::Pci(_) => BackendKind::Pci,
        }
    }
}

/// Where a device's out-of-band channel binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OobBind {
    /// A local address.
    pub ip: Ipv4Addr,
    /// The port (`None`: `BLUERDMA_OOB_PORT` or 60000).
    pub port: Option<u16>,
}

/// Options of a device that hold for every backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Where the out-of-band channel binds (`None`: the device's IP).
    pub oob: Option<OobBind>,
    /// The out-of-band channel's key file (`None`: the default key).
    pub oob_key: Option<PathBuf>,
    /// How long a command may take (`None`: the backend's default).
    pub command_timeout: Option<Duration>,
    /// The least local ACK timeout (`None`: the backend's default).
    pub ack_timeout_min: Option<Duration>,
    /// Packets in flight per QP (`None`: the backend's default).
    pub send_window: Option<u32>,
}

/// Every option key, the backends that take it (`None`: all) and what its value is.
pub const OPTIONS: &[(&str, Option<BackendKind>, &str)] = &[
    ("oob", None, "IP[:PORT]"),
    ("key", None, "PATH"),
    ("command_timeout", None, "SECS"),
    ("ack_timeout_min", None, "SECS"),
    ("send_window", None, "PACKETS"),
    ("sim", Some(BackendKind::Rtl), "model|cocotb"),
    ("connect_timeout", Some(BackendKind::Rtl), "SECS"),
    ("udmabuf", Some(BackendKind::Pci), "NAME"),
    ("hugepages", Some(BackendKind::Pci), "N"),
    ("root", Some(BackendKind::Pci), "DIR"),
];

/// Parses `+kind[:arg]` (the text after `+`, or `None` for no suffix) and the `;key=value`
/// options; the error says what is wrong, without the entry (the caller adds it).
pub fn parse_backend(
    backend: Option<&str>,
    options: &[&str],
) -> Result<(BackendSpec, DeviceOptions), String> {
    let mut spec = match backend {
        None => BackendSpec::Emulated,
        Some(text) => {
            let (kind, arg) = match text.split_once(':') {
                Some((k, a)) => (k, Some(a)),
                None => (text, None),
            };
            match kind {
                "rtl" => BackendSpec::Rtl(parse_rtl(arg)?),
                "pci" => BackendSpec::Pci(PciConfig {
                    selector: arg
                        .map(|a| a.parse().map(PciSelector::Address))
                        .transpose()?,
                    ..PciConfig::default()
                }),
                "emulated" if arg.is_none() => BackendSpec::Emulated,
                _ => {
                    return Err(format!(
                        "`+{text}` is not a backend (`+rtl`, `+rtl:CSR/DMA`, `+pci`, \
                         `+pci:BDF`, or none for the emulated card)"
                    ))
                }
            }
        }
    };
    let mut opts = DeviceOptions::default();
    for option in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (key, value) = option
            .split_once('=')
            .ok_or_else(|| format!("option `{option}`: expected `key=value`"))?;
        let (key, value) = (key.trim(), value.trim());
        let Some(&(_, only, form)) = OPTIONS.iter().find(|(k, _, _)| *k == key) else {
            let known: Vec<&str> = OPTIONS.iter().map(|(k, _, _)| *k).collect();
            return Err(format!(
                "unknown option `{key}` (known: {})",
                known.join(", ")
            ));
        };
        if let Some(kind) = only.filter(|k| *k != spec.kind()) {
            return Err(format!(
                "option `{key}` is for +{kind} devices, not {} ones",
                spec.kind()
            ));
        }
        apply(&mut spec, &mut opts, key, value)
            .map_err(|e| format!("option `{key}={value}`: {e} (expected {key}={form})"))?;
    }
    Ok((spec, opts))
}

/// `CSR/DMA`, or nothing for the one-card bench's ports.
fn parse_rtl(arg: Option<&str>) -> Result<RtlConfig, String> {
    let mut cfg = RtlConfig::default();
    if let Some(arg) = arg {
        let bad = || format!("`+rtl:{arg}`: expected `+rtl:CSR_PORT/DMA_PORT` (e.g. 7701/7003)");
        let (csr, dma) = arg.split_once('/').ok_or_else(bad)?;
        cfg.csr_port = csr.trim().parse().map_err(|_| bad())?;
        cfg.dma_port = dma.trim().parse().map_err(|_| bad())?;
        if cfg.csr_port == 0 || cfg.dma_port == 0 {
            return Err(bad());
        }
    }
    Ok(cfg)
}

fn seconds(value: &str) -> Result<Duration, String> {
    let secs: f64 = value
        .parse()
        .map_err(|_| format!("`{value}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{value}` is not a duration"))
}

/// Sets one option whose key and backend were checked.
fn apply(
    spec: &mut BackendSpec,
    opts: &mut DeviceOptions,
    key: &str,
    value: &str,
) -> Result<(), String> {
    match (key, spec) {
        ("oob", _) => {
            let (ip, port) = match value.split_once(':') {
                Some((ip, port)) => (
                    ip,
                    Some(
                        port.parse()
                            .map_err(|_| format!("`{port}` is not a port"))?,
                    ),
                ),
                None => (value, None),
            };
            let ip: Ipv4Addr = ip
                .parse()
                .map_err(|_| format!("`{ip}` is not an IPv4 address"))?;
            opts.oob = Some(OobBind { ip, port });
        }
        ("key", _) if value.is_empty() => return Err("`key=` needs the path of a key file".into()),
        ("key", _) => opts.oob_key = Some(PathBuf::from(value)),
        ("command_timeout", _) => opts.command_timeout = Some(seconds(value)?),
        ("ack_timeout_min", _) => opts.ack_timeout_min = Some(seconds(value)?),
        ("send_window", _) => {
            let n: u32 = value
                .parse()
                .map_err(|_| format!("`{value}` is not a number"))?;
            if n == 0 {
                return Err("a window of 0 packets sends nothing".into());
            }
            opts.send_window = Some(n);
        }
        ("sim", BackendSpec::Rtl(r)) => {
            r.simulator = match value {
                "model" => Simulator::Model,
                "cocotb" => Simulator::Cocotb,
                _ => return Err(format!("`{value}` is neither `model` nor `cocotb`")),
            }
        }
        ("connect_timeout", BackendSpec::Rtl(r)) => r.connect_timeout = Some(seconds(value)?),
        ("udmabuf", BackendSpec::Pci(p)) => {
            if value.is_empty() || value.contains('/') {
                return Err(format!("`{value}` is not a u-dma-buf name"));
            }
            p.udmabuf = Some(value.into());
        }
        ("hugepages", BackendSpec::Pci(p)) => {
            let n: usize = value
                .parse()
                .map_err(|_| format!("`{value}` is not a number"))?;
            if n == 0 {
                return Err("0 hugepages hold no DMA memory".into());
            }
            p.hugepages = Some(n);
        }
        ("root", BackendSpec::Pci(p)) => {
            if value.is_empty() {
                return Err("the directory is empty".into());
            }
            p.root = Some(PathBuf::from(value));
        }
        _ => return Err("not an option of this backend".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_and_their_arguments() {
        assert_eq!(parse_backend(None, &[]).unwrap().0, BackendSpec::Emulated);
        let (rtl, _) = parse_backend(Some("rtl"), &[]).unwrap();
        assert_eq!(rtl, BackendSpec::Rtl(RtlConfig::default()));
        let BackendSpec::Rtl(r) = parse_backend(Some("rtl:7702/7004"), &["sim=cocotb"])
            .unwrap()
            .0
        else {
            panic!("not rtl")
        };
        assert_eq!(
            (r.csr_port, r.dma_port, r.simulator),
            (7702, 7004, Simulator::Cocotb)
        );
        let (pci, opts) = parse_backend(
            Some("pci:0000:3b:00.0"),
            &[
                "udmabuf=udmabuf1",
                "oob=10.0.0.1:6000",
                "command_timeout=0.5",
            ],
        )
        .unwrap();
        let BackendSpec::Pci(p) = pci else {
            panic!("not pci")
        };
        assert_eq!(
            p.selector,
            Some(PciSelector::Address("0000:3b:00.0".parse().unwrap()))
        );
        assert_eq!(p.udmabuf.as_deref(), Some("udmabuf1"));
        assert_eq!(
            opts.oob,
            Some(OobBind {
                ip: Ipv4Addr::new(10, 0, 0, 1),
                port: Some(6000)
            })
        );
        assert_eq!(opts.command_timeout, Some(Duration::from_millis(500)));
        let BackendSpec::Pci(p) = parse_backend(Some("pci"), &["root=/tmp/card", "hugepages=4"])
            .unwrap()
            .0
        else {
            panic!("not pci")
        };
        assert_eq!((p.selector, p.hugepages), (None, Some(4)));
        assert_eq!(p.root, Some(PathBuf::from("/tmp/card")));
    }

    #[test]
    fn errors_say_what_is_wrong_and_what_is_expected() {
        let e = |b: Option<&str>, o: &[&str]| parse_backend(b, o).unwrap_err();
        assert!(e(Some("fpga"), &[]).contains("`+fpga` is not a backend"));
        assert!(e(Some("rtl:7701"), &[]).contains("+rtl:CSR_PORT/DMA_PORT"));
        assert!(e(Some("rtl:x/1"), &[]).contains("+rtl:CSR_PORT/DMA_PORT"));
        assert!(e(Some("pci:3b:00"), &[]).contains("not a PCI address"));
        assert_eq!(
            e(None, &["udmabuf=udmabuf0"]),
            "option `udmabuf` is for +pci devices, not emulated ones"
        );
        assert!(e(Some("pci"), &["sim=cocotb"]).contains("for +rtl devices"));
        assert!(e(None, &["colour=blue"]).contains("unknown option `colour` (known: oob,"));
        assert!(e(None, &["oob"]).contains("expected `key=value`"));
        assert_eq!(
            e(None, &["oob=host:1"]),
            "option `oob=host:1`: `host` is not an IPv4 address (expected oob=IP[:PORT])"
        );
        assert!(e(Some("pci"), &["hugepages=0"]).contains("0 hugepages"));
        assert!(e(Some("rtl"), &["sim=verilator"]).contains("neither `model` nor `cocotb`"));
        assert!(e(None, &["command_timeout=-1"]).contains("not a duration"));
    }
}
