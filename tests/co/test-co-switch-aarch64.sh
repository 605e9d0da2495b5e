#!/bin/sh
# tests/co/test-co-switch.c built for AArch64 with the cross compiler and
# run under qemu-aarch64 (user mode), so src/co/switch-aarch64.S is tested
# on an x86-64 host.  TAP on stdout, the test's own.  Without
# aarch64-linux-gnu-gcc or qemu-aarch64 it reports one skipped test: exit
# 77 alone, 0 under meson (IOC_TAP_ONLY, as tests/harness/tap.h).  On an
# AArch64 host meson runs the native build instead, and so does this.
set -u
ROOT=${IOC_SOURCE_ROOT:?}
XCC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
if [ "$(uname -m)" = aarch64 ]; then
	XCC=${CC:-cc}
	RUN=
elif command -v "$XCC" >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
	RUN=qemu-aarch64
else
	echo "1..1"
	echo "ok 1 - aarch64 context switch # SKIP $XCC or qemu-aarch64 not installed"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ioc-a64.XXXXXX") || exit 1
trap 'rm -rf "$DIR"' EXIT
if ! "$XCC" -std=gnu11 -O2 -Wall -Wextra -Werror -Wno-clobbered -static \
	-DIOC_CO_BACKEND_ASM=1 -I "$ROOT/tests/harness" -I "$ROOT/include" \
	-o "$DIR/test-co-switch" "$ROOT/tests/co/test-co-switch.c" \
	"$ROOT/src/co/switch-aarch64.S" -lm >"$DIR/cc.log" 2>&1; then
	echo "1..1"
	echo "not ok 1 - aarch64 context switch: the cross build failed"
	sed 's/^/# /' "$DIR/cc.log"
	exit 1
fi
exec $RUN "$DIR/test-co-switch"
