#!/bin/sh
# bench/nbd/seq.sh BUILD_DIR [--quick] [--tcp] [--rounds=N] [--runtime=S]
#                  [--also=NAME=PATH ...] [--only=read|write] [--iodepth=N|run]
#                  [--peers=nbdkit]
#
# Large sequential transfers: fio's nbd engine, one connection, iodepth 8
# (--iodepth=run: run.sh's 32 for 64 KiB and 16 for 1 MiB),
# 64 KiB and 1 MiB reads and writes (--only: one of them), against iocore-nbd (io_uring and
# thread-pool backends) and its peers (qemu-nbd --aio=io_uring and
# --aio=threads, nbdkit file), same image in /dev/shm, over a Unix socket
# (or loopback TCP with --tcp).  --also adds another iocore-nbd binary (an
# older build) to the same run.  Rounds go round robin over the servers,
# so every server sees the same machine load; medians are printed with
# MiB/s, the server's CPU per I/O (utime+stime of every thread from
# /proc/PID/stat over the fio run, divided by fio's I/O count) and both as
# ratios to the best peer, fio's p99 completion latency, the client's CPU
# (fio's usr+sys, % of one core) and the server's busiest thread (% of one
# core).  --peers=nbdkit leaves out qemu-nbd (shorter rounds).  One JSON
# row per line on stdout.
exec python3 - "$@" <<'PY'
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
opt = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1")
           for a in sys.argv[1:] if a.startswith("--"))
if not args:
    sys.exit("usage: seq.sh BUILD_DIR [--quick] [--tcp] [--rounds=N] [--runtime=S]")
build = os.path.abspath(args[0])
ours = os.path.join(build, "tools/nbd/iocore-nbd")
quick = "quick" in opt
tcp = "tcp" in opt
runtime = float(opt.get("runtime", 2 if quick else 4))
rounds = int(opt.get("rounds", 3))
only = opt.get("only")
depth_opt = opt.get("iodepth", "8")
peers_only = opt.get("peers")
size_mb = 256 if quick else 1024
clk = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
work = tempfile.mkdtemp(prefix="ioc-nbd-seq.", dir=base)
img = os.path.join(work, "disk.img")
with open(img, "wb") as f:
    chunk = b"\x5a" * (1 << 20)
    for _ in range(size_mb):
        f.write(chunk)

port = [10809 + 100 + os.getpid() % 500]


def server_cmds():
    out = []
    mine = [("iocore", ours, [])]
    if not peers_only:
        mine.append(("iocore-aio-threads", ours, ["--aio", "threads"]))
    for a in sys.argv[1:]:
        if a.startswith("--also="):
            name, path = a[7:].split("=", 1)
            mine.append((name, path, []))
    i = 0
    for name, path, extra in mine:
        pidf = os.path.join(work, "p%d" % i)
        if tcp:
            lst = ["-b", "127.0.0.1", "-p", str(port[0] + i)]
            uri = "nbd://127.0.0.1:%d/" % (port[0] + i)
        else:
            s = os.path.join(work, "s%d" % i)
            lst, uri = ["-U", s], "nbd+unix:///?socket=" + s
        out.append((name, False, [path] + extra + ["--fork", "--pid-file", pidf] + lst + [img],
                    pidf, uri))
        i += 1
    for name, cmd in (("qemu-nbd-io_uring", ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                             "--aio=io_uring", "-e", "8", "--fork"]),
                      ("qemu-nbd-threads", ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                            "--aio=threads", "-e", "8", "--fork"]),
                      ("nbdkit-file", ["nbdkit"])):
        if peers_only and not name.startswith(peers_only):
            continue
        pidf = os.path.join(work, "p%d" % i)
        if tcp:
            p = str(port[0] + i)
            lst = (["-b", "127.0.0.1", "-p", p] if name.startswith("qemu")
                   else ["-i", "127.0.0.1", "-p", p])
            uri = "nbd://127.0.0.1:%s/" % p
        else:
            s = os.path.join(work, "s%d" % i)
            lst = ["-k", s] if name.startswith("qemu") else ["-U", s]
            uri = "nbd+unix:///?socket=" + s
        if name.startswith("qemu"):
            full = cmd + ["--pid-file", pidf] + lst + [img]
        else:
            full = cmd + ["--pidfile", pidf] + lst + ["file", img]
        out.append((name, True, full, pidf, uri))
        i += 1
    return out


def start(cmd, pidf):
    with open(os.path.join(work, "err"), "wb") as ef:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=ef, timeout=30)
    if r.returncode != 0:
        return None
    for _ in range(500):
        if os.path.exists(pidf):
            try:
                with open(pidf) as f:
                    pid = int(f.read().strip())
                time.sleep(0.1)
                return pid
            except ValueError:
                pass
        time.sleep(0.01)
    return None


def stop(pid):
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(500):
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


def cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / clk


