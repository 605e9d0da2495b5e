# Sourced by the tests that model-check a Promela model with spin
# (tests/*/test-*-model.sh): the skip rule, the scratch directory and the
# verifier build they share.  POSIX sh.
CC=${CC:-cc}

# spin_setup PLAN NAME: print the TAP plan.  Without spin or a C compiler
# every test is reported skipped and the script exits: 77 when run alone,
# 0 under meson (IOC_TAP_ONLY, as tests/harness/tap.h: meson 1.0's TAP
# parser counts 77 as a failure).  Otherwise work in a temporary
# directory that is removed on exit.  In a cross build (IOC_CROSS_BUILD,
# set by tests/meson.build) they skip too: a model runs on the build
# machine whatever the target, and the native suite has checked it.
spin_setup() {
	echo "1..$1"
	_why=
	if [ -n "${IOC_CROSS_BUILD:-}" ]; then
		_why="a model check runs on the build machine; the native suite runs it"
	elif ! command -v spin >/dev/null 2>&1 || ! command -v "$CC" >/dev/null 2>&1; then
		_why="spin or $CC not installed"
	fi
	if [ -n "$_why" ]; then
		_i=1
		while [ "$_i" -le "$1" ]; do
			echo "ok $_i - $2 # SKIP $_why"
			_i=$((_i + 1))
		done
		[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
		exit 77
	fi
	SPIN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ioc-spin.XXXXXX") || exit 1
	trap 'rm -rf "$SPIN_DIR"' EXIT
	cd "$SPIN_DIR" || exit 1
}

# spin_verify MODEL PAN-FLAGS [CC-FLAGS...]: generate the verifier for
# MODEL, build it with -DSAFETY and CC-FLAGS, run it with PAN-FLAGS; the
# logs are left in spin.log and pan.log.  Returns 0 when spin reports no
# error, 1 when it reports one, 2 when the verifier could not be built.
spin_verify() {
	_model=$1
	_pan=$2
	shift 2
	rm -f pan pan.* ./*.trail
	if ! spin -a "$_model" >spin.log 2>&1 ||
	   ! "$CC" -O2 -DSAFETY "$@" -o pan pan.c >>spin.log 2>&1; then
		return 2
	fi
	# shellcheck disable=SC2086 # PAN-FLAGS is a word list
	./pan $_pan >pan.log 2>&1
	grep -q "errors: 0" pan.log
}

# spin_expect_pass N MODEL WHAT: TAP test N, that spin finds no error in
# MODEL (searching up to 100000 steps deep).  Returns 0 or 1.
spin_expect_pass() {
	if spin_verify "$2" -m100000; then
		echo "ok $1 - $3: $(grep -o '[0-9]* states, stored' pan.log)"
		return 0
	fi
	echo "not ok $1 - $3"
	sed 's/^/# /' spin.log pan.log
	return 1
}

# spin_expect_deadlock N MODEL MUTANT WHAT: TAP test N, that MUTANT (an
# edit of MODEL that drops one step of the handshake) is caught: spin must
# report an invalid end state, i.e. a thread asleep for good.  An edit
# that changed nothing fails too, so a model rewritten under the sed
# cannot turn this into a test that always passes.  Returns 0 or 1.
spin_expect_deadlock() {
	if cmp -s "$2" "$3"; then
		echo "not ok $1 - $4: the edit found nothing to remove"
		return 1
	fi
	spin_verify "$3" -m100000
	if grep -q "invalid end state" pan.log; then
		echo "ok $1 - $4 deadlocks, as it should"
		return 0
	fi
	echo "not ok $1 - $4 passed"
	sed 's/^/# /' spin.log pan.log
	return 1
}

# spin_expect_violation N MODEL MUTANT WHAT: TAP test N, that spin finds an
# assertion violated in MUTANT (for example a use after free).  As with
# spin_expect_deadlock, a MUTANT identical to MODEL fails.  Returns 0 or 1.
spin_expect_violation() {
	if cmp -s "$2" "$3"; then
		echo "not ok $1 - $4: the edit found nothing to remove"
		return 1
	fi
	spin_verify "$3" -m100000
	if grep -q "assertion violated" pan.log; then
		echo "ok $1 - $4 fails its assertion, as it should"
		return 0
	fi
	echo "not ok $1 - $4 passed"
	sed 's/^/# /' spin.log pan.log
	return 1
}
