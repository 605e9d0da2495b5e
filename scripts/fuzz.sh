#!/bin/sh
# Build the libFuzzer targets (clang, -Dfuzz=true) and run each for a while.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 20; CI runs them briefly)
# FUZZ_MESON_OPTS: more options for the build's first setup (CI: -Dwerror=true).
# Corpora live in build-fuzz/corpus/<target>/ and grow across runs.
set -eu
secs=${1:-20}
dir=build-fuzz
[ -f $dir/build.ninja ] || CC=clang meson setup $dir -Dfuzz=true -Dbuildtype=debugoptimized ${FUZZ_MESON_OPTS:-}
ninja -C $dir
mkdir -p $dir/corpus
found=0
for exe in $(find $dir/tests -type f -perm -u+x -name 'fuzz-*' | sort); do
	name=$(basename "$exe")
	corpus=$dir/corpus/$name
	mkdir -p "$corpus"
	# Targets whose corpus test can write seeds get them.
	if [ "$name" = fuzz-nbd ] && [ -x $dir/tests/nbd/test-nbd-fuzz-corpus ]; then
		$dir/tests/nbd/test-nbd-fuzz-corpus --write-corpus "$corpus" >/dev/null
	fi
	if [ "$name" = fuzz-qmp ] && [ -x $dir/tests/nbd/test-nbd-fuzz-qmp ]; then
		$dir/tests/nbd/test-nbd-fuzz-qmp --write-corpus "$corpus" >/dev/null
	fi
	# The checked-in seeds of the zip targets (tests/zip/corpus/<target>/).
	seeds=tests/zip/corpus/${name#fuzz-zip-}
	if [ "${name#fuzz-zip-}" != "$name" ] && [ -d "$seeds" ]; then
		cp "$seeds"/* "$corpus"/
	fi
	# The migration stream's checked-in corpus (tests/migrate/corpus/<target>/,
	# written by test-migrate-fuzz-stream --write-corpus).
	start=tests/migrate/corpus/${name#fuzz-migrate-}
	if [ "${name#fuzz-migrate-}" != "$name" ] && [ -d "$start" ]; then
		cp "$start"/* "$corpus"/
	fi
	echo "=== $name: ${secs}s"
	log=$dir/corpus/$name.log
	if ! "$exe" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
			-artifact_prefix="$dir/corpus/$name-" "$corpus" >"$log" 2>&1; then
		tail -40 "$log"
		echo "fuzz: $name failed; the input is in $dir/corpus/$name-*" >&2
		exit 1
	fi
	tail -4 "$log"
	found=$((found + 1))
done
if [ $found -eq 0 ]; then
	echo "fuzz: no fuzz targets were built" >&2
	exit 1
fi
echo "fuzz: $found targets ran without a crash"
