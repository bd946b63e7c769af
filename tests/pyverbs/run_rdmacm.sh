#!/bin/bash
# pyverbs' test_rdmacm (rdma-core's own tests, shipped by Debian's python3-pyverbs under
# /usr/share/doc/rdma-core/tests) over the blue-rdma stand-ins in target/ibverbs/.
#
#   tests/pyverbs/run_rdmacm.sh [--pair] [-v] [TEST...]     (TEST default: test_rdmacm)
#
# The run itself is run.sh's (a private mount namespace whose /sys/class has
# infiniband/bluerdma0/device/net/lo, which the tests read to find the device's address).
#
# Without --pair the tests run as shipped: each forks a passive and an active process that
# both use bluerdma0, which the stand-ins do not allow yet (one process per device, issue
# N): every traffic test errors. With --pair the active side's source address is 127.0.0.2
# (bluerdma1) instead of the passive side's own address; nothing else changes.
#
# Needs root (unshare, mount), python3-pyverbs, and both stand-ins built (`cargo xtask
# rdmacm` or `cargo xtask perftest` install them in target/ibverbs/).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -e "$root/target/ibverbs/librdmacm.so.1" ] || {
    echo "run_rdmacm: $root/target/ibverbs/librdmacm.so.1 is missing (cargo xtask rdmacm builds it)" >&2
    exit 2
}
pre=()
if [ "${1:-}" = --pair ]; then
    pre=(--pair)
    shift
fi
args=("$@")
named=no
for a in "$@"; do
    case $a in -*) ;; *) named=yes ;; esac
done
[ $named = yes ] || args+=(test_rdmacm)
exec "$root/tests/pyverbs/run.sh" "${pre[@]}" --work "$root/target/pyverbs" "${args[@]}"
