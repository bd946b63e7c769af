//! Finding this process's devices and the settings they open with, from the environment:
//! `BLUERDMA_DEVICES` ([`super::DEVICES_ENV`]), or, when it is unset and this process runs
//! in a network namespace of its own with one IPv4 address, that address
//! ([`namespace_address`]); and the per-process settings of [`Settings`].

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::ptr;

use super::{DeviceEntry, DeviceList, DeviceListError, DEVICES_ENV};
use crate::oob::OOB_PORT;
use crate::verbs::DeviceSpec;

/// The environment variable with the out-of-band channel's port (default 60000).
pub const OOB_PORT_ENV: &str = "BLUERDMA_OOB_PORT";
/// The environment variable with the PSN every connection starts from on the wire
/// ([`DeviceSpec::wire_psn_start`]; decimal or `0x` hex).
pub const WIRE_PSN_ENV: &str = "BLUERDMA_WIRE_PSN_START";
/// The environment variable naming a directory to capture each emulated card's frames in.
pub const PCAP_ENV: &str = "BLUERDMA_PCAP";
/// The environment variable with the emulated link's faults (`drop=0.01,seed=7`).
pub const FAULTS_ENV: &str = "BLUERDMA_LINK_FAULTS";
/// The environment variable mapping peers' device IPs to the addresses of their
/// out-of-band channels (`17.34.51.11=10.0.0.2,...`), for peers whose device list gives
/// them an `oob=` address.
pub const OOB_PEERS_ENV: &str = "BLUERDMA_OOB_PEERS";

/// How this process opens its devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// The out-of-band channel's port.
    pub oob_port: u16,
    /// [`DeviceSpec::wire_psn_start`] of every device.
    pub wire_psn_start: Option<u32>,
    /// Capture each emulated card's frames to `<dir>/<device>.pcap`.
    pub pcap_dir: Option<PathBuf>,
    /// Faults on each emulated card's link (a `FaultConfig` string).
    pub link_faults: Option<String>,
    /// Peers' out-of-band addresses by device IP.
    pub oob_peers: Vec<(Ipv4Addr, Ipv4Addr)>,
}

impl Settings {
    /// The settings of the environment; the error names the variable and its value.
    pub fn from_env() -> Result<Settings, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Self::from_vars(&|name: &str| var(name))
    }

    /// The settings from a lookup of the variables (for tests).
    pub fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let mut s = Settings {
            oob_port: OOB_PORT,
            ..Settings::default()
        };
        if let Some(p) = var(OOB_PORT_ENV) {
            s.oob_port = p
                .trim()
                .parse()
                .map_err(|_| format!("{OOB_PORT_ENV}=`{p}` is not a port number"))?;
        }
        if let Some(v) = var(WIRE_PSN_ENV) {
            let t = v.trim();
            let parsed = match t.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => t.parse(),
            };
            s.wire_psn_start =
                Some(parsed.map_err(|_| format!("{WIRE_PSN_ENV}=`{v}` is not a PSN"))?);
        }
        s.pcap_dir = var(PCAP_ENV).map(PathBuf::from);
        s.link_faults = var(FAULTS_ENV);
        if let Some(v) = var(OOB_PEERS_ENV) {
            for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let pair = item
                    .split_once('=')
                    .and_then(|(d, o)| Some((d.trim().parse().ok()?, o.trim().parse().ok()?)));
                s.oob_peers.push(pair.ok_or_else(|| {
                    format!("{OOB_PEERS_ENV}: `{item}` is not `DEVICE_IP=OOB_IP`")
                })?);
            }
        }
        Ok(s)
    }

    /// Applies the per-process settings to a device's spec.
    pub fn apply(&self, spec: &mut DeviceSpec) {
        if let Some(psn) = self.wire_psn_start {
            spec.wire_psn_start = psn;
        }
    }
}

