#!/usr/bin/env python3
"""Persistent dirty bitmaps of an rbd node, kept in the cluster.

Run by test-rbd-bitmap.sh on a fresh one-host cluster (CEPH_CONF).  Each
daemon below is a separate iocore-storage-daemon process on the image, as
two hosts would be: a bitmap added over QMP on one is found, with its
count and its exact ranges over NBD, by the next; a daemon killed with
SIGKILL leaves it inconsistent; block-dirty-bitmap-remove deletes it from
the cluster; a bitmap add, a block_resize or a blockdev-del that waits on
a stopped OSD, or a blockdev-add on a stopped monitor, holds the QMP
monitor, not the daemon.  TAP on stdout; every wait is bounded."""
import atexit, json, os, shutil, signal, socket, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import qmptap  # noqa: E402
from qmptap import run, tap  # noqa: E402

DAEMON, CONF, OSD_PID, MON_PID = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
DIR = tempfile.mkdtemp(prefix="ioc-rbdbm.", dir=os.environ.get("CEPH_DIR", "/tmp"))
started = []


@atexit.register
def cleanup():
    """Whatever happened, no daemon outlives the test, and the OSD runs."""
    for pid in (OSD_PID, MON_PID):
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(DIR, ignore_errors=True)


def ok(cond, name, info=""):
    tap(cond, name, info, lines=-15)


def objects():
    rc, out = run("rados", "-c", CONF, "-p", "rbd", "ls")
    return sorted(o for o in out.split() if o.startswith("__org.iocore_bitmaps."))


class Daemon:
    def __init__(self, tag, **extra):
        self.q = os.path.join(DIR, tag + ".q")
        self.s = os.path.join(DIR, tag + ".s")
        self.log = open(os.path.join(DIR, tag + ".log"), "w+")
        node = {"driver": "rbd", "node-name": "r", "pool": "rbd", "image": "img",
                "conf": CONF}
        node.update(extra)
        self.p = subprocess.Popen([DAEMON, "--blockdev", json.dumps(node),
            "--chardev", "socket,id=m,path=%s,server=on,wait=off" % self.q,
            "--monitor", "chardev=m", "--nbd-server", "addr.type=unix,addr.path=" + self.s],
            stdout=self.log, stderr=subprocess.STDOUT)
        started.append(self.p)
        self.f = None
        self.events = []
        for _ in range(600):
            if self.p.poll() is not None:
                break
            if os.path.exists(self.q) and os.path.exists(self.s):
                sk = socket.socket(socket.AF_UNIX)
                sk.settimeout(60)
                sk.connect(self.q)
                self.f = sk.makefile("rw")
                self.f.readline()
                self.cmd("qmp_capabilities")
                return
            time.sleep(0.1)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def cmd(self, c, **a):
        m = {"execute": c}
        if a:
            m["arguments"] = a
        self.f.write(json.dumps(m) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "event" not in r:
                return r
            self.events.append(r)

    def wait_event(self, name, **data):
        """The event NAME with DATA, seen already or the next one to come
        (60 s at most: the monitor socket's timeout); None if none came."""
        while True:
            for e in self.events:
                if e["event"] == name and all(e.get("data", {}).get(k) == v
                                              for k, v in data.items()):
                    self.events.remove(e)
                    return e
            try:
                self.events.append(json.loads(self.f.readline()))
            except (OSError, ValueError):
                return None

    def bitmaps(self):
        return self.cmd("query-named-block-nodes")["return"][0].get("dirty-bitmaps", [])

    def uri(self, name="r"):
        return "nbd+unix:///%s?socket=%s" % (name, self.s)

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


def dirty_map(uri, name):
    """The dirty extents of qemu:dirty-bitmap:NAME, as [offset, length] runs."""
    rc, out = run("nbdinfo", "--map=qemu:dirty-bitmap:" + name, uri)
    runs = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] == "1":
            runs.append([int(f[0]), int(f[1])])
    return rc, runs, out


