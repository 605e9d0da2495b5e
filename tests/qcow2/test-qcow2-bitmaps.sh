#!/bin/sh
# Persistent dirty bitmaps in a qcow2 image (the bitmaps extension), with
# QEMU's tools on both sides: a bitmap made by `qemu-img bitmap --add` is
# served as qemu:dirty-bitmap:NAME and tracks writes through the daemon's
# qcow2 node; one added over QMP with persistent: true is in the image
# after a clean stop; qemu-img info shows in-use while the daemon runs and
# not after; qemu-nbd -B reads the same extents; qemu-img check stays
# clean; kill -9 leaves the bitmaps in use, reported inconsistent by the
# next open (iocore and qemu-img), refused but for remove; a read-only
# node never writes; an overlay's backing file name makes room for the
# extension; a v2 image refuses persistent bitmaps; QEMU's limits (40
# bitmaps, a 1023-byte name, 512-byte and 2 GiB granules) and its words
# for values past them.  TAP output.
set -u
BUILD=${IOC_BUILD_ROOT:-build}
SRCDIR=$(cd "$(dirname "$0")" && pwd)
DAEMON="$BUILD/tools/daemon/iocore-storage-daemon"
CTL="$BUILD/tools/ctl/iocore-ctl"
. "$SRCDIR/../nbd/nbd-test-lib.sh"

if [ ! -x "$DAEMON" ] || [ ! -x "$CTL" ]; then
	echo "1..0 # SKIP iocore-storage-daemon or iocore-ctl not built"; exit 77
fi
for t in qemu-img qemu-io qemu-nbd nbdinfo python3; do
	have $t || { echo "1..0 # SKIP $t missing"; exit 77; }
done
workdir ioc-qcow2-bitmaps
img="$dir/a.qcow2"
echo "1..42"

# daemon [RO]: the daemon over $img as node q0 (read-only with RO=1),
# its NBD server on $dir/nbd.sock, its monitor on $dir/qmp.sock.
daemon() {
	ro=${1:-0}
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/d.pid" \
		--blockdev "driver=file,node-name=f0,filename=$img,read-only=$([ "$ro" = 1 ] && echo on || echo off)" \
		--blockdev "driver=qcow2,node-name=q0,file=f0,read-only=$([ "$ro" = 1 ] && echo on || echo off)" \
		--nbd-server "addr.type=unix,addr.path=$dir/nbd.sock" \
		--chardev "socket,path=$dir/qmp.sock,server=on,wait=off,id=m" --monitor chardev=m \
		2>"$dir/d.log"
}
ctl() { ${MESON_EXE_WRAPPER:-} "$CTL" -s "$dir/qmp.sock" "$@"; }
export_q0() {
	ctl block-export-add type=nbd id=e0 node-name=q0 writable:=true "bitmaps:=$1" >/dev/null
}
U="nbd+unix:///q0?socket=$dir/nbd.sock"
# map BITMAP [URI]: the dirty extents as "start+length" lines (nbdinfo).
map() { nbdinfo --map="qemu:dirty-bitmap:$1" "${2:-$U}" | awk '$3 == 1 { print $1 "+" $2 }'; }
# flags [-U]: "name:flag,flag" per bitmap, from qemu-img info's JSON.
flags() {
	qemu-img info --output=json "$@" "$img" | python3 -c 'import json,sys
d = json.load(sys.stdin).get("format-specific", {}).get("data", {})
for b in d.get("bitmaps", []): print("%s:%s:%d" % (b["name"], ",".join(b["flags"]) or "-", b["granularity"]))'
}
# qflags: the same from query-named-block-nodes (QEMU's format-specific data).
qflags() {
	ctl --json query-named-block-nodes | python3 -c 'import json,sys
for n in json.load(sys.stdin):
    if n["node-name"] == "q0":
        d = n["image"].get("format-specific", {}).get("data", {})
        for b in d.get("bitmaps", []): print("%s:%s:%d" % (b["name"], ",".join(b["flags"]) or "-", b["granularity"]))'
}
# bm NAME: "recording persistent inconsistent count" from query-named-block-nodes.
bm() {
	ctl --json query-named-block-nodes | python3 -c "import json,sys
for n in json.load(sys.stdin):
    for b in n.get('dirty-bitmaps', []):
        if n['node-name'] == 'q0' and b['name'] == '$1':
            print(b['recording'], b['persistent'], b.get('inconsistent', False), b['count'])"
}
dstop() { stop d; }

qemu-img create -q -f qcow2 "$img" 64M
qemu-img bitmap --add "$img" b0
qemu-img bitmap --add --disable "$img" off0
# QEMU's own write, tracked by QEMU: b0 starts dirty at 0.
qemu-io -f qcow2 -c 'write -P 7 0 64k' "$img" >/dev/null

# 1-6: a bitmap of qemu-img's, tracked and served.
check "the daemon opens a qcow2 image with bitmaps" daemon
expect "while open, qemu-img info and the node's format-specific data show them in use" \
	"b0:in-use,auto:65536 off0:in-use:65536 / b0:in-use,auto:65536 off0:in-use:65536" \
	"$(flags -U) / $(qflags)"
