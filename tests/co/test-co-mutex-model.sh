#!/bin/sh
# Model-check src/co/comutex.pml (the CoMutex handshake) with spin, when
# spin and a C compiler are installed; TAP on stdout, exit 77 to skip.
# Two shapes keep it to about a second: 4 coroutines locking once each,
# and 2 coroutines locking 3 times (the file's own 3 x 2 takes ~6 s).
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/co/comutex.pml
echo "1..2"
if ! command -v spin >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
	echo "ok 1 - comutex model # SKIP spin not installed"
	echo "ok 2 - comutex model # SKIP spin not installed"
	exit 77
fi
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
fail=0
i=0
for shape in "4 1" "2 3"; do
	set -- $shape
	i=$((i + 1))
	sed -e "s/^#define N .*/#define N $1/" -e "s/^#define ROUNDS .*/#define ROUNDS $2/" \
		"$SRC" >comutex.pml
	if spin -a comutex.pml >spin.log 2>&1 &&
	   cc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c >>spin.log 2>&1 &&
	   ./pan -m1000000 >pan.log 2>&1 &&
	   grep -q "errors: 0" pan.log; then
		echo "ok $i - comutex model, $1 coroutines x $2 rounds: $(grep -o '[0-9]* states, stored' pan.log)"
	else
		echo "not ok $i - comutex model, $1 coroutines x $2 rounds"
		sed 's/^/# /' spin.log pan.log
		fail=1
	fi
done
exit $fail
