"""What the bench/<module>/run.sh drivers share: progress on stderr, result
rows on stdout in the shape scripts/bench-report.py reads, a scratch
directory in /dev/shm when it can, a process's CPU time from /proc, and a
server stopped (SIGTERM, then SIGKILL after a bound).  Each driver is a
python program inside a shell script that puts this directory in
IOC_BENCH_COMMON; what a driver measures stays in the driver."""
import json
import os
import signal
import subprocess
import sys
import tempfile

CLK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def row_writer(suite):
    """row(case, params, impl, peer, metric, value, better, cmd, error, **extra):
    one result row of suite, as JSON on stdout."""
    def row(case, params, impl, peer, metric, value, better, cmd, error=None, **extra):
        r = {"suite": suite, "case": case, "params": params, "impl": impl,
             "peer": peer, "metric": metric, "value": value, "better": better,
             "cmd": cmd}
        r.update(extra)
        if error:
            r["error"] = error
        print(json.dumps(r), flush=True)
    return row


def workdir(prefix):
    """A fresh scratch directory, in /dev/shm when it is writable."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def cpu_s(pid):
    """utime + stime of pid (every thread) in seconds, None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / CLK
    except (OSError, ValueError, IndexError, TypeError):
        return None


def stop(p, timeout=10):
    """SIGTERM a Popen'd server and reap it; SIGKILL after timeout s."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
