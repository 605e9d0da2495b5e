# A thin front door to Meson.  The real build is meson.build.
#   make run     build, then serve the default image with iocore-nbd
#   make test    build, then run the whole suite
#   make bench   run the benchmarks against peers (QUICK=1 for a short run)
#   make soak    iocore-nbd under a mixed, checked load for SOAK_SECONDS (600)
#   make install install into PREFIX (default /usr/local), under DESTDIR if set
#   make check-aarch64   the suite cross-built for AArch64, run under qemu-aarch64
BUILD ?= build
MESON_OPTS ?=
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
export CC

.PHONY: all deps build run test install check-asan check-tsan check-aarch64 bench fuzz soak clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	meson setup $(BUILD) --prefix=$(PREFIX) $(MESON_OPTS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	@scripts/run.sh $(BUILD)

test: build
	@scripts/test.sh $(BUILD)

# meson install: binaries, libiocore, headers, pkg-config file, man pages
# and systemd units (README.md, "Installing").  A build directory set up
# for another prefix is moved to PREFIX first.  DESTDIR stages the files
# (for a package) without changing the paths inside them.
install: build
	@[ "$$(meson introspect --buildoptions $(BUILD) | python3 -c 'import json, sys; \
	   print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')" \
	   = "$(PREFIX)" ] || meson configure $(BUILD) -Dprefix=$(PREFIX)
	meson install -C $(BUILD)$(if $(DESTDIR), --destdir "$(abspath $(DESTDIR))")

# Sanitizer suites, each in its own build directory, debug build.
check-asan: deps
	@[ -f build-asan/build.ninja ] || meson setup build-asan -Dbuildtype=debug \
		-Db_sanitize=address,undefined -Db_lundef=false $(MESON_OPTS)
	ninja -C build-asan
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	 scripts/test.sh build-asan --timeout-multiplier 4

check-tsan: deps
	@[ -f build-tsan/build.ninja ] || meson setup build-tsan -Dbuildtype=debug \
		-Db_sanitize=thread -Db_lundef=false $(MESON_OPTS)
	ninja -C build-tsan
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/harness/tsan.supp \
	 scripts/test.sh build-tsan --timeout-multiplier 6

# The library and every module's tests cross-built for AArch64
# (cross/aarch64-linux-gnu.ini, Debian's :arm64 packages) in build-aarch64/
# and run under qemu-aarch64's user-mode emulation, where io_uring is
# refused: the loop runs on epoll and poll.  A64_SCALE (IOC_TEST_SCALE)
# sizes the stress tests' counts and time caps.  No benchmarks or fuzzers.
A64_SCALE ?= 2
check-aarch64: deps
	@[ -f build-aarch64/build.ninja ] || meson setup build-aarch64 \
		--cross-file cross/aarch64-linux-gnu.ini -Dbench=false -Dfuzz=false $(MESON_OPTS)
	ninja -C build-aarch64
	@IOC_TEST_SCALE=$(A64_SCALE) scripts/test.sh build-aarch64 --timeout-multiplier 6

bench: deps
	@QUICK=$(QUICK) scripts/bench.sh $(BUILD)

# iocore-nbd under verified readers and writers, TLS and plain clients,
# clients that leave mid-request, handshake floods, the connection limit and
# injected I/O errors, for SOAK_SECONDS (its last line is its verdict);
# then qcow2's differential run against qemu-io, scaled to SOAK_SECONDS, from a new start.
SOAK_SECONDS ?= 600
soak: build
	@[ -x $(BUILD)/tests/nbd/nbd-soak ] || { echo "nbd-soak not built (needs libnbd-dev)"; exit 1; }
	@$(BUILD)/tests/nbd/nbd-soak -b $(BUILD)/tools/nbd/iocore-nbd -s $(SOAK_SECONDS)
	@# qcow2's differential run against qemu-io, longer and from a new start.
	@[ ! -x $(BUILD)/tests/qcow2/test-qcow2-diff ] || \
	 IOC_SOURCE_ROOT=$(CURDIR) IOC_BUILD_ROOT=$(abspath $(BUILD)) \
	 IOC_TEST_SCALE=$$(( $(SOAK_SECONDS) / 10 + 1 )) IOC_Q2_DIFF_SEED=$$(date +%s) \
	 $(BUILD)/tests/qcow2/test-qcow2-diff

# libFuzzer targets (clang), each run FUZZ_SECONDS (default 20).
fuzz: deps
	@FUZZ_MESON_OPTS="$(MESON_OPTS)" scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-clang build-fuzz build-aarch64
