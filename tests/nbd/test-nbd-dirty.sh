#!/bin/sh
# Dirty bitmaps and the control socket with real clients: qemu-io writes,
# nbdinfo --map and qemu-img map (x-dirty-bitmap) read them back exactly,
# clear/remove/merge/disable through iocore-ctl, persistence across SIGTERM
# and kill -9, a torn sidecar, hostile QMP input, QEMU's limits (a 1023-byte
# name, 512-byte granules, more than 16 bitmaps), and the same exchange
# replayed against qemu-storage-daemon.  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
need qemu-io qemu-img nbdinfo python3
workdir ioc-nbd-dirty
img="$dir/disk.img"
truncate -s 64M "$img"

start() {
	srv --fork --pid-file "$dir/srv.pid" -U "$dir/nbd.sock" -x disk \
		--control "$dir/ctl.sock" "$img"
}
U="nbd+unix:///disk?socket=$dir/nbd.sock"
# Through the cross build's emulator when there is one, like srv.
ctl() { ${MESON_EXE_WRAPPER:-} "$CTL" -s "$dir/ctl.sock" "$@"; }
# map BITMAP: the dirty extents as "start+length" lines, from nbdinfo.
map() { nbdinfo --map="qemu:dirty-bitmap:$1" "$U" | awk '$3 == 1 { print $1 "+" $2 }'; }
# qmap BITMAP: the same from QEMU's client (dirty = "data": false).
qmap() {
	qemu-img map --output=json --image-opts \
		"driver=nbd,server.type=unix,server.path=$dir/nbd.sock,export=disk,x-dirty-bitmap=qemu:dirty-bitmap:$1" |
	python3 -c 'import json,sys
for e in json.load(sys.stdin):
    if not e["data"]: print("%d+%d" % (e["start"], e["length"]))'
}
# expect NAME WANT GOT
expect() {
	if [ "$(echo $2)" = "$(echo $3)" ]; then ok "$1"; else
		notok "$1"; printf '# want: %s\n# got:  %s\n' "$(echo $2)" "$(echo $3)"; fi
}
count() {
	ctl --json query-named-block-nodes | python3 -c "import json,sys
for b in json.load(sys.stdin)[0]['dirty-bitmaps']:
    if b['name'] == '$1': print(b['count'], b['recording'], b['persistent'], b.get('inconsistent', False))"
}

start || { echo "Bail out! server did not start"; exit 1; }

# 1: the socket is private.
expect "control socket is mode 0600" "600" "$(stat -c %a "$dir/ctl.sock")"

# 2-4: iocore-ctl adds bitmaps.
check "iocore-ctl adds b0 (64 KiB)" ctl block-dirty-bitmap-add node=disk name=b0
check "iocore-ctl adds f4k (4 KiB, persistent)" \
	ctl block-dirty-bitmap-add node=disk name=f4k granularity=4096 persistent=true
check "iocore-ctl adds off (disabled)" ctl block-dirty-bitmap-add node=disk name=off disabled=true
# 5: errors go to stderr with a non-zero status.
if out=$(ctl block-dirty-bitmap-add node=disk name=b0 2>&1); then notok "duplicate refused"
else expect "duplicate refused with QEMU's message" \
	"iocore-ctl: GenericError: Bitmap already exists: b0" "$out"; fi

# 6: writes of every kind.
check "qemu-io writes, write-zeroes and discards" qemu-io -f raw \
	-c 'write 100k 4k' -c 'write 1M 130k' -c 'write -z 8M 64k' -c 'discard 20M 8k' \
	-c 'write 67108352 512' "$U"

# 7-10: the maps, rounded to each granularity, from both clients.
want64="65536+65536 1048576+196608 8388608+65536 20971520+65536 67043328+65536"
want4k="102400+4096 1048576+135168 8388608+65536 20971520+8192 67104768+4096"
expect "nbdinfo map of b0 (64 KiB granules)" "$want64" "$(map b0)"
expect "qemu-img map of b0" "$want64" "$(qmap b0)"
expect "nbdinfo map of f4k (4 KiB granules)" "$want4k" "$(map f4k)"
expect "qemu-img map of f4k" "$want4k" "$(qmap f4k)"
# 11-12: count in bytes; the disabled bitmap recorded nothing.
expect "count of b0" "458752 True False False" "$(count b0)"
expect "disabled bitmap stays clean" "0 False False False" "$(count off)"

