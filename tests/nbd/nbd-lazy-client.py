#!/usr/bin/env python3
"""An NBD client that reads its replies late, for iocore-nbd's tests.

Usage: nbd-lazy-client.py SOCKET EXPORT COUNT [IDLE]

Over the Unix socket it negotiates EXPORT with NBD_OPT_GO (simple replies),
queues COUNT 4 KiB READs in one send, waits until every reply to them sits
unread in its socket (so the server sees a client with a backlog of
replies, which is what makes it rest between reads), stays idle for IDLE
seconds (default 0) neither reading nor sending, queues one READ more,
then reads every reply and checks cookies (each once), errors and lengths.  Exits 0
and prints "ok" on success; prints what went wrong otherwise.
"""
import fcntl
import os
import struct
import sys
import termios
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdraw import BLOCK, CMD_DISC, CMD_READ, connect, fail, recv_all, reply, request  # noqa: E402


def unread(s):
    buf = bytearray(4)
    fcntl.ioctl(s.fileno(), termios.FIONREAD, buf)
    return struct.unpack("i", buf)[0]


def main():
    if len(sys.argv) not in (4, 5):
        fail(__doc__)
    count = int(sys.argv[3])
    idle = float(sys.argv[4]) if len(sys.argv) == 5 else 0.0
    s, size = connect(sys.argv[1], sys.argv[2])
    if not size or size < (count + 1) * BLOCK:
        fail("export too small")

    def read_req(i):
        return request(0, CMD_READ, 1000 + i, i * BLOCK, BLOCK)

    s.sendall(b"".join(read_req(i) for i in range(count)))
    want = count * (16 + BLOCK)
    # Not a timing assertion: a bounded wait for the server's replies.
    deadline = time.monotonic() + 30
    while unread(s) < want:
        if time.monotonic() > deadline:
            fail("only %d of %d reply bytes arrived" % (unread(s), want))
        time.sleep(0.005)
    time.sleep(idle)
    s.sendall(read_req(count))
    seen = set()
    for i in range(count + 1):
        err, cookie = reply(s)
        if err != 0 or not 1000 <= cookie <= 1000 + count:
            fail("reply %d: error %d cookie %d" % (i, err, cookie))
        seen.add(cookie)
        recv_all(s, BLOCK)
    if len(seen) != count + 1:
        fail("%d distinct cookies in %d replies" % (len(seen), count + 1))
    s.sendall(request(0, CMD_DISC, 1, 0, 0))
    s.close()
    print("ok")


main()