def thread_cpu(pid):
    out = {}
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    x = f.read().rsplit(")", 1)[1].split()
                out[tid] = (int(x[11]) + int(x[12])) / clk
            except (FileNotFoundError, ProcessLookupError):
                pass
    except FileNotFoundError:
        pass
    return out


def depth(bs):
    if depth_opt == "run":
        return 32 if bs == "64k" else 16
    return int(depth_opt)


def fio(uri, rw, bs, pid):
    cmd = ["fio", "--name=s", "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw,
           "--bs=" + bs, "--iodepth=%d" % depth(bs), "--size=%dM" % size_mb,
           "--time_based=1", "--runtime=%g" % runtime, "--output-format=json"]
    c0 = cpu(pid)
    # The busiest thread over the middle of the run, sampled while fio
    # runs: a peer's per-connection threads are gone once it ends.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.2 + runtime * 0.2)
    t0, w0 = thread_cpu(pid), time.monotonic()
    time.sleep(runtime * 0.6)
    t1, w1 = thread_cpu(pid), time.monotonic()
    busiest = max((t1[k] - t0.get(k, 0) for k in t1), default=0) * 100 / (w1 - w0)
    so, se = p.communicate(timeout=runtime * 3 + 60)
    c1 = cpu(pid)
    r = subprocess.CompletedProcess(cmd, p.returncode, so, se)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or "{" not in out:
        raise RuntimeError(r.stderr.decode(errors="replace")[-300:])
    j = json.loads(out[out.index("{"):])["jobs"][0]
    d = j["read"] if rw == "read" else j["write"]
    mibs = d["bw_bytes"] / 1048576.0
    ios = d["total_ios"]
    p99 = d["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0
    client = j["usr_cpu"] + j["sys_cpu"]
    return (mibs, ((c1 - c0) * 1e6 / ios if ios else None), p99, client, busiest,
            " ".join(cmd))


servers = []
try:
    for name, peer, cmd, pidf, uri in server_cmds():
        if not shutil.which(cmd[0]) and not os.access(cmd[0], os.X_OK):
            log("%s: not installed" % cmd[0])
            continue
        pid = start(cmd, pidf)
        if pid is None:
            log("%s: did not start" % name)
            continue
        servers.append((name, peer, cmd, pid, uri))
    res = {}
    rws = (only,) if only else ("read", "write")
    for rnd in range(rounds):
        for rw in rws:
            for bs in ("64k", "1m"):
                for name, peer, cmd, pid, uri in servers:
                    try:
                        m, c, p99, cl, bt, fcmd = fio(uri, rw, bs, pid)
                    except Exception as e:
                        log("%s %s %s: %s" % (name, rw, bs, e))
                        continue
                    res.setdefault((rw, bs, name), []).append((m, c, p99, cl, bt))
    for rw in rws:
        for bs in ("64k", "1m"):
            med = {}
            for name, peer, cmd, pid, uri in servers:
                v = res.get((rw, bs, name))
                if v:
                    med[name] = (statistics.median(x[0] for x in v),
                                 statistics.median(x[1] for x in v), len(v), peer, cmd,
                                 statistics.median(x[2] for x in v),
                                 statistics.median(x[3] for x in v),
                                 statistics.median(x[4] for x in v))
            peers = [v for v in med.values() if v[3]]
            best_m = max((v[0] for v in peers), default=None)
            best_c = min((v[1] for v in peers), default=None)
            best_p = min((v[5] for v in peers), default=None)
            for name, (m, c, n, peer, cmd, p99, cl, bt) in med.items():
                log("%-5s %-4s %-18s %6.0f MiB/s (%4.2fx)  server CPU %6.1f us/IO (%4.2fx)"
                    "  p99 %6.0f us (%4.2fx)  client %3.0f%%  server thread %3.0f%%  n=%d" %
                    (rw, bs, name, m, m / best_m if best_m else 0, c,
                     c / best_c if best_c else 0, p99, p99 / best_p if best_p else 0,
                     cl, bt, n))
                print(json.dumps({"suite": "nbd", "case": "seq-" + rw,
                                  "params": "bs=%s,iodepth=%d,conns=1,%s" % (bs, depth(bs), "tcp" if tcp else "unix"),
                                  "impl": name, "peer": peer, "MiB/s": round(m, 1),
                                  "server CPU us/IO": round(c, 2), "p99 us": round(p99, 1),
                                  "client CPU %": round(cl, 1),
                                  "server busiest thread %": round(bt, 1),
                                  "vs best peer MiB/s": round(m / best_m, 2) if best_m else None,
                                  "vs best peer CPU": round(c / best_c, 2) if best_c else None,
                                  "vs best peer p99": round(p99 / best_p, 2) if best_p else None,
                                  "cmd": " ".join(cmd)}), flush=True)
finally:
    for s in servers:
        stop(s[3])
    shutil.rmtree(work, ignore_errors=True)
PY
