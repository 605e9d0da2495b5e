#!/bin/sh
# bench/vhost/polling.sh BUILD_DIR [--quick]
#
# The polling-scalability experiment: 1, 10 and 100 vhost-user-blk
# devices of 4 queues each, all exports of one node on one I/O thread of
# one back-end, every ring started by iocore-bench vhost-blk, load on one
# ring of one device only (4 KiB random reads at depth 1, --busy-rings 1).
# A back-end that polls every handler, or wakes for every idle one, loses
# IOPS as devices are added; one that polls only what was recently active
# keeps them.  Then every one of the 100 devices idle (--idle): the
# back-end's CPU in % of one core over that time.
#
# Both back-ends, interleaved (device count, then back-end, repeated):
# iocore-storage-daemon and qemu-storage-daemon (aio=io_uring), same
# image in /dev/shm, same driver.  Medians of the repeats.  One JSON row
# per line on stdout (suite "vhost"); the table on stderr: IOPS at N
# devices over IOPS at 1 (the target: within 5% at 100), the idle CPU
# (the target: under 1% of a core).  --quick: fewer requests and
# repeats.  With two CPUs or more the back-end runs on the last and the
# driver on the first (both back-ends alike): a daemon that polls and a
# driver waiting on its call eventfd, left to the scheduler on a small
# machine, share a core in some runs and not in others, and the repeats
# then disagree tenfold.  --no-pin leaves them to the scheduler.
# Not part of the test suite.
IOC_BENCH_COMMON=$(cd "$(dirname "$0")/../common" && pwd) exec python3 - "$@" <<'EOF'
import json, os, shutil, statistics, subprocess, sys, time
sys.path.insert(0, os.environ["IOC_BENCH_COMMON"])
from benchlib import cpu_s, log, row_writer, stop, workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: polling.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
driver = os.path.join(build, "tools/bench/iocore-bench")
ours = os.path.join(build, "tools/daemon/iocore-storage-daemon")
counts = (1, 10, 100)
repeats = 3 if quick else 5
requests = 20000 if quick else 100000
idle_s = 3 if quick else 10
work = workdir("ioc-vhost-polling.")
cpus = sorted(os.sched_getaffinity(0))
pin = "--no-pin" not in sys.argv and len(cpus) >= 2


def on_cpu(c):
    """A preexec_fn that pins the child to CPU c (None: unpinned)."""
    return (lambda: os.sched_setaffinity(0, {c})) if pin else None
img = os.path.join(work, "disk.img")


def sock(i):
    return os.path.join(work, "v%d.sock" % i)


def start(binary, n):
    cmd = [binary, "--object", "iothread,id=t0", "--blockdev",
           "driver=file,node-name=f,filename=%s,aio=io_uring" % img]
    for i in range(n):
        if os.path.exists(sock(i)):
            os.unlink(sock(i))
        cmd += ["--export", "type=vhost-user-blk,id=e%d,node-name=f,addr.type=unix,"
                "addr.path=%s,num-queues=4,iothread=t0,writable=on" % (i, sock(i))]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=on_cpu(cpus[-1]))
    for _ in range(2000):
        if all(os.path.exists(sock(i)) for i in range(n)):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.01)
    stop(p)
    return None


def drive(n, extra):
    cmd = [driver, "vhost-blk", "--socket", os.path.join(work, "v%d.sock"),
           "--devices", str(n), "--queues", "4", "--depth", "1", "--json", "-q"] + extra
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600,
                       preexec_fn=on_cpu(cpus[0]))
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")[-300:]
    return (json.loads(r.stdout.decode()) if r.stdout.strip() else {}), None


_row = row_writer("vhost")


def row(case, params, impl, metric, value, better, error=None):
    _row(case, params, impl, impl != "iocore", metric, value, better,
         "%s: N exports of one node, num-queues=4, one iothread; iocore-bench "
         "vhost-blk --devices N --queues 4 --depth 1 (--busy-rings 1 | --idle)%s"
         % (impl, "; back-end on CPU %d, driver on CPU %d" % (cpus[-1], cpus[0]) if pin else ""),
         error)


