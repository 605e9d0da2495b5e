# Shared by the NBD shell tests (sourced): TAP helpers, a scratch
# directory whose servers are killed and files removed at exit, and a
# server stop that waits for the process to end.

# The build's programs: IOC_BUILD_ROOT as meson sets it, build/ when a
# test is run by hand; a script may set any of them before sourcing this.
BUILD=${BUILD:-${IOC_BUILD_ROOT:-build}}
SRV=${SRV:-$BUILD/tools/nbd/iocore-nbd}
CTL=${CTL:-$BUILD/tools/ctl/iocore-ctl}
ZIP=${ZIP:-$BUILD/tools/zip/iocore-zip}
DAEMON=${DAEMON:-$BUILD/tools/daemon/iocore-storage-daemon}

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
# check NAME COMMAND...: the command must succeed; its output shows if not.
check() {
	name=$1; shift
	if out=$("$@" 2>&1); then ok "$name"; else
		notok "$name"; echo "$out" | sed 's/^/# /' | tail -20; fi
}
have() { command -v "$1" >/dev/null 2>&1; }
# need TOOL...: skip the whole test (TAP's plan with the reason, exit 77)
# unless every TOOL is installed; need_built PROGRAM...: the same for the
# build's own programs.
need() {
	for _t; do have "$_t" || { echo "1..0 # SKIP $_t missing"; exit 77; }; done
}
need_built() {
	for _p; do
		[ -x "$_p" ] || { echo "1..0 # SKIP $(basename "$_p") not built"; exit 77; }
	done
}
# srv ARGS...: run the server binary $SRV, through the cross build's
# emulator when meson says there is one (MESON_EXE_WRAPPER, e.g.
# qemu-aarch64; unquoted on purpose, so that it splits into words).
srv() { ${MESON_EXE_WRAPPER:-} "$SRV" "$@"; }

# mixed_image FILE: a 48 MiB raw image of 8 MiB of compressible text,
# 4 MiB of random data, 2 MiB of zeros written as data and holes (what a
# migration must send raw, compressed, as zeroes and not at all).
mixed_image() {
	truncate -s 48M "$1"
	python3 -c 'import sys; sys.stdout.write("".join("line %08d of an image that compresses\n" % i for i in range(220000)))' |
		dd of="$1" bs=1M count=8 conv=notrunc iflag=fullblock 2>/dev/null
	dd if=/dev/urandom of="$1" bs=1M count=4 seek=16 conv=notrunc 2>/dev/null
	dd if=/dev/zero of="$1" bs=1M count=2 seek=24 conv=notrunc 2>/dev/null
}

# workdir PREFIX: sets $dir to a fresh directory (in /dev/shm when it can);
# at exit every server with a pid file there is killed and it is removed.
workdir() {
	base=/tmp
	[ -w /dev/shm ] && base=/dev/shm
	dir=$(mktemp -d "$base/$1.XXXXXX")
	trap 'for f in "$dir"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done; rm -rf "$dir"' EXIT
	# A signal (meson's timeout sends TERM) exits through the EXIT trap:
	# a --daemonize'd server is in a session of its own and would live on.
	trap 'exit 1' INT TERM HUP
}

# wait_gone PID [SECONDS]: wait until PID has exited (a zombie counts;
# SECONDS at most, 10 by default); fails if it still runs then.  An
# empty PID (a pid file its server already removed) is gone: it must not
# reach /proc//stat, which is /proc/stat.
wait_gone() {
	[ -n "$1" ] || return 0
	_wg=0
	while [ $_wg -lt $(( ${2:-10} * 50 )) ]; do
		case $(cut -d' ' -f3 /proc/$1/stat 2>/dev/null) in ''|Z|X) return 0;; esac
		sleep 0.02; _wg=$((_wg + 1))
	done
	return 1
}

# stop NAME: SIGTERM the server of $dir/NAME.pid and wait (10 s at most)
# until it has exited.
stop() {
	pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 0
	kill "$pid"
	wait_gone "$pid"
	rm -f "$dir/$1.pid"
}

