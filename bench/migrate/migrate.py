#!/usr/bin/env python3
# The driver behind bench/migrate/run.sh (its opening comment says what is
# measured).  Python for the QMP clients (events with receipt times), the
# per-request latency logs and the cleanup.
import json, os, shutil, signal, socket, subprocess, sys, tempfile, time

USAGE = ("usage: run.sh BUILD_DIR [--quick] [--size=MIB] [--rounds=N] [--links=lo,veth] "
         "[--live-secs=S] [--live-compress=on|off] [--live-auto-converge=both|on|off] "
         "[--no-live] [--no-idle]")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in sys.argv[1:]
            if a.startswith("--"))
if len(args) != 1 or set(opts) - {"quick", "size", "rounds", "links", "live-secs",
                                  "live-compress", "live-auto-converge", "no-live",
                                  "no-idle"}:
    sys.exit(USAGE)
quick = "quick" in opts
build = os.path.abspath(args[0])
SRV = os.path.join(build, "tools/nbd/iocore-nbd")
try:
    size_mb = int(opts.get("size", 256 if quick else 2048))
    rounds = int(opts.get("rounds", 1 if quick else 3))
    live_secs = int(opts.get("live-secs", 30 if quick else 90))
except ValueError:
    sys.exit(USAGE)
links = opts.get("links", "lo,veth").split(",")
if opts.get("live-compress", "off") not in ("on", "off"):
    sys.exit(USAGE)
# The live case's iocore variant: raw (the default: on loopback zstd costs
# the cores fio and the servers share, bench/migrate/NOTES.md) or zstd.
LIVE = "iocore-zstd" if opts.get("live-compress") == "on" else "iocore"
# The live case with capability auto-converge on (QEMU's default
# parameters): a row of its own, labelled so, next to the default
# configuration's (--live-auto-converge=both, the default).
LIVE_AC = LIVE + "+auto-converge"
if opts.get("live-auto-converge", "both") not in ("both", "on", "off"):
    sys.exit(USAGE)
LIVE_VARIANTS = {"both": [LIVE, LIVE_AC], "on": [LIVE_AC],
                 "off": [LIVE]}[opts.get("live-auto-converge", "both")]
if size_mb < 3 or rounds < 1 or live_secs < 5 or set(links) - {"lo", "veth"}:
    sys.exit(USAGE)
if not os.access(SRV, os.X_OK):
    sys.exit("migrate: %s not built" % SRV)
SIZE = size_mb << 20
RATE = "1gbit"
IOPS = 20000
# Generous deadlines: a 2 GiB copy at 1 Gbit/s takes ~17 s uncompressed.
COPY_DEADLINE = 30 + SIZE / 20e6


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def row(case, params, impl, metric, value, better, error=None, cmd=""):
    r = {"suite": "migrate", "case": case, "params": params, "impl": impl,
         "peer": not impl.startswith("iocore"), "metric": metric, "value": value,
         "better": better, "cmd": cmd}
    if error:
        r["error"] = error
    print(json.dumps(r), flush=True)


# ---------------------------------------------------------------- cleanup
procs = []          # every Popen we started
netns = []          # namespaces we created
veths = []          # links we created (in the root namespace)
base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
work = tempfile.mkdtemp(prefix="ioc-migrate-bench.", dir=base)


def stop(p, sig=signal.SIGTERM, wait=10):
    if p.poll() is not None:
        return
    try:
        p.send_signal(sig)
        p.wait(wait)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)
    except ProcessLookupError:
        pass


def cleanup():
    for p in procs:
        try:
            stop(p, wait=5)
        except Exception:
            pass
    for v in veths:
        subprocess.run(["ip", "link", "del", v], stderr=subprocess.DEVNULL)
    for n in netns:
        subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)


def on_signal(sig, frame):
    sys.exit(128 + sig)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGHUP, on_signal)


def spawn(cmd, ns=None, **kw):
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("stdout", subprocess.DEVNULL)
    kw.setdefault("stderr", subprocess.DEVNULL)
    p = subprocess.Popen(cmd, **kw)
    procs.append(p)
    return p


