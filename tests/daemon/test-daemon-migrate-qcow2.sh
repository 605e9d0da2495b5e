#!/bin/sh
# Live migration by copy of a qcow2 node of iocore-storage-daemon: the
# copy reads through the node (its clusters, its zero clusters, its
# backing file), not the image file.  A qcow2 image over a raw backing
# file migrates to an iocore-nbd destination (a raw image filled with
# garbage first, so every block must arrive) while an NBD client writes,
# writes zeroes and discards through the daemon's export; once for each
# of the copy's two paths (compress off: inline; on: the workqueue).
# pause-before-switchover keeps the migration from ending before the
# client is done, so every write the client made is made during the
# migration, whatever the machine's speed.  Then: the destination equals
# the source (qemu-img compare against the closed qcow2 image), holds each
# write the source acknowledged, and the copy's reads were not counted in
# the node's statistics (the client only wrote).
# Loopback only; every wait has a deadline; nothing asserts on timing.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/../nbd/nbd-test-lib.sh"

need qemu-io qemu-img python3
workdir ioc-daemon-migrate-qcow2
echo "1..22"

uri() { echo "nbd+unix:///disk?socket=$dir/$1.sock"; }
# rd_bytes of the node "disk" in query-blockstats.
rd_bytes() {
	ctl src --json query-blockstats query-nodes=true | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if e.get("node-name") == "disk":
        print(e["stats"]["rd_bytes"]); break
else:
    print("none")'
}

# The base: a pattern over its first 8 MiB.  The overlay: data clusters
# (random, so that compression does not shrink the copy below the
# bandwidth limit), a zero cluster over base data, unallocated clusters
# that show the base, and clusters nobody wrote (zeroes).
qemu-img create -q -f raw "$dir/base.raw" 48M
qemu-io -f raw -c 'write -P 0x42 0 8M' "$dir/base.raw" >/dev/null
head -c 16M /dev/urandom >"$dir/rand"

# The client's requests: sixteen writes that overlap nothing else it
# writes, ahead of and behind pass 1, over data, zero and backing
# clusters; then zeroes, a discard and one more write.
woff() { echo $(( $1 * 3145728 + $1 * 4096 )); }
cmds=""
for i in $(seq 0 15); do cmds="$cmds -c 'write -P $((0x80 + i)) $(woff $i) 12k'"; done
cmds="$cmds -c 'write -z 2M 64k' -c 'discard 13M 1M' -c 'write -P 0x99 7M 128k'"

for comp in false true; do
	rm -f "$dir/src.qcow2"
	qemu-img create -q -f qcow2 -b "$dir/base.raw" -F raw "$dir/src.qcow2" 48M
	qemu-io -f qcow2 -c "write -s $dir/rand 1M 3M" -c 'write -z 5M 1M' \
		-c "write -s $dir/rand 12M 16M" -c "write -s $dir/rand 40M 64k" \
		"$dir/src.qcow2" >/dev/null
	check "compress=$comp: the daemon serves a qcow2 node over a backing file" \
		${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/src.pid" \
		--blockdev "driver=file,node-name=f0,filename=$dir/src.qcow2" \
		--blockdev "driver=qcow2,node-name=disk,file=f0,discard=unmap" \
		--object iothread,id=io0 \
		--nbd-server "addr.type=unix,addr.path=$dir/src.sock" \
		--export "type=nbd,id=exp0,node-name=disk,name=disk,writable=on,iothread=io0" \
		--chardev "socket,id=mon0,path=$dir/src.ctl,server=on,wait=off" \
		--monitor chardev=mon0
	rd0=$(rd_bytes)

	# Garbage where the image will go: a block the copy skips shows.
	head -c 48M /dev/urandom >"$dir/dst.img"
	port=$(free_port)
	# Not through check(): its $(...) would wait for the destination.
	if dest_start dst "$dir/dst.img" "tcp:127.0.0.1:$port" -x disk; then
		ok "compress=$comp: an iocore-nbd destination waits"
	else
		notok "compress=$comp: an iocore-nbd destination waits"
	fi
	caps src pause-before-switchover=true compress=$comp
	# Pass 1 slow (19 MiB of data at 2 MB/s) while the client writes.
	ctl src migrate-set-parameters max-bandwidth=2000000 >/dev/null
	check "compress=$comp: migrate the qcow2 node" ctl src migrate uri=tcp:127.0.0.1:$port

	# The client, in the background: a write that comes after the hold
	# waits there, and fails once the source retired.  The migration
	# cannot end before migrate-continue, so every write acknowledged
	# was made during the migration.
	eval timeout 120 qemu-io -f raw $cmds "'$(uri src)'" >"$dir/writer.out" 2>&1 &
	wpid=$!
	i=0
	while kill -0 $wpid 2>/dev/null && [ $i -lt 1200 ] &&
	      [ "$(qfield src 'q["status"]')" != pre-switchover ]; do
		i=$((i + 1)); sleep 0.05
	done
	ctl src migrate-set-parameters max-bandwidth=0 >/dev/null
	expect "compress=$comp: pre-switchover" pre-switchover \
		"$(wait_status src pre-switchover completed failed)"
	check "compress=$comp: migrate-continue" ctl src migrate-continue state=pre-switchover
	expect "compress=$comp: completed" completed "$(wait_status src completed failed)"
	wait $wpid
	acked=$(grep -cE '^(wrote|discard) ' "$dir/writer.out")
	echo "# compress=$comp: $acked of 19 requests acknowledged before the hold"
	check "compress=$comp: the source acknowledged writes during the migration" \
		test "$acked" -ge 1
	expect "compress=$comp: the copy's reads are not the node's clients'" "$rd0" "$(rd_bytes)"
	# The qcow2 image is whole on disk only once the daemon closed it.
	stop src
	check "compress=$comp: the destination equals the qcow2 image" \
		qemu-img compare -f qcow2 -F raw "$dir/src.qcow2" "$(uri dst)"
	# Each acknowledged write, on the destination.
	bad=0
	for i in $(seq 0 15); do
		grep -q "^wrote 12288/12288 bytes at offset $(woff $i)\$" "$dir/writer.out" ||
			continue
		qemu-io -r -f raw -c "read -P $((0x80 + i)) $(woff $i) 12k" "$(uri dst)" 2>&1 |
			grep -q '^read ' || bad=$((bad + 1))
	done
	if grep -q '^wrote 65536/65536 bytes at offset 2097152$' "$dir/writer.out"; then
		qemu-io -r -f raw -c 'read -P 0 2M 64k' "$(uri dst)" 2>&1 |
			grep -q '^read ' || bad=$((bad + 1))
	fi
	expect "compress=$comp: the destination holds the client's writes" 0 "$bad"
	check "compress=$comp: and the image's zero cluster" sh -c \
		"qemu-io -r -f raw -c 'read -P 0 5M 1M' '$(uri dst)' | grep -q '^read '"
	stop dst
done
exit 0
