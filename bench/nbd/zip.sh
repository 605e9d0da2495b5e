#!/bin/sh
# bench/nbd/zip.sh BUILD_DIR [--quick] [--size=MIB] [--runtime=S] [--frame-cache=SIZE]
#                  [--block-size=SIZE] [--level=N] [--cold-runs=N]
#
# Compressed images served over NBD, same data for everyone: iocore-nbd on
# iocore-zip -12 --block-size 12K output (--block-size=SIZE, --level=N to
# try others), qemu-nbd on a qcow2 made by qemu-img convert -c -o
# compression_type=zstd, nbdkit --filter=xz file on xz -T0
# --block-size=1MiB output.  The image (2 GiB by default, 128 MiB
# with --quick) mixes a tar of /usr, random data and zeros.  fio's nbd
# engine: 4 KiB randread (iodepth 64, one connection and four) and 1 MiB
# sequential read (iodepth 8), each on a freshly started server, twice:
# "cold" is a first pass over untouched data (sequential: the whole image
# once; random: one read per 256 KiB of image on average, so most reads
# land on a frame nobody has read yet), capped at the run time; "warm" is
# a time-based run right after it.  A random cold pass lasts well under a
# second (8192 reads at 2 GiB), so one pass moves by 10-20% from run to
# run: cold is the median of --cold-runs=N (3) passes, each on a freshly
# started server, the servers taking turns, and warm the median of the
# warm runs that follow each pass (a single run of a few seconds moves by
# as much on this kind of machine).
# Rows: IOPS and p99 (us; the median pass's), the
# compressed sizes, and iocore's ratio to the best peer on each (IOPS over
# the highest peer's, p99 over the lowest peer's, size over the qcow2's)
# with the target it must meet.  One JSON row per line on stdout, a
# summary table on stderr; never part of make test.  A reference server,
# iocore-nbd on the uncompressed image, is run on every row too: not a
# peer, but the rate this client reaches when nothing is decoded (the
# summary's last column: iocore's share of it).  Numbers from a
# shared, busy machine are indicative only.
exec python3 - "$@" <<'PY'
import json, os, shutil, signal, subprocess, sys, tempfile, time

USAGE = ("usage: zip.sh BUILD_DIR [--quick] [--size=MIB] [--runtime=S] [--frame-cache=SIZE]"
         " [--block-size=SIZE] [--level=N] [--cold-runs=N]")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in sys.argv[1:]
            if a.startswith("--"))
if len(args) != 1 or set(opts) - {"quick", "size", "runtime", "frame-cache", "block-size",
                                   "level", "cold-runs"}:
    sys.exit(USAGE)
quick = "quick" in opts
build = os.path.abspath(args[0])
ours = os.path.join(build, "tools/nbd/iocore-nbd")
zipper = os.path.join(build, "tools/zip/iocore-zip")
try:
    size_mb = int(opts.get("size", 128 if quick else 2048))
    runtime = int(opts.get("runtime", 3 if quick else 10))
    cold_runs = int(opts.get("cold-runs", 3))
except ValueError:
    sys.exit(USAGE)
if size_mb < 3 or runtime < 1 or cold_runs < 1:
    sys.exit(USAGE)
frame_cache = ["--frame-cache", opts["frame-cache"]] if opts.get("frame-cache") else []
block_size = opts.get("block-size") or "12K"
level = opts.get("level") or "12"
if not level.isdigit() or not 1 <= int(level) <= 19:
    sys.exit(USAGE)
for tool in (ours, zipper):
    if not os.access(tool, os.X_OK):
        sys.exit("zip.sh: %s not built" % tool)
# The images live in memory when there is room for the raw image and three
# compressed copies, so the disk never decides a number.
base = tempfile.gettempdir()
if os.access("/dev/shm", os.W_OK):
    st = os.statvfs("/dev/shm")
    if st.f_bavail * st.f_frsize > 3 * size_mb * (1 << 20):
        base = "/dev/shm"
