"""The few pieces of the NBD protocol that iocore-nbd's Python test
clients need to misbehave on purpose: the fixed-newstyle handshake with
NBD_OPT_GO (simple replies, no structured ones), and the request and
reply layouts.  Imported by nbd-lazy-client.py and nbd-split-write.py."""
import socket
import struct
import sys

MAGIC_OPTS = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
REQ_MAGIC = 0x25609513
SIMPLE_REPLY = 0x67446698
OPT_GO, REP_ACK, REP_INFO = 7, 1, 3
CMD_READ, CMD_WRITE, CMD_DISC = 0, 1, 2
BLOCK = 4096


def pattern(n):
    """n bytes of a pattern no image region has by chance."""
    return bytes((i * 7 + 3) % 251 for i in range(n))


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
    """Negotiate export name; returns its size."""
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


def connect(path, name):
    """A Unix-socket connection in transmission: (socket, export size)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, handshake(s, name)


def request(flags, cmd, cookie, offset, length):
    return struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, offset, length)


def reply(s):
    """The next simple reply's (error, cookie); fails on a bad magic."""
    magic, err, cookie = struct.unpack(">IIQ", recv_all(s, 16))
    if magic != SIMPLE_REPLY:
        fail("bad reply magic %#x" % magic)
    return err, cookie
