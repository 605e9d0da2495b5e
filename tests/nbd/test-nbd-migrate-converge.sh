#!/bin/sh
# auto-converge during a live migration between two iocore-nbd: QEMU
# 7.2's capability and its parameters (throttle-trigger-threshold,
# cpu-throttle-initial, -increment, -tailslow, max-cpu-throttle) with
# QEMU's defaults, their round trip and ranges; then a migration under a
# writer (fio) far faster than the link (max-bandwidth): the throttle must
# engage within its bounds (query-migrate's cpu-throttle-percentage, back
# to 0 at the end), the migration must complete while fio still writes
# and the images must be equal (cmp).  With the capability off nothing is
# throttled.  Loopback; waits poll with deadlines; nothing asserts on
# timing.  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
need fio python3
fio --enghelp=nbd >/dev/null 2>&1 || { echo "1..0 # SKIP fio without the nbd engine"; exit 77; }
workdir ioc-nbd-migrate-converge
echo "1..24"

# params CTL: query-migrate-parameters' throttle keys, in a fixed order.
params() {
	ctl "$1" --json query-migrate-parameters | python3 -c 'import json,sys
p = json.load(sys.stdin)
print(" ".join(str(p[k]) for k in ("throttle-trigger-threshold", "cpu-throttle-initial",
      "cpu-throttle-increment", "cpu-throttle-tailslow", "max-cpu-throttle")))'
}
# cap CTL: the state of capability auto-converge.
cap() {
	ctl "$1" --json query-migrate-capabilities | python3 -c 'import json,sys
print([c["state"] for c in json.load(sys.stdin) if c["capability"] == "auto-converge"])'
}
# rejected NAME ARGS...: ok when migrate-set-parameters ARGS fails.
rejected() {
	name=$1; shift
	if ctl s1 migrate-set-parameters "$@" >/dev/null 2>&1; then notok "$name"; else ok "$name"; fi
}
fio_start() {
	s=$1; shift
	fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$dir/$s.sock" --rw=randwrite \
		--bs=4k --iodepth=8 --continue_on_error=none "$@" \
		>"$dir/fio.out" 2>&1 &
	fpid=$!
}
# wait_conn CTL: until the server has an NBD connection (30 s).
wait_conn() {
	i=0
	until [ "$(ctl "$1" --json __org.iocore_query-connections | python3 -c 'import json,sys
print(len(json.load(sys.stdin)))')" -gt 0 ] || [ $i -gt 600 ]; do i=$((i + 1)); sleep 0.05; done
}

truncate -s 48M "$dir/a.ref"
dd if=/dev/urandom of="$dir/a.ref" bs=1M count=8 seek=4 conv=notrunc 2>/dev/null

# ---- the capability and the parameters ----
cp "$dir/a.ref" "$dir/a.img"
source_start s1 "$dir/a.img" || { echo "Bail out! source did not start"; exit 1; }
expect "auto-converge is listed, off by default" "[False]" "$(cap s1)"
expect "QEMU 7.2's defaults: threshold 50, initial 20, increment 10, tailslow off, max 99" \
	"50 20 10 False 99" "$(params s1)"
check "set them" ctl s1 migrate-set-parameters throttle-trigger-threshold=100 \
	cpu-throttle-initial=1 cpu-throttle-increment=99 cpu-throttle-tailslow=true max-cpu-throttle=7
expect "query-migrate-parameters returns them" "100 1 99 True 7" "$(params s1)"
rejected "cpu-throttle-initial 0 is rejected" cpu-throttle-initial=0
rejected "cpu-throttle-initial 100 is rejected" cpu-throttle-initial=100
rejected "cpu-throttle-increment 100 is rejected" cpu-throttle-increment=100
rejected "max-cpu-throttle 100 is rejected" max-cpu-throttle=100
rejected "throttle-trigger-threshold 101 is rejected" throttle-trigger-threshold=101
rejected "a string is rejected" cpu-throttle-initial=much
rejected "cpu-throttle-tailslow must be a boolean" cpu-throttle-tailslow=1
expect "a rejected call changed nothing" "100 1 99 True 7" "$(params s1)"
check "set the capability" ctl s1 migrate-set-capabilities \
	'capabilities:=[{"capability":"auto-converge","state":true}]'
expect "query-migrate-capabilities says on" "[True]" "$(cap s1)"

# ---- a throttled migration: completes, images equal ----
ctl s1 migrate-set-parameters cpu-throttle-initial=30 cpu-throttle-increment=15 \
	cpu-throttle-tailslow=false max-cpu-throttle=60 throttle-trigger-threshold=50 \
	max-bandwidth=4000000 downtime-limit=300 >/dev/null
port=$(free_port)
dest_start d1 "$dir/b.img" tcp:127.0.0.1:$port || { echo "Bail out! destination did not start"; exit 1; }
fio_start s1 --offset=4M --size=8M --time_based --runtime=300
wait_conn s1
check "migrate" ctl s1 migrate uri=tcp:127.0.0.1:$port
# The throttle, sampled while it runs: every value seen must be a step
# (30, 45, 60: initial, + increment, capped by max-cpu-throttle) or 0.
seen=""
i=0
while [ $i -lt 1200 ]; do
	v=$(qfield s1 'str(q.get("status")) + ":" + str(q.get("cpu-throttle-percentage"))')
	case "$v" in
	active:*) seen="$seen ${v#active:}" ;;
	completed:* | failed:* | cancelled:*) break ;;
	esac
	i=$((i + 1)); sleep 0.05
done
expect "completed" completed "$(wait_status s1 completed failed cancelled)"
expect "every throttle seen while active is 0 or a step up to max-cpu-throttle" ok \
	"$(for x in $seen; do case $x in 0|30|45|60) ;; *) echo "bad $x";; esac; done; echo ok)"
check "query-migrate: the throttle engaged, within max-cpu-throttle; 0 at the end" python3 -c "
import json, sys
q = json.loads(sys.argv[1])
assert q['__org.iocore_cpu-throttle-max'] in (30, 45, 60), q
assert q['cpu-throttle-percentage'] == 0, q
assert q['__org.iocore_mirrored-writes'] > 0, q
" "$(ctl s1 --json query-migrate)"
expect_fio_cut $fpid "$dir/fio.out"
expect "destination completes" completed "$(wait_status d1 completed failed)"
check "the two images are equal (cmp)" cmp "$dir/a.img" "$dir/b.img"
stop s1; stop d1

# ---- the capability off: no throttle ----
cp "$dir/a.ref" "$dir/a.img"; rm -f "$dir/b.img"
source_start s2 "$dir/a.img"
ctl s2 migrate-set-parameters max-bandwidth=8000000 >/dev/null
port=$(free_port)
dest_start d2 "$dir/b.img" tcp:127.0.0.1:$port
fio_start s2 --offset=4M --size=8M --time_based --runtime=300
wait_conn s2
ctl s2 migrate uri=tcp:127.0.0.1:$port >/dev/null
expect "completed without auto-converge" completed "$(wait_status s2 completed failed cancelled)"
check "query-migrate has no throttle, writes were mirrored" python3 -c "
import json, sys
q = json.loads(sys.argv[1])
assert 'cpu-throttle-percentage' not in q, q
assert q['__org.iocore_mirrored-writes'] > 0, q
" "$(ctl s2 --json query-migrate)"
wait $fpid
expect "destination completes" completed "$(wait_status d2 completed failed)"
stop s2; stop d2
