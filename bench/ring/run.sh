#!/bin/sh
# bench/ring/run.sh BUILD_DIR [--quick]
# Ring push+pop ns per element per regime (SPSC, MPSC, MPMC), single calls
# and bursts of 32, one thread ("single") and producer+consumer threads
# ("threaded"), iocore vs concurrencykit's ck_ring in the same binary.
# JSON rows on stdout, everything else on stderr.
set -u
BUILD=${1:?usage: run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
BIN="$BUILD/bench/ring/bench-ring"
if [ "$QUICK" = "--quick" ]; then SINGLE=5000000; THREADED=3000000; else SINGLE=50000000; THREADED=10000000; fi

for c in single threaded; do
	n=$SINGLE; [ "$c" = threaded ] && n=$THREADED
	for r in spsc mpsc mpmc; do
		for b in 1 32; do
			for impl in iocore ck; do
				if [ -x "$BIN" ]; then
					"$BIN" --case "$c" --regime "$r" --burst "$b" --impl "$impl" --total "$n" ||
						echo "bench-ring $c $r $b $impl failed" >&2
				else
					peer=false; name=iocore
					[ "$impl" = ck ] && { peer=true; name=ck_ring; }
					printf '{"suite":"ring","case":"%s","params":"regime=%s,burst=%s","impl":"%s","peer":%s,"metric":"ns/element","value":null,"better":"lower","cmd":"%s","error":"%s not built"}\n' \
						"$c" "$r" "$b" "$name" "$peer" "$BIN" "$BIN"
				fi
			done
		done
	done
done
