#!/usr/bin/python3
"""iocore-storage-daemon against qemu-storage-daemon: the same command line
and the same QMP exchanges, replies compared.

Both daemons start with one file node, an iothread, an NBD server and an
NBD export on it, then take the same list of commands: nodes added,
exported (a second export on the iothread too), queried, read and written by qemu-io,
deleted with a client connected in each mode, and wrong arguments, unknown drivers and nodes still in use.
For each step the replies must be of the same kind (return or error),
with the same error class and text, the same shape (every member iocore
sends exists in QEMU's reply with the same JSON type, and every member of
QEMU's is there, but for the short list in MISSING, each with its reason),
and the same events.  Where iocore must answer otherwise, DIFFERS says so
and why, and the step checks iocore's answer on its own.

Prints TAP; exit 77 when qemu-storage-daemon or qemu-io is missing.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import qmptap  # noqa: E402
from qmptap import Qmp, tap  # noqa: E402

try:
    import nbd
except ImportError:
    nbd = None


# Members QEMU sends that iocore does not, with the reason.
MISSING = {
    # QEMU's file driver counts discards it passed down; iocore's node
    # layer counts them in unmap_operations already.
    "driver-specific",
}


def shape(q, i, path=""):
    """Differences of shape: i's members must be in q with the same JSON
    type; q's must be in i, but for MISSING."""
    out = []
    if type(q) != type(i) and not (isinstance(q, (int, float)) and isinstance(i, (int, float))
                                   and not isinstance(q, bool) and not isinstance(i, bool)):
        return ["%s: %s vs %s" % (path or "/", type(q).__name__, type(i).__name__)]
    if isinstance(q, dict):
        for k in i:
            if k not in q:
                out.append("%s/%s: only iocore has it" % (path, k))
            else:
                out += shape(q[k], i[k], path + "/" + k)
        for k in q:
            if k not in i and k not in MISSING:
                out.append("%s/%s: iocore lacks it" % (path, k))
    elif isinstance(q, list) and q and i:
        out += shape(q[0], i[0], path + "[0]")
    return out


def same(step, rq, ri, exact=False, values=()):
    """One step: the same kind, class, text (for errors) and shape."""
    if rq is None or ri is None:
        tap(False, step, "no reply: qsd %r iocore %r" % (rq, ri))
        return
    if ("error" in rq) != ("error" in ri):
        tap(False, step, "qsd:    %s\niocore: %s" % (json.dumps(rq), json.dumps(ri)))
        return
    if "error" in rq:
        ok = rq["error"] == ri["error"]
        tap(ok, step + ": " + rq["error"]["class"] + " as qemu-storage-daemon",
            "qsd:    %s\niocore: %s" % (json.dumps(rq), json.dumps(ri)))
        return
    d = shape(rq["return"], ri["return"])
    for v in values:
        if v(rq["return"]) != v(ri["return"]):
            d.append("value differs: qsd %r iocore %r" % (v(rq["return"]), v(ri["return"])))
    if exact and rq["return"] != ri["return"]:
        d.append("qsd %s\niocore %s" % (json.dumps(rq["return"]), json.dumps(ri["return"])))
    tap(not d, step + ": return as qemu-storage-daemon", "\n".join(d))


