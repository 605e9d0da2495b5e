#!/bin/sh
# The README's incremental-backup walk-through, run as written: the shell
# block after "<!-- backup-walkthrough -->" in a scratch directory, with the
# built iocore-nbd and iocore-ctl first on PATH.  TAP output.
set -u
BUILD=$(cd "${IOC_BUILD_ROOT:-build}" && pwd)
SRC=$(cd "${IOC_SOURCE_ROOT:-$(dirname "$0")/../..}" && pwd)
. "$(dirname "$0")/nbd-test-lib.sh"

need nbdcopy qemu-io qemu-img
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
	{ echo "1..0 # SKIP libnbd's Python bindings (python3-libnbd) missing"; exit 77; }
echo "1..2"
workdir ioc-nbd-backup
mkdir "$dir/bin"
# Through the cross build's emulator when there is one (nbd-test-lib.sh's
# srv does the same for the other tests).
for t in "$BUILD/tools/nbd/iocore-nbd" "$BUILD/tools/ctl/iocore-ctl"; do
	if [ -n "${MESON_EXE_WRAPPER:-}" ]; then
		printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$MESON_EXE_WRAPPER" "$t" \
			> "$dir/bin/${t##*/}"
		chmod +x "$dir/bin/${t##*/}"
	else
		ln -s "$t" "$dir/bin/"
	fi
done
ln -s "$SRC/scripts" "$dir/scripts"
awk '/<!-- backup-walkthrough -->/ { on = 1; next }
     on && /^```sh/ { inblock = 1; next }
     inblock && /^```/ { exit }
     inblock { print }' "$SRC/README.md" > "$dir/walkthrough.sh"
if [ -s "$dir/walkthrough.sh" ]; then ok "the README has the walk-through"; else notok "the README has the walk-through"; fi
if out=$(cd "$dir" && PATH="$dir/bin:$PATH" sh -ex ./walkthrough.sh 2>&1) &&
   echo "$out" | grep -q 'copied 1179648 bytes in 3 extents of 268435456'; then
	ok "it runs: only the dirty extents are copied and the restore matches"
else
	notok "it runs: only the dirty extents are copied and the restore matches"
	echo "$out" | tail -30 | sed 's/^/# /'
	[ -f "$dir/nbd.pid" ] && kill "$(cat "$dir/nbd.pid")" 2>/dev/null
fi
