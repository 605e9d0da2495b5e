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
for c in qemu-nbd qemu-io qemu-img nbdinfo; do
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
# SIGTERM, then wait for the process to be gone (it closes the image and
# gives up the lock as it exits), 60 s at most; 1 if it is still there.
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
check "qemu-nbd exits on SIGTERM" qemu_nbd_stop

phase verify

check "rbd snap create rbd/img@s0" rbdc snap create rbd/img@s0
check "qemu-io overwrites the head after the snapshot" timeout 60 qemu-io -f raw \
	-c 'write -P 0x33 4186112 4096' "rbd:rbd/img:conf=$CEPH_CONF"

phase snap
phase fault

# The daemon: an rbd node as qemu-storage-daemon shows it in
# query-named-block-nodes (the same image members, QEMU's json: name,
# the object size as cluster size), and served over NBD.
DAEMON=${IOC_BUILD_ROOT:-.}/tools/daemon/iocore-storage-daemon
node_query() { # BINARY: the node's entry, as JSON, on stdout
	rm -f "$CEPH_DIR/q.sock" "$CEPH_DIR/d.sock"
	timeout 60 ${MESON_EXE_WRAPPER:-} "$1" \
		--blockdev "driver=rbd,node-name=r,pool=rbd,image=img,conf=$CEPH_CONF" \
		--chardev "socket,id=m,path=$CEPH_DIR/q.sock,server=on,wait=off" \
		--monitor chardev=m --nbd-server "addr.type=unix,addr.path=$CEPH_DIR/d.sock" \
		--export type=nbd,id=e,node-name=r,name=r >/dev/null 2>&1 &
	dpid=$!
	timeout 60 python3 - "$CEPH_DIR/q.sock" "$CEPH_DIR/d.sock" <<'PY'
import json, os, socket, subprocess, sys, time
for _ in range(600):
    if os.path.exists(sys.argv[1]) and os.path.exists(sys.argv[2]):
        break
    time.sleep(0.1)
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
def cmd(c):
    f.write(json.dumps({"execute": c}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "event" not in r:
            return r
cmd("qmp_capabilities")
node = cmd("query-named-block-nodes")["return"][0]
size = subprocess.run(["nbdinfo", "--size", "nbd+unix:///r?socket=" + sys.argv[2]],
                      stdout=subprocess.PIPE, text=True).stdout.strip()
node["nbd-size"] = size
print(json.dumps(node))
PY
	kill $dpid 2>/dev/null
	wait $dpid 2>/dev/null
}
ours=$(node_query "$DAEMON")
rbd_shape() { # JSON: the members checked, as one line
	echo "$1" | python3 -c 'import json, sys
n = json.load(sys.stdin); i = n["image"]
print(n["drv"], i["format"], i["virtual-size"], i.get("cluster-size"),
      i.get("format-specific"), i["filename"].startswith("json:{\"pool\": \"rbd\""),
      "actual-size" in i, n["nbd-size"])'
}
expect_eq() { if [ "$2" = "$3" ]; then ok "$1"; else notok "$1"; echo "# got: $2"; echo "# want: $3"; fi; }
expect_eq "daemon: the rbd node in query-named-block-nodes, served over NBD" \
	"$(rbd_shape "$ours" 2>&1)" \
	"rbd rbd 1073741824 4194304 {'type': 'rbd', 'data': {}} True False 1073741824"
if command -v qemu-storage-daemon >/dev/null 2>&1; then
	theirs=$(node_query qemu-storage-daemon)
	keys() { echo "$1" | python3 -c 'import json, sys
i = json.load(sys.stdin)["image"]; print(sorted(i), i.get("snapshots"))'; }
	expect_eq "daemon: the node's image members and snapshots are qemu-storage-daemon's" \
		"$(keys "$ours" 2>&1)" "$(keys "$theirs" 2>&1)"
fi

echo "1..$n"
[ $fails -eq 0 ]
