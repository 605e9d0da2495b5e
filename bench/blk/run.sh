#!/bin/bash
# bench/blk/run.sh BUILD_DIR [--quick]
#
# iocore-bench blk against qemu-img bench on the same 1 GiB raw image in
# /dev/shm (PEERS.md): 4 KiB requests, 64 in flight, io_uring and threads,
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

row() { # case params impl peer value cmd [error]
	local v=$5
	[ -z "$v" ] && v=null
	if [ -n "${7:-}" ]; then
		printf '{"suite":"blk","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"requests/s","value":%s,"better":"higher","cmd":"%s","error":"%s"}\n' \
			"$1" "$2" "$3" "$4" "$v" "$6" "$7"
	else
		printf '{"suite":"blk","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"requests/s","value":%s,"better":"higher","cmd":"%s"}\n' \
			"$1" "$2" "$3" "$4" "$v" "$6"
	fi
}

# iocore-bench --json prints requests_per_s.
run_ours() { # case params cmd...
	local c=$1 p=$2 out v
	shift 2
	out=$("$@" --json 2>&2) || { row "$c" "$p" "${IMPL:-iocore}" "${PEER:-false}" "" "$*" "iocore-bench failed"; return; }
	v=$(printf '%s\n' "$out" | sed -n 's/.*"requests_per_s":\([0-9.]*\).*/\1/p')
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
	out=$("$@" 2>&1) || { echo "$out" >&2; row "$c" "$p" qemu-img true "" "$*" "qemu-img bench failed"; return; }
	secs=$(printf '%s\n' "$out" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
	if [ -z "$secs" ]; then
		row "$c" "$p" qemu-img true "" "$*" "no timing in output"
		return
	fi
	v=$(awk -v n="$n" -v s="$secs" 'BEGIN { if (s > 0) printf "%.1f", n / s }')
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
		run_ours "$c" "$p" "$bench" blk -c $n_file -d 64 -s 4k $w -i $a -t writeback --fast-path off -f raw "$img"
		run_qemu "$c" "$p" $n_file qemu-img bench -f raw -t writeback -i $a -c $n_file -d 64 -s 4k $w "$img"
	done
done

p="driver=null,depth=64"
run_ours null "$p" "$bench" blk --driver null --null-size 1G -c $n_null -d 64
run_qemu null "$p" $n_null qemu-img bench -c $n_null -d 64 --image-opts driver=null-co,size=1G

# The fast path's own gain: reads from the page cache, with it on against
# the same run with it off (impl iocore-no-fast-path, marked as the peer of
# this comparison) and against qemu-img.
for a in io_uring threads; do
	p="aio=$a,cache=writeback,fast-path=on,depth=64"
	run_ours fast-path "$p" "$bench" blk -c $n_file -d 64 -s 4k -i $a -t writeback --fast-path on -f raw "$img"
	IMPL=iocore-no-fast-path PEER=true run_ours fast-path "$p" "$bench" blk -c $n_file -d 64 -s 4k -i $a -t writeback --fast-path off -f raw "$img"
	run_qemu fast-path "$p" $n_file qemu-img bench -f raw -t writeback -i $a -c $n_file -d 64 -s 4k "$img"
done
