#!/bin/sh
# libiocore.so exports only the public API (ioc_<module>_...), versioned,
# and the pkg-config file describes it.
lib="$IOC_BUILD_ROOT/libiocore.so"
echo "1..3"
if [ ! -f "$lib" ]; then
	echo "not ok 1 - $lib exists"; exit 1
fi
bad=$(nm -D --defined-only "$lib" | awk '$3 != "" && $3 !~ /^ioc_[a-z]/ && $3 !~ /^IOCORE_/ {print $3}')
if [ -z "$bad" ]; then echo "ok 1 - only ioc_* exported"; else
	echo "not ok 1 - unexpected exports:"; echo "$bad" | sed 's/^/# /'; fi
if nm -D --defined-only "$lib" | grep -q 'ioc_strerror@@IOCORE_0'; then
	echo "ok 2 - symbols carry version IOCORE_0"; else echo "not ok 2 - unversioned"; fi
pc="$IOC_BUILD_ROOT/meson-private/iocore.pc"
if grep -q '^Libs: .*-liocore' "$pc" 2>/dev/null; then echo "ok 3 - pkg-config file"; else
	echo "not ok 3 - pkg-config file $pc"; fi
