#!/bin/bash
# A real guest on iocore-storage-daemon's vhost-user-blk export, under the
# loads a VM puts on a disk, and live-migrated (tests/harness/guest.sh:
# the Debian kernel under TCG, fio and util-linux's blkdiscard copied into
# its initramfs).
#   boot 1: two queues on two I/O threads, two vCPUs: fio writes and
#           verifies (crc32c) with a job per vCPU, so on both queues;
#           blkdiscard and blkdiscard -z read back as zeroes; the serial
#           (__org.iocore_serial) in /sys/block/vda/serial; a block_resize
#           over the daemon's QMP while the guest runs reaches the guest
#           (config-change notice on the back-end channel);
#   boot 2: one queue, migrated live between two QEMU processes, each on
#           its own export of the one node (two --export, two sockets),
#           while fio writes and verifies and three readers check a
#           region the host filled.  The host tells the guest that the
#           migration completed by writing a marker into the image; fio
#           then runs one more whole round on the destination.  A reader
#           whose 1 MiB read was in flight at the switch-over sees stale
#           data on the destination unless the export logged the pages it
#           wrote (VHOST_F_LOG_ALL): that is the check that fails without
#           dirty logging.  The image then holds what the guest last saw.
# Every wait is bounded; nothing is asserted on timing.  Skips (77) only
# without QEMU, a kernel, its virtio modules, a static busybox, fio or
# blkdiscard.
set -u
. "$IOC_SOURCE_ROOT/tests/harness/guest.sh"
DAEMON=$IOC_BUILD_ROOT/tools/daemon/iocore-storage-daemon

n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; fail=1; }
check() { if eval "$2"; then ok "$1"; else notok "$1"; fi; }
skip() {
	echo "1..0 # SKIP $1"
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
}

# As in test-vhost-guest.sh: the guest's writes into the memory we share
# with it are made by another process, which ThreadSanitizer cannot see.
[ "${IOC_SANITIZER:-}" = thread ] && skip "a guest's memory is written by QEMU, which ThreadSanitizer cannot see"
guest_check || skip "$GUEST_SKIP"
GUEST_BINARIES="/usr/bin/fio /usr/sbin/blkdiscard:ul-blkdiscard"
guest_check_binaries || skip "$GUEST_SKIP"
command -v python3 >/dev/null 2>&1 || skip "python3 not installed"

