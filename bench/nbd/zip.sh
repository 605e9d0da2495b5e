#!/bin/sh
# bench/nbd/zip.sh BUILD_DIR [--quick]
#
# Compressed images served over NBD, same data for everyone: iocore-nbd on
# iocore-zip --block-size 256K output, qemu-nbd on a qcow2 made by
# qemu-img convert -c -o compression_type=zstd, nbdkit --filter=xz file on
# xz -T0 --block-size=1MiB output.  The image mixes a tar of /usr, random
# data and zeros.  fio's nbd engine: 4 KiB randread (iodepth 64, one
# connection and four) and 1 MiB sequential read (iodepth 8), each run
# twice on a freshly started server: "cold" (first touch: every frame
# decoded) and "warm" (the same run again).  Rows: IOPS and p99 (us), and
# the compressed size.  One JSON row per line on stdout; never part of
# make test.  Numbers from a shared, busy machine are indicative only.
exec python3 - "$@" <<'PY'
import json, os, shutil, signal, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
quick = "--quick" in sys.argv
if not args:
    sys.exit("usage: zip.sh BUILD_DIR [--quick]")
build = os.path.abspath(args[0])
ours = os.path.join(build, "tools/nbd/iocore-nbd")
zipper = os.path.join(build, "tools/zip/iocore-zip")
size_mb = 128 if quick else 512
runtime = 3 if quick else 8
base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
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
subprocess.run([zipper, "-q", "--block-size=256K", "-o", raw + ".zst", raw], check=True)
images["iocore"] = raw + ".zst"
if shutil.which("qemu-img"):
    subprocess.run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2",
                    "-o", "compression_type=zstd", raw, raw + ".qcow2"], check=True)
    images["qemu-nbd"] = raw + ".qcow2"
if shutil.which("xz") and shutil.which("nbdkit"):
    subprocess.run(["xz", "-T0", "--block-size=1MiB", "-k", raw], check=True)
    images["nbdkit-xz"] = raw + ".xz"
for impl, path in images.items():
    row("size", "compressed bytes", impl, "bytes", os.path.getsize(path), "lower")

cmds = {
    "iocore": [ours, "--fork", "--pid-file", pidf, "-U", sock, "-r", images["iocore"]],
    "qemu-nbd": ["qemu-nbd", "-t", "-r", "-f", "qcow2", "-e", "8", "--fork",
                 "--pid-file", pidf, "-k", sock, images.get("qemu-nbd", "")],
    "nbdkit-xz": ["nbdkit", "--pidfile", pidf, "-U", sock, "--filter=xz", "file",
                  images.get("nbdkit-xz", "")],
}


def start(cmd):
    for p in (sock, pidf):
        if os.path.exists(p):
            os.unlink(p)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
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


def fio(extra):
    cmd = ["fio", "--name=b", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
           "--group_reporting=1", "--time_based=1", "--runtime=%d" % runtime,
           "--output-format=json"] + extra
    r = subprocess.run(cmd, capture_output=True, timeout=runtime * 4 + 60)
    out = r.stdout.decode(errors="replace")
    if r.returncode != 0 or "{" not in out:
        raise RuntimeError(r.stderr.decode(errors="replace")[-200:])
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return j["iops"], j["clat_ns"]["percentile"].get("99.000000", 0) / 1000.0


workloads = [
    ("randread-4k", "1 conn, iodepth 64", ["--rw=randread", "--bs=4k", "--iodepth=64"]),
    ("randread-4k", "4 conns, iodepth 64", ["--rw=randread", "--bs=4k", "--iodepth=64",
                                            "--numjobs=4"]),
    ("seqread-1m", "1 conn, iodepth 8", ["--rw=read", "--bs=1m", "--iodepth=8"]),
]
try:
    for case, params, extra in workloads:
        for impl in images:
            pid = start(cmds[impl])
            if pid is None:
                row(case, params, impl, "IOPS", None, "higher", "server did not start")
                continue
            try:
                for temp in ("cold", "warm"):
                    iops, p99 = fio(extra)
                    row(case, params + ", " + temp, impl, "IOPS", round(iops), "higher")
                    row(case, params + ", " + temp, impl, "p99 us", round(p99, 1), "lower")
                    log(impl, case, params, temp, round(iops), "IOPS p99", round(p99, 1))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                row(case, params, impl, "IOPS", None, "higher", str(e))
            finally:
                stop(pid)
finally:
    shutil.rmtree(work, ignore_errors=True)
PY
