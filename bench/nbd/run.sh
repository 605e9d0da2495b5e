#!/bin/sh
# bench/nbd/run.sh BUILD_DIR [--quick]
#
# iocore-nbd against its peers (qemu-nbd --aio=io_uring, qemu-nbd
# --aio=threads, nbdkit file), same raw image in /dev/shm, same clients:
#
# - fio's nbd engine (--thread: one thread per job, one connection each),
#   1 and 4 connections: 4 KiB randread and randrw 80/20 at iodepth 64
#   (IOPS), 64 KiB sequential read and write at iodepth 32 and 1 MiB at
#   iodepth 16 (MB/s; each of 4 jobs streams its own quarter of the image);
# - qemu-img bench (QEMU's own NBD client, one connection; it only steps
#   through the image sequentially, there is no random mode): 4 KiB reads
#   and writes at depth 64 (IOPS), 1 MiB at depth 16 (MB/s);
# - nbdcopy reading the whole image, in the clear and over TLS (PSK): MB/s.
#
# For every fio and qemu-img row, besides the rate: p99 completion latency
# (fio only), the server's CPU per I/O (utime+stime of the whole process,
# every thread, polling included), the client's CPU per I/O, and the
# utilisation of the busiest client thread in % of one core.  A row whose
# busiest client thread is at 95% or more carries "client_bound": true: the
# client cannot go faster whatever the server does, and the report holds
# such IOPS rows to 1.0x the best peer instead of 1.5x.
#
# CPU is sampled from /proc every 50 ms while the client runs, and only the
# measured interval counts: fio's interval starts when its job threads
# appear plus the ramp time and lasts the run time (fio's IOPS cover the
# same interval); I/Os in the interval = the client's rate x its length.
# qemu-img bench runs a known count of I/Os with no ramp, so the server's
# CPU per I/O is exact: its CPU time from just before the client starts to
# just after it exits, over the count (connecting and hanging up are a few
# hundred us of it).  A window of samples was used before, and in a 0.35 s
# run its 50 ms edges made the repeats of one row spread by up to 150%.
# The client's own figures for qemu-img come from the window starting 100
# ms after launch (open and connect) and ending at the last sample before
# it exits.  Rejected: rusage of the whole client (the fio parent parses
# and forks for ~0.15 s of CPU before any I/O, and the ramp would count),
# and per-thread times read only at exit (the threads are gone by then).
#
# nbdkit's null plugin runs the write rows as a reference, not a peer: it
# receives every payload into a buffer and throws it away, so its CPU per
# write is what the kernel charges any server for receiving the bytes
# (copying them out of the socket, freeing the socket's buffers) plus
# nbdkit's own overhead, less the cache misses of storing them: its buffer
# stays in the CPU's caches, an image's pages do not.  The report shows it
# against the best peer as it shows iocore's ablations, and holds it to no
# target.  On this machine it was at 0.37-0.88x of nbdkit's file plugin
# (bench/nbd/NOTES.md), about the level the server-CPU target asks of
# iocore-nbd.
#
# The image is written afresh before each server starts, so no server
# inherits another's page-cache layout of it (see write_image()).  A
# server that works on its own after starting (iocore-nbd regroups a tmpfs
# image into huge pages) is given until its CPU time stays flat for 200
# ms (10 s at most) before the first row, so that the first workload is
# not charged for it; that CPU time is printed as the server's startup.
#
# --quick: 1 s runs after a 0.5 s ramp, a 256 MiB image, one nbdcopy
# round, and no qemu-nbd --aio=threads (the module stays under about two
# minutes on two CPUs).  One JSON row per line on stdout, progress on stderr.
IOC_BENCH_COMMON=$(cd "$(dirname "$0")/../common" && pwd) exec python3 - "$@" <<'EOF'
import json, os, shutil, signal, subprocess, sys, tempfile, threading, time
sys.path.insert(0, os.environ["IOC_BENCH_COMMON"])
from benchlib import CLK, log, row_writer, workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: run.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
ours = os.path.join(build, "tools/nbd/iocore-nbd")
runtime, ramp = (1.0, 0.5) if quick else (3.0, 1.0)
size_mb = 256 if quick else 1024
# qemu-img bench runs a request count, not a time: for iocore-nbd (70k
# 4 KiB IOPS, 3 GB/s) about 0.7 s (quick) or 3 s, longer for the slower
# peers.  A full run (five servers, nbdkit's null plugin on the write rows
# only) took 10 minutes with 5 s fio runs on the loaded 2-CPU machine; 3 s
# keeps it near 7.
qi_count = {"4k": 50000 if quick else 200000, "1m": 2000 if quick else 9000}
BOUND_PCT = 95.0


