#!/bin/sh
# Model-check src/loop/wakeup.pml (the loop's sleep/wake handshake and its
# free) with spin, and check that the model can fail: without the sleep
# marker the loop must lose a wakeup; without the free's wait for owed wakes,
# and in the earlier design (a sleeping flag loaded after the push), a
# producer must touch the freed loop.  TAP on stdout.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/loop/wakeup.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 4 "wakeup model"
cp "$SRC" model.pml
spin_expect_pass 1 model.pml "wakeup model" || exit 1
sed 's/-> marked = true; try = true/-> try = true/' model.pml >mutant.pml
spin_expect_deadlock 2 model.pml mutant.pml "wakeup model without the sleep marker"
sed '/^\twakes_done == owed;$/d' model.pml >mutant.pml
spin_expect_violation 3 model.pml mutant.pml "free without waiting for owed wakes"
{ echo '#define OLD_ORDER 1'; cat model.pml; } >mutant.pml
spin_expect_violation 4 model.pml mutant.pml "the earlier design (flag loaded after the push)"
