#!/bin/sh
# bench/nbd/dirty.sh BUILD_DIR [SECONDS] [ROUNDS]
#
# The cost of change tracking on the write path: fio's nbd engine, 4 KiB
# random writes at iodepth 64 over one Unix-socket connection, against
# iocore-nbd with no dirty bitmap, with one (64 KiB granules), and with one
# persistent bitmap (whose first write to each granule waits for the
# sidecar's fdatasync).  The image (1 GiB, raw) is in /dev/shm.  Rounds
# interleave the three so drift on a shared machine hits them alike; it
# prints each run's IOPS and server CPU per write, the medians per case and
# their ratios to no bitmap.  Not part of make test.
set -eu
BUILD=$(cd "$1" && pwd)
SECS=${2:-8}
ROUNDS=${3:-3}
SRV="$BUILD/tools/nbd/iocore-nbd"
CTL="$BUILD/tools/ctl/iocore-ctl"
dir=$(mktemp -d /dev/shm/ioc-dirty-bench.XXXXXX)
trap '[ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null; rm -rf "$dir"' EXIT

run() { # CASE
	rm -f "$dir"/disk.img*
	truncate -s 1G "$dir/disk.img"
	"$SRV" --fork --pid-file "$dir/pid" -U "$dir/nbd.sock" -x disk \
		--control "$dir/ctl.sock" "$dir/disk.img"
	case $1 in
	one) "$CTL" -s "$dir/ctl.sock" block-dirty-bitmap-add node=disk name=b0 >/dev/null ;;
	persistent) "$CTL" -s "$dir/ctl.sock" block-dirty-bitmap-add node=disk name=b0 \
		persistent=true >/dev/null ;;
	esac
	pid=$(cat "$dir/pid")
	t0=$(cpu_ticks "$pid")
	iops=$(fio --name=w --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/nbd.sock" \
		--rw=randwrite --bs=4k --iodepth=64 --size=1G --time_based \
		--runtime="$SECS" --output-format=terse --terse-version=3 |
		awk -F';' 'NF > 50 {print $49}')
	t1=$(cpu_ticks "$pid")
	kill "$pid"
	while [ -f "$dir/pid" ]; do sleep 0.05; done
	# The server's CPU time per write, in us: less sensitive to what else
	# runs on the machine than IOPS.
	echo "$1 $iops $(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n="$iops" -v s="$SECS" \
		'BEGIN { printf "%.2f", d * 1e6 / hz / (n * s) }')"
}

HZ=$(getconf CLK_TCK)
cpu_ticks() { # PID: user + system time in clock ticks
	awk '{print $14 + $15}' "/proc/$1/stat"
}

for r in $(seq "$ROUNDS"); do
	for c in none one persistent; do run $c; done
done | tee "$dir/rows"
med() { # CASE COLUMN
	awk -v c="$1" -v k="$2" '$1 == c {print $k}' "$dir/rows" | sort -n |
		awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
for c in none one persistent; do
	printf 'median %-10s %s IOPS, %s us of server CPU per write\n' "$c" \
		"$(med $c 2)" "$(med $c 3)"
done
for c in one persistent; do
	awk -v c=$c -v i0="$(med none 2)" -v i1="$(med $c 2)" -v u0="$(med none 3)" \
		-v u1="$(med $c 3)" 'BEGIN { printf "%-10s vs none: IOPS %.3fx, CPU per write %.3fx (target: IOPS >= 0.97x)\n", c, i1 / i0, u1 / u0 }'
done
