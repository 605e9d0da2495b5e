#!/bin/sh
# The rbd driver on a fresh one-host cluster, cross-checked with qemu:
# test-rbd-node runs in phases (its header lists them) and between them
# qemu-img compares the image, served by qemu-nbd through qemu's own rbd
# driver, with the file the driver's writes were mirrored into; the
# driver's block status map is compared with rbd diff; qemu-io writes
# what the driver then reads back; a snapshot is taken for the driver to
# open read-only.  Every step is bounded (timeout), the cluster is stopped
# on exit.
set -u
. "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}/tests/harness/ceph.sh"
ceph_require
for c in qemu-nbd qemu-io qemu-img; do
	command -v $c >/dev/null 2>&1 || { echo "1..0 # SKIP $c not installed"; exit 77; }
done
if ! ls /usr/lib/*/qemu/block-rbd.so >/dev/null 2>&1; then
	echo "1..0 # SKIP qemu's rbd driver not installed (qemu-block-extra)"; exit 77
fi
PROG=${1:-${IOC_BUILD_ROOT:-.}/tests/rbd/test-rbd-node}

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
check() {
	name=$1; shift
	if out=$("$@" 2>&1); then ok "$name"; else
		notok "$name"; echo "$out" | sed 's/^/# /' | tail -20; fi
}
# phase NAME: the C program's TAP lines renumbered into this stream.
phase() {
	timeout 180 ${MESON_EXE_WRAPPER:-} "$PROG" "$1" >"$CEPH_DIR/$1.tap" 2>&1
	rc=$?
	while IFS= read -r line; do
		case $line in
		"ok "*) ok "$1: ${line#ok * - }";;
		"not ok "*) notok "$1: ${line#not ok * - }";;
		1..*) ;;
		*) echo "# $line";;
		esac
	done <"$CEPH_DIR/$1.tap"
	[ $rc -eq 0 ] || notok "$1: exits 0 (status $rc)"
}

if ! ceph_start; then
	notok "cluster starts"
	echo "1..$n"
	exit 1
fi
sock=$CEPH_DIR/nbd.sock
qemu_nbd_start() {
	timeout 60 qemu-nbd -f raw --fork --pid-file "$CEPH_DIR/nbd.pid" -k "$sock" -t \
		"rbd:rbd/img:conf=$CEPH_CONF"
}
qemu_nbd_stop() {
	[ -f "$CEPH_DIR/nbd.pid" ] || return 0
	pid=$(cat "$CEPH_DIR/nbd.pid")
	kill "$pid" 2>/dev/null
	i=0
	while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	rm -f "$CEPH_DIR/nbd.pid"
}
trap 'qemu_nbd_stop; ceph_stop' EXIT
nbd="nbd+unix:///?socket=$sock"

phase io

check "qemu-nbd serves the image" qemu_nbd_start
check "qemu-img compare: the image holds what the driver wrote" \
	timeout 120 qemu-img compare -f raw -F raw "$CEPH_DIR/expect.raw" "$nbd"

# rbd diff's extents, merged where they touch, against the driver's map.
cmp_map() {
	rbdc diff --whole-object --format json rbd/img >"$CEPH_DIR/diff.json" || return 1
	python3 - "$CEPH_DIR/diff.json" "$CEPH_DIR/map.txt" <<'PY'
import json, sys
runs = []
for e in sorted(json.load(open(sys.argv[1])), key=lambda e: e["offset"]):
    if e.get("exists", "true") not in ("true", True):
        continue
    if runs and runs[-1][0] + runs[-1][1] == e["offset"]:
        runs[-1][1] += e["length"]
    else:
        runs.append([e["offset"], e["length"]])
ours = [list(map(int, l.split())) for l in open(sys.argv[2]) if l.strip()]
print("rbd diff:", runs)
print("driver:  ", ours)
sys.exit(0 if runs == ours else 1)
PY
}
check "block status matches rbd diff --whole-object" cmp_map
check "qemu-io writes through qemu-nbd" timeout 60 qemu-io -f raw \
	-c 'write -P 0x5a 100M 1M' "$nbd"
qemu_nbd_stop

phase verify

check "rbd snap create rbd/img@s0" rbdc snap create rbd/img@s0
check "qemu-io overwrites the head after the snapshot" timeout 60 qemu-io -f raw \
	-c 'write -P 0x33 4186112 4096' "rbd:rbd/img:conf=$CEPH_CONF"

phase snap
phase fault

echo "1..$n"
[ $fails -eq 0 ]