# 13-14: LIST_META_CONTEXT, and qemu:allocation-depth as qemu-nbd -A reports it.
expect "contexts listed" "base:allocation qemu:allocation-depth qemu:dirty-bitmap:b0 qemu:dirty-bitmap:f4k qemu:dirty-bitmap:off" \
	"$(nbdinfo --json "$U" | python3 -c 'import json,sys; print(" ".join(sorted(json.load(sys.stdin)["exports"][0]["contexts"])))')"
expect "qemu:allocation-depth is 1 (local) everywhere" "0 67108864 1 local" \
	"$(nbdinfo --map=qemu:allocation-depth "$U" | awk '{print $1, $2, $3, $4}')"
# LIST queries by namespace and prefix, and a name that does not exist.
# list QUERY...: what LIST_META_CONTEXT answers, sorted, space-separated.
list() {
	/usr/bin/python3 - "$U" "$@" <<'EOF'
import sys
import nbd
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(sys.argv[1])
for q in sys.argv[2:]:
    h.add_meta_context(q)
got = []
h.opt_list_meta_context(lambda name: got.append(name) or 0)
h.opt_abort()
print(" ".join(sorted(got)))
EOF
}
if /usr/bin/python3 -c 'import nbd' 2>/dev/null; then
	expect "LIST qemu: lists every qemu: context" \
		"qemu:allocation-depth qemu:dirty-bitmap:b0 qemu:dirty-bitmap:f4k qemu:dirty-bitmap:off" \
		"$(list qemu:)"
	expect "LIST qemu:dirty-bitmap: lists the bitmaps" \
		"qemu:dirty-bitmap:b0 qemu:dirty-bitmap:f4k qemu:dirty-bitmap:off" \
		"$(list qemu:dirty-bitmap:)"
	expect "LIST of one bitmap, a missing one and base:" \
		"base:allocation qemu:dirty-bitmap:f4k" \
		"$(list qemu:dirty-bitmap:f4k qemu:dirty-bitmap:nope base:)"
	# SET with a missing bitmap asked after an existing one selects it.
	expect "SET of an existing and a missing bitmap selects the existing one" "True False" \
		"$(/usr/bin/python3 - "$U" <<'EOF'
import sys
import nbd
h = nbd.NBD()
for q in ("qemu:dirty-bitmap:f4k", "qemu:dirty-bitmap:nope"):
    h.add_meta_context(q)
h.connect_uri(sys.argv[1])
print(h.can_meta_context("qemu:dirty-bitmap:f4k"), h.can_meta_context("qemu:dirty-bitmap:nope"))
h.shutdown()
EOF
)"
	# SET of two bitmaps selects both (QEMU serves several bitmaps of an
	# export): one BLOCK_STATUS answers each with its own map.
	expect "SET of two bitmaps serves both maps" \
		"$(map b0 | tr '\n' ' ') | $(map f4k | tr '\n' ' ')" \
		"$(/usr/bin/python3 - "$U" <<'EOF'
import sys
import nbd
names = ("qemu:dirty-bitmap:b0", "qemu:dirty-bitmap:f4k")
h = nbd.NBD()
for q in names:
    h.add_meta_context(q)
h.connect_uri(sys.argv[1])
size = h.get_size()
got = {q: [] for q in names}
def cb(ctx, off, ents, err):
    for i in range(0, len(ents), 2):
        if ents[i + 1] & 1:
            got[ctx].append("%d+%d" % (off, ents[i]))
        off += ents[i]
    if off != size:
        got[ctx].append("(ends at %d)" % off)
    return 0
