#!/bin/bash
# A back end killed with kill -9 under a guest's writes, restarted on the
# same socket and image: the guest must not notice but for a pause.
#
# The guest (tests/harness/guest.sh, QEMU's vhost-user-blk-pci on a
# chardev with reconnect=1, two queues on two vCPUs and the daemon's two
# I/O threads) runs fio: two jobs of random 4 KiB writes at depth 32,
# each block with a crc32c header, then a second fio that reads every
# block back and checks it (verify_only).  Meanwhile the host kills
# iocore-storage-daemon with SIGKILL up to three times while the writes
# run, each time once the daemon has served some requests, and starts it
# again on the same socket and image.  QEMU reconnects, hands back the
# inflight region (SET_INFLIGHT_FD), and the daemon resubmits what the
# dead one had taken and not completed.  A request lost, run twice out of
# order or completed twice shows as a verify error, an I/O error or a
# guest that hangs (the run is bounded by a timeout).
#
# What QEMU 7.2 sends, as seen here: GET_INFLIGHT_FD then SET_INFLIGHT_FD
# at each start of the device (SeaBIOS's, then Linux's: a reset drops
# the region), before the rings' messages; after a reconnect
# SET_INFLIGHT_FD alone, with the region it kept, and SET_VRING_BASE from
# the used index (its GET_VRING_BASE to the dead daemon failed: "ring
# restore failed").
#
# How many requests each restart resubmitted is reported, not asserted:
# whether a kill lands with requests in flight is a matter of timing.
# Skips (77) only without QEMU, a kernel, its virtio modules, a static
# busybox or fio.
set -u
. "$IOC_SOURCE_ROOT/tests/harness/guest.sh"
DAEMON=$IOC_BUILD_ROOT/tools/daemon/iocore-storage-daemon

n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fail=1; }
skip_all() {
	echo "1..0 # SKIP $1"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
}

# Under ThreadSanitizer the guest's writes to its own buffers, made by
# another process, look like races on the memory we share with it.
[ "${IOC_SANITIZER:-}" = thread ] &&
	skip_all "a guest's memory is written by QEMU, which ThreadSanitizer cannot see"
guest_check || skip_all "$GUEST_SKIP"
FIO=$(command -v fio) || skip_all "fio not installed"

