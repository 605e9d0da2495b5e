#!/usr/bin/env python3
"""Turn the rows of `make bench` into build/bench/report.md and PNG plots.

scripts/bench.sh runs every bench/<mod>/run.sh REPEATS times and leaves:
    OUT/raw/<mod>.<repeat>.jsonl   stdout of each run (one JSON row per line)
    OUT/runs.jsonl                 one line per run: module, repeat, status, rc, seconds
This script validates and merges the rows into OUT/rows.jsonl, takes medians per
(suite, case, params, metric, impl), compares iocore (peer=false) with each peer,
checks the targets in bench/targets.json, draws plots with gnuplot and writes
OUT/report.md.

Ratio convention, used everywhere in the report:
    advantage = ours / peer   when the metric is higher-is-better (IOPS, MB/s)
    advantage = peer / ours   when the metric is lower-is-better  (ns/op, p99)
so advantage > 1 always means iocore is better, and 2.00x means "twice as good"
(twice the rate, or half the time).

Nothing is dropped silently: malformed lines, runs that failed or timed out,
and peer rows whose value is null are listed in the report with their reason.

Python 3 standard library only.  `bench-report.py --self-test` feeds the report
a generated sample and checks the result.
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REQUIRED = ("suite", "case", "params", "impl", "peer", "metric", "value", "better", "cmd")

# --------------------------------------------------------------------------
# Targets: data beside the benchmarks, in bench/targets.json ("about" there
# says what the fields mean).  load_targets() reads them; check_targets()
# evaluates them.
# --------------------------------------------------------------------------
TARGET_KINDS = ("peer", "self", "value")
DEFAULT_TARGETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "bench", "targets.json")


def load_targets(path):
    """The target list of a targets file, each checked for what check_targets() needs."""
    with open(path) as f:
        targets = json.load(f)["targets"]
    for i, t in enumerate(targets):
        where = f"{path}: target {i + 1}"
        if t.get("kind") not in TARGET_KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(TARGET_KINDS)}")
        for k in ("suite", "text"):
            if not isinstance(t.get(k), str):
                raise ValueError(f"{where}: needs a string {k!r}")
        if t["kind"] == "self" and not all(k in t for k in ("xparam", "base", "at", "min")):
            raise ValueError(f"{where}: a self target needs xparam, base, at and min")
        if t["kind"] != "value" and "min" not in t:
            raise ValueError(f"{where}: needs min")
        for k in ("case", "params", "metric", "ours", "peers", "exclude"):
            if k in t:
                re.compile(t[k])
        if "client_bound" in t and not isinstance(t["client_bound"], bool):
            raise ValueError(f"{where}: client_bound must be true or false")
    return targets


# --------------------------------------------------------------------------
# Plots.  A plot is made only when its rows exist.  For "line" plots, every
# (case, metric) of the suite whose rows carry one of the x params with at
# least two distinct values gets a PNG; the series are impl plus the other
# params that vary.  "bar" plots put every workload (case + params) on the x
# axis and one bar per impl, one PNG per matching metric.
# --------------------------------------------------------------------------
PLOTS = [
    dict(name="wq", kind="line", suite="wq", x=("workers", "threads", "nworkers", "w"),
         title="workqueue vs workers"),
    dict(name="loop", kind="line", suite="loop", x=("idle", "idle_handlers", "handlers", "n"),
         title="event loop events/s vs idle handlers"),
    dict(name="nbd", kind="bar", suite="nbd", metrics=(r"iops", r"p99|lat", r"^server cpu"),
         title="NBD servers (fio)"),
    dict(name="zip", kind="line", suite="zip", x=("level", "l"),
         metric=r"MB/s|speed|throughput|rate", title="compression speed vs level"),
]


# ---------------------------------------------------------------- helpers --
def fmt(v):
    """A number for a table: enough digits to compare, no more."""
    if v is None:
        return "n/a"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a == 0:
        return "0"
    return f"{v:.3g}"


def fmt_ratio(r):
    return "n/a" if r is None else f"{r:.2f}x"


def advantage(ours, peer, better):
    """>1 means iocore is better, whatever the direction of the metric."""
    if ours is None or peer is None:
        return None
    if better == "lower":
        return peer / ours if ours > 0 else None
    return ours / peer if peer > 0 else None


def parse_params(p):
    """'backend=epoll,idle=100' (commas, semicolons or spaces) -> ordered dict."""
    out = {}
    for tok in re.split(r"[,;\s]+", p.strip()):
        if not tok:
            continue
        k, sep, v = tok.partition("=")
        out[k] = v if sep else ""
    return out


def params_str(d):
    return ",".join(f"{k}={v}" if v != "" else k for k, v in d.items())


def num_key(s):
    try:
        return (0, float(s), "")
    except ValueError:
        return (1, 0.0, s)


def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def code(s, table=False):
    """An inline code span; in a table cell a | must be escaped even there."""
    s = str(s).replace("\n", " ")
    if table:
        s = s.replace("|", "\\|")
    if "`" in s:
        return "`` " + s + " ``"
    return "`" + s + "`"


def run(cmd):
    """First non-empty output line of a command, or why it failed."""
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return None, str(e)
    text = (p.stdout or "") + (p.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if p.returncode != 0 or not lines:
        return None, (lines[0] if lines else f"exit {p.returncode}")
    return lines, None


def slug(s):
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "x"


# ------------------------------------------------------------- loading ----
def normalise(obj):
    """Check one decoded row; return (row, None) or (None, reason)."""
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        return None, "missing field(s): " + ", ".join(missing)
    row = dict(obj)
    if isinstance(row["params"], dict):
        row["params"] = params_str({k: str(v) for k, v in row["params"].items()})
    elif row["params"] is None:
        row["params"] = ""
    else:
        row["params"] = str(row["params"])
    for k in ("suite", "case", "impl", "metric", "cmd"):
        row[k] = str(row[k])
    if not isinstance(row["peer"], bool):
        return None, f"\"peer\" is not a boolean: {row['peer']!r}"
    v = row["value"]
    if v is not None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, f"\"value\" is not a number or null: {v!r}"
        if math.isnan(v) or math.isinf(v):
            row["value"] = None
            row.setdefault("error", f"value was {v}")
    if row["better"] not in ("higher", "lower"):
        return None, f"\"better\" must be higher or lower: {row['better']!r}"
    if row["value"] is None and not row.get("error"):
        row["error"] = "value is null and the row gives no reason"
    return row, None


def load(out):
    runs = []
    path = os.path.join(out, "runs.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for ln in f:
                ln = ln.strip()
                if ln:
                    try:
                        runs.append(json.loads(ln))
                    except ValueError:
                        pass
    rows, invalid = [], []
    for r in runs:
        if r.get("status") == "skipped":
            continue
        raw = os.path.join(out, "raw", f"{r['module']}.{r['repeat']}.jsonl")
        try:
            lines = open(raw, errors="replace").read().splitlines()
        except OSError as e:
            invalid.append(dict(module=r["module"], repeat=r["repeat"], line=0, text="",
                                why=f"cannot read {raw}: {e}"))
            continue
        r["rows"] = 0
        for i, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            try:
                obj = json.loads(ln)
            except ValueError as e:
                invalid.append(dict(module=r["module"], repeat=r["repeat"], line=i,
                                    text=ln[:200], why=f"not JSON ({e})"))
                continue
            row, why = normalise(obj)
            if row is None:
                invalid.append(dict(module=r["module"], repeat=r["repeat"], line=i,
                                    text=ln[:200], why=why))
                continue
            row["module"] = r["module"]
            row["repeat"] = r["repeat"]
            rows.append(row)
            r["rows"] += 1
    return runs, rows, invalid


# ---------------------------------------------------------- aggregation ---
class Impl:
    def __init__(self, name, peer, better):
        self.name, self.peer, self.better = name, peer, better
        self.values, self.errors, self.cmds = [], [], []
        self.bound = []   # per row that says: was the client the limit?

    @property
    def client_bound(self):
        """True when most of the repeats' rows say the client was the limit
        ("client_bound": true, bench/nbd/run.sh), None when no row says."""
        if not self.bound:
            return None
        return sum(self.bound) * 2 > len(self.bound)

    def bound_note(self):
        n = sum(self.bound)
        if not n:
            return ""
        return " (client-bound)" if n == len(self.bound) else f" (client-bound {n}/{len(self.bound)})"

    @property
    def median(self):
        return statistics.median(self.values) if self.values else None

    def spread(self):
        if len(self.values) < 2 or not self.median:
            return None
        return (max(self.values) - min(self.values)) / abs(self.median)


class Group:
    """All rows of one suite+case+params+metric: iocore and its peers."""

    def __init__(self, suite, case, params, metric):
        self.suite, self.case, self.params, self.metric = suite, case, params, metric
        self.impls = {}
        self.better = None
        self.warnings = []

    def add(self, row):
        if self.better is None:
            self.better = row["better"]
        elif row["better"] != self.better:
            self.warnings.append(f"{row['impl']} says better={row['better']}, "
                                 f"earlier rows said {self.better}")
        im = self.impls.get(row["impl"])
        if im is None:
            im = self.impls[row["impl"]] = Impl(row["impl"], row["peer"], row["better"])
        if row["value"] is not None:
            im.values.append(float(row["value"]))
            if row.get("client_bound") is not None:
                im.bound.append(bool(row["client_bound"]))
        if row.get("error"):
            im.errors.append(str(row["error"]))
        if row["cmd"] not in im.cmds:
            im.cmds.append(row["cmd"])

    def ours(self):
        return [i for i in self.impls.values() if not i.peer]

    def plain_ours(self):
        """The default iocore of this comparison (not a variant), or None."""
        o = self.ours()
        return next((i for i in o if i.name == "iocore"), o[0] if len(o) == 1 else None)

    def peers(self):
        return [i for i in self.impls.values() if i.peer]

    def best(self, impls):
        vals = [i for i in impls if i.median is not None]
        if not vals:
            return None
        key = (lambda i: i.median)
        return min(vals, key=key) if self.better == "lower" else max(vals, key=key)


def aggregate(rows):
    groups = {}
    for r in rows:
        k = (r["suite"], r["case"], r["params"], r["metric"])
        g = groups.get(k)
        if g is None:
            g = groups[k] = Group(*k)
        g.add(r)
    return groups


# ---------------------------------------------------------------- targets -
def rx(pat):
    return re.compile(pat, re.I) if pat else None


def matches(t, g):
    if g.suite != t["suite"]:
        return False
    # Per-CPU-second metrics (requests/cpu-s, cpu-ns/job, MB/CPU-s) explain a
    # result; the targets are on the wall-clock metric unless a target
    # names its metric.
    if not t.get("metric") and re.search(r"cpu", g.metric, re.I):
        return False
    # A bare flag in params (backend=io_uring,no_poll) marks a non-default
    # variant, an ablation: shown in the tables, not held to the targets.
    if any(v == "" for v in parse_params(g.params).values()):
        return False
    for field, val in (("case", g.case), ("params", g.params), ("metric", g.metric)):
        p = rx(t.get(field))
        if p and not p.search(val):
            return False
    ex = rx(t.get("exclude"))
    if ex and ex.search(f"{g.case} {g.params}"):
        return False
    # client_bound true/false: only comparisons whose iocore rows were (not)
    # limited by the client; rows that do not say count as not limited.
    if "client_bound" in t:
        o = g.plain_ours()
        if bool(o is not None and o.client_bound) != t["client_bound"]:
            return False
    return True


# A comparison whose repeats spread wider than this is flagged as noisy.
NOISY = 0.25


def max_spread(*impls):
    sp = [i.spread() for i in impls if i is not None and i.spread() is not None]
    return max(sp) if sp else None


def noise_note(t):
    sp = t.get("spread")
    return f" (noisy: spread {sp * 100:.0f}%)" if sp is not None and sp > NOISY else ""


def check_targets(groups, target_list):
    """-> list of dicts: suite, text, where, ours, peer, achieved, target, status."""
    lines = []
    for t in target_list:
        found = []
        near = []   # matching comparisons that could not be evaluated, and why
        if t["kind"] == "peer":
            for g in groups.values():
                if not matches(t, g):
                    continue
                pr = rx(t.get("peers"))
                peers = [p for p in g.peers() if not pr or pr.search(p.name)]
                orx = rx(t.get("ours"))
                ours = [o for o in g.ours() if not orx or orx.search(o.name)]
                # Variants (iocore-no-spin, ...) are ablations: the target is
                # about plain "iocore" when the comparison has it.
                if len(ours) > 1 and any(o.name == "iocore" for o in ours):
                    ours = [o for o in ours if o.name == "iocore"]
                if not peers or not ours:
                    why = []
                    if not ours:
                        why.append("no iocore row")
                    else:
                        why += [f"{o.name}: {o.errors[0]}" for o in ours if o.errors][:1]
                    if not peers:
                        why.append("no matching peer row")
                    near.append(f"{g.case} {g.params}".strip() + ": " + "; ".join(why))
                    continue
                bp = g.best(peers)
                for o in ours:
                    where = f"{g.case} {g.params} [{g.metric}]".strip()
                    if len(ours) > 1:
                        where += f" ({o.name})"
                    where += o.bound_note()
                    ent = dict(where=where, ours=o.median,
                               peer=(bp.name if bp else ", ".join(p.name for p in peers)),
                               peerval=bp.median if bp else None)
                    if o.median is None:
                        ent.update(status="MISSING", achieved=None,
                                   note="iocore: " + (o.errors[0] if o.errors else "no value"))
                    elif bp is None:
                        errs = "; ".join(f"{p.name}: {p.errors[0] if p.errors else 'no value'}"
                                         for p in peers)
                        ent.update(status="MISSING", achieved=None, note="no peer ran: " + errs)
                    else:
                        a = advantage(o.median, bp.median, g.better)
                        ent.update(achieved=a, note="", spread=max_spread(o, bp),
                                   status="PASS" if a is not None and a >= t["min"] - 1e-12 else "FAIL")
                    found.append(ent)
        elif t["kind"] == "self":
            series = {}
            for g in groups.values():
                if not matches(t, g):
                    continue
                pp = parse_params(g.params)
                if t["xparam"] not in pp:
                    continue
                x = pp.pop(t["xparam"])
                for o in g.ours():
                    key = (g.case, params_str(pp), g.metric, o.name)
                    series.setdefault(key, {})[x] = (o.median, g.better, o)
            for (case, rest, metric, name), pts in sorted(series.items()):
                if t["base"] not in pts or t["at"] not in pts:
                    continue
                (vb, better, ob), (va, _, oa) = pts[t["base"]], pts[t["at"]]
                a = advantage(va, vb, better)
                found.append(dict(
                    spread=max_spread(oa, ob),
                    where=f"{case} {rest} [{metric}] {name}: {t['xparam']}={t['at']} vs {t['base']}",
                    ours=va, peer=f"iocore at {t['xparam']}={t['base']}", peerval=vb,
                    achieved=a, note="" if a is not None else "no value",
                    status=("MISSING" if a is None else
                            "PASS" if a >= t["min"] - 1e-12 else "FAIL")))
        elif t["kind"] == "value":
            for g in groups.values():
                if not matches(t, g):
                    continue
                for o in g.ours():
                    v = o.median
                    ok = v is not None
                    if ok and "max" in t:
                        ok = v <= t["max"] + 1e-12
                    if ok and "min" in t:
                        ok = v >= t["min"] - 1e-12
                    found.append(dict(where=f"{g.case} {g.params} [{g.metric}]", ours=v,
                                      spread=max_spread(o),
                                      peer="", peerval=None, achieved=v, note="",
                                      status="MISSING" if v is None else "PASS" if ok else "FAIL"))
        if not found:
            note = "no matching rows (not measured yet)"
            if "client_bound" in t:
                t2 = {k: v for k, v in t.items() if k != "client_bound"}
                if any(matches(t2, g) for g in groups.values()):
                    note = ("no matching rows: no comparison was " +
                            ("" if t["client_bound"] else "un") + "bound by the client in this run")
            if near:
                note = "; ".join(near[:3]) + (f"; ... ({len(near)} in all)" if len(near) > 3 else "")
            found.append(dict(where="", ours=None, peer="", peerval=None, achieved=None,
                              status="MISSING", note=note))
        for f in found:
            f["suite"] = t["suite"]
            f["text"] = t["text"]
            f["kind"] = t["kind"]
            f["upper_bound"] = t["kind"] == "value" and "max" in t
            f["target"] = (f"<= {fmt(t['max'])}" if t["kind"] == "value" and "max" in t
                           else f">= {t['min']:.3g}x" if t["kind"] != "value"
                           else f">= {fmt(t['min'])}")
            lines.append(f)
    return lines


def target_summary(targets):
    """[((suite, text), [lines])] in the targets file's order."""
    out = {}
    for t in targets:
        out.setdefault((t["suite"], t["text"]), []).append(t)
    return list(out.items())


