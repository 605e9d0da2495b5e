#!/bin/sh
# Run the suite of one build directory and end with "N passed, N failed[, N skipped]".
# Before that line: why each skipped test skipped, how many subtests of
# passing tests skipped and why, how many tests ran, and the last lines of
# each failed test's stdout and stderr (a CI log is often read from its
# tail, and meson prints a failure's log far above it).
# Usage: scripts/test.sh BUILDDIR [extra meson test args]
set -u
dir=${1:?build dir}
shift
meson test -C "$dir" --print-errorlogs --num-processes "${IOC_TEST_JOBS:-2}" "$@"
rc=$?
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import collections, json, re, sys
p = f = s = 0
skips = []                          # (test, reason) of each skipped test
sub = collections.Counter()         # reason -> skipped subtests of run tests
failed = []                         # (test, tail of its output)
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []

def reasons(out):
    """The SKIP reasons in a test's TAP output, in order, without repeats."""
    got = []
    for line in out.splitlines():
        m = re.match(r"^(?:1\.\.0|ok \d+[^#]*)\s*#\s*SKIP\s*(.*)$", line, re.I)
        if m and m.group(1).strip() not in got:
            got.append(m.group(1).strip())
    if not got:                     # exit 77 without TAP: its last comment
        notes = [l.lstrip("# ").strip() for l in out.splitlines() if l.startswith("#")]
        got = notes[-1:] or ["exit status 77, no reason given"]
    return got

for line in lines:
    j = json.loads(line)
    r = j.get("result")
    name = j.get("name", "?").split(" / ")[-1]
    out = j.get("stdout") or ""
    if r in ("OK", "EXPECTEDFAIL"):
        p += 1
        for l in out.splitlines():
            m = re.match(r"^ok \d+[^#]*#\s*SKIP\s*(.*)$", l, re.I)
            if m:
                sub[m.group(1).strip()] += 1
    elif r == "SKIP":
        s += 1
        skips.append((name, "; ".join(reasons(out))))
    else:
        f += 1
        # TAP's "not ok" lines and the comments after them (the failed
        # assertion) wherever they are, then the ends of stdout and stderr.
        ol = out.splitlines()
        why = []
        for i, l in enumerate(ol):
            if l.startswith("not ok"):
                why += [l] + [c for c in ol[i + 1:i + 4] if c.startswith("#")]
        tail = why[:12] + ["-- stdout:"] + ol[-4:] + ["-- stderr:"] + \
            (j.get("stderr") or "").splitlines()[-10:]
        failed.append((name, tail))
for name, why in skips:
    print(f"skipped {name}: {why}")
if sub:
    print(f"{sum(sub.values())} subtests of passing tests skipped:")
    for why, k in sorted(sub.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {k} x {why}")
print(f"{p + f + s} tests ran")
for name, tail in failed:
    print(f"failed {name}, the last lines of its output:")
    for l in tail:
        print(f"  | {l}")
print(f"{p} passed, {f} failed" + (f", {s} skipped" if s else ""))
PY
exit $rc
