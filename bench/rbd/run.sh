#!/bin/sh
# bench/rbd/run.sh BUILD_DIR [--quick]
#
# A Ceph RBD image served three ways on one-host clusters
# (tests/harness/ceph.sh: one monitor, one memstore OSD, a new one for each
# server's turn), in the same run:
#   iocore-storage-daemon --blockdev driver=rbd with an NBD export and a
#     vhost-user-blk export of the node;
#   qemu-storage-daemon with the same --blockdev and both exports;
#   qemu-nbd -f raw rbd:rbd/img:conf=... (NBD only).
# All with librbd's cache on (QEMU's default, cache.direct=off).
#
# Rows: over NBD, fio's nbd engine: 4 KiB random read and write at depth
# 1, 32 and 128, 1 MiB sequential read and write at depth 8; over
# vhost-user-blk (iocore and qemu-storage-daemon), iocore-bench vhost-blk:
# 4 KiB random read and write at depth 1, 32 and 128.  The first 256 MiB
# of the image are written before the runs (reads of objects that do not
# exist cost librbd nothing) and every run stays in them.  For each row:
# the rate, p99 (fio's completion latency, the driver's), the server's
# CPU per I/O (utime+stime of the whole process from /proc over the run,
# fio's ramp included: a slight overestimate for every server alike) and
# the OSD's CPU per I/O beside it, reported, not charged to the server.
# Each server's turn (all its rows, once) has a cluster of its own, started
# afresh and its area written, so that no turn inherits another's writes.
# One JSON row per line on stdout (suite "rbd"); the table with the
# ratios (iocore over the best peer; CPU: best peer's over iocore) on
# stderr.  Servers run in rounds, each round starting with the next server
# in turn, every row taken once a round, read rows before write rows; a
# row is the median of its rounds.  --quick: 3 s runs, fewer requests and
# one round; full: 10 s runs, 3 rounds; --rounds=N sets them.  Not part of
# the suite.
IOC_SOURCE_ROOT=${IOC_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)} \
	IOC_BENCH_COMMON=$(cd "$(dirname "$0")/../common" && pwd) exec python3 - "$@" <<'EOF'
import json, os, shutil, subprocess, sys, time
sys.path.insert(0, os.environ["IOC_BENCH_COMMON"])
from benchlib import cpu_s, log, row_writer, stop, workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: run.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
root = os.environ["IOC_SOURCE_ROOT"]
ours = os.path.join(build, "tools/daemon/iocore-storage-daemon")
driver = os.path.join(build, "tools/bench/iocore-bench")
runtime, ramp = (3, 1) if quick else (10, 2)
rounds = next((int(a.split("=", 1)[1]) for a in sys.argv[1:]
               if a.startswith("--rounds=")), 1 if quick else 3)
settle = 2   # seconds between servers, for the OSD to finish what it was sent
vh_count = 20000 if quick else 100000
AREA_MB = 256
t_begin = time.monotonic()


_row = row_writer("rbd")


def row(case, params, impl, metric, value, better, error=None, cmd=""):
    _row(case, params, impl, impl != "iocore", metric, value, better, cmd, error)