h.block_status(size, 0, cb)
print(" | ".join(" ".join(got[q]) for q in names))
h.shutdown()
EOF
)"
else
	skip "LIST queries by namespace" "libnbd's Python bindings missing"
	skip "LIST qemu:dirty-bitmap:" "libnbd's Python bindings missing"
	skip "LIST of one bitmap" "libnbd's Python bindings missing"
	skip "SET of an existing and a missing bitmap" "libnbd's Python bindings missing"
	skip "SET of two bitmaps" "libnbd's Python bindings missing"
fi

# 15-17: merge into the disabled bitmap, enable it, more writes.
check "merge b0 and f4k into off" ctl block-dirty-bitmap-merge node=disk target=off \
	'bitmaps:=["b0", {"node": "disk", "name": "f4k"}]'
expect "merged map is the union at 64 KiB" "$want64" "$(map off)"
check "enable off" ctl block-dirty-bitmap-enable node=disk name=off
# 18-19: disable b0; a write is then in off and f4k but not b0.
check "disable b0" ctl block-dirty-bitmap-disable node=disk name=b0
qemu-io -f raw -c 'write 30M 4k' "$U" >/dev/null
expect "disabled b0 did not see the write" "$want64" "$(map b0)"
# 20-21
expect "enabled off saw it" \
	"65536+65536 1048576+196608 8388608+65536 20971520+65536 31457280+65536 67043328+65536" "$(map off)"
expect "f4k saw it" \
	"102400+4096 1048576+135168 8388608+65536 20971520+8192 31457280+4096 67104768+4096" "$(map f4k)"

# 22-24: clear and remove.
check "clear b0" ctl block-dirty-bitmap-clear node=disk name=b0
expect "cleared map is empty" "" "$(map b0)"
# A fragmented bitmap comes back whole in one reply: every other 64 KiB
# granule of the 64 MiB image dirty is 1024 extents, more than the reply
# buffer's first size, so it has to grow (QEMU sends up to 2^17 a reply).
# (b0 is disabled here: enabled for this, then cleared and disabled again.)
if /usr/bin/python3 -c 'import nbd' 2>/dev/null; then
	check "enable b0" ctl block-dirty-bitmap-enable node=disk name=b0
	expect "1024 extents of a fragmented bitmap in one reply" "1 1024 512" \
		"$(/usr/bin/python3 - "$U" <<'EOF'
