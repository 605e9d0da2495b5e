#!/bin/sh
# Live migration into a qcow2 destination: iocore-nbd --incoming given a
# qcow2 image (found by its magic, or -f qcow2) receives through a qcow2
# node, so the file stays a qcow2 image holding the source's contents
# (qemu-img compare against the source, qemu-img check), its zeroes not
# written as data; a raw source and a qcow2 source, compress off and on.
# A qcow2 destination smaller than the source grows to its size.
# Loopback only; waits poll query-migrate with a deadline.  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
need qemu-img python3
workdir ioc-nbd-migrate-qcow2
echo "1..18"

img="$dir/a.img"
mixed_image "$img"
qemu-img convert -f raw -O qcow2 "$img" "$dir/a.qcow2"

# migrate NAME SRCIMG DSTIMG COMPRESS [DEST OPTION...]: source sNAME
# serving SRCIMG migrates into dNAME receiving DSTIMG; the two final
# statuses in $res.  Not in $(...): the destination runs in the background
# and would hold the substitution's pipe open.
migrate() {
	m=$1; src=$2; dst=$3; comp=$4; shift 4
	port=$(free_port)
	res=source-failed
	source_start "s$m" "$src" || return
	res=dest-failed
	dest_start "d$m" "$dst" "tcp:127.0.0.1:$port" "$@" >/dev/null || return
	caps "s$m" compress=$comp
	ctl "s$m" migrate uri=tcp:127.0.0.1:$port >/dev/null
	res="$(wait_status "s$m" completed failed cancelled) $(wait_status "d$m" completed failed)"
}
# actual SIZE: the bytes the qcow2 file holds (qemu-img info's actual-size).
actual() {
	qemu-img info -U --output=json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["actual-size"])'
}

# ---- a raw source into a qcow2 image found by its magic, compress off ----
qemu-img create -q -f qcow2 "$dir/b.qcow2" 48M
migrate 1 "$img" "$dir/b.qcow2" false
expect "raw -> qcow2: both ends complete" "completed completed" "$res"
expect "the destination says it serves qcow2" 1 \
	"$(grep -c 'bytes, qcow2) on' "$dir/d1.log")"
check "qemu-img compare through the destination's NBD export" \
	qemu-img compare -f raw -F raw "$img" "nbd+unix:///?socket=$dir/d1.sock"
stop s1
stop d1
expect "the file is still qcow2" qcow2 \
	"$(qemu-img info --output=json "$dir/b.qcow2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["format"])')"
check "qemu-img check of the destination" qemu-img check -q -f qcow2 "$dir/b.qcow2"
check "qemu-img compare: the source and the qcow2 destination are equal" \
	qemu-img compare -f raw -F qcow2 "$img" "$dir/b.qcow2"
# 14 MiB of data in the source; the holes and zeroes must not be written.
size=$(actual "$dir/b.qcow2")
if [ "$size" -lt $((24 << 20)) ]; then ok "zeroes are not stored as data ($size bytes)"; else
	notok "zeroes are not stored as data"; echo "# actual-size $size"; fi

# ---- a qcow2 source into a qcow2 image named by -f qcow2, compress on ----
qemu-img create -q -f qcow2 "$dir/c.qcow2" 48M
migrate 2 "$dir/a.qcow2" "$dir/c.qcow2" true -f qcow2
expect "qcow2 -> qcow2 (-f qcow2, compress): both ends complete" "completed completed" "$res"
stop s2
stop d2
check "qemu-img check" qemu-img check -q -f qcow2 "$dir/c.qcow2"
check "qemu-img compare: qcow2 source and destination are equal" \
	qemu-img compare -f qcow2 -F qcow2 "$dir/a.qcow2" "$dir/c.qcow2"
check "and equal to the raw image" qemu-img compare -f raw -F qcow2 "$img" "$dir/c.qcow2"

# ---- over a qcow2 destination that held other data ----
qemu-img create -q -f qcow2 "$dir/e.qcow2" 48M
python3 -c 'import sys; sys.stdout.buffer.write(b"\xee" * (48 << 20))' >"$dir/ee.raw"
qemu-img convert -q -n -f raw -O qcow2 "$dir/ee.raw" "$dir/e.qcow2"
migrate 3 "$img" "$dir/e.qcow2" true
expect "raw -> a qcow2 full of 0xee: both ends complete" "completed completed" "$res"
stop s3
stop d3
check "qemu-img compare: every old byte was replaced (zeroes too)" \
	qemu-img compare -f raw -F qcow2 "$img" "$dir/e.qcow2"
check "qemu-img check" qemu-img check -q -f qcow2 "$dir/e.qcow2"

# ---- a qcow2 destination smaller than the source: its node grows ----
qemu-img create -q -f qcow2 "$dir/d.qcow2" 16M
migrate 4 "$img" "$dir/d.qcow2" false
expect "into a 16 MiB qcow2: both ends complete" "completed completed" "$res"
stop s4
stop d4
expect "the qcow2 image grew to the source's size" 50331648 \
	"$(qemu-img info --output=json "$dir/d.qcow2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')"
check "qemu-img check" qemu-img check -q -f qcow2 "$dir/d.qcow2"
check "qemu-img compare: equal to the source" \
	qemu-img compare -f raw -F qcow2 "$img" "$dir/d.qcow2"
