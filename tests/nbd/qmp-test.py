#!/usr/bin/env python3
"""QMP checks for iocore-nbd's control socket (used by test-nbd-dirty.sh).

  qmp-test.py compare QSD_QMP QSD_NBD IOC_QMP IOC_NBD
      Replay one exchange against qemu-storage-daemon and iocore-nbd (each
      with a node/export named "disk"), with the same qemu-io writes in
      the middle, and compare the replies: the same kind (return or error)
      and error class, the same shape (every member iocore sends exists in
      QEMU's reply with the same JSON type, and QEMU's members are all
      there but for a short list iocore does not have), and equal bitmaps.
  qmp-test.py hostile IOC_QMP
      Framing and hostile input: split and packed objects, bad JSON, wrong
      types, an oversized message, a client that never reads.  The server
      must answer each as the table of QMP errors says and keep serving.
Prints TAP lines "ok N - ..." / "not ok N - ..." starting at $TAP_START.
"""
import json
import os
import socket
import subprocess
import sys

n = int(os.environ.get("TAP_START", "0"))
failed = 0


def tap(ok, name, detail=""):
    global n, failed
    n += 1
    print("%s %d - %s" % ("ok" if ok else "not ok", n, name))
    if not ok:
        failed += 1
        for line in str(detail).splitlines()[:20]:
            print("# " + line)
    sys.stdout.flush()


class Qmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(20)
        self.s.connect(path)
        self.buf = b""
        self.greeting = self.recv()

    def send(self, raw):
        self.s.sendall(raw if isinstance(raw, bytes) else raw.encode())

    def recv(self):
        """One message; checks the CRLF framing."""
        while b"\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                return None
            self.buf += d
        line, self.buf = self.buf.split(b"\n", 1)
        if not line.endswith(b"\r"):
            raise AssertionError("message does not end in CRLF: %r" % line)
        return json.loads(line)

    def reply(self):
        """The next reply, skipping events (kept in self.events)."""
        while True:
            m = self.recv()
            if m is None or "event" not in m:
                return m
            self.events.append(m)

    events = []

    def cmd(self, execute, **args):
        msg = {"execute": execute}
        if args:
            msg["arguments"] = args
        self.send(json.dumps(msg))
        return self.reply()


def kind(r):
    if r is None:
        return ("closed",)
    if "error" in r:
        return ("error", r["error"]["class"])
    return ("return",)


# QEMU members iocore does not send.
OMIT = {"driver-specific", "idle_time_ns"}


def shape_diff(q, i, path="$"):
    """Differences between QEMU's value q and iocore's i (shapes only)."""
    out = []
    if isinstance(q, dict):
        if not isinstance(i, dict):
            return ["%s: %s vs %s" % (path, type(q).__name__, type(i).__name__)]
        for k in i:
            if k not in q:
                if not k.startswith("__org.iocore"):
                    out.append("%s.%s: iocore-only member" % (path, k))
                continue
            out += shape_diff(q[k], i[k], path + "." + k)
        for k in q:
            if k not in i and k not in OMIT:
                out.append("%s.%s: missing" % (path, k))
        return out
    if isinstance(q, list):
        if not isinstance(i, list):
            return ["%s: list vs %s" % (path, type(i).__name__)]
        if q and i:
            out += shape_diff(q[0], i[0], path + "[0]")
        return out
    if type(q) != type(i):
        return ["%s: %s vs %s" % (path, type(q).__name__, type(i).__name__)]
    return out