row = row_writer("nbd")
work = workdir("ioc-nbd-bench.")
img = os.path.join(work, "disk.img")
sock = os.path.join(work, "sock")
pidf = os.path.join(work, "pid")


# Servers started and not yet stopped: cleanup() stops them whatever
# ended the run (an exception, a timeout, ^C), so none outlives it.
live = set()


def cleanup():
    for pid in list(live):
        stop(pid)
    shutil.rmtree(work, ignore_errors=True)


img_ours = os.path.join(work, "disk-ours.img")


def write_image(path):
    """A fully allocated image: holes would make reads free for everyone.
    Written again before each server: a server may change how the kernel
    keeps the file (iocore-nbd regroups a tmpfs image into huge pages, which
    makes every later reader of the file cheaper), and the next server must
    start from the same fresh file as the first."""
    with open(path, "wb") as f:
        chunk = b"\x5a" * (1 << 20)
        for _ in range(size_mb):
            f.write(chunk)


write_image(img)

servers = [
    ("iocore", False, [ours, "--fork", "--pid-file", pidf, "-U", sock, img]),
] + ([] if quick else [
    # Ablation: the block layer on its thread pool instead of io_uring.
    ("iocore-aio-threads", False, [ours, "--aio", "threads", "--fork",
                                   "--pid-file", pidf, "-U", sock, img]),
]) + [
    ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                 "--aio=io_uring", "-e", "8", "--fork",
                                 "--pid-file", pidf, "-k", sock, img]),
] + ([] if quick else [
    ("qemu-nbd-threads", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                "--aio=threads", "-e", "8", "--fork",
                                "--pid-file", pidf, "-k", sock, img]),
]) + [
    ("nbdkit-file", True, ["nbdkit", "--pidfile", pidf, "-U", sock, "file", img]),
    # Not a peer: a reference for the write rows (see the header).
    ("nbdkit-null", False, ["nbdkit", "--pidfile", pidf, "-U", sock, "null",
                            "size=%dM" % size_mb]),
]
# Servers that run only the write rows.
writes_only = {"nbdkit-null"}

# (case, fio options, bs, iodepth, rate metric)
workloads = [
    ("randread", ["--rw=randread"], "4k", 64, "IOPS"),
    ("randrw", ["--rw=randrw", "--rwmixread=80"], "4k", 64, "IOPS"),
    ("seqread", ["--rw=read"], "64k", 32, "MB/s"),
    ("seqwrite", ["--rw=write"], "64k", 32, "MB/s"),
    ("seqread", ["--rw=read"], "1m", 16, "MB/s"),
    ("seqwrite", ["--rw=write"], "1m", 16, "MB/s"),
]
# (case, bs, depth, rate metric, qemu-img bench options)
qi_workloads = [
    ("seqread", "4k", 64, "IOPS", []),
    ("seqwrite", "4k", 64, "IOPS", ["-w"]),
    ("seqread", "1m", 16, "MB/s", []),
    ("seqwrite", "1m", 16, "MB/s", ["-w"]),
]


