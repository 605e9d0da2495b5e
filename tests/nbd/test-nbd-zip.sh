#!/bin/sh
# iocore-nbd serving compressed images (iocore-zip output with a seek
# table, gzip members with sizes, stock zstd without a seek table, one
# big frame, a frame without a content size, a damaged frame) to real
# clients: nbdcopy, qemu-img compare, qemu-io patterns, nbdinfo --map.
# TAP output; skips when the clients are missing.
set -u
. "$(dirname "$0")/nbd-test-lib.sh"
# zipt ARGS...: iocore-zip, through the cross build's emulator like srv().
zipt() { ${MESON_EXE_WRAPPER:-} "$ZIP" "$@"; }

echo "1..40"
if [ ! -x "$SRV" ] || [ ! -x "$ZIP" ] || [ ! -x "$CTL" ]; then
	echo "# iocore-nbd, iocore-zip or iocore-ctl not built"; exit 77
fi
for p in nbdcopy nbdinfo qemu-io qemu-img zstd python3; do
	have $p || { echo "# $p missing"; exit 77; }
done
workdir ioc-nbd-zip

# start NAME [options] IMAGE: the server forks once it listens; -v keeps
# its log in $dir/NAME.log.
start() {
	name=$1; shift
	srv -v --fork --pid-file "$dir/$name.pid" -U "$dir/$name.sock" "$@" \
		2>"$dir/$name.log"
}
uri() { echo "nbd+unix:///?socket=$dir/$1.sock"; }
# same NAME: nbdcopy of the export (4 connections) equals the raw image.
same() { nbdcopy "$(uri "$1")" "$dir/out.raw" && cmp "$dir/raw" "$dir/out.raw"; }