expect "query-named-block-nodes lists them (recording, persistent)" \
	"True True False 65536 / False True False 0" "$(bm b0) / $(bm off0)"
export_q0 '["b0","off0"]'
check "writes, write-zeroes and discard through the qcow2 node" qemu-io -f raw \
	-c 'write -P 1 1M 64k' -c 'write -P 2 10551196 4096' -c 'write -z 20M 128k' \
	-c 'discard 30M 64k' -c 'flush' "$U"
B0="0+65536 1048576+65536 10485760+131072 20971520+131072 31457280+65536"
expect "nbdinfo sees exactly the dirty extents of b0" "$B0" "$(map b0)"
expect "a disabled bitmap records nothing" "" "$(map off0)"

# 7-10: a persistent bitmap added over QMP.
check "block-dirty-bitmap-add persistent on the qcow2 node" \
	ctl block-dirty-bitmap-add node=q0 name=p1 persistent=true granularity=4096
check "and a transient one" ctl block-dirty-bitmap-add node=q0 name=t1
expect "qemu-img info shows the new one at once, in use" \
	"b0:in-use,auto:65536 off0:in-use:65536 p1:in-use,auto:4096" "$(flags -U)"
qemu-io -f raw -c 'write -P 3 40M 4k' "$U" >/dev/null
expect "the new bitmap counts its 4 KiB" "True True False 4096" "$(bm p1)"

# 11-15: a clean stop writes them back.
dstop
expect "after a clean stop: not in use, auto as recorded, the transient one gone" \
	"b0:auto:65536 off0:-:65536 p1:auto:4096" "$(flags)"
check "qemu-img check is clean" qemu-img check -q "$img"
qemu-nbd -t -r -f qcow2 -B b0 -B p1 -B off0 -k "$dir/q.sock" --fork --pid-file "$dir/q.pid" "$img"
QU="nbd+unix:///?socket=$dir/q.sock"
expect "qemu-nbd -B b0 serves the same extents" \
	"$B0 41943040+65536" "$(map b0 "$QU")"
expect "qemu-nbd -B p1 serves the 4 KiB write" "41943040+4096" "$(map p1 "$QU")"
expect "off0 is still clean for QEMU" "" "$(map off0 "$QU")"
stop q

# 16-19: reopened, the bits are back; remove works.
daemon
export_q0 '["b0","p1"]'
expect "reopened: b0's extents are back" "$B0 41943040+65536" "$(map b0)"
check "block-dirty-bitmap-remove of a persistent bitmap" \
	ctl block-dirty-bitmap-remove node=q0 name=p1
expect "removed from the image at once" "b0:in-use,auto:65536 off0:in-use:65536" "$(flags -U)"
check "block-dirty-bitmap-clear b0" ctl block-dirty-bitmap-clear node=q0 name=b0

# 20-24: kill -9 leaves them in use: inconsistent on the next open.
kill -9 "$(cat "$dir/d.pid")"; wait_gone "$(cat "$dir/d.pid")"; rm -f "$dir/d.pid"
expect "after kill -9 qemu-img info shows them in use" \
	"b0:in-use,auto:65536 off0:in-use:65536" "$(flags)"
daemon
expect "the next open reports b0 inconsistent" "False True True 0" "$(bm b0)"
expect "and refuses to use it" "1" \
	"$(ctl block-dirty-bitmap-clear node=q0 name=b0 2>&1 | grep -c "Bitmap 'b0' is inconsistent and cannot be used")"
check "block-dirty-bitmap-remove is allowed" ctl block-dirty-bitmap-remove node=q0 name=b0
ctl block-dirty-bitmap-remove node=q0 name=off0 >/dev/null
dstop
expect "no bitmap left after the stop" "" "$(flags)"

# 25: the extension is gone, the image clean.
check "qemu-img check is clean after the last bitmap went" qemu-img check -q "$img"

# 26: read-only: loaded, never written.
qemu-img bitmap --add "$img" r0
sum=$(md5sum <"$img")
daemon 1
ro_state=$(bm r0)
dstop
expect "a read-only node loads the bitmap and leaves the file as it was" \
	"True True False 0 $sum" "$ro_state $(md5sum <"$img")"

# 27-28: an overlay: the backing file name sits right after the header
# extensions, and moves to make room for the new one.
rm -f "$img"
qemu-img create -q -f qcow2 "$dir/base.qcow2" 64M
qemu-io -f qcow2 -c 'write -P 9 0 1M' "$dir/base.qcow2" >/dev/null
qemu-img create -q -f qcow2 -b "$dir/base.qcow2" -F qcow2 "$img"
daemon
ctl block-dirty-bitmap-add node=q0 name=ov persistent=true >/dev/null
export_q0 '["ov"]'
qemu-io -f raw -c 'write -P 5 2M 4k' "$U" >/dev/null
dstop
expect "a bitmap added to an overlay is in it after the stop, its backing file kept" \
	"ov:auto:65536 $dir/base.qcow2" \
	"$(flags) $(qemu-img info --output=json "$img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["backing-filename"])')"
