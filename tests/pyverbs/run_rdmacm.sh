#!/bin/bash
# pyverbs' test_rdmacm (rdma-core's own tests, shipped by Debian's python3-pyverbs under
# /usr/share/doc/rdma-core/tests) over the blue-rdma stand-ins in target/ibverbs/.
#
#   tests/pyverbs/run_rdmacm.sh [--pair] [-v] [TEST...]     (TEST default: test_rdmacm)
#
# The tests find their device's IP address through /sys/class/infiniband/<dev>/device/net/,
# which the stand-ins have no sysfs for: the run happens in a private mount namespace whose
# /sys/class is a tmpfs with the real entries bound back in, plus
# infiniband/bluerdma0/device/net/lo (bluerdma0 is 127.0.0.1). Nothing outside that
# namespace changes.
#
# Without --pair the tests run as shipped: each forks a passive and an active process that
# both use bluerdma0, which the stand-ins do not allow yet (one process per device, issue
# N): every traffic test errors. With --pair the active side's source address is 127.0.0.2
# (bluerdma1) instead of the passive side's own address; nothing else changes.
#
# Needs root (unshare, mount), python3-pyverbs, and the stand-ins built (`cargo xtask
# rdmacm` or `cargo xtask perftest` install them in target/ibverbs/).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
libs=$root/target/ibverbs
shipped=/usr/share/doc/rdma-core/tests
runner=run_tests.py
if [ "${1:-}" = --pair ]; then
    runner=pair_run.py
    shift
fi
args=("$@")
named=no
for a in "$@"; do
    case $a in -*) ;; *) named=yes ;; esac
done
[ $named = yes ] || args+=(test_rdmacm)
for f in "$libs/libibverbs.so.1" "$libs/librdmacm.so.1"; do
    [ -e "$f" ] || { echo "run_rdmacm: $f is missing (cargo xtask rdmacm builds it)" >&2; exit 2; }
done
[ -d "$shipped" ] || { echo "run_rdmacm: $shipped is missing (apt-get install python3-pyverbs)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run_rdmacm: needs root (a private mount namespace)" >&2; exit 2; }

work=$root/target/pyverbs
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
exec unshare --mount --propagation private bash -c '
set -eu
work=$1 runner=$2
shift 2
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
exec timeout 900 /usr/bin/python3 "tests/$runner" --dev bluerdma0 --gid 0 "$@"
' run_rdmacm "$work" "$runner" "${args[@]}"
