//! `cargo xtask cluster [N]` (issue H item 5): UCX and Open MPI over the `libibverbs.so.1`
//! stand-in, on N emulated nodes of this machine.
//!
//! 1. Builds the stand-in (perftest's [`perftest::build_library`]) and installs the Debian
//!    packages that are missing ([`PACKAGES`]).
//! 2. Lays out the nodes: a bridge `bvcl-br0` at 10.77.0.1/24 in the root network namespace
//!    (no route beyond that subnet, in any namespace), and per node `i` a network namespace
//!    `bvcl-n<i>` with a veth (`bvcl-h<i>` on the bridge, `eth0` inside) at 10.77.0.(10+i)
//!    and lo up. In it, a long-lived node process (`unshare --ipc --pid --uts --mount
//!    --fork`) sets the host name `node<i>`, mounts a private `/dev/shm`, and gives
//!    its mount namespace a `/dev` of its own: a tmpfs with the real entries bound in, plus
//!    `/dev/infiniband/uverbs0` (a character device, which UCX requires of every verbs
//!    device it lists, by the `dev_name` the stand-in reports). The machine's `/dev` is
//!    never written. Commands run in a node through `nsenter` into that process's
//!    namespaces, with `LD_LIBRARY_PATH=target/ibverbs` and no device configuration: the
//!    stand-in takes the only non-loopback address of the node's namespace as bluerdma0's.
//!    mpirun reaches the nodes through `target/xtask/cluster/node-rsh.sh`, its
//!    `plm_rsh_agent`.
//! 3. Runs, each with a timeout and its exit code checked: `ucx_info -d` on node0 (the memory
//!    domain `bluerdma0` must be listed); `ucx_perftest` UCT put_bw and get over rc_verbs on
//!    `bluerdma0:1` and UCP tag_bw, 1 MiB, node0 serving node1; `tests/mpi/mpitest.c` under
//!    mpirun (`pml ucx`, `osc ucx`, `--tag-output`) with one rank per node, each node's
//!    device its rank's alone, then with [`SHARED_RANKS`] ranks per node sharing it
//!    (`BLUERDMA_SHARED=1`: the node's first rank starts its `bluerdma-devd`, in the node's
//!    namespaces, on a socket in the node's own `BLUERDMA_RUN_DIR`; ranks of one node talk
//!    over shared memory), whose UCX log must show, for every rank, an `ep_cfg` line with
//!    `rc_verbs/bluerdma0` (and, shared, the library's line that it joined the daemon at its
//!    node's address), while the nodes' daemons are watched (one per node, in all the
//!    node's namespaces; none left once the step's processes are killed);
//!    `tests/mpi/ucp_sockaddr.c`, a UCP
//!    client/server connected by socket address through UCX's rdmacm connection manager
//!    over the librdmacm.so.1 stand-in ([`sockaddr`]). Then the same UCX and MPI runs over
//!    UCX's TCP transport (and TCP CM), for comparison. One table, non-zero exit if any step failed, with the tail
//!    of each failed step's log.
//! 4. Tears everything down (the [`Cluster`] guard's Drop, a watchdog process that does it
//!    if xtask dies or is interrupted, and the removal of a crashed run's leftovers first):
//!    every process of the nodes' network namespaces, the daemons included.
//!
//! `cargo xtask ci` runs it with 2 nodes as one row ([`ci_row`]; not with `--quick`).

use super::Row;
use crate::backends::is_root;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::perftest::{self, Exit, Proc};

mod sockaddr;

/// Every name this harness creates starts with it: the bridge, the namespaces, the veths.
const PREFIX: &str = "bvcl-";
const BRIDGE: &str = "bvcl-br0";
/// The private subnet of the nodes; the bridge is `.1`, node `i` is `.(10 + i)`.
const SUBNET: &str = "10.77.0.0/24";
const BRIDGE_IP: &str = "10.77.0.1";
const MAX_NODES: usize = 200;
/// The device each node has, and the `dev_name` the stand-in gives it.
const DEVICE: &str = "bluerdma0";
const DEV_NAME: &str = "uverbs0";
/// Debian packages, and a file each installs that says whether it is there.
const PACKAGES: [(&str, &str); 7] = [
    ("libucx0", "ucx"),
    ("ucx-utils", "ucx_perftest"),
    ("libucx-dev", "ucx_info"),
    ("openmpi-bin", "mpirun"),
    ("libopenmpi-dev", "mpicc"),
    ("iproute2", "ip"),
    ("util-linux", "nsenter"),
];
/// The message size of the UCX measurements.
const MSG: usize = 1 << 20;
/// The first TCP port of ucx_perftest's rendezvous (in node0's namespace).
const UCX_PORT: u16 = 13400;
/// UCX sizes UD datagrams from the port's MTU (4096, for RC); the stand-in's UD carries at
/// most 1978 bytes (one 2048-byte simple-NIC slot), so UCX is told a smaller segment.
const UD_SEG_SIZE: &str = "1024";
/// Lines of a failed step's output that are printed.
const TAIL: usize = 30;
/// The veths' and bridge's MTU: the port's 4096 B path MTU in one UDP datagram.
const MTU: &str = "9000";
/// Ranks per node of the MPI run on shared devices (`BLUERDMA_SHARED=1`); the hostfile's
/// slots.
const SHARED_RANKS: usize = 2;
/// The daemon that owns a shared device (README, "Many processes on one device").
const DEVD: &str = "bluerdma-devd";
/// The namespaces a node's processes, and so its daemon, must all share with its init.
const NODE_NS: [&str; 5] = ["net", "mnt", "pid", "ipc", "uts"];

const USAGE: &str = "\
usage: cargo xtask cluster [N] [--timeout SECS]

N emulated nodes (default 2) in network, IPC, PID, UTS and mount namespaces on a bridge
(10.77.0.0/24), each with the blue-rdma stand-in libibverbs (device bluerdma0 at
10.77.0.(10+i)); runs ucx_info, ucx_perftest (UCT put_bw/get on rc_verbs, UCP tag_bw), an
MPI test (pml ucx) and a UCP client/server connected through UCX's rdmacm CM (over the
librdmacm stand-in) on the emulated NIC, the MPI test again with 2 ranks per node sharing
each node's device (BLUERDMA_SHARED=1, one bluerdma-devd per node), then the same over
UCX's TCP transport. Needs root;
installs libucx0 ucx-utils libucx-dev openmpi-bin libopenmpi-dev iproute2 util-linux if
missing.
Everything it creates is removed at the end (also after Ctrl-C).

options:
  --timeout SECS  hard limit per step (default 90)
";

/// Options of one run.
struct Opts {
    nodes: usize,
    timeout: Duration,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            nodes: 2,
            timeout: Duration::from_secs(90),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--help" | "-h" => {
                    print!("{USAGE}");
                    return Ok(None);
                }
                "--timeout" => {
                    let v = it.next().ok_or("cluster: --timeout needs seconds")?;
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| format!("cluster: --timeout {v}: not a number"))?;
                    o.timeout = Duration::from_secs(secs.max(1));
                }
                n if n.parse::<usize>().is_ok() => {
                    o.nodes = n.parse().unwrap_or(2);
                    if !(2..=MAX_NODES).contains(&o.nodes) {
                        return Err(format!("cluster: N must be 2..={MAX_NODES}, not {n}"));
                    }
                }
                other => return Err(format!("cluster: unknown argument `{other}`\n{USAGE}")),
            }
        }
        Ok(Some(o))
    }
}

