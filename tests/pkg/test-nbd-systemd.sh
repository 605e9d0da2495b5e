#!/bin/sh
# The systemd units of iocore-nbd, as this build configured them
# (IOC_BUILD_ROOT/systemd): systemd-analyze verify finds nothing to say;
# the socket unit's listener and the service's command line, run the way
# systemd runs them (systemd-socket-activate passes the listening sockets
# and starts the server at the first connection), serve the image named by
# the instance, with the options of the instance's environment file; and
# SIGTERM, what systemctl stop sends, ends the server with status 0.  And
# under strace, every system call the server makes while it serves passes
# the service's SystemCallFilter= (denied calls would fail with EPERM).
# The command is the unit's own ExecStart= with its specifiers filled in;
# only the binary's directory is replaced by the build's.  TAP output.
# Usage: test-nbd-systemd.sh [B_SANITIZE]
set -u
SANITIZE=${1:-none}        # meson's b_sanitize
BUILD=${IOC_BUILD_ROOT:-build}
UNITS="$BUILD/systemd"
. "$(dirname "$0")/../nbd/nbd-test-lib.sh"

echo "1..8"
if [ ! -f "$UNITS/iocore-nbd@.service" ] || [ ! -x "$SRV" ]; then
	for i in 1 2 3 4 5 6 7 8; do skip "units" "no iocore-nbd or units in this build"; done
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi
workdir ioc-nbd-systemd
svc="$UNITS/iocore-nbd@.service"
sock="$UNITS/iocore-nbd@.socket"

# The image the instance names: 8 MiB, 1 MiB of it data.
img="$dir/images/disk.img"
mkdir -p "$dir/images"
truncate -s 8M "$img"
head -c 1M /dev/urandom | dd of="$img" bs=1M seek=3 conv=notrunc status=none

# unit_value FILE KEY: the last KEY= value in FILE.
unit_value() { sed -n "s/^$2=//p" "$1" | tail -n 1; }
# spec VALUE: fill in %f (the image), %i (the escaped instance, whose
# backslashes sed must not read as escapes) and %%.
sed_quote() { printf '%s' "$1" | sed 's/[\\&|]/\\&/g'; }
spec() {
	echo "$1" | sed -e "s|%f|$(sed_quote "$img")|g" -e "s|%i|$(sed_quote "$inst")|g" \
		-e 's|%%|%|g'
}

# listening N LOG: read the activator's messages from fd 4 (a FIFO on its
# standard error) into LOG until N sockets listen, or it exits; no sleep.
# Its messages say "Listening on PATH as FD." once a socket listens.
listening() {
	_k=0
	while [ "$_k" -lt "$1" ] && IFS= read -r _line <&4; do
		echo "$_line" >>"$2"
		case $_line in "Listening on "*) _k=$((_k + 1));; esac
	done
}

have_sd=true
for t in systemd-escape systemd-socket-activate systemd-analyze; do
	have "$t" || have_sd=false
done
# The instance that serves $img, and the path systemd gives %f for it.
inst=x f=$img
if $have_sd; then
	inst=$(systemd-escape --path "$img")
	f=$(systemd-escape --unescape --path "$inst")
fi

# 1: systemd-analyze verify, on an instance of each template whose
# ExecStart= names the build's binary (verify checks that it exists).
if $have_sd; then
	mkdir "$dir/units"
	for u in service socket; do
		sed "s|^ExecStart=[^ ]*/iocore-nbd |ExecStart=$(realpath "$SRV") |" \
			"$UNITS/iocore-nbd@.$u" >"$dir/units/iocore-nbd@$inst.$u"
	done
	if out=$(systemd-analyze verify --man=no "$dir/units/iocore-nbd@$inst.socket" \
		 "$dir/units/iocore-nbd@$inst.service" 2>&1) && [ -z "$out" ]; then
		ok "systemd-analyze verify has nothing to say about the units"
	else
		notok "systemd-analyze verify has nothing to say about the units"
		echo "$out" | sed 's/^/# /' | head -20
	fi
