#!/bin/sh
# tests/co/test-co-switch.c built for AArch64 and run under qemu-aarch64
# (tests/harness/run-aarch64.sh), so src/co/switch-aarch64.S is tested on
# an x86-64 host.
exec "${IOC_SOURCE_ROOT:?}/tests/harness/run-aarch64.sh" test-co-switch \
	tests/co/test-co-switch.c src/co/switch-aarch64.S -- -DIOC_CO_BACKEND_ASM=1 -lm
