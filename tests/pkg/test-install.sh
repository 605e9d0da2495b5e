#!/bin/sh
# meson install into a DESTDIR: everything lands where the build says it
# goes.  The binaries, libiocore (shared and static), its headers and
# pkg-config file, the man pages and the systemd units are each looked for;
# every file meson means to install is there; every installed binary has a
# man page; the units run the installed binary and name an installed page;
# and a program built against the installed headers and pkg-config file
# links with the installed library and runs.  TAP output.
set -u
. "$(dirname "$0")/../nbd/nbd-test-lib.sh"

echo "1..10"
workdir ioc-install
D="$dir/root"
if ! meson install -C "$BUILD" --destdir "$D" --quiet >"$dir/install.log" 2>&1; then
	echo "Bail out! meson install failed"
	sed 's/^/# /' "$dir/install.log" | tail -20
	exit 1
fi

# opt NAME: a build option's value, as meson introspect reports it.
opt() {
	meson introspect --buildoptions "$BUILD" |
		python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]))' "$1"
}
prefix=$(opt prefix)
# dir_of NAME: PREFIX/NAME, or NAME when that option is absolute.
dir_of() { v=$(opt "$1"); case $v in /*) echo "$v";; *) echo "$prefix/$v";; esac; }
bindir=$D$(dir_of bindir)
libdir=$D$(dir_of libdir)
mandir=$D$(dir_of mandir)
incdir=$D$(dir_of includedir)

# 1: everything meson means to install.
missing=$(meson introspect --installed "$BUILD" |
	python3 -c 'import json,sys; [print(v) for v in json.load(sys.stdin).values()]' |
	while read -r f; do [ -e "$D$f" ] || echo "$f"; done)
if [ -z "$missing" ]; then
	ok "every file of meson introspect --installed is in DESTDIR"
else
	notok "files missing from DESTDIR: $missing"
fi

# files WHAT FILE...: TAP test that each FILE exists in DESTDIR.
files() {
	what=$1; shift
	absent=""
	for f in "$@"; do [ -e "$f" ] || absent="$absent ${f#"$D"}"; done
	if [ -z "$absent" ]; then ok "$what"; else notok "$what: missing$absent"; fi
}
# 2-7: each kind of file, where it belongs.
files "binaries in $(dir_of bindir)" \
	"$bindir/iocore-nbd" "$bindir/iocore-ctl" "$bindir/iocore-zip" \
	"$bindir/iocore-bench" "$bindir/iocore-storage-daemon"
files "libiocore in $(dir_of libdir), shared and static" \
	"$libdir/libiocore.so" "$libdir/libiocore.so.1" "$libdir/libiocore.a"
files "the pkg-config file" "$libdir/pkgconfig/iocore.pc"
files "the headers" "$incdir/iocore/iocore.h" "$incdir/iocore/blk.h" "$incdir/iocore/zip.h"
files "the man pages" "$mandir/man8/iocore-nbd.8" "$mandir/man1/iocore-ctl.1" \
	"$mandir/man1/iocore-zip.1" "$mandir/man1/iocore-bench.1" \
	"$mandir/man1/iocore-storage-daemon.1"
units=$(find "$D" -name 'iocore-nbd@.service' -path '*/systemd/system/*')
udir=$(dirname "${units:-$D/none/x}")
files "the systemd units in ${udir#"$D"}" "$udir/iocore-nbd@.service" \
	"$udir/iocore-nbd@.socket"

# 8: every installed binary has a man page (a new tool needs one).
nopage=""
for b in "$bindir"/*; do
	name=$(basename "$b")
	ls "$mandir"/man[1-8]/"$name".[1-8] >/dev/null 2>&1 || nopage="$nopage $name"
done
if [ -z "$nopage" ]; then
	ok "every installed binary has a man page"
else
	notok "installed binaries without a man page:$nopage"
fi

# 9: the service runs the installed iocore-nbd and documents itself with
# an installed page.
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$udir/iocore-nbd@.service" 2>/dev/null)
doc=$(sed -n 's/^Documentation=man:\(.*\)(\([1-8]\))$/\1.\2/p' "$udir/iocore-nbd@.service" 2>/dev/null)
if [ -n "$exe" ] && [ -x "$D$exe" ] && [ -n "$doc" ] && ls "$mandir"/man*/"$doc" >/dev/null 2>&1; then
	ok "the service runs $exe and documents itself with $doc, both installed"
else
	notok "the service runs '$exe' (installed: $([ -n "$exe" ] && [ -x "$D$exe" ] && echo yes || echo no)), documented by '$doc'"
fi

# 10: a program against the installed headers, pkg-config file and library.
cat >"$dir/hello.c" <<'EOF'
#include <stdio.h>
#include <iocore/iocore.h>

int main(void)
{
	struct ioc_loop *loop;
	int r = ioc_loop_new(&loop, NULL);

	if (r < 0) {
		fprintf(stderr, "ioc_loop_new: %s\n", ioc_strerror(r));
		return 1;
	}
	ioc_loop_free(loop);
	printf("%s\n", ioc_version());
	return 0;
}
EOF
# shellcheck disable=SC2086 # flags is a word list
if flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$D" \
	   pkg-config --cflags --libs iocore 2>"$dir/pc.log") &&
   ${CC:-cc} -o "$dir/hello" "$dir/hello.c" $flags >"$dir/cc.log" 2>&1 &&
   out=$(LD_LIBRARY_PATH="$libdir" "$dir/hello" 2>&1) && [ -n "$out" ]; then
	ok "a program built with pkg-config --cflags --libs iocore runs (libiocore $out)"
else
	notok "a program built with pkg-config --cflags --libs iocore runs"
	cat "$dir/pc.log" "$dir/cc.log" | sed 's/^/# /' | head -20
	echo "${out:-}" | sed 's/^/# /'
fi
