#!/bin/sh
# Live migration of an export between two iocore-nbd: an idle migration
# (cmp, reads through the destination), one while a client writes through
# the source until the switch-over, pause-before-switchover with no request
# answered while paused, the QMP status sequence and MIGRATION events,
# migrate_cancel and kill -9 of the destination mid-way (the source keeps
# serving), a truncated and a corrupted stream (never served), and
# iocore-ctl migrate --wait.  Loopback only; waits poll query-migrate (or a
# process, a file) with a deadline; nothing asserts on timing.  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
need qemu-io qemu-img python3
workdir ioc-nbd-migrate
echo "1..67"

# events CTL FILE: follow the control socket's events into FILE until a
# migration ends; FILE.ready appears once negotiated.  $evpid.
events() {
	python3 - "$dir/$1.ctl" "$2" <<'EOF' &
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.settimeout(60); s.connect(sys.argv[1])
f = s.makefile("rwb")
json.loads(f.readline())
f.write(b'{"execute": "qmp_capabilities"}'); f.flush()
json.loads(f.readline())
open(sys.argv[2] + ".ready", "w").close()
out = open(sys.argv[2], "w")
deadline = time.time() + 60
while time.time() < deadline:
    m = json.loads(f.readline())
    if "event" not in m:
        continue
    if m["event"] == "MIGRATION":
        out.write("MIGRATION %s\n" % m["data"]["status"])
    elif m["event"] == "MIGRATION_PASS":
        out.write("MIGRATION_PASS %d\n" % m["data"]["pass"])
    out.flush()
    if m["event"] == "MIGRATION" and m["data"]["status"] in ("completed", "failed", "cancelled"):
        break
EOF
	evpid=$!
	i=0
	while [ ! -f "$2.ready" ] && [ $i -lt 600 ]; do i=$((i + 1)); sleep 0.05; done
}
# in_flight CTL: the requests the server has in flight, all connections.
in_flight() {
	ctl "$1" --json __org.iocore_query-connections |
		python3 -c 'import json,sys; print(sum(c["in-flight"] for c in json.load(sys.stdin)))'
}
# wait_held CTL: until the server holds one request (30 s at most).
wait_held() {
	i=0
	until [ "$(in_flight "$1")" = 1 ] || [ $i -gt 600 ]; do
		i=$((i + 1)); sleep 0.05
	done
}

img="$dir/a.img"
mixed_image "$img"
cp "$img" "$dir/a.ref"

# ---- an idle migration to a deferred destination, with events ----
source_start s1 "$img" || { echo "Bail out! source did not start"; exit 1; }
expect "query-migrate is {} before any migration" "{}" "$(ctl s1 --json query-migrate)"
expect "capabilities listed (QEMU's names)" \
	"zero-blocks=True compress=False events=False pause-before-switchover=False auto-converge=False __org.iocore_handover=False" \
	"$(ctl s1 --json query-migrate-capabilities | python3 -c 'import json,sys
print(" ".join("%s=%s" % (c["capability"], c["state"]) for c in json.load(sys.stdin)))')"
check "migrate-set-parameters" ctl s1 migrate-set-parameters compress-level=3 \
	compress-threads=2 downtime-limit=300 __org.iocore_granularity=4096
expect "query-migrate-parameters" "3 2 True 2 0 300 4096" \
	"$(ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; p=json.load(sys.stdin)
print(p["compress-level"], p["compress-threads"], p["compress-wait-thread"], p["decompress-threads"], p["max-bandwidth"], p["downtime-limit"], p["__org.iocore_granularity"])')"
caps s1 events=true compress=true
# Nobody listening, then a name that does not resolve: failed, with the
# reason, and the source serves on.
port=$(free_port)
check "migrate to a port nobody listens on" ctl s1 migrate uri=tcp:127.0.0.1:$port
expect "it fails" failed "$(wait_status s1 failed completed)"
expect "the reason names the address and the refusal" \
	"Failed to connect to 'tcp:127.0.0.1:$port': Connection refused" \
	"$(qfield s1 'q.get("error-desc")')"
