#!/bin/sh
# bench/nbd/dirty.sh BUILD_DIR [SECONDS] [ROUNDS]
#
# The cost of change tracking on the write path: fio's nbd engine, 4 KiB
# random writes at iodepth 64 over one Unix-socket connection, against
# iocore-nbd with no dirty bitmap, with one (64 KiB granules), and with one
# persistent bitmap (whose first write to each granule waits for the
# sidecar's fdatasync).  The image (1 GiB, raw) is in /dev/shm.  Rounds
# interleave the three so drift on a shared machine hits them alike; it
# prints each run's IOPS and the median per case.  Not part of make test.
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
	iops=$(fio --name=w --ioengine=nbd --uri="nbd+unix:///disk?socket=$dir/nbd.sock" \
		--rw=randwrite --bs=4k --iodepth=64 --size=1G --time_based \
		--runtime="$SECS" --ramp_time=1 --output-format=terse --terse-version=3 |
		awk -F';' 'NF > 50 {print $49}')
	kill "$(cat "$dir/pid")"
	while [ -f "$dir/pid" ]; do sleep 0.05; done
	echo "$1 $iops"
}

for r in $(seq "$ROUNDS"); do
	for c in none one persistent; do run $c; done
done | tee "$dir/rows"
for c in none one persistent; do
	printf 'median %-10s %s IOPS\n' "$c" \
		"$(awk -v c=$c '$1 == c {print $2}' "$dir/rows" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
done
