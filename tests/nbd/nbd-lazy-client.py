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
import socket
import struct
import sys
import termios
import time

MAGIC_OPTS = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
REQ_MAGIC = 0x25609513
SIMPLE_REPLY = 0x67446698
OPT_GO, REP_ACK, REP_INFO = 7, 1, 3
CMD_READ, CMD_DISC = 0, 2
BLOCK = 4096


def fail(msg):
    print(msg)
    sys.exit(1)


def recv_all(s, n):
    b = bytearray()
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            fail("server closed after %d of %d bytes" % (len(b), n))
        b += chunk
    return bytes(b)


def handshake(s, name):
    nbdmagic, opts, _hflags = struct.unpack(">8sQH", recv_all(s, 18))
    if nbdmagic != b"NBDMAGIC" or opts != MAGIC_OPTS:
        fail("bad greeting")
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    n = name.encode()
    data = struct.pack(">I", len(n)) + n + struct.pack(">H", 0)
    s.sendall(struct.pack(">QII", MAGIC_OPTS, OPT_GO, len(data)) + data)
    size = None
    while True:
        magic, _opt, rtype, rlen = struct.unpack(">QIII", recv_all(s, 20))
        if magic != OPT_REPLY_MAGIC:
            fail("bad option reply magic")
        body = recv_all(s, rlen)
        if rtype == REP_ACK:
            break
        if rtype == REP_INFO and len(body) >= 12 and struct.unpack(">H", body[:2])[0] == 0:
            size = struct.unpack(">Q", body[2:10])[0]
        elif rtype != REP_INFO:
            fail("NBD_OPT_GO refused (reply type %#x)" % rtype)
    return size


def unread(s):
    buf = bytearray(4)
    fcntl.ioctl(s.fileno(), termios.FIONREAD, buf)
    return struct.unpack("i", buf)[0]


def main():
    if len(sys.argv) not in (4, 5):
        fail(__doc__)
    count = int(sys.argv[3])
    idle = float(sys.argv[4]) if len(sys.argv) == 5 else 0.0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    size = handshake(s, sys.argv[2])
    if not size or size < (count + 1) * BLOCK:
        fail("export too small")

    def read_req(i):
        return struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_READ, 1000 + i, i * BLOCK, BLOCK)

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
        magic, err, cookie = struct.unpack(">IIQ", recv_all(s, 16))
        if magic != SIMPLE_REPLY or err != 0 or not 1000 <= cookie <= 1000 + count:
            fail("reply %d: magic %#x error %d cookie %d" % (i, magic, err, cookie))
        seen.add(cookie)
        recv_all(s, BLOCK)
    if len(seen) != count + 1:
        fail("%d distinct cookies in %d replies" % (len(seen), count + 1))
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_DISC, 1, 0, 0))
    s.close()
    print("ok")


main()
