# A one-host Ceph cluster for tests (sourced): one monitor, one memstore
# OSD and one manager, all under a temporary directory, none of it known
# to systemd, stopped by the pids this shell started.
#
# The problem: the rbd tests need a real cluster (librbd is the client
# under test, and qemu's rbd driver is the reference to compare with), but
# a test must not touch /etc/ceph, /var/lib/ceph or a system unit, must
# not collide with another engineer's run on the same machine, and must
# never hang the suite when a daemon does not come up.
#
# The design: ceph.conf with every path (run dir, log file, admin socket,
# mon/osd/mgr data) in the directory, authentication off (cephx would add
# keyrings to create and nothing to test), msgr v1 only on 127.0.0.1, one
# replica, memstore (no disk, a small RAM budget).  The monitor's port is
# a random free one, bind-tested before use; a monitor that still fails to
# bind (another run took the port in between) is retried on a new port.
# The OSD and the manager take ports from ceph's own range, which they
# probe themselves.  Every wait is bounded (CEPH_TIMEOUT seconds, 90 by
# default) and polls `ceph -s` / `ceph osd stat`, which are the readiness
# the daemons themselves report.
#
# The OSD is placed in the CRUSH map by this script (under root=default)
# rather than by the OSD itself at start: the monitor was seen refusing
# those start-up commands of the OSD's ("wrong fsid", on a freshly
# installed machine, every attempt of one run), and the OSD exits on it.
#
# Rejected: vstart.sh (needs a source tree), cephadm and ceph-deploy
# (containers, systemd, root), a fixed port (two runs collide), bluestore
# on a file (slower to mkfs and far larger than memstore's 256 MiB).
#
# Use:
#   . "$IOC_SOURCE_ROOT/tests/harness/ceph.sh"
#   ceph_require            # exit 77 when the packages are missing
#   ceph_start              # sets CEPH_DIR, CEPH_CONF, CEPH_OSD_PID; traps EXIT
#   ... rbd -c "$CEPH_CONF" ... ; qemu-img ... "rbd:rbd/img:conf=$CEPH_CONF"
#   ceph_stop               # also run by the EXIT trap
# ceph_start creates pool "rbd" and image "rbd/img" (CEPH_IMG_SIZE, 1G);
# the OSD's memstore holds CEPH_MEMSTORE_BYTES (256 MiB) of objects.
# CEPH_MEMSTORE_PAGE_SET=true stores objects in pages: memstore's default
# (one buffer list an object) costs more per small write with every write
# the object took, so a benchmark of 4 KiB writes measures the OSD's age.
# Diagnostics go to stderr prefixed with '#', so TAP output stays clean.

CEPH_TIMEOUT=${CEPH_TIMEOUT:-90}
CEPH_IMG_SIZE=${CEPH_IMG_SIZE:-1G}
CEPH_PIDS=""

ceph_log() { echo "# ceph: $*" >&2; }

# ceph_require: skip (77) when a daemon, tool or python3 is missing.
ceph_require() {
	for _c in ceph-mon ceph-osd ceph-mgr ceph rbd monmaptool python3; do
		if ! command -v "$_c" >/dev/null 2>&1; then
			echo "1..0 # SKIP $_c not installed (ceph-mon ceph-osd ceph-mgr ceph-common)"
			exit 77
		fi
	done
}

# ceph CMD...: the ceph CLI on this cluster, bounded.
cephc() { timeout "$CEPH_TIMEOUT" ceph -c "$CEPH_CONF" --connect-timeout 20 "$@"; }
rbdc() { timeout "$CEPH_TIMEOUT" rbd -c "$CEPH_CONF" "$@"; }

