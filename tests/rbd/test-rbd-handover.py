#!/usr/bin/env python3
"""Hand-over migration of an rbd node (capability __org.iocore_handover).

Run by test-rbd-handover.sh on a fresh one-host cluster (CEPH_CONF).  Each
iocore-nbd below is a separate process on rbd/img, as separate hosts
would be:
 1. A serves the image; migrate without the capability is refused, naming
    it; a persistent bitmap is added on A.
 2. A hands the image over to B (iocore-nbd --incoming) while a verifying
    writer writes 4 KiB blocks: it loses no acknowledged write (every one
    reads back from B), the lock moves from A to B, and B lists A's
    bitmap, consistent.
 3. B to C, cancelled while C (stopped) has not answered: B serves on and
    holds the lock again.  B to D, D killed before it answered: the same.
    B to a stopped destination with __org.iocore_handover-timeout 1000:
    failed, naming the timeout, and the same.
 4. Refusals: a destination with another image (B serves on), a file node
    with the capability.
 5. B stops cleanly: no lock left.
 6. iocore-storage-daemon's export of an rbd node hands over the same way.
 7. The OSD stopped (SIGSTOP) after writes that librbd's cache holds, a
    client's flush waiting for it inside the node, then a hand-over: the
    source's control socket still answers (query-migrate
    within seconds; its bitmap commands refuse the node), and once the
    OSD goes on (SIGCONT) the hand-over completes, every write on the
    destination.
 8. Again, the source stopped (SIGTERM) meanwhile: it exits cleanly once
    the OSD goes on, leaving no lock.
 9. Over TLS (PSK, tls-creds): a destination with another key refuses the
    handshake (the source serves on with the lock); one with the key
    takes the image over.  Skipped without psktool (gnutls-bin).
TAP on stdout; every wait is bounded; nothing asserts on timing."""
import atexit, json, os, shutil, signal, socket, struct, subprocess, sys, tempfile
import threading, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import qmptap  # noqa: E402
from qmptap import run, tap  # noqa: E402

NBD, CONF, DAEMON = sys.argv[1], sys.argv[2], sys.argv[3]
DIR = tempfile.mkdtemp(prefix="ioc-rbdho.", dir=os.environ.get("CEPH_DIR", "/tmp"))
IMG = "rbd:rbd/img:conf=" + CONF
started = []


@atexit.register
def cleanup():
    """Whatever happened, no server outlives the test."""
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
    shutil.rmtree(DIR, ignore_errors=True)


def ok(cond, name, info=""):
    tap(cond, name, info, lines=-15)


def locker(img="rbd/img"):
    """The client that holds img's exclusive lock, or None."""
    rc, out = run("rbd", "-c", CONF, "lock", "ls", "--format", "json", img)
    try:
        locks = json.loads(out)
    except ValueError:
        return "?" + out
    if isinstance(locks, dict):
        locks = list(locks.values())
    return locks[0]["locker"] if len(locks) == 1 else None if not locks else repr(locks)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- a small NBD client (simple replies) ----------------------------------

REQ_MAGIC, SIMPLE_REPLY = 0x25609513, 0x67446698
OPTS_MAGIC, OPT_REPLY_MAGIC = 0x49484156454F5054, 0x3E889045565A9
BS = 4096


class NbdError(Exception):
    pass


def recv_all(s, k):
    b = bytearray()
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            raise NbdError("closed")
        b += c
    return bytes(b)


class Nbd:
    def __init__(self, path):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        s.connect(path)
        self.s, self.h = s, 0
        magic, opts, _ = struct.unpack(">8sQH", recv_all(s, 18))
        if magic != b"NBDMAGIC" or opts != OPTS_MAGIC:
            raise NbdError("greeting")
        s.sendall(struct.pack(">I", 3))
        data = struct.pack(">IH", 0, 0)
        s.sendall(struct.pack(">QII", OPTS_MAGIC, 7, len(data)) + data)
        while True:
            m, _o, t, ln = struct.unpack(">QIII", recv_all(s, 20))
            recv_all(s, ln)
            if m != OPT_REPLY_MAGIC or (t & 0x80000000):
                raise NbdError("GO refused")
            if t == 1:
                break

    def req(self, cmd, off, data=b"", length=0):
        self.h += 1
        ln = len(data) or length
        self.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, cmd, self.h, off, ln) + data)
        magic, err, handle = struct.unpack(">IIQ", recv_all(self.s, 16))
        if magic != SIMPLE_REPLY or handle != self.h:
            raise NbdError("bad reply")
        if err:
            raise NbdError("error %d" % err)
        return recv_all(self.s, ln) if cmd == 0 else None

    def close(self):
        try:
            self.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 2, 0, 0, 0))
        except OSError:
            pass
        self.s.close()


