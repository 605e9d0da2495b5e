#!/bin/sh
# Live migration over TLS with the servers' own --tls-* credentials: a PSK
# migration and an X.509 one (certificates made here with certtool, the
# destination verifying the source's client certificate) complete with
# equal images; a plain source, a wrong PSK and a wrong tls-hostname are
# refused (the destination never serves, the source keeps serving); a
# destination that never answers the handshake is cancelled from it.
# Waits poll query-migrate with a deadline; nothing asserts on timing.
# TAP output; skipped without psktool and certtool (gnutls-bin).
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
for t in psktool certtool qemu-io python3; do
	have $t || { echo "1..0 # SKIP $t missing (gnutls-bin, qemu-utils, python3)"; exit 0; }
done
if srv --tls-psk /dev/null /dev/null 2>&1 | grep -q "without GnuTLS"; then
	echo "1..0 # SKIP iocore-nbd built without GnuTLS"; exit 0
fi
workdir ioc-nbd-migrate-tls
echo "1..29"

# refused_dest NAME: the destination exited 1 and never served.
refused_dest() {
	wait $dpid; drc=$?
	expect "the destination exits 1 and never serves" "1 no" \
		"$drc $([ -S "$dir/$1.sock" ] && echo yes || echo no)"
}
# error_has CTL TEXT: query-migrate's error-desc contains TEXT.
error_has() {
	d=$(qfield "$1" 'q.get("error-desc", "")')
	case $d in *"$2"*) ok "error-desc says: $2"; echo "# error-desc: $d";;
	*) notok "error-desc says: $2"; echo "# error-desc: $d";; esac
}
serves() { # NAME: the source still answers reads and writes
	check "the source keeps serving" qemu-io -f raw -c 'write -P 0x5a 44M 64k' \
		-c 'read -P 0x5a 44M 64k' "nbd+unix:///?socket=$dir/$1.sock"
}

# Keys and certificates.
psktool -u alice -p "$dir/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$dir/wrong.psk" >/dev/null 2>&1
pki="$dir/pki"; spki="$dir/spki"
make_pki "$dir" || { echo "Bail out! certtool could not make the certificates"; exit 1; }

img="$dir/a.img"
mixed_image "$img"
cp "$img" "$dir/a.ref"

# ---- PSK ----
source_start s1 "$img" --tls on --tls-psk "$dir/keys.psk" ||
	{ echo "Bail out! source did not start"; exit 1; }
expect "tls-creds and tls-hostname default to empty" "'' ''" \
	"$(ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; p=json.load(sys.stdin)
print(repr(p["tls-creds"]), repr(p["tls-hostname"]))')"
check "migrate-set-parameters tls-creds" ctl s1 migrate-set-parameters tls-creds=tls0
expect "query-migrate-parameters reports tls-creds" "tls0" \
	"$(ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; print(json.load(sys.stdin)["tls-creds"])')"
ctl s1 migrate-set-capabilities 'capabilities:=[{"capability":"compress","state":true}]' >/dev/null
port=$(free_port)
dest_start d1 "$dir/b.img" tcp:127.0.0.1:$port --tls on --tls-psk "$dir/keys.psk" ||
	{ echo "Bail out! destination did not start"; exit 1; }
check "migrate (PSK)" ctl s1 migrate uri=tcp:127.0.0.1:$port
expect "PSK: source completes" completed "$(wait_status s1 completed failed cancelled)"
expect "PSK: destination completes" completed "$(wait_status d1 completed failed)"
check "PSK: images equal" cmp "$dir/a.ref" "$dir/b.img"
grep -q "incoming migration: connected (TLS)" "$dir/d1.log" && ok "PSK: the destination logged TLS" ||
	{ notok "PSK: the destination logged TLS"; sed 's/^/# /' "$dir/d1.log" | tail -5; }
stop s1; stop d1; wait $dpid 2>/dev/null

