#!/bin/sh
# bench/vhost/run.sh BUILD_DIR [--quick]
#
# vhost-user-blk back-ends driven by iocore-bench vhost-blk (a front-end
# without a guest: build/tools/bench/iocore-bench), same raw image in
# /dev/shm, same driver:
#
# - 4 KiB randread and randwrite at depth 1, 32 and 128 on 1 and 2
#   queues (the driver runs one thread per ring): IOPS;
# - 64 KiB and 1 MiB sequential read and write, depth 32 and 8, 1 queue:
#   MB/s;
# each with aio=io_uring, then again with aio=threads, for both back-ends;
# then polling.sh's experiment (1, 10 and 100 devices, one busy ring).
#
# The back-ends: qemu-storage-daemon (the peer) and iocore's
# own, build/tools/daemon/iocore-storage-daemon, with the same --blockdev
# and --export syntax.  Until that binary exists its rows are printed with
# "value": null and the reason, as every run.sh reports what it cannot run.
#
# For every row, besides the rate and the driver's p50/p99 latency: the
# back-end's CPU per I/O, utime+stime of the whole process (every thread)
# from /proc/PID/stat just before the driver starts and just after it
# exits, over the driver's request count (the driver runs a known count,
# so this is exact, as for qemu-img bench in bench/nbd/run.sh; the
# handshake is a few hundred us of it; the clock tick is 10 ms, so a
# quick run's figure is good to about 2%); and the driver's own CPU per
# I/O from its rusage.  At the end a table on stderr puts iocore beside
# qemu-storage-daemon with the ratios (rate: iocore/qsd, higher is better;
# CPU: qsd/iocore, higher is better).
#
# The image is written afresh before each back-end starts, so none
# inherits another's page-cache layout of it; each back-end then reads it
# once, untimed, and is left to settle (under 1% of a core, 10 s at most)
# before its first row.
#
# --quick: a 256 MiB image and a quarter of the requests (about half a
# second a row for qemu-storage-daemon here).  One JSON
# row per line on stdout, progress and the table on stderr.  Not part of
# the test suite.
IOC_BENCH_HERE=$(cd "$(dirname "$0")" && pwd) IOC_BENCH_COMMON=$(cd "$(dirname "$0")/../common" && pwd) exec python3 - "$@" <<'EOF'
import json, os, resource, shutil, signal, subprocess, sys, tempfile, time
sys.path.insert(0, os.environ["IOC_BENCH_COMMON"])
from benchlib import CLK, cpu_s, log, row_writer, stop, workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: run.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
driver = os.path.join(build, "tools/bench/iocore-bench")
ours = os.path.join(build, "tools/daemon/iocore-storage-daemon")
size_mb = 256 if quick else 1024
scale = 1 if quick else 4


row = row_writer("vhost")
work = workdir("ioc-vhost-bench.")
img = os.path.join(work, "disk.img")
sock = os.path.join(work, "vhost.sock")


def write_image(path):
    """A fully allocated image: holes would make reads free for everyone."""
    with open(path, "wb") as f:
        chunk = b"\x5a" * (1 << 20)
        for _ in range(size_mb):
            f.write(chunk)


def export_args(binary, aio):
    return [binary,
            "--blockdev", "driver=file,node-name=f,filename=%s,aio=%s" % (img, aio),
            "--export", "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,"
            "addr.path=%s,writable=on,num-queues=2" % sock]


servers = [
    ("iocore", False, ours),
    ("qemu-storage-daemon", True, shutil.which("qemu-storage-daemon") or
     "qemu-storage-daemon"),
]

# (case, --rw, bs, depth, queues, metric, count)
workloads = []
for rw in ("randread", "randwrite"):
    for depth in (1, 32, 128):
        for queues in (1, 2):
            workloads.append((rw, rw, "4k", depth, queues, "IOPS",
                              (10000 if depth == 1 else 60000) * scale))
for bs, depth, count in (("64k", 32, 20000), ("1m", 8, 2000)):
    workloads.append(("seqread", "read", bs, depth, 1, "MB/s", count * scale))
    workloads.append(("seqwrite", "write", bs, depth, 1, "MB/s", count * scale))


def start(binary, aio):
    """The back-end in the foreground of a child; its pid once the socket
    exists (10 s at most), or None and why."""
    if not os.access(binary, os.X_OK):
        return None, None, "%s not built yet" % binary if binary == ours \
            else "%s not installed" % binary
    if os.path.exists(sock):
        os.unlink(sock)
    errf = open(os.path.join(work, "server.err"), "wb")
    p = subprocess.Popen(export_args(binary, aio), stdout=subprocess.DEVNULL, stderr=errf)
    for _ in range(1000):
        if os.path.exists(sock):
            return p, errf, None
        if p.poll() is not None:
            break
        time.sleep(0.01)
    stop(p)
    errf.close()
    with open(os.path.join(work, "server.err"), "rb") as f:
        return None, None, "did not start: " + f.read().decode(errors="replace")[-200:]


