#!/bin/sh
# Model-check src/loop/wakeup.pml (the loop's sleep/wake handshake) with
# spin, and check the model can fail: the same model without the loop's
# `sleeping = true` store must report a lost wakeup.  TAP on stdout.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/loop/wakeup.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 2 "wakeup model"
cp "$SRC" model.pml
spin_expect_pass 1 model.pml "wakeup model" || exit 1
sed 's/^\(\t*\) *sleeping = true;.*$/\1skip;/' model.pml >mutant.pml
spin_expect_deadlock 2 model.pml mutant.pml "wakeup model without the sleeping store"
