#!/bin/sh
# bench/qcow2/run.sh BUILD_DIR [--quick]
#
# The qcow2 driver served over NBD against QEMU's: iocore-nbd -f qcow2
# (and, in a full run, iocore-storage-daemon with a qcow2 --blockdev as
# the variant "iocore-storage-daemon"), qemu-nbd -f qcow2
# --cache=writeback --aio=io_uring and qemu-storage-daemon (file node
# aio=io_uring, qcow2 node over it), images in /dev/shm, fio's nbd
# engine, one connection:
#
# - randread: 4 KiB at iodepth 64 of a fully allocated image (4 GiB;
#   --quick 1 GiB), cache=default (each server's default L2 cache, which
#   in QEMU 7.2 and iocore alike covers the whole image) and
#   cache=quarter (l2-cache-size a quarter of what covers the image,
#   l2-cache-entry-size 4096, on every server; iocore-nbd has no cache
#   option, so iocore's row comes from iocore-storage-daemon there);
# - randwrite-alloc: 4 KiB writes at random 64 KiB-aligned offsets of an
#   empty image much larger than what a run writes, so nearly every write
#   allocates a cluster and copies on write the other 60 KiB (the share
#   that allocated is printed, from the image's growth; no ramp here, so
#   that fio counts every write);
# - randwrite: 4 KiB random writes into the allocated image;
# - randread-chain: 4 KiB random reads of an empty overlay over an overlay
#   over the allocated image (each overlay has a quarter of the image
#   written), a two-deep backing chain;
# - seqread, seqwrite: 1 MiB at iodepth 16 over the allocated image;
# - randread-zstd: 4 KiB random reads of a zstd-compressed image;
# - seqread with client=qemu-img: qemu-img bench as the client (QEMU's NBD
#   client; sequential only, it has no random mode), 4 KiB at depth 64 over
#   the allocated image, a known count of reads, so the server's CPU per
#   I/O is its CPU over the client's life over the count; no p99.
#
# Each workload runs in rounds; in each round every server runs it once,
# started afresh (so the repeats of one server are interleaved with the
# others', and a burst of load from elsewhere spreads over all of them),
# and each round starts with the next server in turn (the first reader of
# an image just written pays for what the page cache does with it);
# the rows are the medians over the rounds.  The allocating writes get a
# fresh copy of the empty image each time; writes into allocated
# clusters change no mapping, so they share the allocated image (which
# iocore-nbd may have regrouped into huge pages for everyone after it).  Per row: the rate, fio's p99 completion
# latency, the server's CPU per I/O (utime+stime of the whole process,
# /proc/PID/stat, between the end of fio's ramp and the end of its run,
# sampled every 50 ms) and the busiest fio thread's share of a core;
# "client_bound" is true when that thread was at 95% or more, as in
# bench/nbd/run.sh (the report holds such IOPS rows to 1.0x).
#
# --quick: 2 rounds of 0.7 s runs after a 0.2 s ramp, 1 GiB images, no
# iocore-storage-daemon variant.  Full: 3 rounds of 3 s after 1 s.  One
# JSON row per line on stdout, progress on stderr.  Not part of make test.
# --only=CASE[,CASE] runs only those workloads, --rounds=N sets the rounds,
# --compare=[LABEL:]PATH adds another build's iocore-nbd as "iocore-LABEL".
IOC_BENCH_COMMON=$(cd "$(dirname "$0")/../common" && pwd) exec python3 - "$@" <<'EOF'
import json, os, shutil, signal, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.environ["IOC_BENCH_COMMON"])
from benchlib import CLK, log, row_writer, workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
# --only=CASE[,CASE...]: only these workloads (a before/after of one row).
only = [c for a in sys.argv[1:] if a.startswith("--only=") for c in a[7:].split(",")]
rounds_arg = [int(a[9:]) for a in sys.argv[1:] if a.startswith("--rounds=")]
# --compare=[LABEL:]PATH (repeatable): another build's iocore-nbd as the
# variant "iocore-LABEL" (default "compare"): a before/after of a change,
# interleaved with the rest.
compare = []
for a in sys.argv[1:]:
    if a.startswith("--compare="):
        label, _, path = a[10:].rpartition(":")
        compare.append(("iocore-" + (label or "compare"), path))