qemu-nbd -t -r -f qcow2 -B ov -k "$dir/q.sock" --fork --pid-file "$dir/q.pid" "$img"
expect "qemu-nbd reads its extent, the backing data reads through, check is clean" \
	"2097152+65536 ok clean" "$(map ov "$QU") $(qemu-io -r -f raw -c 'read -P 9 0 1M' "$QU" \
	>/dev/null && echo ok) $(qemu-img check -q -U "$img" && echo clean)"
stop q

# 29-41: QEMU's limits.  An image of qemu-img's with 40 bitmaps, one
# named with 1023 bytes, one of 512-byte granules, one of 2 GiB.
rm -f "$img"
qemu-img create -q -f qcow2 "$img" 64M
i=0
while [ $i -lt 40 ]; do qemu-img bitmap --add "$img" "m$i"; i=$((i + 1)); done
LONG=$(python3 -c 'print("L" * 1023)')
qemu-img bitmap --add "$img" "$LONG"
qemu-img bitmap --add -g 512 "$img" fine
qemu-img bitmap --add -g 2147483648 "$img" huge
qemu-io -f qcow2 -c 'write -P 4 0 4k' "$img" >/dev/null
check "the daemon opens an image with 43 bitmaps, a 1023-byte name, 512 B and 2 GiB granules" daemon
expect "query-named-block-nodes lists all 43, with their granularities" \
	"43 65536 512 2147483648 4096 1023" \
	"$(ctl --json query-named-block-nodes | python3 -c 'import json,sys
for n in json.load(sys.stdin):
    if n["node-name"] == "q0":
        b = {x["name"]: x for x in n["dirty-bitmaps"]}
        l = [k for k in b if len(k) == 1023][0]
        print(len(b), b[l]["granularity"], b["fine"]["granularity"], b["huge"]["granularity"],
              b["fine"]["count"], len(l))')"
ctl block-export-add type=nbd id=e0 node-name=q0 writable:=true \
	"bitmaps:=[\"$LONG\",\"fine\",\"m39\",\"huge\"]" >/dev/null
qemu-io -f raw -c 'write -P 6 1000 1' -c 'write -P 6 9000 3000' "$U" >/dev/null
expect "qemu:dirty-bitmap:fine has 512-byte extents" "0+4096 8704+3584" "$(map fine)"
expect "qemu:dirty-bitmap:<1023 bytes> is served and tracks writes" "0+65536" "$(map "$LONG")"
expect "the 40th of qemu-img's bitmaps too" "0+65536" "$(map m39)"
expect "a 2 GiB granule covers the whole disk" "0+67108864" "$(map huge)"
# QEMU's words for values out of range (qemu-storage-daemon 7.2's).
expect "granularity below 512" "1" \
	"$(ctl block-dirty-bitmap-add node=q0 name=g granularity=256 2>&1 | grep -c 'Granularity must be power of 2 and at least 512')"
expect "granularity past 2 GiB" "1" \
	"$(ctl block-dirty-bitmap-add node=q0 name=g granularity=4294967296 2>&1 | grep -c "Parameter 'granularity' expects uint32_t")"
L1024="${LONG}x"
expect "a 1024-byte name, in memory and persistent" "1 1" \
	"$(ctl block-dirty-bitmap-add node=q0 name="$L1024" 2>&1 | grep -c "Bitmap name too long: $L1024") $(ctl block-dirty-bitmap-add node=q0 name="$L1024" persistent=true 2>&1 | grep -c "Can't make bitmap '$L1024' persistent in 'q0': Name length exceeds maximum (1023 characters)")"
check "a persistent bitmap of 512-byte granules added over QMP" \
	ctl block-dirty-bitmap-add node=q0 name=pfine persistent=true granularity=512
qemu-io -f raw -c 'write -P 7 33M 1' "$U" >/dev/null
dstop
expect "after the stop qemu-img sees 44 bitmaps, none in use" "44 0 512" \
	"$(flags | awk -F: '{ n++; if ($2 ~ /in-use/) u++ } /^pfine:/ { g = $3 } END { print n, u + 0, g }')"
qemu-nbd -t -r -f qcow2 -B fine -B pfine -B "$LONG" -k "$dir/q.sock" --fork --pid-file "$dir/q.pid" "$img"
expect "qemu-nbd serves the bits iocore wrote back" \
	"0+4096 8704+3584 34603008+512 / 34603008+512 / 0+65536 34603008+65536" \
	"$(map fine "$QU" | tr '\n' ' ')/ $(map pfine "$QU") / $(map "$LONG" "$QU" | tr '\n' ' ' | sed 's/ $//')"
stop q
check "qemu-img check is clean" qemu-img check -q "$img"

# 42: qcow2 v2 has no autoclear bits: no persistent bitmaps (as QEMU).
rm -f "$img"
qemu-img create -q -f qcow2 -o compat=0.10 "$img" 64M
daemon
expect "a v2 image refuses a persistent bitmap" "1" \
	"$(ctl block-dirty-bitmap-add node=q0 name=p persistent=true 2>&1 | grep -c "Can't store persistent bitmaps")"
dstop
exit 0
