#!/bin/sh
# Live migration mirrors the writes of every front end on the migrated
# node, not only the NBD server's: the daemon's node is exported over NBD
# (what migrates) and over vhost-user-blk; while pass 1 copies at a
# bounded rate with active mirroring on, a write through the
# vhost-user-blk front end behind pass 1's position is mirrored
# (query-migrate counts it) and the destination's image equals the
# source's.  Loopback only; every wait has a deadline; nothing asserts on
# timing.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
BUILD=${IOC_BUILD_ROOT:-build}
BENCH="$BUILD/tools/bench/iocore-bench"
. "$SRCDIR/../nbd/nbd-test-lib.sh"

need qemu-img python3
workdir ioc-daemon-migrate-vhost
echo "1..10"

uri() { echo "nbd+unix:///disk?socket=$dir/$1.sock"; }
# wait_field CTL EXPR: poll query-migrate until EXPR (Python over q) is
# true or the migration ended (60 s at most); prints the last value.
wait_field() {
	i=0
	while [ $i -lt 1200 ]; do
		v=$(qfield "$1" "bool($2) or q.get('status') in ('completed', 'failed', 'cancelled')" \
		    2>/dev/null)
		[ "$v" = True ] && break
		i=$((i + 1)); sleep 0.05
	done
	qfield "$1" "$2"
}

head -c 32M /dev/urandom >"$dir/src.img"
check "the daemon exports one node over NBD and vhost-user-blk" \
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/src.pid" \
	--blockdev "driver=file,node-name=disk,filename=$dir/src.img" \
	--nbd-server "addr.type=unix,addr.path=$dir/src.sock" \
	--export type=nbd,id=n,node-name=disk,name=disk,writable=on \
	--export "type=vhost-user-blk,id=v,node-name=disk,addr.type=unix,addr.path=$dir/v.sock,writable=on" \
	--chardev "socket,id=m,path=$dir/src.ctl,server=on,wait=off" --monitor chardev=m
port=$(free_port)
truncate -s 0 "$dir/dst.img"
# Not through check(): its $(...) would wait for the destination to exit.
if dest_start dst "$dir/dst.img" "tcp:127.0.0.1:$port" -x disk; then ok "an iocore-nbd destination waits"
else notok "an iocore-nbd destination waits"; fi
check "active mirroring on, pass 1 at 4 MiB/s" ctl src migrate-set-parameters \
	max-bandwidth=4194304 __org.iocore_active-mirror=on
check "migrate on the daemon's monitor" ctl src migrate uri=tcp:127.0.0.1:$port
# Pass 1 reads in order: past 4 MiB sent, the first MiB is behind it.
expect "pass 1 goes past the first MiB while the migration runs" "True True" \
	"$(wait_field src 'q.get("disk", {}).get("transferred", 0) > 4 << 20') \
	 $(qfield src 'q.get("status") == "active"')"
check "a write through the vhost-user-blk front end" \
	${MESON_EXE_WRAPPER:-} "$BENCH" vhost-blk -q --socket "$dir/v.sock" --op write \
	--offset 65536 --length 65536 --pattern 0x77
expect "query-migrate counts it mirrored" True \
	"$(wait_field src 'q.get("__org.iocore_mirrored-writes", 0) >= 1')"
expect "query-migrate reaches completed" completed "$(wait_status src completed failed)"
check "the write is in the source's image" python3 -c \
	'import sys; f = open(sys.argv[1], "rb"); f.seek(65536); sys.exit(f.read(65536) != b"\x77" * 65536)' \
	"$dir/src.img"
check "the destination serves the same bytes" \
	qemu-img compare -f raw -F raw "$dir/src.img" "$(uri dst)"
stop dst
stop src
exit 0
