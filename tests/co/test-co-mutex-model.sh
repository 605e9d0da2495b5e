#!/bin/sh
# Model-check src/co/comutex.pml (the CoMutex handshake) with spin, when
# spin and a C compiler are installed; TAP on stdout.
# Two shapes keep it to about a second: 4 coroutines locking once each,
# and 2 coroutines locking 3 times (the file's own 3 x 2 takes ~6 s).
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/co/comutex.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 2 "comutex model"
fail=0
i=0
for shape in "4 1" "2 3"; do
	set -- $shape
	i=$((i + 1))
	sed -e "s/^#define N .*/#define N $1/" -e "s/^#define ROUNDS .*/#define ROUNDS $2/" \
		"$SRC" >comutex.pml
	if spin_verify comutex.pml -m1000000 -DCOLLAPSE; then
		echo "ok $i - comutex model, $1 coroutines x $2 rounds: $(grep -o '[0-9]* states, stored' pan.log)"
	else
		echo "not ok $i - comutex model, $1 coroutines x $2 rounds"
		sed 's/^/# /' spin.log pan.log
		fail=1
	fi
done
exit $fail
