//! The devices of this host: names, IPv4 addresses, MACs and backends (issue D item 3,
//! issue I; reference-latest.md 5.2 and 5.3 for the reference's blueN/uverbsN naming),
//! how they are found ([`discover`]) and opened ([`open`]).
//!
//! Several devices can share one host (blue0 and blue1 on distinct IPs), each with its own
//! out-of-band listener ([`crate::oob`]). The list comes from the environment variable
//! `BLUERDMA_DEVICES` ([`DEVICES_ENV`]), which holds either
//! - the path of a file with one device per line, `name ip [mac] [+backend][;key=value]...`,
//!   where `#` starts a comment and blank lines are skipped:
//!   ```text
//!   # name  ip          mac (optional)     backend (optional)
//!   blue0   17.34.51.10 02:bd:bd:00:00:00  +pci:0000:3b:00.0;udmabuf=udmabuf0
//!   blue1   127.0.0.2                      +rtl:7702/7004
//!   ```
//! - or the list inline, `name=ip[@mac][+backend][;key=value]...` separated by commas:
//!   `BLUERDMA_DEVICES="blue0=127.0.0.1+rtl,blue1=127.0.0.2"`.
//!
//! The option `;key=PATH` names the device's OOB key file ([`crate::oob::OobKey`]); without
//! it the device uses `BLUERDMA_OOB_KEY` or the default key.
//!
//! A device without a backend is the emulated card in this process; `+rtl` is the RTL
//! simulator's sockets, `+pci` the card ([`spec`] lists the backends and their options).
//! Unset (or empty), the list is blue0 = 127.0.0.1 and blue1 = 127.0.0.2, both emulated. A
//! device without a MAC gets 02:00 followed by its IP's four octets (locally administered,
//! unique per IP). `uverbsN` names the N-th device of the list, as the reference maps
//! uverbsN to blueN. Errors name the file and line, or the inline entry, and what is wrong
//! with it.

mod discover;
mod open;
pub mod spec;

pub use discover::{discover, namespace_address, Settings, OOB_PORT_ENV, WIRE_PSN_ENV};
pub use open::open;
#[cfg(feature = "emulator")]
pub(crate) use open::{open_backend as open_backend_of, open_oob as open_oob_of};
pub use spec::{BackendSpec, DeviceOptions, OobBind};

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;

use bluerdma_core::desc::MacAddr;

use crate::verbs::DeviceSpec;

/// The environment variable that holds the device list or the path of its file.
pub const DEVICES_ENV: &str = "BLUERDMA_DEVICES";

/// The longest device name: an `ibv_device` name is 64 bytes with its terminating NUL. A
/// name is ASCII letters, digits, `_`, `-` and `.`, so that both list forms can write it
/// (`#`, `=`, `@`, `,` and whitespace separate fields).
pub const MAX_NAME_LEN: usize = 63;

/// One device of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEntry {
    /// Name (e.g. `blue0`).
    pub name: String,
    /// The device's IPv4 address: its out-of-band listener and its RoCE address.
    pub ip: Ipv4Addr,
    /// The device's MAC.
    pub mac: MacAddr,
    /// Its backend.
    pub backend: BackendSpec,
    /// Its options.
    pub options: DeviceOptions,
}

impl DeviceEntry {
    /// A device at `ip` with the MAC derived from it (02:00 and the IP's octets).
    pub fn new(name: &str, ip: Ipv4Addr) -> Self {
        let o = ip.octets();
        DeviceEntry {
            name: name.into(),
            ip,
            mac: MacAddr::new([0x02, 0x00, o[0], o[1], o[2], o[3]]),
            backend: BackendSpec::Emulated,
            options: DeviceOptions::default(),
        }
    }

    /// The verbs layer's description of this device (default capacities).
    pub fn spec(&self) -> DeviceSpec {
        let mut spec = DeviceSpec::new(&self.name, self.ip);
        spec.mac = self.mac;
        spec.oob_key = self.options.oob_key.clone();
        spec
    }
}