# The peers the report must cover, and how their impl names look.
PEERS_COVERED = [
    ("qemu-nbd", r"qemu-nbd"),
    ("nbdkit", r"nbdkit"),
    ("qemu-img bench", r"qemu-img"),
    ("libuv", r"libuv|^uv"),
    ("libevent", r"libevent"),
    ("GLib GThreadPool", r"glib|gthread"),
    ("Boost.Context fcontext", r"fcontext|boost"),
    ("concurrencykit ck_ring", r"^ck"),
    ("zstd", r"^zstd"),
    ("pigz", r"^pigz"),
]


def peer_coverage(rows):
    """-> [(peer, suites, rows with a value, rows without, first error)]"""
    out = []
    for name, pat in PEERS_COVERED:
        p = rx(pat)
        mine = [r for r in rows if r["peer"] and p.search(r["impl"])]
        ok = [r for r in mine if r["value"] is not None]
        bad = [r for r in mine if r["value"] is None]
        suites = sorted({r["suite"] for r in mine})
        err = str(bad[0].get("error", "")) if bad else ""
        out.append((name, suites, len(ok), len(bad), err))
    return out


# ------------------------------------------------------------------ plots -
def gnuplot_terminal():
    try:
        p = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    txt = p.stdout + p.stderr
    if re.search(r"^\s*pngcairo\s", txt, re.M):
        return "pngcairo"
    if re.search(r"^\s*png\s", txt, re.M):
        return "png"
    return None


