#!/bin/sh
# Run every module's benchmarks against its peers and write one report.
#
# Usage: scripts/bench.sh [BUILD_DIR]          (make bench, make bench QUICK=1)
#
# Environment:
#   QUICK=1        short run: fewer repeats, each bench/<mod>/run.sh gets --quick
#   REPEATS=N      repeats of every module's run (default 3; 1 with QUICK=1)
#   BENCH_ONLY="loop wq"   run only these modules (default: every bench/*/run.sh)
#   BENCH_TIMEOUT=S        seconds one run.sh may take before it is killed
#                          (default 180 with QUICK=1, 900 otherwise)
#   BENCH_SRC=DIR          where the <mod>/run.sh scripts are (default bench/;
#                          for testing this runner with fake modules)
#
# What it does, in order:
#   1. scripts/install-deps.sh (installs every peer from Debian when missing);
#   2. makes sure BUILD_DIR is configured and built (a failed build is reported
#      loudly but does not stop the run: each run.sh reports what it cannot run);
#   3. runs every bench/<mod>/run.sh BUILD_DIR [--quick], REPEATS times.  The
#      repeat loop is outermost (loop, wq, ..., then loop, wq, ... again), so a
#      burst of load from elsewhere on the machine spreads over modules instead
#      of spoiling every repeat of one of them;
#   4. collects stdout rows into BUILD_DIR/bench/rows.jsonl (each row gains
#      "module" and "repeat"), keeps stderr in BUILD_DIR/bench/logs/, and
#      records each run's exit status and time in BUILD_DIR/bench/runs.jsonl;
#   5. scripts/bench-report.py writes BUILD_DIR/bench/report.md and the PNG
#      plots in BUILD_DIR/bench/plots/.
#
# Nothing is dropped silently: a line on stdout that is not a JSON row, a run
# that exits non-zero or times out, and a peer row with "value": null all show
# up in the report.
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case "$build" in
/*) ;;
*) build="$PWD/$build" ;;
esac

case "${QUICK:-}" in
"" | 0 | no | false) quick=0 ;;
*) quick=1 ;;
esac
if [ "$quick" = 1 ]; then
	repeats=${REPEATS:-1}
	timeout_s=${BENCH_TIMEOUT:-180}
	quick_arg="--quick"
else
	repeats=${REPEATS:-3}
	timeout_s=${BENCH_TIMEOUT:-900}
	quick_arg=""
fi

log() { printf 'bench: %s\n' "$*" >&2; }
now() { date +%s; }

# leftovers SINCE: "pid args" of live processes whose command line mentions
# the build dir and that started at or after SINCE (epoch seconds).
leftovers() {
	boot=$(awk '/^btime/ { print $2 }' /proc/stat 2>/dev/null)
	hz=$(getconf CLK_TCK 2>/dev/null || echo 100)
	[ -n "$boot" ] || return 0
	for p in /proc/[0-9]*; do
		pid=${p#/proc/}
		[ "$pid" = "$$" ] && continue
		args=$( { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
		case "$args" in
		*"$build/"*) ;;
		*) continue ;;
		esac
		# Field 22 of stat is the start time in clock ticks after boot;
		# strip "pid (comm) " first, since comm may contain spaces.
		st=$(sed 's/^.*) //' "$p/stat" 2>/dev/null | awk '{ print $20 }')
		state=$(sed 's/^.*) //' "$p/stat" 2>/dev/null | awk '{ print $1 }')
		if [ -n "$st" ] && [ "$state" != Z ] && [ $((boot + st / hz)) -ge "$1" ]; then
			printf '%s %s\n' "$pid" "$args"
		fi
	done
}

t_start=$(now)
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)
src=${BENCH_SRC:-$here/bench}

# 1. Peers.
deps_ok=1
if ! "$here/scripts/install-deps.sh"; then
	deps_ok=0
	log "install-deps.sh failed: some peers may be missing; their rows will say so"
fi

# 2. Build.  Its output goes to BUILD_DIR/bench/logs/build.log as well.
out="$build/bench"
build_ok=1
if [ ! -f "$build/build.ninja" ]; then
	log "configuring $build"
	# shellcheck disable=SC2086 # MESON_OPTS is a list of options
	meson setup "$build" "$here" ${MESON_OPTS:-} >&2 || build_ok=0
fi
mkdir -p "$out/raw" "$out/logs" "$out/plots"
rm -f "$out"/raw/*.jsonl "$out"/logs/*.log "$out"/plots/*.png "$out"/plots/*.dat \
	"$out"/plots/*.gp "$out/rows.jsonl" "$out/runs.jsonl" "$out/invalid.txt" \
	"$out/leftovers.txt"
if [ "$build_ok" = 1 ]; then
	# -k 0: build every target that can be built, so one broken test does
	# not leave the benchmarks of every other module unbuilt.
	ninja -C "$build" -j"${NINJA_JOBS:-2}" -k 0 >"$out/logs/build.log" 2>&1 || build_ok=0
	tail -n 3 "$out/logs/build.log" >&2
fi
[ "$build_ok" = 1 ] || log "WARNING: the build failed (see $out/logs/build.log); benches run with what was built"

: >"$out/runs.jsonl"

# 3. Which modules have a runner.  The order follows the layers.
modules=""
skipped=""
all_mods=""
for d in "$src"/*/; do
	all_mods="$all_mods $(basename "$d")"