/// Where a device list came from and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceListError {
    /// The file, or `BLUERDMA_DEVICES` for an inline list.
    pub source: String,
    /// The line (1-based) in a file, or the entry (1-based) of an inline list.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for DeviceListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An inline list is named by the variable; its items are entries, not lines.
        let item = if self.source == DEVICES_ENV {
            "entry"
        } else {
            "line"
        };
        match self.line {
            Some(line) => write!(f, "{} {item} {line}: {}", self.source, self.message),
            None => write!(f, "{}: {}", self.source, self.message),
        }
    }
}

impl std::error::Error for DeviceListError {}

/// The devices of this host, in list order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceList {
    entries: Vec<DeviceEntry>,
}

impl Default for DeviceList {
    fn default() -> Self {
        DeviceList {
            entries: vec![
                DeviceEntry::new("blue0", Ipv4Addr::new(127, 0, 0, 1)),
                DeviceEntry::new("blue1", Ipv4Addr::new(127, 0, 0, 2)),
            ],
        }
    }
}

impl DeviceList {
    /// The list named by `BLUERDMA_DEVICES`, or the default.
    pub fn from_env() -> Result<Self, DeviceListError> {
        Self::from_setting(std::env::var(DEVICES_ENV).ok().as_deref())
    }

    /// The list for a value of `BLUERDMA_DEVICES`: `None` or empty gives the default; a
    /// path of an existing file is read; otherwise a value with `=` is an inline list.
    pub fn from_setting(value: Option<&str>) -> Result<Self, DeviceListError> {
        let value = match value.map(str::trim) {
            None | Some("") => return Ok(Self::default()),
            Some(v) => v,
        };
        let path = Path::new(value);
        if path.is_file() {
            return Self::read_file(path);
        }
        if value.contains('=') {
            return Self::parse_inline(value);
        }
        Err(DeviceListError {
            source: DEVICES_ENV.into(),
            line: None,
            message: format!(
                "`{value}` is neither a readable file nor an inline list (name=ip,name=ip)"
            ),
        })
    }

