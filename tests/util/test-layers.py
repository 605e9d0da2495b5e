#!/usr/bin/python3
"""The layers call one way.

Each folder of src/ is a layer with a rank (LAYERS, lowest first): a file
may include a header of its own folder or of a folder of lower rank, never
of one of its own rank or above, so the include graph between folders has
no circle.  The same for calls: every symbol a layer's static library
leaves undefined and another layer defines must be defined in a lower one
(from `nm` on the libraries of the build in IOC_BUILD_ROOT).  tools/ sits
above every layer.  And command tables (struct ioc__qmp_cmd) are the
daemon layer's only: the qmp layer serves them, and the layers below
offer plain functions.  Prints TAP.
"""
import os
import re
import subprocess
import sys

# Lowest first; folders of one rank must not use each other.
LAYERS = [
    ["util"], ["ring"], ["loop"], ["co"], ["pool", "wq", "qmp"], ["blk"],
    ["zip"], ["node"], ["nbd", "migrate"], ["export"], ["daemon"],
]
RANK = {m: r for r, ms in enumerate(LAYERS) for m in ms}
TOOLS = len(LAYERS)

root = os.environ.get("IOC_SOURCE_ROOT", os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
build = os.environ.get("IOC_BUILD_ROOT", os.path.join(root, "build"))
n = 0
failed = 0


def tap(ok, name, detail=""):
    global n, failed
    n += 1
    print("%s %d - %s" % ("ok" if ok else "not ok", n, name))
    if not ok:
        failed += 1
        for line in str(detail).splitlines()[:40]:
            print("# " + line)


def module_of_header(inc, here):
    """The layer a quoted #include names, or None (config, libc...)."""
    m = re.match(r"iocore/(\w+)\.h$", inc)
    if m:
        return m.group(1) if m.group(1) in RANK else None
    m = re.match(r"(\w[\w-]*)/[\w.-]+\.h$", inc)
    if m and os.path.exists(os.path.join(root, "src", inc)):
        return m.group(1)
    if os.path.exists(os.path.join(here, inc)):
        return None  # its own folder
    hits = [d for d in os.listdir(os.path.join(root, "src"))
            if os.path.exists(os.path.join(root, "src", d, inc))]
    return hits[0] if len(hits) == 1 else None


def check_includes():
    bad = {}
    for top, rank_of in (("src", None), ("tools", TOOLS)):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            rel = os.path.relpath(dirpath, os.path.join(root, top)).split(os.sep)[0]
            mod = rel if top == "src" else "tools/" + rel
            rank = RANK.get(rel) if top == "src" else rank_of
            if rank is None:
                bad.setdefault(mod, []).append("%s: folder has no layer" % dirpath)
                continue
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                for line in open(path, errors="replace"):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    other = module_of_header(m.group(1), dirpath)
                    if other is None or other == rel:
                        continue
                    if RANK[other] >= rank:
                        bad.setdefault(mod, []).append(
                            "%s includes %s (%s, rank %d >= %d)" % (
                                os.path.relpath(path, root), m.group(1), other,
                                RANK[other], rank))
    for ms in LAYERS:
        for m in ms:
            tap(m not in bad, "src/%s includes only lower layers" % m,
                "\n".join(bad.get(m, [])))
    tools_bad = [x for k, v in bad.items() if k.startswith("tools/") for x in v]
    tap(not tools_bad, "tools include only layers", "\n".join(tools_bad))


def nm(lib, defined):
    args = ["nm", "--defined-only" if defined else "-u", lib]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if not parts or parts[-1].endswith(":"):
            continue
        if defined and (len(parts) < 3 or parts[1] not in "TDBRtdbr" or
                        parts[1].islower()):
            continue
        syms.add(parts[-1])
    return syms


def check_calls():
    libs = {}
    for ms in LAYERS:
        for m in ms:
            lib = os.path.join(build, "src", m, "libiocore_%s.a" % m)
            if os.path.exists(lib):
                libs[m] = lib
    if len(libs) < len(RANK) - 1:
        print("# skipping the call check: no build in %s" % build)
        return
    owner = {}
    for m, lib in libs.items():
        for s in nm(lib, True):
            owner.setdefault(s, m)
    for m, lib in sorted(libs.items(), key=lambda x: RANK[x[0]]):
        up = sorted("%s (defined in %s)" % (s, owner[s]) for s in nm(lib, False)
                    if s in owner and owner[s] != m and RANK[owner[s]] >= RANK[m])
        tap(not up, "src/%s calls only lower layers" % m, "\n".join(up))


def check_tables():
    """Command tables: src/qmp defines the type, src/daemon fills them."""
    bad = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        layer = os.path.relpath(dirpath, os.path.join(root, "src")).split(os.sep)[0]
        if layer in ("qmp", "daemon"):
            continue
        for f in files:
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, f)
            for i, line in enumerate(open(path, errors="replace"), 1):
                if re.search(r"\bioc__qmp_cmd\b", line):
                    bad.append("%s:%d: %s" % (os.path.relpath(path, root), i, line.strip()))
    tap(not bad, "command tables only in src/daemon", "\n".join(bad))


check_includes()
check_tables()
check_calls()
print("1..%d" % n)
sys.exit(1 if failed else 0)
