//! The UCP client/server step of `cargo xtask cluster` (issue K item 4): UCX connecting by
//! socket address, as most UCX applications do, through its rdmacm connection manager over
//! the librdmacm.so.1 and libibverbs.so.1 stand-ins (both in `target/ibverbs/`).
//!
//! `tests/mpi/ucp_sockaddr.c` listens on node0 (`ucp_listener_create` on 0.0.0.0) and
//! connects from node1 (`ucp_ep_create` with `UCP_EP_PARAM_FIELD_SOCK_ADDR`), checks every
//! byte of 36 tagged messages of 8 B to 4 MiB both ways, times round trips of 4 MiB, closes
//! gracefully, and prints its endpoint's lanes (`ucp_ep_print_info`). Over the NIC, UCX may
//! pick the rdmacm or the TCP connection manager (`UCX_SOCKADDR_TLS_PRIORITY=rdmacm,tcp`):
//! the step passes only if both ends' CM lane is `cm rdmacm`, every data lane is a verbs
//! transport on `bluerdma0` (none on TCP), UCX's `ep_cfg` lines name `rc_verbs/bluerdma0`,
//! both ends verified the data, and the server saw the client's disconnect. The same
//! program over UCX's TCP CM and transport is the comparison row.

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::perftest::{self, Exit, Proc};
use super::{ep_cfg, node_ip, Figure, Step, StepCtx, Transport};

/// What the server prints once its listener is up.
const LISTENING: &str = "ucp_sockaddr: server listening";

impl Transport {
    /// The connection manager the sockaddr step must use, and the priority list UCX is given.
    fn cm(self) -> (&'static str, &'static str) {
        match self {
            // TCP stays in the list: a fallback to it is seen (and fails the step), not
            // merely made impossible.
            Transport::Nic => ("rdmacm", "rdmacm,tcp"),
            Transport::Tcp => ("tcp", "tcp"),
        }
    }
}

impl StepCtx<'_> {
    /// A server on node0 and a client on node1. The client starts once `ready` (given the
    /// server's log) says the server listens, or not at all if the server ended first; both
    /// are killed at the deadline. The client's step, which reports a failed server (with
    /// the server's log).
    pub(super) fn pair(
        &self,
        label: &str,
        (server, client): (Command, Command),
        command: String,
        ready: impl Fn(&Path) -> bool,
        examine_server: impl Fn(&str) -> Result<Figure, String>,
        examine_client: impl Fn(&str) -> Result<Figure, String>,
    ) -> Step {
        let (slog, clog) = (
            self.log(&format!("{label} server")),
            self.log(&format!("{label} client")),
        );
        let deadline = Instant::now() + self.timeout;
        let mut procs = vec![perftest::spawn_logged(server, &slog)];
        while !procs[0].poll() && !ready(&slog) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        if procs[0].exit.is_none() && ready(&slog) {
            procs.push(perftest::spawn_logged(client, &clog));
        } else {
            let _ = std::fs::copy(&slog, &clog);
            procs.push(Proc::failed_to_start());
        }
        perftest::wait_all(&mut procs, deadline);
        self.cluster.reap();
        let server_step = Step::new(
            label,
            "node0",
            &procs[0],
            slog,
            String::new(),
            examine_server,
        );
        let mut step = Step::new(label, "node0+1", &procs[1], clog, command, examine_client);
        if !server_step.ok() && (step.ok() || procs[1].exit == Some(Exit::NoStart)) {
            step.problem = Some(match (&server_step.problem, procs[1].exit) {
                (Some(p), _) => format!("server: {p}"),
                (None, Some(Exit::NoStart)) => "the server ended before it listened".into(),
                (None, _) => format!("the server exited {}", server_step.exit),
            });
            step.exit = server_step.exit;
            step.log = server_step.log;
        }
        step
    }

    /// `ucp_sockaddr` (built at `bin`) over transport `t`, listening on `port` of node0.
    pub(super) fn ucp_sockaddr(&self, t: Transport, bin: &Path, built: bool, port: u16) -> Step {
        let label = format!("UCP sockaddr {}", t.name());
        if !built {
            return Step::skipped(&label, "cc ucp_sockaddr.c failed");
        }
        let (cm, priority) = t.cm();
        let bin = bin.to_string_lossy().into_owned();
        let port = port.to_string();
        let make = |node: usize, args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let mut c = self.cluster.command(node, &bin, &args);
            c.env("UCX_TLS", t.ucx_tls())
                .env("UCX_SOCKADDR_TLS_PRIORITY", priority)
                .env("UCX_LOG_LEVEL", "info");
            c
        };
        let server_ip = node_ip(0);
        let server = make(0, &["-p", &port]);
        let client = make(1, &["-p", &port, "-c", &server_ip]);
        let command = format!(
            "UCX_TLS={} UCX_SOCKADDR_TLS_PRIORITY={priority} ucp_sockaddr -p {port} -c {server_ip}",
            t.ucx_tls()
        );
        println!("cluster: node0 listens, node1: {command}");
        self.pair(
            &label,
            (server, client),
            command,
            |log| perftest::read_log(log).contains(LISTENING),
            |out| examine(out, "server", t, cm),
            |out| examine(out, "client", t, cm),
        )
    }
}

