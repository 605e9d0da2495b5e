#!/bin/sh
# run-aarch64.sh NAME SOURCE... [-- CFLAGS/LIBS...]
# Build a self-contained TAP test (sources relative to the source root)
# for AArch64 with the cross compiler, statically, and run it under
# qemu-aarch64 (user mode), so AArch64 code paths are tested on x86-64
# machines too.  TAP on stdout, the test's own.  Without
# aarch64-linux-gnu-gcc or qemu-aarch64 it reports one skipped test: exit
# 77 alone, 0 under meson (IOC_TAP_ONLY, as tests/harness/tap.h).  On an
# AArch64 host it builds and runs natively.  qemu-user runs guest threads
# on the host's stronger memory order, so this checks that the code builds
# and works on AArch64, not that its barriers suffice.
set -u
ROOT=${IOC_SOURCE_ROOT:?}
NAME=${1:?usage: run-aarch64.sh NAME SOURCE... [-- FLAGS...]}
shift
SRCS=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
	SRCS="$SRCS $ROOT/$1"
	shift
done
[ "${1:-}" = "--" ] && shift
XCC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
if [ "$(uname -m)" = aarch64 ]; then
	XCC=${CC:-cc}
	RUN=
elif command -v "$XCC" >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1; then
	RUN=qemu-aarch64
else
	echo "1..1"
	echo "ok 1 - $NAME on aarch64 # SKIP $XCC or qemu-aarch64 not installed"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ioc-a64.XXXXXX") || exit 1
trap 'rm -rf "$DIR"' EXIT
# The generated ioc-config.h only describes the host's optional libraries;
# what these tests include of it is architecture-neutral.
# shellcheck disable=SC2086
if ! "$XCC" -std=gnu11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -Wno-clobbered -static \
	-I "$ROOT/tests/harness" -I "$ROOT/include" -I "${IOC_BUILD_ROOT:-$ROOT/build}" \
	-o "$DIR/$NAME" $SRCS "$@" >"$DIR/cc.log" 2>&1; then
	echo "1..1"
	echo "not ok 1 - $NAME on aarch64: the cross build failed"
	sed 's/^/# /' "$DIR/cc.log"
	exit 1
fi
$RUN "$DIR/$NAME"
