#!/bin/sh
# iocore-storage-daemon's NBD server with QEMU's TLS objects: tls-creds-psk
# (DIR/keys.psk) on --nbd-server tls-creds=; QEMU's own TLS client writes
# and reads back, libnbd's too; a plain client and a wrong key are
# refused; credentials of a client endpoint are refused at start.  TAP.
set -u
BUILD=${IOC_BUILD_ROOT:-build}
SRCDIR=$(cd "$(dirname "$0")" && pwd)
DAEMON="$BUILD/tools/daemon/iocore-storage-daemon"
. "$SRCDIR/../nbd/nbd-test-lib.sh"
for t in psktool nbdinfo qemu-io; do
	have $t || { echo "1..0 # SKIP $t missing"; exit 77; }
done
workdir ioc-daemon-tls
echo "1..5"
mkdir "$dir/k" "$dir/w"
psktool -u alice -p "$dir/k/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$dir/w/keys.psk" >/dev/null 2>&1
truncate -s 16M "$dir/a.img"
daemon() {
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/d.pid" \
		--object "tls-creds-psk,id=t0,dir=$dir/k,endpoint=$1" \
		--blockdev "driver=file,node-name=disk,filename=$dir/a.img" \
		--nbd-server "addr.type=unix,addr.path=$dir/n.sock,tls-creds=t0" \
		--export type=nbd,id=e,node-name=disk,writable=on 2>"$dir/d.err"
}
daemon client
expect "client credentials are refused for the server" "1 1" \
	"$? $(grep -c 'server endpoint' "$dir/d.err")"
check "the daemon serves with PSK credentials" daemon server
check "QEMU's TLS client writes and reads back" sh -c \
	"qemu-io --object tls-creds-psk,id=c0,endpoint=client,dir=$dir/k,username=alice \
	 --image-opts 'driver=nbd,path=$dir/n.sock,export=disk,tls-creds=c0' \
	 -c 'write -P 0x6c 1M 64k' -c 'read -P 0x6c 1M 64k' | grep -q '^read 65536'"
expect "a plain client is refused: TLS is required" 1 \
	"$(nbdinfo "nbd+unix:///disk?socket=$dir/n.sock" 2>&1 | grep -ci 'tls')"
if nbdinfo "nbds+unix://alice@/disk?socket=$dir/n.sock&tls-psk-file=$dir/w/keys.psk" \
		>/dev/null 2>&1; then
	notok "a wrong key is refused"
else
	ok "a wrong key is refused"
fi
stop d
exit 0
