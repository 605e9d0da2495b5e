#!/usr/bin/env python3
"""Run benchmark commands interleaved and print one median row per result.

    interleave.py ROUNDS < commands        (one shell-quoted command per line)

Each round runs every command once, in an order rotated from round to round,
so a burst of load from elsewhere on the shared machine hits every
implementation alike instead of whichever happened to run during it.  Each
command prints JSON rows (bench/README.md); rows with the same suite, case,
params, impl and metric are merged into one whose value is the median over
the rounds.  A row whose value was null in any round keeps its error.
stderr of the commands passes through; anything on stdout that is not a JSON
row goes to stderr.
"""
import json
import shlex
import statistics
import subprocess
import sys


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    cmds = [shlex.split(l) for l in sys.stdin.read().splitlines() if l.strip()]
    order, merged = [], {}
    for r in range(rounds):
        k = r % len(cmds) if cmds else 0
        for cmd in cmds[k:] + cmds[:k]:
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            except OSError as e:
                print(f"interleave: {cmd[0]}: {e}", file=sys.stderr)
                continue
            if p.returncode:
                print(f"interleave: {' '.join(cmd)} exited {p.returncode}", file=sys.stderr)
            for line in p.stdout.splitlines():
                try:
                    row = json.loads(line)
                    key = (row["suite"], row["case"], row["params"], row["impl"], row["metric"])
                except (ValueError, KeyError, TypeError):
                    print(line, file=sys.stderr)
                    continue
                if key not in merged:
                    order.append(key)
                    merged[key] = (row, [])
                merged[key][1].append(row.get("value"))
    for key in order:
        row, values = merged[key]
        if any(v is None for v in values):
            bad = next(v for v in values if v is None)
            row["value"] = bad
            row.setdefault("error", "no value in some rounds")
        else:
            row["value"] = statistics.median(values)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