with open(img, "wb") as f:
    for _ in range(256):
        f.write(b"\x5a" * (1 << 20))
servers = [("iocore", ours),
           ("qemu-storage-daemon", shutil.which("qemu-storage-daemon"))]
iops = {}       # (impl, n) -> [IOPS]
cpu_io = {}     # (impl, n) -> [server CPU us per I/O]
errors = {}
for rep in range(repeats):
    for n in counts:
        for impl, binary in servers:
            if not binary or not os.access(binary, os.X_OK):
                errors[(impl, n)] = "not available"
                continue
            p = start(binary, n)
            if not p:
                errors[(impl, n)] = "did not start"
                continue
            c0 = cpu_s(p.pid)
            res, err = drive(n, ["--busy-rings", "1", "--rw", "randread",
                                 "--count", str(requests)])
            c1 = cpu_s(p.pid)
            stop(p)
            if err:
                errors[(impl, n)] = err
                continue
            iops.setdefault((impl, n), []).append(res["iops"])
            if c0 is not None and c1 is not None:
                cpu_io.setdefault((impl, n), []).append((c1 - c0) * 1e6 / requests)
            log("rep %d: %s, %d device(s): %.0f IOPS" % (rep, impl, n, res["iops"]))

idle = {}
for impl, binary in servers:
    if not binary or not os.access(binary, os.X_OK):
        continue
    p = start(binary, counts[-1])
    if not p:
        continue
    # Connected and started first, then the window: the handshakes of a
    # hundred devices are not idle time.
    d = subprocess.Popen([driver, "vhost-blk", "--socket", os.path.join(work, "v%d.sock"),
                          "--devices", str(counts[-1]), "--queues", "4", "--depth", "1",
                          "--idle", str(idle_s + 2), "-q"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         preexec_fn=on_cpu(cpus[0]))
    time.sleep(1.5)
    c0, t0 = cpu_s(p.pid), time.monotonic()
    time.sleep(idle_s)
    c1, t1 = cpu_s(p.pid), time.monotonic()
    d.wait(timeout=60)
    stop(p)
    if c0 is not None and c1 is not None:
        idle[impl] = 100.0 * (c1 - c0) / (t1 - t0)

log("")
log("%-20s %8s %10s %10s %12s" % ("back-end", "devices", "IOPS", "vs 1 dev", "CPU us/IO"))
for impl, _ in servers:
    one = statistics.median(iops[(impl, 1)]) if iops.get((impl, 1)) else None
    for n in counts:
        params = {"devices": n, "queues": 4, "busy_rings": 1, "bs": "4k", "depth": 1,
                  "rw": "randread", "repeats": len(iops.get((impl, n), []))}
        if not iops.get((impl, n)):
            row("polling-scalability", params, impl, "IOPS", None, "higher",
                errors.get((impl, n), "no run"))
            continue
        m = statistics.median(iops[(impl, n)])
        c = statistics.median(cpu_io[(impl, n)]) if cpu_io.get((impl, n)) else None
        row("polling-scalability", params, impl, "IOPS", m, "higher")
        if c is not None:
            row("polling-scalability", params, impl, "server CPU us/IO", c, "lower")
        log("%-20s %8d %10.0f %9.3fx %12s" % (impl, n, m, m / one if one else 0,
                                             "%.2f" % c if c is not None else "-"))
for impl, pct in idle.items():
    row("polling-idle", {"devices": counts[-1], "queues": 4, "seconds": idle_s}, impl,
        "server CPU % of a core", pct, "lower")
    log("%-20s all %d devices idle: %.2f%% of a core" % (impl, counts[-1], pct))
shutil.rmtree(work, ignore_errors=True)
EOF