/// `cargo xtask cluster [N] [--timeout SECS]` (and the hidden `--teardown` of the watchdog).
pub fn cluster(root: &Path, args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some("--teardown") {
        teardown();
        return Ok(());
    }
    let Some(opts) = Opts::parse(args)? else {
        return Ok(());
    };
    let steps = run(root, &opts)?;
    let failed: Vec<&str> = steps
        .iter()
        .filter(|s| !s.ok())
        .map(|s| s.label.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("cluster: failed: {}", failed.join(", ")))
    }
}

/// The row of `cargo xtask ci`: the whole run on 2 nodes, one count per step.
pub fn ci_row(root: &Path) -> Row {
    println!("ci: cluster: UCX and Open MPI over the stand-in on 2 namespaced nodes");
    let start = Instant::now();
    let suite = "cluster (UCX + MPI, 2 nodes)".to_string();
    let opts = Opts {
        nodes: 2,
        timeout: Duration::from_secs(120),
    };
    match run(root, &opts) {
        Ok(steps) => {
            let failed: Vec<&Step> = steps.iter().filter(|s| !s.ok()).collect();
            let note = match failed.first() {
                Some(f) => format!("{} failed (logs in target/xtask/cluster)", f.label),
                None => headline(&steps),
            };
            Row {
                suite,
                passed: (steps.len() - failed.len()) as u64,
                failed: failed.len() as u64,
                time: start.elapsed(),
                note,
            }
        }
        Err(e) => {
            eprintln!("ci: cluster: {e}");
            Row::failure(suite, start.elapsed(), e)
        }
    }
}

/// The figures of the NIC's MPI step, for the ci table.
fn headline(steps: &[Step]) -> String {
    steps
        .iter()
        .find(|s| s.label == "MPI mpitest bluerdma0")
        .map(|s| format!("MPI over rc_verbs/bluerdma0: {}", s.figure.text))
        .unwrap_or_default()
}

/// Lays out the nodes, runs every step, tears down, prints the report; the steps' results.
fn run(root: &Path, opts: &Opts) -> Result<Vec<Step>, String> {
    if !is_root() {
        return Err("cluster: needs root (namespaces, a bridge, mknod)".into());
    }
    let start = Instant::now();
    let lib_dir = perftest::build_library(root)?;
    ensure_packages(opts.timeout)?;
    let dir = root.join("target").join("xtask").join("cluster");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mpitest = dir.join("mpitest");
    let mpicc = compile(
        root,
        ["mpicc", "mpi", "mpitest"],
        &mpitest,
        &[],
        opts.timeout,
    );
    let ucp_sockaddr = dir.join("ucp_sockaddr");
    let compile_sockaddr = compile(
        root,
        ["cc", "mpi", "ucp_sockaddr"],
        &ucp_sockaddr,
        &["-lucp", "-lucs"],
        opts.timeout,
    );
    let sockaddr_built = compile_sockaddr.ok();

    if leftovers() {
        println!("cluster: removing the leftovers of an earlier run");
        teardown();
    }
    check_subnet_free()?;
    let cluster = Cluster::up(opts.nodes, &dir, &lib_dir)?;
    let mut steps = vec![mpicc, compile_sockaddr];
    let ctx = StepCtx {
        cluster: &cluster,
        dir: &dir,
        timeout: opts.timeout,
    };
    steps.push(ctx.ucx_info());
    for (i, transport) in [Transport::Nic, Transport::Tcp].into_iter().enumerate() {
        let port = UCX_PORT + 10 * i as u16;
        steps.push(ctx.ucx_pair(transport, "put_bw", port));
        if transport == Transport::Nic {
            steps.push(ctx.ucx_pair(transport, "get", port + 1));
        }
        steps.push(ctx.ucx_pair(transport, "tag_bw", port + 2));
        steps.push(ctx.ucp_sockaddr(transport, &ucp_sockaddr, sockaddr_built, port + 3));
        steps.push(ctx.mpirun(transport, &mpitest, steps[0].ok(), Layout::ONE));
        if transport == Transport::Nic {
            steps.push(ctx.mpirun(transport, &mpitest, steps[0].ok(), Layout::SHARED));
        }
    }
    drop(cluster);
    print_report(&steps, opts.nodes, start, &dir);
    Ok(steps)
}

/// Whether dpkg says `pkg` is installed (when there is no dpkg, its probe binary decides).
fn installed(pkg: &str, probe: &str) -> bool {
    if !perftest::on_path("dpkg-query") {
        return perftest::on_path(probe);
    }
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn ensure_packages(timeout: Duration) -> Result<(), String> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(pkg, probe)| !installed(pkg, probe))
        .map(|(pkg, _)| *pkg)
        .collect();
    if !missing.is_empty() {
        perftest::apt_install("cluster", &missing, timeout)?;
    }
    for bin in [
        "ucx_info",
        "ucx_perftest",
        "mpirun",
        "mpicc",
        "ip",
        "unshare",
        "nsenter",
    ] {
        if !perftest::on_path(bin) {
            return Err(format!(
                "cluster: {bin} is missing (apt-get install {})",
                PACKAGES.map(|(p, _)| p).join(" ")
            ));
        }
    }
    Ok(())
}

/// Runs a command to its end with output captured; Err carries its output.
fn sh(argv: &[&str]) -> Result<String, String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("`{}` failed: {}", argv.join(" "), text.trim()))
    }
}

fn node_ip(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

fn netns(i: usize) -> String {
    format!("{PREFIX}n{i}")
}

/// Our network namespaces (`ip netns list`).
fn our_netns() -> Vec<String> {
    sh(&["ip", "netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(String::from)
        .collect()
}

/// Our links in the root namespace (the bridge and the host ends of the veths).
fn our_links() -> Vec<String> {
    sh(&["ip", "-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .filter(|n| n.starts_with(PREFIX))
        .collect()
}

fn leftovers() -> bool {
    !our_netns().is_empty() || !our_links().is_empty()
}

/// Removes everything this harness creates: every process in our network namespaces
/// (killing a node's PID-namespace init takes all its processes along), the namespaces,
/// the veths and the bridge. Safe to run any number of times.
fn teardown() {
    for ns in our_netns() {
        for _ in 0..50 {
            let pids: Vec<String> = sh(&["ip", "netns", "pids", &ns])
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect();
            if pids.is_empty() {
                break;
            }
            let mut argv = vec!["kill", "-KILL"];
            argv.extend(pids.iter().map(String::as_str));
            let _ = sh(&argv);
            thread::sleep(Duration::from_millis(100));
        }
        let _ = sh(&["ip", "netns", "delete", &ns]);
    }
    // The veths go with their namespaces; the bridge (and any veth left) is ours to delete.
    for link in our_links() {
        let _ = sh(&["ip", "link", "delete", &link]);
    }
}

/// Refuses to lay the nodes over a subnet that this machine already uses.
fn check_subnet_free() -> Result<(), String> {
    let routes = sh(&["ip", "-4", "route", "show", "table", "all"]).unwrap_or_default();
    let addrs = sh(&["ip", "-4", "-o", "addr", "show"]).unwrap_or_default();
    let used: Vec<&str> = routes
        .lines()
        .chain(addrs.lines())
        .filter(|l| l.contains("10.77.0."))
        .collect();
    if used.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "cluster: {SUBNET} is already in use on this machine:\n  {}",
            used.join("\n  ")
        ))
    }
}

/// The node process's script: PID 1 of the node's PID namespace, in its own UTS, IPC and
/// mount namespaces. `$1` = node index, `$2` = an empty directory of ours where the real
/// `/dev` is bound while the node's own is built, `$3` = the file made when ready.
const NODE_INIT: &str = r#"#!/bin/bash
# Node process of `cargo xtask cluster` (generated; see xtask/src/cluster.rs).
set -eu
i=$1 realdev=$2 ready=$3
hostname "node$i"
# A /dev of the node's own: a tmpfs with the real entries bound in. The real /dev is only
# read (bound at $realdev, in this private mount namespace, then detached).
mount --rbind /dev "$realdev"
mount -t tmpfs -o mode=755 node-dev /dev
for e in "$realdev"/* "$realdev"/.[!.]*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${e##*/}
    case $n in shm | infiniband) continue ;; esac
    if [ -L "$e" ]; then
        cp -P "$e" "/dev/$n"
    elif [ -d "$e" ]; then
        mkdir "/dev/$n" && mount --rbind "$e" "/dev/$n"
    else
        touch "/dev/$n" && mount --bind "$e" "/dev/$n"
    fi