def settle(pid, impl):
    """Before the first row: one untimed read of the whole image (both
    back-ends alike), then wait, 10 s at most, until the back-end uses
    under 1% of a core over 200 ms, so that no row measures what a start
    leaves running (iocore's huge-page pass over a tmpfs image)."""
    subprocess.run([driver, "vhost-blk", "--socket", sock, "--rw", "read", "--size", "1m",
                    "--depth", "8", "--queues", "1", "--count", str(size_mb), "--json",
                    "--timeout", "30000"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    last = cpu_s(pid)
    while last is not None and time.monotonic() - t0 < 10:
        time.sleep(0.2)
        now = cpu_s(pid)
        if now is None or now - last < 0.002:
            break
        last = now
    log("%-20s settled %.1f s after its warm-up read" % (impl, time.monotonic() - t0))


def run_driver(rw, bs, depth, queues, count, server_pid):
    """One run: the driver's JSON, the server's CPU s, the command, the
    driver's CPU s: the growth of RUSAGE_CHILDREN over the run, the driver
    being the only child reaped in it (the server is reaped at its stop)."""
    cmd = [driver, "vhost-blk", "--socket", sock, "--rw", rw, "--size", bs,
           "--depth", str(depth), "--queues", str(queues), "--count", str(count),
           "--json", "--timeout", "30000"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    srv0 = cpu_s(server_pid)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    srv1 = cpu_s(server_pid)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    if p.returncode != 0 or not out.strip():
        raise RuntimeError("driver failed: " + err.decode(errors="replace")[-300:])
    j = json.loads(out.decode())
    server = None if srv0 is None or srv1 is None else srv1 - srv0
    return j, server, " ".join(cmd), cli


results = {}   # (case, params) -> {impl: (rate, p50, p99, server us/IO, client us/IO)}
t_begin = time.monotonic()
try:
    if not os.access(driver, os.X_OK):
        sys.exit("bench/vhost: %s not built" % driver)
    for aio, impl, peer, binary in [(a,) + s for a in ("io_uring", "threads")
                                    for s in servers]:
        write_image(img)
        p, errf, why = start(binary, aio)
        scmd = " ".join(export_args(binary, aio))
        if p is not None:
            settle(p.pid, impl)
        for case, rw, bs, depth, queues, metric, count in workloads:
            params = "aio=%s,bs=%s,iodepth=%d,queues=%d" % (aio, bs, depth, queues)
            mets = [(metric, "higher"), ("p99 us", "lower"), ("server CPU us/IO", "lower"),
                    ("client CPU us/IO", "lower")]
            if p is None:
                for m, better in mets:
                    row(case, params, impl, peer, m, None, better, scmd, why)
                continue
            try:
                j, server_s, dcmd, cli_s = run_driver(rw, bs, depth, queues, count, p.pid)
            except Exception as e:
                for m, better in mets:
                    row(case, params, impl, peer, m, None, better, scmd, str(e)[:200])
                continue
            n = j["requests"]
            rate = j["iops"] if metric == "IOPS" else j["mb_s"]
            srv = None if server_s is None else round(server_s * 1e6 / n, 2)
            cli = round(cli_s * 1e6 / n, 2)
            cmd = scmd + " ; " + dcmd
            row(case, params, impl, peer, metric, round(rate, 1), "higher", cmd)
            row(case, params, impl, peer, "p99 us", j["lat_us"]["p99"], "lower", cmd)
            row(case, params, impl, peer, "server CPU us/IO", srv, "lower", cmd,
                None if srv is not None else "server gone")
            row(case, params, impl, peer, "client CPU us/IO", cli, "lower", cmd)
            results.setdefault((case, params, metric), {})[impl] = (
                rate, j["lat_us"]["p50"], j["lat_us"]["p99"], srv, cli)
            log("%-20s %-9s %-26s %9.0f %-4s p50 %7.1f p99 %7.1f us  CPU us/IO server %s "
                "client %s" % (impl, case, params, rate, metric, j["lat_us"]["p50"],
                               j["lat_us"]["p99"], srv, cli))
        if p is not None:
            stop(p)
            errf.close()
        elif why:
            log("%-20s skipped: %s" % (impl, why))

    # The table: each workload, qemu-storage-daemon beside iocore.
    def fmt(v, f="%.0f"):
        return "-" if v is None else f % v

    log("")
    log("%-9s %-38s %-4s | %10s %8s %8s %8s | %10s %8s %8s %8s | %7s %7s" % (
        "case", "params", "", "qsd", "p50 us", "p99 us", "srv us", "iocore", "p50 us",
        "p99 us", "srv us", "rate x", "cpu x"))
    for (case, params, metric), by in results.items():
        q = by.get("qemu-storage-daemon")
        o = by.get("iocore")
        rr = o[0] / q[0] if o and q and q[0] else None
        cr = q[3] / o[3] if o and q and o[3] and q[3] is not None else None
        log("%-9s %-38s %-4s | %10s %8s %8s %8s | %10s %8s %8s %8s | %7s %7s" % (
            case, params, metric,
            fmt(q and q[0]), fmt(q and q[1], "%.1f"), fmt(q and q[2], "%.1f"),
            fmt(q and q[3], "%.2f"),
            fmt(o and o[0]), fmt(o and o[1], "%.1f"), fmt(o and o[2], "%.1f"),
            fmt(o and o[3], "%.2f"), fmt(rr, "%.2f"), fmt(cr, "%.2f")))
    # The polling-scalability experiment, its rows on the same stdout.
    sys.stdout.flush()
    subprocess.run([os.path.join(os.environ["IOC_BENCH_HERE"], "polling.sh"), build] +
                   (["--quick"] if quick else []), timeout=1800)
    log("vhost: %.0f s" % (time.monotonic() - t_begin))
finally:
    shutil.rmtree(work, ignore_errors=True)
EOF
