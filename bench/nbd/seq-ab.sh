#!/bin/sh
# bench/nbd/seq-ab.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Two iocore-nbd binaries only, side by side on one image in /dev/shm over
# Unix sockets: 64 KiB and 1 MiB sequential reads and writes with fio (one
# connection, iodepth 8, 2 s), alternating between the two, ROUNDS times
# (default 3).  Per run: MiB/s, the server's CPU per I/O (utime+stime from
# /proc/PID/stat) and fio's own (usr+sys).  Fewer servers than seq.sh, so
# each round is short and the two binaries see the same machine load.
# Wrap it in flock /tmp/iocore-bench.lock.
OLD=$1 NEW=$2 ROUNDS=${3:-3}
[ -x "$OLD" ] && [ -x "$NEW" ] || { echo "usage: $0 OLD NEW [ROUNDS]" >&2; exit 2; }
D=$(mktemp -d /dev/shm/ioc-nbd-ab.XXXXXX) || exit 1
trap 'kill $(cat $D/p1 $D/p2 2>/dev/null) 2>/dev/null; rm -rf $D' EXIT
head -c 256M /dev/zero | tr '\0' 'Z' > $D/img
"$OLD" --fork --pid-file $D/p1 -U $D/s1 $D/img || exit 1
"$NEW" --fork --pid-file $D/p2 -U $D/s2 $D/img || exit 1
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
hz=$(getconf CLK_TCK)
r=0
while [ $r -lt "$ROUNDS" ]; do
	r=$((r + 1))
	for rw in write read; do for bs in 64k 1m; do for s in 1 2; do
		pid=$(cat $D/p$s); c0=$(cpu $pid)
		out=$(fio --name=s --ioengine=nbd --uri="nbd+unix:///?socket=$D/s$s" --rw=$rw \
			--bs=$bs --iodepth=8 --size=256M --time_based=1 --runtime=2 \
			--output-format=json 2>/dev/null)
		c1=$(cpu $pid)
		echo "$out" | python3 -c "
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.index('{'):])['jobs'][0]; d = j['$rw']
ios = d['total_ios']
print('$rw %-4s %s %6d MiB/s  server CPU %7.1f us/IO  client CPU %7.1f us/IO' % (
    '$bs', 'old' if $s == 1 else 'new', d['bw_bytes'] / 1048576,
    ($c1 - $c0) * 1e6 / $hz / ios,
    (j['usr_cpu'] + j['sys_cpu']) / 100 * j['job_runtime'] * 1000 / ios))"
	done; done; done
done | sort