check "migrate to a name that does not resolve" ctl s1 migrate uri=tcp:no-such-host.invalid:1
expect "it fails too" failed "$(wait_status s1 failed completed)"
expect "the reason names the host" "Cannot resolve 'no-such-host.invalid'" \
	"$(qfield s1 'q.get("error-desc")')"
check "the source still serves" qemu-io -f raw -r -c "read -P 0 40M 64k" \
	"nbd+unix:///?socket=$dir/s1.sock"
port=$(free_port)
dest_start d1 "$dir/b.img" defer || { echo "Bail out! destination did not start"; exit 1; }
check "migrate-incoming on the deferred destination" ctl d1 migrate-incoming uri=tcp:127.0.0.1:$port
expect "the destination does not serve NBD before the migration" "no" \
	"$([ -S "$dir/d1.sock" ] && echo yes || echo no)"
events s1 "$dir/ev1"
check "migrate" ctl s1 migrate uri=tcp:127.0.0.1:$port
expect "source completes" completed "$(wait_status s1 completed failed cancelled)"
expect "destination completes" completed "$(wait_status d1 completed failed)"
wait $evpid
# Idle: pass 1 copies everything, nothing is dirty, the switch-over's
# final pass (2) runs in status device.
expect "MIGRATION events: setup, active, pass 1, device, pass 2, completed" \
	"MIGRATION setup|MIGRATION active|MIGRATION_PASS 1|MIGRATION device|MIGRATION_PASS 2|MIGRATION completed" \
	"$(paste -sd'|' "$dir/ev1")"
check "the two images are equal (cmp)" cmp "$img" "$dir/b.img"
check "query-migrate when completed: QEMU's fields" python3 -c "
import json, subprocess, sys
q = json.loads(sys.argv[1])
assert q['status'] == 'completed', q
for k in ('total-time', 'setup-time', 'downtime'): assert isinstance(q[k], int), k
d = q['disk']
for k in ('transferred', 'remaining', 'total', 'duplicate', 'normal', 'normal-bytes',
          'dirty-pages-rate', 'dirty-sync-count', 'page-size'): assert isinstance(d[k], int), k
assert isinstance(d['mbps'], float)
assert d['total'] == 48 << 20 and d['remaining'] == 0 and d['page-size'] == 4096, d
assert d['duplicate'] > 0 and d['normal'] > 0, d
c = q['compression']
for k in ('pages', 'busy', 'compressed-size'): assert isinstance(c[k], int), k
for k in ('busy-rate', 'compression-rate'): assert isinstance(c[k], float), k
assert c['pages'] > 0 and c['compression-rate'] > 1, c
assert d['transferred'] < 16 << 20, d  # holes and text do not go whole
w = q['__org.iocore_worker-busy-ns']
assert len(w) == 2 and min(w) > 0, w  # both compression workers had chunks
" "$(ctl s1 --json query-migrate)"
if have nbdinfo; then
	expect "nbdinfo through the destination" 50331648 \
		"$(nbdinfo --size "nbd+unix:///?socket=$dir/d1.sock")"
else
	skip "nbdinfo through the destination" "nbdinfo missing"
fi
check "qemu-img compare through the destination's NBD socket" \
	qemu-img compare -f raw -F raw "$dir/a.ref" "nbd+unix:///?socket=$dir/d1.sock"
if qemu-io -f raw -c 'read 0 4k' "nbd+unix:///?socket=$dir/s1.sock" >/dev/null 2>&1; then
	notok "the source no longer serves"
else
	ok "the source no longer serves"
fi
check "the source stays up with its control socket" ctl s1 query-version
stop s1
stop d1