    /// Reads a device file (`name ip [mac]` per line).
    pub fn read_file(path: &Path) -> Result<Self, DeviceListError> {
        let text = std::fs::read_to_string(path).map_err(|e| DeviceListError {
            source: path.display().to_string(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse_file(&text, &path.display().to_string())
    }

    /// Parses the text of a device file; `source` names it in errors.
    pub fn parse_file(text: &str, source: &str) -> Result<Self, DeviceListError> {
        let mut list = DeviceList { entries: vec![] };
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fail = |message: String| DeviceListError {
                source: source.into(),
                line: Some(index + 1),
                message,
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            // After name and IP: an optional MAC, then the backend and options (which start
            // with `+` or `;`).
            let is_backend = |f: &&str| f.starts_with('+') || f.starts_with(';');
            let (mac, rest) = match fields.get(2) {
                Some(f) if !is_backend(f) => (Some(*f), &fields[3..]),
                _ => (None, fields.get(2..).unwrap_or(&[])),
            };
            let entry = match fields.as_slice() {
                [name, ip, ..] if rest.iter().all(is_backend) => {
                    parse_entry(name, ip, mac, &rest.concat())
                }
                _ => Err(format!(
                    "`{line}`: expected `name ip [mac] [+backend][;key=value]`, found {} \
                     fields",
                    fields.len()
                )),
            }
            .map_err(fail)?;
            list.add(entry).map_err(fail)?;
        }
        list.non_empty(source)
    }

    /// Parses an inline list, `name=ip[@mac][+backend][;key=value]...` separated by commas.
    pub fn parse_inline(text: &str) -> Result<Self, DeviceListError> {
        let mut list = DeviceList { entries: vec![] };
        for (index, item) in text.split(',').enumerate() {
            let item = item.trim();
            let fail = |message: String| DeviceListError {
                source: DEVICES_ENV.into(),
                line: Some(index + 1),
                message,
            };
            let entry = match item.split_once('=') {
                Some((name, rest)) => {
                    // `ip[@mac]` ends at the backend (`+`) or the first option (`;`).
                    let end = rest.find(['+', ';']).unwrap_or(rest.len());
                    let (addr, backend) = rest.split_at(end);
                    match addr.split_once('@') {
                        Some((ip, mac)) => {
                            parse_entry(name.trim(), ip.trim(), Some(mac.trim()), backend)
                        }
                        None => parse_entry(name.trim(), addr.trim(), None, backend),
                    }
                }
                None => Err(format!(
                    "`{item}`: expected `name=ip[@mac][+backend][;key=value]`"
                )),
            }
            .map_err(fail)?;
            list.add(entry).map_err(fail)?;
        }
        list.non_empty(DEVICES_ENV)
    }

    fn add(&mut self, entry: DeviceEntry) -> Result<(), String> {
        if let Some(other) = self.entries.iter().find(|e| e.name == entry.name) {
            return Err(format!(
                "device name `{}` is listed twice (first at {})",
                entry.name, other.ip
            ));
        }
        if let Some(other) = self.entries.iter().find(|e| e.ip == entry.ip) {
            return Err(format!(
                "IP {} is already device `{}` (each device needs its own IP for its OOB listener)",
                entry.ip, other.name
            ));
        }
        self.entries.push(entry);
        Ok(())
    }

    fn non_empty(self, source: &str) -> Result<Self, DeviceListError> {
        if self.entries.is_empty() {
            return Err(DeviceListError {
                source: source.into(),
                line: None,
                message: "the device list is empty".into(),
            });
        }
        Ok(self)
    }

    /// The devices in list order.
    pub fn entries(&self) -> &[DeviceEntry] {
        &self.entries
    }

    /// The device called `name`; `uverbsN` is the N-th device of the list.
    pub fn get(&self, name: &str) -> Option<&DeviceEntry> {
        if let Some(found) = self.entries.iter().find(|e| e.name == name) {
            return Some(found);
        }
        let index: usize = name.strip_prefix("uverbs")?.parse().ok()?;
        self.entries.get(index)
    }

    /// The device at `ip`.
    pub fn by_ip(&self, ip: Ipv4Addr) -> Option<&DeviceEntry> {
        self.entries.iter().find(|e| e.ip == ip)
    }
}

/// One device from its fields (`backend` is `+kind[:arg][;key=value]...`, or empty); the
/// error says which field is wrong.
fn parse_entry(
    name: &str,
    ip: &str,
    mac: Option<&str>,
    backend: &str,
) -> Result<DeviceEntry, String> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(name_char) {
        return Err(format!(
            "`{}` is not a device name (ASCII letters, digits, `_`, `-` and `.`; at most \
             {MAX_NAME_LEN} bytes)",
            name.escape_debug()
        ));
    }
    if name.starts_with("uverbs") {
        return Err(format!(
            "`{name}`: uverbsN names are aliases for the N-th device, not device names"
        ));
    }
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("device `{name}`: `{ip}` is not an IPv4 address"))?;
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
        return Err(format!(
            "device `{name}`: {ip} cannot be a device address (unspecified, broadcast or multicast)"
        ));
    }
    let mut entry = DeviceEntry::new(name, ip);
    if let Some(mac) = mac {
        entry.mac = parse_mac(mac)
            .ok_or_else(|| format!("device `{name}`: `{mac}` is not a MAC (xx:xx:xx:xx:xx:xx)"))?;
    }
    let mut parts = backend.split(';');
    let kind = parts.next().unwrap_or("").trim();
    let kind = match kind.strip_prefix('+') {
        Some(k) => Some(k),
        None if kind.is_empty() => None,
        None => {
            return Err(format!(
                "device `{name}`: `{kind}` is not a backend (`+rtl`, `+pci`)"
            ))
        }
    };
    let options: Vec<&str> = parts.collect();
    (entry.backend, entry.options) =
        spec::parse_backend(kind, &options).map_err(|e| format!("device `{name}`: {e}"))?;
    Ok(entry)
}

