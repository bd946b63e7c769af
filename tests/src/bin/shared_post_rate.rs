//! The post_send rate of one process on the first two devices of `BLUERDMA_DEVICES`
//! (through their daemons when `BLUERDMA_SHARED=1`, else opened by this process alone), for
//! `cargo xtask shared-perf`, which runs several of these at once.
//!
//! Usage: `shared_post_rate [--seconds S]` (default 1). It opens both devices (named
//! `bluerdma0` and `bluerdma1`, as the libibverbs stand-in names them), connects a QP pair
//! between them, warms up, prints `ready`, and waits for a line on stdin (so that every
//! process of a run measures at the same time); then 64 B WRITEs timed around `post_send`
//! only, one per call and 32 per call, S seconds each ([`bluerdma_linux::perf::post_rate`],
//! as `cargo bench -p bluerdma-linux --bench post_rate`), printed as `post_send_1 <WR/s>` and
//! `post_send_32 <WR/s>`. The end of stdin before the line exits 2; whatever happens, the
//! process exits after 120 s (status 3).

use std::io::{self, BufRead, Write};
use std::process::exit;
use std::time::Duration;

use bluerdma_linux::devices::{DeviceList, Settings};
use bluerdma_linux::perf::{fresh_pair, post_rate, seconds_arg};
use bluerdma_linux::Context;

fn main() {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        eprintln!("shared_post_rate: watchdog: 120 s passed");
        exit(3);
    });
    let seconds = seconds_arg(1.0);
    let (a, b) = match (open(0), open(1)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("shared_post_rate: {e}");
            exit(1);
        }
    };
    let (sa, sb) = fresh_pair(&a, &b);
    post_rate(&sa, &sb, 0.2, 32);
    println!("ready");
    let _ = io::stdout().flush();
    let mut line = String::new();
    if !matches!(io::stdin().lock().read_line(&mut line), Ok(n) if n > 0) {
        eprintln!("shared_post_rate: stdin ended before the start");
        exit(2);
    }
    let one = post_rate(&sa, &sb, seconds, 1);
    let batch = post_rate(&sa, &sb, seconds, 32);
    println!("post_send_1 {one:.0}");
    println!("post_send_32 {batch:.0}");
}

/// Opens device `index` of the environment's list as the stand-in would (`bluerdmaN`).
fn open(index: usize) -> Result<Context, String> {
    let list = DeviceList::from_env().map_err(|e| e.to_string())?;
    let entry = list
        .entries()
        .get(index)
        .ok_or_else(|| format!("BLUERDMA_DEVICES has no device {index}"))?;
    let settings = Settings::from_env()?;
    let name = format!("bluerdma{index}");
    let mut spec = entry.spec();
    spec.name = name.clone();
    settings.apply(&mut spec);
    bluerdma_linux::devices::open(&list, entry, spec, &settings)
        .map_err(|e| format!("open {name} at {}: {e}", entry.ip))
}
