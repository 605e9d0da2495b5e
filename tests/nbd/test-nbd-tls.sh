#!/bin/sh
# iocore-nbd over TLS (NBD_OPT_STARTTLS) with real clients: libnbd's
# nbdinfo and nbdcopy, QEMU's qemu-img and qemu-io.
# Keys and certificates are made here with GnuTLS's psktool and certtool.
# TAP output; a missing tool skips its cases.
set -u
. "$(dirname "$0")/nbd-test-lib.sh"
fails() { # name command...: the command must fail
	name=$1; shift
	if out=$("$@" 2>&1); then
		notok "$name"; echo "$out" | sed 's/^/# /' | tail -10
	else ok "$name"; fi
}
# refused MESSAGE command...: the command must fail and say MESSAGE
refused() {
	msg=$1; shift
	if out=$("$@" 2>&1); then
		notok "refused: $msg"; echo "$out" | sed 's/^/# /' | tail -10
	elif echo "$out" | grep -q -- "$msg"; then ok "refused: $msg"
	else notok "refused: $msg"; echo "$out" | sed 's/^/# /' | tail -10; fi
}

if [ ! -x "$SRV" ]; then
	echo "# $SRV not built"; exit 77
fi
if ! have psktool || ! have nbdinfo || ! have python3; then
	echo "1..0 # SKIP needs psktool (gnutls-bin), nbdinfo (libnbd-bin) and python3"
	exit 0
fi
if srv --tls-psk /dev/null /dev/null 2>&1 | grep -q "without GnuTLS"; then
	echo "1..0 # SKIP iocore-nbd built without GnuTLS"
	exit 0
fi
echo "1..23"
workdir ioc-nbd-tls

# start NAME [options] IMAGE: in the background once listening, logging.
start() {
	name=$1; shift
	srv -v --fork --pid-file "$dir/$name.pid" "$@" 2>"$dir/$name.log"
}
# A TCP port nobody listens on (X.509 names the host, so TCP to localhost).
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

psktool -u alice -p "$dir/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$dir/wrong.psk" >/dev/null 2>&1
img="$dir/disk.img"
truncate -s 64M "$img"
head -c 8M /dev/urandom > "$dir/src.img"
truncate -s 64M "$dir/src.img"

start psk -U "$dir/psk.sock" --tls-psk "$dir/keys.psk" "$img" ||
	{ echo "Bail out! server did not start"; exit 1; }
U="nbds+unix://alice@/?socket=$dir/psk.sock&tls-psk-file=$dir/keys.psk"
PLAIN="nbd+unix:///?socket=$dir/psk.sock"

# 1-2: PSK: a TLS session, and the server says which
check "PSK: nbdinfo over TLS" sh -c "nbdinfo '$U' | grep -q 'with TLS' && nbdinfo '$U' | grep -q 'export-size: 67108864'"
check "PSK: server log names the cipher and the PSK user" \
	grep -q "TLS started: (TLS1.[23]).*PSK user alice" "$dir/psk.log"

# 3-4: data through TLS both ways, big requests and many small ones in flight
if have nbdcopy; then
	check "PSK: nbdcopy file -> TLS -> file, byte for byte" sh -c \
		"nbdcopy '$dir/src.img' '$U' && nbdcopy '$U' '$dir/out.img' && cmp '$dir/src.img' '$dir/out.img'"
	check "PSK: nbdcopy 4 KiB requests, 64 in flight" sh -c \
		"rm -f '$dir/out.img' && nbdcopy --request-size=4096 --requests=64 '$U' '$dir/out.img' && cmp '$dir/src.img' '$dir/out.img'"
else
	skip "nbdcopy over TLS" "nbdcopy missing"; skip "nbdcopy 4 KiB" "nbdcopy missing"
fi

# 5: 4 MiB writes from 4 connections at once (payloads span many records)
# (fio's nbd engine cannot do TLS: libnbd refuses it the key file)
if have nbdcopy; then
	head -c 16M /dev/urandom > "$dir/big.img"
	truncate -s 64M "$dir/big.img"
	check "PSK: 4 connections of 4 MiB writes, read back byte for byte" sh -c \
		"nbdcopy --connections=4 --request-size=4194304 '$dir/big.img' '$U' && \
		 rm -f '$dir/out.img' && nbdcopy '$U' '$dir/out.img' && cmp '$dir/big.img' '$dir/out.img'"
