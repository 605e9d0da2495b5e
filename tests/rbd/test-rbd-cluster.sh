#!/bin/sh
# The one-host cluster of tests/harness/ceph.sh, checked with the
# reference client: qemu-nbd serves rbd/img through qemu's rbd driver and
# qemu-io writes and reads patterns through it; rbd(8) sees the image.
# Skips (77) when the ceph daemons or qemu's rbd driver are missing.
set -u
. "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/harness/ceph.sh"
ceph_require
for c in qemu-nbd qemu-io qemu-img; do
	command -v $c >/dev/null 2>&1 || { echo "1..0 # SKIP $c not installed"; exit 77; }
done
if ! ls /usr/lib/*/qemu/block-rbd.so >/dev/null 2>&1; then
	echo "1..0 # SKIP qemu's rbd driver not installed (qemu-block-extra)"; exit 77
fi

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
check() {
	name=$1; shift
	if out=$("$@" 2>&1); then ok "$name"; else
		notok "$name"; echo "$out" | sed 's/^/# /' | tail -20; fi
}

echo "1..7"
if ! ceph_start; then
	notok "cluster starts"
	exit 1
fi
ok "cluster starts"
osd_up() { cephc -s | grep -q "1 up"; }
img_seen() { rbdc info rbd/img | grep -q "size 1 GiB"; }
diff_seen() { rbdc diff rbd/img --format json | grep -q '"offset":0,'; }
check "ceph -s shows the OSD up" osd_up
check "rbd info sees rbd/img" img_seen

sock=$CEPH_DIR/nbd.sock
# SIGTERM, then wait for the process to be gone (it closes the image as
# it exits), 60 s at most; 1 if it is still there.
qemu_nbd_stop() {
	[ -f "$CEPH_DIR/nbd.pid" ] || return 0
	pid=$(cat "$CEPH_DIR/nbd.pid")
	rm -f "$CEPH_DIR/nbd.pid"
	kill "$pid" 2>/dev/null
	i=0
	while kill -0 "$pid" 2>/dev/null; do
		[ $i -lt 600 ] || { echo "qemu-nbd (pid $pid) has not exited"; return 1; }
		sleep 0.1; i=$((i + 1))
	done
}
trap 'qemu_nbd_stop; ceph_stop' EXIT
check "qemu-nbd serves rbd:rbd/img" timeout 60 qemu-nbd -f raw --fork \
	--pid-file "$CEPH_DIR/nbd.pid" -k "$sock" -t "rbd:rbd/img:conf=$CEPH_CONF"
check "qemu-io writes and reads back through it" timeout 60 qemu-io -f raw \
	-c 'write -P 0xa5 0 1M' -c 'write -P 0x5a 3M 64k' \
	-c 'read -P 0xa5 0 1M' -c 'read -P 0x5a 3M 64k' -c 'read -P 0 4M 64k' \
	"nbd+unix:///?socket=$sock"
check "qemu-nbd exits on SIGTERM" qemu_nbd_stop
check "rbd diff shows the written extents" diff_seen