/// One end's output: the data verified, the end's closing step, the CM lane `cm`, every data
/// lane on `t`, and UCX's `ep_cfg` lines naming it.
fn examine(out: &str, role: &str, t: Transport, cm: &str) -> Result<Figure, String> {
    if let Some(l) = out.lines().find(|l| l.contains("MISMATCH")) {
        return Err(l.trim().to_string());
    }
    let verified = format!("ucp_sockaddr: {role} verified ");
    let Some(counts) = out.lines().find_map(|l| l.split(&verified).nth(1)) else {
        return Err(format!("no `{verified}` line"));
    };
    let closed = match role {
        "server" => "server saw the client disconnect",
        _ => "client closed its endpoint",
    };
    if !out.contains(closed) {
        return Err(format!("no `{closed}` line"));
    }
    let lanes = lanes(out);
    let cms: Vec<&str> = lanes.iter().filter_map(|l| l.strip_prefix("cm ")).collect();
    if cms != [cm] {
        return Err(format!(
            "the endpoint's CM lanes are {cms:?}, not [\"{cm}\"] (lanes: {})",
            lanes.join("; ")
        ));
    }
    let data: Vec<&str> = lanes
        .iter()
        .filter(|l| !l.starts_with("cm "))
        .map(String::as_str)
        .collect();
    let on_device = |l: &str| match t {
        Transport::Nic => l.contains("_verbs/bluerdma0:"),
        Transport::Tcp => l.starts_with("tcp/eth0"),
    };
    if let Some(bad) = data.iter().find(|l| !on_device(l)) {
        let fell_back = t == Transport::Nic && bad.starts_with("tcp/");
        return Err(format!(
            "{} lane {bad} (lanes: {})",
            if fell_back {
                "UCX fell back to TCP:"
            } else {
                "a data"
            },
            lanes.join("; ")
        ));
    }
    if data.is_empty() {
        return Err("the endpoint has no data lane".into());
    }
    ep_cfg(out, t.ep_cfg_proof())?;
    let bw = out.lines().find_map(|l| {
        let w: Vec<&str> = l.split("round trip ").nth(1)?.split_whitespace().collect();
        (w.get(3) == Some(&"MB/s")).then(|| w.get(2)?.parse::<f64>().ok())?
    });
    if role == "client" && bw.is_none() {
        return Err("no `round trip ... MB/s` line".into());
    }
    Ok(Figure {
        text: format!(
            "cm {cm}, lanes {}; {} verified; 4 MiB round trips {} MB/s",
            data.join(" "),
            counts.trim(),
            bw.map_or("?".into(), |v| format!("{v:.2}"))
        ),
        bw,
        lat: None,
    })
}