def wait_for(pred, timeout, what, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("%s: process exited (%s)" % (what, proc.returncode))
        time.sleep(0.01)
    raise RuntimeError("timed out waiting for " + what)


def listening(ns, port):
    cmd = ["ss", "-Hltn", "sport = :%d" % port]
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    return bool(subprocess.run(cmd, capture_output=True).stdout.strip())


# ---------------------------------------------------------------- QMP
class QMP:
    def __init__(self, path, timeout=30):
        wait_for(lambda: os.path.exists(path), timeout, "control socket " + path)
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(timeout)
        end = time.monotonic() + timeout
        while True:
            try:
                self.s.connect(path)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.01)
        self.buf = b""
        self.events = []        # (monotonic time of receipt, event)
        self._read()            # greeting
        self.cmd("qmp_capabilities")

    def _read(self, timeout=None):
        while b"\n" not in self.buf:
            self.s.settimeout(timeout if timeout is not None else 60)
            d = self.s.recv(65536)
            if not d:
                raise RuntimeError("QMP connection closed")
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def _next(self, timeout=None):
        m = self._read(timeout)
        if "event" in m:
            self.events.append((time.monotonic(), m))
        return m

    def cmd(self, name, **a):
        msg = {"execute": name}
        if a:
            msg["arguments"] = a
        self.s.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            m = self._next()
            if "return" in m:
                return m["return"]
            if "error" in m:
                raise RuntimeError("%s: %s" % (name, m["error"].get("desc")))

    def wait_event(self, pred, timeout):
        """The receipt time of the first event for which pred holds."""
        end = time.monotonic() + timeout
        i = 0
        while True:
            while i < len(self.events):
                t, e = self.events[i]
                i += 1
                if pred(e):
                    return t, e
            left = end - time.monotonic()
            if left <= 0:
                raise RuntimeError("timed out waiting for an event")
            try:
                self._next(min(left, 1.0))
            except socket.timeout:
                pass

    def close(self):
        self.s.close()


# ---------------------------------------------------------------- links
class Link:
    """Where the source side and the destination side run, and the
    destination's address."""
    def __init__(self, name, src_ns, dst_ns, addr):
        self.name, self.src_ns, self.dst_ns, self.addr = name, src_ns, dst_ns, addr
        self.port = 20000

    def next_port(self):
        if self.src_ns is None:   # the host's loopback: a port nobody uses
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            s.close()
            return p
        self.port += 1
        return self.port


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


tag = "%d" % (os.getpid() % 100000)


def make_links():
    out = {}
    root = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
    if "lo" in links:
        if root:
            ns = "iocbm-l" + tag
            try:
                sh("ip", "netns", "add", ns)
                netns.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                out["lo"] = Link("loopback", ns, ns, "127.0.0.1")
            except subprocess.CalledProcessError as e:
                log("migrate: no namespace for loopback (%s); using the host's" %
                    e.stderr.decode().strip())
        if "lo" not in out:
            out["lo"] = Link("loopback", None, None, "127.0.0.1")
    if "veth" in links:
        if not root:
            out["veth"] = "needs root (ip netns, tc)"
        else:
            a, b = "iocbm-s" + tag, "iocbm-d" + tag
            try:
                for n in (a, b):
                    sh("ip", "netns", "add", n)
                    netns.append(n)
                    sh("ip", "-n", n, "link", "set", "lo", "up")
                # Created inside namespace a, so nothing is left in the root
                # namespace even for a moment.
                sh("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb",
                   "netns", b)
                sh("ip", "-n", a, "addr", "add", "10.213.57.1/30", "dev", "va")
                sh("ip", "-n", b, "addr", "add", "10.213.57.2/30", "dev", "vb")
                for n, d in ((a, "va"), (b, "vb")):
                    sh("ip", "-n", n, "link", "set", d, "up")
                    sh("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", d, "root", "tbf",
                       "rate", RATE, "burst", "256kb", "latency", "20ms")
                out["veth"] = Link("veth-1gbit", a, b, "10.213.57.2")
            except subprocess.CalledProcessError as e:
                out["veth"] = "cannot set up the namespaces: " + e.stderr.decode().strip()
    return out


