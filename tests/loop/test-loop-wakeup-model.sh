#!/bin/sh
# Model-check src/loop/wakeup.pml (the loop's sleep/wake handshake) with
# spin, and check the model can fail: the same model without the loop's
# `sleeping = true` store must report a lost wakeup.  TAP; 77 = skip.
set -u
SRC=${IOC_SOURCE_ROOT:?}/src/loop/wakeup.pml
echo "1..2"
if ! command -v spin >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
	echo "ok 1 - wakeup model # SKIP spin not installed"
	echo "ok 2 - wakeup model mutant # SKIP spin not installed"
	exit 77
fi
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
check() { # model.pml -> prints pan output
	spin -a "$1" >spin.log 2>&1 &&
	cc -O2 -DSAFETY -o pan pan.c >>spin.log 2>&1 &&
	./pan -m100000 >pan.log 2>&1
	cat spin.log pan.log
}
cp "$SRC" model.pml
if check model.pml | grep -q "errors: 0"; then
	echo "ok 1 - wakeup model: $(grep -o '[0-9]* states, stored' pan.log)"
else
	echo "not ok 1 - wakeup model"
	sed 's/^/# /' spin.log pan.log
	exit 1
fi
sed 's/^\(\t*\) *sleeping = true;.*$/\1skip;/' model.pml >mutant.pml
if check mutant.pml | grep -q "invalid end state"; then
	echo "ok 2 - wakeup model mutant finds the lost wakeup"
else
	echo "not ok 2 - mutant without the sleeping store passed"
	exit 1
fi