done
umount -l "$realdev"
mkdir /dev/shm /dev/infiniband
mount -t tmpfs -o mode=1777 node-shm /dev/shm
# UCX lists a verbs device only if /dev/infiniband/<dev_name> is a R/W character device.
mknod -m 666 "/dev/infiniband/@DEV_NAME@" c 1 3
touch "$ready"
trap 'exit 0' TERM
while :; do sleep 3600 & wait $! || true; done
"#;

/// The `plm_rsh_agent` of mpirun: `node-rsh.sh HOST COMMAND...` runs the command line (one
/// shell line, as ssh would) in node HOST (its address or `node<i>`).
fn rsh_script(nodes: &[Node], lib_dir: &Path, dir: &Path) -> String {
    let mut cases = String::new();
    for n in nodes {
        cases.push_str(&format!(
            "    {ip} | node{i}) pid={pid} tmp={tmp} run={run} ;;\n",
            ip = n.ip,
            i = n.index,
            pid = n.init,
            tmp = node_tmp(dir, n.index).display(),
            run = node_run(dir, n.index).display()
        ));
    }
    format!(
        "#!/bin/sh\n\
         # plm_rsh_agent of `cargo xtask cluster` (generated; see xtask/src/cluster.rs).\n\
         while [ $# -gt 0 ] && [ \"${{1#-}}\" != \"$1\" ]; do shift; done\n\
         host=$1\n\
         shift\n\
         case $host in\n{cases}    *) echo \"node-rsh: no node $host\" >&2; exit 255 ;;\n\
         esac\n\
         unset BLUERDMA_DEVICES\n\
         export LD_LIBRARY_PATH={lib} TMPDIR=$tmp BLUERDMA_RUN_DIR=$run\n\
         exec nsenter -t \"$pid\" -n -i -p -u -m --wd={dir} -- /bin/sh -c \"$*\"\n",
        lib = lib_dir.display(),
        dir = dir.display(),
    )
}

/// Node `i`'s temporary directory (TMPDIR of everything run in it: Open MPI's session
/// directories). Not a private /tmp mount: that would hide a checkout under /tmp, and with
/// it the binaries and logs the steps use.
fn node_tmp(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("node{i}.tmp"))
}

/// Node `i`'s `BLUERDMA_RUN_DIR`, where the daemon of its shared device listens: a directory
/// of its own (all nodes see the machine's `/run`), emptied when the nodes are laid out.
fn node_run(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("node{i}.run"))
}

/// The socket of node `i`'s daemon (the library's name: `<device>-<ip>.sock`).
fn devd_socket(dir: &Path, i: usize) -> PathBuf {
    node_run(dir, i).join(format!("{DEVICE}-{}.sock", node_ip(i)))
}

/// One node: its index, address and the PID (in the root namespace) of its init process.
struct Node {
    index: usize,
    ip: String,
    init: u32,
}

/// The laid-out nodes. Dropping it removes everything (and stops the watchdog).
struct Cluster {
    nodes: Vec<Node>,
    lib_dir: PathBuf,
    dir: PathBuf,
    rsh: PathBuf,
    watchdog: Option<std::process::Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        println!("cluster: tearing down the nodes, namespaces, veths and bridge");
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // Every process of the nodes goes, their daemons (bluerdma-devd) with them.
        let nets: Vec<PathBuf> = self
            .nodes
            .iter()
            .filter_map(|n| namespaces(n.init).swap_remove(0))
            .collect();
        teardown();
        let left: Vec<u32> = devd_pids()
            .into_iter()
            .filter(|&p| namespaces(p)[0].as_ref().is_some_and(|n| nets.contains(n)))
            .collect();
        if !left.is_empty() {
            eprintln!("cluster: WARNING: {DEVD} {left:?} of the nodes outlived the teardown");
        }
    }
}

impl Cluster {
    fn up(n: usize, dir: &Path, lib_dir: &Path) -> Result<Cluster, String> {
        let mut cluster = Cluster {
            nodes: Vec::new(),
            lib_dir: lib_dir.to_path_buf(),
            dir: dir.to_path_buf(),
            rsh: dir.join("node-rsh.sh"),
            watchdog: None,
        };
        cluster.watchdog = Some(watchdog()?);
        println!("cluster: bridge {BRIDGE} {BRIDGE_IP}/24, {n} nodes at 10.77.0.10..");
        let bridge_cidr = format!("{BRIDGE_IP}/24");
        for argv in [
            vec!["ip", "link", "add", BRIDGE, "type", "bridge"],
            vec!["ip", "addr", "add", &bridge_cidr, "dev", BRIDGE],
        ] {
            sh(&argv).map_err(|e| format!("cluster: {e}"))?;
        }
        let init = dir.join("node-init.sh");
        write_script(&init, &NODE_INIT.replace("@DEV_NAME@", DEV_NAME))?;
        for i in 0..n {
            cluster.nodes.push(add_node(i, dir, &init)?);
        }
        sh(&["ip", "link", "set", BRIDGE, "mtu", MTU, "up"])
            .map_err(|e| format!("cluster: {e}"))?;
        write_script(&cluster.rsh, &rsh_script(&cluster.nodes, lib_dir, dir))?;
        let hosts: String = cluster
            .nodes
            .iter()
            .map(|n| format!("{} slots={SHARED_RANKS}\n", n.ip))
            .collect();
        fs::write(dir.join("hostfile"), hosts).map_err(|e| format!("cluster: hostfile: {e}"))?;
        Ok(cluster)
    }

    /// `nsenter` into node `i` with the stand-in on the library path and the node's device.
    fn command(&self, i: usize, program: &str, args: &[String]) -> Command {
        let node = &self.nodes[i];
        let mut c = Command::new("nsenter");
        c.args(["-t", &node.init.to_string(), "-n", "-i", "-p", "-u", "-m"])
            .arg(format!("--wd={}", self.dir.display()))
            .args(["--", program])
            .args(args)
            .env("LD_LIBRARY_PATH", &self.lib_dir)
            // Each node finds its device's address itself: the only non-loopback IPv4
            // address of its network namespace (the library's rule).
            .env_remove("BLUERDMA_DEVICES")
            .env("UCX_UD_VERBS_SEG_SIZE", UD_SEG_SIZE)
            .env("TMPDIR", node_tmp(&self.dir, i))
            .env("BLUERDMA_RUN_DIR", node_run(&self.dir, i));
        c
    }