# ---------------------------------------------------------------- the image
def make_image(path):
    mib = 1 << 20
    with open(path, "wb") as f:
        tar = subprocess.Popen(["tar", "cf", "-", "--ignore-failed-read", "/usr"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for i in range(size_mb):
            k = i % 3
            if k == 0:
                blk = tar.stdout.read(mib)
                f.write(blk + bytes(mib - len(blk)))
            elif k == 1:
                f.write(os.urandom(mib))
            else:
                f.write(bytes(mib))
        tar.kill()
        tar.wait()


# ---------------------------------------------------------------- runners
class Run:
    """One copy: its own directory; everything started is stopped after."""
    def __init__(self, name):
        self.d = tempfile.mkdtemp(prefix=name + ".", dir=work)
        self.mine = []
        self.qmps = []

    def spawn(self, cmd, ns=None, **kw):
        p = spawn(cmd, ns, **kw)
        self.mine.append(p)
        return p

    def qmp(self, path):
        q = QMP(path)
        self.qmps.append(q)
        return q

    def path(self, n):
        return os.path.join(self.d, n)

    def close(self):
        for q in self.qmps:
            try:
                q.close()
            except OSError:
                pass
        for p in reversed(self.mine):
            stop(p)
            procs.remove(p)
        shutil.rmtree(self.d, ignore_errors=True)


def fresh_source(run, image, live):
    """The source image: the shared one when idle (nobody writes it), a copy
    when fio will write it."""
    if not live:
        return image
    p = run.path("src.img")
    shutil.copyfile(image, p)
    return p


def iocore_dest(run, link, port):
    dst = run.path("dst.img")
    logf = open(run.path("dst.log"), "w")
    p = run.spawn([SRV, "-v", "-U", run.path("dst.sock"), "--control", run.path("dst.ctl"),
                   "--incoming", "tcp:%s:%d" % (link.addr, port), dst], link.dst_ns,
                  stderr=logf)
    wait_for(lambda: "waiting for an incoming migration" in open(run.path("dst.log")).read(),
             30, "the iocore destination", p)
    return p


def iocore_copy(run, link, image, compress, live=None, auto_converge=False):
    """Time from migrate to the MIGRATION completed event, and the final
    query-migrate."""
    src = fresh_source(run, image, live)
    port = link.next_port()
    run.spawn([SRV, "-U", run.path("src.sock"), "--control", run.path("src.ctl"), src],
              link.src_ns)
    dp = iocore_dest(run, link, port)
    q = run.qmp(run.path("src.ctl"))
    q.cmd("migrate-set-capabilities", capabilities=[
        {"capability": "events", "state": True},
        {"capability": "compress", "state": bool(compress)},
        {"capability": "auto-converge", "state": bool(auto_converge)}])
    q.cmd("migrate-set-parameters", **{"compress-level": 1, "compress-threads": 2,
                                       "downtime-limit": 20})
    writer = live(run, run.path("src.sock")) if live else None
    t0 = time.monotonic()
    w0 = time.time()
    q.cmd("migrate", uri="tcp:%s:%d" % (link.addr, port))
    t1, ev = q.wait_event(lambda e: e["event"] == "MIGRATION" and
                          e["data"]["status"] in ("completed", "failed", "cancelled"),
                          COPY_DEADLINE + (live_secs if live else 0))
    w1 = time.time()
    qm = q.cmd("query-migrate")
    if ev["data"]["status"] != "completed":
        raise RuntimeError("migration %s: %s" % (ev["data"]["status"],
                                                 qm.get("error-desc", "")))
    res = {"time": t1 - t0, "query": qm, "window": (w0, w1)}
    if writer:
        res["writer"] = writer.finish(w0, w1)
    # The destination serves once it has verified the image.
    wait_for(lambda: os.path.exists(run.path("dst.sock")), 30, "the destination serving", dp)
    if live and subprocess.run(["cmp", "-s", src, run.path("dst.img")]).returncode != 0:
        res["mismatch"] = True
    return res


def qemu_nbd_target(run, link, port, size, extra=()):
    dst = run.path("dst.img")
    with open(dst, "wb") as f:
        f.truncate(size)
    p = run.spawn(["qemu-nbd", "-f", "raw", "-t", "-e", "8", "-b", link.addr, "-p", str(port),
                   "-x", ""] + list(extra) + [dst], link.dst_ns)
    wait_for(lambda: listening(link.dst_ns, port), 30, "qemu-nbd target", p)
    return p


def qsd_mirror(run, link, image, mode, live=None):
    """Time from blockdev-mirror to BLOCK_JOB_READY; the job's len over
    the image size."""
    src = fresh_source(run, image, live)
    port = link.next_port()
    qemu_nbd_target(run, link, port, SIZE)
    qmp_path = run.path("qsd.qmp")
    run.spawn(["qemu-storage-daemon",
               "--blockdev", "driver=file,node-name=file0,filename=%s,cache.direct=off" % src,
               "--blockdev", "driver=raw,node-name=disk0,file=file0",
               "--nbd-server", "addr.type=unix,addr.path=%s" % run.path("src.sock"),
               "--export", "type=nbd,id=exp0,node-name=disk0,name=,writable=on",
               "--chardev", "socket,path=%s,server=on,wait=off,id=m0" % qmp_path,
               "--monitor", "chardev=m0"], link.src_ns)
    q = run.qmp(qmp_path)
    wait_for(lambda: os.path.exists(run.path("src.sock")), 30, "qsd's NBD socket")
    q.cmd("blockdev-add", **{"driver": "nbd", "node-name": "tgt", "export": "",
                             "server": {"type": "inet", "host": link.addr, "port": str(port)}})
    writer = live(run, run.path("src.sock")) if live else None
    t0 = time.monotonic()
    w0 = time.time()
    q.cmd("blockdev-mirror", **{"job-id": "m0", "device": "disk0", "target": "tgt",
                                "sync": "full", "copy-mode": mode, "auto-dismiss": False})
    t1, ev = q.wait_event(lambda e: e["event"] in ("BLOCK_JOB_READY", "BLOCK_JOB_COMPLETED",
                                                   "BLOCK_JOB_ERROR"),
                          COPY_DEADLINE + (live_secs if live else 0))
    w1 = time.time()
    if ev["event"] != "BLOCK_JOB_READY":
        raise RuntimeError("mirror: %s" % json.dumps(ev.get("data")))
    job = [j for j in q.cmd("query-block-jobs") if j["device"] == "m0"][0]
    res = {"time": t1 - t0, "job": job, "window": (w0, w1)}
    if writer:
        res["writer"] = writer.finish(w0, w1)
    q.cmd("block-job-complete", device="m0")
    q.wait_event(lambda e: e["event"] == "BLOCK_JOB_COMPLETED", 60)
    return res


def nbdcopy_copy(run, link, image):
    port = link.next_port()
    qemu_nbd_target(run, link, port, SIZE)
    run.spawn(["qemu-nbd", "-f", "raw", "-t", "-r", "-e", "8", "-k", run.path("src.sock"),
               "-x", "", image], link.src_ns)
    wait_for(lambda: os.path.exists(run.path("src.sock")), 30, "qemu-nbd source")
    t0 = time.monotonic()
    p = run.spawn(["nbdcopy", "nbd+unix:///?socket=" + run.path("src.sock"),
                   "nbd://%s:%d/" % (link.addr, port)], link.src_ns, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=COPY_DEADLINE)
    except subprocess.TimeoutExpired:
        raise RuntimeError("nbdcopy timed out")
    if p.returncode != 0:
        raise RuntimeError("nbdcopy: " + err.decode(errors="replace")[-200:])
    return {"time": time.monotonic() - t0}


def zstd_socat_copy(run, link, image):
    port = link.next_port()
    dst = run.path("dst.img")
    rx = run.spawn(["sh", "-c", 'socat -u TCP-LISTEN:%d,bind=%s,reuseaddr STDOUT | '
                    'zstd -d -q -f -o "$0"' % (port, link.addr), dst], link.dst_ns)
    wait_for(lambda: listening(link.dst_ns, port), 30, "socat receiver", rx)
    t0 = time.monotonic()
    tx = run.spawn(["sh", "-c", 'zstd -T0 -1 -q -c "$0" | socat -u STDIN TCP:%s:%d' %
                    (link.addr, port), image], link.src_ns)
    try:
        tx.wait(COPY_DEADLINE)
        rx.wait(COPY_DEADLINE)
    except subprocess.TimeoutExpired:
        raise RuntimeError("zstd | socat timed out")
    if tx.returncode or rx.returncode:
        raise RuntimeError("zstd | socat: exit %s/%s" % (tx.returncode, rx.returncode))
    t = time.monotonic() - t0
    if os.path.getsize(dst) != SIZE:
        raise RuntimeError("zstd | socat: short copy")
    return {"time": t}


# ---------------------------------------------------------------- the writer
class Writer:
    """fio, nbd engine, 4 KiB random writes at 20k IOPS over the whole
    image, every request's completion latency logged with its wall time."""
    def __init__(self, run, sock):
        self.run = run
        self.prefix = run.path("fio")
        self.t_start = time.time()
        self.p = run.spawn(["fio", "--name=w", "--ioengine=nbd",
                            "--uri=nbd+unix:///?socket=" + sock, "--rw=randwrite", "--bs=4k",
                            "--iodepth=16", "--rate_iops=%d" % IOPS, "--size=%d" % SIZE,
                            "--time_based", "--runtime=%d" % live_secs,
                            "--write_lat_log=" + self.prefix, "--log_avg_msec=0",
                            "--log_unix_epoch=1", "--output-format=terse"])
        self.deadline = self.t_start + live_secs
        # Let it connect and reach its rate before the copy starts.
        time.sleep(2)
        if self.p.poll() is not None:
            raise RuntimeError("fio exited early (%s)" % self.p.returncode)

    def finish(self, w0, w1):
        # fio dies on the source's ESHUTDOWN after a switch-over; otherwise
        # stop it (SIGINT writes its logs).
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        lat = []
        last = 0
        try:
            with open(self.prefix + "_clat.1.log") as f:
                for line in f:
                    v = line.split(",")
                    if len(v) > 2 and v[2].strip() == "1":
                        t = int(v[0]) / 1000.0
                        if w0 <= t <= w1:
                            lat.append(int(v[1]))
                            last = t
        except FileNotFoundError:
            pass
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000.0 if lat else None
        iops = len(lat) / (w1 - w0) if w1 > w0 else 0
        # The writer counts as still running at the end of the window if it
        # had not reached its run time and a write of its completed within
        # the window's last second (requests held at a switch-over complete
        # with an error and are not logged).
        running = w1 < self.deadline and last >= w1 - 1.0
        return {"p99_us": p99, "writes": len(lat), "iops": iops, "running": running}


# ---------------------------------------------------------------- driver
def median(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


results = {}     # (case, link, impl) -> [result dicts]
errors = {}      # (case, link, impl) -> last error


def attempt(case, link, impl, fn, *a):
    run = Run(impl)
    key = (case, link.name if isinstance(link, Link) else link, impl)
    try:
        r = fn(run, *a)
        results.setdefault(key, []).append(r)
        extra = ""
        if "query" in r:
            d = r["query"]["disk"]
            extra = " transferred %.0f MiB, downtime %s ms" % (
                d["transferred"] / 2**20, r["query"].get("downtime"))
        if "writer" in r:
            w = r["writer"]
            extra += ", fio p99 %s us, %d writes, running %s" % (
                w["p99_us"], w["writes"], w["running"])
        if "query" in r and "__org.iocore_cpu-throttle-max" in r["query"]:
            extra += ", throttle max %d%%" % r["query"]["__org.iocore_cpu-throttle-max"]
        log("  %-6s %-12s %-20s %7.2f s%s" % (case, key[1], impl, r["time"], extra))
    except Exception as e:   # a peer that fails is reported, not fatal
        errors[key] = str(e)[:300]
        log("  %-6s %-12s %-20s failed: %s" % (case, key[1], impl, errors[key]))
    finally:
        run.close()


def main():
    t_start = time.monotonic()
    image = os.path.join(work, "image.raw")
    log("migrate: image %d MiB in %s, %d round(s)" % (size_mb, work, rounds))
    make_image(image)
    ls = make_links()
    have = {t: bool(shutil.which(t)) for t in ("qemu-storage-daemon", "qemu-nbd", "nbdcopy",
                                              "zstd", "socat", "fio")}
    idle_impls = [
        ("iocore", lambda run, l: iocore_copy(run, l, image, False), []),
        ("iocore-zstd", lambda run, l: iocore_copy(run, l, image, True), []),
        ("qsd-background", lambda run, l: qsd_mirror(run, l, image, "background"),
         ["qemu-storage-daemon", "qemu-nbd"]),
        ("qsd-write-blocking", lambda run, l: qsd_mirror(run, l, image, "write-blocking"),
         ["qemu-storage-daemon", "qemu-nbd"]),
        ("nbdcopy", lambda run, l: nbdcopy_copy(run, l, image), ["nbdcopy", "qemu-nbd"]),
        ("zstd-socat", lambda run, l: zstd_socat_copy(run, l, image), ["zstd", "socat"]),
    ]
    live_impls = [
        (v, lambda run, l, v=v: iocore_copy(run, l, image, LIVE == "iocore-zstd", Writer,
                                            v == LIVE_AC), ["fio"])
        for v in LIVE_VARIANTS] + [
        ("qsd-write-blocking", lambda run, l: qsd_mirror(run, l, image, "write-blocking",
                                                         Writer),
         ["fio", "qemu-storage-daemon", "qemu-nbd"]),
    ]
    for ln, l in ls.items():
        if not isinstance(l, Link):
            for impl, _, _ in idle_impls:
                errors[("idle", {"lo": "loopback", "veth": "veth-1gbit"}[ln], impl)] = l
    for r in range(rounds):
        log("round %d/%d" % (r + 1, rounds))
        if "no-idle" not in opts:
            for ln, l in ls.items():
                if not isinstance(l, Link):
                    continue
                k = r % len(idle_impls)
                for impl, fn, needs in idle_impls[k:] + idle_impls[:k]:
                    missing = [t for t in needs if not have[t]]
                    if missing:
                        errors[("idle", l.name, impl)] = "missing " + " ".join(missing)
                        continue
                    attempt("idle", l, impl, fn, l)
        if "no-live" not in opts and isinstance(ls.get("lo"), Link):
            l = ls["lo"]
            order = live_impls if r % 2 == 0 else live_impls[::-1]
            for impl, fn, needs in order:
                missing = [t for t in needs if not have[t]]
                if missing:
                    errors[("live", l.name, impl)] = "missing " + " ".join(missing)
                    continue
                attempt("live", l, impl, fn, l)
    report()
    log("migrate: %.0f s" % (time.monotonic() - t_start))


def report():
    table = []   # (what, ours, peer, ratio, target, ok)

    def mt(case, link, impl, f=lambda r: r["time"]):
        v = results.get((case, link, impl), [])
        return median([f(r) for r in v])

    # Every measurement as a row.
    for (case, link, impl), rs in sorted(results.items()):
        params = "link=%s,size=%dMiB" % (link, size_mb)
        if case == "live":
            params += ",writer=fio randwrite 4k %d IOPS" % IOPS
        row(case, params, impl, "s", round(mt(case, link, impl), 3), "lower")
    for (case, link, impl), e in sorted(errors.items()):
        if (case, link, impl) not in results:
            row(case, "link=%s,size=%dMiB" % (link, size_mb), impl, "s", None, "lower", e)

    for link, target in (("loopback", 1.5), ("veth-1gbit", 2.0)):
        ours = {i: mt("idle", link, i) for i in ("iocore", "iocore-zstd")}
        ours = {k: v for k, v in ours.items() if v is not None}
        peers = {i: mt("idle", link, i) for i in ("qsd-background", "qsd-write-blocking",
                                                   "nbdcopy", "zstd-socat")}
        peers = {k: v for k, v in peers.items() if v is not None}
        if not ours or not peers:
            table.append(("idle copy, " + link, "-", "-", None, ">= %.1fx" % target, False))
            continue
        oi, ot = min(ours.items(), key=lambda kv: kv[1])
        pi, pt = min(peers.items(), key=lambda kv: kv[1])
        ratio = pt / ot
        row("idle", "link=%s,size=%dMiB" % (link, size_mb), oi, "speed x best peer",
            round(ratio, 3), "higher")
        table.append(("idle copy, " + link + " (speed)", "%s %.2f s" % (oi, ot),
                      "%s %.2f s" % (pi, pt), ratio, ">= %.1fx" % target, ratio >= target))

    link = "loopback"
    for LV in LIVE_VARIANTS:
        tag = "" if LV == LIVE else " [%s]" % LV
        io = results.get(("live", link, LV), [])
        qs = results.get(("live", link, "qsd-write-blocking"), [])
        if io:
            running = all(r["writer"]["running"] for r in io)
            table.append(("live: completed while fio runs" + tag, "%d/%d" % (
                sum(r["writer"]["running"] for r in io), len(io)), "-", None, "all", running))
        else:
            table.append(("live: completed while fio runs" + tag, "-", "-", None, "all", False))
        ot = mt("live", link, LV)
        pt = mt("live", link, "qsd-write-blocking")
        r = ot / pt if ot and pt else None
        table.append(("live: time (to completed / ready)" + tag,
                      "%.2f s" % ot if ot else "-", "qsd-wb %.2f s" % pt if pt else "-", r,
                      "<= 0.7x", r is not None and r <= 0.7))
        # Bytes copied per byte of image: on the wire (disk.transferred, so
        # compressed), and read and sent before compression (amplification).
        ow = mt("live", link, LV, lambda x: x["query"]["disk"]["transferred"] / SIZE)
        oa = mt("live", link, LV, lambda x: x["query"]["__org.iocore_amplification"])
        pa = mt("live", link, "qsd-write-blocking", lambda x: x["job"]["len"] / SIZE)
        table.append(("live: bytes on the wire / image" + tag, "%.3f" % ow if ow else "-",
                      "qsd-wb %.3f" % pa if pa else "-", None, "<= 1.2",
                      ow is not None and ow <= 1.2))
        table.append(("live: bytes copied (uncompressed) / image" + tag, "%.3f" % oa if oa else "-",
                      "qsd-wb %.3f" % pa if pa else "-", None, "<= 1.2",
                      oa is not None and oa <= 1.2))
        op = mt("live", link, LV, lambda x: x["writer"]["p99_us"])
        pp = mt("live", link, "qsd-write-blocking", lambda x: x["writer"]["p99_us"])
        r = op / pp if op and pp else None
        table.append(("live: fio write p99 in the window" + tag,
                      "%.0f us" % op if op else "-", "qsd-wb %.0f us" % pp if pp else "-", r,
                      "<= 1.0x", r is not None and r <= 1.0))
        oi = mt("live", link, LV, lambda x: x["writer"]["iops"])
        pi = mt("live", link, "qsd-write-blocking", lambda x: x["writer"]["iops"])
        table.append(("live: fio write IOPS in the window (info)" + tag, "%.0f" % oi if oi else "-",
                      "qsd-wb %.0f" % pi if pi else "-", oi / pi if oi and pi else None, "-", None))
        od = mt("live", link, LV, lambda x: x["query"].get("downtime"))
        table.append(("live: downtime (loopback)" + tag, "%s ms" % od if od is not None else "-", "-",
                      None, "< 20 ms", od is not None and od < 20))

        def spread(x):
            b = x["query"].get("__org.iocore_worker-busy-ns") or []
            return (max(b) - min(b)) / max(b) if b and max(b) > 0 else None
        sp = mt("live", link, LV, spread)
        table.append(("live: compression workers' busy spread" + tag, "%.1f%%" % (100 * sp)
                      if sp is not None else "-", "-", None, "<= 10%", sp is not None and sp <= 0.1))
    for what, o, p, ratio, target, ok in table:
        # One row per target: ours, the best peer, the ratio, PASS/FAIL.
        r = {"suite": "migrate", "case": "target", "params": what, "impl": "iocore",
             "peer": False, "metric": "target " + target, "ours": o, "best peer": p,
             "value": round(ratio, 3) if ratio is not None else None,
             "better": "higher", "pass": None if ok is None else bool(ok), "cmd": ""}
        if ratio is None and o == "-":
            r["error"] = "not measured"
        print(json.dumps(r), flush=True)
    for (case, l, impl), rs in sorted(results.items()):
        for x in rs:
            if x.get("mismatch"):
                log("WARNING: %s %s %s: source and destination images differ" % (case, l, impl))
    log("")
    log("%-66s %-24s %-28s %7s %9s  %s" % ("", "ours", "best peer", "ratio", "target", ""))
    for what, o, p, ratio, target, ok in table:
        log("%-66s %-24s %-28s %7s %9s  %s" % (what, o, p, "%.2fx" % ratio if ratio else "-",
                                                target,
                                                "info" if ok is None else "PASS" if ok else "FAIL"))
    if errors:
        log("")
        for (case, l, impl), e in sorted(errors.items()):
            log("could not run: %s %s %s: %s" % (case, l, impl, e))


try:
    main()
finally:
    cleanup()