import sys
import nbd
G = 64 << 10
h = nbd.NBD()
h.add_meta_context("qemu:dirty-bitmap:b0")
h.connect_uri(sys.argv[1])
for g in range(0, h.get_size() // G, 2):
    h.zero(G, g * G)
replies = []
h.block_status(h.get_size(), 0,
               lambda ctx, off, ents, err: replies.append(ents) or 0)
ents = replies[0]
dirty = sum(1 for i in range(1, len(ents), 2) if ents[i] & 1)
ok = all(ents[i] == G for i in range(0, len(ents), 2))
print(len(replies), len(ents) // 2 if ok else "uneven", dirty)
h.shutdown()
EOF
)"
	check "clear b0 again" ctl block-dirty-bitmap-clear node=disk name=b0
	check "disable b0 again" ctl block-dirty-bitmap-disable node=disk name=b0
else
	skip "enable b0" "libnbd's Python bindings missing"
	skip "1024 extents in one reply" "libnbd's Python bindings missing"
	skip "clear b0 again" "libnbd's Python bindings missing"
	skip "disable b0 again" "libnbd's Python bindings missing"
fi
check "remove off" ctl block-dirty-bitmap-remove node=disk name=off
# 25: a removed bitmap is gone from the contexts.
if nbdinfo --map=qemu:dirty-bitmap:off "$U" >/dev/null 2>&1; then notok "removed context refused"
else ok "removed context refused"; fi

# 26-27: statistics and connections.
expect "query-blockstats counts the writes" "5 1" "$(ctl --json query-blockstats query-nodes=true |
	python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["stats"]; print(s["wr_operations"] >= 5 and 5, s["unmap_operations"])')"
python3 - "$dir/nbd.sock" "$dir/ctl.sock" "$CTL" ${MESON_EXE_WRAPPER:-} > "$dir/conn.out" 2>&1 <<'EOF'
import json, socket, struct, subprocess, sys
# A raw NBD client parked in transmission, so there is a connection to see.
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
hdr = s.recv(18)
s.sendall(struct.pack(">I", 1 | 2))                      # FIXED_NEWSTYLE, NO_ZEROES
name = b"disk"
s.sendall(struct.pack(">QII", 0x49484156454F5054, 1, len(name)) + name)  # EXPORT_NAME
s.recv(10)
out = subprocess.run(sys.argv[4:] + [sys.argv[3], "-s", sys.argv[2], "--json",
                      "__org.iocore_query-connections"], capture_output=True, text=True)
c = json.loads(out.stdout)
print(len(c), c[0]["export"], c[0]["transmission"], "read" in c[0]["requests"])
EOF
expect "__org.iocore_query-connections lists a client" "1 disk True True" "$(cat "$dir/conn.out")"
# Polling counters after NBD I/O: one entry per I/O thread, counters
# consistent with each other, growing between two queries, and listed by
# query-commands.
pollq() {
	ctl --json __org.iocore_query-polling | python3 -c 'import json,sys
p = json.load(sys.stdin)
ok = [e["thread"] for e in p] == list(range(len(p))) and len(p) >= 1
for e in p:
    ok = ok and e["polls"] == e["polls-hit"] + e["polls-empty"]
    ok = ok and 0 <= e["poll-ns-total"] <= e["polls"] * 32000
    ok = ok and e["backoffs"] * 64 <= e["polls"]
    ok = ok and 0 <= e["poll-ns-current"] <= 32000
    ok = ok and (e["poll-ns-current"] == 0 or not e["backing-off"])
print(ok, sum(e["sleeps"] + e["polls"] for e in p))'
}
# Rests (conn.c): the sum over the I/O threads of rests and of rests
# that ended with the client idle, and whether rests-late <= rests.
restq() {
	ctl --json __org.iocore_query-polling | python3 -c 'import json,sys
p = json.load(sys.stdin)
r, l = sum(e["rests"] for e in p), sum(e["rests-late"] for e in p)
print(r, l, 0 <= l <= r)'
}
set -- $(restq)
rests0=${1:-x}
qemu-img bench -f raw -c 2000 -d 1 -s 4096 "$U" >/dev/null 2>&1
set -- $(pollq)
qemu-img bench -f raw -c 2000 -d 4 -s 4096 "$U" >/dev/null 2>&1
set -- "$@" $(pollq)
expect "__org.iocore_query-polling: sane counters that grow with I/O" "True True True" \
	"$1 $3 $([ "${4:-0}" -gt "${2:-0}" ] && echo True)"
expect "query-commands lists __org.iocore_query-polling" "True" \
	"$(ctl --json query-commands | python3 -c 'import json,sys; print(any(c["name"] == "__org.iocore_query-polling" for c in json.load(sys.stdin)))')"
# A client at depth 1 or 4 never has 8 replies unread: no rest.  One
# that leaves 64 replies unread before its next request gets rests, and
# every reply, right.  It sends nothing for 0.2 s in between: a rest that
# brings no request ends resting, so its two bursts make one to three
# rests (rests repeated while it idles would make hundreds).
set -- $(restq)
expect "no rest for clients at depth 1 and 4" "$rests0" "$1"
expect "a client that reads late is served in full" "ok" \
	"$(python3 "$SRCDIR/nbd-lazy-client.py" "$dir/nbd.sock" disk 64 0.2 2>&1)"
set -- $(restq)
expect "it made the server rest 1-3 times; rests-late <= rests" "True True" \
	"$([ "${1:-0}" -gt "$rests0" ] && [ "${1:-0}" -le $((rests0 + 3)) ] && echo True) ${3:-}"
# --rest-max-ns 0: the same client on a server of its own, no rest.
truncate -s 1M "$dir/r0.img"
srv --fork --pid-file "$dir/r0.pid" -U "$dir/r0.sock" -x disk \
	--control "$dir/r0ctl.sock" --rest-max-ns 0 "$dir/r0.img"
expect "--rest-max-ns 0: served in full, no rest" "ok 0" \
	"$(python3 "$SRCDIR/nbd-lazy-client.py" "$dir/r0.sock" disk 64 2>&1) $(
	${MESON_EXE_WRAPPER:-} "$CTL" -s "$dir/r0ctl.sock" --json __org.iocore_query-polling |
	python3 -c 'import json,sys; print(sum(e["rests"] for e in json.load(sys.stdin)))')"
