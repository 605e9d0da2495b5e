#!/bin/bash
# A real guest on the vhost-user-blk export: the Debian kernel under TCG
# (tests/harness/guest.sh) with QEMU's vhost-user-blk-pci on
# iocore-storage-daemon's --export type=vhost-user-blk.
#   boot 0: the harness itself, on qemu-storage-daemon's export (when it
#           is installed): a failure here is the harness's, not ours;
#   boot 1: two queues on two I/O threads, two vCPUs: size, queues,
#           serial, host data read, writes read back, a pattern for the
#           host to find, parallel I/O, 1 MiB requests, discard, the
#           write-cache switch (SET_CONFIG), flushes;
#   boot 2: the same server again (a new connection on the same export),
#           without EVENT_IDX and indirect descriptors: the pattern is
#           still there, parallel writers verify;
#   boot 3: a read-only export with 4 KiB logical blocks: RO and the
#           block size seen, reads work, writes refused.
# The server must log no ring fault.  Skips (77) only without QEMU, a
# kernel, its virtio modules or a static busybox.
set -u
. "$IOC_SOURCE_ROOT/tests/harness/guest.sh"
DAEMON=$IOC_BUILD_ROOT/tools/daemon/iocore-storage-daemon

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fail=1; }
fail=0

# Under ThreadSanitizer the guest's writes to its own buffers, made by
# another process, look like races on the memory we share with it.
if [ "${IOC_SANITIZER:-}" = thread ]; then
	echo "1..0 # SKIP a guest's memory is written by QEMU, which ThreadSanitizer cannot see"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi
if ! guest_check; then
	echo "1..0 # SKIP $GUEST_SKIP"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi

base=/tmp
[ -w /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/vhost-guest.XXXXXX")
srv_pid=
cleanup() {
	[ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

img=$dir/disk.img
truncate -s 64M "$img"
dd if=/dev/urandom of="$dir/host.bin" bs=1M count=1 2>/dev/null
dd if="$dir/host.bin" of="$img" bs=1M seek=8 conv=notrunc 2>/dev/null
host_md5=$(md5sum <"$dir/host.bin" | cut -d' ' -f1)
head -c 1048576 /dev/zero | tr '\000' 'A' >"$dir/A.bin"
a_md5=$(md5sum <"$dir/A.bin" | cut -d' ' -f1)

# start_server [--queues N] [--iothreads K] [--serial S] [--read-only]
# [--logical-block-size B]: iocore-storage-daemon exporting $img as a
# vhost-user-blk device on $dir/vub.sock, its queues spread over K I/O
# threads, in the background, until the socket is there (10 s at most).
start_server() {
	local q=1 k=0 serial= ro=false lbs=512 threads= i
	while [ $# -gt 0 ]; do
		case $1 in
		--queues) q=$2; shift ;;
		--iothreads) k=$2; shift ;;
		--serial) serial=$2; shift ;;
		--read-only) ro=true ;;
		--logical-block-size) lbs=$2; shift ;;
		esac
		shift
	done
	set --
	for i in $(seq 0 $((k - 1))); do
		set -- "$@" --object "iothread,id=io$i"
		threads="$threads${threads:+,}\"io$i\""
	done
	rm -f "$dir/vub.sock" "$dir/mon.sock"
	"$DAEMON" "$@" \
		--blockdev "{\"driver\":\"file\",\"node-name\":\"disk\",\"filename\":\"$img\",\"read-only\":$ro}" \
		--export "{\"type\":\"vhost-user-blk\",\"id\":\"vub\",\"node-name\":\"disk\",
			\"addr\":{\"type\":\"unix\",\"path\":\"$dir/vub.sock\"},\"writable\":$([ $ro = true ] && echo false || echo true),
			\"num-queues\":$q,\"logical-block-size\":$lbs${serial:+,\"__org.iocore_serial\":\"$serial\"}
			${threads:+,\"iothread\":[$threads]}}" \
		--chardev "socket,id=mon,path=$dir/mon.sock,server=on,wait=off" --monitor chardev=mon \
		>"$dir/srv.out" 2>>"$dir/srv.log" &
	srv_pid=$!
	for _ in $(seq 200); do
		[ -S "$dir/vub.sock" ] && [ -S "$dir/mon.sock" ] && return 0
		kill -0 "$srv_pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
# queue_requests: each queue's request count, from query-block-exports.
queue_requests() {
	python3 - "$dir/mon.sock" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile("rwb")
json.loads(f.readline())
f.write(b'{"execute":"qmp_capabilities"}\n{"execute":"query-block-exports"}\n'); f.flush()
json.loads(f.readline())
r = json.loads(f.readline())["return"][0]
print(" ".join(str(x) for x in r["__org.iocore_vhost-user-blk"]["queue-requests"]))
PY
}
stop_server() {
	kill "$srv_pid"
	for _ in $(seq 200); do
		kill -0 "$srv_pid" 2>/dev/null || break
		sleep 0.05
	done
	wait "$srv_pid"
	local rc=$?
	srv_pid=
	return $rc
}

# boot NAME NQ SMP [DEVICE_OPTS]: run the guest script $dir/NAME.sh; each
# "GUEST-OK x" or "GUEST-FAIL x" line becomes a TAP line.
boot() {
	local name=$1 nq=$2 smp=$3 rc
	guest_initramfs "$dir" "$dir/$name.sh"
	GUEST_SMP=$smp GUEST_DEVICE_OPTS=${4:-} guest_run "$dir" "$dir/vub.sock" "$nq" 150
	rc=$?
	cp "$dir/console.log" "$dir/$name.console"
	while read -r word what; do
		case $word in
		GUEST-OK) ok "$name: $what" ;;
		GUEST-FAIL) notok "$name: $what" ;;
		esac
	done < <(grep -a -o 'GUEST-\(OK\|FAIL\) .*' "$dir/console.log" | tr -d '\r')
	if [ $rc -eq 0 ] && grep -aq 'GUEST-DONE rc=0' "$dir/console.log"; then
		ok "$name: guest ran to the end"
	else
		notok "$name: guest ran to the end (qemu status $rc)"
		sed 's/^/# qemu: /' "$dir/qemu.log" | tail -5
		tr -d '\r' <"$dir/console.log" | sed 's/^/# console: /' | tail -25
	fi
}