/// The lanes `ucp_ep_print_info` lists: `cm <name>` or `<transport>/<device>:<port>.<n>`.
fn lanes(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("ucp_sockaddr: ep"))
        .filter_map(|l| {
            let rest = l.split_once("lane[")?.1.split_once("]:")?.1.trim();
            Some(match rest.strip_prefix("cm ") {
                Some(cm) => format!("cm {}", cm.trim()),
                // `<rsc index>:<transport>/<device>:<port>.<path> md[..] -> ...`
                None => {
                    let tl = rest.split_whitespace().next()?;
                    tl.split_once(':').map_or(tl, |(_, t)| t).to_string()
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "\
[1] [node1:228  :0]      ucp_worker.c:1763 UCX  INFO  ep_cfg[1]: tag(rc_verbs/bluerdma0:1) ka(ud_verbs/bluerdma0:1)
ucp_sockaddr: client verified 36 messages, 31876320 B
ucp_sockaddr: 4194304 B round trip 8194.5 usec 1023.69 MB/s
ucp_sockaddr: ep #                 lane[0]: cm rdmacm
ucp_sockaddr: ep #                 lane[1]:  5:rc_verbs/bluerdma0:1.0 md[4]  -> md[4]/ib/sysdev[255] rma_bw#0 am am_bw#0 wireup
ucp_sockaddr: ep #                 lane[2]:  6:ud_verbs/bluerdma0:1.0 md[4]  -> md[4]/ib/sysdev[255] keepalive
ucp_sockaddr: ep #                tag_send: 0..<egr/short>..56..<egr/bcopy>..2177..<rndv>..(inf)
ucp_sockaddr: client closed its endpoint
";

    #[test]
    fn a_run_over_rdmacm_and_the_nic_passes() {
        let f = examine(CLIENT, "client", Transport::Nic, "rdmacm").unwrap();
        assert_eq!(f.bw, Some(1023.69));
        assert_eq!(
            f.text,
            "cm rdmacm, lanes rc_verbs/bluerdma0:1.0 ud_verbs/bluerdma0:1.0; 36 messages, \
             31876320 B verified; 4 MiB round trips 1023.69 MB/s"
        );
    }

    #[test]
    fn a_fallback_to_tcp_fails() {
        let tcp_cm = CLIENT.replace("cm rdmacm", "cm tcp");
        let e = examine(&tcp_cm, "client", Transport::Nic, "rdmacm").unwrap_err();
        assert!(e.contains("CM lanes are [\"tcp\"]"), "{e}");
        let tcp_lane = CLIENT.replace("6:ud_verbs/bluerdma0:1.0", "1:tcp/eth0.0");
        let e = examine(&tcp_lane, "client", Transport::Nic, "rdmacm").unwrap_err();
        assert!(
            e.starts_with("UCX fell back to TCP: lane tcp/eth0.0"),
            "{e}"
        );
        let no_ep_cfg = CLIENT.replace("ep_cfg[1]", "ep cfg");
        assert!(examine(&no_ep_cfg, "client", Transport::Nic, "rdmacm").is_err());
    }

    #[test]
    fn missing_checks_fail() {
        let server = CLIENT.replace("client verified", "server verified");
        let e = examine(&server, "server", Transport::Nic, "rdmacm").unwrap_err();
        assert!(e.contains("server saw the client disconnect"), "{e}");
        let bad =
            format!("{CLIENT}ucp_sockaddr: client: MISMATCH: message 8 B round 0 at offset 3\n");
        let e = examine(&bad, "client", Transport::Nic, "rdmacm").unwrap_err();
        assert!(e.contains("MISMATCH"), "{e}");
        let none = CLIENT.replace("verified", "checked");
        assert!(examine(&none, "client", Transport::Nic, "rdmacm").is_err());
    }
}