def exchange(path, nbd_sock):
    """The replayed exchange; returns a list of (label, reply)."""
    q = Qmp(path)
    r = [("greeting", q.greeting)]
    q.send('{"execute": "query-version", "id": "x1"}')
    r.append(("before negotiation", q.reply()))
    q.send('{"execute":"qmp_capabilities"}{"execute":"query-version","id":[1,2]}')
    r.append(("packed: qmp_capabilities", q.reply()))
    r.append(("packed: query-version", q.reply()))
    q.send('{"execute":"query-')
    q.send('version", "id": {"a": null}}')
    r.append(("split object", q.reply()))
    for raw in ['{"execute":"no-such"}', '{not json}', '{"foo":1}', '{"execute":1}',
                '{"execute":"query-version","arguments":[]}',
                '{"execute":"query-version","extra":1}',
                '{"execute":"qmp_capabilities"}']:
        q.send(raw)
        r.append((raw, q.reply()))
    for label, args in [
            ("granularity string", {"node": "disk", "name": "b0", "granularity": "x"}),
            ("missing name", {"node": "disk"}),
            ("unexpected parameter", {"node": "disk", "name": "b0", "bogus": 1}),
            ("unknown node", {"node": "nope", "name": "b0"}),
            ("bad granularity", {"node": "disk", "name": "b0", "granularity": 1000}),
            ("add b0", {"node": "disk", "name": "b0"}),
            ("add b1", {"node": "disk", "name": "b1", "granularity": 4096}),
            ("add b2 disabled", {"node": "disk", "name": "b2", "disabled": True}),
            ("add b0 again", {"node": "disk", "name": "b0"}),
            # QEMU's limits: its words past them, and what they allow.
            ("limit: granularity 256", {"node": "disk", "name": "g", "granularity": 256}),
            ("limit: granularity 4 GiB", {"node": "disk", "name": "g",
                                          "granularity": 1 << 32}),
            ("limit: empty name", {"node": "disk", "name": ""}),
            ("limit: 1024-byte name", {"node": "disk", "name": "N" * 1024}),
            ("add 1023-byte name", {"node": "disk", "name": "N" * 1023}),
            ("add 512-byte granules", {"node": "disk", "name": "fine", "granularity": 512}),
            ("add 2 GiB granules", {"node": "disk", "name": "huge",
                                    "granularity": 1 << 31})] + [
            ("add m%d" % i, {"node": "disk", "name": "m%d" % i}) for i in range(20)]:
        r.append((label, q.cmd("block-dirty-bitmap-add", **args)))
    subprocess.run(["qemu-io", "-f", "raw", "-c", "write 100k 4k", "-c", "write 1M 130k",
                    "-c", "write -z 3M 64k", "-c", "discard 5M 8k",
                    "nbd+unix:///disk?socket=" + nbd_sock],
                   check=True, stdout=subprocess.DEVNULL)
    r.append(("nodes after writes", q.cmd("query-named-block-nodes")))
    r.append(("merge", q.cmd("block-dirty-bitmap-merge", node="disk", target="b2",
                             bitmaps=["b0", {"node": "disk", "name": "b1"}])))
    r.append(("merge unknown", q.cmd("block-dirty-bitmap-merge", node="disk",
                                     target="b0", bitmaps=["zz"])))
    r.append(("clear b1", q.cmd("block-dirty-bitmap-clear", node="disk", name="b1")))
    r.append(("disable b0", q.cmd("block-dirty-bitmap-disable", node="disk", name="b0")))
    r.append(("remove unknown", q.cmd("block-dirty-bitmap-remove", node="disk", name="zz")))
    subprocess.run(["qemu-io", "-f", "raw", "-c", "write 7M 4k",
                    "nbd+unix:///disk?socket=" + nbd_sock],
                   check=True, stdout=subprocess.DEVNULL)
    r.append(("nodes after merge", q.cmd("query-named-block-nodes")))
    r.append(("enable b0", q.cmd("block-dirty-bitmap-enable", node="disk", name="b0")))
    r.append(("remove b1", q.cmd("block-dirty-bitmap-remove", node="disk", name="b1")))
    r.append(("exports", q.cmd("query-block-exports")))
    r.append(("blockstats nodes", q.cmd("query-blockstats", **{"query-nodes": True})))
    r.append(("blockstats", q.cmd("query-blockstats")))
    r.append(("commands", q.cmd("query-commands")))
    q.events = []
    q.send('{"execute": "quit", "id": 7}')
    msgs = []
    while True:
        m = q.recv()
        if m is None:
            break
        msgs.append(m)
    r.append(("quit", [m for m in msgs if "event" not in m]))
    r.append(("quit events", sorted(m["event"] for m in msgs if "event" in m)))
    return r


