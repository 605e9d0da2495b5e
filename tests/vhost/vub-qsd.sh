#!/bin/bash
# Stands in for qemu-storage-daemon in tests/vhost/test-vhost-driver.sh, so
# that script's front end (iocore-bench vhost-blk) runs against the
# export: each --export type=vhost-user-blk becomes a vub-serve of its
# --blockdev (filename, read-only, discard), socket, writable and
# num-queues (and a serial from its id).  Other options are ignored.  Runs until SIGTERM, which it
# passes on; exits when every server has.
set -u
SRV=${IOC_BUILD_ROOT:-build}/tests/vhost/vub-serve
declare -A file ro disc
exports=()
while [ $# -gt 0 ]; do
	case $1 in
	--blockdev) spec=$2; shift 2
		name=$(echo "$spec" | sed -n 's/.*node-name=\([^,]*\).*/\1/p')
		file[$name]=$(echo "$spec" | sed -n 's/.*filename=\([^,]*\).*/\1/p')
		ro[$name]=$(echo "$spec" | grep -q 'read-only=on' && echo 1)
		disc[$name]=$(echo "$spec" | grep -q 'discard=unmap' && echo 1) ;;
	--export) exports+=("$2"); shift 2 ;;
	*) shift ;;
	esac
done
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
for spec in "${exports[@]}"; do
	node=$(echo "$spec" | sed -n 's/.*node-name=\([^,]*\).*/\1/p')
	path=$(echo "$spec" | sed -n 's/.*addr.path=\([^,]*\).*/\1/p')
	nq=$(echo "$spec" | sed -n 's/.*num-queues=\([0-9]*\).*/\1/p')
	id=$(echo "$spec" | sed -n 's/.*[,]id=\([^,]*\).*/\1/p')
	args=(--socket "$path" --file "${file[$node]}" --queues "${nq:-1}" --iothreads "${nq:-1}"
	      --serial "vub-$id")
	echo "$spec" | grep -q 'writable=on' || args+=(--read-only)
	[ -n "${ro[$node]:-}" ] && args+=(--read-only)
	[ -n "${disc[$node]:-}" ] && args+=(--node-opts ,discard=unmap)
	"$SRV" "${args[@]}" >/dev/null &
	pids+=($!)
done
wait "${pids[@]}"
wait "${pids[@]}" 2>/dev/null
exit 0
