#!/bin/sh
# Active mirroring during a live migration between two iocore-nbd: fio
# writes 4 KiB blocks at random far faster than the migration's link
# (max-bandwidth), so dirty passes alone never catch up.  With
# __org.iocore_active-mirror the migration must reach completed while fio
# still writes, the images must be equal (cmp) and query-migrate must say
# that writes were mirrored (with __org.iocore_write-admission at its
# default, then with it off in the cancel case).  migrate_cancel and kill
# -9 of the destination while writes wait for the destination (or, on a
# slow machine, wait at a switch-over paused by pause-before-switchover):
# fio (verifying what it wrote, stopping at the first error) must see
# every write succeed, and the source keeps serving.  The parameters'
# values.  Loopback; waits poll with deadlines; nothing asserts on
# timing.  TAP output.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/nbd-test-lib.sh"

need_built "$SRV" "$CTL"
need fio qemu-io python3
fio --enghelp=nbd >/dev/null 2>&1 || { echo "1..0 # SKIP fio without the nbd engine"; exit 77; }
workdir ioc-nbd-migrate-mirror
echo "1..23"

# wait_mirrored CTL: until query-migrate counts a mirrored write, or the
# migration paused before its switch-over (60 s).  The failure cases run
# with pause-before-switchover so that the migration cannot complete
# before the cancel or the kill, however slow the machine: the failure
# then finds writes waiting for the destination's answer, or held at the
# switch-over; fio must see every one of them succeed either way.
wait_mirrored() {
	i=0
	while [ $i -lt 1200 ]; do
		[ "$(qfield "$1" 'q.get("__org.iocore_mirrored-writes", 0) > 0 or
			q.get("status") == "pre-switchover"')" = True ] && return 0
		i=$((i + 1)); sleep 0.05
	done
	return 1
}
# fio_start CTL ARGS...: fio writing 4 KiB blocks at random through the
# source's socket in the background ($fpid); output in $dir/fio.out.
fio_start() {
	s=$1; shift
	fio --name=w --ioengine=nbd --uri="nbd+unix:///?socket=$dir/$s.sock" --rw=randwrite \
		--bs=4k --iodepth=8 --continue_on_error=none "$@" \
		>"$dir/fio.out" 2>&1 &
	fpid=$!
}

mixed_image "$dir/a.ref"

# ---- the parameter ----
cp "$dir/a.ref" "$dir/a.img"
source_start s1 "$dir/a.img" || { echo "Bail out! source did not start"; exit 1; }
expect "__org.iocore_active-mirror is auto by default" auto \
	"$(ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; print(json.load(sys.stdin)["__org.iocore_active-mirror"])')"
check "set to off" ctl s1 migrate-set-parameters __org.iocore_active-mirror=off
expect "query says off" off \
	"$(ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; print(json.load(sys.stdin)["__org.iocore_active-mirror"])')"
if ctl s1 migrate-set-parameters __org.iocore_active-mirror=sometimes >/dev/null 2>&1; then
	notok "another value is rejected"
else
	ok "another value is rejected"
fi
ctl s1 migrate-set-parameters __org.iocore_active-mirror=auto >/dev/null
wa() {
	ctl s1 --json query-migrate-parameters | python3 -c 'import json,sys; print(json.load(sys.stdin)["__org.iocore_write-admission"])'
}
expect "__org.iocore_write-admission is 4 by default" 4 "$(wa)"
check "set to 0" ctl s1 migrate-set-parameters __org.iocore_write-admission=0
expect "query says 0" 0 "$(wa)"
if ctl s1 migrate-set-parameters __org.iocore_write-admission=1000001 >/dev/null 2>&1; then
	notok "a value above 1000000 is rejected"
else
	ok "a value above 1000000 is rejected"
fi
ctl s1 migrate-set-parameters __org.iocore_write-admission=4 >/dev/null

# ---- auto: completes while fio writes faster than the link ----
ctl s1 migrate-set-parameters max-bandwidth=4000000 downtime-limit=300 >/dev/null
port=$(free_port)
dest_start d1 "$dir/b.img" tcp:127.0.0.1:$port || { echo "Bail out! destination did not start"; exit 1; }
fio_start s1 --offset=32M --size=8M --time_based --runtime=300
# fio writing before the migration starts (bounded).
i=0; until [ "$(ctl s1 --json __org.iocore_query-connections | python3 -c 'import json,sys
print(len(json.load(sys.stdin)))')" -gt 0 ] || [ $i -gt 600 ]; do i=$((i + 1)); sleep 0.05; done
check "migrate" ctl s1 migrate uri=tcp:127.0.0.1:$port
st=$(wait_status s1 completed failed cancelled)
expect "completed" completed "$st"
check "query-migrate: active mirroring on, writes mirrored" python3 -c "
import json, sys
q = json.loads(sys.argv[1])
assert q['__org.iocore_active-mirror'] is True, q
assert q['__org.iocore_mirrored-writes'] > 0, q
" "$(ctl s1 --json query-migrate)"
expect_fio_cut $fpid "$dir/fio.out"
expect "destination completes" completed "$(wait_status d1 completed failed)"
check "the two images are equal (cmp)" cmp "$dir/a.img" "$dir/b.img"
expect "fio wrote into the image" differ \
	"$(cmp -s "$dir/a.img" "$dir/a.ref" && echo same || echo differ)"
stop s1; stop d1

# ---- migrate_cancel while writes wait for the destination ----
cp "$dir/a.ref" "$dir/a.img"; rm -f "$dir/b.img"
source_start s2 "$dir/a.img"
ctl s2 migrate-set-parameters max-bandwidth=1000000 __org.iocore_active-mirror=on \
	__org.iocore_write-admission=0 >/dev/null
caps s2 pause-before-switchover=true
port=$(free_port)
dest_start d2 "$dir/b.img" tcp:127.0.0.1:$port
# Every block of the first 4 MiB written once, then read back and
# checked, twice (pass 1 reaches them first: writes behind it are mirrored).
fio_start s2 --size=4M --loops=2 --verify=crc32c --do_verify=1 --verify_state_save=0
ctl s2 migrate uri=tcp:127.0.0.1:$port >/dev/null
wait_mirrored s2
check "migrate_cancel with writes being mirrored" ctl s2 migrate_cancel
expect "status cancelled" cancelled "$(wait_status s2 cancelled failed completed)"
wait $fpid; frc=$?
expect "fio: every write succeeded and reads back (verify)" 0 "$frc"
[ "$frc" = 0 ] || sed 's/^/# /' "$dir/fio.out" | tail -5
check "the source keeps serving" qemu-io -f raw -c 'write -P 0x5a 44M 64k' \
	-c 'read -P 0x5a 44M 64k' "nbd+unix:///?socket=$dir/s2.sock"
check "the data fio did not touch is intact" cmp -i 4M:4M -n 40M "$dir/a.img" "$dir/a.ref"
wait $dpid 2>/dev/null
stop s2

# ---- kill -9 of the destination while writes wait for it ----
cp "$dir/a.ref" "$dir/a.img"; rm -f "$dir/b.img"
source_start s3 "$dir/a.img"
ctl s3 migrate-set-parameters max-bandwidth=1000000 __org.iocore_active-mirror=on >/dev/null
caps s3 pause-before-switchover=true
port=$(free_port)
dest_start d3 "$dir/b.img" tcp:127.0.0.1:$port
fio_start s3 --size=4M --loops=2 --verify=crc32c --do_verify=1 --verify_state_save=0
ctl s3 migrate uri=tcp:127.0.0.1:$port >/dev/null
wait_mirrored s3
kill -9 $dpid; wait $dpid 2>/dev/null
expect "the source reports failed" failed "$(wait_status s3 failed completed cancelled)"
wait $fpid; frc=$?
expect "fio: every write succeeded and reads back (verify)" 0 "$frc"
[ "$frc" = 0 ] || sed 's/^/# /' "$dir/fio.out" | tail -5
check "the data fio did not touch is intact" cmp -i 4M:4M -n 40M "$dir/a.img" "$dir/a.ref"
stop s3