stop r0

# 28-30: persistence across SIGTERM: f4k (persistent) comes back exactly, b0 not.
before=$(map f4k)
stop srv
start
expect "persistent f4k survives SIGTERM exactly" "$before" "$(map f4k)"
expect "it is listed persistent and recording" "$(echo "$before" | awk -F+ '{s+=$2} END {print s}') True True False" "$(count f4k)"
expect "b0 (not persistent) is gone" "" "$(count b0)"

# 31-35: kill -9 right after acknowledged writes.
check "add persistent k9" ctl block-dirty-bitmap-add node=disk name=k9 persistent=true
check "qemu-io writes (acknowledged) before the kill" qemu-io -f raw \
	-c 'write 2M 4k' -c 'write 5M 1M' -c 'write -z 40M 4k' -c 'discard 50M 64k' -c 'write 63M 4k' "$U"
f4k_before=$(map f4k)
kill -9 "$(cat "$dir/srv.pid")"
while kill -0 "$(cat "$dir/srv.pid")" 2>/dev/null; do sleep 0.02; done
rm -f "$dir/srv.pid"
start
expect "after kill -9 every acknowledged write is marked" \
	"2097152+65536 5242880+1048576 41943040+65536 52428800+65536 66060288+65536" "$(map k9)"
expect "and the bitmap is consistent" "1310720 True True False" "$(count k9)"
expect "f4k also survived the kill" "$f4k_before" "$(map f4k)"

# 36-39: a torn sidecar (a bit flipped after a clean stop) loads inconsistent.
stop srv
printf '\377' | dd of="$img.k9.iocbm" bs=1 seek=4200 conv=notrunc 2>/dev/null
start
expect "torn sidecar: reported inconsistent, not recording" "0 False True True" "$(count k9)"
if nbdinfo --map=qemu:dirty-bitmap:k9 "$U" >/dev/null 2>&1; then notok "inconsistent bitmap refused over NBD"
else ok "inconsistent bitmap refused over NBD"; fi
if ctl block-dirty-bitmap-clear node=disk name=k9 >/dev/null 2>&1; then notok "inconsistent bitmap refused by clear"
else ok "inconsistent bitmap refused by clear"; fi
check "an inconsistent bitmap can be removed" ctl block-dirty-bitmap-remove node=disk name=k9
# 40
if [ -e "$img.k9.iocbm" ]; then notok "its sidecar is deleted"; else ok "its sidecar is deleted"; fi

# 41: iocore-ctl events follows events (quit's BLOCK_EXPORT_DELETED).
# It prints a header once it has negotiated: from then on it gets events.
ctl events > "$dir/events.out" 2>&1 &
evpid=$!
i=0
while ! grep -q '^# events' "$dir/events.out" && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
# A client that never negotiates is there too: it must get no event.
python3 - "$dir/ctl.sock" > "$dir/silent.out" 2>&1 <<'EOF' &
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(60)
buf = b""
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        if buf.count(b"\r\n") == 1 and buf.endswith(b"\r\n"):
            print("greeted", flush=True)
except OSError as e:
    print("error", e)