base=/tmp
[ -w /dev/shm ] && base=/dev/shm
dir=$(mktemp -d "$base/vhost-migrate.XXXXXX")
srv_pid=
qemu_pids=
cleanup() {
	local p
	for p in $qemu_pids $srv_pid; do
		kill "$p" 2>/dev/null
	done
	wait 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

img1=$dir/disk1.img
img2=$dir/disk2.img
MIB=1048576

# qmp SOCK COMMAND [ARGUMENTS-JSON]: one command on a QMP socket (the
# daemon's or QEMU's), 30 s at most; prints the return value or the
# error, exits 1 on an error.
cat >"$dir/qmp.py" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
f = s.makefile("rwb")
json.loads(f.readline())
cmd = {"execute": sys.argv[2]}
if len(sys.argv) > 3:
    cmd["arguments"] = json.loads(sys.argv[3])
f.write(b'{"execute":"qmp_capabilities"}\n' + json.dumps(cmd).encode() + b"\n")
f.flush()
replies = []
while len(replies) < 2:
    r = json.loads(f.readline())
    if "event" not in r:
        replies.append(r)
r = replies[1]
print(json.dumps(r["return"] if "return" in r else r["error"]))
sys.exit(0 if "return" in r else 1)
PY
qmp() { python3 "$dir/qmp.py" "$@"; }

# start_server ARGS...: the daemon with these options and a monitor on
# $dir/mon.sock, until the sockets named in WAIT_SOCKS are there (10 s).
start_server() {
	rm -f "$dir/mon.sock" $WAIT_SOCKS
	"$DAEMON" "$@" \
		--chardev "socket,id=mon,path=$dir/mon.sock,server=on,wait=off" --monitor chardev=mon \
		>>"$dir/srv.out" 2>>"$dir/srv.log" &
	srv_pid=$!
	for _ in $(seq 200); do
		local all=1 s
		for s in "$dir/mon.sock" $WAIT_SOCKS; do
			[ -S "$s" ] || all=0
		done
		[ $all = 1 ] && return 0
		kill -0 "$srv_pid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
stop_server() {
	kill "$srv_pid"
	wait "$srv_pid"
	local rc=$?
	srv_pid=
	return $rc
}

# wait_console FILE PATTERN SECONDS: until the guest printed PATTERN.
wait_console() {
	local i
	for i in $(seq $(($3 * 10))); do
		grep -aq "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# report NAME CONSOLE: each "GUEST-OK x" / "GUEST-FAIL x" line as TAP,
# then whether the guest ran to its end.
report() {
	local name=$1 console=$2 word what
	while read -r word what; do
		case $word in
		GUEST-OK) ok "$name: $what" ;;
		GUEST-FAIL) notok "$name: $what" ;;
		esac
	done < <(grep -a -o 'GUEST-\(OK\|FAIL\) .*' "$console" | tr -d '\r')
	if grep -aq 'GUEST-DONE rc=0' "$console"; then
		ok "$name: guest ran to the end"
	else
		notok "$name: guest ran to the end"
		tr -d '\r' <"$console" | sed 's/^/# console: /' | tail -25
	fi
}

common='t() { if eval "$2"; then echo "GUEST-OK $1"; else echo "GUEST-FAIL $1"; fi; }
zeroes() { dd if=/dev/vda bs=1M skip=$1 count=$2 iflag=direct 2>/dev/null | cmp -s -n $(($2 * 1048576)) - /dev/zero; }
'

# One initramfs for both boots (building one costs seconds): the serial
# says which part runs.
truncate -s 64M "$img1" "$img2"
dd if=/dev/urandom of="$img2" bs=1M seek=32 count=16 conv=notrunc 2>/dev/null
region_md5=$(dd if="$img2" bs=1M skip=32 count=16 2>/dev/null | md5sum | cut -d' ' -f1)
MARK_SECTOR=$((60 * 2048))

# Boot 1: fio on two queues, discard, serial, resize.
cat >"$dir/guest.sh" <<EOF
$common
boot1() {
t "serial" '[ "\$(cat /sys/block/vda/serial)" = iocore-migrate-01 ]'
t "two queues" '[ "\$(ls /sys/block/vda/mq | wc -l)" = 2 ]'
t "fio write and crc32c verify, a job per queue" 'fio --name=v --filename=/dev/vda \
	--direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite --bs=4k --size=8M \
	--numjobs=2 --offset_increment=8M --cpus_allowed_policy=split --cpus_allowed=0-1 \
	--verify=crc32c --verify_fatal=1 --output=/tmp/fio.out >/dev/null 2>&1 ||
	{ tail -20 /tmp/fio.out; false; }'
t "discard offered" '[ "\$(cat /sys/block/vda/queue/discard_max_bytes)" -gt 0 ]'
t "write zeroes offered" '[ "\$(cat /sys/block/vda/queue/write_zeroes_max_bytes)" -gt 0 ]'
t "blkdiscard: the range reads back as zeroes" '
	dd if=/dev/urandom of=/dev/vda bs=1M seek=20 count=4 oflag=direct 2>/dev/null &&
	! zeroes 20 4 && ul-blkdiscard -o $((20 * MIB)) -l $((4 * MIB)) /dev/vda && zeroes 20 4'
t "blkdiscard -z: the range reads back as zeroes" '
	dd if=/dev/urandom of=/dev/vda bs=1M seek=27 count=6 oflag=direct 2>/dev/null &&
	! zeroes 28 4 && ul-blkdiscard -z -o $((28 * MIB)) -l $((4 * MIB)) /dev/vda && zeroes 28 4'
t "blkdiscard -z leaves its neighbours" '! zeroes 27 1 && ! zeroes 32 1'
t "capacity 64 MiB before the resize" '[ "\$(cat /sys/block/vda/size)" = 131072 ]'
echo GUEST-RESIZE-NOW
t "block_resize seen: 96 MiB" 'i=0; while [ "\$(cat /sys/block/vda/size)" != 196608 ] && [ \$i -lt 300 ]; do
	sleep 0.1; i=\$((i + 1)); done; [ "\$(cat /sys/block/vda/size)" = 196608 ]'
t "the new end is readable" 'dd if=/dev/vda of=/dev/null bs=1M skip=95 count=1 iflag=direct 2>/dev/null'
}
EOF

# Boot 2: three readers of the host's region (1 MiB direct reads: some
# are in flight whenever the source stops), until fio is done.  fio rounds of
# write and verify until the host's marker says "migrated", then one more
# (bounded: 60 rounds).  At the end the md5 of fio's range, for the host.
cat >>"$dir/guest.sh" <<EOF
boot2() {
migrated() { [ "\$(dd if=/dev/vda bs=512 skip=$MARK_SECTOR count=1 iflag=direct 2>/dev/null | head -c 8)" = MIGRATED ]; }
for k in 1 2 3; do
	( bad=0 r=0
	  while [ ! -e /tmp/stop ]; do
		r=\$((r + 1))
		m=\$(dd if=/dev/vda bs=1M skip=32 count=16 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)
		[ "\$m" = $region_md5 ] || { echo "GUEST-FAIL reader \$k: round \$r read stale or wrong data"; bad=1; }
	  done
	  [ \$bad = 0 ] && echo "GUEST-OK reader \$k: \$r rounds of the host's data" ) &
done
echo GUEST-LOAD-RUNNING
r=0 after=-1 bad=0
while [ \$r -lt 60 ] && [ \$after -lt 1 ]; do
	r=\$((r + 1))
	[ \$after -ge 0 ] && after=\$((after + 1))
	fio --name=m --filename=/dev/vda --direct=1 --ioengine=psync --rw=randwrite --bs=4k \
		--size=4M --verify=crc32c --verify_backlog=64 --verify_fatal=1 \
		--output=/tmp/fio.out >/dev/null 2>&1 || { bad=1; tail -20 /tmp/fio.out; break; }
	[ \$after -lt 0 ] && migrated && after=0
done
touch /tmp/stop
wait
t "fio write and crc32c verify across the migration: \$r rounds, the last on the destination" '[ \$bad = 0 ] && [ \$after = 1 ]'
echo "GUEST-MD5 \$(dd if=/dev/vda bs=1M count=4 iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1)"
}
if [ "\$(cat /sys/block/vda/serial)" = iocore-migrate-01 ]; then boot1; else boot2; fi
EOF
guest_initramfs "$dir" "$dir/guest.sh"

# ---- boot 1: fio on two queues, discard, serial, resize ----------------------------

img=$img1

WAIT_SOCKS="$dir/vub.sock"
if start_server --object iothread,id=io0 --object iothread,id=io1 \
	--blockdev "{\"driver\":\"file\",\"node-name\":\"disk\",\"filename\":\"$img\",\"discard\":\"unmap\"}" \
	--export "{\"type\":\"vhost-user-blk\",\"id\":\"vub\",\"node-name\":\"disk\",
		\"addr\":{\"type\":\"unix\",\"path\":\"$dir/vub.sock\"},\"writable\":true,
		\"num-queues\":2,\"iothread\":[\"io0\",\"io1\"],\"__org.iocore_serial\":\"iocore-migrate-01\"}"; then
	GUEST_SMP=2 guest_start "$dir" "$dir/vub.sock" 2 boot1 200
	qemu_pids=$GUEST_PID
	if wait_console "$dir/boot1.console" GUEST-RESIZE-NOW 180; then
		check "block_resize over the daemon's QMP" \
			"qmp '$dir/mon.sock' block_resize '{\"node-name\":\"disk\",\"size\":$((96 * MIB))}' >/dev/null"
	else
		notok "the guest reached the resize"
	fi
	wait "$qemu_pids"
	qemu_pids=
	report boot1 "$dir/boot1.console"
	q=$(qmp "$dir/mon.sock" query-block-exports | python3 -c '
import json, sys
print(" ".join(str(x) for x in json.load(sys.stdin)[0]["__org.iocore_vhost-user-blk"]["queue-requests"]))')
	read -r q0 q1 <<<"$q"
	check "both queues served requests (${q0:-none}, ${q1:-none})" '[ "${q0:-0}" -gt 0 ] && [ "${q1:-0}" -gt 0 ]'
	check "the image grew to 96 MiB" '[ "$(stat -c %s "$img")" = $((96 * MIB)) ]'
	check "server exits on SIGTERM" stop_server
else
	notok "server started"
	sed 's/^/# server: /' "$dir/srv.log"
fi

# ---- boot 2: live migration under load ---------------------------------------------

img=$img2

WAIT_SOCKS="$dir/a.sock $dir/b.sock"
if start_server --object iothread,id=io0 \
	--blockdev "{\"driver\":\"file\",\"node-name\":\"disk\",\"filename\":\"$img\"}" \
	--export "{\"type\":\"vhost-user-blk\",\"id\":\"src\",\"node-name\":\"disk\",
		\"addr\":{\"type\":\"unix\",\"path\":\"$dir/a.sock\"},\"writable\":true,\"iothread\":\"io0\"}" \
	--export "{\"type\":\"vhost-user-blk\",\"id\":\"dst\",\"node-name\":\"disk\",
		\"addr\":{\"type\":\"unix\",\"path\":\"$dir/b.sock\"},\"writable\":true,\"iothread\":\"io0\"}"; then
	ok "server started with two exports of one node"
	guest_start "$dir" "$dir/a.sock" 1 src 240 -qmp "unix:$dir/src.qmp,server=on,wait=off"
	src_pid=$GUEST_PID
	guest_start "$dir" "$dir/b.sock" 1 dst 240 -qmp "unix:$dir/dst.qmp,server=on,wait=off" \
		-incoming "unix:$dir/mig.sock"
	dst_pid=$GUEST_PID
	qemu_pids="$src_pid $dst_pid"
	status=
	if wait_console "$dir/src.console" GUEST-LOAD-RUNNING 120; then
		if qmp "$dir/src.qmp" migrate "{\"uri\":\"unix:$dir/mig.sock\"}" >"$dir/migrate.out" 2>&1; then
			ok "migrate accepted"
		else
			notok "migrate accepted: $(cat "$dir/migrate.out")"
		fi
		for _ in $(seq 600); do
			status=$(qmp "$dir/src.qmp" query-migrate 2>/dev/null |
				 python3 -c 'import json, sys; print(json.load(sys.stdin).get("status", ""))' 2>/dev/null)
			case $status in completed|failed|cancelled) break ;; esac
			sleep 0.2
		done
		check "migration completed (status ${status:-none})" '[ "$status" = completed ]'
		# Without a migration the destination would wait for one.
		[ "$status" = completed ] || kill "$dst_pid"
		printf MIGRATED | dd of="$img" bs=512 seek=$MARK_SECTOR conv=notrunc 2>/dev/null
		qmp "$dir/src.qmp" quit >/dev/null 2>&1
	else
		notok "the guest's load started on the source"
		tr -d '\r' <"$dir/src.console" | sed 's/^/# console: /' | tail -25
		kill "$src_pid" "$dst_pid"
	fi
	wait $src_pid
	wait $dst_pid
	dst_rc=$?
	qemu_pids=
	check "destination QEMU ran the guest to its power-off (status $dst_rc)" '[ $dst_rc = 0 ]'
	report dst "$dir/dst.console"
	guest_md5=$(tr -d '\r' <"$dir/dst.console" | sed -n 's/^GUEST-MD5 //p')
	host_md5=$(dd if="$img" bs=1M count=4 2>/dev/null | md5sum | cut -d' ' -f1)
	check "the image holds what the guest last wrote" '[ -n "$guest_md5" ] && [ "$guest_md5" = "$host_md5" ]'
	check "the host's region is intact" \
		'[ "$(dd if="$img" bs=1M skip=32 count=16 2>/dev/null | md5sum | cut -d" " -f1)" = $region_md5 ]'
	check "the source export logged dirty pages" \
		"grep -q \"export 'src': dirty logging on\" '$dir/srv.log'"
	check "server exits on SIGTERM" stop_server
	for f in src dst; do
		[ -s "$dir/$f.qemu.log" ] && sed "s/^/# $f qemu: /" "$dir/$f.qemu.log" | tail -5
	done
else
	notok "server started with two exports of one node"
	sed 's/^/# server: /' "$dir/srv.log"
fi

if grep -q 'stopped:\|closing the connection' "$dir/srv.log"; then
	notok "server logged no fault"
	sed 's/^/# server: /' "$dir/srv.log" | tail -20
else
	ok "server logged no fault"
fi
echo "1..$n"
exit $fail