# ---- X.509, the destination verifying the source's client certificate ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s2 "$img" --tls on --tls-certificates "$spki"
ctl s2 migrate-set-parameters tls-creds=tls0 >/dev/null
port=$(free_port)
dest_start d2 "$dir/b.img" tcp:127.0.0.1:$port --tls on --tls-certificates "$pki" --tls-verify-peer
check "migrate (X.509)" ctl s2 migrate uri=tcp:127.0.0.1:$port
expect "X.509: source completes" completed "$(wait_status s2 completed failed cancelled)"
expect "X.509: destination completes" completed "$(wait_status d2 completed failed)"
check "X.509: images equal" cmp "$dir/a.ref" "$dir/b.img"
stop s2; stop d2; wait $dpid 2>/dev/null

# ---- X.509 with a tls-hostname the certificate does not carry ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s3 "$img" --tls on --tls-certificates "$spki"
ctl s3 migrate-set-parameters tls-creds=tls0 tls-hostname=not-this-host.example >/dev/null
port=$(free_port)
dest_start d3 "$dir/b.img" tcp:127.0.0.1:$port --tls on --tls-certificates "$pki"
ctl s3 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "wrong tls-hostname: source fails" failed "$(wait_status s3 failed completed cancelled)"
error_has s3 "TLS handshake with the destination failed"
serves s3
refused_dest d3
stop s3

# ---- a plain source against a TLS destination ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s4 "$img"
port=$(free_port)
dest_start d4 "$dir/b.img" tcp:127.0.0.1:$port --tls on --tls-psk "$dir/keys.psk"
ctl s4 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "plain source: fails" failed "$(wait_status s4 failed completed cancelled)"
refused_dest d4
grep -q "TLS handshake with the source failed" "$dir/d4.log" &&
	ok "the destination logs why (TLS required)" ||
	{ notok "the destination logs why (TLS required)"; sed 's/^/# /' "$dir/d4.log" | tail -5; }
serves s4
stop s4

# ---- a wrong PSK ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s5 "$img" --tls on --tls-psk "$dir/wrong.psk"
ctl s5 migrate-set-parameters tls-creds=tls0 >/dev/null
port=$(free_port)
dest_start d5 "$dir/b.img" tcp:127.0.0.1:$port --tls on --tls-psk "$dir/keys.psk"
ctl s5 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "wrong PSK: source fails" failed "$(wait_status s5 failed completed cancelled)"
error_has s5 "TLS handshake with the destination failed"
serves s5
refused_dest d5
stop s5

# ---- tls-creds on a source without TLS credentials ----
source_start s6 "$img"
ctl s6 migrate-set-parameters tls-creds=tls0 >/dev/null
port=$(free_port)
ctl s6 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "tls-creds without credentials: fails" failed "$(wait_status s6 failed completed cancelled)"
stop s6

# ---- a destination that takes the connection and never answers ----
# The handshake waits on the engine's loop: migrate_cancel ends it, and
# the source keeps serving.
port=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1)
open(sys.argv[2] + ".tmp", "w").close()
c, _ = s.accept()
open(sys.argv[2], "w").close()
time.sleep(120)' $port "$dir/silent.accepted" &
spid=$!
source_start s7 "$img" --tls on --tls-psk "$dir/keys.psk"
ctl s7 migrate-set-parameters tls-creds=tls0 >/dev/null
i=0; while [ ! -e "$dir/silent.accepted.tmp" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
ctl s7 migrate uri=tcp:127.0.0.1:$port >/dev/null
i=0; while [ ! -e "$dir/silent.accepted" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
expect "the silent destination was connected to" yes \
	"$([ -e "$dir/silent.accepted" ] && echo yes || echo no)"
check "migrate_cancel during the handshake" ctl s7 migrate_cancel
expect "silent destination: cancelled" cancelled "$(wait_status s7 cancelled completed failed)"
serves s7
stop s7
kill $spid 2>/dev/null; wait $spid 2>/dev/null || :