# ---- a migration while qemu-io writes through the source ----
cp "$dir/a.ref" "$img"
rm -f "$dir/b.img"
source_start s2 "$img" || { echo "Bail out! source did not start"; exit 1; }
caps s2 compress=true
ctl s2 migrate-set-parameters max-bandwidth=8000000 compress-threads=2 >/dev/null
port=$(free_port)
dest_start d2 "$dir/b.img" tcp:127.0.0.1:$port || { echo "Bail out! destination did not start"; exit 1; }
# The writer: rounds of 4 KiB writes over 1 MiB at 40 MiB, until the
# source stops answering (bounded).
(
	r=0
	while [ $r -lt 400 ] && [ ! -f "$dir/stopw" ]; do
		set -- ; k=0
		while [ $k -lt 64 ]; do
			set -- "$@" -c "write -P $(( (r + k) % 250 + 1 )) $((41943040 + ((r * 7 + k * 13) % 256) * 4096)) 4k"
			k=$((k + 1))
		done
		qemu-io -f raw "$@" "nbd+unix:///?socket=$dir/s2.sock" >"$dir/w.out" 2>&1 || break
		grep -q "failed" "$dir/w.out" && break
		r=$((r + 1))
	done
	echo "$r" >"$dir/w.rounds"
) &
wpid=$!
# Let the writer get going before the migration (bounded).
i=0; while [ ! -s "$dir/w.out" ] && [ $i -lt 200 ]; do i=$((i + 1)); sleep 0.05; done
check "migrate while the writer runs" ctl s2 migrate uri=tcp:127.0.0.1:$port
expect "completes while written" completed "$(wait_status s2 completed failed cancelled)"
touch "$dir/stopw"
wait $wpid
expect "destination completes" completed "$(wait_status d2 completed failed)"
check "the two images are equal after the writes (cmp)" cmp "$img" "$dir/b.img"
check "verify pass through the destination's NBD socket" \
	qemu-img compare -f raw -F raw "$img" "nbd+unix:///?socket=$dir/d2.sock"
expect "the writer wrote during the migration" yes \
	"$([ "$(cat "$dir/w.rounds")" -gt 0 ] && ! cmp -s "$img" "$dir/a.ref" && echo yes || echo no)"
if have fio; then
	# fio_migrate NAME IMG WHAT FIO-OPTIONS...: a fresh pair (NAME's
	# source on IMG, made from a.ref), fio writing through the source
	# until the switch-over cuts it; the migration completes and the two
	# images are equal.
	fio_migrate() {
		fm=$1 fimg=$2 fwhat=$3
		shift 3
		rm -f "$fimg.dst"
		source_start "s$fm" "$fimg"
		ctl "s$fm" migrate-set-parameters max-bandwidth=16000000 >/dev/null
		port=$(free_port)
		dest_start "d$fm" "$fimg.dst" tcp:127.0.0.1:$port
		fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$dir/s$fm.sock" \
			--offset=32M --time_based --runtime=30 --iodepth=4 \
			--continue_on_error=none "$@" >"$dir/fio$fm.out" 2>&1 &
		fpid=$!
		ctl "s$fm" migrate uri=tcp:127.0.0.1:$port >/dev/null
		fst=$(wait_status "s$fm" completed failed cancelled)
		wait $fpid
		expect "$fwhat: completes, images equal" "completed same" \
			"$fst $(cmp -s "$fimg" "$fimg.dst" && echo same || echo differ)"
		stop "s$fm"; stop "d$fm"
	}
	cp "$dir/a.ref" "$dir/f.img"
	fio_migrate 3 "$dir/f.img" "fio" --rw=randwrite --bs=4k --size=2M
	# 1 MiB writes on an image without holes (on tmpfs without swap
	# their payloads are received into the image's mapping), racing the
	# copy, the dirty passes and the switch-over's hold.
	cp "$dir/a.ref" "$dir/m.img"; fallocate -l 48M "$dir/m.img"
	fio_migrate m "$dir/m.img" "fio 1 MiB writes, image without holes" \
		--rw=write --bs=1m --size=8M
