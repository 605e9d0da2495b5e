#!/bin/sh
# Persistent dirty bitmaps of an rbd node, kept in the cluster: on a fresh
# one-host cluster, test-rbd-bitmap.py runs iocore-storage-daemon again and
# again on one image, as separate hosts would (its header lists the steps).
# Every step is bounded; the cluster is stopped on exit.
set -u
. "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/harness/ceph.sh"
ceph_require
for c in qemu-io qemu-img nbdinfo rados; do
	command -v $c >/dev/null 2>&1 || { echo "1..0 # SKIP $c not installed"; exit 77; }
done
DAEMON=${IOC_BUILD_ROOT:-.}/tools/daemon/iocore-storage-daemon
if ! ceph_start; then
	echo "not ok 1 - cluster starts"
	echo "1..1"
	exit 1
fi
timeout 500 python3 "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/rbd/test-rbd-bitmap.py" \
	"$DAEMON" "$CEPH_CONF" "$CEPH_OSD_PID" "$CEPH_MON_PID"