def start(cmd):
    for p in (sock, pidf):
        if os.path.exists(p):
            os.unlink(p)
    if not shutil.which(cmd[0]) and not os.access(cmd[0], os.X_OK):
        return None, "%s not installed" % cmd[0]
    # All three daemonise once they listen and write the pid file.
    # stderr to a file: a daemon may keep it open, so a pipe never ends.
    errf = os.path.join(work, "start.err")
    with open(errf, "wb") as ef:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=ef, timeout=30)
    if r.returncode != 0:
        with open(errf, "rb") as ef:
            return None, "start failed: " + ef.read().decode(errors="replace").strip()[:200]
    for _ in range(500):
        if os.path.exists(pidf) and os.path.exists(sock):
            try:
                with open(pidf) as f:
                    pid = int(f.read().strip())
                live.add(pid)
                return pid, None
            except ValueError:
                pass
        time.sleep(0.01)
    return None, "no pid file"


def settle(pid, impl):
    """Until pid's CPU time stops growing (see the header); prints it."""
    t0 = time.monotonic()
    first = last = proc_cpu_s("/proc/%d/stat" % pid)
    flat = 0
    while first is not None and flat < 2 and time.monotonic() - t0 < 10:
        time.sleep(0.1)
        now = proc_cpu_s("/proc/%d/stat" % pid)
        if now is None:
            return
        flat = flat + 1 if now == last else 0
        last = now
    if first is not None:
        print("%-18s startup: %.2f s of CPU in %.1f s before the first row"
              % (impl, last, time.monotonic() - t0), file=sys.stderr, flush=True)


def stop(pid):
    live.discard(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(500):
        try:
            os.kill(pid, 0)
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

def proc_cpu_s(path):
    """CPU seconds (user + system) from a /proc stat file, None if gone."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except (OSError, ValueError, IndexError):
        return None


class Sampler(threading.Thread):
    """Every 50 ms: the time, the server's CPU seconds (the process: all
    threads) and each client thread's.  Only reads /proc; the samples are
    read after join()."""

    def __init__(self, server_pid, client_pid):
        super().__init__(daemon=True)
        self.server, self.client = server_pid, client_pid
        self.samples = []   # (t, server s, {tid: client thread s})
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            t = time.monotonic()
            srv = proc_cpu_s("/proc/%d/stat" % self.server)
            threads = {}
            try:
                tids = os.listdir("/proc/%d/task" % self.client)
            except OSError:
                tids = []
            for tid in tids:
                v = proc_cpu_s("/proc/%d/task/%s/stat" % (self.client, tid))
                if v is not None:
                    threads[tid] = v
            if threads:
                self.samples.append((t, srv, threads))
            self.done.wait(0.05)

    def stop(self):
        self.done.set()
        self.join()


def cpu_window(samples, t0, t1):
    """Server CPU s, client CPU s and the busiest client thread's share
    (% of one core) between the first sample at or after t0 and the last
    at or before t1; the interval's length.  None if it holds < 2 samples."""
    win = [s for s in samples if t0 <= s[0] <= t1]
    if len(win) < 2:
        return None
    (ta, sa, ca), (tb, sb, cb) = win[0], win[-1]
    dt = tb - ta
    # Every thread alive at the last sample; one that started after the
    # first counts from zero.  A thread that ended inside the window would
    # be lost: the callers end their windows while the client's threads live.
    per = [cb[tid] - ca.get(tid, 0.0) for tid in cb] or [0.0]
    server = None if sa is None or sb is None else sb - sa
    return server, sum(per), 100.0 * max(per) / dt, dt


def measure(rate_ios, win):
    """Per-I/O CPU in us from a cpu_window() result and the I/Os per second."""
    if win is None or not rate_ios:
        return dict(server=None, client=None, pct=None, bound=None)
    server, client, pct, dt = win
    ios = rate_ios * dt
    return dict(server=None if server is None else round(server * 1e6 / ios, 2),
                client=round(client * 1e6 / ios, 2), pct=round(pct, 1),
                bound=pct >= BOUND_PCT)


