#!/bin/sh
# Hand-over migration of an rbd node between iocore-nbd processes on one
# image, as separate hosts would run them: on a fresh one-host cluster,
# test-rbd-handover.py (its header lists the steps).  Every step is
# bounded; the cluster is stopped on exit.
set -u
. "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/harness/ceph.sh"
ceph_require
NBD=${IOC_BUILD_ROOT:-.}/tools/nbd/iocore-nbd
DAEMON=${IOC_BUILD_ROOT:-.}/tools/daemon/iocore-storage-daemon
if ! ceph_start; then
	echo "not ok 1 - cluster starts"
	echo "1..1"
	exit 1
fi
timeout 300 python3 "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/rbd/test-rbd-handover.py" \
	"$NBD" "$CEPH_CONF" "$DAEMON"
