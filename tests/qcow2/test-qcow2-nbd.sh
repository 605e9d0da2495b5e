#!/bin/sh
# iocore-nbd serving qcow2 images: found by their magic and with -f qcow2,
# written and read by qemu-io, the same bytes as qemu-nbd's view of the
# same file, qemu-img check clean after; -f raw serves the file's bytes;
# the image's persistent bitmaps on the control socket, kept by writes.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/../nbd/nbd-test-lib.sh"
need qemu-img qemu-io qemu-nbd
workdir ioc-qcow2-nbd
echo "1..10"
uri() { echo "nbd+unix:///?socket=$dir/$1.sock"; }
serve() { _n=$1; shift; srv --fork --pid-file "$dir/$_n.pid" -U "$dir/$_n.sock" "$@"; }

qemu-img create -q -f raw "$dir/base.raw" 16M
qemu-io -f raw -c 'write -P 0x21 0 4M' "$dir/base.raw" >/dev/null
qemu-img create -q -f qcow2 -b "$dir/base.raw" -F raw "$dir/top.qcow2" 16M
check "a qcow2 file over a raw backing file is served by its magic" serve a "$dir/top.qcow2"
check "writes and reads through it" qemu-io -f raw -c 'write -P 0x42 1M 64k' \
	-c 'read -P 0x21 0 1M' -c 'read -P 0x42 1M 64k' "$(uri a)"
stop a
check "qemu-img check is clean" qemu-img check -q "$dir/top.qcow2"
qemu-nbd -f qcow2 -r -k "$dir/q.sock" --fork --pid-file "$dir/q.pid" "$dir/top.qcow2"
serve b -r -f qcow2 "$dir/top.qcow2"
check "-f qcow2 serves what qemu-nbd serves" \
	qemu-img compare -f raw -F raw "$(uri b)" "nbd+unix:///?socket=$dir/q.sock"
stop b
stop q
serve c -r -f raw "$dir/top.qcow2"
check "-f raw serves the file's own bytes" qemu-img compare -f raw -F raw "$(uri c)" "$dir/top.qcow2"
stop c
# A bitmap qemu-img added: listed on iocore-nbd's control socket, its
# count grows with a write, a new one added there, both in the image after.
qemu-img bitmap --add "$dir/top.qcow2" b0
bitmaps() {
	ctl d --json query-named-block-nodes | python3 -c "import json, sys
print(' '.join('%s:%d' % (b['name'], b['count'])
               for b in sorted(json.load(sys.stdin)[0]['dirty-bitmaps'], key=lambda b: b['name'])))"
}
srv --fork --pid-file "$dir/d.pid" -U "$dir/d.sock" --control "$dir/d.ctl" -f qcow2 "$dir/top.qcow2"
expect "the image's bitmap is listed on the control socket" "b0:0" "$(bitmaps)"
qemu-io -f raw -c 'write -P 0x43 4M 64k' "$(uri d)" >/dev/null
ctl d block-dirty-bitmap-add node= name=b1 persistent=true >/dev/null
expect "a write dirties it; a persistent one is added" "b0:65536 b1:0" "$(bitmaps)"
stop d
expect "both are in the image after iocore-nbd stops" "b0 b1" \
	"$(qemu-img info --output=json "$dir/top.qcow2" | python3 -c "import json, sys
print(' '.join(sorted(b['name'] for b in
      json.load(sys.stdin)['format-specific']['data'].get('bitmaps', []))))")"
if srv -f vmdk "$dir/top.qcow2" 2>/dev/null; then notok "an unknown format is refused"
else ok "an unknown format is refused"; fi
expect "a malformed rbd: name is refused with the reason" 1 \
	"$(srv 'rbd:' 2>&1 | grep -ci 'pool')"
exit 0