# Readiness from a server's -v log, without sleeping.  start_logged NAME
# COMMAND...: runs COMMAND (a server with -v --fork) with its stderr into
# the FIFO $dir/NAME.fifo, which this shell reads on fd 8; returns the
# command's status (with --fork: 0 once the server listens).
# await_log NAME TEXT: reads the server's log lines (copied to
# $dir/NAME.log) until one contains TEXT, then copies the rest in the
# background ($logcat; it ends when the server exits).  Fails if the
# server exits first.
start_logged() {
	name=$1; shift
	mkfifo "$dir/$name.fifo"
	"$@" 2>"$dir/$name.fifo" &
	spid=$!
	exec 8<"$dir/$name.fifo"
	wait $spid
}
await_log() {
	found=1
	while IFS= read -r line <&8; do
		printf '%s\n' "$line" >>"$dir/$1.log"
		case $line in *"$2"*) found=0; break;; esac
	done
	cat <&8 >>"$dir/$1.log" &
	logcat=$!
	exec 8<&-
	return $found
}

# The control socket and migration status, for tests that name their
# control sockets $dir/NAME.ctl (CTL is iocore-ctl).
ctl() { s=$1; shift; ${MESON_EXE_WRAPPER:-} "$CTL" -s "$dir/$s.ctl" "$@"; }
# source_start NAME IMAGE [OPTION...]: iocore-nbd serving IMAGE on
# $dir/NAME.sock with the control socket $dir/NAME.ctl, forked; its
# stderr goes to $dir/NAME.log.
source_start() {
	name=$1; image=$2; shift 2
	srv --fork --pid-file "$dir/$name.pid" -U "$dir/$name.sock" --control "$dir/$name.ctl" \
		--iothreads 2 "$@" "$image" 2>"$dir/$name.log"
}
# dest_start NAME IMAGE URI [OPTION...]: a migration destination in the
# background (no --fork, so its exit status can be had: $dpid); returns
# once it waits for the stream.
dest_start() {
	name=$1; image=$2; uri=$3; shift 3
	: >"$dir/$name.log"
	# Not through srv(): a function in the background would be a subshell,
	# and $! must be the server (kill -9, its exit status).
	${MESON_EXE_WRAPPER:-} "$SRV" -v -U "$dir/$name.sock" --control "$dir/$name.ctl" \
		--iothreads 2 "$@" --incoming "$uri" "$image" 2>"$dir/$name.log" &
	dpid=$!
	echo $dpid >"$dir/$name.pid"
	i=0
	until grep -q "waiting for an incoming migration" "$dir/$name.log"; do
		i=$((i + 1))
		[ $i -gt 600 ] && return 1
		kill -0 $dpid 2>/dev/null || return 1
		sleep 0.05
	done
}
# free_port: a TCP port nobody listens on now (the kernel picks it).
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# caps CTL NAME=BOOL...: migrate-set-capabilities.
caps() {
	c=$1; shift
	list=$(for a in "$@"; do printf '{"capability":"%s","state":%s},' "${a%%=*}" "${a#*=}"; done)
	ctl "$c" migrate-set-capabilities "capabilities:=[${list%,}]" >/dev/null
}
# qfield CTL EXPR: a Python expression over q = query-migrate's return.
qfield() {
	ctl "$1" --json query-migrate | python3 -c "import json,sys; q=json.load(sys.stdin); print($2)"
}
# wait_status CTL STATUS...: poll query-migrate until its status is one of
# STATUS (60 s at most); prints the status reached.
wait_status() {
	c=$1; shift
	i=0
	while [ $i -lt 1200 ]; do
		st=$(qfield "$c" 'q.get("status", "none")' 2>/dev/null)
		for w in "$@"; do [ "$st" = "$w" ] && { echo "$st"; return 0; }; done
		i=$((i + 1)); sleep 0.05
	done
	echo "$st"; return 1
}
# expect NAME WANT GOT: ok when the two agree word for word.
expect() {
	if [ "$(echo $2)" = "$(echo $3)" ]; then ok "$1"; else
		notok "$1"; printf '# want: %s\n# got:  %s\n' "$(echo $2)" "$(echo $3)"; fi
}
# expect_fio_cut PID OUT: a fio started to run far longer than the
# migration (300 s) stops only when a request fails.  The switch-over
# answers held and further requests with ESHUTDOWN (err=108) and closes
# the connection; a request fio sends as it closes fails on the socket
# instead (ENOTCONN 107, ECONNRESET 104, EPIPE 32), and libnbd then fails
# the rest with that error, whatever replies were on their way.  When the
# close reaches libnbd while fio waits for completions, nbd_poll() itself
# fails: fio's nbd engine then prints "fio: nbd_poll: ..." and stops with
# no request error at all.  Each proves fio was still writing at the
# switch-over.  OUT is fio's output.
expect_fio_cut() {
	wait "$1"; _frc=$?
	_ferr=$(grep -oE 'err= *[0-9]+' "$2" | grep -v 'err= *0$' | head -1)
	_fpoll=$(grep -m1 'fio: nbd_poll:' "$2")
	echo "# fio ended with ${_ferr:-no error}${_fpoll:+, $_fpoll}"
	_fcut="$_frc $( { echo "$_ferr" | grep -qE '= *(108|107|104|32)$' ||
		[ -n "$_fpoll" ]; } && echo yes || echo no)"
	expect "fio was still writing at the switch-over (stopped by the server)" "1 yes" "$_fcut"
	# Anything else: fio's own words, to tell what stopped it.
	[ "$_fcut" = "1 yes" ] || grep -iE 'error|err=|fio:' "$2" | head -8 | sed 's/^/# /'
}

