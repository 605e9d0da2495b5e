# A thin front door to Meson.  The real build is meson.build.
#   make run     build, then serve the default image with iocore-nbd
#   make test    build, then run the whole suite
#   make bench   run the benchmarks against peers (QUICK=1 for a short run)
BUILD ?= build
MESON_OPTS ?=
CC ?= cc
export CC

.PHONY: all deps build run test check-asan check-tsan bench fuzz clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	@scripts/run.sh $(BUILD)

test: build
	@scripts/test.sh $(BUILD)

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
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	 scripts/test.sh build-tsan --timeout-multiplier 6

bench: deps
	@QUICK=$(QUICK) scripts/bench.sh $(BUILD)

# libFuzzer targets (clang), each run FUZZ_SECONDS (default 20).
fuzz: deps
	@scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-clang build-fuzz