work = tempfile.mkdtemp(prefix="ioc-zip-bench.", dir=base)
raw = os.path.join(work, "disk.img")
sock = os.path.join(work, "sock")
pidf = os.path.join(work, "pid")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def row(case, params, impl, metric, value, better, error=None):
    r = {"suite": "nbd-zip", "case": case, "params": params, "impl": impl,
         "metric": metric, "value": value, "better": better}
    if error:
        r["error"] = error
    print(json.dumps(r), flush=True)


# The data: thirds of /usr as a tar, random bytes, zeros (in 1 MiB runs).
mib = 1 << 20
with open(raw, "wb") as f:
    tar = subprocess.Popen(["tar", "cf", "-", "--ignore-failed-read", "/usr"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for i in range(size_mb):
        k = i % 3
        if k == 0:
            blk = tar.stdout.read(mib)
            f.write(blk + bytes(mib - len(blk)))
        elif k == 1:
            f.write(os.urandom(mib))
        else:
            f.write(bytes(mib))
    tar.kill()
    tar.wait()

images = {}
subprocess.run([zipper, "-q", "-" + level, "--block-size=" + block_size, "-o", raw + ".zst", raw], check=True)
images["iocore"] = raw + ".zst"
if shutil.which("qemu-img"):
    subprocess.run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2",
                    "-o", "compression_type=zstd", raw, raw + ".qcow2"], check=True)
    images["qemu-nbd"] = raw + ".qcow2"
if shutil.which("xz") and shutil.which("nbdkit"):
    subprocess.run(["xz", "-T0", "--block-size=1MiB", "-k", raw], check=True)
    images["nbdkit-xz"] = raw + ".xz"
# The raw image stays for one reference server, not a peer: iocore-nbd
# serving it uncompressed shows what fio's client reaches on this machine
# when nothing has to be decoded, the ceiling of each row.
sizes = {}
for impl, path in images.items():
    sizes[impl] = os.path.getsize(path)
    row("size", "compressed bytes", impl, "bytes", sizes[impl], "lower")

cmds = {
    "iocore": [ours, "--fork", "--pid-file", pidf, "-U", sock, "-r"] + frame_cache +
              [images["iocore"]],
    "qemu-nbd": ["qemu-nbd", "-t", "-r", "-f", "qcow2", "-e", "8", "--fork",
                 "--pid-file", pidf, "-k", sock, images.get("qemu-nbd", "")],
    "nbdkit-xz": ["nbdkit", "--pidfile", pidf, "-U", sock, "--filter=xz", "file",
                  images.get("nbdkit-xz", "")],
}
REF = "uncompressed"
cmds[REF] = [ours, "--fork", "--pid-file", pidf, "-U", sock, "-r", raw]


def start(cmd, env=None):
    for p in (sock, pidf):
        if os.path.exists(p):
            os.unlink(p)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                       env=env)
    if r.returncode != 0:
        return None
    for _ in range(500):
        if os.path.exists(pidf) and os.path.exists(sock):
            with open(pidf) as f:
                t = f.read().strip()
                if t:
                    return int(t)
        time.sleep(0.01)
    return None


def stop(pid):
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(500):
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)