    /// Kills every process in the nodes but their init (what a step that timed out left).
    fn reap(&self) {
        for n in &self.nodes {
            let pids = sh(&["ip", "netns", "pids", &netns(n.index)]).unwrap_or_default();
            let keep = [n.init, parent(n.init).unwrap_or(n.init)];
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                if !keep.contains(&pid) {
                    let _ = sh(&["kill", "-KILL", &pid.to_string()]);
                }
            }
        }
    }

    /// Whether node `i`'s namespace has a TCP socket listening on `port`.
    fn listening(&self, i: usize, port: u16) -> bool {
        let pid = self.nodes[i].init;
        let v4 = format!("/proc/{pid}/net/tcp");
        let v6 = format!("/proc/{pid}/net/tcp6");
        perftest::socket_in(&[&v4, &v6], None, port, Some("0A"))
    }
}

/// `ppid` of `pid` from `/proc/<pid>/stat`.
fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn write_script(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text)
        .and_then(|()| fs::set_permissions(path, fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("cluster: cannot write {}: {e}", path.display()))
}

/// A process outside our process group that tears everything down once xtask has gone
/// (Ctrl-C, a kill, a panic); the guard's Drop stops it on a normal end.
fn watchdog() -> Result<std::process::Child, String> {
    let me = std::env::current_exe().map_err(|e| format!("cluster: current_exe: {e}"))?;
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; exec \"$0\" cluster --teardown",
            pid = std::process::id()
        ))
        .arg(&me)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cluster: cannot start the teardown watchdog: {e}"))
}

/// Node `i`: its namespace, veth and address, then its node process, once it is ready.
fn add_node(i: usize, dir: &Path, init: &Path) -> Result<Node, String> {
    let ns = netns(i);
    let host = format!("{PREFIX}h{i}");
    let ip = node_ip(i);
    let cidr = format!("{ip}/24");
    for argv in [
        vec!["ip", "netns", "add", &ns],
        vec![
            "ip", "link", "add", &host, "mtu", MTU, "type", "veth", "peer", "name", "eth0", "mtu",
            MTU, "netns", &ns,
        ],
        vec!["ip", "link", "set", &host, "master", BRIDGE, "up"],
        vec!["ip", "-n", &ns, "addr", "add", &cidr, "dev", "eth0"],
        vec!["ip", "-n", &ns, "link", "set", "eth0", "up"],
        vec!["ip", "-n", &ns, "link", "set", "lo", "up"],
    ] {
        sh(&argv).map_err(|e| format!("cluster: node{i}: {e}"))?;
    }
    let realdev = dir.join(format!("node{i}.realdev"));
    let ready = dir.join(format!("node{i}.ready"));
    let log = dir.join(format!("node{i}.log"));
    let _ = fs::remove_file(&ready);
    fs::create_dir_all(&realdev).map_err(|e| format!("cluster: {}: {e}", realdev.display()))?;
    for d in [node_tmp(dir, i), node_run(dir, i)] {
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).map_err(|e| format!("cluster: {}: {e}", d.display()))?;
    }
    // A Unix socket's path holds at most 107 bytes.
    let sock = devd_socket(dir, i);
    if sock.as_os_str().len() > 107 {
        return Err(format!(
            "cluster: {} is too long for a Unix socket (107 bytes at most): move the checkout",
            sock.display()
        ));
    }
    let out = fs::File::create(&log).map_err(|e| format!("cluster: {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| format!("cluster: {e}"))?;
    // `ip netns exec` execs unshare in place, which forks the node's PID 1.
    let child = Command::new("ip")
        .args(["netns", "exec", &ns, "unshare", "--ipc", "--pid", "--uts"])
        .args(["--mount", "--fork", "--kill-child", "--mount-proc", "bash"])
        .arg(init)
        .arg(i.to_string())
        .arg(&realdev)
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cluster: node{i}: cannot start unshare: {e}"))?;
    let unshare = child.id();
    let mut proc = Proc::started(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        if proc.poll() || Instant::now() > deadline {
            proc.kill();
            let text = perftest::read_log(&log);
            return Err(format!(
                "cluster: node{i} did not come up ({}):\n{}",
                proc.exit.unwrap_or(Exit::Timeout),
                text.trim()
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
    let init = children(unshare)
        .first()
        .copied()
        .ok_or_else(|| format!("cluster: node{i}: no process under unshare ({unshare})"))?;
    // The child handle is dropped without killing: the process lives until teardown.
    std::mem::forget(proc);
    Ok(Node { index: i, ip, init })
}

/// The children of `pid` (every process whose parent it is).
fn children(pid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&p| parent(p) == Some(pid))
                .collect()
        })
        .unwrap_or_default()
}

/// Compiles `tests/<folder>/<name>.c` with `compiler` into `out` (its log beside `out`).
fn compile(
    root: &Path,
    [compiler, folder, name]: [&str; 3],
    out: &Path,
    libs: &[&str],
    timeout: Duration,
) -> Step {
    let src = root.join("tests").join(folder).join(format!("{name}.c"));
    let mut c = Command::new(compiler);
    c.args(["-O2", "-Wall", "-o"]).arg(out).arg(&src).args(libs);
    let log = out.with_extension("cc.log");
    let command = format!(
        "{compiler} -O2 -Wall -o {} {} {}",
        out.display(),
        src.display(),
        libs.join(" ")
    );
    println!("cluster: {command}");
    let mut p = perftest::spawn_logged(c, &log);
    perftest::wait_all(std::slice::from_mut(&mut p), Instant::now() + timeout);
    let label = format!("{compiler} {name}.c");
    Step::new(&label, "root", &p, log, command, |_| Ok(Figure::default()))
}

/// Over which transport a step runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    /// The emulated NIC: UCX rc_verbs/ud_verbs on `bluerdma0:1`.
    Nic,
    /// UCX's TCP transport on the nodes' eth0, for comparison.
    Tcp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Nic => "bluerdma0",
            Transport::Tcp => "tcp",
        }
    }

    fn ucx_tls(self) -> &'static str {
        match self {
            Transport::Nic => "rc_verbs,ud_verbs,self",
            Transport::Tcp => "tcp,self",
        }
    }

    /// The UCT transport and device of ucx_perftest.
    fn uct(self) -> [&'static str; 4] {
        match self {
            Transport::Nic => ["-x", "rc_verbs", "-d", "bluerdma0:1"],
            Transport::Tcp => ["-x", "tcp", "-d", "eth0"],
        }
    }

    /// UCX_TLS of an MPI run with `per_node` ranks per node: those on one node talk over
    /// shared memory (sm: posix, sysv, cma), as they would on a real host.
    fn mpi_tls(self, per_node: usize) -> &'static str {
        match (self, per_node > 1) {
            (_, false) => self.ucx_tls(),
            (Transport::Nic, true) => "rc_verbs,ud_verbs,sm,self",
            (Transport::Tcp, true) => "tcp,sm,self",
        }
    }

    /// What an `ep_cfg` line must name to prove that this transport carried the data.
    fn ep_cfg_proof(self) -> &'static str {
        match self {
            Transport::Nic => "rc_verbs/bluerdma0",
            Transport::Tcp => "tcp/eth0",
        }
    }
}

/// The measured figures of a step.
#[derive(Debug, Default)]
struct Figure {
    text: String,
    /// MB/s (10^6 B/s).
    bw: Option<f64>,
    /// usec.
    lat: Option<f64>,
}

/// One step of the run, as it ended.
struct Step {
    label: String,
    node: String,
    exit: Exit,
    time: Duration,
    figure: Figure,
    /// Set when the output is not what it must be (even with exit 0).
    problem: Option<String>,
    log: PathBuf,
    command: String,
}

impl Step {
    fn new(
        label: &str,
        node: &str,
        p: &Proc,
        log: PathBuf,
        command: String,
        examine: impl Fn(&str) -> Result<Figure, String>,
    ) -> Step {
        let exit = p.exit.unwrap_or(Exit::Timeout);
        let out = perftest::read_log(&log);
        let (figure, problem) = match examine(&out) {
            Ok(f) => (f, None),
            Err(e) => (Figure::default(), Some(e)),
        };
        Step {
            label: label.into(),
            node: node.into(),
            exit,
            time: p.elapsed(),
            figure,
            problem,
            log,
            command,
        }
    }