if not args:
    sys.exit("usage: run.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
ours_nbd = os.path.join(build, "tools/nbd/iocore-nbd")
ours_daemon = os.path.join(build, "tools/daemon/iocore-storage-daemon")
rounds, runtime, ramp = (2, 0.7, 0.2) if quick else (3, 3.0, 1.0)
if rounds_arg:
    rounds = rounds_arg[0]
size_mb = 1024 if quick else 4096
alloc_gb = 64          # virtual size of the image the allocating writes go to
CS = 65536
BOUND_PCT = 95.0


row = row_writer("qcow2")
work = workdir("ioc-qcow2-bench.")
sock = os.path.join(work, "sock")
pidf = os.path.join(work, "pid")
P = lambda name: os.path.join(work, name)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.decode(errors="replace")[-300:]))


def make_images():
    """main.qcow2 (fully allocated, incompressible), mid/top (the chain),
    zstd.qcow2 (compressible), empty.qcow2 (for allocating writes)."""
    raw = P("data.raw")
    chunk = os.urandom(1 << 20)
    with open(raw, "wb") as f:
        for i in range(size_mb):
            # Every MiB different, none of it zero (convert skips zeroes).
            f.write(i.to_bytes(8, "little") + chunk[8:])
    run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, P("main.qcow2")])
    # Compressible: each 64 KiB cluster a quarter random, the rest text.
    zmb = size_mb // 4
    text = (b"the quick brown fox jumps over the lazy dog %d\n" * 1200)[:CS * 3 // 4]
    with open(raw, "wb") as f:
        for i in range(zmb * 16):
            f.write(os.urandom(CS // 4) + text)
    run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", "-o",
         "compression_type=zstd", raw, P("zstd.qcow2")])
    os.unlink(raw)
    q = size_mb // 4
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", P("main.qcow2"),
         P("mid.qcow2")])
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x11 %dM %dM" % (0, q), P("mid.qcow2")])
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", P("mid.qcow2"),
         P("top.qcow2")])
    run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x22 %dM %dM" % (q, q), P("top.qcow2")])
    run(["qemu-img", "create", "-q", "-f", "qcow2", P("empty.qcow2"), "%dG" % alloc_gb])


def l2_quarter(mb):
    """A quarter of the L2 tables' bytes for an image of mb MiB."""
    return mb * 1024 * 1024 // CS * 8 // 4


# Servers: (impl, peer, how to start on IMAGE with cache option or None).
def srv_iocore_nbd(img, l2):
    if l2 is not None:
        return srv_iocore_daemon(img, l2)
    return [ours_nbd, "-f", "qcow2", "--fork", "--pid-file", pidf, "-U", sock, img], ""


def daemon_args(img, l2, file_opts):
    qopts = "driver=qcow2,node-name=q,file=f"
    if l2 is not None:
        qopts += ",l2-cache-size=%d,l2-cache-entry-size=4096" % l2
    return ["--blockdev", "driver=file,node-name=f,filename=%s%s" % (img, file_opts),
            "--blockdev", qopts,
            "--nbd-server", "addr.type=unix,addr.path=" + sock,
            "--export", "type=nbd,id=e,node-name=q,writable=on",
            "--daemonize", "--pidfile", pidf]


def srv_iocore_daemon(img, l2):
    return [ours_daemon] + daemon_args(img, l2, ""), "q"


def srv_qemu_nbd(img, l2):
    cmd = ["qemu-nbd", "-t", "--cache=writeback", "--aio=io_uring", "-e", "8", "--fork",
           "--pid-file", pidf, "-k", sock]
    if l2 is None:
        return cmd + ["-f", "qcow2", img], ""
    return cmd + ["--image-opts", "driver=qcow2,file.driver=file,file.filename=%s,"
                  "l2-cache-size=%d,l2-cache-entry-size=4096" % (img, l2)], ""


def srv_qsd(img, l2):
    return ["qemu-storage-daemon"] + daemon_args(img, l2, ",aio=io_uring"), "q"


