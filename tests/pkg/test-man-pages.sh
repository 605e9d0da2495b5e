#!/bin/sh
# The man pages built from doc/*.scd: each one renders without a single
# groff warning, has the sections every page must have, and documents
# every long option its tool's --help prints, as an entry of its own (an
# option line followed by its indented description), so an option added
# without documentation fails here.
#
# Usage (meson passes the built pages): test-man-pages.sh PAGE...
# A page NAME.N belongs to the tool NAME, looked up in the build's tools/.
# The options are read from the --help text, not from the source, so any
# option parser will do.  A tool whose --help lists commands ("commands:"
# and then "  NAME  description" lines) is asked for each command's
# --help too.  TAP output, four tests per page.
set -u
BUILD=${IOC_BUILD_ROOT:-build}
SECTIONS="NAME|SYNOPSIS|DESCRIPTION|OPTIONS|EXIT STATUS|EXAMPLES|SEE ALSO"

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }

echo "1..$(($# * 4))"
if [ $# -eq 0 ]; then
	echo "Bail out! no man pages given (built without scdoc?)"
	exit 1
fi
if ! command -v groff >/dev/null 2>&1; then
	for p in "$@"; do
		for t in render sections options options; do skip "$(basename "$p"): $t" "groff missing"; done
	done
	[ -n "${IOC_TAP_ONLY:-}" ] && exit 0
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ioc-man.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# long_options TOOL [ARGS...]: the long options in TOOL ARGS --help, one a
# line, and those of each command it lists.  Leaks are not what this test
# checks: in a sanitizer build, a leak report at exit must not hide the
# options.
long_options() {
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
		"$@" --help >"$tmp/help" 2>&1 || {
		echo "$* --help failed:" >&2
		sed 's/^/  /' "$tmp/help" | head -10 >&2
		return 1
	}
	grep -oE '(^|[^a-zA-Z0-9-])--[a-z0-9][a-z0-9-]*' "$tmp/help" | sed 's/^[^-]*//'
	cmds=$(awk '/^[Cc]ommands:/ { on = 1; next }
		on && /^  +[a-z][a-z0-9-]*  / { print $1; next }
		{ on = 0 }' "$tmp/help")
	for c in $cmds; do
		long_options "$@" "$c" || return 1
	done
}

for page in "$@"; do
	base=$(basename "$page")
	name=${base%.*}
	# 1: groff -ww (all warnings) prints nothing.
	if groff -mandoc -Tutf8 -ww -z "$page" >"$tmp/warn" 2>&1 && [ ! -s "$tmp/warn" ]; then
		ok "$base renders without groff warnings"
	else
		notok "$base renders without groff warnings"
		sed 's/^/# /' "$tmp/warn" | head -20
	fi
	# Plain text, wide lines, no hyphenation: an entry's line stays whole.
	groff -mandoc -Tascii -P-cbou -rLL=300n -rHY=0 "$page" >"$tmp/text" 2>/dev/null
	# 2: the sections.
	missing=$(echo "$SECTIONS" | tr '|' '\n' | while read -r s; do
		grep -qx "$s" "$tmp/text" || echo "$s"; done | tr '\n' ',')
	if [ -z "$missing" ]; then
		ok "$base has the sections ${SECTIONS}"
	else
		notok "$base has the sections ${SECTIONS}: missing ${missing%,}"
	fi
	# 3-4: every long option of --help is an entry of the page.
	tool=""
	for t in "$BUILD"/tools/*/"$name"; do
		[ -x "$t" ] && tool=$t && break
	done
	if [ -z "$tool" ]; then
		skip "$base: --help options documented" "$name not built"
		skip "$base: --help options found" "$name not built"
		continue
	fi
	if ! long_options "$tool" >"$tmp/opts.all" 2>"$tmp/err"; then
		notok "$base: --help options documented"
		sed 's/^/# /' "$tmp/err"
		notok "$base: --help options found"
		continue
	fi
	sort -u "$tmp/opts.all" >"$tmp/opts"
	# An entry: a line indented by the page's first level that starts with
	# an option, the next line indented deeper (its description).  The
	# option opens the line or follows ", " ("-T N, --threads=N").
	awk 'function ind(s) { match(s, /^ */); return RLENGTH }
		prev != "" && ind($0) > ind(prev) { print prev }
		{ prev = ($0 ~ /^ +-/) ? $0 : "" }' "$tmp/text" >"$tmp/entries"
	undoc=""
	while read -r opt; do
		grep -qE "^ +(-[^ ]*[^,]*, )*${opt}([ =[,]|$)" "$tmp/entries" || undoc="$undoc $opt"
	done <"$tmp/opts"
	if [ -z "$undoc" ]; then
		ok "$base: all $(wc -l <"$tmp/opts") long options of $name --help have an entry"
	else
		notok "$base: options of $name --help without an entry:$undoc"
	fi
	# No long option at all in --help means the parse above broke.
	if [ -s "$tmp/opts" ]; then
		ok "$base: --help options found: $(tr '\n' ' ' <"$tmp/opts")"
	else
		notok "$base: --help options found: none in $name --help"
	fi
done