else
	skip "fio: completes, images equal" "fio missing"
	skip "fio 1 MiB writes, image without holes: completes, images equal" "fio missing"
fi
stop s2
stop d2

# ---- pause-before-switchover, no request answered while paused ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s4 "$img"
caps s4 events=true pause-before-switchover=true
port=$(free_port)
dest_start d4 "$dir/b.img" tcp:127.0.0.1:$port
events s4 "$dir/ev4"
check "migrate with pause-before-switchover" ctl s4 migrate uri=tcp:127.0.0.1:$port
expect "pauses in pre-switchover" pre-switchover "$(wait_status s4 pre-switchover completed failed)"
qemu-io -f raw -c 'read -P 0 40M 4k' "nbd+unix:///?socket=$dir/s4.sock" >"$dir/r.out" 2>&1 &
rpid=$!
wait_held s4
expect "the read waits at the gate, unanswered" "1 running" \
	"$(in_flight s4) $(kill -0 $rpid 2>/dev/null && echo running || echo done)"
expect "still pre-switchover" pre-switchover "$(qfield s4 'q["status"]')"
check "migrate-continue" ctl s4 migrate-continue state=pre-switchover
expect "completes after migrate-continue" completed "$(wait_status s4 completed failed)"
wait $rpid
expect "the held read is answered with an error (ESHUTDOWN), not data" "failed" \
	"$(grep -q 'failed' "$dir/r.out" && echo failed || cat "$dir/r.out")"
wait $evpid
expect "events with pause-before-switchover" \
	"MIGRATION setup|MIGRATION active|MIGRATION pre-switchover|MIGRATION device|MIGRATION completed" \
	"$(grep '^MIGRATION ' "$dir/ev4" | paste -sd'|')"
wait_status d4 completed failed >/dev/null
check "images equal after the paused switch-over" cmp "$img" "$dir/b.img"
stop s4; stop d4

# ---- a WRITE's payload half received at the switch-over ----
# A 1 MiB WRITE whose client stops after 600000 bytes of its payload.  On
# tmpfs without swap the payload goes straight into the image's mapping,
# whole 4 KiB blocks only, and counts as past the gate: the switch-over's
# hold must end it there, or pre-switchover would wait for a client that
# waits for it.  The 146 whole blocks that arrived stay written and reach
# the destination, the block it stopped in does not (no torn block), and
# the request, once whole, waits at the gate and fails with ESHUTDOWN.
dd if="$dir/a.ref" of="$dir/p.img" bs=1M count=4 2>/dev/null
cp "$dir/p.img" "$dir/p.ref"
rm -f "$dir/p.dst" "$dir/p.go"
mapped=no
[ "$(stat -f -c %T "$dir")" = tmpfs ] && ! awk 'NR > 1' /proc/swaps | grep -q . && mapped=yes
# image_is WHOLE: p.img is p.ref with the pattern's first WHOLE bytes at 64 KiB.
image_is() {
	python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from nbdraw import pattern
img, ref, n = open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read(), int(sys.argv[4])
print(img == ref[:65536] + pattern(n) + ref[65536 + n:])' "$SRCDIR" "$dir/p.img" "$dir/p.ref" "$1"
}
source_start s5 "$dir/p.img"
caps s5 pause-before-switchover=true
port=$(free_port)
dest_start d5 "$dir/p.dst" tcp:127.0.0.1:$port
python3 "$SRCDIR/nbd-split-write.py" "$dir/s5.sock" "" 65536 1048576 600000 "$dir/p.go" \
	>"$dir/p.out" 2>&1 &
ppid=$!
if [ $mapped = yes ]; then
	i=0
	until [ "$(image_is 598016)" = True ] || [ $i -gt 600 ]; do i=$((i + 1)); sleep 0.05; done
	expect "the payload's whole blocks are in the image before the switch-over" True \
		"$(image_is 598016)"
else
	skip "the payload's whole blocks are in the image before the switch-over" \
		"not tmpfs without swap: the payload waits in a buffer"
