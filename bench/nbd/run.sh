#!/bin/sh
# bench/nbd/run.sh BUILD_DIR [--quick]
#
# fio's nbd engine against iocore-nbd and its peers, same image
# (raw, in /dev/shm), same jobs: 4 KiB randread and randrw 80/20 at
# iodepth 64, one connection and four (numjobs=4, one connection each).
# Peers: qemu-nbd --aio=io_uring, qemu-nbd --aio=threads, nbdkit file.
# Rows: IOPS (read+write, higher is better) and p99 completion latency
# (all completions, lower is better).  Then whole-image reads with nbdcopy,
# in the clear and over TLS (PSK): MB/s.  One JSON row per line on stdout.
exec python3 - "$@" <<'EOF'
import json, os, shutil, signal, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: run.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
ours = os.path.join(build, "tools/nbd/iocore-nbd")
runtime, ramp = (2, 0.5) if quick else (8, 1)
size_mb = 256 if quick else 1024


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def row(case, params, impl, peer, metric, value, better, cmd, error=None):
    r = {"suite": "nbd", "case": case, "params": params, "impl": impl,
         "peer": peer, "metric": metric, "value": value, "better": better,
         "cmd": cmd}
    if error:
        r["error"] = error
    print(json.dumps(r), flush=True)


base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
work = tempfile.mkdtemp(prefix="ioc-nbd-bench.", dir=base)
img = os.path.join(work, "disk.img")
sock = os.path.join(work, "sock")
pidf = os.path.join(work, "pid")


def cleanup():
    shutil.rmtree(work, ignore_errors=True)


# A fully allocated image: holes would make reads free for everyone.
with open(img, "wb") as f:
    chunk = b"\x5a" * (1 << 20)
    for _ in range(size_mb):
        f.write(chunk)

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
    ("qemu-nbd-threads", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                "--aio=threads", "-e", "8", "--fork",
                                "--pid-file", pidf, "-k", sock, img]),
    ("nbdkit-file", True, ["nbdkit", "--pidfile", pidf, "-U", sock, "file", img]),
]