done
order="ring loop co pool wq blk nbd qcow2 zip"
for m in $all_mods; do
	case " $order " in
	*" $m "*) ;;
	*) order="$order $m" ;;
	esac
done
for m in $order; do
	[ -d "$src/$m" ] || continue
	[ "$m" = common ] && continue # shared helpers (bench/common/bench.h), not a module
	if [ -n "${BENCH_ONLY:-}" ]; then
		case " $BENCH_ONLY " in
		*" $m "*) ;;
		*) continue ;;
		esac
	fi
	if [ -x "$src/$m/run.sh" ]; then
		modules="$modules $m"
	elif [ -f "$src/$m/run.sh" ]; then
		skipped="$skipped $m:not-executable"
		log "skipping $m: bench/$m/run.sh is not executable"
	else
		skipped="$skipped $m:no-run.sh"
		log "skipping $m: no bench/$m/run.sh"
	fi
done
for s in $skipped; do
	printf '{"module":"%s","repeat":0,"status":"skipped","why":"%s"}\n' \
		"${s%%:*}" "${s#*:}" >>"$out/runs.jsonl"
done

# A run.sh that hangs must not eat the whole budget.  timeout(1) (without
# --foreground) signals the whole process group it leads, so servers a run.sh
# started (qemu-nbd, nbdkit) get the SIGTERM too; -k sends SIGKILL 10 s later.
have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1

rep=1
while [ "$rep" -le "$repeats" ]; do
	for m in $modules; do
		raw="$out/raw/$m.$rep.jsonl"
		err="$out/logs/$m.$rep.log"
		log "run $rep/$repeats: bench/$m/run.sh $quick_arg"
		t0=$(now)
		if [ "$have_timeout" = 1 ]; then
			(cd "$here" && timeout -k 10 "$timeout_s" "$src/$m/run.sh" "$build" $quick_arg) \
				>"$raw" 2>"$err" </dev/null
		else
			(cd "$here" && "$src/$m/run.sh" "$build" $quick_arg) >"$raw" 2>"$err" </dev/null
		fi
		rc=$?
		t1=$(now)
		# A server a run.sh started and forgot (a daemon escapes timeout's
		# process group) would load the machine for every later run: name it.
		# Only processes running something from this build dir and started
		# during this run are reported; they are not killed (a `make run`
		# of the same build may be serving on purpose).
		left=$(leftovers "$t0")
		if [ -n "$left" ]; then
			log "  WARNING: bench/$m/run.sh left processes running:"
			printf '%s\n' "$left" | sed 's/^/    /' >&2
			printf '%s\n' "$left" | sed "s/^/$m.$rep: /" >>"$out/leftovers.txt"
		fi
		status=ok
		[ "$rc" = 0 ] || status=failed
		[ "$rc" = 124 ] || [ "$rc" = 137 ] && [ "$have_timeout" = 1 ] && status=timeout
		nrows=$(grep -c . "$raw" 2>/dev/null || true)
		printf '{"module":"%s","repeat":%d,"status":"%s","rc":%d,"seconds":%d,"lines":%d,"timeout":%d}\n' \
			"$m" "$rep" "$status" "$rc" "$((t1 - t0))" "${nrows:-0}" "$timeout_s" >>"$out/runs.jsonl"
		log "  $m: $status (exit $rc), ${nrows:-0} lines, $((t1 - t0)) s"
		[ "$status" = ok ] || tail -n 5 "$err" | sed 's/^/    /' >&2
	done
	rep=$((rep + 1))
done

t_end=$(now)

# 4+5. Collect and report.
python3 "$here/scripts/bench-report.py" \
	--out "$out" --repo "$here" --build "$build" \
	--quick "$quick" --repeats "$repeats" --seconds "$((t_end - t_start))" \
	--deps-ok "$deps_ok" --build-ok "$build_ok" --load-start "$load_start"
rc=$?
total=$(($(now) - t_start))
log "report: $out/report.md (total $total s)"
# The budget of `make bench QUICK=1` is 5 minutes (one repeat).
if [ "$quick" = 1 ] && [ "$total" -gt $((300 * repeats)) ]; then
	log "WARNING: the QUICK run took $total s, over its budget of 5 minutes per repeat"
fi
exit $rc