def fio(extra, cold):
    cmd = ["fio", "--name=b", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
           "--group_reporting=1", "--runtime=%d" % runtime, "--output-format=json"]
    # Cold: a first pass, as much as one read per 256 KiB of image (a whole
    # pass for sequential reads), stopped at the run time; warm: the run
    # time after it.
    cmd += cold if cold else ["--time_based=1"]
    cmd += extra
    r = subprocess.run(cmd, capture_output=True, timeout=runtime * 4 + 60)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or "{" not in out:
        raise RuntimeError(r.stderr.decode(errors="replace")[-200:])
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return j["iops"], j["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0


frames = size_mb * 4             # 256 KiB pieces of the image
# (case, params, fio options, cold-pass options, IOPS target vs best peer)
workloads = [
    ("randread-4k", "1 conn, iodepth 64", ["--rw=randread", "--bs=4k", "--iodepth=64"],
     ["--io_size=%dk" % (4 * frames)], 3.0),
    ("randread-4k", "4 conns, iodepth 64", ["--rw=randread", "--bs=4k", "--iodepth=64",
                                            "--numjobs=4"],
     ["--io_size=%dk" % (frames)], 3.0),
    ("seqread-1m", "1 conn, iodepth 8", ["--rw=read", "--bs=1m", "--iodepth=8"],
     ["--io_size=%dm" % size_mb], 2.0),
]
results = {}    # (case, params, temp) -> {impl: (iops, p99)}


def record(case, params, temp, impl, iops, p99):
    results.setdefault((case, params, temp), {})[impl] = (iops, p99)
    row(case, params + ", " + temp, impl, "IOPS", round(iops), "higher")
    row(case, params + ", " + temp, impl, "p99 us", round(p99, 1), "lower")
    log(impl, case, params, temp, round(iops), "IOPS p99", round(p99, 1))


try:
    for case, params, extra, cold, target in workloads:
        passes = {}     # impl -> [(iops, p99)] of its cold passes
        warms = {}      # impl -> [(iops, p99)] of the warm runs after them
        failed = set()
        for k in range(cold_runs):
            for impl in list(images) + [REF]:
                if impl in failed:
                    continue
                # The reference without the huge-page pass over the raw
                # image (src/blk/huge.c): a one-time cost that would land
                # in its first rows, where it is meant as the client's
                # ceiling.
                pid = start(cmds[impl], dict(os.environ, IOC_BLK_HUGE="off")
                            if impl == REF else None)
                if pid is None:
                    row(case, params, impl, "IOPS", None, "higher", "server did not start")
                    failed.add(impl)
                    continue
                try:
                    passes.setdefault(impl, []).append(fio(extra, cold))
                    warms.setdefault(impl, []).append(fio(extra, None))
                    if k == cold_runs - 1:
                        got = sorted(passes[impl])
                        record(case, params, "cold", impl, *got[len(got) // 2])
                        got = sorted(warms[impl])
                        record(case, params, "warm", impl, *got[len(got) // 2])
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    row(case, params, impl, "IOPS", None, "higher", str(e))
                    failed.add(impl)
                finally:
                    stop(pid)
finally:
    shutil.rmtree(work, ignore_errors=True)

# iocore against the best peer on each row, and the targets.
log("")
log("%-40s %14s %14s %8s %8s  %-10s %s" % ("vs best peer", "IOPS ratio", "p99 ratio",
                                          "target", "", "best peer", "x uncompressed"))
targets = {(c, p): t for c, p, _, _, t in workloads}
for (case, params, temp), got in results.items():
    peers = {k: v for k, v in got.items() if k not in ("iocore", REF)}
    if "iocore" not in got or not peers:
        continue
    iops, p99 = got["iocore"]
    best_iops = max(peers.items(), key=lambda kv: kv[1][0])
    best_p99 = min(v[1] for v in peers.values() if v[1] > 0) if any(
        v[1] > 0 for v in peers.values()) else 0
    ri = iops / best_iops[1][0] if best_iops[1][0] else None
    rp = p99 / best_p99 if best_p99 else None
    target = targets[(case, params)]
    ok = ri is not None and ri >= target and (rp is None or rp <= 1.0)
    p = params + ", " + temp
    row(case, p, "iocore", "IOPS x best peer", ri and round(ri, 2), "higher")
    row(case, p, "iocore", "p99 x best peer", rp and round(rp, 2), "lower")
    # The share of the reference (the raw image, same client) reached.
    rr = iops / got[REF][0] if got.get(REF, (0,))[0] else None
    if rr is not None:
        row(case, p, "iocore", "IOPS x uncompressed", round(rr, 2), "higher")
    log("%-40s %14s %14s %7.1fx %8s  %-10s %s" % (
        case + " " + p, "%.2fx" % ri if ri else "-", "%.2fx" % rp if rp else "-", target,
        "PASS" if ok else "FAIL", best_iops[0], "%.2fx" % rr if rr else "-"))
if "iocore" in sizes and "qemu-nbd" in sizes:
    rs = sizes["iocore"] / sizes["qemu-nbd"]
    row("size", "compressed bytes", "iocore", "size x qcow2", round(rs, 3), "lower")
    log("%-40s %14s %14s %8s %8s  %s" % ("compressed size", "%.3fx" % rs, "-", "<=1.0x",
                                        "PASS" if rs <= 1.0 else "FAIL", "qemu-nbd"))
PY