# A free TCP port on 127.0.0.1, by binding port 0 and reading it back; the
# kernel hands out ephemeral ports in turn, so two runs get different ones.
ceph_free_port() {
	python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ceph_write_conf() {
	cat >"$CEPH_CONF" <<EOF
[global]
fsid = $CEPH_FSID
mon host = v1:127.0.0.1:$CEPH_PORT
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
ms bind msgr2 = false
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
osd crush update on start = false
osd class update on start = false
osd objectstore = memstore
memstore device bytes = ${CEPH_MEMSTORE_BYTES:-268435456}
memstore page set = ${CEPH_MEMSTORE_PAGE_SET:-false}
osd max object name len = 256
osd max object namespace len = 64
osd memory target = 268435456
mon data avail warn = 1
mon data avail crit = 0
mgr initial modules =
run dir = $CEPH_DIR/run
log file = $CEPH_DIR/log/\$name.log
admin socket = $CEPH_DIR/run/\$name.asok
pid file = $CEPH_DIR/run/\$name.pid
mon data = $CEPH_DIR/mon-\$id
osd data = $CEPH_DIR/osd-\$id
mgr data = $CEPH_DIR/mgr-\$id
keyring = /dev/null
crash dir = $CEPH_DIR/crash
exit on mount failure = true
debug ms = ${CEPH_DEBUG_MS:-0}
[client]
log file = $CEPH_DIR/log/client.log
admin socket =
EOF
}

# ceph_wait SECONDS WHAT CMD...: run CMD every 0.5 s until it succeeds
# (0), SECONDS at most, or until it says waiting is pointless (2).
ceph_wait() {
	_cw_t=$1; _cw_what=$2; shift 2
	_cw_end=$(( $(date +%s) + _cw_t ))
	while [ "$(date +%s)" -lt $_cw_end ]; do
		"$@" >/dev/null 2>&1
		case $? in 0) return 0;; 2) return 1;; esac
		sleep 0.5
	done
	ceph_log "timed out after ${_cw_t}s waiting for $_cw_what"
	return 1
}

ceph_alive() { kill -0 "$1" 2>/dev/null; }

# Up, or fail at once (no point waiting) when the OSD process is gone.
ceph_osd_up() {
	ceph_alive "$CEPH_OSD_PID" || { ceph_log "ceph-osd exited"; return 2; }
	timeout 20 ceph -c "$CEPH_CONF" --connect-timeout 10 osd stat 2>/dev/null | grep -q '1 up'
}

# Start the monitor on a fresh port; 0 once it answers.
ceph_start_mon() {
	CEPH_PORT=$(ceph_free_port) || return 1
	ceph_write_conf
	rm -rf "$CEPH_DIR/mon-a" "$CEPH_DIR/monmap"
	monmaptool --create --fsid "$CEPH_FSID" --addv a "[v1:127.0.0.1:$CEPH_PORT]" \
		"$CEPH_DIR/monmap" >/dev/null || return 1
	ceph-mon -c "$CEPH_CONF" -i a --mkfs --monmap "$CEPH_DIR/monmap" \
		>>"$CEPH_DIR/log/setup.log" 2>&1 || return 1
	ceph-mon -c "$CEPH_CONF" -i a -f >>"$CEPH_DIR/log/mon.out" 2>&1 &
	CEPH_MON_PID=$!
	CEPH_PIDS="$CEPH_PIDS $CEPH_MON_PID"
	_end=$(( $(date +%s) + CEPH_TIMEOUT / 2 ))
	while [ "$(date +%s)" -lt $_end ]; do
		ceph_alive "$CEPH_MON_PID" || return 1
		if timeout 10 ceph -c "$CEPH_CONF" --connect-timeout 5 mon stat \
			>/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	return 1
}

# ceph_start: a fresh cluster with pool rbd and image rbd/img.  A start
# that fails (a daemon that crashes while it comes up: an OSD did, once
# in about ten runs on a loaded machine) is stopped and made again once
# from scratch; a second failure fails.  Each attempt is bounded by
# CEPH_TIMEOUT per wait.
ceph_start() {
	ceph_start_once && return 0
	ceph_log "start failed; stopping it and starting again"
	ceph_stop
	ceph_start_once
}