fi
ctl s5 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "pauses in pre-switchover with the payload half received" pre-switchover \
	"$(wait_status s5 pre-switchover completed failed)"
touch "$dir/p.go"
wait_held s5
expect "the WRITE, whole now, waits at the gate" 1 "$(in_flight s5)"
check "migrate-continue" ctl s5 migrate-continue state=pre-switchover
expect "completes" completed "$(wait_status s5 completed failed)"
wait $ppid
expect "the WRITE fails with ESHUTDOWN" 108 "$(cat "$dir/p.out")"
wait_status d5 completed failed >/dev/null
expect "the source image has the whole blocks that arrived, no torn block" True \
	"$(image_is $([ $mapped = yes ] && echo 598016 || echo 0))"
check "the destination's image equals the source's" cmp "$dir/p.img" "$dir/p.dst"
stop s5; stop d5

# ---- the destination dies while the source is paused, clients held ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s4k "$img"
caps s4k pause-before-switchover=true
port=$(free_port)
dest_start d4k "$dir/b.img" tcp:127.0.0.1:$port
ctl s4k migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "paused in pre-switchover" pre-switchover "$(wait_status s4k pre-switchover completed failed)"
qemu-io -f raw -c 'read -P 0 40M 4k' "nbd+unix:///?socket=$dir/s4k.sock" >"$dir/r.out" 2>&1 &
rpid=$!
wait_held s4k
kill -9 $dpid; wait $dpid 2>/dev/null
st=$(wait_status s4k failed completed cancelled)
expect "the source notices without migrate-continue: failed" failed "$st"
# Still held otherwise: end the read rather than wait for ever.
[ "$st" = failed ] || kill $rpid 2>/dev/null
check "error-desc names the lost destination" python3 -c "
import json, sys
q = json.loads(sys.argv[1])
assert 'destination' in q['error-desc'], q
" "$(ctl s4k --json query-migrate)"
wait $rpid; rrc=$?
expect "the held read is answered with the data" 0 "$rrc"
check "the source keeps serving writes" qemu-io -f raw -c 'write -P 0x5a 44M 64k' \
	-c 'read -P 0x5a 44M 64k' "nbd+unix:///?socket=$dir/s4k.sock"
stop s4k

# ---- migrate_cancel mid-way ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s5 "$img"
ctl s5 migrate-set-parameters max-bandwidth=1000000 >/dev/null
port=$(free_port)
dest_start d5 "$dir/b.img" tcp:127.0.0.1:$port
ctl s5 migrate uri=tcp:127.0.0.1:$port >/dev/null
wait_status s5 active >/dev/null
check "migrate_cancel" ctl s5 migrate_cancel
expect "status cancelled" cancelled "$(wait_status s5 cancelled failed completed)"
check "the source keeps serving (write and read back)" qemu-io -f raw \
	-c 'write -P 0x5a 44M 64k' -c 'read -P 0x5a 44M 64k' -c 'read -P 0 46M 4k' \
	"nbd+unix:///?socket=$dir/s5.sock"
wait $dpid; drc=$?
expect "the destination never serves, exits 1" "1 no" \
	"$drc $([ -S "$dir/d5.sock" ] && echo yes || echo no)"
check "the source's other data intact" cmp -n 44M "$img" "$dir/a.ref"
stop s5

# ---- kill -9 of the destination mid-way ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s6 "$img"
ctl s6 migrate-set-parameters max-bandwidth=1000000 >/dev/null
port=$(free_port)
dest_start d6 "$dir/b.img" tcp:127.0.0.1:$port
ctl s6 migrate uri=tcp:127.0.0.1:$port >/dev/null
wait_status s6 active >/dev/null
kill -9 $dpid; wait $dpid 2>/dev/null
expect "source reports failed" failed "$(wait_status s6 failed completed cancelled)"
check "with an error-desc" python3 -c "import json,sys; q=json.loads(sys.argv[1]); assert q['error-desc'], q" \
	"$(ctl s6 --json query-migrate)"