# A 24 MiB image (plus an odd tail): zeros, random data, text, and known
# patterns at odd offsets for qemu-io to check.
raw="$dir/raw"
python3 - "$raw" <<'PY'
import os, sys
mib = 1 << 20
with open(sys.argv[1], 'wb') as f:
    for i in range(24):
        k = i % 4
        if k == 0:
            f.write(bytes(mib))
        elif k == 1:
            f.write(os.urandom(mib))
        else:
            line = b'line %08d of a compressible text\n' % i
            f.write((line * (mib // len(line) + 1))[:mib])
    f.write(os.urandom(12345))
PY
qemu-io -f raw -c 'write -P 0x5a 4096 8k' -c 'write -P 0xa5 5000000 300000' \
	-c 'write -P 0x11 17825792 262144' "$raw" >/dev/null
# qemu-io checks: the patterns, zeros in the first MiB, and the tail.
QIO_ARGS="-c 'read -P 0x5a 4096 8k' -c 'read -P 0xa5 5000000 300000' \
 -c 'read -P 0x11 17825792 262144' -c 'read -P 0 16384 1032192' -c 'read -P 0 16777216 1M' \
 -c 'read 25165824 12345'"
# qreads URI ARGS: qemu-io reads (-c ...) succeed and every pattern matches
# (qemu-io exits 1 on a mismatch but still prints the read).
qreads() {
	qout=$(eval "qemu-io -r -f raw $2 '$1'" 2>&1)
	rc=$?
	echo "$qout" | grep -i 'failed\|error'
	[ $rc -eq 0 ] && ! echo "$qout" | grep -qi 'failed\|error'
}
qio() { qreads "$(uri "$1")" "$QIO_ARGS"; }

# 1-5: iocore-zip --block-size 256K, seek table
zipt -q --block-size=256K -o "$dir/img.zst" "$raw"
check "iocore-zip --block-size 256K -l lists frames" sh -c \
	"${MESON_EXE_WRAPPER:-} '$ZIP' -lv '$dir/img.zst' | grep -c ' at ' | grep -qx 97"
start zst "$dir/img.zst" || { echo "Bail out! server did not start"; exit 1; }
check "zero frames are holes in base:allocation before any read" sh -c \
	"nbdinfo --map '$(uri zst)' | awk '\$1 == 262144 && \$2 == 786432 && \$4 == \"hole,zero\" { z = 1 }
	     \$1 == 0 && \$2 == 262144 && \$4 == \"data\" { d = 1 } END { exit !(z && d) }'"
check "seek table: nbdcopy equals the image" same zst
check "seek table: qemu-img compare" qemu-img compare -f raw -F raw "$raw" "$(uri zst)"
check "seek table: qemu-io patterns" qio zst
check "an image alone is allocation depth 1 everywhere" sh -c \
	"nbdinfo --map=qemu:allocation-depth '$(uri zst)' |
	 awk '{ n++ } \$1 == 0 && \$2 == 25178169 && \$3 == 1 { ok = 1 } END { exit !(ok && n == 1) }'"
stop zst

# 6: the frame cache is shared and hit: two reads of one frame decode once
start zc "$dir/img.zst"
qemu-io -r -f raw -c 'read 1048576 4k' -c 'read 1052672 4k' "$(uri zc)" >/dev/null
qemu-io -r -f raw -c 'read 1056768 4k' "$(uri zc)" >/dev/null
stop zc
check "one decode serves reads of one frame from two connections" \
	grep -q 'frame cache: 2 hits, 1 misses.*1 decodes (0 readahead, 0 in place)' "$dir/zc.log"

# 7: sequential readahead: a read ending on a frame's end decodes the next
start ra "$dir/img.zst"
qemu-io -r -f raw -c 'read 1048576 256k' "$(uri ra)" >/dev/null
qemu-io -r -f raw -c 'read 1310720 4k' "$(uri ra)" >/dev/null
stop ra
# (the 256 KiB read covers its frame whole: decoded in place, not cached)
check "readahead decodes the next frame" \
	grep -q 'frame cache: 1 hits, 1 misses.*2 decodes (1 readahead, 1 in place)' "$dir/ra.log"

# 8a-c: a cache of four frames under four connections: constant eviction
# (nbdcopy's 256 KiB requests cover the frames whole and decode them in
# place; 64 KiB requests go through the cache)
start small --frame-cache 1M "$dir/img.zst"
check "tiny frame cache: nbdcopy equals the image" same small
check "tiny frame cache: nbdcopy of 64 KiB requests equals the image" sh -c \
	"nbdcopy --request-size=65536 '$(uri small)' '$dir/out64.raw' && cmp '$dir/raw' '$dir/out64.raw'"
stop small
check "tiny frame cache: frames were evicted" \
	grep -q 'frame cache: .* [1-9][0-9]* evictions' "$dir/small.log"

# gzip members written by iocore-zip --format=gzip
zipt -q --format=gzip --block-size=256K -o "$dir/img.gz" "$raw"
start gz "$dir/img.gz"
check "gzip members: zero members are holes before any read" sh -c \
	"nbdinfo --map '$(uri gz)' | awk '\$1 == 262144 && \$2 == 786432 && \$4 == \"hole,zero\" { z = 1 }
	     \$1 == 0 && \$2 == 262144 && \$4 == \"data\" { d = 1 } END { exit !(z && d) }'"
check "gzip members: nbdcopy equals the image" same gz
check "gzip members: qemu-io patterns" qio gz
stop gz

# 10-11: stock zstd -T0 --long (one frame) and concatenated stock frames
zstd -q -T0 --long "$raw" -o "$dir/stock.zst"
start stock "$dir/stock.zst"
check "stock zstd -T0 --long: nbdcopy equals the image" same stock
stop stock
check "stock zstd: indexed by walking and the log says so" \
	grep -q 'no seek table: indexed 1 frame(s) by walking' "$dir/stock.log"
# 12: several stock frames, one without a content size (from a pipe), and
# a cache too small for them (each read decodes streaming)
head -c 10000000 "$raw" | zstd -q -c > "$dir/multi.zst"
tail -c +10000001 "$raw" | zstd -q -c - >> "$dir/multi.zst"
start multi --frame-cache 8M "$dir/multi.zst"
same_and_qio() { same "$1" && qio "$1"; }
check "stock frames, unsized, small cache: image and patterns" same_and_qio multi
stop multi
check "the unsized frame was measured and the slow path logged" sh -c \
	"grep -q 'indexed 2 frame(s) by walking their headers (. without a content size' '$dir/multi.log' &&
	 grep -q 'larger than half the frame cache' '$dir/multi.log'"

# pzstd: several frames, each behind a skippable frame, no seek table
if have pzstd; then
	pzstd -q -p 2 "$raw" -o "$dir/p.zst"
	start pz "$dir/p.zst"
	check "pzstd output (skippable frames between frames): nbdcopy equals the image" same pz
	stop pz
else
	skip "pzstd output" "pzstd missing"
fi

# 14-16: a damaged frame fails its range with EIO and a logged offset;
# the rest is still served
cp "$dir/img.zst" "$dir/bad.zst"
coff=$(zipt -lv "$dir/img.zst" | awk '$1 == 5 { print $3 }')
printf '\377\377\377\377\377\377\377\377' | dd of="$dir/bad.zst" bs=1 seek=$((coff + 5000)) \
	conv=notrunc 2>/dev/null
start bad --control "$dir/bad.ctl" "$dir/bad.zst"
check "damaged frame: its range fails with EIO" sh -c \
	"qemu-io -r -f raw -c 'read 1310720 4k' '$(uri bad)' 2>&1 | grep -q 'Input/output error'"
check "damaged frame: a large read covering it whole fails with EIO" sh -c \
	"qemu-io -r -f raw -c 'read 1048576 1M' '$(uri bad)' 2>&1 | grep -q 'Input/output error'"
check "damaged frame: other ranges still read" qio bad
# The control socket shows the export as a node of the compressed format,
# with its frames, its cache and the errors.
# jcheck NAME EXPR: EXPR holds for the export's node (n) in NAME's
# query-named-block-nodes.
jcheck() {
	ctl "$1" --json query-named-block-nodes | python3 -c "
import json, sys
nodes = json.load(sys.stdin)
n = nodes[0]
sys.exit(not (len(nodes) == 1 and ($2)))"
}
check "damaged frame: query-named-block-nodes counts the errors" jcheck bad \
	"n['drv'] == '__org.iocore_zip' and n['ro'] and n['file'] == '$dir/bad.zst' and
	 n['image']['virtual-size'] == 25178169 and n['image']['__org.iocore_zip']['frames'] == 97 and
	 n['image']['__org.iocore_zip']['zero-frames'] == 22 and
	 n['image']['__org.iocore_zip']['errors'] >= 2 and n['backing_file_depth'] == 0"
bm_refused() {
	! ctl bad block-dirty-bitmap-add node= name=b 2>"$dir/bm.err" &&
	grep -q "Node '' (driver __org.iocore_zip) does not support dirty bitmaps" "$dir/bm.err"
}
check "damaged frame: a dirty bitmap on the compressed node is refused" bm_refused
ctl_errors() { ctl bad query-named-block-nodes | grep -q 'frame cache: .* [1-9][0-9]* errors'; }
check "damaged frame: iocore-ctl prints the frame cache" ctl_errors
stop bad
check "damaged frame: the log names its offsets" \
	grep -q "frame 5 (compressed offset $coff,.*data offset 1310720" "$dir/bad.log"

# Detected by content: a compressed image named like a raw one is served
# decompressed.
cp "$dir/img.zst" "$dir/disk.img"
start named "$dir/disk.img"
check "a compressed image named disk.img is served decompressed" same named
stop named

# 17: not compressed: still served as a raw image
start plain -r "$raw"
check "a raw image is still served as it is" same plain
stop plain

# 18-24: a copy-on-write overlay makes the compressed image writable
cp "$raw" "$dir/expect"
base_sum=$(cksum < "$dir/img.zst")
start ov --control "$dir/ov.ctl" --overlay "$dir/ov" "$dir/img.zst"
# Writes of whole and partial clusters, zeroes over base data (whole and
# partial clusters), TRIM, two concurrent writes to halves of one base
# cluster; the same applied to a raw copy is the expected image.
OV_OPS="-c 'write -P 0x66 0 128k' -c 'write -P 0x77 1048576 4k' -c 'write -z 2097152 64k' \
 -c 'write -z 1572864 1000' -c 'write -P 0x42 3145800 70000'"
eval "qemu-io -f raw $OV_OPS -c 'discard 1310720 131072' '$(uri ov)'" >/dev/null
eval "qemu-io -f raw $OV_OPS -c 'write -z 1310720 131072' '$dir/expect'" >/dev/null
check "overlay: nbdcopy equals the image with the writes applied" sh -c \
	"nbdcopy '$(uri ov)' '$dir/out.raw' && cmp '$dir/expect' '$dir/out.raw'"
check "overlay: reads of written, zeroed, trimmed and base ranges" qreads "$(uri ov)" \
	"-c 'read -P 0x66 0 128k' -c 'read -P 0x77 1048576 4k' \
	 -c 'read -P 0 2097152 64k' -c 'read -P 0 1310720 128k' -c 'read -P 0 1572864 1000' \
	 -c 'read -P 0x42 3145800 70000' -c 'read -P 0x11 17825792 262144'"
check "overlay: a node over the compressed image, as a backing chain" jcheck ov \
	"n['drv'] == '__org.iocore_zip-overlay' and not n['ro'] and n['file'] == '$dir/ov' and
	 n['backing_file'] == '$dir/img.zst' and n['backing_file_depth'] == 1 and
	 n['image']['backing-image']['format'] == '__org.iocore_zip' and
	 n['image']['__org.iocore_zip-overlay']['clusters-written'] == 6 and
	 n['image']['__org.iocore_zip-overlay']['clusters-zero'] == 3"
check "overlay: zeroed clusters are holes over base data" sh -c \
	"nbdinfo --map '$(uri ov)' | awk '\$1 == 1310720 && \$2 == 131072 && \$4 == \"hole,zero\" { ok = 1 } END { exit !ok }'"
# Written, copied-before-write and zeroed clusters are the overlay's
# (depth 1), the rest the base's (depth 2), as a qcow2 over its backing file.
check "overlay: allocation depth 1 for the overlay, 2 for the base" sh -c \
	"nbdinfo --map=qemu:allocation-depth '$(uri ov)' | awk '
	 \$1 == 0 && \$2 == 131072 && \$3 == 1 { a = 1 }
	 \$1 == 131072 && \$2 == 917504 && \$3 == 2 { b = 1 }
	 \$1 == 1048576 && \$2 == 65536 && \$3 == 1 { c = 1 }
	 \$1 == 1310720 && \$2 == 131072 && \$3 == 1 { d = 1 }
	 \$1 == 1572864 && \$2 == 65536 && \$3 == 1 { e = 1 }
	 \$1 == 3145728 && \$2 == 131072 && \$3 == 1 { f = 1 }
	 \$1 == 3276800 && \$3 == 2 { g = 1 }
	 END { exit !(a && b && c && d && e && f && g) }'"
# A flushed write, then kill -9: it is there after a restart, and the
# compressed base is unchanged.
qemu-io -f raw -c 'write -P 0x99 8388608 64k' -c 'flush' "$(uri ov)" >/dev/null
qemu-io -f raw -c 'write -P 0x99 8388608 64k' "$dir/expect" >/dev/null
kill -9 "$(cat "$dir/ov.pid")"
wait_gone "$(cat "$dir/ov.pid")"
rm -f "$dir/ov.pid" "$dir/ov.sock"
start ov --control "$dir/ov.ctl" --overlay "$dir/ov" "$dir/img.zst"
check "overlay after kill -9: flushed writes are there" sh -c \
	"nbdcopy '$(uri ov)' '$dir/out.raw' && cmp '$dir/expect' '$dir/out.raw'"
check "overlay after kill -9: the map's counts are read back" jcheck ov \
	"n['image']['__org.iocore_zip-overlay'] == {'clusters-written': 7, 'clusters-zero': 3}"
# Two writes at once to the halves of one base cluster whose frame is not
# decoded yet (both wait for the decode, then both copy the cluster):
# neither may lose the other's bytes.
stop ov
start ov --overlay "$dir/ov" "$dir/img.zst"
qemu-io -f raw -c 'aio_write -P 0x31 5242880 4k' -c 'aio_write -P 0x32 5246976 4k' \
	-c 'aio_flush' "$(uri ov)" >/dev/null
qemu-io -f raw -c 'write -P 0x31 5242880 4k' -c 'write -P 0x32 5246976 4k' "$dir/expect" >/dev/null
check "overlay: concurrent writes to one base cluster both land" qreads "$(uri ov)" \
	"-c 'read -P 0x31 5242880 4k' -c 'read -P 0x32 5246976 4k'"
check "overlay: the compressed base is unchanged" test "$(cksum < "$dir/img.zst")" = "$base_sum"
# Commit: read the export through NBD into a new compressed image.
check "overlay: commit into a new compressed image" sh -c \
	"nbdcopy '$(uri ov)' - | ${MESON_EXE_WRAPPER:-} '$ZIP' -q --block-size=256K -c > '$dir/new.zst' &&
	 ${MESON_EXE_WRAPPER:-} '$ZIP' -dc '$dir/new.zst' | cmp - '$dir/expect'"
stop ov
refused() {
	if srv --fork --pid-file "$dir/x.pid" -U "$dir/x.sock" --overlay "$dir/ov" \
		"$dir/multi.zst" 2>"$dir/x.log"; then
		stop x; return 1
	fi
	grep -q 'another base' "$dir/x.log"
}
check "overlay: refused over another base" refused

# 26: the servers' logs hold no sanitizer report (ASan/UBSan/TSan builds)
check "no sanitizer report in the server logs" sh -c \
	"! grep -l 'Sanitizer\|runtime error' '$dir'/*.log"
