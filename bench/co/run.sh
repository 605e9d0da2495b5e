#!/bin/sh
# bench/co/run.sh BUILD_DIR [--quick]
# Coroutines: QEMU's perf cases (lifecycle, nesting, yield, cost) with their
# iteration counts (a tenth for the long ones with --quick), the bare
# context switch against Boost.Context's jump_fcontext and glibc's
# swapcontext in the same binary (interleaved batches, so all three see the
# same CPU clock), and one coroutine per request, 64 in flight through the
# loop.  bench-co times the thread's CPU clock and
# reports the fastest batch (bench-co.c says why).  One JSON row per line
# on stdout; everything else on stderr.
set -u
BUILD=${1:?usage: bench/co/run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
BIN="$BUILD/bench/co/bench-co"

if [ "$QUICK" = "--quick" ]; then
	YIELD=10000000 COST=4000000 NEST=1000 SWITCH=10000000 REQ=1000000
else
	YIELD=100000000 COST=40000000 NEST=10000 SWITCH=50000000 REQ=4000000
fi

row_null() { # case params impl peer metric better error
	printf '{"suite":"co","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"%s","value":null,"better":"%s","cmd":"%s","error":"%s"}\n' \
		"$1" "$2" "$3" "$4" "$5" "$6" "$BIN" "$7"
}

if [ ! -x "$BIN" ]; then
	for impl in iocore boost-fcontext swapcontext; do
		peer=true; [ $impl = iocore ] && peer=false
		row_null switch pingpong=raw $impl $peer ns/switch lower "bench-co not built"
	done
	row_null lifecycle iters=1000000 iocore false ns/coroutine lower "bench-co not built"
	row_null nesting cycles=$NEST,depth=1000 iocore false ns/coroutine lower "bench-co not built"
	row_null yield iters=$YIELD iocore false ns/round-trip lower "bench-co not built"
	row_null cost iters=$COST iocore false ns/op lower "bench-co not built"
	row_null request inflight=64,io=none iocore false requests/s higher "bench-co not built"
	exit 0
fi

run() {
	"$BIN" "$@" 2>&1 >&3 | sed 's/^/bench-co: /' >&2
} 3>&1

run --case switch --iters $SWITCH	# iocore, boost-fcontext, swapcontext interleaved
run --case lifecycle --iters 1000000
run --case nesting --iters $NEST
run --case yield --iters $YIELD
run --case cost --iters $COST
run --case request --iters $REQ
run --case request --impl callbacks --iters $REQ