workloads = [
    ("randread", ["--rw=randread"]),
    ("randrw", ["--rw=randrw", "--rwmixread=80"]),
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
                    return int(f.read().strip()), None
            except ValueError:
                pass
        time.sleep(0.01)
    return None, "no pid file"


def stop(pid):
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


def proc_cpu_s(pid):
    """CPU seconds (user + system, all threads) of a live process."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def fio(extra, jobs, server_pid):
    """Run fio; returns IOPS, p99 us, the command, and the CPU time per
    I/O of the server and of the client (fio and its job processes), in us.
    Both CPU figures cover the whole run, ramp included, and are divided by
    the I/Os of the whole run (IOPS x (runtime + ramp)): an estimate, the
    same for every server.  On 2 CPUs they tell who the bottleneck is: a
    client near one CPU per connection cannot go faster whatever the
    server does."""
    cmd = ["fio", "--name=b", "--ioengine=nbd",
           "--uri=nbd+unix:///?socket=" + sock, "--bs=4k", "--iodepth=64",
           "--numjobs=%d" % jobs, "--group_reporting=1",
           "--unified_rw_reporting=1", "--time_based=1",
           "--runtime=%g" % runtime, "--ramp_time=%g" % ramp,
           "--output-format=json"] + extra
    import resource
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = proc_cpu_s(server_pid)
    r = subprocess.run(cmd, capture_output=True, timeout=runtime * 3 + 60)
    s1 = proc_cpu_s(server_pid)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or "{" not in out:
        raise RuntimeError("fio failed: " + r.stderr.decode(errors="replace")[-300:])
    j = json.loads(out[out.index("{"):])
    m = j["jobs"][0]["mixed"]
    iops = m["iops"]
    p99 = m["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0
    ios = iops * (runtime + ramp)
    client = ((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime))
    server = None if s0 is None or s1 is None else s1 - s0
    per_io = lambda t: None if t is None or ios <= 0 else round(t * 1e6 / ios, 2)
    return iops, p99, " ".join(cmd), per_io(server), per_io(client)


def bulk():
    """Whole-image sequential reads with nbdcopy (libnbd; 4 connections
    when the server allows multi-conn, 256 KiB requests), in the clear and
    over TLS with a pre-shared key: MB/s, rounds interleaved across the
    servers, median.  Big reads are where sparse-read probing (block
    status before each read) and TLS record handling cost."""
    if not shutil.which("nbdcopy"):
        for case in ("bulk-read", "bulk-read-tls"):
            row(case, "nbdcopy", "iocore", False, "MB/s", None, "higher", "nbdcopy",
                "nbdcopy not installed")
        return
    psk = os.path.join(work, "keys.psk")
    have_psk = shutil.which("psktool") and subprocess.run(
        ["psktool", "-u", "alice", "-p", psk], capture_output=True).returncode == 0
    plain = [
        ("iocore", False, [ours, "--fork", "--pid-file", "{pid}", "-U", "{sock}", img]),
        ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                     "--aio=io_uring", "-e", "8", "--fork",
                                     "--pid-file", "{pid}", "-k", "{sock}", img]),
        ("nbdkit-file", True, ["nbdkit", "--pidfile", "{pid}", "-U", "{sock}", "file", img]),
    ]
    tls = [
        ("iocore", False, [ours, "--fork", "--pid-file", "{pid}", "-U", "{sock}",
                           "--tls-psk", psk, img]),
        ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                     "--aio=io_uring", "-e", "8", "--fork",
                                     "--object", "tls-creds-psk,id=t0,endpoint=server,dir=" + work,
                                     "--tls-creds", "t0",
                                     "--pid-file", "{pid}", "-k", "{sock}", img]),
        ("nbdkit-file", True, ["nbdkit", "--pidfile", "{pid}", "-U", "{sock}",
                               "--tls=require", "--tls-psk=" + psk, "file", img]),
    ]
    rounds = 3 if quick else 5
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
                r = subprocess.run(["nbdcopy", uri, "null:"], capture_output=True, timeout=300)
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


if not shutil.which("fio"):
    for wl, _ in workloads:
        for jobs in (1, 4):
            for impl, peer, cmd in servers:
                for metric, better in (("IOPS", "higher"), ("p99 us", "lower")):
                    row(wl, "bs=4k,iodepth=64,conns=%d" % jobs, impl, peer, metric,
                        None, better, "fio", "fio not installed")
    cleanup()
    sys.exit(0)

try:
    for impl, peer, scmd in servers:
        pid, err = start(scmd)
        for wl, extra in workloads:
            for jobs in (1, 4):
                params = "bs=4k,iodepth=64,conns=%d" % jobs
                if pid is None:
                    for metric, better in (("IOPS", "higher"), ("p99 us", "lower")):
                        row(wl, params, impl, peer, metric, None, better,
                            " ".join(scmd), err)
                    continue
                try:
                    iops, p99, fcmd, scpu, ccpu = fio(extra, jobs, pid)
                    log("%-18s %-8s conns=%d  %9.0f IOPS  p99 %7.0f us  "
                        "CPU us/IO server %s client %s" %
                        (impl, wl, jobs, iops, p99, scpu, ccpu))
                    row(wl, params, impl, peer, "IOPS", round(iops, 1), "higher",
                        " ".join(scmd) + " ; " + fcmd)
                    row(wl, params, impl, peer, "p99 us", round(p99, 1), "lower",
                        " ".join(scmd) + " ; " + fcmd)
                    row(wl, params, impl, peer, "server CPU us/IO", scpu, "lower",
                        " ".join(scmd) + " ; " + fcmd,
                        None if scpu is not None else "no /proc stat")
                    row(wl, params, impl, peer, "client CPU us/IO", ccpu, "lower",
                        " ".join(scmd) + " ; " + fcmd)
                except Exception as e:
                    for metric, better in (("IOPS", "higher"), ("p99 us", "lower")):
                        row(wl, params, impl, peer, metric, None, better,
                            " ".join(scmd), str(e)[:200])
        if pid is not None:
            stop(pid)
    bulk()
finally:
    cleanup()
EOF
