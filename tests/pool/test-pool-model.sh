#!/bin/sh
# Model-check the pool's sleep/wake handshake (src/pool/pool-wake.pml) with
# spin: no job is stranded while every worker sleeps, and shutdown joins
# every worker.  TAP on stdout; skipped when spin or a C compiler is missing.
MODEL=${1:?usage: test-pool-model.sh path/to/pool-wake.pml}
CC=${CC:-cc}
echo "1..1"
if ! command -v spin >/dev/null 2>&1 || ! command -v "$CC" >/dev/null 2>&1; then
	echo "ok 1 - pool-wake model # SKIP spin or $CC not installed"
	exit 0
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ioc-pool-model.XXXXXX") || exit 1
trap 'rm -rf "$DIR"' EXIT
cp "$MODEL" "$DIR/model.pml"
cd "$DIR" || exit 1
if ! spin -a model.pml >spin.log 2>&1 ||
   ! "$CC" -O1 -DSAFETY -o pan pan.c >cc.log 2>&1; then
	echo "not ok 1 - pool-wake model (could not build the verifier)"
	sed 's/^/# /' spin.log cc.log
	exit 1
fi
./pan -m100000 >pan.log 2>&1
if grep -q "errors: 0" pan.log; then
	echo "ok 1 - pool-wake model"
	grep -E "states, stored|depth reached" pan.log | sed 's/^/# /'
	exit 0
fi
echo "not ok 1 - pool-wake model"
sed 's/^/# /' pan.log
exit 1
