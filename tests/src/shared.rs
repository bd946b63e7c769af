//! Devices shared between processes (`BLUERDMA_SHARED=1`, `bluerdma-devd`): opening one
//! of the environment's list through its daemon, and reading the daemon's state.

use std::path::PathBuf;

use bluerdma_linux::devices::{DeviceList, Settings};
use bluerdma_linux::Context;

/// Opens `device` of `BLUERDMA_DEVICES` (through its daemon when `BLUERDMA_SHARED=1`).
pub fn open(device: &str) -> Result<Context, String> {
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .get(device)
        .ok_or_else(|| format!("no device {device} in BLUERDMA_DEVICES"))?;
    let settings = Settings::from_env()?;
    let mut spec = entry.spec();
    spec.name = device.to_string();
    settings.apply(&mut spec);
    bluerdma_linux::devices::open(&list, entry, spec, &settings).map_err(|e| e.to_string())
}

/// The state text of `device`'s daemon (a line per client, then the card's).
pub fn status(device: &str) -> Result<String, String> {
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .get(device)
        .ok_or_else(|| format!("no device {device} in BLUERDMA_DEVICES"))?;
    bluerdma_linux::shared::status(entry).map_err(|e| e.to_string())
}

/// The value of `key=` in the line of `text` that starts with `prefix`.
pub fn status_field(text: &str, prefix: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| crate::line_field(l, key))
        .and_then(|v| v.parse().ok())
}

/// Sets this process's environment for shared devices `devices` (a `BLUERDMA_DEVICES`
/// value) with daemons' sockets under `run_dir`, building `bluerdma-devd` in this test's
/// profile. Call once, before any thread reads the environment.
pub fn setup(devices: &str, run_dir: &std::path::Path) -> PathBuf {
    let devd = crate::served::cargo_build(&["-p", "bluerdma-linux", "--bin", "bluerdma-devd"])
        .join("bluerdma-devd");
    assert!(devd.exists(), "the build did not make {}", devd.display());
    std::fs::create_dir_all(run_dir).expect("run dir");
    // SAFETY (of the environment): called before the test starts threads that read it.
    std::env::set_var("BLUERDMA_SHARED", "1");
    std::env::set_var("BLUERDMA_DEVD", &devd);
    std::env::set_var("BLUERDMA_RUN_DIR", run_dir);
    std::env::set_var("BLUERDMA_DEVICES", devices);
    devd
}
