#!/bin/sh
# Live migration and dirty bitmaps on an export of iocore-storage-daemon:
# a bitmap added over the daemon's monitor tracks an NBD client's writes;
# the export migrates to an iocore-nbd destination, idle and while a
# client writes (on the export's I/O thread), with QEMU's commands on the
# daemon's monitor and its MIGRATION events there; the destination's
# image equals the source's.
# Loopback only; every wait has a deadline; nothing asserts on timing.
set -u
SRCDIR=$(cd "$(dirname "$0")" && pwd)
. "$SRCDIR/../nbd/nbd-test-lib.sh"

need qemu-io qemu-img nbdinfo python3
workdir ioc-daemon-migrate
echo "1..17"

# daemon NAME IMAGE [OPTION...]: the storage daemon with IMAGE as node
# "disk" and an NBD server on $dir/NAME.sock, its monitor on
# $dir/NAME.ctl, in the background.
daemon() {
	_n=$1; _i=$2; shift 2
	${MESON_EXE_WRAPPER:-} "$DAEMON" --daemonize --pidfile "$dir/$_n.pid" \
		--blockdev "driver=file,node-name=disk,filename=$_i" \
		--nbd-server "addr.type=unix,addr.path=$dir/$_n.sock" \
		--chardev "socket,id=mon0,path=$dir/$_n.ctl,server=on,wait=off" \
		--monitor chardev=mon0 "$@" 2>"$dir/$_n.log"
}
EXPORT="--export type=nbd,id=exp0,node-name=disk,name=disk,writable=on"
uri() { echo "nbd+unix:///disk?socket=$dir/$1.sock"; }

head -c 32M /dev/urandom >"$dir/src.img"
check "the daemon starts, daemonized" daemon src "$dir/src.img"
check "a bitmap on the daemon's node" ctl src block-dirty-bitmap-add node=disk name=b0
check "an export offering it" ctl src block-export-add type=nbd id=exp0 node-name=disk \
	name=disk writable=true 'bitmaps:=["b0"]'
qemu-io -f raw -c 'write -P 0x5a 1M 128k' -c 'write -P 0x5b 20M 64k' "$(uri src)" >/dev/null
expect "the bitmap counts the client's writes" 196608 \
	"$(ctl src --json query-named-block-nodes |
	   python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["dirty-bitmaps"][0]["count"])')"
check "a client reads the bitmap through the export" sh -c \
	"nbdinfo --map=qemu:dirty-bitmap:b0 '$(uri src)' | awk '\$3 == 1 { s = s \$1 \",\" } END { exit s != \"1048576,20971520,\" }'"

# Idle: the image as it is.
# The monitor's events, line by line, until the migration ends (60 s).
python3 - "$dir/src.ctl" "$dir/src.events" <<'PY' &
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.settimeout(60); s.connect(sys.argv[1])
f = s.makefile("rwb")
json.loads(f.readline())
f.write(b'{"execute": "qmp_capabilities"}\n'); f.flush()
json.loads(f.readline())
open(sys.argv[2] + ".ready", "w").close()
out = open(sys.argv[2], "w")
end = time.time() + 60
while time.time() < end:
    m = json.loads(f.readline())
    if m.get("event") == "MIGRATION":
        out.write("MIGRATION %s\n" % m["data"]["status"]); out.flush()
        if m["data"]["status"] in ("completed", "failed", "cancelled"):
            break
PY
evpid=$!
i=0; while [ ! -f "$dir/src.events.ready" ] && [ $i -lt 600 ]; do i=$((i + 1)); sleep 0.05; done
port=$(free_port)
truncate -s 0 "$dir/dst.img"
# Not through check(): its $(...) would wait for the destination to exit.
if dest_start dst "$dir/dst.img" "tcp:127.0.0.1:$port" -x disk; then ok "an iocore-nbd destination waits"
else notok "an iocore-nbd destination waits"; fi
check "the events capability on the daemon's monitor" caps src events=true
check "migrate on the daemon's monitor" ctl src migrate uri=tcp:127.0.0.1:$port
expect "query-migrate reaches completed" completed "$(wait_status src completed failed)"
wait $evpid
expect "MIGRATION events on the daemon's monitor" "MIGRATION setup MIGRATION active MIGRATION completed" \
	"$(grep -E 'setup|active|completed' "$dir/src.events")"
check "the destination serves the same bytes" sh -c \
	"qemu-img compare -f raw -F raw '$dir/src.img' '$(uri dst)'"
stop dst
stop src

# A client writes until the switch-over, its connections on the
# export's I/O thread (the switch-over retires them there).
check "the daemon starts again, exporting on its command line" daemon src "$dir/src.img" \
	--object iothread,id=io0 $EXPORT,iothread=io0
qemu-io -f raw -c 'write -P 0x11 0 4M' "$(uri src)" >/dev/null
python3 - "$dir/src.sock" >"$dir/writer.out" 2>&1 <<'PY' &
import subprocess, sys
# Writes one after another until the source refuses them (switch-over).
for i in range(4000):
    r = subprocess.run(["qemu-io", "-f", "raw", "-c", "write -P %d %d 64k" % (i % 200 + 1, (i % 256) * 65536),
                        "nbd+unix:///disk?socket=" + sys.argv[1]], capture_output=True, text=True)
    if r.returncode or "failed" in r.stdout + r.stderr:
        print("stopped at", i); break
else:
    print("never stopped")
PY
wpid=$!
port=$(free_port)
truncate -s 0 "$dir/dst.img"
if dest_start dst "$dir/dst.img" "tcp:127.0.0.1:$port" -x disk; then ok "a second destination waits"
else notok "a second destination waits"; fi
check "migrate while the client writes" ctl src migrate uri=tcp:127.0.0.1:$port
expect "completed under writes" completed "$(wait_status src completed failed)"
wait $wpid
check "the writer was stopped by the switch-over" grep -q "stopped at" "$dir/writer.out"
check "the destination holds every write the source took" sh -c \
	"qemu-img compare -f raw -F raw '$dir/src.img' '$(uri dst)'"
stop dst
stop src
exit 0
