#!/bin/bash
# rdma-core's own test suite (pyverbs; Debian's python3-pyverbs ships it under
# /usr/share/doc/rdma-core/tests, some files gzipped), unmodified, over the blue-rdma
# stand-ins in target/ibverbs/, with `--dev bluerdma0 --gid 0`.
#
#   tests/pyverbs/run.sh [--pair] [--work DIR] [-v] MODULE...     (e.g. test_qpex test_cq)
#
# `cargo xtask pyverbs` runs the generic modules through this script and reads the unittest
# summary it prints.
#
# Some tests find their device's IP address through /sys/class/infiniband/<dev>/device/net/,
# which the stand-ins have no sysfs for: the run happens in a private mount namespace whose
# /sys/class is a tmpfs with the real entries bound back in, plus
# infiniband/bluerdma0/device/net/lo (bluerdma0 is 127.0.0.1). Nothing outside that
# namespace changes. The run also has its own network namespace (only its loopback, up), so
# the devices' ports (UDP 4791, TCP 60000 on 127.0.0.x) never meet those of other tests or
# tools running on the machine at the same time.
#
# With --pair, the active side of an rdmacm test connects from 127.0.0.2 (bluerdma1) instead
# of from the passive side's own address (see run_rdmacm.sh); nothing else changes.
#
# The shipped files are copied (and gunzipped) into DIR (default target/pyverbs-run) and
# run from there; the shipped tree is not touched. The run is ended after PYVERBS_TIMEOUT
# seconds (default 1800).
#
# Needs root (unshare, mount), python3-pyverbs, and the stand-ins built (`cargo xtask
# pyverbs`, `cargo xtask rdmacm` or `cargo xtask perftest` install them in target/ibverbs/).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
libs=$root/target/ibverbs
shipped=/usr/share/doc/rdma-core/tests
runner=run_tests.py
work=$root/target/pyverbs-run
while [ $# -gt 0 ]; do
    case $1 in
        --pair) runner=pair_run.py; shift ;;
        --work) work=$2; shift 2 ;;
        *) break ;;
    esac
done
args=("$@")
named=no
for a in "$@"; do
    case $a in -*) ;; *) named=yes ;; esac
done
[ $named = yes ] || { echo "run.sh: name the test modules to run (e.g. test_cq)" >&2; exit 2; }
[ -e "$libs/libibverbs.so.1" ] || {
    echo "run.sh: $libs/libibverbs.so.1 is missing (cargo xtask pyverbs builds it)" >&2; exit 2; }
[ -d "$shipped" ] || { echo "run.sh: $shipped is missing (apt-get install python3-pyverbs)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (a private mount namespace)" >&2; exit 2; }

rm -rf "$work"
mkdir -p "$work/realclass"
cp -r "$shipped" "$work/tests"
gunzip -f "$work"/tests/*.gz
cat > "$work/tests/pair_run.py" <<'EOF'
#!/usr/bin/env python3
# run_tests.py, except that the active side of an rdmacm test connects from
# PAIR_ACTIVE_SRC (another device) instead of from the passive side's own address.
import os
import unittest
from importlib.machinery import SourceFileLoader

from args_parser import parser

tests = SourceFileLoader('tests', os.path.join(os.path.dirname(__file__), '__init__.py')).load_module()
import tests.base_rdmacm as base_rdmacm

_addrinfo = base_rdmacm.AddrInfo


def active_from_other_device(src=None, dst=None, **kwargs):
    if dst is not None and src == dst:
        src = os.environ['PAIR_ACTIVE_SRC']
    return _addrinfo(src=src, dst=dst, **kwargs)


base_rdmacm.AddrInfo = active_from_other_device
parser.parse_args()
unittest.main(module=tests)
EOF

export LD_LIBRARY_PATH=$libs PAIR_ACTIVE_SRC=127.0.0.2
exec unshare --mount --net --propagation private bash -c '
set -eu
work=$1 runner=$2
shift 2
ip link set lo up
# /sys/class as a tmpfs with every real entry bound back in, and the device-to-netdev link.
mount --rbind /sys/class "$work/realclass"
mount -t tmpfs -o mode=755 pyverbs-sysclass /sys/class
for e in "$work"/realclass/*; do
    n=${e##*/}
    mkdir "/sys/class/$n" && mount --rbind "$e" "/sys/class/$n"
done
umount -l "$work/realclass"
mkdir -p /sys/class/infiniband/bluerdma0/device/net/lo
cd "$work"
exec timeout "${PYVERBS_TIMEOUT:-1800}" /usr/bin/python3 "tests/$runner" --dev bluerdma0 --gid 0 "$@"
' pyverbs "$work" "$runner" "${args[@]}"
