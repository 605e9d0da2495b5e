#!/bin/sh
# Model-check the source engine's sleep/wake handshake
# (src/migrate/engine-wake.pml) with spin: no kick is lost and eng_wake is
# posted once per sleep.  Then check that the check can fail: a kick that
# leaves no mark on a running engine, and an engine that sleeps over a
# mark, must each deadlock.  TAP on stdout; skipped when spin or a C
# compiler is missing.
set -u
MODEL=${1:?usage: test-mig-engine-model.sh path/to/engine-wake.pml}
. "${IOC_SOURCE_ROOT:?}/tests/harness/spin-model.sh"
spin_setup 3 "engine-wake model"
cp "$MODEL" model.pml
spin_expect_pass 1 model.pml "engine-wake model" || exit 1
sed 's|:: else -> state = KICKED  /\* a mark for the engine \*/|:: else -> skip|' \
	model.pml >mutant1.pml
spin_expect_deadlock 2 model.pml mutant1.pml "engine-wake model, a kick without a mark" || rc=1
sed 's|:: state == KICKED -> kicked = 1 /\* KICKED: no sleep \*/|:: state == KICKED -> state = SLEEPING; asleep = 1|' \
	model.pml >mutant2.pml
spin_expect_deadlock 3 model.pml mutant2.pml "engine-wake model, sleeping over a mark" || rc=1
exit ${rc:-0}
