#!/bin/sh
# bench/wq/run.sh BUILD_DIR [--quick]
# One submitter, 4 KiB page jobs (empty / checksum / zstd -1), throughput vs
# worker count 1..nproc for iocore's wq, GLib's GThreadPool and a plain
# mutex+condvar queue; plus the FILL / ROUND_ROBIN / LEAST_LOADED comparison
# (case "batching"), with every ring kept full and with a 16-job window,
# and for one worker the ceiling (ceiling-inline: the jobs run by the
# submitter itself, no queue, the rate the work alone allows one thread).
# The implementations of one comparison run interleaved, several rounds,
# and each row is the median (bench/ring/interleave.py): the machine is
# shared, and load that comes and goes should hit every implementation.
# JSON rows on stdout, everything else on stderr.
set -u
BUILD=${1:?usage: run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
HERE=$(dirname "$0")
BIN="$BUILD/bench/wq/bench-wq"
NPROC=$(nproc)
# Enough jobs that thread start and the first sleeps do not dominate: 50k
# empty jobs took 2-8 ms, where one worker starting on its submitter's CPU
# could cut the rate threefold; 300k run for 15-100 ms.
if [ "$QUICK" = "--quick" ]; then
	ROUNDS=3; SMALL=300000; LARGE=10000
else
	ROUNDS=5; SMALL=1000000; LARGE=40000
fi

if [ ! -x "$BIN" ]; then
	for c in empty crc4k compress4k; do
		for impl in iocore:false glib-gthreadpool:true mutex-condvar:true; do
			printf '{"suite":"wq","case":"%s","params":"workers=1","impl":"%s","peer":%s,"metric":"jobs/s","value":null,"better":"higher","cmd":"%s","error":"%s not built"}\n' \
				"$c" "${impl%%:*}" "${impl##*:}" "$BIN" "$BIN"
		done
	done
	exit 0
fi

# commands CASE WORKERS JOBS [EXTRA...]: one comparison's command lines.
commands() {
	c=$1; w=$2; n=$3; shift 3
	for impl in iocore glib mutex; do
		echo "$BIN --case $c --impl $impl --workers $w --jobs $n $*"
	done
	# The ceiling of one worker: the submitter doing the jobs itself.
	if [ "$w" = 1 ] && [ "$c" != empty ]; then
		echo "$BIN --case $c --impl inline --workers 1 --jobs $n $*"
	fi
	if [ "$c" != empty ]; then
		for p in fill rr ll; do
			echo "$BIN --case $c --impl iocore --policy $p --variant --workers $w --jobs $n $*"
		done
	fi
}

w=1
while [ "$w" -le "$NPROC" ]; do
	for c in empty crc4k compress4k; do
		n=$SMALL; [ "$c" = compress4k ] && n=$LARGE
		commands "$c" "$w" "$n" | python3 "$HERE/../ring/interleave.py" "$ROUNDS"
	done
	# A small window (16 jobs in flight, rings of 64): where batching
	# (FILL) matters, since the rings never fill.
	for c in empty crc4k; do
		commands "$c" "$w" "$SMALL" --inflight 16 | python3 "$HERE/../ring/interleave.py" "$ROUNDS"
	done
	w=$((w + 1))
done
