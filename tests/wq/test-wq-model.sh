#!/bin/sh
# Model-check src/wq/wq-sleep.pml (the workqueue's sleep/wake handshakes)
# with spin: the real protocol must pass, and each mutant that drops a
# re-check must fail (so the check itself can fail).  TAP on stdout.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/wq/wq-sleep.pml
. "$IOC_SOURCE_ROOT/tests/harness/spin-model.sh"
spin_setup 3 "wq-sleep model"

check() { # name expect(pass|fail) spin-defines...
	name=$1; expect=$2; shift 2
	rm -f pan pan.* ./*.trail
	if ! spin "$@" -a "$SRC" >spin.log 2>&1 || ! $CC -O1 -w -o pan pan.c >cc.log 2>&1; then
		echo "not ok - $name (could not build the verifier)"
		cat spin.log cc.log | sed 's/^/# /'
		return 1
	fi
	./pan -E >pan.log 2>&1
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | head -n 1)
	if [ -z "$errors" ]; then
		echo "not ok - $name (no verdict)"; sed 's/^/# /' pan.log; return 1
	fi
	if { [ "$expect" = pass ] && [ "$errors" = 0 ]; } ||
	   { [ "$expect" = fail ] && [ "$errors" != 0 ]; }; then
		echo "ok - $name (errors: $errors)"
		return 0
	fi
	echo "not ok - $name (errors: $errors, expected $expect)"
	sed 's/^/# /' pan.log
	return 1
}

rc=0
check "handshakes lose no wakeup" pass || rc=1
check "mutant: worker skips its re-check" fail -DBUG_NO_WORKER_RECHECK || rc=1
check "mutant: submitter skips its re-check" fail -DBUG_NO_SUBMITTER_RECHECK || rc=1
exit $rc
