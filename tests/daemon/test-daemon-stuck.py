#!/usr/bin/python3
"""The daemon's stop with a request that does not complete.

A null-co node with latency-ns (QEMU's option: each request completes that
long after it was submitted) stands for a node that stops answering.  A
libnbd client sends one read; once the daemon has taken it off the socket
(the server end's receive queue is empty: the request is inside the node,
or the NBD thread's handler that puts it there runs before anything the
signal starts on that thread), SIGTERM:

- latency 0.3 s: the daemon waits for the read and exits 0;
- latency one hour: the NBD server kills the connection after 10 s, says
  10 s later that a connection still has requests in flight, and goes on
  waiting for them (a node's write-back cache may hold acknowledged writes
  that only its flush and close save): it is still running after saying
  so, and the test ends it with SIGKILL.

Prints TAP; exit 77 (or a skip plan) when python3-libnbd or ss is missing.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import qmptap  # noqa: E402
from qmptap import tap  # noqa: E402

try:
    import nbd
except ImportError:
    nbd = None


def recv_q(pid, path):
    """Bytes waiting in the daemon's ends of connections on path, or None
    when it has none."""
    out = subprocess.run(["ss", "-xHp"], stdout=subprocess.PIPE, text=True).stdout
    total, seen = 0, False
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[4] == path and "pid=%d," % pid in line:
            total += int(f[2])
            seen = True
    return total if seen else None


def run_case(exe, wrap, tmp, name, latency_ns, env, wait_for=None):
    """After SIGTERM: the exit status (None: still running after 60 s) and
    stderr; with wait_for, True when stderr came to hold that text while the
    daemon still ran (60 s at most), else False."""
    sock = os.path.join(tmp, name + ".sock")
    errp = os.path.join(tmp, name + ".err")
    err = open(errp, "w+")
    proc = subprocess.Popen(
        wrap + [exe, "--blockdev",
                "driver=null-co,node-name=%s-node,size=64M,read-zeroes=on,latency-ns=%d"
                % (name, latency_ns),
                "--nbd-server", "addr.type=unix,addr.path=" + sock,
                "--export", "type=nbd,id=%s,node-name=%s-node,name=" % (name, name)],
        stdout=subprocess.DEVNULL, stderr=err, env=env)
    h = None
    try:
        end = time.monotonic() + 30
        while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        h = nbd.NBD()
        h.connect_unix(sock)
        buf = nbd.Buffer(4096)
        h.aio_pread(buf, 0)    # libnbd writes the request in this call
        taken = False
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if recv_q(proc.pid, sock) == 0:
                taken = True
                break
            time.sleep(0.02)
        tap(taken, "%s: the daemon took the read off the socket" % name)
        proc.send_signal(signal.SIGTERM)
        if wait_for:
            rc = False
            end = time.monotonic() + 60
            while time.monotonic() < end and proc.poll() is None:
                with open(errp) as f:
                    seen = wait_for in f.read()
                if seen:
                    rc = proc.poll() is None
                    break
                time.sleep(0.05)
        else:
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rc = None
    finally:
        del h   # closes the connection
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err.seek(0)
    return rc, err.read()


def main():
    if nbd is None or not shutil.which("ss"):
        print("1..0 # SKIP python3-libnbd or ss not installed")
        return 0 if os.environ.get("IOC_TAP_ONLY") else 77
    build = os.environ.get("IOC_BUILD_ROOT", "build")
    exe = os.path.join(build, "tools/daemon/iocore-storage-daemon")
    wrap = os.environ.get("MESON_EXE_WRAPPER", "").split()
    tmp = tempfile.mkdtemp(prefix="ioc-stuck-",
                           dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        rc, err = run_case(exe, wrap, tmp, "slow", 300 * 1000 * 1000, os.environ)
        tap(rc == 0, "a read 0.3 s long: the daemon waits for it and exits 0",
            "exit %s\n%s" % (rc, err))
        tap("in flight" not in err, "... and says nothing of requests in flight", err)
        said = "NBD server: 1 connection(s) still have requests in flight; waiting"
        running, err = run_case(exe, wrap, tmp, "stuck", 3600 * 10**9, os.environ, said)
        tap(running is True, "a read that does not complete: the daemon says so and "
            "goes on waiting", err)
        tap("ERROR: AddressSanitizer" not in err and "runtime error" not in err
            and "ThreadSanitizer" not in err, "... with nothing from a sanitizer", err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return qmptap.plan()


if __name__ == "__main__":
    sys.exit(main())
