#!/bin/sh
# iocore-bench vhost-blk against qemu-storage-daemon's vhost-user-blk
# export: the handshake and config, every request type (read, write,
# flush, get-id, discard, write-zeroes with and without UNMAP) with the
# data checked both through the driver (--verify, read-back) and against
# the image file itself with cmp; two queues, indirect descriptors,
# polling, two devices at once; and the malformed requests of --bad,
# after each of which the daemon must still be running and serving.
# What the daemon answers to those is printed, and asserted only where
# the virtio spec says what it must be.  TAP output; no waits without a
# bound, no assertions on timing.
set -u
BUILD=${IOC_BUILD_ROOT:-build}
DRV="$BUILD/tools/bench/iocore-bench"
QSD=${QSD:-qemu-storage-daemon}

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
skip_all() {
	echo "1..0 # SKIP $1"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
}
# check NAME COMMAND...: the command must succeed; its output shows if not.
check() {
	name=$1; shift
	if out=$("$@" 2>&1); then ok "$name"; else
		notok "$name"; echo "$out" | sed 's/^/# /' | tail -20; fi
}

[ -x "$DRV" ] || skip_all "iocore-bench not built"
command -v "$QSD" >/dev/null 2>&1 || skip_all "qemu-storage-daemon not installed"
command -v cmp >/dev/null 2>&1 || skip_all "cmp not installed"