fn parse_mac(text: &str) -> Option<MacAddr> {
    let mut octets = [0u8; 6];
    let mut parts = text.split(':');
    for octet in octets.iter_mut() {
        let part = parts.next()?;
        // from_str_radix alone would take a sign (`+f`).
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *octet = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(MacAddr::new(octets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn default_is_blue0_and_blue1_on_loopback_with_uverbs_aliases() {
        let list = DeviceList::from_setting(None).unwrap();
        assert_eq!(list, DeviceList::from_setting(Some("  ")).unwrap());
        let names: Vec<_> = list.entries().iter().map(|e| (&*e.name, e.ip)).collect();
        assert_eq!(
            names,
            [
                ("blue0", Ipv4Addr::new(127, 0, 0, 1)),
                ("blue1", Ipv4Addr::new(127, 0, 0, 2))
            ]
        );
        assert_eq!(list.get("uverbs1"), list.get("blue1"));
        assert_eq!(list.get("uverbs0").unwrap().name, "blue0");
        assert_eq!(list.get("uverbs2"), None);
        assert_eq!(list.get("blue7"), None);
        assert_eq!(
            list.by_ip(Ipv4Addr::new(127, 0, 0, 2)).unwrap().mac,
            MacAddr::new([2, 0, 127, 0, 0, 2])
        );
        assert_eq!(
            list.get("blue1").unwrap().spec().ip,
            Ipv4Addr::new(127, 0, 0, 2)
        );
    }

    #[test]
    fn inline_list_with_optional_mac() {
        let list =
            DeviceList::from_setting(Some("blue0=10.0.0.1, blue1=10.0.0.2@02:bd:bd:00:00:01"))
                .unwrap();
        assert_eq!(list.entries().len(), 2);
        assert_eq!(
            list.get("blue0").unwrap().mac,
            MacAddr::new([2, 0, 10, 0, 0, 1])
        );
        assert_eq!(
            list.get("blue1").unwrap().mac,
            MacAddr::new([2, 0xbd, 0xbd, 0, 0, 1])
        );
        assert_eq!(
            list.get("blue1").unwrap().spec().mac,
            list.get("blue1").unwrap().mac
        );
    }

    #[test]
    fn inline_errors_name_the_entry() {
        let err = DeviceList::parse_inline("blue0=127.0.0.1,blue1=127.0.0.300").unwrap_err();
        assert_eq!(
            err.to_string(),
            "BLUERDMA_DEVICES entry 2: device `blue1`: `127.0.0.300` is not an IPv4 address"
        );
        let err = DeviceList::parse_inline("blue0=127.0.0.1,blue0=127.0.0.2").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.message.contains("listed twice"), "{err}");
        let err = DeviceList::parse_inline("blue0").unwrap_err();
        assert!(err.message.contains("expected `name=ip[@mac]"), "{err}");
        let err = DeviceList::from_setting(Some("/no/such/devices.conf")).unwrap_err();
        assert!(err.message.contains("neither a readable file"), "{err}");
    }

    #[test]
    fn file_format_with_comments_and_errors_naming_the_line() {
        let text =
            "# devices\n\nblue0 17.34.51.10 02:bd:bd:00:00:00  # first\nblue1\t17.34.51.11\n";
        let list = DeviceList::parse_file(text, "devices.conf").unwrap();
        assert_eq!(
            list.get("uverbs1").unwrap().ip,
            Ipv4Addr::new(17, 34, 51, 11)
        );
        assert_eq!(
            list.get("blue0").unwrap().mac,
            MacAddr::new([2, 0xbd, 0xbd, 0, 0, 0])
        );

        let err = DeviceList::parse_file("blue0 10.0.0.1\nblue1 10.0.0.1\n", "d.conf").unwrap_err();
        assert_eq!(
            err.to_string(),
            "d.conf line 2: IP 10.0.0.1 is already device `blue0` (each device needs its own IP for its OOB listener)"
        );
        let err = DeviceList::parse_file("blue0 10.0.0.1 02:bd:bd:00:00\n", "d.conf").unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(err.message.contains("is not a MAC"), "{err}");
        let err = DeviceList::parse_file("\n\nblue0 10.0.0.1 aa bb\n", "d.conf").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(err.message.contains("found 4 fields"), "{err}");
        let err = DeviceList::parse_file("uverbs0 10.0.0.1\n", "d.conf").unwrap_err();
        assert!(err.message.contains("aliases"), "{err}");
        let err = DeviceList::parse_file("blue0 0.0.0.0\n", "d.conf").unwrap_err();
        assert!(err.message.contains("cannot be a device address"), "{err}");
        let with_key =
            "blue0 10.0.0.1 ;key=/etc/bluerdma/oob.key\nblue1 10.0.0.2 02:bd:bd:00:00:01 ;key=k\n";
        let list = DeviceList::parse_file(with_key, "d.conf").unwrap();
        let key = |name| list.get(name).unwrap().options.oob_key.clone();
        assert_eq!(key("blue0"), Some(PathBuf::from("/etc/bluerdma/oob.key")));
        assert_eq!(key("blue1"), Some(PathBuf::from("k")));
        assert_eq!(list.get("blue1").unwrap().spec().oob_key, key("blue1"));
        assert_eq!(
            list.get("blue1").unwrap().mac,
            MacAddr::new([2, 0xbd, 0xbd, 0, 0, 1])
        );
        let err = DeviceList::parse_file("blue0 10.0.0.1 ;key=\n", "d.conf").unwrap_err();
        assert!(err.message.contains("needs the path"), "{err}");
        let inline = DeviceList::parse_inline("blue0=127.0.0.1;key=/k").unwrap();
        assert_eq!(
            inline.get("blue0").unwrap().options.oob_key,
            Some("/k".into())
        );
        let err =
            DeviceList::parse_file("blue0 10.0.0.1 bd:+f:bd:00:00:00\n", "d.conf").unwrap_err();
        assert!(
            err.message.contains("is not a MAC"),
            "a signed octet: {err}"
        );
        let err = DeviceList::parse_inline("bl\0ue=10.0.0.1").unwrap_err();
        assert!(
            err.message.contains("`bl\\0ue` is not a device name"),
            "{err}"
        );
        let err = DeviceList::parse_file("blue=0 10.0.0.1\n", "d.conf").unwrap_err();
        assert!(err.message.contains("is not a device name"), "{err}");
        let long = format!("{} 10.0.0.1\n", "b".repeat(MAX_NAME_LEN + 1));
        assert!(DeviceList::parse_file(&long, "d.conf").is_err());
        let ok = format!(
            "{} 10.0.0.1\nmlx5_0.x-1 10.0.0.2\n",
            "b".repeat(MAX_NAME_LEN)
        );
        assert_eq!(
            DeviceList::parse_file(&ok, "d.conf")
                .unwrap()
                .entries()
                .len(),
            2
        );
        let err = DeviceList::parse_file("# nothing\n", "d.conf").unwrap_err();
        assert_eq!(err.to_string(), "d.conf: the device list is empty");
    }

    #[test]
    fn setting_naming_a_file_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devices.conf");
        std::fs::write(
            &path,
            "blue0 192.168.7.1\nblue1 192.168.7.2\nblue2 192.168.7.3\n",
        )
        .unwrap();
        let list = DeviceList::from_setting(path.to_str()).unwrap();
        assert_eq!(list.get("uverbs2").unwrap().name, "blue2");
        std::fs::write(&path, "blue0 192.168.7.1 zz\n").unwrap();
        let err = DeviceList::from_setting(path.to_str()).unwrap_err();
        assert_eq!(err.source, path.display().to_string());
        assert_eq!(err.line, Some(1));
    }

    #[test]
    fn entries_name_their_backend_inline_and_in_files() {
        let list = DeviceList::parse_inline(
            "blue0=127.0.0.1+rtl, blue1=127.0.0.2+rtl:7702/7004;sim=cocotb, \
             blue2=17.34.51.10@02:bd:bd:00:00:02+pci:0000:3b:00.0;udmabuf=udmabuf0;oob=10.0.0.1, \
             blue3=127.0.0.4+pci;root=/tmp/fake card, blue4=127.0.0.5;command_timeout=3",
        )
        .unwrap();
        let kinds: Vec<String> = list
            .entries()
            .iter()
            .map(|e| e.backend.kind().to_string())
            .collect();
        assert_eq!(kinds, ["rtl", "rtl", "pci", "pci", "emulated"]);
        let e = &list.entries()[2];
        assert_eq!(e.mac, MacAddr::new([2, 0xbd, 0xbd, 0, 0, 2]));
        assert_eq!(e.options.oob.unwrap().ip, Ipv4Addr::new(10, 0, 0, 1));
        let BackendSpec::Pci(p) = &e.backend else {
            panic!("not pci")
        };
        assert_eq!(p.udmabuf.as_deref(), Some("udmabuf0"));
        let BackendSpec::Pci(p) = &list.entries()[3].backend else {
            panic!("not pci")
        };
        assert_eq!(p.root.as_deref(), Some(Path::new("/tmp/fake card")));
        assert_eq!(
            list.entries()[4].options.command_timeout,
            Some(std::time::Duration::from_secs(3))
        );

        let text = "blue0 127.0.0.1 +rtl:7701/7003\n\
                    blue1 127.0.0.2 02:00:00:00:00:09 +pci ;root=/tmp/x ;hugepages=2\n\
                    blue2 127.0.0.3\n";
        let list = DeviceList::parse_file(text, "d.conf").unwrap();
        assert_eq!(list.entries()[0].backend.kind(), crate::BackendKind::Rtl);
        let BackendSpec::Pci(p) = &list.entries()[1].backend else {
            panic!("not pci")
        };
        assert_eq!(p.hugepages, Some(2));
        assert_eq!(list.entries()[2].backend, BackendSpec::Emulated);
    }

    #[test]
    fn backend_errors_name_the_entry_and_the_problem() {
        let err = DeviceList::parse_inline("blue0=127.0.0.1,blue1=127.0.0.2+rtl:7702").unwrap_err();
        assert_eq!(
            err.to_string(),
            "BLUERDMA_DEVICES entry 2: device `blue1`: `+rtl:7702`: expected \
             `+rtl:CSR_PORT/DMA_PORT` (e.g. 7701/7003)"
        );
        let err = DeviceList::parse_inline("blue0=127.0.0.1+gpu").unwrap_err();
        assert!(err
            .to_string()
            .contains("entry 1: device `blue0`: `+gpu` is not a backend"));
        let err = DeviceList::parse_inline("blue0=127.0.0.1;udmabuf=u").unwrap_err();
        assert!(
            err.message.contains("for +pci devices, not emulated ones"),
            "{err}"
        );
        let err =
            DeviceList::parse_file("blue0 127.0.0.1 +pci;sim=cocotb\n", "d.conf").unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(
            err.message.contains("option `sim` is for +rtl devices"),
            "{err}"
        );
        let err = DeviceList::parse_file("blue0 127.0.0.1 pci\n", "d.conf").unwrap_err();
        assert!(err.message.contains("is not a MAC"), "{err}");
    }
}
