#!/bin/sh
# Model-check src/zip/ordered-write.pml (worker_write()'s try-lock handoff)
# with spin, when spin and a C compiler are installed; TAP on stdout.
# Three shapes (blocks x slots), then the model with the recheck after the
# token release removed, which spin must reject: a test that the model can
# fail.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/zip/ordered-write.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 4 "ordered-write model"
fail=0
i=0
# check NAME SED-EXPR... : 0 when spin finds no error
check() {
	sed "$@" "$SRC" >m.pml && spin_verify m.pml -m1000000
}
for shape in "4 2" "5 3" "6 2"; do
	set -- $shape
	i=$((i + 1))
	if check -e "s/^#define K .*/#define K $1/" -e "s/^#define NS .*/#define NS $2/"; then
		echo "ok $i - ordered-write model, $1 blocks x $2 slots: $(grep -o '[0-9]* states, stored' pan.log)"
	else
		echo "not ok $i - ordered-write model, $1 blocks x $2 slots"
		sed 's/^/# /' spin.log pan.log
		fail=1
	fi
done
i=$((i + 1))
if check -e 's/:: ready\[wnext % NS\] -> goto again/:: ready[wnext % NS] -> skip/'; then
	echo "not ok $i - ordered-write model without the recheck: spin found no lost block"
	fail=1
elif grep -q "assertion violated" pan.log; then
	echo "ok $i - ordered-write model without the recheck loses a block (spin: assertion violated)"
else
	echo "not ok $i - ordered-write model without the recheck: spin did not run"
	sed 's/^/# /' spin.log pan.log
	fail=1
fi
exit $fail
