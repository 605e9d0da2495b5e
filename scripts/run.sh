#!/bin/sh
# The main job (`make run`): serve BUILD/default.img (1 GiB, sparse, created
# if missing) with iocore-nbd on a Unix socket and on 127.0.0.1:10809.
#
# iocore-nbd serves either a Unix socket (-U) or TCP; to offer both, this
# script creates the two listening sockets and hands them over by systemd
# socket activation (LISTEN_FDS), which iocore-nbd supports.
set -eu
dir=${1:-build}
bin="$dir/tools/nbd/iocore-nbd"
if [ ! -x "$bin" ]; then
	echo "run.sh: $bin is not built (the block layer is needed); try: make" >&2
	exit 1
fi
dir=$(cd "$dir" && pwd)
img="$dir/default.img"
sock="$dir/iocore-nbd.sock"
port=${IOC_NBD_PORT:-10809}
if [ ! -e "$img" ]; then
	truncate -s 1G "$img"
	echo "created $img (1 GiB, sparse)" >&2
fi

cat >&2 <<EOF
iocore-nbd $("$bin" --version | cut -d' ' -f2) serving $img
  nbd+unix:///?socket=$sock
  nbd://127.0.0.1:$port
Try:
  nbdinfo 'nbd+unix:///?socket=$sock'
  nbdinfo --map nbd://127.0.0.1:$port
  qemu-img info nbd://127.0.0.1:$port
  qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' 'nbd+unix:///?socket=$sock'
  fio --name=r --ioengine=nbd --uri='nbd+unix:///?socket=$sock' --rw=randread --bs=4k --iodepth=64 --runtime=5 --time_based
Ctrl-C stops it (requests in flight are answered, then the image is flushed).
EOF

if command -v python3 >/dev/null 2>&1; then
	exec python3 - "$bin" "$img" "$sock" "$port" <<'EOF'
import os, socket, stat, sys
bin, img, path, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    if stat.S_ISSOCK(os.lstat(path).st_mode):
        os.unlink(path)
except FileNotFoundError:
    pass
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.bind(path)
u.listen(1024)
fds = [u]
try:
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("127.0.0.1", port))
    t.listen(1024)
    fds.append(t)
except OSError as e:
    print("run.sh: TCP 127.0.0.1:%d unavailable (%s): Unix socket only" % (port, e),
          file=sys.stderr)
# Via high fds, so no listener is clobbered on its way to 3, 4.
for i, s in enumerate(fds):
    os.dup2(s.fileno(), 100 + i, inheritable=False)
for i in range(len(fds)):
    os.dup2(100 + i, 3 + i, inheritable=True)
    os.close(100 + i)
env = dict(os.environ, LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()))
os.execve(bin, [bin, "-v", img], env)
EOF
fi
# Without python3: the Unix socket only.
exec "$bin" -v -U "$sock" "$img"
