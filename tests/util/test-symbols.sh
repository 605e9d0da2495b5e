#!/bin/sh
# libiocore.so exports only the public API (ioc_<module>_...), versioned,
# needs none of the daemon layers' libraries, and the pkg-config file
# describes it.
lib="$IOC_BUILD_ROOT/libiocore.so"
echo "1..4"
if [ ! -f "$lib" ]; then
	echo "not ok 1 - $lib exists"; exit 1
fi
bad=$(nm -D --defined-only "$lib" | awk '$3 != "" && $3 !~ /^ioc_[a-z]/ && $3 !~ /^IOCORE_/ {print $3}')
if [ -z "$bad" ]; then echo "ok 1 - only ioc_* exported"; else
	echo "not ok 1 - unexpected exports:"; echo "$bad" | sed 's/^/# /'; fi
if nm -D --defined-only "$lib" | grep -q 'ioc_strerror@@IOCORE_1'; then
	echo "ok 2 - symbols carry version IOCORE_1"; else echo "not ok 2 - unversioned"; fi
pc="$IOC_BUILD_ROOT/meson-private/iocore.pc"
if grep -q '^Libs: .*-liocore' "$pc" 2>/dev/null; then echo "ok 3 - pkg-config file"; else
	echo "not ok 3 - pkg-config file $pc"; fi
# The runtime alone: a program linking libiocore for the loop does not
# pull in the daemon layers' libraries.
heavy=$(readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | grep -E 'gnutls|jansson|rbd')
if [ -z "$heavy" ]; then echo "ok 4 - no GnuTLS, jansson or librbd needed"; else
	echo "not ok 4 - libiocore.so needs:"; echo "$heavy" | sed 's/^/# /'; fi
