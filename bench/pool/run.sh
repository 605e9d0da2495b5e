#!/bin/sh
# bench/pool/run.sh BUILD_DIR [--quick]
# The thread pool against GLib's GThreadPool and libuv's uv_queue_work:
# 4 KiB preadv at 64 in flight from one loop (image in /dev/shm) and empty
# jobs, then the ablations of iocore's design steps, plus the ceiling: the
# same threads calling preadv themselves, with no pool.  One JSON row per line
# on stdout; everything else on stderr.
set -u
BUILD=${1:?usage: bench/pool/run.sh BUILD_DIR [--quick]}
QUICK=${2:-}
BIN="$BUILD/bench/pool/bench-pool"
HERE=$(dirname "$0")
SECS=2; ROUNDS=5
[ "$QUICK" = "--quick" ] && { SECS=1.2; ROUNDS=3; }
THREADS=4   # libuv's default pool size; every implementation gets the same

row_null() { # case params impl peer metric better error
	printf '{"suite":"pool","case":"%s","params":"%s","impl":"%s","peer":%s,"metric":"%s","value":null,"better":"%s","cmd":"%s","error":"%s"}\n' \
		"$1" "$2" "$3" "$4" "$5" "$6" "$BIN" "$7"
}

if [ ! -x "$BIN" ]; then
	for impl in iocore glib-gthreadpool libuv; do
		peer=true; [ $impl = iocore ] && peer=false
		row_null preadv "bs=4096,depth=64,threads=$THREADS,file=/dev/shm" $impl $peer requests/s higher "bench-pool not built"
		row_null empty "bs=0,depth=64,threads=$THREADS" $impl $peer ns/job lower "bench-pool not built"
	done
	exit 0
fi

DIR=/dev/shm
[ -w "$DIR" ] || DIR=${TMPDIR:-/tmp}
IMG=$(mktemp "$DIR/iocore-pool-bench.XXXXXX")
trap 'rm -f "$IMG"' EXIT INT TERM
# 64 MiB of data, fully in memory, so the reads measure the pool.
dd if=/dev/urandom of="$IMG" bs=1M count=64 status=none

run() {
	"$BIN" "$@" 2>&1 >&3 | sed 's/^/bench-pool: /' >&2
} 3>&1

# The comparisons run interleaved, several rounds, median per row
# (bench/ring/interleave.py): load from elsewhere on the shared machine then
# hits every implementation alike.  "bare" is no pool at all: the same
# number of threads calling preadv in a loop, the ceiling for everyone.
{
	for impl in iocore glib libuv bare; do
		echo "$BIN --impl $impl --case preadv --file $IMG --threads $THREADS --seconds $SECS"
	done
} | python3 "$HERE/../ring/interleave.py" "$ROUNDS"
{
	for impl in iocore glib libuv; do
		echo "$BIN --impl $impl --case empty --threads $THREADS --seconds $SECS"
	done
} | python3 "$HERE/../ring/interleave.py" "$ROUNDS"
# One design step off at a time (bench-pool.c lists them; bench/pool/NOTES.md
# has what they measured).
for v in default no-submit-batch no-complete-batch wake-always no-spin spin-busy no-lag-yield qemu-like max64 eager-spawn; do
	run --impl iocore --variant $v --case preadv --file "$IMG" --threads $THREADS --seconds $SECS
done