def srv_compare(path):
    def mk(img, l2):
        if l2 is not None:
            raise RuntimeError("--compare runs only rows without a cache option")
        return [path, "-f", "qcow2", "--fork", "--pid-file", pidf, "-U", sock, img], ""
    return mk


servers = [("iocore", False, srv_iocore_nbd)]
servers += [(label, False, srv_compare(path)) for label, path in compare]
if not quick:
    servers.append(("iocore-storage-daemon", False, srv_iocore_daemon))
servers += [("qemu-nbd-io_uring", True, srv_qemu_nbd),
            ("qemu-storage-daemon", True, srv_qsd)]

# (case, params, image, fresh copy per run, l2 option, fio options, metric)
q4 = ["--bs=4k", "--iodepth=64"]
m1 = ["--bs=1m", "--iodepth=16"]
workloads = [
    ("randread", "bs=4k,iodepth=64,cache=default", "main.qcow2", False, None,
     q4 + ["--rw=randread"], "IOPS"),
    ("randread", "bs=4k,iodepth=64,cache=quarter", "main.qcow2", False, l2_quarter(size_mb),
     q4 + ["--rw=randread"], "IOPS"),
    ("randwrite-alloc", "bs=4k,iodepth=64,cluster=64k", "empty.qcow2", True, None,
     q4 + ["--rw=randwrite", "--blockalign=64k", "--norandommap"], "IOPS"),
    ("randwrite", "bs=4k,iodepth=64", "main.qcow2", False, None,
     q4 + ["--rw=randwrite"], "IOPS"),
    ("randread-chain", "bs=4k,iodepth=64,depth=2", "top.qcow2", False, None,
     q4 + ["--rw=randread"], "IOPS"),
    ("seqread", "bs=1m,iodepth=16", "main.qcow2", False, None, m1 + ["--rw=read"], "MB/s"),
    ("seqwrite", "bs=1m,iodepth=16", "main.qcow2", False, None, m1 + ["--rw=write"], "MB/s"),
    ("randread-zstd", "bs=4k,iodepth=64", "zstd.qcow2", False, None,
     q4 + ["--rw=randread"], "IOPS"),
    # QEMU's own NBD client, which costs the client less per I/O than fio.
    ("seqread", "client=qemu-img,bs=4k,iodepth=64", "main.qcow2", False, None,
     "qemu-img", "IOPS"),
]
qi_count = 40000 if quick else 200000


def proc_cpu_s(path):
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except (OSError, ValueError, IndexError):
        return None


# The server running now: stopped on the way out, also when bench.sh's
# timeout sends SIGTERM (the daemons detach from our process group, so
# the signal does not reach them).
running = []
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))


def start(cmd):
    for p in (sock, pidf):
        if os.path.exists(p):
            os.unlink(p)
    errf = P("start.err")
    with open(errf, "wb") as ef:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=ef, timeout=30)
    if r.returncode != 0:
        with open(errf, "rb") as ef:
            raise RuntimeError("start failed: " + ef.read().decode(errors="replace")[:200])
    for _ in range(1000):
        if os.path.exists(pidf) and os.path.exists(sock):
            try:
                with open(pidf) as f:
                    pid = int(f.read().strip())
                running.append(pid)
                return pid
            except ValueError:
                pass
        time.sleep(0.01)
    raise RuntimeError("no pid file")


def settle(pid):
    """Until the server's CPU time stays flat for 200 ms (10 s at most):
    iocore-nbd regroups a tmpfs image into huge pages after it starts,
    which must not be charged to the first workload."""
    t0 = time.monotonic()
    last = proc_cpu_s("/proc/%d/stat" % pid)
    flat = 0
    while last is not None and flat < 2 and time.monotonic() - t0 < 10:
        time.sleep(0.1)
        now = proc_cpu_s("/proc/%d/stat" % pid)
        flat = flat + 1 if now == last else 0
        last = now


