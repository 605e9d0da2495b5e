#!/bin/sh
# bench/nbd/dirty-map.sh BUILD_DIR [SIZE] [ROUNDS]
#
# Reading a dirty bitmap: `nbdinfo --map=qemu:dirty-bitmap:b0` of a sparse
# image (SIZE, default 1T) with 1% of its 64 KiB granules dirty, picked at
# random over the whole image, side by side in the same run:
#   - iocore-nbd serving a raw image, bitmap b0 added on its control socket;
#   - qemu-nbd -B b0 serving a qcow2 image (64 KiB clusters) whose
#     persistent bitmap b0 was made by qemu-img bitmap --add.
# Both bitmaps are dirtied the same way, through NBD: one 64 KiB
# write-zeroes per chosen granule (libnbd's Python bindings, 64 in flight),
# so neither image allocates data.  Two measurements per server: the
# wall time of nbdinfo --map (what the user sees, nbdinfo's own formatting
# included), and of the same walk made with libnbd's block_status in 2 GiB
# requests that only count the extents, and the CPU time nbdinfo and the
# server each used during nbdinfo --map (who the time belongs to).  Rounds
# alternate the two servers; it prints each run's times, the medians and
# their ratios, and checks that the two maps are identical.  Images and sockets live in /dev/shm and are
# removed at exit.  Not part of make test.
set -eu
BUILD=$(cd "$1" && pwd)
SIZE=${2:-1T}
ROUNDS=${3:-3}
SRV="$BUILD/tools/nbd/iocore-nbd"
CTL="$BUILD/tools/ctl/iocore-ctl"
for t in qemu-img qemu-nbd nbdinfo; do
	command -v $t >/dev/null || { echo "dirty-map.sh: $t missing" >&2; exit 1; }
done
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
	{ echo "dirty-map.sh: libnbd's Python bindings (python3-libnbd) missing" >&2; exit 1; }
dir=$(mktemp -d /dev/shm/ioc-dirty-map.XXXXXX)
cleanup() {
	for p in "$dir"/*.pid; do
		[ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null
	done
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

IOC="nbd+unix:///disk?socket=$dir/ioc.sock"
QEMU="nbd+unix:///disk?socket=$dir/qemu.sock"

# iocore-nbd on a raw image, with b0 (64 KiB, the default granularity).
truncate -s "$SIZE" "$dir/raw.img"
"$SRV" --fork --pid-file "$dir/ioc.pid" -U "$dir/ioc.sock" -x disk \
	--control "$dir/ctl.sock" "$dir/raw.img"
"$CTL" -s "$dir/ctl.sock" block-dirty-bitmap-add node=disk name=b0 >/dev/null

# qemu-nbd on a qcow2 image with a persistent b0 (enabled: it records the
# writes below; a writable export may serve an enabled bitmap).
qemu-img create -q -f qcow2 -o cluster_size=65536 "$dir/q.qcow2" "$SIZE"
qemu-img bitmap --add -g 65536 "$dir/q.qcow2" b0
qemu-nbd -f qcow2 -t -x disk -B b0 -k "$dir/qemu.sock" --fork \
	--pid-file "$dir/qemu.pid" "$dir/q.qcow2"

# The same 1% of granules, in the same order, on both.
/usr/bin/python3 - "$IOC" "$QEMU" <<'EOF'
import random, sys
import nbd

GRAN = 64 << 10
for uri in sys.argv[1:]:
    h = nbd.NBD()
    h.connect_uri(uri)
    n = h.get_size() // GRAN
    picks = random.Random(20240601).sample(range(n), n // 100)
    for g in picks:
        while h.aio_in_flight() >= 64:
            h.poll(-1)
        h.aio_zero(GRAN, g * GRAN, completion=lambda err: 1)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    h.shutdown()
print("%d of %d granules of 64 KiB dirty" % (n // 100, n), flush=True)
EOF

now() { date +%s%N; }
# srv_ms PIDFILE: CPU time (ms) the server has used so far, user and
# system, from /proc/PID/stat: coarse (clock ticks) but it counts threads
# that have exited (per-thread schedstat would lose a worker's time).
HZ=$(getconf CLK_TCK)
srv_ms() {
	awk -v hz="$HZ" '{printf "%d", ($14 + $15) * 1000 / hz}' /proc/"$(cat "$1")"/stat
}
# timed NAME URI PIDFILE: one nbdinfo --map; prints its wall time, the
# CPU time nbdinfo itself used and the server's CPU time, all in ms.
timed() {
	s0=$(srv_ms "$3")
	t0=$(now)
	c=$(/usr/bin/python3 -c '
import resource, subprocess, sys
with open(sys.argv[2], "wb") as out:
    subprocess.run(["nbdinfo", "--map=qemu:dirty-bitmap:b0", sys.argv[1]],
                   stdout=out, check=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(int((u.ru_utime + u.ru_stime) * 1000))' "$2" "$dir/$1.map")
	t1=$(now)
	s1=$(srv_ms "$3")
	echo "$(( (t1 - t0) / 1000000 )) client $c server $((s1 - s0))"
}

# walk URI: the block-status walk alone, its wall time in ms.
walk() {
	/usr/bin/python3 - "$1" <<'EOF'
import sys, time
import nbd

ctx = "qemu:dirty-bitmap:b0"
h = nbd.NBD()
h.add_meta_context(ctx)
h.connect_uri(sys.argv[1])
size = h.get_size()
end = [0]


def cb(metacontext, offset, entries, err):
    if metacontext == ctx:
        end[0] = offset + sum(entries[0::2])
    return 0


t0 = time.monotonic()
off = 0
while off < size:
    h.block_status(min(size - off, 2 << 30), off, cb)
    if end[0] <= off:
        sys.exit("no progress at %d" % off)
    off = end[0]
print(int((time.monotonic() - t0) * 1000))
h.shutdown()
EOF
}

for r in $(seq "$ROUNDS"); do
	echo "iocore-nbd nbdinfo $(timed ioc "$IOC" "$dir/ioc.pid") walk $(walk "$IOC")"
	echo "qemu-nbd nbdinfo $(timed qemu "$QEMU" "$dir/qemu.pid") walk $(walk "$QEMU")"
done | tee "$dir/rows"
if cmp -s "$dir/ioc.map" "$dir/qemu.map"; then
	echo "maps identical ($(awk '$3 == 1' "$dir/ioc.map" | wc -l) dirty extents)"
else
	echo "MAPS DIFFER:"; diff "$dir/ioc.map" "$dir/qemu.map" | head -10
	exit 1
fi
med() { # SERVER COLUMN
	awk -v c="$1" -v k="$2" '$1 == c {print $k}' "$dir/rows" | sort -n |
		awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
for m in "nbdinfo 3" "nbdinfo-client-cpu 5" "nbdinfo-server-cpu 7" "walk 9"; do
	set -- $m
	mi=$(med iocore-nbd "$2")
	mq=$(med qemu-nbd "$2")
	printf 'median %-8s iocore-nbd %5s ms, qemu-nbd %5s ms: qemu-nbd/iocore-nbd %s\n' \
		"$1" "$mi" "$mq" \
		"$(awk -v a="$mi" -v b="$mq" 'BEGIN { if (a > 0) printf "%.2fx", b / a; else print "inf" }')"
done