else
	skip "systemd-analyze verify" "systemd-escape, systemd-socket-activate or systemd-analyze missing"
fi

# The unit's scheme, which the steps below rely on (and iocore-nbd(8)
# documents): %f, unescaped from the instance, is the image; the socket
# is %i.sock; the service runs
# ".../iocore-nbd $IOCORE_NBD_OPTS %f" with the options from
# SYSCONFDIR/iocore/nbd-%i.conf.
listen=$(unit_value "$sock" ListenStream)
exec_start=$(unit_value "$svc" ExecStart)
envfile=$(unit_value "$svc" EnvironmentFile)
case "$listen|$exec_start|$envfile|$f" in
*/%i.sock\|*/iocore-nbd\ \$IOCORE_NBD_OPTS\ %f\|-*/iocore/nbd-%i.conf\|"$img")
	ok "the units listen on %i.sock and serve %f with \$IOCORE_NBD_OPTS from nbd-%i.conf" ;;
*)
	notok "the units' scheme: ListenStream=$listen ExecStart=$exec_start EnvironmentFile=$envfile %f=$f" ;;
esac

if ! $have_sd || ! have nbdinfo; then
	for i in 3 4 5 6 7 8; do skip "socket activation" "systemd-socket-activate or nbdinfo missing"; done
	exit 0
fi

# The instance's environment file, as EnvironmentFile= reads it.
conf="$dir/nbd-$inst.conf"
echo 'IOCORE_NBD_OPTS=-r -x disk --iothreads 2' >"$conf"
opts=$(sed -n 's/^IOCORE_NBD_OPTS=//p' "$conf")
# ExecStart= with $IOCORE_NBD_OPTS split into words, as systemd does for
# an unbraced $VAR, and the build's binary.
set -f
# shellcheck disable=SC2046 # word splitting is what systemd does here
set -- $(spec "$exec_start" | sed "s|\$IOCORE_NBD_OPTS|$opts|")
set +f
shift
# Two sockets, as a socket unit with a second ListenStream= passes them
# (here, not in /run; and without %i's backslashes, which URIs refuse).
s1="$dir/first.sock"
s2="$dir/second.sock"
mkfifo "$dir/activate.fifo"
systemd-socket-activate -l "$s1" -l "$s2" -- "$SRV" "$@" 2>"$dir/activate.fifo" &
pid=$!
echo "$pid" >"$dir/activate.pid"
# It says so once both sockets listen; the server starts at the first
# connection.  The FIFO stays open until the activator is gone, and the
# pipe holds the few lines it writes meanwhile.
exec 4<"$dir/activate.fifo"
listening 2 "$dir/activate.log"

# 3-5: nbdinfo through the first socket: the image, read-only, named
# "disk": so the options of the environment file arrived.
json=$(timeout 60 nbdinfo --json "nbd+unix:///disk?socket=$s1" 2>&1)
if echo "$json" | python3 -c 'import json,sys; e=json.load(sys.stdin)["exports"][0]; assert e["export-size"]==8<<20 and e["is_read_only"] and e["export-name"]=="disk", e' 2>/dev/null; then
	ok "nbdinfo through the activated socket: 8 MiB, read-only, export \"disk\""
else
	notok "nbdinfo through the activated socket"
	echo "$json" | sed 's/^/# /' | head -20
	sed 's/^/# activate: /' "$dir/activate.log"
fi
if have nbdcopy; then
	check "the data read through the socket is the image's" sh -c \
		"timeout 60 nbdcopy 'nbd+unix:///disk?socket=$s1' - | cmp - '$img'"
else
	skip "data through the socket" "nbdcopy missing"
fi
check "the second activated socket serves too" \
	timeout 60 nbdinfo --size "nbd+unix:///disk?socket=$s2"

