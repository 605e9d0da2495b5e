#!/bin/sh
# bench/nbd/backup.sh BUILD_DIR [SIZE] [ROUNDS]
#
# An incremental backup against a full one, side by side in the same run:
# iocore-nbd serves a raw image (SIZE, default 4G, every byte written, no
# holes) with a dirty bitmap b0 added on its control socket; a full
# backup is taken with nbdcopy; then 1% of the image's 64 KiB blocks,
# picked at random, are rewritten through NBD.  Each round then times
#   - full:        nbdcopy of the whole image into a new file;
#   - incremental: scripts/nbd-incremental-backup, which reads b0's map
#                  and copies only the dirty extents into the first backup;
# and checks both copies against the image.  Prints each round, the medians
# and full/incremental.  Everything lives in /dev/shm (three times SIZE)
# and is removed at exit.  Not part of make test.
set -eu
BUILD=$(cd "$1" && pwd)
SIZE=${2:-4G}
ROUNDS=${3:-3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SRV="$BUILD/tools/nbd/iocore-nbd"
CTL="$BUILD/tools/ctl/iocore-ctl"
INC="$SRC/scripts/nbd-incremental-backup"
command -v nbdcopy >/dev/null || { echo "backup.sh: nbdcopy missing" >&2; exit 1; }
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
	{ echo "backup.sh: libnbd's Python bindings (python3-libnbd) missing" >&2; exit 1; }
dir=$(mktemp -d /dev/shm/ioc-backup-bench.XXXXXX)
cleanup() {
	[ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
URI="nbd+unix:///disk?socket=$dir/nbd.sock"

# The image: distinct data in every MiB (no zeros for a copier to skip).
truncate -s "$SIZE" "$dir/disk.img"
/usr/bin/python3 - "$dir/disk.img" <<'EOF'
import os, struct, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
size = os.fstat(fd).st_size
block = bytearray(os.urandom(1 << 20))
for off in range(0, size, 1 << 20):
    block[0:8] = struct.pack("<Q", off + 1)
    os.pwrite(fd, block[:min(1 << 20, size - off)], off)
os.close(fd)
EOF

"$SRV" --fork --pid-file "$dir/pid" -U "$dir/nbd.sock" -x disk \
	--control "$dir/ctl.sock" "$dir/disk.img"
"$CTL" -s "$dir/ctl.sock" block-dirty-bitmap-add node=disk name=b0 >/dev/null
nbdcopy "$URI" "$dir/backup.img"

# 1% of the 64 KiB blocks rewritten, 64 writes in flight.
/usr/bin/python3 - "$URI" <<'EOF'
import os, random, sys
import nbd

BLK = 64 << 10
h = nbd.NBD()
h.connect_uri(sys.argv[1])
n = h.get_size() // BLK
buf = nbd.Buffer.from_bytearray(bytearray(os.urandom(BLK)))
for b in random.Random(4096).sample(range(n), n // 100):
    while h.aio_in_flight() >= 64:
        h.poll(-1)
    h.aio_pwrite(buf, b * BLK, completion=lambda err: 1)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
h.shutdown()
print("%d of %d blocks of 64 KiB rewritten" % (n // 100, n), flush=True)
EOF

now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }
for r in $(seq "$ROUNDS"); do
	rm -f "$dir/full.img"
	t0=$(now)
	nbdcopy "$URI" "$dir/full.img"
	t1=$(now)
	out=$("$INC" "$URI" b0 "$dir/backup.img")
	t2=$(now)
	for f in full backup; do
		cmp -s "$dir/$f.img" "$dir/disk.img" ||
			{ echo "backup.sh: $f.img differs from the image" >&2; exit 1; }
	done
	echo "full $(ms "$t0" "$t1") incremental $(ms "$t1" "$t2") ($out)"
done | tee "$dir/rows"
med() { # COLUMN
	awk -v k="$1" '{print $k}' "$dir/rows" | sort -n |
		awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
mf=$(med 2)
mi=$(med 4)
printf 'median full nbdcopy %s ms, incremental %s ms: full/incremental %s\n' "$mf" "$mi" \
	"$(awk -v a="$mi" -v b="$mf" 'BEGIN { if (a > 0) printf "%.1fx", b / a; else print "inf" }')"
