"""What the Python tests share: TAP lines and a QMP client.

    sys.path.insert(0, <tests/harness>); from qmptap import tap, Qmp
    tap(ok, "name", detail)    # "ok N - name"; detail's lines after a failure
    run("cmd", "arg")          # (exit status, stdout and stderr), bounded
    ...
    sys.exit(qmptap.plan())    # "1..N"; 1 when anything failed

Qmp speaks to a QMP monitor on a Unix socket: cmd() returns the reply,
keeping the events that come before it; wait_event() takes one of those,
or reads on for it, bounded.
"""
import json
import socket
import subprocess
import sys
import time

n = 0
failed = 0


def tap(ok, name, detail="", lines=30):
    """lines < 0: the last -lines of detail (a log's tail), else the first."""
    global n, failed
    n += 1
    print("%s %d - %s" % ("ok" if ok else "not ok", n, name))
    if not ok:
        failed += 1
        d = str(detail).splitlines()
        for line in (d[lines:] if lines < 0 else d[:lines]):
            print("# " + line)
    sys.stdout.flush()


def run(*cmd, timeout=60):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


def plan():
    print("1..%d" % n)
    return 1 if failed else 0


class Qmp:
    def __init__(self, path, timeout=30):
        self.timeout = timeout
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.greeting = json.loads(self.f.readline())
        self.events = []
        self.cmd("qmp_capabilities")

    def cmd(self, cmd_, **args):
        msg = {"execute": cmd_}
        if args:
            msg["arguments"] = args
        return self.raw(msg)

    def raw(self, msg):
        self.s.sendall((json.dumps(msg) + "\n").encode())
        while True:
            line = self.f.readline()
            if not line:
                return None
            r = json.loads(line)
            if "event" in r:
                self.events.append(r)
                continue
            return r

    def wait_event(self, name, data=None, timeout=30):
        """The first event called name (with data, if given), or None."""
        end = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["event"] == name and (data is None or e.get("data") == data):
                    return self.events.pop(i)
            if time.monotonic() >= end:
                return None
            self.s.settimeout(max(0.05, end - time.monotonic()))
            try:
                line = self.f.readline()
            except (socket.timeout, OSError):
                continue
            finally:
                self.s.settimeout(self.timeout)
            if not line:
                return None  # the monitor went away
            r = json.loads(line)
            if "event" in r:
                self.events.append(r)
