#!/bin/bash
# bench/blk/run.sh BUILD_DIR [--quick]
#
# iocore-bench blk against qemu-img bench on the same 1 GiB raw image in
# /dev/shm: 4 KiB requests, 64 in flight, io_uring and threads,
# reads and writes, with --fast-path off (the runtime against the runtime),
# then the null driver against QEMU's null-co, then the fast path's own
# gain (iocore with it against iocore without it, and against qemu-img).
# One JSON row per line on stdout; everything else on stderr.
set -u
build=${1:?usage: run.sh BUILD_DIR [--quick]}
quick=0
[ "${2:-}" = "--quick" ] && quick=1
build=$(cd "$build" && pwd)
bench="$build/tools/bench/iocore-bench"

if [ $quick = 1 ]; then
	n_file=100000; n_null=1000000
else
	n_file=400000; n_null=2000000
fi

# Two rows per run: requests/s (wall clock, what qemu-img bench reports)
# and requests per CPU-second of the whole process (user + system time of
# every thread): the machine is shared, and a run that waits for a CPU
# loses wall-clock rate but not CPU efficiency.
row1() { # metric case params impl peer value cmd [error]
	local v=$6
	[ -z "$v" ] && v=null
	if [ -n "${8:-}" ]; then
		printf '{"suite":"blk","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"%s","value":%s,"better":"higher","cmd":"%s","error":"%s"}\n' \
			"$2" "$3" "$4" "$5" "$1" "$v" "$7" "$8"
	else
		printf '{"suite":"blk","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"%s","value":%s,"better":"higher","cmd":"%s"}\n' \
			"$2" "$3" "$4" "$5" "$1" "$v" "$7"
	fi
}

row() { # case params impl peer value cmd [error]; CPU rate in $cpu_rate
	row1 requests/s "$@"
	if [ -n "${7:-}" ]; then
		row1 requests/cpu-s "$1" "$2" "$3" "$4" "" "$6" "$7"
	elif [ -n "${cpu_rate:-}" ]; then
		row1 requests/cpu-s "$1" "$2" "$3" "$4" "$cpu_rate" "$6"
	else
		row1 requests/cpu-s "$1" "$2" "$3" "$4" "" "$6" "no CPU time measured"
	fi
}

# Run a command; its stdout goes to stdout, then a last line "CPU seconds"
# with the user + system time it and its threads used.
timed() {
	python3 - "$@" <<'PY'
import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.write(p.stdout)
print("CPU %.6f" % (r.ru_utime + r.ru_stime))
sys.exit(p.returncode)
PY
}

# requests / cpu seconds, or empty.
rate_of() { awk -v n="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.1f", n / s }'; }

# iocore-bench --json prints requests_per_s.
run_ours() { # case params count cmd...
	local c=$1 p=$2 n=$3 out v
	shift 3
	cpu_rate=
	out=$(timed "$@" --json) || { row "$c" "$p" "${IMPL:-iocore}" "${PEER:-false}" "" "$*" "iocore-bench failed"; return; }
	v=$(printf '%s\n' "$out" | sed -n 's/.*"requests_per_s":\([0-9.]*\).*/\1/p')
	cpu_rate=$(rate_of "$n" "$(printf '%s\n' "$out" | sed -n 's/^CPU //p')")
	row "$c" "$p" "${IMPL:-iocore}" "${PEER:-false}" "$v" "$*"
}

# qemu-img bench prints "Run completed in X seconds."; rate = count / X.
run_qemu() { # case params count cmd...
	local c=$1 p=$2 n=$3 out secs v
	shift 3
	if ! command -v qemu-img >/dev/null; then
		row "$c" "$p" qemu-img true "" "$*" "qemu-img not installed"
		return
	fi
	cpu_rate=
	out=$(timed "$@" 2>&1) || { echo "$out" >&2; row "$c" "$p" qemu-img true "" "$*" "qemu-img bench failed"; return; }
	cpu_rate=$(rate_of "$n" "$(printf '%s\n' "$out" | sed -n 's/^CPU //p')")
	secs=$(printf '%s\n' "$out" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
	if [ -z "$secs" ]; then
		row "$c" "$p" qemu-img true "" "$*" "no timing in output"
		return
	fi
	v=$(rate_of "$n" "$secs")
	row "$c" "$p" qemu-img true "$v" "$*"
}

if [ ! -x "$bench" ]; then
	echo "run.sh: $bench not built" >&2
	for c in read-4k write-4k; do
		for a in io_uring threads; do
			row "$c" "aio=$a,cache=writeback,fast-path=off,depth=64" iocore false "" "$bench" "iocore-bench not built"
		done
	done
	row null "driver=null,depth=64" iocore false "" "$bench" "iocore-bench not built"
	exit 0
fi

img=/dev/shm/iocore-blk-bench-$$.img
trap 'rm -f "$img"' EXIT
dd if=/dev/zero of="$img" bs=1M count=1024 status=none || exit 1

for c in read-4k write-4k; do
	w=""
	[ $c = write-4k ] && w="-w"
	for a in io_uring threads; do
		p="aio=$a,cache=writeback,fast-path=off,depth=64"
		run_ours "$c" "$p" $n_file "$bench" blk -c $n_file -d 64 -s 4k $w -i $a -t writeback --fast-path off -f raw "$img"
		run_qemu "$c" "$p" $n_file qemu-img bench -f raw -t writeback -i $a -c $n_file -d 64 -s 4k $w "$img"
	done
done

p="driver=null,depth=64"
run_ours null "$p" $n_null "$bench" blk --driver null --null-size 1G -c $n_null -d 64
run_qemu null "$p" $n_null qemu-img bench -c $n_null -d 64 --image-opts driver=null-co,size=1G

# The fast path's own gain: requests served from the page cache inline,
# with it on against the same run with it off (impl iocore-no-fast-path,
# marked as the peer of this comparison) and against qemu-img.  Reads use
# preadv2(RWF_NOWAIT) (or cachestat, or on tmpfs without swap a plain
# preadv); writes go inline only on tmpfs without swap.
for c in fast-path fast-path-write; do
	w=""
	[ $c = fast-path-write ] && w="-w"
	for a in io_uring threads; do
		p="aio=$a,cache=writeback,fast-path=on,depth=64"
		run_ours $c "$p" $n_file "$bench" blk -c $n_file -d 64 -s 4k $w -i $a -t writeback --fast-path on -f raw "$img"
		IMPL=iocore-no-fast-path PEER=true run_ours $c "$p" $n_file "$bench" blk -c $n_file -d 64 -s 4k $w -i $a -t writeback --fast-path off -f raw "$img"
		run_qemu $c "$p" $n_file qemu-img bench -f raw -t writeback -i $a -c $n_file -d 64 -s 4k $w "$img"
	done
done