# 1. The first "host": a persistent bitmap, writes through the export.
a = Daemon("a")
ok(a.f is not None, "daemon a serves the rbd node", a.output())
r = a.cmd("block-dirty-bitmap-add", node="r", name="b0", persistent=True,
          granularity=65536)
ok("return" in r, "block-dirty-bitmap-add persistent=true on an rbd node", r)
ok(len(objects()) == 1, "the bitmap object is in the image's pool", objects())
r = a.cmd("block-export-add", type="nbd", id="e", **{"node-name": "r"}, name="r",
          writable=True)
ok("return" in r, "a writable export of the node", r)
rc, out = run("qemu-io", "-f", "raw", "-c", "write -P 0x11 1M 64k",
              "-c", "write -P 0x22 10485760 4k", "-c", "write -P 0x33 200M 128k", a.uri())
ok(rc == 0, "qemu-io writes through the export", out)
bm = a.bitmaps()
ok(bm and bm[0]["count"] == 65536 * 4 and bm[0]["persistent"],
   "the bitmap counts the writes", bm)
ok(a.stop() == 0, "daemon a stops cleanly", a.output())

# 2. The second "host": the bitmap found in the cluster, served over NBD.
b = Daemon("b")
bm = b.bitmaps() if b.f else None
ok(bm and bm[0]["name"] == "b0" and bm[0]["count"] == 262144 and bm[0]["persistent"]
   and not bm[0].get("inconsistent", False) and bm[0]["granularity"] == 65536
   and bm[0]["recording"], "daemon b lists b0 with its count", bm or b.output())
r = b.cmd("block-export-add", type="nbd", id="e", **{"node-name": "r"}, name="r",
          writable=False, bitmaps=["b0"])
ok("return" in r, "daemon b exports the node with b0", r)
rc, runs, out = dirty_map(b.uri(), "b0")
ok(rc == 0 and runs == [[1048576, 65536], [10485760, 65536], [209715200, 131072]],
   "qemu:dirty-bitmap:b0 has exactly the written ranges", out)
rc, out = run("qemu-img", "map", "--output=json", "--image-opts",
              "driver=nbd,server.type=unix,server.path=%s,export=r,"
              "x-dirty-bitmap=qemu:dirty-bitmap:b0" % b.s)
try:
    dirty = [[e["start"], e["length"]] for e in json.loads(out) if not e["data"]]
except ValueError:
    dirty = None
ok(dirty == [[1048576, 65536], [10485760, 65536], [209715200, 131072]],
   "qemu-img map with x-dirty-bitmap agrees", out)
# b keeps recording; one more write, then a clean stop.  The clients
# above have exited, but b may not have read their connections' end yet:
# a safe block-export-del would be refused ("still in use") and the name
# stay taken.  Hard mode, and the new export once the old one is gone.
r = b.cmd("block-export-del", id="e", mode="hard")
ev = b.wait_event("BLOCK_EXPORT_DELETED", id="e") if "return" in r else None
ok(ev is not None, "daemon b deletes its read-only export", r)
r = b.cmd("block-export-add", type="nbd", id="w", **{"node-name": "r"}, name="r",
          writable=True)
rc, out = run("qemu-io", "-f", "raw", "-c", "write 512M 4k", b.uri())
ok(rc == 0 and "return" in r, "daemon b writes once more", out)
ok(b.stop() == 0, "daemon b stops cleanly", b.output())

# 3. A read-only node loads the bitmap and never writes the object.
before = run("rados", "-c", CONF, "-p", "rbd", "stat", objects()[0])[1] if objects() else ""
c = Daemon("c", **{"read-only": True})
bm = c.bitmaps() if c.f else None
ok(bm and bm[0]["count"] == 262144 + 65536 and not bm[0].get("inconsistent", False),
   "a read-only node loads it (with daemon b's write)", bm or c.output())