    fn skipped(label: &str, why: &str) -> Step {
        Step {
            label: label.into(),
            node: "-".into(),
            exit: Exit::NoStart,
            time: Duration::ZERO,
            figure: Figure::default(),
            problem: Some(why.into()),
            log: PathBuf::new(),
            command: String::new(),
        }
    }

    fn ok(&self) -> bool {
        self.exit == Exit::Code(0) && self.problem.is_none()
    }
}

/// Where the steps run.
struct StepCtx<'a> {
    cluster: &'a Cluster,
    dir: &'a Path,
    timeout: Duration,
}

impl StepCtx<'_> {
    fn log(&self, label: &str) -> PathBuf {
        let name: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{name}.log"))
    }

    /// `ucx_info -d` on node0: the memory domain `bluerdma0` must be listed; the figure says
    /// which of its transports opened.
    fn ucx_info(&self) -> Step {
        let label = "ucx_info -d";
        let log = self.log(label);
        println!("cluster: node0: {label}");
        let mut c = self.cluster.command(0, "ucx_info", &["-d".into()]);
        c.env("UCX_LOG_LEVEL", "info");
        let mut p = perftest::spawn_logged(c, &log);
        perftest::wait_all(std::slice::from_mut(&mut p), Instant::now() + self.timeout);
        self.cluster.reap();
        Step::new(label, "node0", &p, log, format!("{label} (node0)"), |out| {
            examine_ucx_info(out)
        })
    }

    /// ucx_perftest `test` (UCT put_bw/get, UCP tag_bw) of 1 MiB: node0 serves, node1 runs.
    fn ucx_pair(&self, t: Transport, test: &str, port: u16) -> Step {
        let ucp = test.starts_with("tag");
        let label = format!("{} {test} {}", if ucp { "UCP" } else { "UCT" }, t.name());
        let mut args: Vec<String> = ["-t", test, "-s", &MSG.to_string(), "-n", "100"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["-p".into(), port.to_string()]);
        if !ucp {
            args.extend(t.uct().iter().map(|s| s.to_string()));
            args.extend(["-D".into(), "zcopy".into()]);
        }
        let mut client_args = args.clone();
        client_args.push(node_ip(0));
        let env = |c: &mut Command| {
            c.env("UCX_TLS", t.ucx_tls()).env("UCX_LOG_LEVEL", "info");
        };
        let command = format!("ucx_perftest {}", client_args.join(" "));
        println!(
            "cluster: node0 serves, node1: UCX_TLS={} {command}",
            t.ucx_tls()
        );
        let mut server = self.cluster.command(0, "ucx_perftest", &args);
        env(&mut server);
        let mut client = self.cluster.command(1, "ucx_perftest", &client_args);
        env(&mut client);
        self.pair(
            &label,
            (server, client),
            command,
            |_| self.cluster.listening(0, port),
            |_| Ok(Figure::default()),
            |out| examine_perftest(out, test, ucp.then(|| t.ep_cfg_proof())),
        )
    }

    /// mpitest under mpirun with `layout`'s ranks per node; every rank's output is tagged
    /// with its rank (`--tag-output`), and the nodes' `bluerdma-devd` processes are watched
    /// while it runs.
    fn mpirun(&self, t: Transport, mpitest: &Path, built: bool, layout: Layout) -> Step {
        let label = layout.label(t);
        if !built {
            return Step::skipped(&label, "mpicc failed");
        }
        let nodes = self.cluster.nodes.len();
        let np = nodes * layout.per_node;
        let log = self.log(&label);
        let mut c = Command::new("mpirun");
        c.args([
            "--allow-run-as-root",
            "--tag-output",
            "-np",
            &np.to_string(),
        ])
        .arg("--hostfile")
        .arg(self.dir.join("hostfile"));
        if layout.per_node == 1 {
            c.args(["--map-by", "node"]);
        } else {
            // The nodes share this machine's cores: binding would pin every node's rank k
            // to the same core.
            c.args(["--map-by", &format!("ppr:{}:node", layout.per_node)])
                .args(["--bind-to", "none"]);
        }
        c.arg("--mca")
            .arg("plm_rsh_agent")
            .arg(&self.cluster.rsh)
            .args(["--mca", "plm_rsh_no_tree_spawn", "1"])
            .args(["--mca", "oob_tcp_if_include", SUBNET])
            .args([
                "--mca", "pml", "ucx", "--mca", "osc", "ucx", "--mca", "btl", "self",
            ])
            // Open MPI 4.1's pml ucx drops out unless a device matches `mlx*`.
            .args([
                "--mca",
                "pml_ucx_tls",
                "any",
                "--mca",
                "pml_ucx_devices",
                "any",
            ])
            .args(["-x", &format!("UCX_TLS={}", t.mpi_tls(layout.per_node))])
            .args(["-x", "UCX_LOG_LEVEL=info"])
            .args(["-x", &format!("UCX_UD_VERBS_SEG_SIZE={UD_SEG_SIZE}")]);
        if layout.shared {
            // Every rank opens bluerdma0 through its node's daemon, and says so (info).
            c.args(["-x", "BLUERDMA_SHARED=1", "-x", "BLUERDMA_LOG=info"]);
        }
        c.arg(mpitest)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("BLUERDMA_DEVICES")
            .env_remove("BLUERDMA_SHARED")
            .current_dir(self.dir);
        let command = format!(
            "{} {}",
            c.get_program().to_string_lossy(),
            c.get_args()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!("cluster: {command}");
        let mut watch = DaemonWatch::new(self.cluster);
        let mut p = perftest::spawn_logged(c, &log);
        let deadline = Instant::now() + self.timeout;
        while !p.poll() {
            watch.scan();
            if Instant::now() >= deadline {
                p.kill();
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        // A daemon outlives its last client by 3 s: the step's reap must end it.
        watch.scan();
        self.cluster.reap();
        let left = watch.left_running(Duration::from_secs(2));
        Step::new(&label, "all", &p, log, command, |out| {
            let mut f = examine_mpitest(out, t.ep_cfg_proof(), layout, nodes)?;
            f.text.push_str(&watch.verdict(layout.shared, &left)?);
            Ok(f)
        })
    }
}

/// How the ranks of an MPI step sit on the nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Layout {
    /// Ranks per node.
    per_node: usize,
    /// Whether every rank opens the device through its node's daemon (`BLUERDMA_SHARED=1`);
    /// without it each node's device belongs to its one rank.
    shared: bool,
}

impl Layout {
    const ONE: Layout = Layout {
        per_node: 1,
        shared: false,
    };
    const SHARED: Layout = Layout {
        per_node: SHARED_RANKS,
        shared: true,
    };

    fn label(self, t: Transport) -> String {
        if self.shared {
            format!("MPI mpitest {}/node shared {}", self.per_node, t.name())
        } else {
            format!("MPI mpitest {}", t.name())
        }
    }
}

/// The `bluerdma-devd` processes seen in the nodes' network namespaces during a step.
struct DaemonWatch {
    /// Per node, its init's namespaces (the `/proc/<pid>/ns/<ns>` links, [`NODE_NS`]).
    node_ns: Vec<Vec<Option<PathBuf>>>,
    /// Per node, the daemons seen in its network namespace (PIDs in ours).
    seen: Vec<std::collections::BTreeSet<u32>>,
    /// Per node, whether its daemon's socket was seen in its run directory.
    socket: Vec<bool>,
    /// Per node, its daemon's socket.
    socket_path: Vec<PathBuf>,
    /// A daemon in a node's network namespace but not in all of the node's others.
    misplaced: Vec<String>,
}

impl DaemonWatch {
    fn new(cluster: &Cluster) -> DaemonWatch {
        let n = cluster.nodes.len();
        DaemonWatch {
            node_ns: cluster.nodes.iter().map(|n| namespaces(n.init)).collect(),
            seen: vec![Default::default(); n],
            socket: vec![false; n],
            socket_path: (0..n).map(|i| devd_socket(&cluster.dir, i)).collect(),
            misplaced: Vec::new(),
        }
    }

    /// The node whose network namespace `pid` is in.
    fn node_of(&self, ns: &[Option<PathBuf>]) -> Option<usize> {
        let net = ns.first()?.as_ref()?;
        self.node_ns
            .iter()
            .position(|n| n.first().and_then(Option::as_ref) == Some(net))
    }

    fn scan(&mut self) {
        for pid in devd_pids() {
            let ns = namespaces(pid);
            let Some(i) = self.node_of(&ns) else {
                continue;
            };
            if self.seen[i].insert(pid) && ns != self.node_ns[i] {
                let other: Vec<&str> = NODE_NS
                    .iter()
                    .zip(ns.iter().zip(&self.node_ns[i]))
                    .filter(|(_, (a, b))| a != b)
                    .map(|(name, _)| *name)
                    .collect();
                self.misplaced.push(format!(
                    "node{i}: {DEVD} (pid {pid}) is in the node's network namespace but not in its {} namespace",
                    other.join(", ")
                ));
            }
        }
        for (i, path) in self.socket_path.iter().enumerate() {
            self.socket[i] |= path.exists();
        }
    }

    /// The daemons still running in the nodes after `grace` (each as `node<i> pid <p>`).
    fn left_running(&self, grace: Duration) -> Vec<String> {
        let deadline = Instant::now() + grace;
        loop {
            let left: Vec<String> = devd_pids()
                .into_iter()
                .filter_map(|pid| {
                    let i = self.node_of(&namespaces(pid))?;
                    Some(format!("node{i} pid {pid}"))
                })
                .collect();
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the step's figure says of the daemons, or what is wrong with them: with
    /// `shared`, each node ran one in all of its namespaces, listening in its run directory;
    /// without, none ran; and none is left.
    fn verdict(&self, shared: bool, left: &[String]) -> Result<String, String> {
        if !left.is_empty() {
            return Err(format!(
                "{DEVD} still running after the step's processes were killed: {}",
                left.join(", ")
            ));
        }
        if !self.misplaced.is_empty() {
            return Err(self.misplaced.join("; "));
        }
        if !shared {
            return match self.seen.iter().position(|s| !s.is_empty()) {
                Some(i) => Err(format!("a {DEVD} ran in node{i} without BLUERDMA_SHARED")),
                None => Ok(String::new()),
            };
        }
        let mut per_node = Vec::new();
        for (i, pids) in self.seen.iter().enumerate() {
            if pids.is_empty() {
                return Err(format!("no {DEVD} ran in node{i}"));
            }
            if !self.socket[i] {
                return Err(format!(
                    "node{i}'s {DEVD} ran but {} never appeared",
                    self.socket_path[i].display()
                ));
            }
            per_node.push(format!("node{i} {}", pids.len()));
        }
        Ok(format!(
            "; {DEVD} per node ({}) in the node's {} namespaces, each on its own socket, none left",
            per_node.join(", "),
            NODE_NS.join("/")
        ))
    }
}

/// The `/proc/<pid>/ns/<ns>` links of `pid`, in [`NODE_NS`] order.
fn namespaces(pid: u32) -> Vec<Option<PathBuf>> {
    NODE_NS
        .iter()
        .map(|ns| fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok())
        .collect()
}

/// The running (not zombie) `bluerdma-devd` processes of this machine.
fn devd_pids() -> Vec<u32> {
    let Ok(d) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                return false;
            };
            let state = stat[close + 1..].split_whitespace().next();
            &stat[open + 1..close] == DEVD && state != Some("Z") && state != Some("X")
        })
        .collect()
}