else
	skip "nbdcopy 4 MiB writes over TLS" "nbdcopy missing"
fi

# 6: QEMU's TLS client (its PSK directory holds keys.psk)
if have qemu-io; then
	check "PSK: qemu-io writes and reads back over TLS" sh -c \
		"qemu-io --object tls-creds-psk,id=t0,endpoint=client,dir=$dir,username=alice \
		 --image-opts 'driver=nbd,path=$dir/psk.sock,tls-creds=t0' \
		 -c 'write -P 0x5a 1M 64k' -c 'read -P 0x5a 1M 64k' | grep -q '^read 65536'"
else
	skip "qemu-io over TLS" "qemu-io missing"
fi

# 7-10: refusals, each followed by a TLS client the server still serves
fails "PSK required: a plain client is refused" nbdinfo "$PLAIN"
check "  ...with NBD_REP_ERR_TLS_REQD and its message" sh -c \
	"LIBNBD_DEBUG=1 nbdinfo '$PLAIN' 2>&1 | grep -q 'TLS required'"
fails "PSK: a wrong key fails the handshake" nbdinfo \
	"nbds+unix://alice@/?socket=$dir/psk.sock&tls-psk-file=$dir/wrong.psk"
check "  ...the server logs why and serves on" sh -c \
	"grep -q 'TLS handshake failed' '$dir/psk.log' && nbdinfo '$U' | grep -q 'export-size'"

# 11-12: cleartext bytes where the TLS handshake must start: the connection
# ends, the server does not, and the next TLS client is served.
check "garbage after the STARTTLS ACK closes only that connection" python3 - "$dir/psk.sock" <<'PY'
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
g = s.recv(18)
assert g[:8] == b"NBDMAGIC", g
s.sendall(struct.pack(">I", 1))                                      # fixed newstyle
s.sendall(b"IHAVEOPT" + struct.pack(">II", 5, 0))                    # STARTTLS
r = b""
while len(r) < 20:
    r += s.recv(20 - len(r))
assert struct.unpack(">QIII", r)[2] == 1, r                          # ACK
s.sendall(b"GET / HTTP/1.1\r\n\r\n" * 20)
s.settimeout(5)
try:
    while s.recv(4096):
        pass
except ConnectionResetError:
    pass
PY
check "  ...and TLS clients are still served" sh -c "nbdinfo '$U' | grep -q 'export-size'"

# 13: SIGTERM while a TLS client reads 4 KiB at a time, 64 in flight: the
# server answers what it received, closes, and exits by itself.
if have nbdcopy; then
	# All data first (holes would be answered too fast over TLS), through
	# the first server; then a server of its own whose log says when the
	# copy's connection has reached transmission: the signal lands then,
	# with 64 MiB of 4 KiB reads still to come.
	head -c 64M /dev/urandom > "$dir/full.img"
	nbdcopy "$dir/full.img" "$U"
	stop psk
	start_logged drain srv -v --fork --pid-file "$dir/drain.pid" \
		-U "$dir/drain.sock" --tls-psk "$dir/keys.psk" "$img"
	D="nbds+unix://alice@/?socket=$dir/drain.sock&tls-psk-file=$dir/keys.psk"
	nbdcopy --no-extents --request-size=4096 --requests=64 --connections=1 "$D" null: \
		>"$dir/copy.log" 2>&1 &
	cpid=$!
	await_log drain 'export ""'
	pid=$(cat "$dir/drain.pid")
	kill -TERM "$pid"
	gone=false
	wait_gone "$pid" 20 && gone=true
	wait $cpid 2>/dev/null
	wait $logcat
	if $gone && grep -q "stopping: 1 connection(s) open" "$dir/drain.log"; then
		ok "SIGTERM with a TLS client in flight: the server drains and exits"
	else
		notok "SIGTERM with a TLS client in flight: the server drains and exits"
		tail -5 "$dir/drain.log" | sed 's/^/# /'
	fi
	rm -f "$dir/drain.pid"
