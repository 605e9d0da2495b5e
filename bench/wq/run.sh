#!/bin/sh
# bench/wq/run.sh BUILD_DIR [--quick]
# One submitter, 4 KiB page jobs (empty / checksum / zstd -1), throughput vs
# worker count 1..nproc for iocore's wq, GLib's GThreadPool and a plain
# mutex+condvar queue; plus the FILL / ROUND_ROBIN / LEAST_LOADED comparison
# (case "batching"), with every ring kept full and with a 16-job window.
# JSON rows on stdout, everything else on stderr.
set -u
BUILD=${1:?usage: run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
BIN="$BUILD/bench/wq/bench-wq"
NPROC=$(nproc)
if [ "$QUICK" = "--quick" ]; then SMALL=150000; LARGE=15000; else SMALL=1000000; LARGE=100000; fi

row_missing() { # case params impl peer
	printf '{"suite":"wq","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"jobs/s","value":null,"better":"higher","cmd":"%s","error":"%s not built"}\n' \
		"$1" "$2" "$3" "$4" "$BIN" "$BIN"
}

w=1
while [ "$w" -le "$NPROC" ]; do
	for c in empty crc4k compress4k; do
		n=$SMALL; [ "$c" = compress4k ] && n=$LARGE
		for impl in iocore glib mutex; do
			if [ -x "$BIN" ]; then
				"$BIN" --case "$c" --impl "$impl" --workers "$w" --jobs "$n" 2>&2 ||
					echo "bench-wq $c $impl $w failed" >&2
			else
				peer=true; name=glib-gthreadpool
				[ "$impl" = iocore ] && { peer=false; name=iocore; }
				[ "$impl" = mutex ] && name=mutex-condvar
				row_missing "$c" "workers=$w" "$name" "$peer"
			fi
		done
		if [ "$c" != empty ] && [ -x "$BIN" ]; then
			for p in fill rr ll; do
				"$BIN" --case "$c" --impl iocore --policy "$p" --variant \
					--workers "$w" --jobs "$n" ||
					echo "bench-wq batching $c $p $w failed" >&2
			done
		fi
	done
	# A small window (16 jobs in flight, rings of 64): where batching
	# (FILL) matters, since rings never fill.
	for c in empty crc4k; do
		[ -x "$BIN" ] || break
		for impl in iocore glib mutex; do
			"$BIN" --case "$c" --impl "$impl" --workers "$w" --inflight 16 \
				--jobs "$SMALL" || echo "bench-wq $c $impl $w K=16 failed" >&2
		done
		for p in fill rr ll; do
			"$BIN" --case "$c" --impl iocore --policy "$p" --variant \
				--workers "$w" --inflight 16 --jobs "$SMALL" ||
				echo "bench-wq batching $c $p $w K=16 failed" >&2
		done
	done
	w=$((w + 1))
done