def fio(extra, bs, depth, jobs, server_pid):
    """fio --thread: the main thread parses and starts a helper and one
    thread per job; the ramp starts when the job threads appear.
    -> IOPS, MB/s, p99 us, command, measure()."""
    cmd = ["fio", "--name=b", "--ioengine=nbd", "--thread",
           "--uri=nbd+unix:///?socket=" + sock, "--bs=" + bs,
           "--iodepth=%d" % depth, "--numjobs=%d" % jobs, "--group_reporting=1",
           "--unified_rw_reporting=1", "--time_based=1",
           # fio reads "0.5" as 0 s: milliseconds.
           "--runtime=%dms" % (runtime * 1000), "--ramp_time=%dms" % (ramp * 1000),
           "--output-format=json"] + extra
    if jobs > 1 and ("--rw=read" in extra or "--rw=write" in extra):
        # Each job streams its own part of the image.
        part = size_mb // jobs
        cmd += ["--size=%dm" % part, "--offset_increment=%dm" % part]
    errf = os.path.join(work, "fio.err")
    with open(errf, "wb") as ef:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=ef)
        smp = Sampler(server_pid, p.pid)
        smp.start()
        try:
            out = p.communicate(timeout=runtime * 3 + 60)[0].decode(errors="replace")
        finally:
            smp.stop()
            if p.poll() is None:
                p.kill()
                p.wait()
    if p.returncode != 0 or "{" not in out:
        with open(errf, "rb") as ef:
            raise RuntimeError("fio failed: " + ef.read().decode(errors="replace")[-300:])
    j = json.loads(out[out.index("{"):])
    m = j["jobs"][0]["mixed"]
    iops = m["iops"]
    mbs = m["bw_bytes"] / 1e6
    p99 = m["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0
    # The job threads started between the sample before this one and this
    # one (50 ms apart): the window begins no earlier than the end of the
    # ramp and ends 100 ms before the jobs do, while every thread lives.
    started = next((s[0] for s in smp.samples if len(s[2]) >= jobs + 1), None)
    win = None
    if started is not None:
        win = cpu_window(smp.samples, started + ramp, started + ramp + runtime - 0.1)
    return iops, mbs, p99, " ".join(cmd), measure(iops, win)


def qemu_img(extra, bs, depth, server_pid):
    """qemu-img bench: -> IOPS, MB/s, command, measure()."""
    count = qi_count[bs]
    cmd = ["qemu-img", "bench", "-f", "raw", "-t", "none", "-c", str(count),
           "-d", str(depth), "-s", bs] + extra + ["nbd+unix:///?socket=" + sock]
    srv0 = proc_cpu_s("/proc/%d/stat" % server_pid)
    t_launch = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    smp = Sampler(server_pid, p.pid)
    smp.start()
    try:
        out = p.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        smp.stop()
        if p.poll() is None:
            p.kill()
            p.wait()
    srv1 = proc_cpu_s("/proc/%d/stat" % server_pid)
    secs = None
    for ln in out.splitlines():
        if ln.startswith("Run completed in"):
            secs = float(ln.split()[3])
    if p.returncode != 0 or not secs:
        raise RuntimeError("qemu-img bench failed: " + out[-300:])
    iops = count / secs
    mbs = iops * (4096 if bs == "4k" else 1 << 20) / 1e6
    win = cpu_window(smp.samples, t_launch + 0.1, t_launch + 1e9)
    m = measure(iops, win)
    # The server's CPU over the client's whole life, per I/O (see the header).
    if srv0 is not None and srv1 is not None:
        m["server"] = round((srv1 - srv0) * 1e6 / count, 2)
    return iops, mbs, " ".join(cmd), m


def emit(case, params, impl, peer, cmd, metric, rate, p99, m):
    """The rows of one measurement; every row says whether the client was
    the limit."""
    kw = dict(client_bound=m["bound"], client_thread_pct=m["pct"])
    row(case, params, impl, peer, metric, round(rate, 1), "higher", cmd, **kw)
    if p99 is not None:
        row(case, params, impl, peer, "p99 us", round(p99, 1), "lower", cmd, **kw)
    for metric_, key in (("server CPU us/IO", "server"), ("client CPU us/IO", "client"),
                         ("client busiest thread %", "pct")):
        row(case, params, impl, peer, metric_, m[key], "lower", cmd,
            None if m[key] is not None else "no CPU samples in the measured interval", **kw)


def failed(case, params, impl, peer, cmd, metrics, err):
    for metric, better in metrics:
        row(case, params, impl, peer, metric, None, better, cmd, err)


def bulk():
    """Whole-image sequential reads with nbdcopy (libnbd; 4 connections
    when the server allows multi-conn, 256 KiB requests), in the clear and
    over TLS with a pre-shared key: MB/s, rounds interleaved across the
    servers, median.  Big reads are where sparse-read probing (block
    status before each read) and TLS record handling cost."""
    # iocore-nbd on a file of its own: the servers run side by side here,
    # and its huge-page pass over the image must not speed up the others.
    write_image(img_ours)
    if not shutil.which("nbdcopy"):
        for case in ("bulk-read", "bulk-read-tls"):
            row(case, "nbdcopy", "iocore", False, "MB/s", None, "higher", "nbdcopy",
                "nbdcopy not installed")
        return
    psk = os.path.join(work, "keys.psk")
    have_psk = shutil.which("psktool") and subprocess.run(
        ["psktool", "-u", "alice", "-p", psk], capture_output=True).returncode == 0
    plain = [
        ("iocore", False, [ours, "--fork", "--pid-file", "{pid}", "-U", "{sock}", img_ours]),
        ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                     "--aio=io_uring", "-e", "8", "--fork",
                                     "--pid-file", "{pid}", "-k", "{sock}", img]),
        ("nbdkit-file", True, ["nbdkit", "--pidfile", "{pid}", "-U", "{sock}", "file", img]),
    ]
    tls = [
        ("iocore", False, [ours, "--fork", "--pid-file", "{pid}", "-U", "{sock}",
                           "--tls-psk", psk, img_ours]),
        ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                     "--aio=io_uring", "-e", "8", "--fork",
                                     "--object", "tls-creds-psk,id=t0,endpoint=server,dir=" + work,
                                     "--tls-creds", "t0",
                                     "--pid-file", "{pid}", "-k", "{sock}", img]),
        ("nbdkit-file", True, ["nbdkit", "--pidfile", "{pid}", "-U", "{sock}",
                               "--tls=require", "--tls-psk=" + psk, "file", img]),
    ]
    rounds = 1 if quick else 5
    for case, servers_, scheme in (("bulk-read", plain, "nbd+unix:///?socket={sock}"),
                                   ("bulk-read-tls", tls if have_psk else [],
                                    "nbds+unix://alice@/?socket={sock}&tls-psk-file=" + psk)):
        running = []
        for i, (impl, peer, tmpl) in enumerate(servers_):
            s = os.path.join(work, "%s-%d.sock" % (case, i))
            pf = os.path.join(work, "%s-%d.pid" % (case, i))
            cmd = [a.replace("{pid}", pf).replace("{sock}", s) for a in tmpl]
            if not shutil.which(cmd[0]) and not os.access(cmd[0], os.X_OK):
                row(case, "nbdcopy", impl, peer, "MB/s", None, "higher", " ".join(cmd),
                    "%s not installed" % cmd[0])
                continue
            errf = os.path.join(work, "b.err")
            with open(errf, "wb") as ef:
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=ef, timeout=30)
            pid = None
            for _ in range(500):
                if r.returncode == 0 and os.path.exists(pf) and os.path.exists(s):
                    try:
                        with open(pf) as f:
                            pid = int(f.read().strip())
                        live.add(pid)
                        break
                    except ValueError:
                        pass
                time.sleep(0.01)
            if pid is None:
                row(case, "nbdcopy", impl, peer, "MB/s", None, "higher", " ".join(cmd),
                    "did not start")
                continue
            running.append((impl, peer, cmd, pid, scheme.replace("{sock}", s), []))
        for _ in range(rounds):
            for impl, peer, cmd, pid, uri, times in running:
                t0 = time.monotonic()
                try:
                    r = subprocess.run(["nbdcopy", uri, "null:"], capture_output=True,
                                       timeout=300)
                except subprocess.TimeoutExpired:
                    log("%-18s %-14s nbdcopy timed out" % (impl, case))
                    continue
                if r.returncode == 0:
                    times.append(time.monotonic() - t0)
        for impl, peer, cmd, pid, uri, times in running:
            ccmd = " ".join(cmd) + " ; nbdcopy URI null:"
            if times:
                times.sort()
                mbs = size_mb * 1.048576 / times[len(times) // 2]
                log("%-18s %-14s %8.0f MB/s (median of %d)" % (impl, case, mbs, len(times)))
                row(case, "nbdcopy,image=%dMiB" % size_mb, impl, peer, "MB/s",
                    round(mbs, 1), "higher", ccmd)
            else:
                row(case, "nbdcopy,image=%dMiB" % size_mb, impl, peer, "MB/s", None,
                    "higher", ccmd, "nbdcopy failed")
            stop(pid)


t_begin = time.monotonic()
try:
    have_fio = shutil.which("fio") is not None
    have_qi = shutil.which("qemu-img") is not None
    for impl, peer, scmd in servers:
        write_image(img)
        pid, err = start(scmd)
        if pid is not None:
            settle(pid, impl)
        scmd_s = " ".join(scmd)
        for wl, extra, bs, depth, metric in workloads:
            if impl in writes_only and wl != "seqwrite":
                continue
            for jobs in (1, 4):
                params = "bs=%s,iodepth=%d,conns=%d" % (bs, depth, jobs)
                mets = [(metric, "higher"), ("p99 us", "lower"), ("server CPU us/IO", "lower")]
                if pid is None or not have_fio:
                    failed(wl, params, impl, peer, scmd_s, mets,
                           err if pid is None else "fio not installed")
                    continue
                try:
                    iops, mbs, p99, fcmd, m = fio(extra, bs, depth, jobs, pid)
                except Exception as e:
                    failed(wl, params, impl, peer, scmd_s, mets, str(e)[:200])
                    continue
                rate = iops if metric == "IOPS" else mbs
                log("%-18s fio %-8s %-24s %9.0f %-4s p99 %7.0f us  CPU us/IO server %s "
                    "client %s  client thread %s%%%s" %
                    (impl, wl, params, rate, metric, p99, m["server"], m["client"], m["pct"],
                     " CLIENT-BOUND" if m["bound"] else ""))
                emit(wl, params, impl, peer, scmd_s + " ; " + fcmd, metric, rate, p99, m)
        for wl, bs, depth, metric, extra in qi_workloads:
            if impl in writes_only and wl != "seqwrite":
                continue
            params = "client=qemu-img,bs=%s,iodepth=%d,conns=1" % (bs, depth)
            mets = [(metric, "higher"), ("server CPU us/IO", "lower")]
            if pid is None or not have_qi:
                failed(wl, params, impl, peer, scmd_s, mets,
                       err if pid is None else "qemu-img not installed")
                continue
            try:
                iops, mbs, qcmd, m = qemu_img(extra, bs, depth, pid)
            except Exception as e:
                failed(wl, params, impl, peer, scmd_s, mets, str(e)[:200])
                continue
            rate = iops if metric == "IOPS" else mbs
            log("%-18s qemu-img %-8s %-32s %9.0f %-4s CPU us/IO server %s client %s  "
                "client thread %s%%%s" %
                (impl, wl, params, rate, metric, m["server"], m["client"], m["pct"],
                 " CLIENT-BOUND" if m["bound"] else ""))
            emit(wl, params, impl, peer, scmd_s + " ; " + qcmd, metric, rate, None, m)
        if pid is not None:
            stop(pid)
    bulk()
    log("nbd: %.0f s" % (time.monotonic() - t_begin))
finally:
    cleanup()
EOF