fn examine_ucx_info(out: &str) -> Result<Figure, String> {
    let md = format!("Memory domain: {DEVICE}");
    let Some(at) = out.find(&md) else {
        return Err(format!("no `{md}` in the output"));
    };
    // The domain's section runs to the next memory domain (or connection manager).
    let section = &out[at + md.len()..];
    let end = section
        .find("# Memory domain:")
        .or_else(|| section.find("# Connection manager"))
        .unwrap_or(section.len());
    let mut transports = Vec::new();
    let mut current: Option<String> = None;
    for line in section[..end].lines() {
        let l = line.trim_start_matches('#').trim();
        if let Some(tl) = l.strip_prefix("Transport:") {
            if let Some(prev) = current.take() {
                transports.push(format!("{prev} ok"));
            }
            current = Some(tl.trim().to_string());
        } else if l.contains("failed to open interface") {
            if let Some(prev) = current.take() {
                transports.push(format!("{prev} FAILED"));
            }
        }
    }
    transports.extend(current.map(|t| format!("{t} ok")));
    Ok(Figure {
        text: format!("md {DEVICE} listed; {}", transports.join(", ")),
        ..Figure::default()
    })
}

/// ucx_perftest's `Final:` line: iterations, overhead 50%/average/overall (usec), bandwidth
/// average/overall (MB/s, 2^20 B), message rate average/overall.
fn examine_perftest(out: &str, test: &str, proof: Option<&str>) -> Result<Figure, String> {
    let nums: Vec<f64> = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Final:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if nums.len() < 6 {
        return Err("no `Final:` result line".into());
    }
    if let Some(proof) = proof {
        ep_cfg(out, proof)?;
    }
    let (lat, bw) = (nums[2], nums[5] * 1.048576);
    Ok(Figure {
        text: if test == "get" {
            format!("{lat:.2} usec/op, {bw:.2} MB/s")
        } else {
            format!("{bw:.2} MB/s ({lat:.2} usec/op)")
        },
        bw: Some(bw),
        lat: Some(lat),
    })
}

/// The `ep_cfg[...]` lines that name `proof`; an error if there is none.
fn ep_cfg(out: &str, proof: &str) -> Result<usize, String> {
    let lines = out.lines().filter(|l| l.contains("ep_cfg"));
    let (with, total) = lines.fold((0, 0), |(w, t), l| (w + l.contains(proof) as usize, t + 1));
    if with == 0 {
        Err(format!(
            "no ep_cfg line names {proof} ({total} ep_cfg lines)"
        ))
    } else {
        Ok(with)
    }
}

/// The start of a chunk in `mpirun --tag-output`'s output at `at`: `[<job>,<rank>]<stdout>:`
/// (or `<stderr>`); the rank, the stream (true: stderr) and the marker's length.
fn tag_at(s: &str, at: usize) -> Option<(usize, bool, usize)> {
    let rest = s.get(at..)?.strip_prefix('[')?;
    let close = rest.find(']')?;
    let (job, rank) = rest[..close].split_once(',')?;
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rank: usize = rank.parse().ok()?;
    let after = &rest[close + 1..];
    let err = if after.starts_with("<stderr>:") {
        true
    } else if after.starts_with("<stdout>:") {
        false
    } else {
        return None;
    };
    Some((rank, err, 1 + close + 1 + "<stdout>:".len()))
}