# 6-7: SIGTERM, as systemctl stop: the server exits 0 and is gone.
kill -TERM "$pid"
wait "$pid"
rc=$?
cat <&4 >>"$dir/activate.log"
exec 4<&-
rm -f "$dir/activate.pid"
if [ "$rc" -eq 0 ]; then
	ok "SIGTERM: the server exits 0"
else
	notok "SIGTERM: the server exits 0 (status $rc)"
	sed 's/^/# activate: /' "$dir/activate.log"
fi
if timeout 10 nbdinfo --size "nbd+unix:///disk?socket=$s1" >/dev/null 2>&1; then
	notok "after SIGTERM nothing serves the socket"
else
	ok "after SIGTERM nothing serves the socket"
fi

# 8: the system calls of an activated server serving reads, writes and
# flushes, against the unit's SystemCallFilter= lines (an allow list, then
# ~ deny lists), with the groups expanded by systemd-analyze.
if ! have strace; then
	skip "system calls within SystemCallFilter=" "strace missing"
	exit 0
fi
if [ "$SANITIZE" != none ]; then
	skip "system calls within SystemCallFilter=" "a $SANITIZE build: its runtime makes calls of its own"
	exit 0
fi
# expand NAME...: the system calls of each name or @group, one a line.
expand() {
	for x in "$@"; do
		case $x in
		@*) systemd-analyze syscall-filter "$x" | awk 'NR > 1 && $1 !~ /^#/ { print $1 }' |
			while read -r y; do expand "$y"; done ;;
		*) echo "$x" ;;
		esac
	done
}
: >"$dir/allow"; : >"$dir/deny"
sed -n 's/^SystemCallFilter=//p' "$svc" >"$dir/filters"
while read -r f; do
	# shellcheck disable=SC2086 # each value is a list of names
	case $f in
	~*) expand ${f#\~} >>"$dir/deny" ;;
	*) expand $f >>"$dir/allow" ;;
	esac
done <"$dir/filters"
cp "$img" "$dir/images/rw.img"
mkfifo "$dir/activate2.fifo"
strace -f -qq -o "$dir/trace" systemd-socket-activate -l "$dir/third.sock" -- \
	"$SRV" --pid-file "$dir/srv.pid" "$dir/images/rw.img" 2>"$dir/activate2.fifo" &
spid=$!
echo "$spid" >"$dir/strace.pid"
exec 4<"$dir/activate2.fifo"
listening 1 "$dir/activate2.log"
U3="nbd+unix:///?socket=$dir/third.sock"
head -c 2M /dev/urandom >"$dir/data"
timeout 60 nbdcopy --flush "$dir/data" "$U3" >"$dir/io.log" 2>&1
timeout 60 nbdcopy "$U3" - 2>>"$dir/io.log" | head -c 2M | cmp -s - "$dir/data"
io=$?
if [ -s "$dir/srv.pid" ]; then kill -TERM "$(cat "$dir/srv.pid")"; else kill "$spid"; fi
wait "$spid"
rm -f "$dir/strace.pid"
cat <&4 >>"$dir/activate2.log"
exec 4<&-
# The server's calls: from its execve on (before it, systemd-socket-activate
# ran in the same process), every thread.
awk 'on { s = $2; sub(/\(.*/, "", s); if (s ~ /^[a-z_0-9]+$/) print s }
	/execve\(".*iocore-nbd"/ { on = 1 }' "$dir/trace" | sort -u >"$dir/used"
bad=$( { sort -u "$dir/allow" | comm -23 "$dir/used" -
	 sort -u "$dir/deny" | comm -12 "$dir/used" -; } | tr '\n' ' ')
if [ "$io" -ne 0 ] || [ ! -s "$dir/used" ]; then
	notok "system calls within SystemCallFilter=: the traced server did not serve"
	sed 's/^/# /' "$dir/io.log" "$dir/activate2.log" | head -20
elif [ -n "$bad" ]; then
	notok "system calls outside the service's SystemCallFilter=: ${bad% }"
else
	ok "the server's $(wc -l <"$dir/used") system calls are within the service's SystemCallFilter="
fi