# Two writers at once (one per vCPU, so one per queue), then both read
# back and compared.
parallel='t "parallel writers" "dd if=/dev/urandom of=/tmp/p1 bs=64k count=64 2>/dev/null &&
	dd if=/dev/urandom of=/tmp/p2 bs=64k count=64 2>/dev/null &&
	(dd if=/tmp/p1 of=/dev/vda bs=64k seek=512 oflag=direct 2>/dev/null &
	 dd if=/tmp/p2 of=/dev/vda bs=64k seek=640 oflag=direct 2>/dev/null; wait) &&
	dd if=/dev/vda of=/tmp/q1 bs=64k skip=512 count=64 iflag=direct 2>/dev/null &&
	dd if=/dev/vda of=/tmp/q2 bs=64k skip=640 count=64 iflag=direct 2>/dev/null &&
	cmp /tmp/p1 /tmp/q1 && cmp /tmp/p2 /tmp/q2"'
common='t() { if eval "$2"; then echo "GUEST-OK $1"; else echo "GUEST-FAIL $1"; fi; }
md5() { dd if=/dev/vda bs=1M skip=$1 count=1 iflag=direct 2>/dev/null | md5sum | cut -d" " -f1; }
'

cat >"$dir/boot1.sh" <<EOF
$common
t "capacity 64 MiB" '[ "\$(cat /sys/block/vda/size)" = 131072 ]'
t "two queues" '[ "\$(ls /sys/block/vda/mq | wc -l)" = 2 ]'
t "serial" '[ "\$(cat /sys/block/vda/serial)" = iocore-test ]'
t "writable" '[ "\$(cat /sys/block/vda/ro)" = 0 ]'
t "EVENT_IDX and indirect descriptors in use" '[ "\$(cut -c29-30 /sys/bus/virtio/devices/virtio0/features)" = 11 ]'
t "reads what the host wrote" '[ "\$(md5 8)" = $host_md5 ]'
t "writes read back" 'dd if=/dev/urandom of=/tmp/a bs=64k count=16 2>/dev/null &&
	dd if=/tmp/a of=/dev/vda bs=64k seek=32 oflag=direct 2>/dev/null &&
	dd if=/dev/vda of=/tmp/b bs=64k skip=32 count=16 iflag=direct 2>/dev/null && cmp /tmp/a /tmp/b'
t "1 MiB requests" 'dd if=/dev/urandom of=/tmp/c bs=1M count=4 2>/dev/null &&
	dd if=/tmp/c of=/dev/vda bs=1M seek=40 oflag=direct 2>/dev/null &&
	dd if=/dev/vda of=/tmp/d bs=1M skip=40 count=4 iflag=direct 2>/dev/null && cmp /tmp/c /tmp/d'