def block(b, seq):
    return struct.pack(">QQ", b, seq) * (BS // 16)


def writes_back(srv, b, seq, read=True):
    """True if srv takes a write of block b (seq) and, with read, reads
    it back; else why not."""
    try:
        k = Nbd(srv.sock)
        k.req(1, b * BS, block(b, seq))
        back = not read or k.req(0, b * BS, length=BS) == block(b, seq)
        k.close()
        return back
    except (OSError, NbdError) as ex:
        return str(ex)


class Writer(threading.Thread):
    """Writes blocks 0..NB-1 in turn, each with a new sequence number, to
    the server at self.target; a failed write is uncertain (it may or may
    not have landed), and the writer reconnects to self.target (which the
    test moves to the destination) and goes on."""
    NB = 1024

    def __init__(self, path):
        super().__init__(daemon=True)
        self.target, self.stop, self.seq = path, False, 0
        self.acked = {}         # block -> last acknowledged seq
        self.maybe = {}         # block -> seqs sent after it, unacknowledged
        self.errors, self.reconnects, self.max_pause, self.bad = 0, 0, 0.0, ""
        self.writes = 0

    def connect(self):
        end = time.time() + 20
        while time.time() < end and not self.stop:
            try:
                return Nbd(self.target)
            except (OSError, NbdError):
                time.sleep(0.01)
        return None

    def run(self):
        c, last_ok, b = self.connect(), time.time(), 0
        while not self.stop and c:
            self.seq += 1
            try:
                c.req(1, b * BS, block(b, self.seq))
            except (OSError, NbdError):
                self.errors += 1
                self.maybe.setdefault(b, set()).add(self.seq)
                c.s.close()
                c = self.connect()
                self.reconnects += 1
                continue
            now = time.time()
            self.max_pause = max(self.max_pause, now - last_ok)
            last_ok = now
            self.acked[b] = self.seq
            self.maybe.pop(b, None)
            self.writes += 1
            b = (b + 1) % self.NB
        if c:
            c.close()
        if not c and not self.stop:
            self.bad = "could not reconnect to " + self.target

    def verify(self, path):
        """Every block reads back as its last acknowledged write, or as a
        write sent after it whose answer was lost."""
        c, wrong = Nbd(path), []
        for b in range(self.NB):
            got = c.req(0, b * BS, length=BS)
            want = self.acked.get(b, 0)
            gb, gs = struct.unpack(">QQ", got[:16])
            if want == 0 and got == bytes(BS) or \
               got == block(b, gs) and gb == b and (gs == want or gs in self.maybe.get(b, ())):
                continue
            wrong.append((b, want, gs))
        c.close()
        return wrong


# ---- iocore-nbd and its control socket --------------------------------------

class Server:
    def __init__(self, tag, image=IMG, incoming=None, extra=(), argv=None):
        self.tag = tag
        self.sock = os.path.join(DIR, tag + ".sock")
        self.ctl = os.path.join(DIR, tag + ".ctl")
        self.logf = os.path.join(DIR, tag + ".log")
        self.log = open(self.logf, "w+")
        cmd = [NBD, "-v", "-U", self.sock, "--control", self.ctl, "--iothreads", "1"]
        if incoming:
            cmd += ["--incoming", incoming]
        cmd += list(extra) + [image]
        if argv:
            cmd = argv(self)
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        started.append(self.p)
        self.f, self.events = None, []
        want = "waiting for an incoming migration" if incoming else "serving"
        up = (lambda: os.path.exists(self.ctl) and os.path.exists(self.sock)) if argv else \
            (lambda: want in self.output())
        for _ in range(600):
            if self.p.poll() is not None or up():
                break
            time.sleep(0.05)
        if self.p.poll() is None and up():
            self.connect()

    def connect(self):
        """A (new) connection to the control socket."""
        if self.f:
            self.sk.close()
        sk = socket.socket(socket.AF_UNIX)
        sk.settimeout(60)
        sk.connect(self.ctl)
        # Two files: a text file that reads and writes drops what it
        # read ahead at each write (an event behind a reply).
        self.sk, self.f, self.w = sk, sk.makefile("r"), sk.makefile("w")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd_within(self, secs, c, **a):
        """c's reply if it comes within secs, else None (a connection
        that timed out is made again, once the server answers)."""
        self.sk.settimeout(secs)
        try:
            return self.cmd(c, **a)
        except OSError:
            return None
        finally:
            self.sk.settimeout(60)

    def output(self):
        with open(self.logf) as f:
            return f.read()

    def cmd(self, c, **a):
        m = {"execute": c}
        if a:
            m["arguments"] = a
        self.w.write(json.dumps(m) + "\n")
        self.w.flush()
        while True:
            r = json.loads(self.f.readline())
            if "event" not in r:
                return r
            if r["event"] == "MIGRATION":
                self.events.append(r["data"]["status"])

    def caps(self, c):
        return self.cmd("migrate-set-capabilities", capabilities=[
            {"capability": k, "state": v} for k, v in c.items()])

    def status(self):
        return self.cmd("query-migrate")["return"]

    def wait(self, *want, secs=30):
        end = time.time() + secs
        q = {}
        while time.time() < end:
            q = self.status()
            if q.get("status") in want:
                return q
            time.sleep(0.02)
        return q

    def bitmaps(self):
        nodes = self.cmd("query-named-block-nodes")["return"]
        return nodes[0].get("dirty-bitmaps", []) if nodes else []

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


def handover(src, tag, **kw):
    port = free_port()
    dst = Server(tag, incoming="tcp:127.0.0.1:%d" % port, **kw)
    return dst, "tcp:127.0.0.1:%d" % port


# 1. The source, and what it refuses.
a = Server("a")
ok(a.f is not None, "A serves rbd/img", a.output())
lock_a = locker()
ok(lock_a and not lock_a.startswith("?"), "A holds the exclusive lock", lock_a)
r = a.cmd("migrate", uri="tcp:127.0.0.1:1")
ok("__org.iocore_handover" in r.get("error", {}).get("desc", ""),
   "migrate of an rbd node without the capability is refused, naming it", r)
r = a.cmd("block-dirty-bitmap-add", node="", name="b0", persistent=True,
          granularity=65536)
ok("return" in r, "a persistent bitmap on A", r)
ok("return" in a.caps({"__org.iocore_handover": True, "events": True}), "the capability is set")
caps = a.cmd("query-migrate-capabilities")["return"]
ok({"capability": "__org.iocore_handover", "state": True} in caps,
   "query-migrate-capabilities lists it", caps)

a.caps({"pause-before-switchover": True})
r = a.cmd("migrate", uri="tcp:127.0.0.1:1")
ok("pause-before-switchover" in r.get("error", {}).get("desc", ""),
   "pause-before-switchover is refused with it", r)
a.caps({"pause-before-switchover": False})

# 2. A to B under a verifying writer.
b, uri = handover(a, "b")
ok(b.f is not None, "B waits for the hand-over", b.output())
ok(locker() == lock_a, "B took no lock while waiting", locker())
w = Writer(a.sock)
w.start()
for _ in range(400):
    if w.writes >= 200 or not w.is_alive():
        break
    time.sleep(0.01)
w.target = b.sock
r = a.cmd("migrate", uri=uri)
ok("return" in r, "migrate A to B", r)
q = a.wait("completed", "failed", "cancelled")
ok(q.get("status") == "completed" and q.get("__org.iocore_mode") == "handover",
   "A's query-migrate: completed, mode handover", q)
ok(q.get("disk", {}).get("transferred", 1 << 30) < 4096,
   "no image data went over the stream", q)
for _ in range(100):
    if "completed" in a.events:
        break
    a.cmd("query-migrate")
    time.sleep(0.02)
ok(a.events == ["setup", "active", "device", "completed"],
   "A's MIGRATION events: setup, active, device, completed", a.events)
down_ms = q.get("downtime", -1)
ok(down_ms >= 0, "A reports the downtime (%s ms)" % down_ms, q)
qb = b.wait("completed", "failed")
ok(qb.get("status") == "completed", "B's query-migrate: completed", qb)
writes_at_switch = w.writes
for _ in range(400):
    if w.writes >= writes_at_switch + 200 or not w.is_alive():
        break
    time.sleep(0.01)
w.stop = True
w.join(30)
ok(w.writes > writes_at_switch and not w.bad and w.errors <= 2,
   "the writer went on on B (%d writes, %d failed at the switch, largest pause %.1f ms)"
   % (w.writes, w.errors, w.max_pause * 1000), w.bad)
wrong = w.verify(b.sock)
ok(not wrong, "every acknowledged write reads back from B", wrong[:5])
lock_b = locker()
ok(lock_b and lock_b != lock_a and not lock_b.startswith("?"),
   "the lock moved from A (%s) to B (%s)" % (lock_a, lock_b))
bm = b.bitmaps()
ok(bm and bm[0]["name"] == "b0" and bm[0]["persistent"] and
   not bm[0].get("inconsistent", False) and bm[0]["count"] > 0,
   "B lists A's persistent bitmap, consistent, with A's writes", bm)
try:
    Nbd(a.sock).close()
    served = True
except (OSError, NbdError):
    served = False
ok(not served, "A serves no more")
a.stop()
ok("return" in b.caps({"__org.iocore_handover": True}), "B, now the source, takes the capability")

# 3. Cancel, a destination that dies, and one that does not answer in
# time, before the answer.
TO = "__org.iocore_handover-timeout"
r = b.cmd("migrate-set-parameters", **{TO: 99})
ok("between 100 and 3600000" in r.get("error", {}).get("desc", ""),
   "a hand-over timeout under 100 ms is refused", r)
r = b.cmd("query-migrate-parameters")
ok(r.get("return", {}).get(TO) == 30000, "the hand-over timeout is 30 s by default", r)
for what in ("cancel", "kill", "timeout"):
    if what == "timeout":
        r = b.cmd("migrate-set-parameters", **{TO: 1000})
        ok("return" in r, "B waits 1000 ms for the destination's answer", r)
    c, uri = handover(b, "c-" + what)
    os.kill(c.p.pid, signal.SIGSTOP)
    r = b.cmd("migrate", uri=uri)
    if what != "timeout":  # (its device phase may be over before a query)
        q = b.wait("device", "failed", "completed")
        ok("return" in r and q.get("status") == "device",
           "%s: B let go and waits for the destination's answer" % what, [r, q])
        ok(locker() is None, "%s: meanwhile nobody holds the lock" % what, locker())
    if what == "cancel":
        b.cmd("migrate_cancel")
        q = b.wait("cancelled", "failed", "completed")
        c.stop(signal.SIGKILL)
        ok(q.get("status") == "cancelled", "migrate_cancel: cancelled", q)
    elif what == "kill":
        c.stop(signal.SIGKILL)
        q = b.wait("cancelled", "failed", "completed")
        ok(q.get("status") == "failed" and "destination" in q.get("error-desc", ""),
           "a destination killed before its answer: failed", q)
    else:
        q = b.wait("cancelled", "failed", "completed")
        c.stop(signal.SIGKILL)
        ok(q.get("status") == "failed" and "within 1000 ms" in q.get("error-desc", ""),
           "a destination that does not answer in 1000 ms: failed", q)
        b.cmd("migrate-set-parameters", **{TO: 30000})
    back = writes_back(b, 0, 99999)
    ok(back is True, "%s: B serves on, and writes" % what, back)
    ok(locker() == lock_b, "%s: B holds the lock again" % what, locker())

# 4. Refusals.
run("rbd", "-c", CONF, "create", "rbd/img2", "--size", "1G")
e, uri = handover(b, "e", image="rbd:rbd/img2:conf=" + CONF)
r = b.cmd("migrate", uri=uri)
q = b.wait("failed", "completed", "cancelled")
ok(q.get("status") == "failed" and "refused" in q.get("error-desc", ""),
   "a destination with another image refuses (B: %s)" % q.get("error-desc"), q)
rc = e.p.wait(timeout=30)
ok(rc != 0 and "hands over rbd:rbd//img;" in e.output(),
   "that destination says why and exits non-zero", e.output())
back = writes_back(b, 1, 5, read=False)
ok(back is True and locker() == lock_b, "B serves on with the lock", [back, locker()])

fimg = os.path.join(DIR, "file.img")
with open(fimg, "wb") as f:
    f.truncate(1 << 20)
fsrv = Server("f", image=fimg)
fsrv.caps({"__org.iocore_handover": True})
r = fsrv.cmd("migrate", uri="tcp:127.0.0.1:1")
ok("shared storage" in r.get("error", {}).get("desc", ""),
   "a file node with the capability is refused", r)
fsrv.stop()

# 5. A clean stop lets the lock go.
ok(b.stop() == 0, "B stops cleanly", b.output())
ok(locker() is None, "no lock is left", locker())

# 6. The storage daemon's export, handed over to iocore-nbd.
node = {"driver": "rbd", "node-name": "r", "pool": "rbd", "image": "img", "conf": CONF}
d = Server("d", argv=lambda sv: [DAEMON, "--blockdev", json.dumps(node),
    "--nbd-server", "addr.type=unix,addr.path=" + sv.sock,
    "--export", "type=nbd,id=e,node-name=r,name=,writable=on",
    "--chardev", "socket,id=m,path=%s,server=on,wait=off" % sv.ctl, "--monitor", "chardev=m"])
ok(d.f is not None, "iocore-storage-daemon exports the rbd node", d.output())
lock_d = locker()
g, uri = handover(d, "g")
r = d.cmd("migrate", uri=uri)
ok("__org.iocore_handover" in r.get("error", {}).get("desc", ""),
   "the daemon refuses it without the capability", r)
d.caps({"__org.iocore_handover": True})
r = d.cmd("migrate", uri=uri)
q = d.wait("completed", "failed", "cancelled")
ok("return" in r and q.get("status") == "completed" and q.get("__org.iocore_mode") ==
   "handover", "the daemon hands its export over", [r, q])
ok(lock_d and locker() not in (None, lock_d), "the lock moved to the destination",
   [lock_d, locker()])
back = writes_back(g, 2, 7)
ok(back is True, "the destination serves it", back)
d.stop()
ok(g.stop() == 0 and locker() is None, "both stop; no lock is left", locker())

# 7. An OSD that stops answering while the source lets go.
OSD = int(os.environ.get("CEPH_OSD_PID", "0") or 0)
osd_stopped = [False]


@atexit.register
def osd_cont():
    """Registered after cleanup(), so run before it: the OSD goes on."""
    if osd_stopped[0]:
        os.kill(OSD, signal.SIGCONT)
        osd_stopped[0] = False


IMG3 = "rbd:rbd/img3:conf=" + CONF
run("rbd", "-c", CONF, "create", "rbd/img3", "--size", "64M")
# H's cache holds its writes until a flush (librbd writes back after a
# second by default: on a busy machine before the OSD is stopped).
HELD = IMG3 + ":rbd_cache_max_dirty_age=3600"
h = Server("h", image=HELD)
ok(h.f is not None and OSD > 0, "H serves rbd/img3 (the OSD is pid %d)" % OSD, h.output())
h.caps({"__org.iocore_handover": True})
lock_h = locker("rbd/img3")
i, uri = handover(h, "i", image=HELD)
NW = 64


def dirty(srv, seq):
    """Writes that librbd's cache holds when the OSD stops right after:
    a write and a flush first (the cache is write-through until a flush
    comes after a write), then NW blocks, which it holds back (H's
    rbd_cache_max_dirty_age); so the hand-over's flush has work, and is
    what waits for the OSD."""
    k = Nbd(srv.sock)
    k.req(1, 0, block(0, seq))
    k.req(3, 0)
    for bl in range(NW):
        k.req(1, bl * BS, block(bl, seq + bl))
    k.close()
    os.kill(OSD, signal.SIGSTOP)
    osd_stopped[0] = True


dirty(h, 7000)
# A client's flush, which waits for the OSD inside the node: the hold
# drains it, and must not hold the main loop meanwhile.
kf = Nbd(h.sock)
kf.h += 1
kf.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 3, kf.h, 0, 0))
r = h.cmd("migrate", uri=uri)
time.sleep(2)  # the thread connects and asks the main loop to let go
q = h.cmd_within(10, "query-migrate")
ok(q is not None and q.get("return", {}).get("status") == "active",
   "the OSD stopped, a flush inside the node: H's query-migrate answers "
   "while it lets go", [r, q, h.output()])