/// The lines each rank wrote, from `mpirun --tag-output`'s output, in the order they ended
/// (`None`: mpirun's own lines). Open MPI writes every chunk it reads from a rank with the
/// rank's tag before it; a chunk without a newline at its end (a line written in pieces,
/// as an unbuffered stderr does) is followed on the same output line by the next chunk,
/// of any rank. So a line is put back together per rank and stream, from its chunks.
fn rank_lines(out: &str) -> Vec<(Option<usize>, String)> {
    let mut lines = Vec::new();
    let mut open: std::collections::HashMap<(usize, bool), String> = Default::default();
    for line in out.lines() {
        let starts: Vec<(usize, (usize, bool, usize))> = line
            .match_indices('[')
            .filter_map(|(i, _)| Some((i, tag_at(line, i)?)))
            .collect();
        if starts.first().is_none_or(|(i, _)| *i != 0) {
            lines.push((None, line.to_string()));
            continue;
        }
        for (k, &(i, (rank, err, len))) in starts.iter().enumerate() {
            let end = starts.get(k + 1).map_or(line.len(), |(j, _)| *j);
            let piece = open.entry((rank, err)).or_default();
            piece.push_str(&line[i + len..end]);
            // The last chunk of the output line ended with its newline.
            if k + 1 == starts.len() {
                lines.push((Some(rank), std::mem::take(piece)));
            }
        }
    }
    let mut rest: Vec<_> = open.into_iter().filter(|(_, t)| !t.is_empty()).collect();
    rest.sort();
    lines.extend(rest.into_iter().map(|((rank, _), t)| (Some(rank), t)));
    lines
}

