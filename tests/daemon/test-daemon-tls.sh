#!/bin/sh
# iocore-storage-daemon's NBD server with QEMU's TLS objects on
# --nbd-server tls-creds=.  tls-creds-psk (DIR/keys.psk): QEMU's own TLS
# client writes and reads back, also through an export on an I/O thread
# (the session moves there after the handshake), libnbd's too; a plain client and a wrong
# key are refused; credentials of a client endpoint are refused at start.
# tls-creds-x509 (certificates made here): with verify-peer (the default)
# a client with a certificate of the CA is served, one without a
# certificate or with another CA's is refused; with verify-peer=off a
# client without one is served.  As qemu-storage-daemon 7.2 answers.  TAP.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/../nbd/nbd-test-lib.sh"
need psktool certtool nbdinfo qemu-io
workdir ioc-daemon-tls
echo "1..11"
mkdir "$dir/k" "$dir/w"
psktool -u alice -p "$dir/k/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$dir/w/keys.psk" >/dev/null 2>&1
truncate -s 16M "$dir/a.img"
daemon() {
	daemon_with "tls-creds-psk,id=t0,dir=$dir/k,endpoint=$1"
}
daemon_with() {
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/d.pid" \
		--object "$1" --object iothread,id=io0 \
		--blockdev "driver=file,node-name=disk,filename=$dir/a.img" \
		--nbd-server "addr.type=unix,addr.path=$dir/n.sock,tls-creds=t0" \
		--export type=nbd,id=e,node-name=disk,writable=on \
		--export type=nbd,id=e2,node-name=disk,name=e2,writable=on,iothread=io0 \
		2>"$dir/d.err"
}
daemon client
expect "client credentials are refused for the server" "1 1" \
	"$? $(grep -c 'server endpoint' "$dir/d.err")"
check "the daemon serves with PSK credentials" daemon server
check "QEMU's TLS client writes and reads back" sh -c \
	"qemu-io --object tls-creds-psk,id=c0,endpoint=client,dir=$dir/k,username=alice \
	 --image-opts 'driver=nbd,path=$dir/n.sock,export=disk,tls-creds=c0' \
	 -c 'write -P 0x6c 1M 64k' -c 'read -P 0x6c 1M 64k' | grep -q '^read 65536'"
check "... and through an export on an I/O thread, its session moved there" sh -c \
	"qemu-io --object tls-creds-psk,id=c0,endpoint=client,dir=$dir/k,username=alice \
	 --image-opts 'driver=nbd,path=$dir/n.sock,export=e2,tls-creds=c0' \
	 -c 'write -P 0x6d 2M 1M' -c 'read -P 0x6d 2M 1M' -c 'read -P 0x6c 1M 64k' |
	 grep -c '^read' | grep -qx 2"
expect "a plain client is refused: TLS is required" 1 \
	"$(nbdinfo "nbd+unix:///disk?socket=$dir/n.sock" 2>&1 | grep -ci 'tls')"
if nbdinfo "nbds+unix://alice@/disk?socket=$dir/n.sock&tls-psk-file=$dir/w/keys.psk" \
		>/dev/null 2>&1; then
	notok "a wrong key is refused"
else
	ok "a wrong key is refused"
fi
stop d

# X.509: our CA's server and client certificates; a client certificate
# that another CA signed, beside our CA's certificate; a CA alone.
make_pki "$dir/x" && mkdir -p "$dir/o" && make_pki "$dir/o" &&
	mkdir -p "$dir/x/other" "$dir/x/none" &&
	cp "$dir/x/pki/ca-cert.pem" "$dir/x/other/" &&
	cp "$dir/o/spki/client-cert.pem" "$dir/o/spki/client-key.pem" "$dir/x/other/" &&
	cp "$dir/x/pki/ca-cert.pem" "$dir/x/none/" ||
	{ echo "Bail out! certtool could not make the certificates"; exit 1; }
# x509_io CLIENTDIR: QEMU's client with tls-creds-x509 from CLIENTDIR
# writes and reads back.
x509_io() {
	qemu-io --object "tls-creds-x509,id=c0,endpoint=client,dir=$1" \
		--image-opts "driver=nbd,path=$dir/n.sock,export=disk,tls-creds=c0,tls-hostname=localhost" \
		-c 'write -P 0x3c 2M 64k' -c 'read -P 0x3c 2M 64k' 2>&1 | grep -q '^read 65536'
}
refused() { # NAME CLIENTDIR
	if x509_io "$2"; then notok "$1"; else ok "$1"; fi
}
check "the daemon serves with X.509 credentials" \
	daemon_with "tls-creds-x509,id=t0,dir=$dir/x/pki,endpoint=server"
check "a client with a certificate of the CA writes and reads back" x509_io "$dir/x/spki"
refused "a client without a certificate is refused (verify-peer)" "$dir/x/none"
refused "a client whose certificate another CA signed is refused" "$dir/x/other"
stop d
daemon_with "tls-creds-x509,id=t0,dir=$dir/x/pki,endpoint=server,verify-peer=off"
check "verify-peer=off: a client without a certificate is served" x509_io "$dir/x/none"
stop d
exit 0
