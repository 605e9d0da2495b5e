#!/usr/bin/python3
"""An NBD export's iothread= places its clients on that I/O thread.

The daemon runs two I/O thread objects, an NBD server with two threads of
its own, and three NBD exports: e1 on io1, e2 on io2 (fixed-iothread=on),
e0 without iothread.  Clients (libnbd, and a raw one that sends requests
behind its NBD_OPT_GO) write and read on each; __org.iocore_query-connections,
whose snapshot of a connection runs on the thread that serves it, must
show e1's clients on io1's thread (query-iothreads' thread-id), e2's on
io2's and e0's on one of the server's.  qemu-io, qemu-img compare and
nbdinfo check the data through the placed exports.  Then, with clients
connected on placed exports: a safe deletion is refused and a hard one
closes them (BLOCK_EXPORT_DELETED), a new export shares io2 with e2,
nbd-server-stop closes them, and SIGTERM stops the daemon (exit 0,
nothing from a sanitizer).

Prints TAP; exit 77 (or a skip plan) when qemu-io or python3-libnbd is
missing.
"""
import json
import os
import shutil
import signal
import socket
import struct
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


def wait_path(p, proc, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(p):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def client(sock, name):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h


def raw_pipelined(sock, name, offset, data):
    """A raw client that sends a WRITE and a READ of data right behind its
    NBD_OPT_GO, before the server's reply: they arrive with the handshake
    and are served after the move.  Returns (socket, ok)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock)

    def recv_all(k):
        b = bytearray()
        while len(b) < k:
            c = s.recv(k - len(b))
            if not c:
                raise OSError("closed")
            b += c
        return bytes(b)

    recv_all(18)                                  # NBDMAGIC, IHAVEOPT, flags
    nm = name.encode()
    go = struct.pack(">I", len(nm)) + nm + struct.pack(">H", 0)
    msg = struct.pack(">I", 3)                    # FIXED_NEWSTYLE | NO_ZEROES
    msg += struct.pack(">QII", 0x49484156454F5054, 7, len(go)) + go
    msg += struct.pack(">IHHQQI", 0x25609513, 0, 1, 1, offset, len(data)) + data
    msg += struct.pack(">IHHQQI", 0x25609513, 0, 0, 2, offset, len(data))
    s.sendall(msg)
    while True:                                   # the option replies
        _magic, _opt, rtype, rlen = struct.unpack(">QIII", recv_all(20))
        recv_all(rlen)
        if rtype == 1:                            # NBD_REP_ACK
            break
        if rtype != 3:                            # NBD_REP_INFO
            return s, False
    _m, err1, c1 = struct.unpack(">IIQ", recv_all(16))
    _m, err2, c2 = struct.unpack(">IIQ", recv_all(16))
    back = recv_all(len(data))
    return s, (err1, c1, err2, c2) == (0, 1, 0, 2) and back == data


def closed(h):
    """A libnbd handle whose server closed the connection."""
    try:
        h.pread(512, 0)
    except nbd.Error:
        return True
    return False


def main():
    if not shutil.which("qemu-io") or not shutil.which("qemu-img") or nbd is None:
        print("1..0 # SKIP qemu-io, qemu-img or python3-libnbd not installed")
        return 0 if os.environ.get("IOC_TAP_ONLY") else 77
    build = os.environ.get("IOC_BUILD_ROOT", "build")
    exe = os.path.join(build, "tools/daemon/iocore-storage-daemon")
    wrap = os.environ.get("MESON_EXE_WRAPPER", "").split()
    tmp = tempfile.mkdtemp(prefix="ioc-iothread-",
                           dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    proc = None
    try:
        imgs = {}
        for e in ("e0", "e1", "e2"):
            imgs[e] = os.path.join(tmp, e + ".img")
            with open(imgs[e], "wb") as f:
                f.truncate(64 << 20)
        sock = os.path.join(tmp, "nbd.sock")
        qmp = os.path.join(tmp, "qmp.sock")
        err = open(os.path.join(tmp, "daemon.err"), "w+")
        args = wrap + [exe, "--nbd-iothreads", "2",
                       "--object", "iothread,id=io1", "--object", "iothread,id=io2"]
        for e in ("e0", "e1", "e2"):
            args += ["--blockdev", "driver=file,node-name=n%s,filename=%s" % (e[1], imgs[e])]
        args += ["--nbd-server", "addr.type=unix,addr.path=" + sock,
                 "--export", "type=nbd,id=e0,node-name=n0,name=e0,writable=on",
                 "--export", "type=nbd,id=e1,node-name=n1,name=e1,writable=on,iothread=io1",
                 "--export", "type=nbd,id=e2,node-name=n2,name=e2,writable=on,iothread=io2,"
                             "fixed-iothread=on",
                 "--chardev", "socket,id=m0,path=%s,server=on,wait=off" % qmp,
                 "--monitor", "chardev=m0"]
        proc = subprocess.Popen(args, stderr=err)
        if not wait_path(qmp, proc) or not wait_path(sock, proc):
            err.seek(0)
            print("Bail out! the daemon did not start: " + err.read())
            return 1
        q = Qmp(qmp, timeout=60)
        steps(q, sock, imgs, proc, err)
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return qmptap.plan()


def uri(sock, name):
    return "nbd+unix:///%s?socket=%s" % (name, sock)


def steps(q, sock, imgs, proc, err):
    r = q.cmd("query-iothreads")
    tids = {t["id"]: t["thread-id"] for t in r.get("return", [])}
    tap(set(tids) == {"io1", "io2"} and tids["io1"] != tids["io2"],
        "query-iothreads names both I/O threads", r)

    # Clients on each export, each writing its own pattern and reading it
    # back: two on e1, two on e2, one on e0.
    hs = {"e0": [], "e1": [], "e2": []}
    ok = True
    for e, k in (("e1", 2), ("e2", 2), ("e0", 1)):
        for i in range(k):
            h = client(sock, e)
            buf = bytes([0x40 + 16 * int(e[1]) + i]) * 65536
            h.pwrite(buf, (i + 1) << 20)
            ok &= h.pread(len(buf), (i + 1) << 20) == buf
            h.flush()
            hs[e].append(h)
    tap(ok, "libnbd clients write and read back on e0, e1 and e2")
    raw, rok = raw_pipelined(sock, "e1", 8 << 20, b"\x5c" * 4096)
    tap(rok, "requests sent behind NBD_OPT_GO are served on e1")

    r = q.cmd("__org.iocore_query-connections")
    conns = r.get("return")
    tap(isinstance(conns, list) and len(conns) == 6,
        "__org.iocore_query-connections lists the six clients", r)
    conns = conns if isinstance(conns, list) else []
    by = {}
    for c in conns:
        by.setdefault(c["export"], []).append(c)
    for e, io in (("e1", "io1"), ("e2", "io2")):
        cs = by.get(e, [])
        tap(len(cs) == (3 if e == "e1" else 2) and
            all(c["thread-id"] == tids.get(io) and c["thread"] == -1 for c in cs),
            "%s's clients run on %s's thread (%s)" % (e, io, tids.get(io)),
            json.dumps(cs))
        tap(all(c["requests"]["write"]["operations"] >= 1 and
                c["requests"]["read"]["operations"] >= 1 for c in cs),
            "%s's clients' requests were counted there" % e, json.dumps(cs))
    cs = by.get("e0", [])
    tap(len(cs) == 1 and cs[0]["thread"] in (0, 1) and
        cs[0]["thread-id"] not in tids.values(),
        "e0's client runs on one of the NBD server's own threads", json.dumps(cs))
    raw.close()

    # Real clients through the placed exports.
    for e in ("e1", "e2"):
        r1 = subprocess.run(["qemu-io", "-f", "raw", "-c", "write -P 0x3a 16M 4M",
                             "-c", "write -z 24M 1M", "-c", "read -P 0x3a 16M 4M",
                             "-c", "read -P 0 24M 1M", uri(sock, e)],
                            capture_output=True, text=True, timeout=120)
        tap(r1.returncode == 0 and "Pattern verification failed" not in r1.stdout and
            r1.stdout.count("read ") == 2,
            "qemu-io writes and reads back 4 MiB through %s" % e, r1.stdout + r1.stderr)
        r2 = subprocess.run(["qemu-img", "compare", "-f", "raw", "-F", "raw", imgs[e],
                             uri(sock, e)], capture_output=True, text=True, timeout=120)
        tap(r2.returncode == 0, "qemu-img compare: %s's image and the export agree" % e,
            r2.stdout + r2.stderr)
    if shutil.which("nbdinfo"):
        r3 = subprocess.run(["nbdinfo", "--json", uri(sock, "e2")], capture_output=True,
                            text=True, timeout=60)
        try:
            size = json.loads(r3.stdout)["exports"][0]["export-size"]
        except (ValueError, KeyError, IndexError):
            size = None
        tap(size == 64 << 20, "nbdinfo reads e2's size", r3.stdout + r3.stderr)

    r = q.cmd("query-block-exports")
    tap([x["id"] for x in r.get("return", [])] == ["e2", "e1", "e0"] and
        not any(x["shutting-down"] for x in r["return"]),
        "query-block-exports lists the three exports", r)

    # Deletion with clients connected on a placed export.
    r = q.cmd("block-export-del", id="e1")
    tap(r.get("error", {}).get("desc") == "export 'e1' still in use",
        "a safe deletion of e1 with clients is refused", r)
    r = q.cmd("object-del", id="io1")
    tap("error" in r, "io1 cannot be deleted while e1 uses it", r)
    r = q.cmd("block-export-del", id="e1", mode="hard")
    ev = q.wait_event("BLOCK_EXPORT_DELETED", {"id": "e1"})
    tap("return" in r and ev is not None, "a hard deletion of e1 completes", (r, ev))
    tap(all(closed(h) for h in hs["e1"]), "e1's clients were disconnected")
    tap(not any(closed(h) for h in hs["e0"] + hs["e2"]),
        "e0's and e2's clients are still served")
    r = q.cmd("object-del", id="io1")
    tap(r.get("return") == {}, "io1 can be deleted once e1 is gone", r)

    # A second export on io2: its clients share e2's thread.
    r = q.cmd("block-export-add", type="nbd", id="e3", **{"node-name": "n1"}, name="e3",
              iothread="io2")
    h3 = client(sock, "e3") if "return" in r else None
    ok = h3 is not None and h3.pread(65536, 1 << 20) == bytes([0x50]) * 65536
    tap(ok, "an export added on io2 serves a client", r)
    r = q.cmd("__org.iocore_query-connections")
    cs = [c for c in r.get("return", []) if c["export"] == "e3"]
    tap(len(cs) == 1 and cs[0]["thread-id"] == tids["io2"],
        "e3's client runs on io2's thread too", json.dumps(cs))

    # nbd-server-stop with clients on placed exports.
    r = q.cmd("nbd-server-stop")
    evs = [q.wait_event("BLOCK_EXPORT_DELETED", {"id": x}) for x in ("e0", "e2", "e3")]
    tap("return" in r and all(evs), "nbd-server-stop with clients on io2 completes",
        (r, evs))
    tap(all(closed(h) for h in hs["e0"] + hs["e2"] + [h3]),
        "every client was disconnected")
    r = q.cmd("query-block-exports")
    tap(r.get("return") == [], "no export is left", r)

    # The server again, a client on io2, and SIGTERM.
    r1 = q.cmd("nbd-server-start", addr={"type": "unix", "data": {"path": sock}})
    r2 = q.cmd("block-export-add", type="nbd", id="e4", **{"node-name": "n2"}, name="e4",
               writable=True, iothread="io2")
    h4 = client(sock, "e4") if "return" in r1 and "return" in r2 else None
    if h4:
        h4.pwrite(b"\x77" * 4096, 0)
    r = q.cmd("__org.iocore_query-connections")
    cs = r.get("return", [])
    tap(h4 is not None and len(cs) == 1 and cs[0]["thread-id"] == tids["io2"],
        "after a restart of the server, e4's client runs on io2's thread", (r1, r2, r))
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    err.seek(0)
    log = err.read()
    tap(rc == 0, "SIGTERM with a client on io2: the daemon exits 0", "rc %r\n%s" % (rc, log))
    tap("Sanitizer" not in log, "nothing from a sanitizer", log)
    tap(h4 is not None and closed(h4), "e4's client was disconnected")
    data = open(os.path.join(os.path.dirname(err.name), "e2.img"), "rb").read(4096)
    tap(data == b"\x77" * 4096, "e4's write reached the image")


if __name__ == "__main__":
    sys.exit(main())