r = q and h.cmd_within(10, "block-dirty-bitmap-add", node="", name="b9",
                       persistent=True)
ok(r is not None and "handed over" in r.get("error", {}).get("desc", ""),
   "a bitmap command is refused meanwhile, not left to wait for the OSD", r)
osd_cont()
if r is None:
    h.connect()  # that one timed out
q = h.wait("completed", "failed", "cancelled", secs=90)
ok(q.get("status") == "completed", "the OSD goes on: the hand-over completes", q)
try:
    magic, err, handle = struct.unpack(">IIQ", recv_all(kf.s, 16))
    flushed = (magic == SIMPLE_REPLY and handle == kf.h, err)
except OSError as ex:
    flushed = str(ex)
kf.s.close()
ok(flushed == (True, 0), "the client's flush was answered, with success", flushed)
qi = i.wait("completed", "failed", secs=30)
ok(qi.get("status") == "completed", "I's query-migrate: completed", qi)
try:
    k = Nbd(i.sock)
    wrong = [bl for bl in range(NW) if k.req(0, bl * BS, length=BS) != block(bl, 7000 + bl)]
    k.close()
except (OSError, NbdError) as ex:
    wrong = str(ex)
ok(wrong == [], "every write made before the OSD stopped reads back from I", wrong)
lock_i = locker("rbd/img3")
ok(lock_h and lock_i and lock_i != lock_h and not lock_i.startswith("?"),
   "the lock of rbd/img3 moved from H to I", [lock_h, lock_i])
