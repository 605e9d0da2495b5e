#!/bin/sh
# Model-check src/loop/wakeup.pml (the loop's sleep/wake handshake) with
# spin, and check the model can fail: the same model without the loop's
# `sleeping = true` store must report a lost wakeup.  TAP on stdout.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/loop/wakeup.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 2 "wakeup model"
cp "$SRC" model.pml
if spin_verify model.pml -m100000; then
	echo "ok 1 - wakeup model: $(grep -o '[0-9]* states, stored' pan.log)"
else
	echo "not ok 1 - wakeup model"
	sed 's/^/# /' spin.log pan.log
	exit 1
fi
sed 's/^\(\t*\) *sleeping = true;.*$/\1skip;/' model.pml >mutant.pml
spin_expect_deadlock 2 model.pml mutant.pml "wakeup model without the sleeping store"
