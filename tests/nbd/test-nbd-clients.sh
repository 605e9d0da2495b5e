#!/bin/sh
# iocore-nbd with real clients: qemu-io, qemu-img, nbdinfo, nbdcopy, fio.
# TAP output; a client that is not installed skips its cases.
set -u
. "$(dirname "$0")/nbd-test-lib.sh"

echo "1..21"
if [ ! -x "$SRV" ]; then
	echo "# $SRV not built"; exit 77
fi
workdir ioc-nbd-clients

# start NAME [options] IMAGE: the server forks once it listens.
start() {
	name=$1; shift
	srv --fork --pid-file "$dir/$name.pid" -U "$dir/$name.sock" "$@"
}
uri() { echo "nbd+unix:///${2:-}?socket=$dir/$1.sock"; }

img="$dir/disk.img"
truncate -s 64M "$img"
start main -x disk -D "the test disk" "$img" || { echo "Bail out! server did not start"; exit 1; }
U=$(uri main disk)

# 1-2: nbdinfo --json and --list
if have nbdinfo; then
	check "nbdinfo --json reports size and flags" sh -c \
		"nbdinfo --json '$U' | python3 -c 'import json,sys; j=json.load(sys.stdin); e=j[\"exports\"][0]; assert e[\"export-size\"]==67108864, e; assert e[\"can_multi_conn\"] and e[\"can_flush\"] and e[\"can_fua\"], e; assert \"base:allocation\" in e[\"contexts\"], e'"
	check "nbdinfo --list shows the export and its description" sh -c \
		"nbdinfo --list 'nbd+unix:///?socket=$dir/main.sock' | grep -q 'export=\"disk\"' && nbdinfo --list 'nbd+unix:///?socket=$dir/main.sock' | grep -q 'the test disk'"
else
	skip "nbdinfo --json" "nbdinfo missing"; skip "nbdinfo --list" "nbdinfo missing"
fi

# 3: qemu-io patterns
if have qemu-io; then
	check "qemu-io writes patterns and reads them back" sh -c \
		"qemu-io -f raw -c 'write -P 0x11 0 1M' -c 'write -P 0x22 1M 4k' -c 'write -z 2M 64k' \
		 -c 'write -f -P 0x33 3M 512' -c 'flush' -c 'read -P 0x11 0 1M' -c 'read -P 0x22 1M 4k' \
		 -c 'read -P 0 2M 64k' -c 'read -P 0x33 3M 512' '$U' | grep -c 'read ' | grep -qx 4"
else
	skip "qemu-io patterns" "qemu-io missing"
fi

# 4-5: qemu-img convert both ways + compare
if have qemu-img; then
	head -c 8M /dev/urandom > "$dir/src.img"
	truncate -s 64M "$dir/src.img"
	check "qemu-img convert file -> nbd" qemu-img convert -n -f raw -O raw "$dir/src.img" "$U"
	check "qemu-img convert nbd -> file and compare" sh -c \
		"qemu-img convert -f raw -O raw '$U' '$dir/back.img' && qemu-img compare -f raw -F raw '$dir/src.img' '$dir/back.img' && cmp '$dir/src.img' '$img'"
else
	skip "qemu-img convert in" "qemu-img missing"; skip "qemu-img convert out" "qemu-img missing"
fi

# 6: block status agrees with the file (reference: nbdkit's file plugin on
# the same file, which also reads SEEK_DATA/SEEK_HOLE)
if have nbdinfo && have nbdkit; then
	sparse="$dir/sparse.img"
	truncate -s 32M "$sparse"
	dd if=/dev/urandom of="$sparse" bs=64k seek=16 count=16 conv=notrunc status=none
	dd if=/dev/urandom of="$sparse" bs=64k seek=200 count=1 conv=notrunc status=none
	start sparse -r "$sparse"
	ours=$(nbdinfo --map "$(uri sparse)")
	theirs=$(nbdkit -U - file "$sparse" --run 'nbdinfo --map "$uri"')
	if [ "$ours" = "$theirs" ] && echo "$ours" | grep -q hole; then
		ok "nbdinfo --map agrees with the file"
	else
		notok "nbdinfo --map agrees with the file"
		echo "# ours:"; echo "$ours" | sed 's/^/#   /'; echo "# nbdkit:"; echo "$theirs" | sed 's/^/#   /'
	fi
	# 7: a sparse read is correct (holes arrive as OFFSET_HOLE chunks)
	check "sparse structured read matches the file" sh -c \
		"nbdcopy '$(uri sparse)' - | cmp - '$sparse'"
	stop sparse