def wait_path(p, proc, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(p):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def qemu_io(sock, name, *cmds):
    args = ["qemu-io", "-f", "raw"]
    for c in cmds:
        args += ["-c", c]
    args.append("nbd+unix:///%s?socket=%s" % (name, sock))
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


class Daemon:
    def __init__(self, exe, tmp, tag):
        self.dir = os.path.join(tmp, tag)
        os.mkdir(self.dir)
        self.img = os.path.join(self.dir, "a.img")
        self.img2 = os.path.join(self.dir, "b.img")
        for p in (self.img, self.img2):
            with open(p, "wb") as f:
                f.truncate(64 << 20)
        self.qmp_path = os.path.join(self.dir, "qmp.sock")
        self.nbd = os.path.join(self.dir, "nbd.sock")
        self.proc = subprocess.Popen(exe + [
            "--blockdev", "driver=file,node-name=disk,filename=" + self.img,
            "--object", "iothread,id=io0",
            "--nbd-server", "addr.type=unix,addr.path=" + self.nbd,
            "--export", "type=nbd,id=exp0,node-name=disk,name=disk,writable=on,iothread=io0",
            "--chardev", "socket,id=mon0,path=%s,server=on,wait=off" % self.qmp_path,
            "--monitor", "chardev=mon0"], stderr=subprocess.PIPE, text=True)
        if not wait_path(self.qmp_path, self.proc) or not wait_path(self.nbd, self.proc):
            raise RuntimeError("%s did not start: %s" % (exe[0], self.proc.stderr.read()))
        self.q = Qmp(self.qmp_path)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def both(a, b, cmd_, **args):
    """cmd_ on both, each reply with its daemon's directory written "@"."""
    return a.q.cmd(cmd_, **args), b.q.cmd(cmd_, **args)


def norm(r, d):
    return json.loads(json.dumps(r).replace(d.dir, "@"))


def main():
    qsd = shutil.which("qemu-storage-daemon")
    if not qsd or not shutil.which("qemu-io") or nbd is None:
        print("1..0 # SKIP qemu-storage-daemon, qemu-io or python3-libnbd not installed")
        return 0 if os.environ.get("IOC_TAP_ONLY") else 77
    build = os.environ.get("IOC_BUILD_ROOT", "build")
    ioc = os.path.join(build, "tools/daemon/iocore-storage-daemon")
    if os.environ.get("IOC_CROSS_BUILD"):
        # The comparison is about replies, not the target: a cross build's
        # daemon runs under its emulator, which the command lines do not
        # name; the native suite runs it.
        print("1..0 # SKIP a cross build (the native suite compares the daemons)")
        return 0 if os.environ.get("IOC_TAP_ONLY") else 77
    tmp = tempfile.mkdtemp(prefix="ioc-daemon-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                           else None)
    a = b = None
    try:
        a = Daemon([qsd], tmp, "qsd")
        b = Daemon([ioc], tmp, "ioc")
        run_steps(a, b)
        cli_steps(qsd, ioc)
    finally:
        for d in (a, b):
            if d:
                d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return qmptap.plan()


# Command lines both must refuse, with the same message after the name.
BAD_LINES = [
    ["--blockdev", "driver=file,node-name=x,filename=/nonexistent/x"],
    ["--blockdev", "driver=bogus,node-name=x"],
    ["--blockdev", "driver=file,node-name=x,filename=/dev/null,read-only=maybe"],
    ["--blockdev", "driver=file,node-name=x,filename=/dev/null,bogus=1"],
    ["--export", "type=nbd,id=e,node-name=nosuch"],
    ["--object", "bogus,id=x"],
    ["--nbd-server", "addr.type=unix"],
    ["--blockdev", '{"driver": "file", "node-name": "x"}'],
]


def cli_steps(qsd, ioc):
    for line in BAD_LINES:
        out = []
        for exe in (qsd, ioc):
            r = subprocess.run([exe] + line, capture_output=True, text=True, timeout=30)
            msg = r.stderr.strip().split(": ", 1)[-1] if r.stderr else ""
            out.append((r.returncode, msg))
        tap(out[0] == out[1] and out[0][0] != 0,
            "refused as qemu-storage-daemon refuses it: %s" % " ".join(line),
            "qsd:    %r\niocore: %r" % tuple(out))


def run_steps(a, b):
    same("query-version shape", *both(a, b, "query-version"))
    same("query-block-exports", *both(a, b, "query-block-exports"), exact=True)
    same("query-named-block-nodes", *both(a, b, "query-named-block-nodes"),
         values=[lambda r: [x["node-name"] for x in r], lambda r: [x["drv"] for x in r]])

    # Nodes.
    def add(**kw):
        ra = a.q.cmd("blockdev-add", **{k: (v.replace("@", a.dir) if isinstance(v, str) else v)
                                         for k, v in kw.items()})
        rb = b.q.cmd("blockdev-add", **{k: (v.replace("@", b.dir) if isinstance(v, str) else v)
                                         for k, v in kw.items()})
        return norm(ra, a), norm(rb, b)
    same("blockdev-add of a file", *add(driver="file", **{"node-name": "n1"},
                                        filename="@/b.img"))
    same("blockdev-add: a duplicate name", *add(driver="file", **{"node-name": "n1"},
                                                filename="@/b.img"))
    same("blockdev-add: an invalid name", *add(driver="file", **{"node-name": "1bad"},
                                               filename="@/b.img"))
    same("blockdev-add: no name", *add(driver="file", filename="@/b.img"))
    same("blockdev-add: an unknown driver", *add(driver="bogus", **{"node-name": "x"}))
    same("blockdev-add: a bad enum", *add(driver="file", **{"node-name": "x"},
                                          filename="@/b.img", aio="bogus"))
    same("blockdev-add: an unexpected member", *add(driver="file", **{"node-name": "x"},
                                                    filename="@/b.img", extra=1))
    same("blockdev-add: a missing file", *add(driver="file", **{"node-name": "x"},
                                              filename="@/none.img"))
    same("blockdev-add: a wrong type", *add(driver="file", **{"node-name": "x"},
                                            filename=5))
    same("blockdev-add: raw over a node", *add(driver="raw", **{"node-name": "r1"},
                                               file="n1"))
    same("blockdev-add: raw over a missing node", *add(driver="raw", **{"node-name": "r2"},
                                                       file="nosuch"))
    same("query-named-block-nodes after adds", *both(a, b, "query-named-block-nodes"),
         values=[lambda r: sorted(x["node-name"] for x in r)])

    # Exports.
    same("block-export-add", *both(a, b, "block-export-add", type="nbd", id="e1",
                                   **{"node-name": "r1"}, name="r1", writable=True))
    same("block-export-add: a duplicate id", *both(a, b, "block-export-add", type="nbd",
                                                   id="e1", **{"node-name": "r1"}))
    same("block-export-add: a missing node", *both(a, b, "block-export-add", type="nbd",
                                                   id="e2", **{"node-name": "nosuch"}))
    same("block-export-add: a missing iothread", *both(a, b, "block-export-add",
                                                       type="nbd", id="e2",
                                                       **{"node-name": "r1"},
                                                       iothread="nosuch"))
    same("block-export-add: a missing member", *both(a, b, "block-export-add", type="nbd",
                                                     id="e2"))
    same("query-block-exports with two", *both(a, b, "query-block-exports"), exact=True)

    # A client writes and reads both.
    for d in (a, b):
        r = qemu_io(d.nbd, "r1", "write -P 0x3c 0 256k", "read -P 0x3c 0 256k",
                    "discard 1M 64k")
        tap(r.returncode == 0 and "Pattern verification failed" not in r.stdout,
            "qemu-io writes and reads through %s" % d.dir.split("/")[-1], r.stdout + r.stderr)
    with open(a.img2, "rb") as fa, open(b.img2, "rb") as fb:
        tap(fa.read(1 << 20) == fb.read(1 << 20), "the files hold the same bytes")

    # A second export of r1, on the iothread.  No client of it here:
    # qemu-storage-daemon 7.2 aborts when a client of an export on an
    # iothread leaves (nbd_blockdev_client_closed() asserts that it runs
    # in the main thread); test-daemon-iothread.py serves them on iocore.
    same("block-export-add on an iothread, fixed",
         *both(a, b, "block-export-add", type="nbd", id="e2", **{"node-name": "r1"},
               name="r1io", writable=True, iothread="io0", **{"fixed-iothread": True}))
    same("query-block-exports with three", *both(a, b, "query-block-exports"), exact=True)
    same("block-export-del of the iothread's export",
         *both(a, b, "block-export-del", id="e2"))
    ea, eb = a.q.wait_event("BLOCK_EXPORT_DELETED"), b.q.wait_event("BLOCK_EXPORT_DELETED")
    tap(ea is not None and eb is not None and ea["data"] == eb["data"] == {"id": "e2"},
        "its BLOCK_EXPORT_DELETED as qemu-storage-daemon", "qsd %r\niocore %r" % (ea, eb))
    # DIFFERS: QEMU counts requests on the export's BlockBackend, so its
    # nodes show zeroes; iocore counts them on the node, for every front
    # end alike.  The shape is QEMU's; the counts are checked on their own.
    ra, rb = both(a, b, "query-blockstats", **{"query-nodes": True})
    same("query-blockstats", ra, rb, values=[lambda r: [x["node-name"] for x in r]])
    st = {x["node-name"]: x["stats"] for x in rb.get("return", [])}
    tap(st.get("r1", {}).get("wr_operations", 0) >= 1 and
        st.get("r1", {}).get("rd_operations", 0) >= 1 and
        st.get("n1", {}).get("wr_bytes", 0) >= 256 << 10,
        "iocore counts the client's requests on the node and its file", json.dumps(st))

    # Deleting in use.
    same("blockdev-del of an exported node", *both(a, b, "blockdev-del",
                                                   **{"node-name": "r1"}))
    same("blockdev-del of a node under another", *both(a, b, "blockdev-del",
                                                       **{"node-name": "n1"}))
    same("blockdev-del of a missing node", *both(a, b, "blockdev-del",
                                                 **{"node-name": "nosuch"}))

    # block-export-del with a client connected, in each mode.
    clients = []
    for d in (a, b):
        h = nbd.NBD()
        h.connect_uri("nbd+unix:///r1?socket=" + d.nbd)
        h.pread(4096, 0)  # answered: the client is in transmission
        clients.append(h)
    same("block-export-del safe with a client", *both(a, b, "block-export-del", id="e1"))
    same("block-export-del: a bad mode", *both(a, b, "block-export-del", id="e1",
                                               mode="bogus"))
    same("block-export-del: a missing export", *both(a, b, "block-export-del", id="nosuch"))
    same("block-export-del hard with a client", *both(a, b, "block-export-del", id="e1",
                                                      mode="hard"))
    ea, eb = a.q.wait_event("BLOCK_EXPORT_DELETED"), b.q.wait_event("BLOCK_EXPORT_DELETED")
    tap(ea is not None and eb is not None and ea["data"] == eb["data"],
        "BLOCK_EXPORT_DELETED as qemu-storage-daemon", "qsd %r\niocore %r" % (ea, eb))
    outcome = []
    for h in clients:
        try:
            h.pread(4096, 0)
            outcome.append("read")
        except nbd.Error as e:
            outcome.append("failed")
    tap(outcome == ["failed", "failed"], "the client's next read fails on both", outcome)
    same("query-block-exports after the deletion", *both(a, b, "query-block-exports"),
         exact=True)
    same("blockdev-del once unexported", *both(a, b, "blockdev-del", **{"node-name": "r1"}))
    same("blockdev-del of its file", *both(a, b, "blockdev-del", **{"node-name": "n1"}))

    # Resizing.
    # DIFFERS in the words only: QEMU refuses through its permission
    # system ("Permission conflict on node..."); iocore names the export
    # whose clients cannot be told of a new size.
    ra, rb = both(a, b, "block_resize", **{"node-name": "disk"}, size=96 << 20)
    tap("error" in ra and "error" in rb and ra["error"]["class"] == rb["error"]["class"],
        "block_resize of an NBD-exported node refused as qemu-storage-daemon refuses it",
        "qsd %r\niocore %r" % (ra, rb))
    for d in (a, b):
        with open(os.path.join(d.dir, "c.img"), "wb") as f:
            f.truncate(16 << 20)
    same("blockdev-add of a node to resize", *add(driver="file", **{"node-name": "rz"},
                                                  filename="@/c.img"))
    same("block_resize of an unexported node", *both(a, b, "block_resize",
                                                     **{"node-name": "rz"}, size=48 << 20))
    same("block_resize of a missing node", *both(a, b, "block_resize",
                                                 **{"node-name": "nosuch"}, size=1 << 20))
    same("block_resize: a negative size", *both(a, b, "block_resize", **{"node-name": "rz"},
                                                size=-1))
    tap(os.path.getsize(os.path.join(a.dir, "c.img")) ==
        os.path.getsize(os.path.join(b.dir, "c.img")) == 48 << 20,
        "both files have the new size")

    # Objects.
    same("object-add iothread", *both(a, b, "object-add", **{"qom-type": "iothread"},
                                      id="io1"))
    same("object-add: a duplicate id", *both(a, b, "object-add",
                                             **{"qom-type": "iothread"}, id="io1"))
    same("object-add: an unknown type", *both(a, b, "object-add", **{"qom-type": "bogus"},
                                              id="x"))
    same("object-del", *both(a, b, "object-del", id="io1"))
    same("object-del: a missing object", *both(a, b, "object-del", id="nosuch"))

    # Commands and arguments QMP refuses.
    same("an unknown command", *both(a, b, "no-such-command"))
    same("a wrong argument type", *both(a, b, "block-export-del", id=5))
    same("an unexpected argument", *both(a, b, "query-block-exports", foo=1))
    same("nbd-server-start twice", *both(a, b, "nbd-server-start",
                                         addr={"type": "unix", "data": {"path": "/nonexistent/x"}}))
    same("nbd-server-stop", *both(a, b, "nbd-server-stop"))
    ea, eb = a.q.wait_event("BLOCK_EXPORT_DELETED"), b.q.wait_event("BLOCK_EXPORT_DELETED")
    tap(ea is not None and eb is not None and ea["data"] == eb["data"],
        "nbd-server-stop deletes the NBD export with an event", "qsd %r\niocore %r" % (ea, eb))
    same("query-block-exports with no server", *both(a, b, "query-block-exports"), exact=True)
    same("nbd-server-stop twice", *both(a, b, "nbd-server-stop"))
    same("block-export-add with no server", *both(a, b, "block-export-add", type="nbd",
                                                  id="e3", **{"node-name": "disk"}))


if __name__ == "__main__":
    sys.exit(main())