def stop(pid):
    if pid in running:
        running.remove(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(1000):
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Sampler(threading.Thread):
    """Every 50 ms: the time, the server's CPU s and each fio thread's."""

    def __init__(self, server, client):
        super().__init__(daemon=True)
        self.server, self.client, self.samples = server, client, []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            t = time.monotonic()
            srv = proc_cpu_s("/proc/%d/stat" % self.server)
            th = {}
            try:
                tids = os.listdir("/proc/%d/task" % self.client)
            except OSError:
                tids = []
            for tid in tids:
                v = proc_cpu_s("/proc/%d/task/%s/stat" % (self.client, tid))
                if v is not None:
                    th[tid] = v
            if th:
                self.samples.append((t, srv, th))
            self.done.wait(0.05)


def fio(uri, opts, pid, ramp):
    cmd = ["fio", "--name=b", "--ioengine=nbd", "--thread", "--uri=" + uri,
           "--numjobs=1", "--time_based=1", "--runtime=%dms" % (runtime * 1000),
           "--ramp_time=%dms" % (ramp * 1000), "--output-format=json"] + opts
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    smp = Sampler(pid, p.pid)
    smp.start()
    try:
        out, err = p.communicate(timeout=runtime * 3 + 60)
    finally:
        smp.done.set()
        smp.join()
        if p.poll() is None:
            p.kill()
            p.wait()
    out = out.decode(errors="replace")
    if p.returncode != 0 or "{" not in out:
        raise RuntimeError("fio failed: " + err.decode(errors="replace")[-300:])
    j = json.loads(out[out.index("{"):])["jobs"][0]
    d = j["write"] if j["write"]["io_bytes"] > j["read"]["io_bytes"] else j["read"]
    res = {"iops": d["iops"], "mbs": d["bw_bytes"] / 1e6, "ios": d["total_ios"],
           "p99": d["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0,
           "cmd": " ".join(cmd), "server": None, "pct": None}
    # The window: from the end of the ramp (the job thread appears with
    # the second thread of fio's) to 100 ms before the run ends.
    started = next((s[0] for s in smp.samples if len(s[2]) >= 2), None)
    if started is not None:
        win = [s for s in smp.samples
               if started + ramp <= s[0] <= started + ramp + runtime - 0.1]
        if len(win) >= 2:
            (ta, sa, ca), (tb, sb, cb) = win[0], win[-1]
            dt = tb - ta
            per = [cb[t] - ca.get(t, 0.0) for t in cb] or [0.0]
            ios = d["iops"] * dt
            if sa is not None and sb is not None and ios:
                res["server"] = (sb - sa) * 1e6 / ios
            res["pct"] = 100.0 * max(per) / dt
    return res


def qemu_img(uri, count, pid):
    """qemu-img bench (QEMU's NBD client, sequential 4 KiB reads at depth
    64): a known count, so the server's CPU per I/O is exact (its CPU from
    just before the client starts to just after it exits, over the count)."""
    cmd = ["qemu-img", "bench", "-f", "raw", "-t", "none", "-c", str(count), "-d", "64",
           "-s", "4k", uri]
    srv0 = proc_cpu_s("/proc/%d/stat" % pid)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    srv1 = proc_cpu_s("/proc/%d/stat" % pid)
    out = r.stdout.decode(errors="replace")
    secs = next((float(ln.split()[3]) for ln in out.splitlines()
                 if ln.startswith("Run completed in")), None)
    if r.returncode != 0 or not secs:
        raise RuntimeError("qemu-img bench failed: " + out[-300:])
    server = None if srv0 is None or srv1 is None else (srv1 - srv0) * 1e6 / count
    return {"iops": count / secs, "mbs": count * 4096 / secs / 1e6, "ios": count,
            "p99": None, "cmd": " ".join(cmd), "server": server, "pct": None}


def median(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


t_begin = time.monotonic()
try:
    missing = [t for t in ("fio", "qemu-img", "qemu-io") if not shutil.which(t)]
    if missing:
        for wl in workloads:
            for impl, peer, _ in servers:
                row(wl[0], wl[1], impl, peer, wl[6], None, "higher", "fio",
                    "not installed: " + " ".join(missing))
        sys.exit(0)
    make_images()
    log("qcow2: images ready in %.0f s" % (time.monotonic() - t_begin))
    for case, params, image, fresh, l2, opts, metric in workloads:
        if only and case not in only:
            continue
        results = {impl: [] for impl, _, _ in servers}
        errors, cmds = {}, {}
        for rnd in range(rounds):
            # Each round starts with another server, so that what the
            # first reader of a fresh image pays is not always iocore's.
            k = rnd % len(servers)
            for impl, peer, mk in servers[k:] + servers[:k]:
                img = P(image)
                if fresh:
                    img = P("run.qcow2")
                    shutil.copyfile(P(image), img)
                try:
                    scmd, export = mk(img, l2)
                except RuntimeError as e:
                    errors[impl] = str(e)
                    continue
                cmds[impl] = " ".join(scmd)
                if not os.access(scmd[0], os.X_OK) and not shutil.which(scmd[0]):
                    errors[impl] = "%s not built or installed" % scmd[0]
                    continue
                pid = None
                try:
                    size0 = os.path.getsize(img)
                    pid = start(scmd)
                    settle(pid)
                    # No ramp for the allocating writes, so that fio's
                    # count of writes is every write the image received.
                    uri = "nbd+unix:///%s?socket=%s" % (export, sock)
                    if opts == "qemu-img":
                        r = qemu_img(uri, qi_count, pid)
                    else:
                        r = fio(uri, opts, pid, 0 if case == "randwrite-alloc" else ramp)
                    stop(pid)
                    pid = None
                    if case == "randwrite-alloc":
                        # Clusters the run added (the rest of the growth,
                        # L2 tables and refcount blocks, is under 1%).
                        grown = (os.path.getsize(img) - size0) / CS
                        r["alloc_pct"] = 100.0 * grown / max(1, r["ios"])
                    results[impl].append(r)
                    cmds[impl] += " ; " + r["cmd"]
                    log("%-22s %-16s %-32s round %d: %9.0f %s p99 %s us  "
                        "server CPU %s us/IO  client thread %s%%%s" %
                        (impl, case, params, rnd + 1,
                         r["iops"] if metric == "IOPS" else r["mbs"], metric,
                         None if r["p99"] is None else round(r["p99"]),
                         None if r["server"] is None else round(r["server"], 2),
                         None if r["pct"] is None else round(r["pct"]),
                         "" if "alloc_pct" not in r else
                         "  allocating %.0f%%" % r["alloc_pct"]))
                except Exception as e:
                    errors[impl] = str(e)[:200]
                finally:
                    if pid is not None:
                        stop(pid)
                    if fresh and os.path.exists(img):
                        os.unlink(img)
        for impl, peer, _ in servers:
            rs = results[impl]
            cmd = cmds.get(impl, "")
            if not rs:
                err = errors.get(impl, "did not run")
                for m, b in ((metric, "higher"), ("p99 us", "lower"),
                             ("server CPU us/IO", "lower")):
                    row(case, params, impl, peer, m, None, b, cmd, err)
                continue
            bound = sum(1 for r in rs if (r["pct"] or 0) >= BOUND_PCT) * 2 > len(rs)
            pct = median([r["pct"] for r in rs])
            kw = dict(client_bound=bound, client_thread_pct=None if pct is None else round(pct, 1),
                      rounds=len(rs))
            rate = median([r["iops"] if metric == "IOPS" else r["mbs"] for r in rs])
            row(case, params, impl, peer, metric, round(rate, 1), "higher", cmd, **kw)
            if rs[0]["p99"] is not None:
                row(case, params, impl, peer, "p99 us",
                    round(median([r["p99"] for r in rs]), 1), "lower", cmd, **kw)
            srv = median([r["server"] for r in rs])
            row(case, params, impl, peer, "server CPU us/IO",
                None if srv is None else round(srv, 2), "lower", cmd,
                None if srv is not None else "no CPU samples in the measured interval", **kw)
            if pct is not None:
                row(case, params, impl, peer, "client busiest thread %",
                    kw["client_thread_pct"], "lower", cmd, **kw)
            if case == "randwrite-alloc":
                row(case, params, impl, peer, "allocating writes %",
                    round(median([r["alloc_pct"] for r in rs]), 1), "higher", cmd, **kw)
    log("qcow2: %.0f s" % (time.monotonic() - t_begin))
finally:
    for pid in list(running):
        stop(pid)
    shutil.rmtree(work, ignore_errors=True)
EOF