check "the source keeps serving, data intact" qemu-img compare -f raw -F raw \
	"$dir/a.ref" "nbd+unix:///?socket=$dir/s6.sock"
stop s6

# ---- a truncated and a corrupted stream ----
# Capture a real stream: a listener stands in for the destination and
# keeps everything up to END (the source then fails: no ACK).
cp "$dir/a.ref" "$img"
source_start s7 "$img"
caps s7 compress=true
port=$(free_port)
python3 - "$port" "$dir/stream" <<'EOF' &
import socket, struct, sys
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(1)
open(sys.argv[2] + ".ready", "w").close()
ls.settimeout(60)
c, _ = ls.accept(); c.settimeout(60)
buf = b""
def need(n):
    global buf
    while len(buf) < n:
        d = c.recv(1 << 20)
        if not d: raise SystemExit("short")
        buf += d
need(32); pos = 32
while True:
    need(pos + 32)
    typ, = struct.unpack(">I", buf[pos:pos + 4])
    plen, = struct.unpack(">I", buf[pos + 20:pos + 24])
    need(pos + 32 + plen); pos += 32 + plen
    if typ == 5: break
open(sys.argv[2], "wb").write(buf[:pos])
c.close()
EOF
cpid=$!
i=0; while [ ! -f "$dir/stream.ready" ] && [ $i -lt 600 ]; do i=$((i + 1)); sleep 0.05; done
ctl s7 migrate uri=tcp:127.0.0.1:$port >/dev/null
wait $cpid
wait_status s7 failed completed >/dev/null
stop s7
# feed FILE: send FILE to a fresh destination; prints its exit status and
# whether it ever listened for NBD.
feed() {
	rm -f "$dir/c.img"
	port=$(free_port)
	dest_start d7 "$dir/c.img" tcp:127.0.0.1:$port || { echo "no-start"; return; }
	python3 -c 'import socket,sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(open(sys.argv[2], "rb").read()); s.shutdown(socket.SHUT_WR)
try:
    s.settimeout(30); s.recv(64)
except OSError: pass' "$port" "$1"
	wait $dpid; rc=$?
	echo "$rc $([ -S "$dir/d7.sock" ] && echo serves || echo never)"
}
size=$(stat -c %s "$dir/stream")
expect "captured a whole stream" yes "$([ "$size" -gt 1000 ] && echo yes || echo no)"
head -c $((size / 2)) "$dir/stream" >"$dir/stream.trunc"
expect "a truncated stream is rejected, never served" "1 never" "$(feed "$dir/stream.trunc")"
python3 -c 'import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[len(b) // 2] ^= 0x40
open(sys.argv[2], "wb").write(b)' "$dir/stream" "$dir/stream.bad"
expect "a corrupted stream is rejected, never served" "1 never" "$(feed "$dir/stream.bad")"
grep -q "incoming migration failed" "$dir/d7.log" && ok "with the reason logged" ||
	{ notok "with the reason logged"; sed 's/^/# /' "$dir/d7.log" | tail -5; }

# ---- iocore-ctl migrate --wait ----
cp "$dir/a.ref" "$img"; rm -f "$dir/b.img"
source_start s8 "$img"
port=$(free_port)
dest_start d8 "$dir/b.img" tcp:127.0.0.1:$port
if out=$(ctl s8 migrate tcp:127.0.0.1:$port --wait 2>&1); then
	case $out in *"migration completed in"*"on the wire"*) ok "iocore-ctl migrate --wait";;
	*) notok "iocore-ctl migrate --wait"; echo "$out" | sed 's/^/# /';; esac
else
	notok "iocore-ctl migrate --wait"; echo "$out" | sed 's/^/# /'
fi
wait_status d8 completed failed >/dev/null
check "images equal after iocore-ctl migrate" cmp "$img" "$dir/b.img"
stop s8; stop d8
