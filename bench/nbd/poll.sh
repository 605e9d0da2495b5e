#!/bin/sh
# bench/nbd/poll.sh BUILD_DIR [--base OTHER_BUILD_DIR]... [--reps N] [--quick]
#
# Server CPU time per I/O, the figure adaptive polling trades against
# latency, for iocore-nbd and its peers on one connection, 4 KiB reads at
# queue depth 64, image in /dev/shm:
#   fio      fio's nbd engine (libnbd, one saturated client thread),
#            random reads: IOPS, p99 completion latency, server us/IO;
#   qemu-img qemu-img bench (QEMU's NBD client, not saturated), sequential
#            reads: IOPS and server us/IO.
# Each --base runs another iocore-nbd (another build, e.g. before a change)
# in the same rounds.  Rounds alternate the servers; every figure is the
# median over the rounds, and each row carries its ratio to the best peer
# (server us/IO: ours / lowest peer, lower is better; IOPS: ours / highest
# peer).  iocore rows also report the I/O thread's polling counters
# (__org.iocore_query-polling) per I/O.  Wrap runs in
# flock /tmp/iocore-bench.lock.
exec python3 - "$@" <<'EOF'
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

argv = sys.argv[1:]
def opt(name, default=None):
    if name in argv:
        i = argv.index(name)
        v = argv[i + 1]
        del argv[i:i + 2]
        return v
    return default
bases = []
while "--base" in argv:
    bases.append(opt("--base"))
reps = int(opt("--reps", "3"))
quick = "--quick" in argv
argv = [a for a in argv if a != "--quick"]
if not argv:
    sys.exit("usage: poll.sh BUILD_DIR [--base OTHER_BUILD_DIR] [--reps N] [--quick]")
build = os.path.abspath(argv[0])
runtime = 2 if quick else 5
count = 100000 if quick else 300000

work = tempfile.mkdtemp(prefix="ioc-nbd-poll.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
img, sock, pidf, ctl = (os.path.join(work, n) for n in ("disk.img", "sock", "pid", "ctl"))
with open(img, "wb") as f:
    chunk = b"\x5a" * (1 << 20)
    for _ in range(256):
        f.write(chunk)

def iocore(b):
    return [os.path.join(b, "tools/nbd/iocore-nbd"), "--fork", "--pid-file", pidf,
            "-U", sock, "--control", ctl, img]
servers = [("iocore", False, iocore(build))]
for i, b in enumerate(bases):
    servers.append(("iocore-base" + (str(i + 1) if i else ""), False, iocore(os.path.abspath(b))))
servers += [
    ("nbdkit-file", True, ["nbdkit", "--pidfile", pidf, "-U", sock, "file", img]),
    ("qemu-nbd-io_uring", True, ["qemu-nbd", "-t", "-f", "raw", "--cache=writeback",
                                 "--aio=io_uring", "-e", "8", "--fork",
                                 "--pid-file", pidf, "-k", sock, img]),
]
ctl_bin = os.path.join(build, "tools/ctl/iocore-ctl")

def start(cmd):
    for p in (sock, pidf, ctl):
        if os.path.exists(p):
            os.unlink(p)
    if not shutil.which(cmd[0]) and not os.access(cmd[0], os.X_OK):
        return None
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    for _ in range(500):
        if os.path.exists(pidf) and os.path.exists(sock):
            try:
                return int(open(pidf).read().strip())
            except ValueError:
                pass
        time.sleep(0.01)
    return None

def stop(pid):
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(500):
            os.kill(pid, 0)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

def cpu_s(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def polling():
    if not os.path.exists(ctl):
        return None
    r = subprocess.run([ctl_bin, "-s", ctl, "--json", "__org.iocore_query-polling"],
                       capture_output=True, text=True)
    try:
        p = json.loads(r.stdout)
    except ValueError:
        return None
    keys = ("poll-ns-total", "polls", "polls-hit", "polls-empty", "backoffs", "sleeps")
    return {k: sum(e[k] for e in p) for k in keys}

def run_fio():
    out = subprocess.run(["fio", "--name=b", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
                          "--bs=4k", "--iodepth=64", "--rw=randread", "--time_based",
                          "--runtime=%d" % runtime, "--output-format=json"],
                         capture_output=True, text=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return j["total_ios"], j["iops"], j["clat_ns"]["percentile"]["99.000000"] / 1000

def run_qemu_img():
    t = time.monotonic()
    subprocess.run(["qemu-img", "bench", "-f", "raw", "-c", str(count), "-d", "64", "-s", "4096",
                    "nbd+unix:///?socket=" + sock], capture_output=True, check=True)
    return count, count / (time.monotonic() - t), None

clients = [("fio", run_fio), ("qemu-img", run_qemu_img)]
res = {}
for rnd in range(reps):
    for name, _, cmd in servers:
        for cname, fn in clients:
            pid = start(cmd)
            if pid is None:
                continue
            try:
                p0, c0 = polling(), cpu_s(pid)
                ios, iops, p99 = fn()
                c1, p1 = cpu_s(pid), polling()
            except Exception as e:
                print("%s %s: %s" % (name, cname, e), file=sys.stderr)
                stop(pid)
                continue
            stop(pid)
            r = res.setdefault((cname, name), {"us/IO": [], "IOPS": [], "p99 us": [], "poll us/IO": [],
                                               "polls/IO": [], "sleeps/IO": [], "backoffs": []})
            r["us/IO"].append((c1 - c0) * 1e6 / ios)
            r["IOPS"].append(iops)
            if p99 is not None:
                r["p99 us"].append(p99)
            if p0 and p1:
                d = {k: p1[k] - p0[k] for k in p0}
                r["poll us/IO"].append(d["poll-ns-total"] / 1000 / ios)
                r["polls/IO"].append(d["polls"] / ios)
                r["sleeps/IO"].append(d["sleeps"] / ios)
                r["backoffs"].append(d["backoffs"])

med = {k: {m: statistics.median(v) for m, v in r.items() if v} for k, r in res.items()}
for cname, _ in clients:
    peers = [med[(cname, n)] for n, peer, _ in servers if peer and (cname, n) in med]
    for name, peer, _ in servers:
        m = med.get((cname, name))
        if not m:
            continue
        line = "%-8s %-18s" % (cname, name)
        for k in ("IOPS", "p99 us", "us/IO", "poll us/IO", "polls/IO", "sleeps/IO", "backoffs"):
            if k in m:
                line += "  %s %.4g" % (k, m[k])
        if peers and not peer:
            line += "  | us/IO x%.2f of best peer, IOPS x%.2f" % (
                m["us/IO"] / min(p["us/IO"] for p in peers), m["IOPS"] / max(p["IOPS"] for p in peers))
            if "p99 us" in m:
                line += ", p99 x%.2f" % (m["p99 us"] / min(p["p99 us"] for p in peers if "p99 us" in p))
        print(line, flush=True)
shutil.rmtree(work, ignore_errors=True)
EOF