r = c.cmd("block-dirty-bitmap-add", node="r", name="ro", persistent=True)
ok("error" in r, "a read-only node refuses a persistent bitmap", r)
c.stop()
after = run("rados", "-c", CONF, "-p", "rbd", "stat", objects()[0])[1] if objects() else ""
ok(before and before == after, "the read-only node left the object alone", before + after)

# 4. lock=auto: the bitmap cannot be whole, so it loads inconsistent.
d = Daemon("d", **{"__org.iocore_lock": "auto"})
bm = d.bitmaps() if d.f else None
ok(bm and bm[0].get("inconsistent") is True, "lock=auto loads it inconsistent",
   bm or d.output())
r = d.cmd("block-dirty-bitmap-add", node="r", name="x", persistent=True)
ok("error" in r, "lock=auto refuses a new persistent bitmap", r)
d.stop()
# Marked in use by d: it stays inconsistent; remove it and start over.
e = Daemon("e")
bm = e.bitmaps() if e.f else None
ok(bm and bm[0].get("inconsistent") is True, "after lock=auto it stays inconsistent",
   bm or e.output())
r = e.cmd("block-dirty-bitmap-remove", node="r", name="b0")
ok("return" in r and objects() == [], "remove deletes it from the cluster",
   [r, objects()])
r = e.cmd("block-dirty-bitmap-add", node="r", name="b1", persistent=True)
ok("return" in r, "a new persistent bitmap", r)

# 5. A crash with the bitmap open: inconsistent at the next open.
e.stop(signal.SIGKILL)
f = Daemon("f")
bm = f.bitmaps() if f.f else None
ok(bm and bm[0]["name"] == "b1" and bm[0].get("inconsistent") is True,
   "after kill -9 the bitmap is inconsistent", bm or f.output())
r = f.cmd("block-dirty-bitmap-remove", node="r", name="b1")
ok("return" in r and objects() == [], "an inconsistent bitmap can be removed",
   [r, objects()])
f.stop()

# 6. A bitmap whose bits would not fit one object is refused, with a
# reason (the limit as this client's configuration gives it).
g = Daemon("g", **{"__org.iocore_conf": {"osd_max_object_size": "1024"}})
r = g.cmd("block-dirty-bitmap-add", node="r", name="big", persistent=True,
          granularity=65536) if g.f else {}
ok("File too large" in r.get("error", {}).get("desc", ""),
   "a bitmap larger than osd_max_object_size is refused", r or g.output())
r = g.cmd("block-dirty-bitmap-add", node="r", name="big", persistent=False,
          granularity=65536) if g.f else {}
ok("return" in r, "a bitmap that is not persistent is not limited", r)
g.stop()
ok(objects() == [], "nothing left in the cluster", objects())

# 7. The OSD stops answering while a persistent bitmap is being added: the
# add waits on the cluster (the monitor's commands wait behind it), while a
# local file's export on the same daemon keeps serving; once the OSD runs
# again the add completes and the command that waited is answered.
h = Daemon("h")
img = os.path.join(DIR, "local.raw")
with open(img, "wb") as fh:
    fh.truncate(16 << 20)
r1 = h.cmd("blockdev-add", driver="file", **{"node-name": "f"}, filename=img) if h.f else {}
r2 = h.cmd("block-export-add", type="nbd", id="lf", **{"node-name": "f"}, name="f",
           writable=True) if h.f else {}
ok("return" in r1 and "return" in r2, "daemon h exports a local file too", [r1, r2])
m2 = socket.socket(socket.AF_UNIX)
m2.settimeout(60)
m2.connect(h.q)


def m2_line(timeout):
    """The next line from the second monitor connection, "" if none came
    in TIMEOUT seconds (recv on the socket: a file object would be broken
    by the first timeout)."""
    buf = b""
    m2.settimeout(timeout)
    try:
        while not buf.endswith(b"\n"):
            c = m2.recv(1)
            if not c:
                break
            buf += c
    except OSError:
        pass
    return buf.decode()