else
	skip "nbdinfo --map" "nbdinfo or nbdkit missing"; skip "sparse read" "nbdkit missing"
fi

# 8-11: nbdcopy both ways, 1 and 4 connections
if have nbdcopy; then
	for c in 1 4; do
		head -c 16M /dev/urandom > "$dir/cp.img"
		truncate -s 64M "$dir/cp.img"
		check "nbdcopy file -> nbd, $c connection(s)" sh -c \
			"nbdcopy --connections=$c '$dir/cp.img' '$U' && cmp '$dir/cp.img' '$img'"
		check "nbdcopy nbd -> file, $c connection(s)" sh -c \
			"rm -f '$dir/out.img' && truncate -s 64M '$dir/out.img' && nbdcopy --connections=$c '$U' '$dir/out.img' && cmp '$dir/cp.img' '$dir/out.img'"
	done
else
	for i in 1 2 3 4; do skip "nbdcopy" "nbdcopy missing"; done
fi

# 12-13: fio with verify through its nbd engine, 1 and 4 connections
if have fio && fio --enghelp 2>/dev/null | grep -q nbd; then
	check "fio verify=crc32c (1 connection)" fio --name=v --ioengine=nbd --uri="$U" \
		--rw=randwrite --bs=4k --size=16M --iodepth=32 --verify=crc32c \
		--do_verify=1 --verify_fatal=1 --verify_state_save=0 --output=/dev/null
	check "fio verify=crc32c (4 jobs)" fio --name=v --ioengine=nbd --uri="$U" \
		--rw=randwrite --bs=16k --size=8M --offset_increment=8M --numjobs=4 \
		--iodepth=16 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --output=/dev/null
else
	skip "fio verify" "fio nbd engine missing"; skip "fio verify 4 jobs" "fio nbd engine missing"
fi

# 14: read-only refusal
start ro -r "$img"
if have qemu-io; then
	# qemu-io sees READ_ONLY and refuses; the raw C test (nbd-server)
	# checks the server's own EPERM for writes sent anyway.
	before=$(cksum < "$img")
	if ! qemu-io -f raw -c 'write -P 1 0 4k' "$(uri ro)" >/dev/null 2>&1 &&
	   [ "$(cksum < "$img")" = "$before" ]; then
		ok "read-only export refuses writes"
	else
		notok "read-only export refuses writes"
	fi
else
	skip "read-only refusal" "qemu-io missing"
fi
stop ro

# 15: data written with FUA / flushed survives kill -9 of the server
if have qemu-io; then
	qemu-io -f raw -c 'write -P 0x77 5M 64k' -c 'flush' -c 'write -f -P 0x66 6M 4k' "$U" >/dev/null 2>&1
	kill -9 "$(cat "$dir/main.pid")"
	rm -f "$dir/main.pid"
	check "flushed and FUA data are in the image after kill -9" sh -c \
		"qemu-io -f raw -c 'read -P 0x77 5M 64k' -c 'read -P 0x66 6M 4k' '$img' | grep -c '^read' | grep -qx 2"
else
	skip "kill -9" "qemu-io missing"
fi

# 16: SIGTERM while fio has requests in flight: fio sees no I/O error
# before the disconnect, and the server exits 0 after answering.
if have fio && fio --enghelp 2>/dev/null | grep -q nbd; then
	start_logged term srv -v --fork --pid-file "$dir/term.pid" -U "$dir/term.sock" "$img"
	fio --name=t --ioengine=nbd --uri="$(uri term)" --rw=randwrite --bs=4k \
		--size=64M --iodepth=64 --time_based --runtime=30 --output=/dev/null \
		>"$dir/fio-term.log" 2>&1 &
	fiopid=$!
	# The signal lands once fio's connection has reached transmission
	# (the server logs the export it chose); the check below does not
	# depend on how many requests were in flight.
	await_log term 'export ""'
	kill -TERM "$(cat "$dir/term.pid")"
	wait $fiopid
	# fio fails once the server is gone; what matters is that the server
	# exited by itself (it drained) within the grace period.
	pid=$(cat "$dir/term.pid" 2>/dev/null)
	gone=false
	wait_gone "$pid" 15 && gone=true
	wait $logcat
	if $gone && [ ! -e "$dir/term.sock" ]; then
		ok "SIGTERM with fio in flight: server drains and exits"
	else
		notok "SIGTERM with fio in flight: server drains and exits"
		tail -5 "$dir/term.log" | sed 's/^/# /'
	fi