else
	skip "SIGTERM with a TLS client" "nbdcopy missing"
	stop psk
fi

# 14: --tls on: the client chooses
start opt -U "$dir/opt.sock" --tls on --tls-psk "$dir/keys.psk" "$img"
check "--tls on: plain and TLS clients both served" sh -c \
	"nbdinfo 'nbd+unix:///?socket=$dir/opt.sock' | grep -q 'without TLS' && \
	 nbdinfo 'nbds+unix://alice@/?socket=$dir/opt.sock&tls-psk-file=$dir/keys.psk' | grep -q 'with TLS'"
stop opt

# 15: no TLS configured: a client that insists on TLS is refused
start off -U "$dir/off.sock" "$img"
fails "no TLS configured: an nbds:// client gets no TLS" nbdinfo \
	"nbds+unix://alice@/?socket=$dir/off.sock&tls-psk-file=$dir/keys.psk"
stop off

# 16-18: start-up errors name the problem and exit non-zero
refused "nope.psk: No such file" srv -U "$dir/x.sock" --tls-psk "$dir/nope.psk" "$img"
: > "$dir/empty.psk"
refused "empty.psk: no \"username:hexkey\" line" srv -U "$dir/x.sock" --tls-psk "$dir/empty.psk" "$img"
refused "needs --tls-certificates DIR or --tls-psk FILE" srv -U "$dir/x.sock" --tls require "$img"

# 19-22: X.509, with certificates made here (CN and SAN localhost)
if have certtool && have python3; then
	make_pki "$dir" || { echo "Bail out! certtool could not make the certificates"; exit 1; }
	pki="$dir/pki"; cli="$dir/spki"
	port=$(free_port)
	start x509 -b 127.0.0.1 -p "$port" --tls-certificates "$pki" --tls-verify-peer "$img"
	check "X.509: nbdinfo with a client certificate" sh -c \
		"nbdinfo 'nbds://localhost:$port/?tls-certificates=$cli' | grep -q 'with TLS'"
	mkdir -p "$dir/nocert" && cp "$pki/ca-cert.pem" "$dir/nocert/"
	fails "X.509 --tls-verify-peer: a client without a certificate is refused" \
		nbdinfo "nbds://localhost:$port/?tls-certificates=$dir/nocert"
	if have qemu-img; then
		check "X.509: qemu-img convert over TLS reads back what nbdcopy wrote" sh -c \
			"nbdcopy '$dir/src.img' 'nbds://localhost:$port/?tls-certificates=$cli' && \
			 qemu-img convert --object tls-creds-x509,id=t0,endpoint=client,dir=$cli \
			 --image-opts 'driver=nbd,host=localhost,port=$port,tls-creds=t0' -O raw '$dir/q.img' && \
			 cmp '$dir/src.img' '$dir/q.img'"
	else
		skip "X.509 qemu-img" "qemu-img missing"
	fi
	check "X.509: a client sending its handshake a byte at a time, then 256 reads it does not read at once" \
		python3 "$(dirname "$0")/nbd-tls-client.py" 127.0.0.1 "$port" "$pki/ca-cert.pem" \
		"$cli/client-cert.pem" "$cli/client-key.pem"
	stop x509
else
	skip "X.509 nbdinfo" "certtool missing"; skip "X.509 verify-peer" "certtool missing"
	skip "X.509 qemu-img" "certtool missing"; skip "X.509 awkward client" "certtool missing"
fi

# 23: every server above exited by itself on SIGTERM; under ASan, UBSan or
# TSan a report (a leak at exit included) lands in its log.
if grep -l -E "Sanitizer|runtime error" "$dir"/*.log >/dev/null 2>&1; then
	notok "no sanitizer report from any server"
	grep -h -A 30 -E "Sanitizer|runtime error" "$dir"/*.log | sed 's/^/# /' | head -60
else
	ok "no sanitizer report from any server"
fi
exit 0