/// The devices of this process: `BLUERDMA_DEVICES` when it is set; otherwise, in a network
/// namespace of its own with one IPv4 address outside 127.0.0.0/8 (a node of `cargo xtask
/// cluster`, a container), one emulated device `bluerdma0` at that address; otherwise the
/// default list (blue0 = 127.0.0.1, blue1 = 127.0.0.2).
pub fn discover() -> Result<DeviceList, DeviceListError> {
    let configured = std::env::var(DEVICES_ENV).is_ok_and(|v| !v.trim().is_empty());
    if !configured {
        if let Some(ip) = namespace_address() {
            log::info!("bluerdma0 at {ip}: the only IPv4 address of this network namespace");
            return Ok(DeviceList {
                entries: vec![DeviceEntry::new("bluerdma0", ip)],
            });
        }
    }
    DeviceList::from_env()
}

/// A node's own address, found without configuration: when this process runs in a network
/// namespace other than the machine's first one and that namespace has exactly one IPv4
/// address outside 127.0.0.0/8, that address.
pub fn namespace_address() -> Option<Ipv4Addr> {
    if !in_own_netns() {
        return None;
    }
    let mut found = None;
    let mut ifs: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: getifaddrs fills `ifs` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut p = ifs;
    let mut count = 0;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs made; its address, when set, is a sockaddr
        // whose family says its type.
        unsafe {
            let a = (*p).ifa_addr;
            if !a.is_null() && (*a).sa_family as i32 == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    count += 1;
                    found = Some(ip);
                }
            }
            p = (*p).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs made.
    unsafe { libc::freeifaddrs(ifs) };
    (count == 1).then_some(found).flatten()
}

/// Whether this process runs in a network namespace of its own: one named by `ip netns`
/// (its file in /run/netns is this namespace), or one that differs from PID 1's when that
/// can be read.
fn in_own_netns() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(own) = std::fs::metadata("/proc/self/ns/net") else {
        return false;
    };
    let named = std::fs::read_dir("/run/netns").is_ok_and(|dir| {
        dir.flatten().any(|e| {
            std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == own.ino() && m.dev() == own.dev())
        })
    });
    named || std::fs::metadata("/proc/1/ns/net").is_ok_and(|first| first.ino() != own.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(list: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            list.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn settings_come_from_the_environment_with_defaults() {
        let s = Settings::from_vars(&vars(&[])).unwrap();
        assert_eq!((s.oob_port, s.wire_psn_start), (60000, None));
        let s = Settings::from_vars(&vars(&[
            (OOB_PORT_ENV, "61000"),
            (WIRE_PSN_ENV, "0xFFFFF0"),
            (PCAP_ENV, "/tmp/caps"),
            (OOB_PEERS_ENV, "17.34.51.11=10.0.0.2, 17.34.51.12=10.0.0.3"),
        ]))
        .unwrap();
        assert_eq!((s.oob_port, s.wire_psn_start), (61000, Some(0xFF_FFF0)));
        assert_eq!(s.pcap_dir, Some(PathBuf::from("/tmp/caps")));
        assert_eq!(s.oob_peers.len(), 2);
        assert_eq!(
            s.oob_peers[1],
            (Ipv4Addr::new(17, 34, 51, 12), Ipv4Addr::new(10, 0, 0, 3))
        );
        let mut spec = DeviceSpec::new("blue0", Ipv4Addr::LOCALHOST);
        s.apply(&mut spec);
        assert_eq!(spec.wire_psn_start, 0xFF_FFF0);
    }

    #[test]
    fn bad_settings_name_the_variable() {
        let e = |k, v| Settings::from_vars(&vars(&[(k, v)])).unwrap_err();
        assert_eq!(
            e(OOB_PORT_ENV, "70000"),
            "BLUERDMA_OOB_PORT=`70000` is not a port number"
        );
        assert_eq!(
            e(WIRE_PSN_ENV, "0xZZ"),
            "BLUERDMA_WIRE_PSN_START=`0xZZ` is not a PSN"
        );
        assert!(e(OOB_PEERS_ENV, "17.34.51.11").contains("DEVICE_IP=OOB_IP"));
    }
}