h.stop()

# 8. I stopped (SIGTERM) while it lets go to J with the OSD stopped: its
# stop waits for the node change, takes the image back and exits cleanly
# once the OSD goes on.
ok("return" in i.caps({"__org.iocore_handover": True}), "I takes the capability")
j, uri = handover(i, "j", image=IMG3)
dirty(i, 8000)
r = i.cmd("migrate", uri=uri)
q = i.cmd_within(10, "query-migrate")
ok(q is not None and q.get("return", {}).get("status") in ("setup", "active"),
   "the OSD stopped again: I's query-migrate answers while it lets go", [r, q])
i.p.send_signal(signal.SIGTERM)
for _ in range(300):  # its loop ends (-v says so); the node change waits on
    if ": stopping:" in i.output():
        break
    time.sleep(0.1)
ok(": stopping:" in i.output(), "I takes the SIGTERM while the OSD is stopped",
   i.output())
osd_cont()
try:
    rc = i.p.wait(timeout=60)
except subprocess.TimeoutExpired:
    rc = None
ok(rc == 0, "I, stopped meanwhile, exits cleanly once the OSD goes on (%s)" % rc,
   i.output())
j.stop(signal.SIGKILL)
ok(locker("rbd/img3") is None, "no lock of rbd/img3 is left", locker("rbd/img3"))