# QEMU's own migration commands (the system emulator's, qapi/migration.json
# of 7.2), which the storage daemon lacks and iocore-nbd serves for live
# migration of an export.
QEMU_MIGRATION = {
    "migrate-set-capabilities", "query-migrate-capabilities",
    "migrate-set-parameters", "query-migrate-parameters", "migrate",
    "query-migrate", "migrate-continue", "migrate_cancel", "migrate-incoming",
}


def compare(qsd_qmp, qsd_nbd, ioc_qmp, ioc_nbd):
    qr = exchange(qsd_qmp, qsd_nbd)
    ir = exchange(ioc_qmp, ioc_nbd)
    for (label, a), (_, b) in zip(qr, ir):
        if label == "greeting":
            d = shape_diff(a, b)
            tap(not d, "greeting has QEMU's shape", d)
            continue
        if label in ("quit", "quit events"):
            ok = (label == "quit" and [kind(x) for x in a] == [kind(x) for x in b]
                  and b and b[0].get("id") == 7) or (label == "quit events" and a == b)
            tap(ok, label + " as qemu-storage-daemon", "%s\n%s" % (a, b))
            continue
        ok = kind(a) == kind(b)
        detail = "qsd:    %s\niocore: %s" % (json.dumps(a)[:600], json.dumps(b)[:600])
        if ok and label.startswith("limit:"):
            ok = a["error"]["desc"] == b["error"]["desc"]
        if ok and "id" in a:
            ok = b.get("id") == a["id"]
        if ok and kind(a) == ("return",):
            if label == "commands":
                names = {c["name"] for c in a["return"]}
                extra = [c["name"] for c in b["return"] if c["name"] not in names
                         and not c["name"].startswith("__org.iocore")
                         and c["name"] not in QEMU_MIGRATION]
                ok = not extra
                detail = "not QEMU's: %s" % extra
            else:
                d = shape_diff(a["return"], b["return"])
                ok = not d
                detail = "\n".join(d) + "\n" + detail
            if ok and label.startswith("nodes"):
                qa, ib = a["return"][0]["dirty-bitmaps"], b["return"][0]["dirty-bitmaps"]
                ok = qa == ib
                diff = [(x, y) for x, y in zip(qa, ib) if x != y][:1] or [(len(qa), len(ib))]
                detail = "bitmaps differ: qsd %s, iocore %s\n" % diff[0] + detail
            # (Statistics values are not compared: QEMU counts requests
            # on the export's BlockBackend, so its node-level counters
            # stay 0; iocore's are the export's.)
        tap(ok, "%s: %s as qemu-storage-daemon" % (label, kind(b)[-1]), detail)


