#!/bin/sh
# bench/rbd/handover.sh BUILD_DIR
#
# Hand-over migration of an rbd node back and forth: on a one-host
# cluster (tests/harness/ceph.sh, started here and stopped at the end),
# iocore-nbd serves rbd/img; N times (N=10 by default) a new iocore-nbd
# --incoming takes it over from the current one (capability
# __org.iocore_handover), while one client writes 4 KiB blocks at depth 1
# and reconnects to the new server after each switch.  Prints, per
# hand-over and in sum: the source's downtime (query-migrate's downtime:
# from the hold to the destination's READY, which it sends once it
# serves) and the writer's largest pause (between two acknowledged
# writes, its reconnect included); median and max.  Not part of the
# suite; results go to bench/rbd/NOTES.md by hand.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
. "$ROOT/tests/harness/ceph.sh"
ceph_require
ceph_start || { echo "cluster did not start" >&2; exit 1; }
N=${N:-10} NBD=$BUILD/tools/nbd/iocore-nbd python3 - <<'PY'
import json, os, signal, socket, statistics, struct, subprocess, tempfile, threading, time

N, NBD, CONF = int(os.environ["N"]), os.environ["NBD"], os.environ["CEPH_CONF"]
DIR = tempfile.mkdtemp(prefix="ioc-hobench.", dir=os.environ["CEPH_DIR"])
IMG = "rbd:rbd/img:conf=" + CONF
procs = []


def recv_all(s, k):
    b = bytearray()
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            raise OSError("closed")
        b += c
    return bytes(b)


def nbd_connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(path)
    recv_all(s, 18)
    s.sendall(struct.pack(">I", 3))
    data = struct.pack(">IH", 0, 0)
    s.sendall(struct.pack(">QII", 0x49484156454F5054, 7, len(data)) + data)
    while True:
        _m, _o, t, ln = struct.unpack(">QIII", recv_all(s, 20))
        recv_all(s, ln)
        if t & 0x80000000:
            raise OSError("refused")
        if t == 1:
            return s


class Writer(threading.Thread):
    def __init__(self, path):
        super().__init__(daemon=True)
        self.target, self.stop, self.pauses, self.writes = path, False, [], 0
        self.pause = 0.0

    def connect(self):
        end = time.time() + 30
        while time.time() < end:
            try:
                return nbd_connect(self.target)
            except OSError:
                time.sleep(0.001)
        raise SystemExit("writer: cannot reconnect")

    def run(self):
        s, last, h = self.connect(), time.time(), 0
        while not self.stop:
            h += 1
            b = h % 2048
            try:
                s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, h, b * 4096, 4096) +
                          struct.pack(">QQ", b, h) * 256)
                _mg, err, _hd = struct.unpack(">IIQ", recv_all(s, 16))
                if err:
                    raise OSError("error %d" % err)
            except OSError:
                s.close()
                s = self.connect()
                continue
            now = time.time()
            self.pause = max(self.pause, now - last)
            last = now
            self.writes += 1
        s.close()


class Server:
    def __init__(self, tag, incoming=None):
        self.sock, self.ctl = os.path.join(DIR, tag + ".sock"), os.path.join(DIR, tag + ".ctl")
        self.logf = os.path.join(DIR, tag + ".log")
        cmd = [NBD, "-v", "-U", self.sock, "--control", self.ctl, "--iothreads", "1"]
        cmd += ["--incoming", incoming] if incoming else []
        self.p = subprocess.Popen(cmd + [IMG], stdout=open(self.logf, "w"),
                                  stderr=subprocess.STDOUT)
        procs.append(self.p)
        want = "waiting for an incoming" if incoming else "serving"
        for _ in range(600):
            if want in open(self.logf).read() or self.p.poll() is not None:
                break
            time.sleep(0.05)
        k = socket.socket(socket.AF_UNIX)
        k.connect(self.ctl)
        self.f, self.w = k.makefile("r"), k.makefile("w")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, c, **a):
        self.w.write(json.dumps({"execute": c, "arguments": a}) + "\n")
        self.w.flush()
        while True:
            r = json.loads(self.f.readline())
            if "event" not in r:
                return r


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


try:
    src = Server("s0")
    w = Writer(src.sock)
    w.start()
    time.sleep(1)
    downs, pauses = [], []
    for i in range(1, N + 1):
        port = free_port()
        dst = Server("s%d" % i, incoming="tcp:127.0.0.1:%d" % port)
        src.cmd("migrate-set-capabilities",
                capabilities=[{"capability": "__org.iocore_handover", "state": True}])
        time.sleep(0.5)
        w.pause = 0.0
        w.target = dst.sock
        src.cmd("migrate", uri="tcp:127.0.0.1:%d" % port)
        for _ in range(1500):
            q = src.cmd("query-migrate")["return"]
            if q.get("status") in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.02)
        if q.get("status") != "completed":
            raise SystemExit("hand-over %d: %s" % (i, q))
        time.sleep(0.5)
        downs.append(q["downtime"])
        pauses.append(w.pause * 1000)
        print("hand-over %2d: downtime %3d ms, writer's largest pause %6.1f ms"
              % (i, q["downtime"], w.pause * 1000), flush=True)
        src.p.send_signal(signal.SIGTERM)
        src.p.wait(60)
        src = dst
    w.stop = True
    w.join(30)
    print("%d hand-overs, %d writes: downtime median %.1f ms, max %d ms; "
          "writer's largest pause median %.1f ms, max %.1f ms"
          % (N, w.writes, statistics.median(downs), max(downs),
             statistics.median(pauses), max(pauses)))
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
PY
