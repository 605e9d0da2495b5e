#!/bin/sh
# Model-check src/co/comutex.pml (the CoMutex handshake) with spin, when
# spin and a C compiler are installed; TAP on stdout, exit 77 to skip.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/co/comutex.pml
echo "1..1"
if ! command -v spin >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
	echo "ok 1 - comutex model # SKIP spin not installed"
	exit 77
fi
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
cp "$SRC" . &&
spin -a comutex.pml >spin.log 2>&1 &&
cc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c >>spin.log 2>&1 &&
./pan -m1000000 >pan.log 2>&1
if grep -q "errors: 0" pan.log; then
	echo "ok 1 - comutex model: $(grep -o '[0-9]* states, stored' pan.log)"
	exit 0
fi
echo "not ok 1 - comutex model"
sed 's/^/# /' spin.log pan.log
exit 1
