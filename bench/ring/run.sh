#!/bin/sh
# bench/ring/run.sh BUILD_DIR [--quick]
# Ring push+pop ns per element per regime (SPSC, MPSC, MPMC), single calls
# and bursts of 32, one thread ("single") and producer+consumer threads
# ("threaded"), iocore vs concurrencykit's ck_ring in the same binary.
# The two run interleaved for several rounds; each row is the median
# (interleave.py).  JSON rows on stdout, everything else on stderr.
set -u
BUILD=${1:?usage: run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
HERE=$(dirname "$0")
BIN="$BUILD/bench/ring/bench-ring"
if [ "$QUICK" = "--quick" ]; then
	ROUNDS=3; SINGLE=2000000; THREADED=1000000
else
	ROUNDS=5; SINGLE=10000000; THREADED=2000000
fi

for c in single threaded; do
	n=$SINGLE; [ "$c" = threaded ] && n=$THREADED
	for r in spsc mpsc mpmc; do
		for b in 1 32; do
			if [ ! -x "$BIN" ]; then
				for impl in iocore:false ck_ring:true; do
					printf '{"suite":"ring","case":"%s","params":"regime=%s,burst=%s","impl":"%s","peer":%s,"metric":"ns/element","value":null,"better":"lower","cmd":"%s","error":"%s not built"}\n' \
						"$c" "$r" "$b" "${impl%%:*}" "${impl##*:}" "$BIN" "$BIN"
				done
				continue
			fi
			for impl in iocore ck; do
				echo "$BIN --case $c --regime $r --burst $b --impl $impl --total $n"
			done | python3 "$HERE/interleave.py" "$ROUNDS"
		done
	done
done
