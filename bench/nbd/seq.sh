#!/bin/sh
# bench/nbd/seq.sh BUILD_DIR [--quick] [--tcp] [--rounds=N] [--runtime=S]
#                  [--also=NAME=PATH ...]
#
# Large sequential transfers: fio's nbd engine, one connection, iodepth 8,
# 64 KiB and 1 MiB reads and writes, against iocore-nbd (io_uring and
# thread-pool backends) and its peers (qemu-nbd --aio=io_uring and
# --aio=threads, nbdkit file), same image in /dev/shm, over a Unix socket
# (or loopback TCP with --tcp).  --also adds another iocore-nbd binary (an
# older build) to the same run.  Rounds go round robin over the servers,
# so every server sees the same machine load; medians are printed with
# MiB/s, the server's CPU per I/O (utime+stime of every thread from
# /proc/PID/stat over the fio run, divided by fio's I/O count) and both as
# ratios to the best peer.  One JSON row per line on stdout.
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
    mine = [("iocore", ours, []), ("iocore-aio-threads", ours, ["--aio", "threads"])]
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


def fio(uri, rw, bs, pid):
    cmd = ["fio", "--name=s", "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw,
           "--bs=" + bs, "--iodepth=8", "--size=%dM" % size_mb, "--time_based=1",
           "--runtime=%g" % runtime, "--output-format=json"]
    c0 = cpu(pid)
    r = subprocess.run(cmd, capture_output=True, timeout=runtime * 3 + 60)
    c1 = cpu(pid)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or "{" not in out:
        raise RuntimeError(r.stderr.decode(errors="replace")[-300:])
    j = json.loads(out[out.index("{"):])["jobs"][0]
    d = j["read"] if rw == "read" else j["write"]
    mibs = d["bw_bytes"] / 1048576.0
    ios = d["total_ios"]
    return mibs, ((c1 - c0) * 1e6 / ios if ios else None), " ".join(cmd)


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
    for rnd in range(rounds):
        for rw in ("read", "write"):
            for bs in ("64k", "1m"):
                for name, peer, cmd, pid, uri in servers:
                    try:
                        m, c, fcmd = fio(uri, rw, bs, pid)
                    except Exception as e:
                        log("%s %s %s: %s" % (name, rw, bs, e))
                        continue
                    res.setdefault((rw, bs, name), []).append((m, c))
    for rw in ("read", "write"):
        for bs in ("64k", "1m"):
            med = {}
            for name, peer, cmd, pid, uri in servers:
                v = res.get((rw, bs, name))
                if v:
                    med[name] = (statistics.median(x[0] for x in v),
                                 statistics.median(x[1] for x in v), len(v), peer, cmd)
            peers = [v for v in med.values() if v[3]]
            best_m = max((v[0] for v in peers), default=None)
            best_c = min((v[1] for v in peers), default=None)
            for name, (m, c, n, peer, cmd) in med.items():
                log("%-5s %-4s %-20s %8.0f MiB/s (%5.2fx)  server CPU %7.1f us/IO (%5.2fx)  n=%d" %
                    (rw, bs, name, m, m / best_m if best_m else 0, c,
                     c / best_c if best_c else 0, n))
                print(json.dumps({"suite": "nbd", "case": "seq-" + rw,
                                  "params": "bs=%s,iodepth=8,conns=1,%s" % (bs, "tcp" if tcp else "unix"),
                                  "impl": name, "peer": peer, "MiB/s": round(m, 1),
                                  "server CPU us/IO": round(c, 2),
                                  "vs best peer MiB/s": round(m / best_m, 2) if best_m else None,
                                  "vs best peer CPU": round(c / best_c, 2) if best_c else None,
                                  "cmd": " ".join(cmd)}), flush=True)
finally:
    for s in servers:
        stop(s[3])
    shutil.rmtree(work, ignore_errors=True)
PY