/// mpitest's output under `mpirun --tag-output` with `layout` on `nodes` nodes: all checks
/// passed, `per_node` ranks on each node, and every rank's UCX log has an `ep_cfg` line
/// naming `proof` (with shared devices, every rank's library also says it opened bluerdma0
/// through the daemon at its node's address).
fn examine_mpitest(out: &str, proof: &str, layout: Layout, nodes: usize) -> Result<Figure, String> {
    let lines = rank_lines(out);
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let out = text.as_str();
    if let Some(l) = out.lines().find(|l| l.contains("mpitest: MISMATCH")) {
        return Err(l.trim().to_string());
    }
    if !out.contains("mpitest: all checks passed") {
        return Err("no `mpitest: all checks passed` line".into());
    }
    let said = |what: &str| {
        out.lines()
            .find_map(|l| l.split_once("mpitest: ")?.1.strip_prefix(what))
    };
    // Which node each rank is on: `mpitest: <n> ranks on node0 node0 node1 node1`.
    let hosts = out
        .lines()
        .find_map(|l| {
            let rest = l.split_once("mpitest: ")?.1;
            rest.split_once(" ranks on ").map(|(_, h)| h.trim())
        })
        .ok_or("no `mpitest: <n> ranks on` line")?;
    let on: Vec<&str> = hosts.split_whitespace().collect();
    let np = nodes * layout.per_node;
    if on.len() != np {
        return Err(format!("{} ranks ran, not {np}: {hosts}", on.len()));
    }
    for i in 0..nodes {
        let here = on.iter().filter(|h| **h == format!("node{i}")).count();
        if here != layout.per_node {
            return Err(format!(
                "{here} ranks on node{i}, not {}: {hosts}",
                layout.per_node
            ));
        }
    }
    // `mpitest: pingpong rank 0 (node0) <-> rank 2 (node1)`: it must cross nodes.
    let pair = said("pingpong rank 0 ").unwrap_or("").trim().to_string();
    let ends: Vec<&str> = pair
        .split(['(', ')'])
        .filter(|w| w.starts_with("node"))
        .collect();
    if nodes > 1 && (ends.len() != 2 || ends[0] == ends[1]) {
        return Err(format!("the ping-pong does not cross nodes: `{pair}`"));
    }
    // Each rank's lines.
    let mut ep = vec![0usize; np];
    let mut opened = vec![false; np];
    for (rank, text) in lines.iter().filter_map(|(r, t)| Some(((*r)?, t))) {
        if rank >= np {
            continue;
        }
        if text.contains("ep_cfg") && text.contains(proof) {
            ep[rank] += 1;
        }
        let text = text.as_str();
        let ip = on[rank]
            .strip_prefix("node")
            .and_then(|i| i.parse::<usize>().ok())
            .map(node_ip);
        if let Some(ip) = ip {
            opened[rank] |=
                text.contains(&format!("{DEVICE}: shared")) && text.contains(&format!(" at {ip} "));
        }
    }
    let missing = |bad: &dyn Fn(usize) -> bool| -> String {
        (0..np)
            .filter(|&r| bad(r))
            .map(|r| format!("{r} ({})", on[r]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let no_ep = missing(&|r| ep[r] == 0);
    if !no_ep.is_empty() {
        return Err(format!(
            "no ep_cfg line names {proof} on rank {no_ep} ({} on the others)",
            ep.iter().sum::<usize>()
        ));
    }
    if layout.shared {
        let closed = missing(&|r| !opened[r]);
        if !closed.is_empty() {
            return Err(format!(
                "no `bluerdma info: {DEVICE}: shared ... at <its node's address>` line on rank {closed}"
            ));
        }
    }
    let pingpong = |size: usize| {
        out.lines().find_map(|l| {
            let rest = l.split("mpitest: pingpong ").nth(1)?;
            let w: Vec<&str> = rest.split_whitespace().collect();
            (w.first()?.parse::<usize>().ok()? == size)
                .then(|| {
                    Some((
                        w.get(2)?.parse::<f64>().ok()?,
                        w.get(4)?.parse::<f64>().ok()?,
                    ))
                })
                .flatten()
        })
    };
    let lat = pingpong(8).map(|(usec, _)| usec);
    let bw = pingpong(8 << 20).map(|(_, mb_s)| mb_s);
    let between = if layout.per_node > 1 {
        format!(" (rank 0 {pair})")
    } else {
        String::new()
    };
    Ok(Figure {
        text: format!(
            "8 B {} usec, 8 MiB {} MB/s{between}; {np} ranks on {hosts}; {proof} in every rank's ep_cfg{}",
            lat.map_or("?".into(), |v| format!("{v:.2}")),
            bw.map_or("?".into(), |v| format!("{v:.2}")),
            if layout.shared {
                format!(", each opened {DEVICE} shared")
            } else {
                String::new()
            },
        ),
        bw,
        lat,
    })
}

fn print_report(steps: &[Step], nodes: usize, start: Instant, dir: &Path) {
    let rows: Vec<perftest::TableRow> = steps
        .iter()
        .map(|s| perftest::TableRow {
            label: &s.label,
            who: &s.node,
            exit: s.exit,
            time: s.time,
            figure: match &s.problem {
                Some(p) if s.exit == Exit::Code(0) => format!("BAD OUTPUT: {p}"),
                Some(p) => format!("FAILED: {p}"),
                None if s.ok() => s.figure.text.clone(),
                None => "FAILED (see below)".into(),
            },
        })
        .collect();
    perftest::print_table(["step", "node"], &rows);
    let value = |label: &str, f: fn(&Figure) -> Option<f64>| {
        steps
            .iter()
            .find(|s| s.label == label && s.ok())
            .and_then(|s| f(&s.figure))
            .map_or("-".to_string(), |v| format!("{v:.2}"))
    };
    println!(
        "{:<28} {:>14} {:>14}",
        "figure (MB = 10^6 B)", "bluerdma0", "UCX tcp"
    );
    for (name, label, f) in [
        (
            "UCT put_bw 1 MiB MB/s",
            "UCT put_bw",
            (|f: &Figure| f.bw) as fn(&Figure) -> Option<f64>,
        ),
        ("UCP tag_bw 1 MiB MB/s", "UCP tag_bw", |f: &Figure| f.bw),
        ("UCP sockaddr 4 MiB MB/s", "UCP sockaddr", |f: &Figure| f.bw),
        ("MPI ping-pong 8 B usec", "MPI mpitest", |f: &Figure| f.lat),
        ("MPI ping-pong 8 MiB MB/s", "MPI mpitest", |f: &Figure| f.bw),
        (
            "MPI 2/node shared 8 B usec",
            "MPI mpitest 2/node shared",
            |f: &Figure| f.lat,
        ),
        (
            "MPI 2/node shared 8 MiB MB/s",
            "MPI mpitest 2/node shared",
            |f: &Figure| f.bw,
        ),
    ] {
        println!(
            "{name:<28} {:>14} {:>14}",
            value(&format!("{label} bluerdma0"), f),
            value(&format!("{label} tcp"), f)
        );
    }
    for s in steps.iter().filter(|s| !s.ok()) {
        eprintln!();
        eprintln!(
            "cluster: FAILED {} (exit {}{}): {}",
            s.label,
            s.exit,
            s.problem
                .as_deref()
                .map(|p| format!(", {p}"))
                .unwrap_or_default(),
            s.command
        );
        if s.log.as_os_str().is_empty() {
            continue;
        }
        eprintln!("  last lines of {}:", s.log.display());
        perftest::print_tail_folded(&perftest::read_log(&s.log), TAIL);
    }
    let passed = steps.iter().filter(|s| s.ok()).count();
    println!(
        "cluster: {passed} of {} steps passed on {nodes} nodes in {:.0} s; logs in {}",
        steps.len(),
        start.elapsed().as_secs_f64(),
        dir.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ucx_outputs_are_read() {
        let perf = "Final:                   100   330.0  366.68  366.68   2727.25   2727.25  2727  2727\n";
        let f = examine_perftest(perf, "put_bw", None).unwrap();
        assert_eq!(f.lat, Some(366.68));
        assert!((f.bw.unwrap() - 2727.25 * 1.048576).abs() < 1e-6);
        assert!(examine_perftest(perf, "tag_bw", Some("rc_verbs/bluerdma0")).is_err());
        let info = "# Memory domain: bluerdma0\n#      Transport: rc_verbs\n#   < failed to open interface >\n#      Transport: ud_verbs\n#  capabilities:\n# Memory domain: cma\n";
        let f = examine_ucx_info(info).unwrap();
        assert_eq!(f.text, "md bluerdma0 listed; rc_verbs FAILED, ud_verbs ok");
        let mpi = "[1,0]<stdout>:mpitest: 2 ranks on node0 node1\n\
                   [1,0]<stdout>:mpitest: pingpong rank 0 (node0) <-> rank 1 (node1)\n\
                   [1,0]<stdout>:mpitest: pingpong 8 B 4.00 usec 2.00 MB/s\n\
                   [1,0]<stderr>:[x] UCX  INFO  ep_cfg[1]: tag(tcp/eth0)\n\
                   [1,0]<stdout>:mpitest: pingpong 8388608 B 900.00 usec 9320.68 MB/s\n\
                   [1,1]<stderr>:[y] UCX  INFO  ep_cfg[0]: tag(tcp/eth0)\n\
                   [1,0]<stdout>:mpitest: all checks passed on 2 ranks\n";
        let f = examine_mpitest(mpi, "tcp/eth0", Layout::ONE, 2).unwrap();
        assert_eq!((f.lat, f.bw), (Some(4.0), Some(9320.68)));
        assert!(examine_mpitest(mpi, "rc_verbs/bluerdma0", Layout::ONE, 2).is_err());
        // Rank 1 without its own ep_cfg line fails, whatever rank 0 says.
        let rank0_only: String = mpi
            .lines()
            .filter(|l| !l.starts_with("[1,1]"))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = examine_mpitest(&rank0_only, "tcp/eth0", Layout::ONE, 2).unwrap_err();
        assert!(e.contains("rank 1 (node1)"), "{e}");
        // Placement: 2 ranks on one node is not one per node.
        let crowded = mpi.replace("ranks on node0 node1", "ranks on node0 node0");
        assert!(examine_mpitest(&crowded, "tcp/eth0", Layout::ONE, 2).is_err());
    }

    #[test]
    fn shared_runs_are_checked_on_every_rank() {
        let mut out = String::from(
            "[1,0]<stdout>:mpitest: 4 ranks on node0 node0 node1 node1\n\
             [1,0]<stdout>:mpitest: pingpong rank 0 (node0) <-> rank 2 (node1)\n\
             [1,0]<stdout>:mpitest: all checks passed on 4 ranks\n",
        );
        for r in 0..4 {
            let ip = node_ip(r / 2);
            out.push_str(&format!(
                "[1,{r}]<stderr>:bluerdma info: bluerdma0: shared emulated device at {ip} (slot {r}, QP indices 0..1)\n\
                 [1,{r}]<stderr>:[t] UCX  INFO  ep_cfg[0]: tag(posix/memory cma/memory)\n\
                 [1,{r}]<stderr>:[t] UCX  INFO  ep_cfg[1]: tag(rc_verbs/bluerdma0:1)\n"
            ));
        }
        // A line written in pieces is tagged before each piece.
        out = out.replace(
            "[1,1]<stderr>:bluerdma info: bluerdma0: shared emulated device at 10.77.0.10 (",
            "[1,1]<stderr>:bluerdma [1,1]<stderr>:info[1,1]<stderr>:: bluerdma0: shared \
             emulated device at [1,1]<stderr>:10.77.0.10 (",
        );
        assert!(out.contains("[1,1]<stderr>:info"));
        // Rank 0's unfinished chunk before rank 1's line, on one output line.
        out = out.replace(
            "[1,0]<stderr>:bluerdma info: bluerdma0: shared emulated device at 10.77.0.10 (",
            "[1,0]<stderr>:bluerdma [1,2]<stderr>:x\n[1,0]<stderr>:info: bluerdma0: shared emulated \
             device at 10.77.0.10 (",
        );
        assert!(out.contains("[1,0]<stderr>:bluerdma [1,2]"));
        let f = examine_mpitest(&out, "rc_verbs/bluerdma0", Layout::SHARED, 2).unwrap();
        assert!(
            f.text.contains("(rank 0 (node0) <-> rank 2 (node1))"),
            "{}",
            f.text
        );
        // Rank 3 talked over shared memory only.
        let shm_only = out.replace(
            "[1,3]<stderr>:[t] UCX  INFO  ep_cfg[1]: tag(rc_verbs/bluerdma0:1)\n",
            "",
        );
        let e = examine_mpitest(&shm_only, "rc_verbs/bluerdma0", Layout::SHARED, 2).unwrap_err();
        assert!(e.contains("rank 3 (node1)"), "{e}");
        // Rank 2 opened the device at the other node's address (or not shared).
        let wrong = out.replace(
            "device at 10.77.0.11 (slot 2",
            "device at 10.77.0.10 (slot 2",
        );
        let e = examine_mpitest(&wrong, "rc_verbs/bluerdma0", Layout::SHARED, 2).unwrap_err();
        assert!(e.contains("rank 2 (node1)"), "{e}");
        // A ping-pong inside one node is not the NIC's figure.
        let local = out.replace("<-> rank 2 (node1)", "<-> rank 1 (node0)");
        assert!(examine_mpitest(&local, "rc_verbs/bluerdma0", Layout::SHARED, 2).is_err());
    }
}