base=/tmp
[ -w /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/ioc-vhost-drv.XXXXXX") || exit 1
qsd_pid=
cleanup() {
	if [ -n "$qsd_pid" ]; then
		kill "$qsd_pid" 2>/dev/null
		wait "$qsd_pid" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
trap 'exit 1' INT TERM

img="$dir/disk.img"
roimg="$dir/ro.img"
sock="$dir/rw.sock"
rosock="$dir/ro.sock"
MiB=1048576
truncate -s 64M "$img"
truncate -s 16M "$roimg"
head -c $MiB /dev/urandom >"$dir/rnd"
head -c $MiB /dev/zero >"$dir/zero"

# start AIO: the daemon with a writable export (two queues, discard
# passed down to the file) and a read-only one; waits (10 s at most) until
# both sockets exist.
start() {
	rm -f "$sock" "$rosock"
	"$QSD" --blockdev driver=file,node-name=f,filename="$img",aio="$1",discard=unmap \
		--blockdev driver=file,node-name=r,filename="$roimg",aio="$1",read-only=on \
		--export type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path="$sock",writable=on,num-queues=2 \
		--export type=vhost-user-blk,id=o,node-name=r,addr.type=unix,addr.path="$rosock",writable=off \
		>"$dir/qsd.log" 2>&1 &
	qsd_pid=$!
	i=0
	while [ $i -lt 200 ]; do
		[ -S "$sock" ] && [ -S "$rosock" ] && return 0
		kill -0 "$qsd_pid" 2>/dev/null || break
		sleep 0.05; i=$((i + 1))
	done
	kill "$qsd_pid" 2>/dev/null
	wait "$qsd_pid" 2>/dev/null
	qsd_pid=
	return 1
}

# drv ARGS...: the driver, bounded by its own --timeout and by timeout(1).
drv() { timeout 60 "$DRV" vhost-blk --timeout 10000 "$@"; }
# imgcmp FILE OFFSET LEN: FILE's first LEN bytes are the image's at OFFSET.
imgcmp() { cmp -n "$3" -i "0:$2" "$1" "$img"; }
alive() { kill -0 "$qsd_pid" 2>/dev/null; }

if ! start io_uring && ! start threads; then
	echo "1..1"
	echo "not ok 1 - qemu-storage-daemon did not start:"
	sed 's/^/# /' "$dir/qsd.log"
	exit 1
fi
ok "qemu-storage-daemon listens on both sockets"

# the handshake and the config space.
if out=$(drv --socket "$sock" --info --json) &&
   echo "$out" | grep -q '"capacity":67108864,' &&
   echo "$out" | grep -q '"num_queues":2,'; then
	ok "--info: capacity 64 MiB, 2 queues"
else
	notok "--info: capacity 64 MiB, 2 queues"; echo "# $out"
fi
if out=$(drv --socket "$rosock" --info --json) && echo "$out" | grep -q '"read_only":true'; then
	ok "--info: the read-only export offers VIRTIO_BLK_F_RO"
else
	notok "--info: the read-only export offers VIRTIO_BLK_F_RO"; echo "# $out"
fi

# write a pattern, read it back and check it, in several ring set-ups.
check "--verify 4k depth 16" \
	drv --socket "$sock" --verify --count 2000 --depth 16 --size 4k -q
check "--verify 64k on 2 queues with indirect descriptors" \
	drv --socket "$sock" --verify --count 256 --depth 8 --size 64k --queues 2 \
	--indirect --offset 8M --seed 2 -q
check "--verify 1M polling, without EVENT_IDX" \
	drv --socket "$sock" --verify --count 16 --depth 4 --size 1M --poll \
	--no-event-idx --offset 32M --seed 3 -q
check "--verify 512-byte requests at depth 1" \
	drv --socket "$sock" --verify --count 300 --depth 1 --size 512 --offset 60M --seed 4 -q

# what --verify wrote is in the image file: read it through the driver
# and compare with the file directly.
check "--verify's data read back equals the image file" sh -c '
	"$1" vhost-blk --socket "$2" --op read --offset 8M --length 1M --output "$3/v" &&
	cmp -n 1048576 -i 0:8388608 "$3/v" "$4"' sh "$DRV" "$sock" "$dir" "$img"

# the benchmark loop's access patterns complete with status OK.
for rw in randread randwrite mix; do
	if out=$(drv --socket "$sock" --rw $rw --count 3000 --depth 32 --offset 40M \
			--range 16M --json) &&
	   echo "$out" | grep -q '"requests":3000,' &&
	   echo "$out" | grep -q '"status":{"ok":3000,"ioerr":0'; then
		ok "--rw $rw: 3000 requests, all OK"
	else
		notok "--rw $rw: 3000 requests, all OK"; echo "# $out"
	fi
done
check "--rw write 64k on 2 queues, polling" \
	drv --socket "$sock" --rw write --count 400 --depth 16 --size 64k --queues 2 \
	--poll --offset 40M --range 16M -q

# a single write and read with data from a file, against the image.
W=3145728
check "--op write: 1 MiB of random data at 3 MiB" \
	drv --socket "$sock" --op write --offset $W --length 1M --input "$dir/rnd"
check "the image file holds the data written" imgcmp "$dir/rnd" $W $MiB
check "--op read returns it" sh -c '
	"$1" vhost-blk --socket "$2" --op read --offset 3M --length 1M --output "$3/r" &&
	cmp "$3/r" "$3/rnd"' sh "$DRV" "$sock" "$dir"

# flush and get-id.
check "--op flush" drv --socket "$sock" --op flush
if out=$(drv --socket "$sock" --op get-id --json) &&
   echo "$out" | grep -q '"outcome":"ok"' && echo "$out" | grep -q '"id":"[^"]'; then
	ok "--op get-id returns an id ($(echo "$out" | sed 's/.*"id":"\([^"]*\)".*/\1/'))"
else
	notok "--op get-id returns an id"; echo "# $out"
fi

# discard and write-zeroes (with and without UNMAP) read back as
# zeroes, through the driver and in the file; the bytes around them keep
# the random data.
zcheck() { # NAME OFFSET(bytes) OP-ARGS...
	name=$1 off=$2; shift 2
	check "$name" drv --socket "$sock" "$@" --offset $off --length 64k
	if "$DRV" vhost-blk --socket "$sock" --op read --offset $off --length 64k \
			--output "$dir/z" >/dev/null 2>&1 &&
	   cmp -n 65536 "$dir/z" "$dir/zero" && imgcmp "$dir/zero" $off 65536; then
		ok "$name: reads back zeroes, and the image holds zeroes"
	else
		notok "$name: reads back zeroes, and the image holds zeroes"
	fi
}
zcheck "--op discard 64k" $((W + 0)) --op discard
zcheck "--op write-zeroes 64k" $((W + 131072)) --op write-zeroes
zcheck "--op write-zeroes --unmap 64k" $((W + 262144)) --op write-zeroes --unmap
check "the data between the zeroed ranges is untouched" sh -c '
	cmp -n 65536 -i 65536:$((3145728 + 65536)) "$1" "$2" &&
	cmp -n 65536 -i 196608:$((3145728 + 196608)) "$1" "$2" &&
	cmp -n 720896 -i 327680:$((3145728 + 327680)) "$1" "$2"' sh "$dir/rnd" "$img"

# two devices at once (one thread per ring of each); the read-only
# device refuses a write with IOERR.
check "two devices, randread" \
	drv --socket "$sock" --socket "$rosock" --rw randread --count 2000 --depth 16 \
	--range 16M -q
check "write to the read-only device: IOERR (--bad write-ro)" \
	drv --socket "$rosock" --bad write-ro --expect-status ioerr

# requests past the end fail with IOERR, an unknown type with
# UNSUPP; without --expect-status the driver exits non-zero on either.
check "a read past the end: IOERR, and the device still serves" sh -c '
	out=$("$1" vhost-blk --socket "$2" --bad past-end --expect-status ioerr) &&
	echo "$out" | grep -q "served"' sh "$DRV" "$sock"
check "an unknown request type: UNSUPP" \
	drv --socket "$sock" --bad bad-type --expect-status unsupp
if drv --socket "$sock" --op read --offset 64M --length 4k >/dev/null 2>&1; then
	notok "the driver exits non-zero when a request fails"
else
	ok "the driver exits non-zero when a request fails"
fi

# malformed descriptor chains.  A back-end may fail the request or
# drop the connection (the spec lets a device treat them as fatal); it
# must neither crash nor stop serving other connections.
for kind in desc-oob desc-loop len-wrap "status-size short-header no-status head-oob avail-jump straddle-end"; do
	res=""
	for k in $kind; do
		out=$("$DRV" vhost-blk --socket "$sock" --bad $k --expect-status any \
			--timeout 1000 2>&1)
		res="$res $k: ${out#*: };"
	done
	if alive && drv --socket "$sock" --op read --length 4k >/dev/null 2>&1; then
		ok "--bad $kind: the daemon survives and serves a new connection"
	else
		notok "--bad $kind: the daemon survives and serves a new connection"
	fi
	echo "# $res"
done

# the rings stop cleanly on the way out; the daemon reported nothing
# but the malformed requests.
if alive && drv --socket "$sock" --verify --count 64 --depth 8 --seed 9 -q >/dev/null; then
	ok "a last --verify after the malformed requests"
else
	notok "a last --verify after the malformed requests"
fi
sed 's/^/# qemu-storage-daemon: /' "$dir/qsd.log" | head -20
echo "1..$n"