ceph_start_once() {
	_base=/tmp
	[ -w /dev/shm ] && _base=/dev/shm
	CEPH_DIR=$(mktemp -d "$_base/ioc-ceph.XXXXXX") || return 1
	CEPH_CONF=$CEPH_DIR/ceph.conf
	CEPH_FSID=$(python3 -c 'import uuid; print(uuid.uuid4())')
	mkdir -p "$CEPH_DIR/run" "$CEPH_DIR/log" "$CEPH_DIR/crash" \
		"$CEPH_DIR/osd-0" "$CEPH_DIR/mgr-x"
	trap 'ceph_stop' EXIT
	trap 'exit 1' INT TERM HUP
	export CEPH_CONF CEPH_DIR
	_t0=$(date +%s)

	_try=0
	until ceph_start_mon; do
		_try=$((_try + 1))
		[ -n "${CEPH_MON_PID:-}" ] && kill "$CEPH_MON_PID" 2>/dev/null
		wait "${CEPH_MON_PID:-}" 2>/dev/null
		if [ $_try -ge 3 ]; then
			ceph_log "monitor did not start; its log:"
			tail -20 "$CEPH_DIR/log/mon.a.log" "$CEPH_DIR/log/mon.out" \
				"$CEPH_DIR/log/setup.log" 2>/dev/null | sed 's/^/# /' >&2
			return 1
		fi
	done

	_id=$(cephc osd create) || { ceph_log "osd create failed"; return 1; }
	cephc osd crush add "osd.$_id" 1.0 root=default >>"$CEPH_DIR/log/setup.log" 2>&1 ||
		{ ceph_log "osd crush add failed"; tail -5 "$CEPH_DIR/log/setup.log" |
			sed 's/^/# /' >&2; return 1; }
	ceph-osd -c "$CEPH_CONF" -i "$_id" --mkfs >>"$CEPH_DIR/log/setup.log" 2>&1 ||
		{ ceph_log "ceph-osd --mkfs failed"; tail -20 "$CEPH_DIR/log/setup.log" >&2; return 1; }
	ceph-osd -c "$CEPH_CONF" -i "$_id" -f >>"$CEPH_DIR/log/osd.out" 2>&1 &
	CEPH_OSD_PID=$!
	CEPH_PIDS="$CEPH_PIDS $CEPH_OSD_PID"
	ceph-mgr -c "$CEPH_CONF" -i x -f >>"$CEPH_DIR/log/mgr.out" 2>&1 &
	CEPH_MGR_PID=$!
	CEPH_PIDS="$CEPH_PIDS $CEPH_MGR_PID"
	export CEPH_OSD_PID

	if ! ceph_wait "$CEPH_TIMEOUT" "the OSD to be up" ceph_osd_up; then
		# The first lines of a crash dump name the cause.
		grep -m5 -E 'FAILED|Caught signal|ceph_assert|abort' \
			"$CEPH_DIR/log/osd.$_id.log" 2>/dev/null | sed 's/^/# /' >&2
		tail -5 "$CEPH_DIR/log/osd.out" 2>/dev/null | sed 's/^/# /' >&2
		# Which monitor the OSD met, and what it said of it.
		ceph_log "mon 127.0.0.1:$CEPH_PORT, fsid $CEPH_FSID; the OSD's fsid and the mon's last lines:"
		cat "$CEPH_DIR/osd-$_id/ceph_fsid" 2>/dev/null | sed 's/^/# osd ceph_fsid: /' >&2
		grep -m3 -E 'handle_command on fsid|wrong' "$CEPH_DIR/log/mon.a.log" 2>/dev/null |
			sed 's/^/# mon: /' >&2
		ss -ltnp 2>/dev/null | grep ":$CEPH_PORT " | sed 's/^/# listening: /' >&2
		return 1
	fi
	cephc osd pool create rbd 8 >>"$CEPH_DIR/log/setup.log" 2>&1 &&
	cephc osd pool application enable rbd rbd >>"$CEPH_DIR/log/setup.log" 2>&1 ||
		{ ceph_log "pool create failed (exit $?)"; tail -5 "$CEPH_DIR/log/setup.log" |
			sed 's/^/# /' >&2; return 1; }
	rbdc create rbd/img --size "$CEPH_IMG_SIZE" ||
		{ ceph_log "rbd create failed"; return 1; }
	ceph_log "cluster up in $(( $(date +%s) - _t0 ))s (mon 127.0.0.1:$CEPH_PORT, $CEPH_DIR)"
	return 0
}

# ceph_stop: SIGTERM what ceph_start started, wait (bounded) and SIGKILL
# what is left; remove the directory.  Idempotent.
ceph_stop() {
	[ -n "$CEPH_PIDS" ] || { [ -n "${CEPH_DIR:-}" ] && rm -rf "$CEPH_DIR"; return 0; }
	for _p in $CEPH_PIDS; do kill -CONT "$_p" 2>/dev/null; kill "$_p" 2>/dev/null; done
	_s=0
	while [ $_s -lt 40 ]; do
		_left=""
		for _p in $CEPH_PIDS; do ceph_alive "$_p" && _left="$_left $_p"; done
		[ -z "$_left" ] && break
		sleep 0.25; _s=$((_s + 1))
	done
	for _p in $CEPH_PIDS; do kill -KILL "$_p" 2>/dev/null; done
	for _p in $CEPH_PIDS; do wait "$_p" 2>/dev/null; done
	CEPH_PIDS=""
	if [ -n "${CEPH_KEEP:-}" ]; then
		ceph_log "kept $CEPH_DIR"
	else
		rm -rf "$CEPH_DIR"
	fi
}