def cluster_start():
    """A cluster: a shell holding it, its conf and the OSD's pid on stdout;
    closing its stdin stops it (the harness's EXIT trap).  (shell, conf,
    OSD pid), or None."""
    cl = subprocess.Popen(
        ["sh", "-c", '. "$IOC_SOURCE_ROOT/tests/harness/ceph.sh"; ceph_require; '
         'ceph_start >&2 || exit 1; echo "$CEPH_CONF $CEPH_OSD_PID"; read x'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=dict(os.environ, CEPH_MEMSTORE_BYTES=str(1 << 30), CEPH_IMG_SIZE="1G",
                 CEPH_MEMSTORE_PAGE_SET="true"))
    line = cl.stdout.readline().decode().split()
    if len(line) != 2:
        cl.wait()
        return None
    return cl, line[0], int(line[1])


def cluster_stop(cl):
    try:
        cl.stdin.close()
    except OSError:
        pass
    cl.wait(timeout=120)


first = cluster_start()
if first is None:
    for case in ("randread", "randwrite", "seqread", "seqwrite"):
        row(case, {}, "iocore", "IOPS", None, "higher",
            "no cluster (ceph packages missing or it did not start)")
    sys.exit(0)
cl, conf, osd_pid = first
work = workdir("ioc-rbd-bench.")
nbd_sock = os.path.join(work, "nbd.sock")
vh_sock = os.path.join(work, "vh.sock")
try:
    def fill():
        subprocess.run(["rbd", "-c", conf, "bench", "--io-type", "write", "--io-size", "4M",
                        "--io-threads", "4", "--io-total", "%dM" % AREA_MB,
                        "--io-pattern", "seq", "rbd/img"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)

    def daemon_cmd(binary, conf):
        return [binary, "--blockdev",
                "driver=rbd,node-name=r,pool=rbd,image=img,conf=%s" % conf,
                "--nbd-server", "addr.type=unix,addr.path=%s" % nbd_sock,
                "--export", "type=nbd,id=n,node-name=r,name=,writable=on",
                "--export", "type=vhost-user-blk,id=v,node-name=r,addr.type=unix,"
                "addr.path=%s,writable=on" % vh_sock]

    servers = [
        ("iocore", (lambda c: daemon_cmd(ours, c)) if os.access(ours, os.X_OK) else None,
         True),
        ("qemu-storage-daemon", (lambda c: daemon_cmd("qemu-storage-daemon", c))
         if shutil.which("qemu-storage-daemon") else None, True),
        ("qemu-nbd", (lambda c: ["qemu-nbd", "-f", "raw", "--cache=writeback", "-k", nbd_sock,
                                 "-x", "", "-t", "-e", "8", "rbd:rbd/img:conf=%s" % c])
         if shutil.which("qemu-nbd") else None, False),
    ]

    def start(cmd, vhost):
        for s in (nbd_sock, vh_sock):
            if os.path.exists(s):
                os.unlink(s)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(3000):
            if os.path.exists(nbd_sock) and (not vhost or os.path.exists(vh_sock)):
                return p
            if p.poll() is not None:
                return None
            time.sleep(0.01)
        stop(p, 30)
        return None

    nbd_rows = [("randread", "randread", "4k", d) for d in (1, 32, 128)] + \
               [("randwrite", "randwrite", "4k", d) for d in (1, 32, 128)] + \
               [("seqread", "read", "1m", 8), ("seqwrite", "write", "1m", 8)]
    vh_rows = [("randread", "randread", d) for d in (1, 32, 128)] + \
              [("randwrite", "randwrite", d) for d in (1, 32, 128)]

    def fio(rw, bs, depth):
        cmd = ["fio", "--name=b", "--ioengine=nbd", "--thread",
               "--uri=nbd+unix:///?socket=" + nbd_sock, "--rw=" + rw, "--bs=" + bs,
               "--iodepth=%d" % depth, "--size=%dm" % AREA_MB, "--time_based=1",
               "--runtime=%ds" % runtime, "--ramp_time=%ds" % ramp,
               "--unified_rw_reporting=1", "--output-format=json"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=runtime * 4 + 120)
        out = r.stdout.decode(errors="replace")
        if r.returncode != 0 or "{" not in out:
            raise RuntimeError("fio: " + r.stderr.decode(errors="replace")[-200:])
        m = json.loads(out[out.index("{"):])["jobs"][0]["mixed"]
        ios = m["iops"] * runtime
        return m["iops"], m["bw_bytes"] / 1e6, \
            m["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0, ios

    def vhost(rw, depth):
        cmd = [driver, "vhost-blk", "--socket", vh_sock, "--rw", rw, "--size", "4k",
               "--depth", str(depth), "--count", str(vh_count), "--range",
               "%dM" % AREA_MB, "--json", "-q", "--timeout", "60000"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)
        if r.returncode != 0 or not r.stdout.strip():
            raise RuntimeError("driver: " + r.stderr.decode(errors="replace")[-200:])
        j = json.loads(r.stdout.decode())
        return j["iops"], j["mb_s"], j["lat_us"]["p99"], j["requests"]

    fio_cmd = "fio --ioengine=nbd --size=%dm --runtime=%ds" % (AREA_MB, runtime)
    # (front, case, params, metric) -> {impl: [(rate, p99, srv, osd), ...]}
    results = {}
    cmds = {}
    for rnd in range(rounds):
        # Each round starts with the next server, so that none always
        # inherits what the one before left in the cluster.
        order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
        for impl, mkcmd, has_vhost in order:
            # Reads first, then writes: a read row right after a write row
            # measures the OSD still applying the writes, and the faster
            # writer leaves it more to apply.
            jobs = [("nbd",) + x for x in nbd_rows if x[0].endswith("read")] + \
                   ([("vhost", c, rw, "4k", d) for c, rw, d in vh_rows
                     if c.endswith("read")] if has_vhost else []) + \
                   [("nbd",) + x for x in nbd_rows if x[0].endswith("write")] + \
                   ([("vhost", c, rw, "4k", d) for c, rw, d in vh_rows
                     if c.endswith("write")] if has_vhost else [])
            # A cluster of its own for each turn: one OSD's cost per request
            # grew several times over a run's writes (bench/rbd/NOTES.md),
            # so a shared cluster favoured whoever ran first.
            if cl is None:
                c = cluster_start()
                if c is None:
                    log("rbd: a cluster did not start; this turn is skipped")
                    continue
                cl, conf, osd_pid = c
            log("rbd: %s, round %d: writing the first %d MiB of rbd/img"
                % (impl, rnd + 1, AREA_MB))
            fill()
            time.sleep(settle)
            cmd = mkcmd(conf) if mkcmd else None
            p = start(cmd, has_vhost) if cmd else None
            for front, case, rw, bs, depth in jobs:
                metric = "MB/s" if bs == "1m" else "IOPS"
                key = (front, case, "bs=%s,iodepth=%d" % (bs, depth), metric)
                params = {"front": front, "bs": bs, "iodepth": depth}
                if p is None:
                    if rnd == 0:
                        row(case, params, impl, metric, None, "higher",
                            "not available" if not cmd else "did not start")
                    continue
                s0, o0 = cpu_s(p.pid), cpu_s(osd_pid)
                try:
                    if front == "nbd":
                        iops, mbs, p99, ios = fio(rw, bs, depth)
                    else:
                        iops, mbs, p99, ios = vhost(rw, depth)
                except Exception as e:
                    row(case, params, impl, metric, None, "higher", str(e)[:200])
                    continue
                s1, o1 = cpu_s(p.pid), cpu_s(osd_pid)
                srv = None if None in (s0, s1) or not ios else round((s1 - s0) * 1e6 / ios, 2)
                osd = None if None in (o0, o1) or not ios else round((o1 - o0) * 1e6 / ios, 2)
                rate = mbs if metric == "MB/s" else iops
                cmds[(key, impl)] = " ".join(cmd) + " ; " + \
                    (fio_cmd if front == "nbd" else "iocore-bench vhost-blk")
                results.setdefault(key, {}).setdefault(impl, []).append((rate, p99, srv, osd))
                log("%-20s round %d %-5s %-9s bs=%-3s depth=%-3d %9.0f %-4s p99 %8.1f us  "
                    "CPU us/IO server %s OSD %s" % (impl, rnd + 1, front, case, bs, depth,
                                                     rate, metric, p99, srv, osd))
            if p is not None:
                stop(p, 30)
            cluster_stop(cl)
            cl = None

    def median(vals):
        vals = sorted(v for v in vals if v is not None)
        if not vals:
            return None
        m = len(vals) // 2
        return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2

    # Each impl's row is the median of its rounds, metric by metric.
    for key in results:
        front, case, params_s, metric = key
        bs, depth = params_s.split(",")
        params = {"front": front, "bs": bs[3:], "iodepth": int(depth[8:])}
        for impl, runs in results[key].items():
            med = tuple(median([r[i] for r in runs]) for i in range(4))
            results[key][impl] = med
            c = cmds[(key, impl)]
            row(case, params, impl, metric, round(med[0], 1), "higher", cmd=c)
            row(case, params, impl, "p99 us", med[1], "lower", cmd=c)
            row(case, params, impl, "server CPU us/IO", med[2], "lower", cmd=c)
            row(case, params, impl, "OSD CPU us/IO", med[3], "lower", cmd=c)

    def fmt(v, f="%.0f"):
        return "-" if v is None else f % v

    log("")
    log("%-5s %-9s %-18s %-4s | %9s %9s %9s | %8s %8s %8s | %7s %7s" % (
        "front", "case", "params", "", "iocore", "qsd", "qemu-nbd", "srv us", "qsd us",
        "nbd us", "rate x", "cpu x"))
    for (front, case, params, metric), by in results.items():
        o = by.get("iocore")
        peers = [v for k, v in by.items() if k != "iocore"]
        best = max(peers, key=lambda v: v[0]) if peers else None
        cpus = [v[2] for v in peers if v[2]]
        rr = o[0] / best[0] if o and best and best[0] else None
        cr = min(cpus) / o[2] if o and o[2] and cpus else None
        q, n = by.get("qemu-storage-daemon"), by.get("qemu-nbd")
        log("%-5s %-9s %-18s %-4s | %9s %9s %9s | %8s %8s %8s | %7s %7s" % (
            front, case, params, metric, fmt(o and o[0]), fmt(q and q[0]), fmt(n and n[0]),
            fmt(o and o[2], "%.1f"), fmt(q and q[2], "%.1f"), fmt(n and n[2], "%.1f"),
            fmt(rr, "%.2f"), fmt(cr, "%.2f")))
    log("rbd: %.0f s" % (time.monotonic() - t_begin))
finally:
    shutil.rmtree(work, ignore_errors=True)
    if cl is not None:
        cluster_stop(cl)
EOF