print("after greeting:", buf.split(b"\r\n", 1)[1].decode())
EOF
silentpid=$!
i=0
while ! grep -q '^greeted' "$dir/silent.out" && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
srvpid=$(cat "$dir/srv.pid")
ctl quit > /dev/null
wait $evpid
wait $silentpid
while kill -0 "$srvpid" 2>/dev/null; do sleep 0.02; done
rm -f "$dir/srv.pid"
if grep -q 'BLOCK_EXPORT_DELETED {"id":"disk"}' "$dir/events.out"; then ok "iocore-ctl events prints BLOCK_EXPORT_DELETED at quit"
else notok "iocore-ctl events prints BLOCK_EXPORT_DELETED at quit"; sed 's/^/# /' "$dir/events.out"; fi
expect "no event before negotiation (a silent client at quit)" "greeted after greeting:" \
	"$(cat "$dir/silent.out")"
# 43: quit stopped the server cleanly and removed its sockets.
if [ -e "$dir/ctl.sock" ]; then notok "quit removed the control socket"; else ok "quit removed the control socket"; fi

# Hostile input (qmp-test.py hostile).
start
TAP_START=$n python3 "$SRCDIR/qmp-test.py" hostile "$dir/ctl.sock" > "$dir/hostile.out" 2>&1
cat "$dir/hostile.out"
n=$((n + $(grep -c '^\(not \)\?ok' "$dir/hostile.out")))
# NBD clients unaffected by all that.
check "NBD still serves after the hostile clients" qemu-io -f raw -c 'write -P 7 0 64k' -c 'read -P 7 0 64k' "$U"

# QEMU's limits over NBD: a 1023-byte name, 512-byte granules, 24 bitmaps.
LONG=$(python3 -c 'print("L" * 1023)')
check "a bitmap with a 1023-byte name and 512-byte granules, and 23 more" sh -c '
	'"${MESON_EXE_WRAPPER:-}"' "$0" -s "$1" block-dirty-bitmap-add node=disk name="$2" granularity=512 &&
	for i in $(seq 0 22); do '"${MESON_EXE_WRAPPER:-}"' "$0" -s "$1" block-dirty-bitmap-add node=disk name=x$i || exit 1; done' \
	"$CTL" "$dir/ctl.sock" "$LONG"
qemu-io -f raw -c 'write -P 1 1000 1' -c 'write -P 1 70000 2000' "$U" >/dev/null
expect "served as qemu:dirty-bitmap:<1023 bytes>, in 512-byte granules" \
	"512+512 69632+2560" "$(map "$LONG")"
expect "QEMU's client reads it too" "512+512 69632+2560" "$(qmap "$LONG")"
expect "the 24th bitmap is served" "0+131072" "$(map x22)"
expect "nbdinfo lists a context for each of them" "24" \
	"$(nbdinfo --json "$U" | python3 -c 'import json,sys
c = json.load(sys.stdin)["exports"][0]["contexts"]
print(sum(1 for x in c if x.startswith("qemu:dirty-bitmap:") and (len(x) == 18 + 1023 or x[18:19] == "x")))')"
stop srv

# The exchange replayed against qemu-storage-daemon.
if have qemu-storage-daemon; then
	truncate -s 16M "$dir/q.img"
	rm -f "$img".*.iocbm
	truncate -s 16M "$img"
	qemu-storage-daemon --blockdev driver=file,filename="$dir/q.img",node-name=disk,discard=unmap \
		--nbd-server addr.type=unix,addr.path="$dir/qnbd.sock" \
		--export type=nbd,id=disk,node-name=disk,name=disk,writable=on \
		--chardev socket,path="$dir/qmp.sock",server=on,wait=off,id=m --monitor chardev=m \
		--pidfile "$dir/qsd.pid" --daemonize
	start
	TAP_START=$n python3 "$SRCDIR/qmp-test.py" compare "$dir/qmp.sock" "$dir/qnbd.sock" \
		"$dir/ctl.sock" "$dir/nbd.sock" > "$dir/cmp.out"
	cat "$dir/cmp.out"
	n=$((n + $(grep -c '^\(not \)\?ok' "$dir/cmp.out")))
	rm -f "$dir/srv.pid" "$dir/qsd.pid"
else
	skip "qemu-storage-daemon comparison" "qemu-storage-daemon missing"
fi
echo "1..$n"
