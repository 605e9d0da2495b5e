#!/bin/sh
# Model-check the pool's sleep/wake handshake (src/pool/pool-wake.pml) with
# spin: no job is stranded while every worker sleeps, and shutdown joins
# every worker.  Then check that the check can fail: a spinner that goes to
# sleep without re-checking the queue under the lock must deadlock.  TAP on
# stdout; skipped when spin or a C compiler is missing.
set -u
MODEL=${1:?usage: test-pool-model.sh path/to/pool-wake.pml}
. "${IOC_SOURCE_ROOT:?}/tests/harness/spin-model.sh"
spin_setup 2 "pool-wake model"
cp "$MODEL" model.pml
spin_expect_pass 1 model.pml "pool-wake model" || exit 1
# The line after `spun = 1;` is the spinner's `goto top`, its re-check.
sed '/spun = 1;/{n;s/goto top/skip/;}' model.pml >mutant.pml
spin_expect_deadlock 2 model.pml mutant.pml "pool-wake model without the spinner's re-check"