def gp_quote(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_table(path, xs, series, cols):
    """Tab-separated: first column the x label, then one column per series."""
    with open(path, "w") as f:
        f.write("x\t" + "\t".join(n.replace("\t", " ") for n in cols) + "\n")
        for x in xs:
            cells = [x]
            for n in cols:
                v = series[n].get(x)
                cells.append("?" if v is None else repr(float(v)))
            f.write("\t".join(cells) + "\n")


def render(plotdir, base, term, title, xlabel, ylabel, ncols, kind, notes, ymax=None,
           meta=None, xfit=True, nx=1):
    """meta: per column (impl, other params, is_peer), for line styles."""
    dat = base + ".dat"
    gp = os.path.join(plotdir, base + ".gp")
    png = base + ".png"
    font = 'font "sans,10"' if term == "pngcairo" else ""
    lines = [
        f"set terminal {term} size 960,560 noenhanced {font}",
        f"set output {gp_quote(png)}",
        f"set title {gp_quote(title)}",
        f"set xlabel {gp_quote(xlabel)}",
        f"set ylabel {gp_quote(ylabel)}",
        'set datafile separator "\\t"',
        'set datafile missing "?"',
        "set key outside right top",
        "set grid ytics",
        "set yrange [0:*]",
        "set bmargin 7",
    ]
    if ymax is not None and ymax >= 10000:
        lines.append('set format y "%.1s%c"')   # 1.6M, 800.0k
    if kind == "bar":
        lines += [
            "set style data histograms",
            "set style histogram clustered gap 1",
            "set style fill solid 0.8 border -1",
            "set xtics " + ("nomirror" if xfit else "rotate by -25 left"),
            f"set xrange [-0.6:{nx - 0.4}]",
            f"plot for [i=2:{ncols + 1}] {gp_quote(dat)} using i:xtic(1) title columnhead(i)",
        ]
    else:
        lines += [
            "set offsets 0.25, 0.25, 0, 0",
        ]
        # iocore solid, peers dashed, so a reader pairs the curves at a glance.
        # With a second param varying (corpus=usr|mem), one colour per value
        # of it and one point shape per impl, so iocore and the peer on the
        # same input share a colour.
        parts = []
        impls = [m[0] for m in (meta or [])]
        rests = [m[1] for m in (meta or [])]
        for i in range(ncols):
            dt = 2 if meta and meta[i][2] else 1
            if meta and len(set(rests)) > 1:
                lc = sorted(set(rests)).index(rests[i]) + 1
                pt = (7, 5, 9, 11, 13, 15)[sorted(set(impls)).index(impls[i]) % 6]
            else:
                lc, pt = i + 1, 7
            parts.append(f"{gp_quote(dat)} using 0:{i + 2}:xtic(1) with linespoints "
                         f"lw 2 lc {lc} pt {pt} dt {dt} title columnhead({i + 2})")
        lines.append("plot " + ", \\\n     ".join(parts))
    with open(gp, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        p = subprocess.run(["gnuplot", base + ".gp"], cwd=plotdir, capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        notes.append(f"{png}: gnuplot failed: {e}")
        return None
    if p.returncode != 0 or not os.path.exists(os.path.join(plotdir, png)):
        notes.append(f"{png}: gnuplot failed: {(p.stderr or '').strip()[:300]}")
        return None
    return png


def make_plots(groups, plotdir, notes):
    """-> {suite: [(title, png file name)]}"""
    made = {}
    os.makedirs(plotdir, exist_ok=True)
    term = gnuplot_terminal()
    if term is None:
        notes.append("gnuplot with a png or pngcairo terminal was not found: no plots "
                     "(install gnuplot-nox)")
        return made
    for spec in PLOTS:
        gs = [g for g in groups.values() if g.suite == spec["suite"]]
        if not gs:
            continue
        if spec["kind"] == "line":
            mrx = rx(spec.get("metric"))
            by = {}
            for g in gs:
                if mrx and not mrx.search(g.metric):
                    continue
                pp = parse_params(g.params)
                xp = next((x for x in spec["x"] if x in pp), None)
                if xp is None:
                    continue
                by.setdefault((g.case, g.metric, xp), []).append((pp, g))
            for (case, metric, xp), items in sorted(by.items()):
                xs = sorted({pp[xp] for pp, _ in items}, key=num_key)
                if len(xs) < 2:
                    continue
                # Params other than x that vary within this case label the series.
                keys = []
                for pp, _ in items:
                    for k in pp:
                        if k != xp and k not in keys:
                            keys.append(k)
                varying = [k for k in keys if len({pp.get(k) for pp, _ in items}) > 1]
                series, cols, is_peer = {}, [], {}
                for pp, g in items:
                    for im in g.impls.values():
                        if im.median is None:
                            continue
                        label = im.name
                        extra = ",".join(f"{k}={pp[k]}" for k in varying if k in pp)
                        if extra:
                            label += " " + extra
                        if label not in series:
                            series[label] = {}
                            cols.append(label)
                            is_peer[label] = (im.name, extra, im.peer)
                        series[label][pp[xp]] = im.median
                if not cols:
                    continue
                cols.sort(key=lambda c: (is_peer[c][2], c))
                base = slug(f"{spec['name']}-{case}-{metric}-vs-{xp}")
                write_table(os.path.join(plotdir, base + ".dat"), xs, series, cols)
                title = f"{spec['title']}: {case} ({metric})"
                ymax = max(v for sr in series.values() for v in sr.values())
                png = render(plotdir, base, term, title, xp, metric, len(cols), "line", notes, ymax,
                             [is_peer[c] for c in cols])
                if png:
                    made.setdefault(spec["suite"], []).append((title, png))
        else:
            for mpat in spec["metrics"]:
                mrx = rx(mpat)
                sel = [g for g in gs if mrx.search(g.metric)]
                for metric in sorted({g.metric for g in sel}):
                    mg = [g for g in sel if g.metric == metric]
                    xs, series, cols = [], {}, []
                    # Params every workload shares go to the title, not the labels.
                    pps = [parse_params(g.params) for g in mg]
                    common = {k: v for k, v in pps[0].items()
                              if all(p.get(k) == v for p in pps)} if pps else {}
                    for g in sorted(mg, key=lambda g: (g.case, g.params)):
                        rest = {k: v for k, v in parse_params(g.params).items() if k not in common}
                        x = f"{g.case} {params_str(rest)}".strip()
                        xs.append(x)
                        for im in g.impls.values():
                            if im.median is None:
                                continue
                            if im.name not in series:
                                series[im.name] = {}
                                cols.append(im.name)
                            series[im.name][x] = im.median
                    if not cols:
                        continue
                    cols.sort(key=lambda c: (not c.startswith("iocore"), c))
                    base = slug(f"{spec['name']}-{metric}")
                    write_table(os.path.join(plotdir, base + ".dat"), xs, series, cols)
                    title = f"{spec['title']}: {metric} per server and workload"
                    if common:
                        title += f" ({params_str(common)})"
                    ymax = max(v for sr in series.values() for v in sr.values())
                    # Labels stay horizontal while they fit side by side.
                    xfit = len(xs) * (max(len(x) for x in xs) + 2) <= 100
                    png = render(plotdir, base, term, title, "workload", metric, len(cols),
                                 "bar", notes, ymax, xfit=xfit, nx=len(xs))
                    if png:
                        made.setdefault(spec["suite"], []).append((title, png))
    return made


# ------------------------------------------------------ machine, versions -
def machine_info():
    info = []
    model = None
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.lower().startswith("model name"):
                model = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info.append(("CPU", model or platform.processor() or "unknown"))
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    info.append(("CPUs", f"{os.cpu_count()} online" + (f", {usable} usable by this run" if usable else "")))
    lines, _ = run("lscpu | grep -E '^(Hypervisor vendor|Thread\\(s\\) per core|L3 cache|CPU max MHz)'")
    for ln in lines or []:
        k, _, v = ln.partition(":")
        info.append((k.strip(), v.strip()))
    info.append(("Kernel", f"{platform.system()} {platform.release()} {platform.machine()}"))
    try:
        for ln in open("/proc/meminfo"):
            if ln.startswith("MemTotal"):
                kb = int(ln.split()[1])
                info.append(("Memory", f"{kb / 1048576:.1f} GiB"))
    except (OSError, ValueError):
        pass
    try:
        st = os.statvfs("/dev/shm")
        info.append(("/dev/shm", f"{st.f_blocks * st.f_frsize / 2**30:.1f} GiB tmpfs"))
    except OSError:
        pass
    lines, _ = run("cat /sys/kernel/mm/transparent_hugepage/enabled")
    if lines:
        info.append(("THP", lines[0]))
    lines, _ = run("cat /proc/sys/kernel/io_uring_disabled")
    if lines:
        info.append(("kernel.io_uring_disabled", lines[0]))
    return info


# (peer or tool, command that prints its version, which line/regex to keep)
VERSION_CMDS = [
    ("qemu-nbd", "qemu-nbd --version", None),
    ("qemu-img (qemu-img bench)", "qemu-img --version", None),
    ("nbdkit", "nbdkit --version", None),
    ("fio", "fio --version", None),
    ("libnbd (nbdinfo)", "nbdinfo --version", r"libnbd"),
    ("libuv", "pkg-config --modversion libuv", None),
    ("libevent", "pkg-config --modversion libevent", None),
    ("GLib (GThreadPool)", "pkg-config --modversion glib-2.0", None),
    ("Boost.Context", "dpkg-query -W -f='${Package} ${Version}\\n' libboost-context-dev", None),
    ("concurrencykit (ck_ring)", "dpkg-query -W -f='${Package} ${Version}\\n' libck-dev", None),
    ("zstd", "zstd -V", None),
    ("pigz", "pigz -V", None),
    ("gzip", "gzip -V", None),
    ("gcc", "gcc --version", None),
    ("clang", "clang --version", None),
    ("liburing", "pkg-config --modversion liburing", None),
    ("libzstd", "pkg-config --modversion libzstd", None),
    ("libdeflate", "dpkg-query -W -f='${Package} ${Version}\\n' libdeflate-dev", None),
    ("zlib", "pkg-config --modversion zlib", None),
    ("gnuplot", "gnuplot -V", None),
    ("meson", "meson --version", None),
]


def versions():
    out = []
    for name, cmd, pick in VERSION_CMDS:
        lines, err = run(cmd)
        if lines is None:
            out.append((name, f"NOT AVAILABLE ({err})", cmd))
            continue
        line = lines[0]
        if pick:
            line = next((ln for ln in lines if re.search(pick, ln)), line)
        out.append((name, line.strip("* "), cmd))
    return out


def build_info(build):
    info = []
    try:
        comp = json.load(open(os.path.join(build, "meson-info", "intro-compilers.json")))
        c = comp.get("host", {}).get("c", {})
        if c:
            info.append(("C compiler", f"{c.get('id')} {c.get('version')} ({' '.join(c.get('exelist', []))})"))
    except (OSError, ValueError):
        # Older meson (1.0) has no intro-compilers.json: its log names the compiler.
        try:
            for ln in open(os.path.join(build, "meson-logs", "meson-log.txt"), errors="replace"):
                if ln.startswith("C compiler for the host machine:"):
                    info.append(("C compiler", ln.split(":", 1)[1].strip()))
                    break
        except OSError:
            pass
    try:
        opts = json.load(open(os.path.join(build, "meson-info", "intro-buildoptions.json")))
        want = ("buildtype", "b_sanitize", "b_ndebug", "optimization", "debug")
        for o in opts:
            if o.get("name") in want:
                info.append((o["name"], str(o.get("value"))))
    except (OSError, ValueError):
        pass
    return info


def git_info(repo):
    head, _ = run(f"git -C '{repo}' log -1 --format='%h %cI %s'")
    dirty, _ = run(f"git -C '{repo}' status --porcelain --untracked-files=no | head -1")
    s = head[0] if head else "unknown"
    if dirty:
        s += " (working tree has uncommitted changes)"
    return s


# ----------------------------------------------------------------- report -
# report.md is written section by section, in this order: the run and how to
# read it, the targets (whose first table is also headline.md), the machine
# and versions, the runs, the results per suite, what could not run, notes,
# and the commands behind the rows.  Each report_* function appends one part.
class Report:
    """The report's lines, and short ids for the commands the tables cite."""

    def __init__(self):
        self.lines = []
        self.cmd_ids = {}

    def w(self, line):
        self.lines.append(line)

    def cid(self, c):
        if c not in self.cmd_ids:
            self.cmd_ids[c] = f"c{len(self.cmd_ids) + 1}"
        return self.cmd_ids[c]


def report_intro(rep, a):
    """Title, mode, commit, load, build and deps warnings, the ratio convention."""
    w, out = rep.w, a.out
    mode = "QUICK (run.sh --quick)" if a.quick else "full"
    w("# iocore benchmark report\n")
    w(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by `make bench`"
      f"{' QUICK=1' if a.quick else ''} (scripts/bench.sh -> scripts/bench-report.py).  ")
    w(f"Mode: {mode}; {a.repeats} repeat(s) of every module; wall time {a.seconds} s.  ")
    w(f"iocore commit: {git_info(a.repo)}.  ")
    w(f"Load average at start / end: {a.load_start or 'n/a'} / "
      f"{' '.join(open('/proc/loadavg').read().split()[:3]) if os.path.exists('/proc/loadavg') else 'n/a'}"
      f" on {os.cpu_count()} CPUs (a load well above 1 means other work competed with the "
      "benchmarks: compare ratios within this report, and distrust small differences).\n")
    if not a.build_ok:
        failed = []
        try:
            failed = [ln.split(" ", 1)[1] for ln in open(os.path.join(out, "logs", "build.log"),
                                                         errors="replace")
                      if ln.startswith("FAILED: ")]
        except OSError:
            pass
        w("**WARNING: the build failed; benchmarks ran with whatever binaries existed"
          + (f" ({len(failed)} targets failed, e.g. {', '.join(failed[:3])}; see logs/build.log)"
             if failed else " (see logs/build.log)") + ".**\n")
    if not a.deps_ok:
        w("**WARNING: scripts/install-deps.sh failed; some peers may be missing "
          "(see 'Peers that could not run').**\n")
    w("## How to read the numbers\n")
    w("Every value is the **median** over the repeats (the spread column shows "
      "(max - min) / median).  Rows with the same suite, case, params and metric are "
      "compared: iocore (peer=false) against each peer.\n")
    w("**advantage = ours / peer for higher-is-better metrics, peer / ours for "
      "lower-is-better metrics: > 1 means iocore is better** (2.00x = twice the rate or "
      "half the time; 0.50x = half as good).  Targets are written in the same convention.  "
      f"A target result marked \"noisy\" rests on repeats that spread more than {NOISY:.0%} "
      "around their median: rerun before believing it.\n")


def report_targets(rep, targets):
    """One line per target (the headline), then every comparison.  -> headline lines."""
    w = rep.w
    w("## Targets\n")
    npass = sum(1 for t in targets if t["status"] == "PASS")
    nfail = sum(1 for t in targets if t["status"] == "FAIL")
    nmiss = sum(1 for t in targets if t["status"] == "MISSING")
    w(f"{npass} comparisons pass, {nfail} fail, {nmiss} missing.\n")
    w("Headline: one line per target, with its worst comparison "
      "(also in headline.md, ready for the top-level README).\n")
    head_start = len(rep.lines)
    w("| suite | target | needed | comparisons passing | worst | where (worst) | result |")
    w("|---|---|---|---|---|---|---|")
    for key, ts in target_summary(targets):
        evald = [t for t in ts if t["status"] in ("PASS", "FAIL")]
        npas = sum(1 for t in evald if t["status"] == "PASS")
        if not evald:
            res, worst, where, count = "MISSING", "n/a", md_escape(ts[0].get("note", "")), "0/0"
        else:
            # The worst is the smallest advantage, or for a "<= max" value target the largest.
            pick = max if ts[0]["upper_bound"] else min
            wt = pick(evald, key=lambda t: t["achieved"])
            worst = fmt(wt["achieved"]) if wt["kind"] == "value" else fmt_ratio(wt["achieved"])
            where = md_escape(wt["where"])
            count = f"{npas}/{len(evald)}"
            res = ("PASS" if npas == len(evald) else "FAIL") + noise_note(wt)
            if len(evald) < len(ts):
                count += f" ({len(ts) - len(evald)} missing)"
        w(f"| {key[0]} | {md_escape(key[1])} | {ts[0]['target']} | {count} | {worst} | {where} | {res} |")
    headline = rep.lines[head_start:]
    w("")
    w("Every comparison:\n")
    w("| suite | target | where | iocore | compared with | advantage | needed | result |")
    w("|---|---|---|---|---|---|---|---|")
    for t in targets:
        cmpw = t["peer"]
        if t["peerval"] is not None:
            cmpw += f" ({fmt(t['peerval'])})"
        ach = fmt(t["achieved"]) if t["kind"] == "value" else fmt_ratio(t["achieved"])
        res = t["status"] + noise_note(t) + (f": {t['note']}" if t.get("note") else "")
        w(f"| {t['suite']} | {md_escape(t['text'])} | {md_escape(t['where'])} | "
          f"{fmt(t['ours'])} | {md_escape(cmpw)} | {ach} | {t['target']} | {md_escape(res)} |")
    w("")
    return headline


def report_machine(rep, a):
    """The machine, the build, and the version of every peer and tool."""
    w = rep.w
    w("## Machine\n")
    w("| | |")
    w("|---|---|")
    for k, v in machine_info():
        w(f"| {md_escape(k)} | {md_escape(v)} |")
    for k, v in build_info(a.build):
        w(f"| build {md_escape(k)} | {md_escape(v)} |")
    w("")

    w("## Peer and tool versions\n")
    w("| peer / tool | version | from |")
    w("|---|---|---|")
    for name, ver, cmd in versions():
        w(f"| {md_escape(name)} | {md_escape(ver)} | {code(cmd, table=True)} |")
    w("")


def report_runs(rep, runs):
    """Every run of every module, and the time per module."""
    w = rep.w
    w("## Runs\n")
    w("| module | repeat | status | exit | seconds | rows | stderr |")
    w("|---|---|---|---|---|---|---|")
    for r in runs:
        if r.get("status") == "skipped":
            w(f"| {r['module']} | - | skipped | - | - | - | {md_escape(r.get('why', ''))} |")
            continue
        st = r["status"]
        if st == "timeout":
            st = f"TIMEOUT after {r.get('timeout')} s"
        elif st != "ok":
            st = "FAILED"
        w(f"| {r['module']} | {r['repeat']} | {st} | {r.get('rc')} | {r.get('seconds')} | "
          f"{r.get('rows', 0)} | logs/{r['module']}.{r['repeat']}.log |")
    per_mod = {}
    for r in runs:
        if r.get("status") != "skipped":
            per_mod[r["module"]] = per_mod.get(r["module"], 0) + int(r.get("seconds", 0))
    if per_mod:
        w("\nTime per module (all repeats): " +
          ", ".join(f"{m} {s} s" for m, s in per_mod.items()) + ".")
    w("")


def report_workloads(rep, gs, target_list):
    """For a suite whose rows say whether the client was the limit (nbd): one
    line per workload with iocore's advantage over the best peer in the rate,
    p99 and server CPU per I/O, the targets that apply, and who was
    client-bound."""
    w = rep.w
    by = {}
    for g in gs:
        by.setdefault((g.case, g.params), {})[g.metric] = g
    kinds = (("rate", lambda m: m.lower() in ("iops", "mb/s")), ("p99", lambda m: m.startswith("p99")),
             ("server CPU/IO", lambda m: m.lower().startswith("server cpu")))
    w("Per workload: iocore's advantage over the best peer in each metric (> 1 is better "
      "for iocore; for p99 and CPU per I/O, the best peer's value over iocore's), the target "
      "that applies to it, and the busiest client thread in iocore's and the best peer's runs "
      "(% of one core; client-bound at 95% or more, where the IOPS target is 1.0x instead of "
      "1.5x).\n")
    w("| case | params | rate | rate target | p99 | p99 target | server CPU/IO | CPU target | "
      "client thread: iocore / best peer |")
    w("|---|---|---|---|---|---|---|---|---|")
    for (case, params), ms in by.items():
        cells = []
        rate_peer = None
        for _, pick in kinds:
            g = next((g for m, g in ms.items() if pick(m)), None)
            o = g.plain_ours() if g else None
            bp = g.best(g.peers()) if g else None
            if g is None or o is None:
                cells += ["-", "-"]
                continue
            if g.metric.lower() in ("iops", "mb/s"):
                rate_peer = bp
            a = advantage(o.median, bp.median, g.better) if bp else None
            cell = fmt_ratio(a) + (f" ({g.metric} {fmt(o.median)} vs {bp.name} {fmt(bp.median)})"
                                   if bp else " (no peer)")
            need = [t for t in target_list if t["kind"] == "peer" and matches(t, g)]
            if need:
                mins = min(t["min"] for t in need)
                res = "PASS" if a is not None and a >= mins - 1e-12 else "FAIL"
                tc = f">= {mins:.3g}x {res}"
            else:
                tc = "-"
            cells += [cell, tc]
        pct = ms.get("client busiest thread %")
        if pct is not None:
            o = pct.plain_ours()
            peer = pct.impls.get(rate_peer.name) if rate_peer else None
            ct = (f"{fmt(o.median) if o else 'n/a'}%{o.bound_note() if o else ''} / "
                  f"{fmt(peer.median) + '%' + peer.bound_note() if peer else 'n/a'}")
        else:
            ct = "-"
        if all(c == "-" for c in cells):
            continue
        w(f"| {md_escape(case)} | {md_escape(params)} | " + " | ".join(md_escape(c) for c in cells)
          + f" | {md_escape(ct)} |")
    w("")


def report_results(rep, groups, plots, notes, target_list=()):
    """Per suite: iocore against the best peer, all rows, the plots."""
    w = rep.w
    suites = []
    for g in groups.values():
        if g.suite not in suites:
            suites.append(g.suite)
    w("## Results\n")
    if not suites:
        w("No rows at all: no module printed a benchmark row.\n")
    for s in suites:
        gs = [g for g in groups.values() if g.suite == s]
        w(f"### {s}\n")
        if any(im.bound for g in gs for im in g.impls.values()):
            report_workloads(rep, gs, target_list)
        if any(g.peers() for g in gs):
            w("Summary: iocore against the best peer of each comparison.\n")
            w("| case | params | metric | iocore | best peer | peer value | advantage |")
            w("|---|---|---|---|---|---|---|")
        else:
            w("No comparison with a peer in this suite.")
        alone = 0
        for g in gs:
            if not g.peers():
                alone += 1
                continue
            ours = g.ours() or [None]
            bp = g.best(g.peers())
            for o in ours:
                oname = "" if o is None or o.name == "iocore" else f" ({o.name})"
                ov = o.median if o else None
                if bp is None:
                    bpn = "(no peer ran: " + ", ".join(p.name for p in g.peers()) + ")"
                    bpv, adv = "", "n/a"
                else:
                    bpn, bpv = bp.name + bp.bound_note(), fmt(bp.median)
                    adv = fmt_ratio(advantage(ov, bp.median, g.better))
                ovs = fmt(ov) + (o.bound_note() if o else "")
                w(f"| {md_escape(g.case)}{md_escape(oname)} | {md_escape(g.params)} | "
                  f"{md_escape(g.metric)} ({g.better} is better) | {ovs} | {md_escape(bpn)} | "
                  f"{bpv} | {adv} |")
        if alone:
            w(f"\n{alone} measurement(s) of this suite have no peer (iocore alone, e.g. a "
              "scaling curve): see all rows below.")
        w("")
        w("All rows (median of the repeats; advantage of iocore over that row):\n")
        w("| case | params | metric | impl | median | min - max | spread | n | advantage | cmd |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for g in gs:
            ours = [o for o in g.ours() if o.median is not None]
            for im in sorted(g.impls.values(), key=lambda i: (i.peer, i.name)):
                if im.peer and ours:
                    advs = [(o.name, advantage(o.median, im.median, g.better)) for o in ours]
                    if len(advs) == 1:
                        adv = fmt_ratio(advs[0][1])
                    else:
                        adv = ", ".join(f"{n} {fmt_ratio(v)}" for n, v in advs)
                elif im.peer:
                    adv = "n/a (no iocore value)"
                else:
                    adv = "-"
                vals = im.values
                mm = f"{fmt(min(vals))} - {fmt(max(vals))}" if vals else "n/a"
                sp = im.spread()
                spt = f"{sp * 100:.0f}%" if sp is not None else "-"
                med = fmt(im.median)
                if im.median is None:
                    med = "**not run**"
                n = f"{len(vals)}" + (f" (+{len(im.errors)} failed)" if im.errors else "")
                cmds = ", ".join(rep.cid(c) for c in im.cmds)
                name = im.name + (" (peer)" if im.peer else "") + im.bound_note()
                w(f"| {md_escape(g.case)} | {md_escape(g.params)} | {md_escape(g.metric)} | "
                  f"{md_escape(name)} | {med} | {mm} | {spt} | {n} | {md_escape(adv)} | {cmds} |")
            for warn in g.warnings:
                notes.append(f"{g.suite}/{g.case} {g.params} {g.metric}: {warn}")
        w("")
        for title, png in plots.get(s, []):
            w(f"![{md_escape(title)}](plots/{png})\n")


def report_problems(rep, out, runs, rows, invalid):
    """Peer coverage, rows without a value, failed runs, leftovers, invalid lines."""
    w = rep.w
    w("## Peers covered\n")
    w("| peer | suites | rows with a value | rows without | status |")
    w("|---|---|---|---|---|")
    for name, suites, nok, nbad, err in peer_coverage(rows):
        if nok and not nbad:
            st = "ran"
        elif nok:
            st = f"ran, but not everywhere: {err}"
        elif nbad:
            st = f"**could not run**: {err}"
        else:
            st = "**no rows**: no benchmark printed a row for it"
        w(f"| {name} | {', '.join(suites) or '-'} | {nok} | {nbad} | {md_escape(st)} |")
    w("")
    w("## Peers that could not run (and iocore rows without a value)\n")
    fails = {}
    for r in rows:
        if r["value"] is None or r.get("error"):
            k = (r["suite"], r["case"], r["params"], r["impl"], r["peer"],
                 str(r.get("error") or "value is null"))
            fails[k] = fails.get(k, 0) + 1
    if not fails:
        w("Every row has a value.\n")
    else:
        w("Every row with \"value\": null (or with an \"error\"), with the reason it gives.\n")
        w("| suite | case | params | impl | times | why |")
        w("|---|---|---|---|---|---|")
        for (su, ca, pa, im, peer, err), n in sorted(fails.items()):
            who = im + ("" if peer else " (iocore itself)")
            w(f"| {md_escape(su)} | {md_escape(ca)} | {md_escape(pa)} | {md_escape(who)} | "
              f"{n} | {md_escape(err)} |")
        w("")
    bad_runs = [r for r in runs if r.get("status") not in ("ok", "skipped")]
    if bad_runs:
        w("Runs that failed or timed out (their rows up to the failure are kept above; "
          "the tail of stderr is below):\n")
        for r in bad_runs:
            log = os.path.join(out, "logs", f"{r['module']}.{r['repeat']}.log")
            try:
                tail = open(log, errors="replace").read().splitlines()[-8:]
            except OSError:
                tail = []
            w(f"- bench/{r['module']}/run.sh, repeat {r['repeat']}: {r['status']} (exit {r.get('rc')})")
            if tail:
                w("  ```")
                for ln in tail:
                    w("  " + ln[:300])
                w("  ```")
        w("")
    try:
        left = open(os.path.join(out, "leftovers.txt")).read().splitlines()
    except OSError:
        left = []
    if left:
        w("Processes a run.sh left running after it exited (they load the machine for "
          "every later run; the module's run.sh must stop them):\n")
        for ln in left:
            w(f"- {code(ln[:300])}")
        w("")
    skipped = [r for r in runs if r.get("status") == "skipped"]
    if skipped:
        w("Modules without a runner (nothing measured): " +
          ", ".join(f"{r['module']} ({r.get('why')})" for r in skipped) + ".\n")
    if invalid:
        w(f"Lines on stdout that are not valid rows ({len(invalid)}; also in invalid.txt):\n")
        for iv in invalid[:50]:
            w(f"- {iv['module']}.{iv['repeat']} line {iv['line']}: {md_escape(iv['why'])}: "
              f"{code(iv['text'][:160])}")
        if len(invalid) > 50:
            w(f"- ... {len(invalid) - 50} more in invalid.txt")
        w("")


def report_commands(rep, notes):
    """Notes gathered on the way, and the command behind every id."""
    w = rep.w
    if notes:
        w("## Notes\n")
        for n in notes:
            w(f"- {md_escape(n)}")
        w("")

    w("## Commands behind the rows\n")
    w("Each id is referenced from the 'cmd' column above; every row's own command is also "
      "in rows.jsonl.\n")
    for c, i in rep.cmd_ids.items():
        w(f"- {i}: {code(c)}")
    w("")


def write_headline(a, headline):
    """headline.md: the targets' first table and how it was made (for README.md)."""
    mi = dict(machine_info())
    with open(os.path.join(a.out, "headline.md"), "w") as f:
        f.write(f"Targets from `make bench{' QUICK=1' if a.quick else ''}` "
                f"({a.repeats} repeat(s), medians), "
                f"commit {git_info(a.repo).split(' ')[0]}, {mi.get('CPU', '?')} "
                f"({mi.get('CPUs', '?').split(',')[0]}), {mi.get('Kernel', '?')}, "
                f"load average {a.load_start or 'n/a'} at the start. "
                "Advantage > 1 means iocore is better (ours/peer for rates, peer/ours for "
                "times); each target's worst comparison is shown. "
                "Full report: build/bench/report.md.\n\n")
        f.write("\n".join(headline) + "\n")


def write_report(a, runs, rows, invalid, groups, targets, plots, notes, target_list=()):
    rep = Report()
    report_intro(rep, a)
    headline = report_targets(rep, targets)
    report_machine(rep, a)
    report_runs(rep, runs)
    report_results(rep, groups, plots, notes, target_list)
    report_problems(rep, a.out, runs, rows, invalid)
    report_commands(rep, notes)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(rep.lines) + "\n")
    write_headline(a, headline)


def main_report(a):
    runs, rows, invalid = load(a.out)
    with open(os.path.join(a.out, "rows.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=False) + "\n")
    with open(os.path.join(a.out, "invalid.txt"), "w") as f:
        for iv in invalid:
            f.write(f"{iv['module']}.{iv['repeat']}:{iv['line']}: {iv['why']}: {iv['text']}\n")
    groups = aggregate(rows)
    target_list = load_targets(a.targets)
    targets = check_targets(groups, target_list)
    notes = []
    plots = make_plots(groups, os.path.join(a.out, "plots"), notes)
    write_report(a, runs, rows, invalid, groups, targets, plots, notes, target_list)
    print(f"bench-report: {len(rows)} rows, {len(invalid)} invalid lines, "
          f"{sum(len(v) for v in plots.values())} plots -> {os.path.join(a.out, 'report.md')}",
          file=sys.stderr)
    return 0


# -------------------------------------------------------------- self-test -
def sample_rows():
    """A plausible run of every suite, with failures mixed in."""
    R = []

    def row(suite, case, params, impl, peer, metric, value, better, **kw):
        d = dict(suite=suite, case=case, params=params, impl=impl, peer=peer, metric=metric,
                 value=value, better=better, cmd=f"bench-{suite} --case {case} --impl {impl} {params}")
        d.update(kw)
        R.append(d)

    for be in ("epoll", "io_uring"):
        for n, v in ((0, 1.0e6), (100, 0.99e6), (1000, 0.98e6), (3200, 0.97e6 if be == "io_uring" else 0.5e6)):
            # threads=1cpu: the loop target reads the pinned rows (bench/loop/run.sh).
            row("loop", "idle", f"backend={be},idle={n},threads=1cpu", "iocore", False,
                "events/s", v, "higher")
        row("loop", "pingpong", f"backend={be}", "iocore", False, "roundtrips/s", 300000, "higher")
    row("loop", "pingpong", "backend=epoll", "libuv", True, "roundtrips/s", 200000, "higher")
    row("loop", "pingpong", "backend=epoll", "libevent", True, "roundtrips/s", 260000, "higher")
    row("loop", "pingpong", "backend=io_uring", "libuv", True, "roundtrips/s", 200000, "higher")
    row("loop", "pingpong", "backend=io_uring", "libevent", True, "roundtrips/s", None, "higher",
        error="libevent has no io_uring backend")
    row("loop", "pingpong", "backend=epoll,no_poll", "iocore", False, "roundtrips/s", 1000, "higher")
    row("loop", "pingpong", "backend=epoll,no_poll", "libuv", True, "roundtrips/s", 200000, "higher")
    row("loop", "wakeup", "", "iocore", False, "ns/roundtrip", 10000, "lower")
    row("loop", "wakeup", "", "libuv", True, "ns/roundtrip", 58000, "lower")
    row("co", "switch", "", "iocore", False, "ns/switch", 6.0, "lower")
    row("co", "switch", "", "boost-fcontext", True, "ns/switch", 5.5, "lower")
    row("co", "switch", "", "iocore", False, "cpu-ns/switch", 1.0, "lower")
    row("co", "switch", "", "boost-fcontext", True, "cpu-ns/switch", 5.5, "lower")
    for w_ in (1, 2):
        for case, k in (("tiny", 1.0), ("large", 0.1)):
            row("wq", case, f"workers={w_},batch=on", "iocore", False, "jobs/s", 4e6 * k * w_, "higher")
            row("wq", case, f"workers={w_},batch=on", "gthreadpool", True, "jobs/s", 1e6 * k * w_, "higher")
            row("wq", case, f"workers={w_},batch=on", "mutex-condvar", True, "jobs/s", 0.8e6 * k * w_, "higher")
    for wl in ("randread", "randrw"):
        for c in (1, 4):
            p = f"rw={wl},jobs={c}"
            row("nbd", "fio", p, "iocore-nbd", False, "IOPS", 90000, "higher")
            row("nbd", "fio", p, "qemu-nbd-io_uring", True, "IOPS", 60000, "higher")
            row("nbd", "fio", p, "nbdkit", True, "IOPS", 100000, "higher")
            row("nbd", "fio", p, "iocore-nbd", False, "p99 us", 900, "lower")
            row("nbd", "fio", p, "qemu-nbd-io_uring", True, "p99 us", 1200, "lower")
            row("nbd", "fio", p, "nbdkit", True, "p99 us", 1000, "lower")
    # Client-bound marking (bench/nbd/run.sh): one connection saturates the
    # client's thread, so its IOPS target is 1.0x; four do not (1.5x).
    for c, pct in ((1, 97.0), (4, 40.0)):
        p = f"bs=4k,iodepth=64,conns={c}"
        for impl, peer, iops, cpu, pc in (("iocore", False, 150000, 5.0, pct),
                                          ("nbdkit-file", True, 120000, 12.0, 60.0)):
            kw = dict(client_bound=pc >= 95, client_thread_pct=pc)
            row("nbd", "randread", p, impl, peer, "IOPS", iops, "higher", **kw)
            row("nbd", "randread", p, impl, peer, "server CPU us/IO", cpu, "lower", **kw)
            row("nbd", "randread", p, impl, peer, "client busiest thread %", pc, "lower", **kw)
    for impl, peer, mbs in (("iocore", False, 3000), ("nbdkit-file", True, 1500)):
        row("nbd", "seqread", "bs=1m,iodepth=16,conns=1", impl, peer, "MB/s", mbs, "higher",
            client_bound=False, client_thread_pct=30.0)
    for lv in (1, 3, 9):
        p = f"corpus=usr,level={lv}"
        row("zip", "compress", p, "iocore-zip", False, "MB/s", 300 / lv, "higher")
        row("zip", "compress", p, "zstd -T2", True, "MB/s", 280 / lv, "higher")
        row("zip", "compress", p, "iocore-zip", False, "size ratio", 0.36, "lower")
        row("zip", "compress", p, "zstd -T2", True, "size ratio", 0.355, "lower")
    return R


def self_test():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    # The convention itself.
    check(advantage(200, 100, "higher") == 2.0, "higher: ours/peer")
    check(advantage(50, 100, "lower") == 2.0, "lower: peer/ours")
    check(advantage(None, 100, "lower") is None, "missing ours")
    check(advantage(0, 100, "lower") is None, "zero ours, lower")
    check(parse_params("a=1, b=x;c") == {"a": "1", "b": "x", "c": ""}, "parse_params")

    tmp = tempfile.mkdtemp(prefix="bench-report-selftest-")
    try:
        os.makedirs(os.path.join(tmp, "raw"))
        rows = sample_rows()
        mods = {}
        for r in rows:
            mods.setdefault(r["suite"], []).append(r)
        runs = []
        for rep in (1, 2, 3):
            for m, rs in mods.items():
                with open(os.path.join(tmp, "raw", f"{m}.{rep}.jsonl"), "w") as f:
                    for r in rs:
                        r2 = dict(r)
                        if r2["value"] is not None:
                            r2["value"] = r2["value"] * (1 + 0.01 * (rep - 2))
                        f.write(json.dumps(r2) + "\n")
                    if m == "loop" and rep == 1:
                        f.write("this is not json\n")
                        f.write('{"suite":"loop"}\n')
                runs.append(dict(module=m, repeat=rep, status="ok", rc=0, seconds=1, lines=0,
                                 timeout=60))
        runs.append(dict(module="blk", repeat=0, status="skipped", why="no-run.sh"))
        with open(os.path.join(tmp, "runs.jsonl"), "w") as f:
            for r in runs:
                f.write(json.dumps(r) + "\n")
        a = argparse.Namespace(out=tmp, repo=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               build=tmp, targets=DEFAULT_TARGETS,
                               quick=1, repeats=3, seconds=3, deps_ok=1, build_ok=1,
                               load_start="0.00 0.00 0.00")
        main_report(a)
        rep = open(os.path.join(tmp, "report.md")).read()
        out_rows = [json.loads(x) for x in open(os.path.join(tmp, "rows.jsonl"))]
        check(len(out_rows) == 3 * len(rows), f"rows.jsonl has {len(out_rows)} rows, want {3 * len(rows)}")
        check(len(open(os.path.join(tmp, "invalid.txt")).read().splitlines()) == 2, "2 invalid lines")
        check("libevent has no io_uring backend" in rep, "error row listed")
        check("not JSON" in rep and "missing field(s)" in rep, "invalid lines listed")
        check("blk (no-run.sh)" in rep, "skipped module listed")
        # pingpong epoll: 300k vs best peer libevent 260k -> 1.15x, FAIL at 1.2x.
        check(re.search(r"\| loop \| pipe ping-pong.*pingpong backend=epoll.*\| 1\.15x \|.*FAIL", rep),
              "ping-pong epoll target 1.15x FAIL")
        check(re.search(r"\| loop \| pipe ping-pong.*backend=io_uring.*\| 1\.50x \|.*PASS", rep),
              "ping-pong io_uring target 1.50x PASS vs libuv (libevent not run)")
        # wakeup: 10 us vs 58 us, lower is better -> 5.80x.
        check(re.search(r"cross-thread.*\| 5\.80x \|.*PASS", rep), "wakeup 5.80x PASS")
        check(not re.search(r"\| loop \| pipe ping-pong.*no_poll", rep), "variants left out of targets")
        # co switch 6.0 vs 5.5 ns -> 0.92x FAIL.
        check(re.search(r"switch time.*\| 0\.92x \|.*FAIL", rep), "switch 0.92x FAIL")
        check(not re.search(r"switch time.*\| 5\.50x \|", rep), "cpu metrics left out of targets")
        check(re.search(r"3200 idle.*io_uring.*\| 0\.97x \|.*PASS", rep), "idle self target")
        check(re.search(r"p99.*\| 1\.11x \|.*PASS", rep), "p99 vs best peer (nbdkit 1000 vs 900)")
        check(re.search(r"IOPS in each workload.*\| 0\.90x \|.*FAIL", rep), "IOPS 0.90x FAIL")
        check(re.search(r"not saturated.*randread bs=4k,iodepth=64,conns=4 \[IOPS\] \|.*"
                        r"\| 1\.25x \|.*FAIL", rep), "IOPS not client-bound: 1.5x target, FAIL")
        check(re.search(r"\(client-bound\) \| .*randread bs=4k,iodepth=64,conns=1 \[IOPS\] "
                        r"\(client-bound\).*\| 1\.25x \|.*PASS", rep),
              "IOPS client-bound: 1.0x target, PASS")
        check(not re.search(r"not saturated.*conns=1 \[IOPS\]", rep),
              "a client-bound row is not held to 1.5x")
        check(re.search(r"server CPU per I/O.*\| 2\.40x \|.*PASS", rep), "server CPU/IO 2.40x PASS")
        check(re.search(r"sequential reads and writes.*\| 2\.00x \|.*PASS", rep), "seq MB/s 2x PASS")
        check(re.search(r"\| randread \| bs=4k,iodepth=64,conns=1 \| 1\.25x .*\| >= 1x PASS \| - \| - "
                        r"\| 2\.40x .*\| >= 2x PASS \| 97\.00% \(client-bound\) / 60\.00% \|", rep),
              "per-workload line: ratios, targets, client-bound")
        check(re.search(r"at most 3% larger.*\| 0\.99x \|.*PASS", rep), "size within 3%")
        check(re.search(r"tiny jobs.*\| 4\.00x \|.*PASS", rep), "wq tiny 4x")
        check("MISSING: no matching rows" in rep, "unmeasured targets say so")
        t_cb = [dict(suite="nbd", kind="peer", metric="^MB/s$", client_bound=True, min=1.0,
                     text="x")]
        check("no comparison was bound by the client" in
              check_targets(aggregate(sample_rows()), t_cb)[0]["note"],
              "a client-bound target without client-bound rows says why")
        check(re.search(r"\| libevent \| loop \| 3 \| 3 \| ran, but not everywhere", rep),
              "peer coverage: libevent ran 3 times, failed 3 times")
        check(re.search(r"\| pigz \| - \| 0 \| 0 \| \*\*no rows", rep), "peer coverage: pigz absent")
        pngs = sorted(f for f in os.listdir(os.path.join(tmp, "plots")) if f.endswith(".png"))
        for want in ("wq-tiny-jobs-s-vs-workers.png", "loop-idle-events-s-vs-idle.png",
                     "nbd-iops.png", "nbd-p99-us.png", "zip-compress-mb-s-vs-level.png"):
            check(want in pngs, f"plot {want} (have {pngs})")
        for p in pngs:
            with open(os.path.join(tmp, "plots", p), "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{p} is a PNG")
        check("![" in rep and "plots/" in rep, "plots linked from the report")
        head = open(os.path.join(tmp, "headline.md")).read()
        check(head.count("\n| ") >= len(load_targets(DEFAULT_TARGETS)),
              "headline.md has one line per target")
        check("noisy" not in head, "2% spread is not flagged as noisy")
        keep = os.environ.get("BENCH_SELFTEST_KEEP")
        if keep:
            print(f"self-test output kept in {tmp}", file=sys.stderr)
    finally:
        if not os.environ.get("BENCH_SELFTEST_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print(f"not ok - {f}", file=sys.stderr)
    print("bench-report self-test: " + ("FAILED" if failures else "ok"), file=sys.stderr)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="the bench output directory (BUILD/bench)")
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--build", default="build")
    ap.add_argument("--targets", default=DEFAULT_TARGETS,
                    help="the targets file (default: bench/targets.json)")
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--deps-ok", type=int, default=1)
    ap.add_argument("--build-ok", type=int, default=1)
    ap.add_argument("--load-start", default="")
    ap.add_argument("--self-test", action="store_true",
                    help="generate sample rows, make a report from them and check it")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.out:
        ap.error("--out is required")
    return main_report(a)


if __name__ == "__main__":
    sys.exit(main())
