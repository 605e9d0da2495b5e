#!/bin/sh
# block_resize on the daemon's monitor: a vhost-user-blk export's front
# end (iocore-bench vhost-blk) reads the new capacity from the config
# space; a read-only node and a missing one are refused; an NBD export's
# node is refused (its clients cannot be told).  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
BUILD=${IOC_BUILD_ROOT:-build}
BENCH="$BUILD/tools/bench/iocore-bench"
. "$SRCDIR/../nbd/nbd-test-lib.sh"
have python3 || { echo "1..0 # SKIP python3 missing"; exit 77; }
workdir ioc-daemon-resize
echo "1..7"
capacity() {
	${MESON_EXE_WRAPPER:-} "$BENCH" vhost-blk --socket "$dir/v.sock" --op get-id --json 2>/dev/null |
		python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["capacity"])'
}
truncate -s 64M "$dir/a.img"
truncate -s 16M "$dir/b.img"
check "the daemon starts with a vhost-user-blk and an NBD export" \
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/d.pid" \
	--blockdev "driver=file,node-name=a,filename=$dir/a.img" \
	--blockdev "driver=file,node-name=b,filename=$dir/b.img" \
	--blockdev "driver=file,node-name=ro,filename=$dir/b.img,read-only=on" \
	--export "type=vhost-user-blk,id=v,node-name=a,addr.type=unix,addr.path=$dir/v.sock,writable=on" \
	--nbd-server "addr.type=unix,addr.path=$dir/n.sock" \
	--export type=nbd,id=n,node-name=b \
	--chardev "socket,id=m,path=$dir/d.ctl,server=on,wait=off" --monitor chardev=m
expect "the front end reads the capacity" 67108864 "$(capacity)"
check "block_resize to 128 MiB" ctl d block_resize node-name=a size=134217728
expect "the front end reads the new capacity" 134217728 "$(capacity)"
expect "the file has the new size" 134217728 "$(stat -c %s "$dir/a.img")"
expect "a read-only node is refused" 1 \
	"$(ctl d block_resize node-name=ro size=1048576 2>&1 | grep -c 'read-only')"
expect "an NBD export's node is refused, naming the export" 1 \
	"$(ctl d block_resize node-name=b size=1048576 2>&1 | grep -c "exported by 'n'")"
stop d
exit 0