def hostile(path):
    q = Qmp(path)
    g = q.greeting
    v = g["QMP"]["version"]
    tap(g["QMP"]["capabilities"] == [] and v["package"].startswith("iocore-nbd ")
        and set(v["qemu"]) == {"major", "minor", "micro"}
        and v["package"].split()[1].split("-")[0] ==
        "%d.%d.%d" % (v["qemu"]["major"], v["qemu"]["minor"], v["qemu"]["micro"]),
        "greeting names iocore's version (numbers and package agree)", g)
    # No events before negotiation: a second client quits nothing, so just
    # check the first reply is the negotiation error and nothing precedes it.
    q.send('{"execute":"query-commands","id":{"deep":[1,{"x":null}]}}')
    r = q.recv()
    tap(r["error"]["class"] == "CommandNotFound" and r["id"] == {"deep": [1, {"x": None}]},
        "commands before negotiation: CommandNotFound, id echoed verbatim", r)
    # One byte at a time.
    for ch in '{"execute": "qmp_capabilities"}':
        q.send(ch)
    r = q.recv()
    tap(r == {"return": {}}, "an object sent a byte at a time", r)
    q.send('  \r\n{"execute":"query-version","id":1}\n\n{"execute":"query-version",'
           '"id":"two"}{"execute":"query-version","id":3}')
    ids = [q.recv().get("id") for _ in range(3)]
    tap(ids == [1, "two", 3], "three objects in one write, with whitespace", ids)
    q.send('{"execute":"query-version","id":"br}ace\\"["}')
    r = q.recv()
    tap(r.get("id") == 'br}ace"[', "brackets and escapes inside strings", r)
    q.send('{"execute": }')
    r = q.recv()
    tap(r["error"]["class"] == "GenericError" and "JSON parse error" in r["error"]["desc"],
        "bad JSON: GenericError", r)
    q.send('["execute"]')
    r = q.recv()
    tap(r["error"]["class"] == "GenericError", "an array: GenericError", r)
    q.send('{"execute":"block-dirty-bitmap-add","arguments":{"node":"disk","name":5}}')
    r = q.recv()
    tap(r["error"]["desc"] == "Invalid parameter type for 'name', expected: string",
        "a wrong type is named in QEMU's words", r)
    q.send('{"execute":"block-dirty-bitmap-add","arguments":{"node":"disk","name":"n",'
           '"granularity":-4096}}')
    r = q.recv()
    tap(r["error"]["desc"] == "Parameter 'granularity' expects uint64", "negative uint64", r)
    q.send('{"execute":"block-dirty-bitmap-merge","arguments":{"node":"disk",'
           '"target":"zz","bitmaps":[3]}}')
    r = q.recv()
    tap(r["error"]["class"] == "GenericError", "merge of junk: GenericError", r)
    q.send('{"execute":"query-version","id":"still"}')
    r = q.recv()
    tap(r.get("id") == "still", "the connection is usable after the errors", r)
    # A stray closing bracket and a scalar at top level.
    q.send('} 42 {"execute":"query-version","id":"after"}')
    msgs = [q.recv() for _ in range(3)]
    tap([m.get("id") for m in msgs] == [None, None, "after"]
        and all(m["error"]["class"] == "GenericError" for m in msgs[:2]),
        "junk between objects is reported and skipped", msgs)
    # A message larger than the limit: an error, then the connection closes.
    big = Qmp(path)
    big.send('{"execute":"qmp_capabilities"}')
    big.recv()
    try:
        big.send('{"execute":"query-version","id":"' + "x" * (2 << 20))
    except OSError:
        pass
    r = big.recv()
    try:
        closed = big.recv() is None
    except ConnectionResetError:
        closed = True
    tap(r is not None and r["error"]["class"] == "GenericError" and closed,
        "an oversized message: error, then disconnect", r)
    # A client that sends commands and never reads is dropped; the others
    # are served meanwhile.
    lazy = socket.socket(socket.AF_UNIX)
    lazy.connect(path)
    lazy.setblocking(False)
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    req = b'{"execute":"qmp_capabilities"}' + b'{"execute":"query-commands"}' * 2000
    dropped = False
    sent = 0
    for _ in range(400):
        try:
            sent += lazy.send(req)
        except BlockingIOError:
            r = q.cmd("query-version")  # the server is still there
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
        if sent > (64 << 20):
            break
    if not dropped:
        # The server may have closed it without our send failing yet.
        lazy.setblocking(True)
        lazy.settimeout(20)
        try:
            while lazy.recv(1 << 20):
                pass
            dropped = True
        except OSError:
            dropped = True
    tap(dropped, "a client that never reads is disconnected")
    r = q.cmd("query-version")
    tap(r is not None and "return" in r, "other clients are still served", r)


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(*sys.argv[2:6])
    elif sys.argv[1] == "hostile":
        hostile(sys.argv[2])
    sys.exit(1 if failed else 0)