# 9. Over TLS: the stream's handshake, then the same hand-over.
if shutil.which("psktool"):
    keys, wrong = os.path.join(DIR, "keys.psk"), os.path.join(DIR, "wrong.psk")
    for f in (keys, wrong):
        run("psktool", "-u", "alice", "-p", f)
    tls = lambda f: ["--tls", "on", "--tls-psk", f]  # noqa: E731
    t = Server("t", image=IMG3, extra=tls(keys))
    ok(t.f is not None, "T serves rbd/img3 with TLS credentials", t.output())
    t.caps({"__org.iocore_handover": True})
    t.cmd("migrate-set-parameters", **{"tls-creds": "tls0"})
    lock_t = locker("rbd/img3")
    u, uri = handover(t, "u", image=IMG3, extra=tls(wrong))
    t.cmd("migrate", uri=uri)
    q = t.wait("completed", "failed", "cancelled")
    ok(q.get("status") == "failed" and "TLS" in q.get("error-desc", ""),
       "another key: the TLS handshake fails, naming it", q)
    u.stop(signal.SIGKILL)
    ok(lock_t and locker("rbd/img3") == lock_t, "T holds the lock again",
       [lock_t, locker("rbd/img3")])
    v, uri = handover(t, "v", image=IMG3, extra=tls(keys))
    r = t.cmd("migrate", uri=uri)
    q = t.wait("completed", "failed", "cancelled")
    ok(q.get("status") == "completed", "with the key: handed over over TLS", [r, q])
    ok(locker("rbd/img3") not in (None, lock_t), "the lock moved to V",
       [lock_t, locker("rbd/img3")])
    back = writes_back(v, 0, 9001)
    ok(back is True, "V serves it", back)
    t.stop()
    ok(v.stop() == 0 and locker("rbd/img3") is None, "both stop; no lock is left",
       locker("rbd/img3"))
else:
    print("# psktool missing (gnutls-bin): no TLS hand-over")

sys.exit(qmptap.plan())