base=/tmp
[ -w /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/vhost-reconnect.XXXXXX")
srv_pid=
qemu_pid=
cleanup() {
	[ -n "$srv_pid" ] && kill -9 "$srv_pid" 2>/dev/null
	[ -n "$qemu_pid" ] && kill -9 "$qemu_pid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$dir" "$img"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# The image on a disk with O_DIRECT, and a flush every 16 writes, so that
# requests take long enough in the back end to be in flight at a kill
# (on tmpfs each completes before the guest posts the next).
img=$(mktemp /var/tmp/vhost-reconnect.XXXXXX.img)
truncate -s 128M "$img"

# start_server: the daemon on $dir/vub.sock (a socket a killed one left
# there is stale and replaced), until its sockets are there (10 s at most).
start_server() {
	rm -f "$dir/mon.sock"
	"$DAEMON" --object iothread,id=io0 --object iothread,id=io1 \
		--blockdev "driver=file,node-name=disk,filename=$img,aio=io_uring,cache.direct=on" \
		--export "{\"type\":\"vhost-user-blk\",\"id\":\"vub\",\"node-name\":\"disk\",
			\"addr\":{\"type\":\"unix\",\"path\":\"$dir/vub.sock\"},\"writable\":true,
			\"num-queues\":2,\"iothread\":[\"io0\",\"io1\"]}" \
		--chardev "socket,id=mon,path=$dir/mon.sock,server=on,wait=off" --monitor chardev=mon \
		>>"$dir/srv.out" 2>>"$dir/srv.log" &
	srv_pid=$!
	for _ in $(seq 200); do
		[ -S "$dir/mon.sock" ] && return 0
		kill -0 "$srv_pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
# requests: virtio-blk requests the running daemon completed (0 when its
# monitor does not answer).
requests() {
	python3 - "$dir/mon.sock" <<'PY' 2>/dev/null || echo 0
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
f = s.makefile("rwb")
json.loads(f.readline())
f.write(b'{"execute":"qmp_capabilities"}\n{"execute":"query-block-exports"}\n'); f.flush()
json.loads(f.readline())
r = json.loads(f.readline())["return"][0]
print(sum(r["__org.iocore_vhost-user-blk"]["queue-requests"]))
PY
}
# wait_console WORD SECONDS: until the guest printed WORD (bounded).
wait_console() {
	local deadline=$((SECONDS + $2))
	while [ $SECONDS -lt $deadline ]; do
		grep -aq "$1" "$dir/console.log" 2>/dev/null && return 0
		kill -0 "$qemu_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

job="--name=w --filename=/dev/vda --thread --direct=1 --ioengine=libaio --iodepth=32
	--bs=4k --size=48M --numjobs=2 --offset_increment=48M --rw=randwrite
	--verify=crc32c --verify_fatal=1 --randrepeat=1 --fsync=16"
job=$(echo $job)
cat >"$dir/guest.sh" <<EOF
t() { if eval "\$2"; then echo "GUEST-OK \$1"; else echo "GUEST-FAIL \$1"; fi; }
echo GUEST-LOAD-START
t "fio writes through the kills" 'fio $job --do_verify=0 >/tmp/w.log 2>&1 || { tail -20 /tmp/w.log; false; }'
echo GUEST-WRITES-DONE
t "every block reads back with its crc32c" 'fio $job --verify_only >/tmp/v.log 2>&1 || { tail -20 /tmp/v.log; false; }'
EOF
GUEST_BINARIES=$FIO guest_initramfs "$dir" "$dir/guest.sh"

if ! start_server; then
	notok "server started"
	sed 's/^/# server: /' "$dir/srv.log"
	echo "1..$n"
	exit 1
fi
ok "server started"
GUEST_SMP=2 GUEST_CHARDEV_OPTS=,reconnect=1 guest_run "$dir" "$dir/vub.sock" 2 240 &
qemu_pid=$!

kills=0
if wait_console GUEST-LOAD-START 120; then
	for k in 1 2 3; do
		# Some requests served by this daemon, the writes still running
		# (60 s at most), then the kill.
		served=0
		deadline=$((SECONDS + 60))
		while [ $SECONDS -lt $deadline ]; do
			grep -aq GUEST-WRITES-DONE "$dir/console.log" && break
			served=$(requests)
			[ "$served" -ge 1500 ] && break
			sleep 0.1
		done
		grep -aq GUEST-WRITES-DONE "$dir/console.log" && break
		kill -9 "$srv_pid"
		wait "$srv_pid" 2>/dev/null
		kills=$((kills + 1))
		echo "# kill $k after $served requests"
		echo "=== kill $k" >>"$dir/srv.log"
		if ! start_server; then
			notok "server restarted after kill $k"
			sed 's/^/# server: /' "$dir/srv.log" | tail -5
			break
		fi
	done
else
	notok "guest started its load"
fi
wait "$qemu_pid"
rc=$?
qemu_pid=
if [ "$kills" -gt 0 ]; then
	ok "daemon killed $kills times during the writes"
else
	# Timing, not a fault: the guest outran every wait.
	ok "daemon killed during the writes # SKIP the writes ended before the first kill"
fi

while read -r word what; do
	case $word in
	GUEST-OK) ok "guest: $what" ;;
	GUEST-FAIL) notok "guest: $what" ;;
	esac
done < <(grep -a -o 'GUEST-\(OK\|FAIL\) .*' "$dir/console.log" | tr -d '\r')
if [ $rc -eq 0 ] && grep -aq 'GUEST-DONE rc=0' "$dir/console.log"; then
	ok "guest ran to the end"
else
	notok "guest ran to the end (qemu status $rc)"
	sed 's/^/# qemu: /' "$dir/qemu.log" | tail -5
	tr -d '\r' <"$dir/console.log" | sed 's/^/# console: /' | tail -30
fi

grep -o 'queue [0-9]*: resubmitting [0-9]* requests' "$dir/srv.log" | sed 's/^/# /'
resub=$(grep -o 'resubmitting [0-9]* requests' "$dir/srv.log" | awk '{ s += $2 } END { print s + 0 }')
if [ "$resub" -gt 0 ]; then
	ok "restarts resubmitted $resub requests in flight at a kill"
else
	ok "restarts resubmitted requests in flight at a kill # SKIP no kill found one in flight"
fi
if grep -q 'stopped:\|closing the connection' "$dir/srv.log"; then
	notok "server logged no fault"
	sed 's/^/# server: /' "$dir/srv.log" | tail -20
else
	ok "server logged no fault"
fi
kill "$srv_pid" 2>/dev/null
wait "$srv_pid" 2>/dev/null
srv_pid=
echo "1..$n"
exit $fail