t "a pattern for the host" 'dd if=/dev/zero bs=4096 count=256 2>/dev/null | tr "\\000" A |
	dd of=/dev/vda bs=4096 seek=4096 oflag=direct conv=fsync 2>/dev/null'
t "parallel readers" '(dd if=/dev/vda of=/dev/null bs=4k count=2048 iflag=direct 2>/dev/null &
	dd if=/dev/vda of=/dev/null bs=4k skip=4096 count=2048 iflag=direct 2>/dev/null; wait)'
t "write cache on" '[ "\$(cat /sys/block/vda/queue/write_cache)" = "write back" ]'
t "write cache off (SET_CONFIG)" 'echo "write through" >/sys/block/vda/queue/write_cache &&
	dd if=/tmp/a of=/dev/vda bs=64k seek=48 count=4 oflag=direct 2>/dev/null &&
	echo "write back" >/sys/block/vda/queue/write_cache'
$parallel
t "discard" 'blkdiscard -o 50331648 -l 1048576 /dev/vda'
t "flush" 'sync && dd if=/tmp/a of=/dev/vda bs=4k count=1 seek=100 conv=fsync 2>/dev/null'
EOF

cat >"$dir/boot2.sh" <<EOF
$common
t "pattern still there" '[ "\$(md5 16)" = $a_md5 ]'
t "two queues again" '[ "\$(ls /sys/block/vda/mq | wc -l)" = 2 ]'
t "EVENT_IDX and indirect descriptors off" '[ "\$(cut -c29-30 /sys/bus/virtio/devices/virtio0/features)" = 00 ]'
$parallel
EOF

cat >"$dir/boot3.sh" <<EOF
$common
t "read-only" '[ "\$(cat /sys/block/vda/ro)" = 1 ]'
t "4 KiB logical blocks" '[ "\$(cat /sys/block/vda/queue/logical_block_size)" = 4096 ]'
t "reads" '[ "\$(md5 8)" = $host_md5 ]'
t "writes refused" '! dd if=/dev/zero of=/dev/vda bs=4k count=1 oflag=direct 2>/dev/null'
EOF

cat >"$dir/boot0.sh" <<EOF
$common
t "capacity 64 MiB" '[ "\$(cat /sys/block/vda/size)" = 131072 ]'
t "reads what the host wrote" '[ "\$(md5 8)" = $host_md5 ]'
EOF
if command -v qemu-storage-daemon >/dev/null 2>&1; then
	rm -f "$dir/vub.sock"
	qemu-storage-daemon --blockdev driver=file,node-name=f,filename="$img" \
		--export type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path="$dir/vub.sock",writable=off \
		>"$dir/qsd.log" 2>&1 &
	srv_pid=$!
	for _ in $(seq 200); do
		[ -S "$dir/vub.sock" ] && break
		sleep 0.05
	done
	boot boot0 1 1
	stop_server
else
	n=$((n + 1)); echo "ok $n - boot0: the harness on qemu-storage-daemon # SKIP not installed"
fi

if start_server --queues 2 --iothreads 2 --serial iocore-test; then
	ok "server started"
	boot boot1 2 2
	if cmp -s <(dd if="$img" bs=1M skip=16 count=1 2>/dev/null) "$dir/A.bin"; then
		ok "host: the guest's pattern is in the image"
	else
		notok "host: the guest's pattern is in the image"
	fi
	boot boot2 2 2 ,event_idx=off,indirect_desc=off
	# Both queues served requests (Linux maps each vCPU to one).
	read -r q0 q1 <<EOF2
$(queue_requests)
EOF2
	if stop_server; then ok "server exits on SIGTERM"; else notok "server exits on SIGTERM"; fi
	if [ "${q0:-0}" -gt 0 ] && [ "${q1:-0}" -gt 0 ]; then
		ok "both queues served requests ($q0, $q1)"
	else
		notok "both queues served requests (${q0:-none}, ${q1:-none})"
	fi
	grep '^io thread' "$dir/srv.log" | sed 's/^/# /'
else
	notok "server started"
	sed 's/^/# server: /' "$dir/srv.log"
fi

if start_server --read-only --logical-block-size 4096; then
	boot boot3 1 1
	stop_server || notok "read-only server exits on SIGTERM"
else
	notok "read-only server started"
fi

if grep -q 'stopped:\|closing the connection' "$dir/srv.log"; then
	notok "server logged no fault"
	sed 's/^/# server: /' "$dir/srv.log" | tail -20
else
	ok "server logged no fault"
fi
grep -c 'front end connected' "$dir/srv.log" | sed 's/^/# connections: /'
echo "1..$n"
exit $fail