else
	skip "SIGTERM with fio" "fio nbd engine missing"
fi

# 17: systemd socket activation (LISTEN_FDS/LISTEN_PID), as make run uses
if have nbdinfo && have python3; then
	mkfifo "$dir/act.ready"
	python3 - "$SRV" "$dir/act.sock" "$dir/act.pid" "$img" 5>"$dir/act.ready" <<'PY' &
import os, socket, sys
srv, path, pidf, img = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(16)
os.close(5)  # the socket listens: the test may go on
os.dup2(s.fileno(), 100)
os.dup2(100, 3, inheritable=True)
env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
argv = os.environ.get("MESON_EXE_WRAPPER", "").split() + [srv]
os.execvpe(argv[0], argv + ["--pid-file", pidf, img], env)
PY
	actpid=$!
	# The socket listens before the server runs: clients queue on it.
	# Reading the FIFO ends (EOF) when the activator closes its end.
	cat "$dir/act.ready" >/dev/null
	check "socket activation (LISTEN_FDS)" sh -c \
		"nbdinfo 'nbd+unix:///?socket=$dir/act.sock' | grep -q 'export-size: 67108864'"
	kill $actpid 2>/dev/null
	wait $actpid 2>/dev/null
	rm -f "$dir/act.pid"
else
	skip "socket activation" "nbdinfo or python3 missing"
fi

# 18: TCP on a private port
tport=$((20000 + $$ % 20000))
if have nbdinfo && srv --fork --pid-file "$dir/tcp.pid" -b 127.0.0.1 -p $tport "$img" 2>/dev/null; then
	check "TCP listener" sh -c "nbdinfo nbd://127.0.0.1:$tport | grep -q 'export-size: 67108864'"
	kill "$(cat "$dir/tcp.pid")"
	rm -f "$dir/tcp.pid"
else
	skip "TCP listener" "nbdinfo missing or port $tport busy"
fi

# 19: one listener: -U with -p is refused, not half obeyed
if srv -U "$dir/both.sock" -p "$tport" "$img" 2>"$dir/both.err"; then
	notok "-U with -p is refused"
else
	check "-U with -p is refused" grep -q "cannot be combined" "$dir/both.err"
fi

# 20-21: a restart.  The next server takes the socket and pid file while
# the old one still runs (it replaces them); the old one, stopped after,
# must leave the successor's alone, and the successor, stopped last,
# removes both.
if have nbdinfo; then
	cp "$img" "$dir/re2.img"
	if srv --fork --pid-file "$dir/re.pid" -U "$dir/re.sock" -r "$img" &&
	   oldpid=$(cat "$dir/re.pid") &&
	   srv --fork --pid-file "$dir/re.pid" -U "$dir/re.sock" -r "$dir/re2.img"; then
		newpid=$(cat "$dir/re.pid")
		kill "$oldpid"
		gone=false
		wait_gone "$oldpid" && gone=true
		check "a server stopped after its successor started leaves its socket and pid file" \
			sh -c "[ '$newpid' != '$oldpid' ] && $gone &&
			       [ \"\$(cat '$dir/re.pid')\" = '$newpid' ] &&
			       nbdinfo 'nbd+unix:///?socket=$dir/re.sock' | grep -q 'export-size: 67108864'"
		kill "$newpid"
		gone=false
		wait_gone "$newpid" && gone=true
		check "the last server stopped removes its socket and pid file" \
			sh -c "$gone && [ ! -e '$dir/re.sock' ] && [ ! -e '$dir/re.pid' ]"
	else
		notok "a restart: servers did not start"; notok "a restart: no second server"
	fi
else
	skip "restart keeps the successor's socket" "nbdinfo missing"
	skip "restart: the last server cleans up" "nbdinfo missing"
fi

[ -f "$dir/main.pid" ] && stop main
exit 0