def stalled(pid, what, execute, arguments, io, queued=False):
    """EXECUTE (as id WHAT) on the second connection while PID (an OSD or
    the monitor) is stopped: no answer while it is, qemu-io's IO on the
    local export meanwhile, the answer once PID runs again.  QUEUED: a
    query sent meanwhile on the first connection, answered after it."""
    os.kill(pid, signal.SIGSTOP)
    m2.sendall((json.dumps({"execute": execute, "id": what,
                            "arguments": arguments}) + "\n").encode())
    early = m2_line(3)
    ok(early == "", "%s waits while the cluster is stopped" % what, early)
    if queued:
        h.f.write('{"execute": "query-block-exports", "id": "queued"}\n')
        h.f.flush()
    cmds = [a for c in io for a in ("-c", c)]
    try:
        rc, out = run("qemu-io", "-f", "raw", *cmds, "nbd+unix:///f?socket=" + h.s,
                      timeout=60)
    except subprocess.TimeoutExpired:
        rc, out = -1, "qemu-io did not finish in 60 s"
    ok(rc == 0, "meanwhile the local file's export serves (%s)" % what, out)
    os.kill(pid, signal.SIGCONT)
    try:
        late = json.loads(m2_line(120))
    except ValueError as e:
        late = {"exception": str(e)}
    ok("return" in late and late.get("id") == what, "%s completes once it runs" % what,
       late)


m2_line(60)
m2.sendall(b'{"execute": "qmp_capabilities"}\n')
m2_line(60)
stalled(OSD_PID, "bitmap-add", "block-dirty-bitmap-add",
        {"node": "r", "name": "late", "persistent": True},
        ["write -P 0x5a 0 64k", "read -P 0x5a 0 64k"], queued=True)
q = None
try:
    while q is None or "event" in q:
        q = json.loads(h.f.readline())
except (OSError, ValueError) as e:
    q = {"exception": str(e)}
ok(q.get("id") == "queued" and "return" in q, "the query that waited is answered", q)
bm = h.bitmaps()
ok(any(b["name"] == "late" and b["persistent"] for b in bm) and len(objects()) == 1,
   "the bitmap is in the cluster", [bm, objects()])
r = h.cmd("block-dirty-bitmap-remove", node="r", name="late")
ok("return" in r and objects() == [], "and is removed from it", [r, objects()])

# 8. The same with the Ceph monitor stopped during a blockdev-add: the
# connect waits on the loop's thread pool, the local export serves.
stalled(MON_PID, "blockdev-add", "blockdev-add",
        {"driver": "rbd", "node-name": "r2", "pool": "rbd", "image": "img", "conf": CONF,
         "read-only": True}, ["read -P 0x5a 0 64k"])
names = [x["node-name"] for x in h.cmd("query-named-block-nodes")["return"]]
ok("r2" in names, "the new rbd node is in the graph", names)

# 9. block_resize with the OSD stopped: the same.
stalled(OSD_PID, "block_resize", "block_resize", {"node-name": "r", "size": 2 << 30},
        ["read -P 0x5a 0 64k"])
rc, out = run("rbd", "-c", CONF, "info", "rbd/img")
ok(rc == 0 and "2 GiB" in out, "the image has its new size", out)
r = h.cmd("block_resize", **{"node-name": "r"}, size=1 << 30)
ok("return" in r, "and shrinks back", r)

# 10. blockdev-del of the writable rbd node with the OSD stopped: its
# close (the exclusive lock's release) waits on the loop's thread pool.
r = h.cmd("blockdev-del", **{"node-name": "r2"})
ok("return" in r, "the read-only rbd node is deleted", r)
stalled(OSD_PID, "blockdev-del", "blockdev-del", {"node-name": "r"},
        ["read -P 0x5a 0 64k"])
names = [x["node-name"] for x in h.cmd("query-named-block-nodes")["return"]]
ok("r" not in names and "r2" not in names, "both rbd nodes left the graph", names)
m2.close()
ok(h.stop() == 0, "daemon h stops cleanly", h.output())

sys.exit(qmptap.plan())
