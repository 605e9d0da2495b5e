#!/bin/sh
# Install the Debian packages that iocore's build, tests and benchmarks need.
#
# Idempotent: when every package is already installed it does nothing and
# costs one dpkg-query, so a warm `make` stays fast.  As root (or with sudo)
# it runs `apt-get update` once and installs what is missing; otherwise it
# prints the exact command and exits non-zero.
#
# Usage: scripts/install-deps.sh [--print]
#   --print   list the packages and exit
set -eu

# Build: toolchain, Meson, the libraries libiocore links, and scdoc for
# the man pages.
BUILD="meson ninja-build pkg-config gcc clang libclang-rt-14-dev
       liburing-dev libzstd-dev zlib1g-dev libdeflate-dev libisal-dev libxxhash-dev
       libgnutls28-dev libjansson-dev scdoc librbd-dev"
# Tests: real clients and tools the integration tests drive (groff renders
# the man pages; systemd has systemd-socket-activate, systemd-analyze and
# systemd-escape for the units).
TEST="qemu-utils nbdkit fio libnbd-bin libnbd-dev zstd pigz gzip
      python3 xxd spin time gnutls-bin groff-base systemd
      qemu-system-common socat python3-libnbd
      ceph-mon ceph-osd ceph-mgr ceph-common qemu-block-extra"
# On x86-64, a cross compiler and qemu's user mode run the AArch64
# context switch (tests/co/test-co-switch-aarch64.sh), and with Debian's
# :arm64 development packages (multiarch) the whole suite (make
# check-aarch64, cross/aarch64-linux-gnu.ini).  libisal-dev is not
# co-installable for two architectures (not Multi-Arch: same), so the
# AArch64 build goes without ISA-L; installing it would remove the
# amd64 one, which is why that install runs with --no-remove.
CROSS=""
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
	# A Linux guest under TCG on the vhost-user-blk export (tests/vhost):
	# QEMU, a kernel with its virtio modules, busybox for the initramfs.
	TEST="$TEST qemu-system-x86 linux-image-amd64 busybox-static util-linux"
	TEST="$TEST gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
	CROSS="liburing-dev:arm64 libzstd-dev:arm64 zlib1g-dev:arm64
	       libdeflate-dev:arm64 libgnutls28-dev:arm64 libjansson-dev:arm64"
fi
# Benchmarks: the peers iocore is measured against, and the plotter.
BENCH="libuv1-dev libevent-dev libglib2.0-dev libboost-context-dev
       libck-dev gnuplot-nox g++"

PKGS=$(echo $BUILD $TEST $BENCH)
CROSS=$(echo $CROSS)

if [ "${1:-}" = "--print" ]; then
	echo "$PKGS${CROSS:+ $CROSS}"
	exit 0
fi

# not_installed PKG...: the ones dpkg does not have installed.
not_installed() {
	for p in "$@"; do
		st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
		case "$st" in
		*"ok installed") ;;
		*) printf ' %s' "$p" ;;
		esac
	done
}
# shellcheck disable=SC2086 # word splitting of the package lists is wanted
missing=$(not_installed $PKGS)
# shellcheck disable=SC2086
xmissing=$(not_installed $CROSS)
addarch=""
if [ -n "$CROSS" ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
	addarch=arm64
fi

[ -z "$missing$xmissing$addarch" ] && exit 0

echo "install-deps: missing Debian packages:$missing$xmissing" >&2

if [ "$(id -u)" -eq 0 ]; then
	SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	SUDO="sudo"
else
	echo "install-deps: not root; run this and retry:" >&2
	echo "  sudo sh -c '${addarch:+dpkg --add-architecture $addarch && }apt-get update &&" \
	     "apt-get install -y --no-install-recommends$missing$xmissing'" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
[ -n "$addarch" ] && $SUDO dpkg --add-architecture "$addarch"
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
if [ -n "$missing" ]; then
	# shellcheck disable=SC2086 # word splitting of the package list is wanted
	$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $missing
fi
if [ -n "$xmissing" ]; then
	# shellcheck disable=SC2086
	$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
		--no-remove $xmissing
fi
