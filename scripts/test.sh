#!/bin/sh
# Run the suite of one build directory and end with "N passed, N failed[, N skipped]".
# Usage: scripts/test.sh BUILDDIR [extra meson test args]
set -u
dir=${1:?build dir}
shift
meson test -C "$dir" --print-errorlogs --num-processes "${IOC_TEST_JOBS:-2}" "$@"
rc=$?
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in lines:
    r = json.loads(line).get("result")
    if r in ("OK", "EXPECTEDFAIL"):
        p += 1
    elif r == "SKIP":
        s += 1
    else:
        f += 1
print(f"{p} passed, {f} failed" + (f", {s} skipped" if s else ""))
PY
exit $rc