# make_pki DIR: a test CA and, laid out as QEMU's tls-creds-x509 wants
# them, DIR/pki (ca-cert.pem, server-cert.pem, server-key.pem: the
# server's, for localhost and 127.0.0.1) and DIR/spki (the same plus
# client-cert.pem and client-key.pem: a client's); DIR/ca-key.pem signs.
# Fails when certtool (gnutls-bin) cannot make them.
make_pki() {
	_d=$1
	mkdir -p "$_d/pki" "$_d/spki"
	printf 'cn = iocore test CA\nca\ncert_signing_key\nexpiration_days = 2\n' >"$_d/ca.info"
	printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$_d/srv.info"
	printf 'cn = iocore test client\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$_d/cli.info"
	certtool --generate-privkey --key-type=ecdsa --outfile "$_d/ca-key.pem" 2>/dev/null &&
	certtool --generate-self-signed --load-privkey "$_d/ca-key.pem" --template "$_d/ca.info" \
		--outfile "$_d/pki/ca-cert.pem" 2>/dev/null &&
	certtool --generate-privkey --key-type=ecdsa --outfile "$_d/pki/server-key.pem" 2>/dev/null &&
	certtool --generate-certificate --load-privkey "$_d/pki/server-key.pem" \
		--load-ca-certificate "$_d/pki/ca-cert.pem" --load-ca-privkey "$_d/ca-key.pem" \
		--template "$_d/srv.info" --outfile "$_d/pki/server-cert.pem" 2>/dev/null &&
	certtool --generate-privkey --key-type=ecdsa --outfile "$_d/spki/client-key.pem" 2>/dev/null &&
	certtool --generate-certificate --load-privkey "$_d/spki/client-key.pem" \
		--load-ca-certificate "$_d/pki/ca-cert.pem" --load-ca-privkey "$_d/ca-key.pem" \
		--template "$_d/cli.info" --outfile "$_d/spki/client-cert.pem" 2>/dev/null &&
	cp "$_d/pki/ca-cert.pem" "$_d/pki/server-cert.pem" "$_d/pki/server-key.pem" "$_d/spki/"
}
