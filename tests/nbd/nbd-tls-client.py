#!/usr/bin/env python3
"""A deliberately awkward NBD-over-TLS client for iocore-nbd's tests.

Usage: nbd-tls-client.py HOST PORT CA_FILE [CLIENT_CERT CLIENT_KEY]

It negotiates STARTTLS, then runs the TLS handshake sending its bytes one
at a time with TCP_NODELAY (each byte its own segment, so the server sees
records in pieces), writes a pattern with 1 MiB WRITEs, queues 256 64 KiB
READs (16 MiB of replies) before reading any reply, through a small
receive buffer, so the server's socket fills and its TLS sends must wait
and be retried however fast this client reads, then reads every reply and
checks handles and data.  Exits 0 on success; prints what went wrong
otherwise.
"""
import socket
import ssl
import struct
import sys

MAGIC_OPTS = 0x49484156454F5054
REQ_MAGIC = 0x25609513
SIMPLE_REPLY = 0x67446698
OPT_GO, OPT_STARTTLS = 7, 5
REP_ACK, REP_INFO = 1, 3
CMD_READ, CMD_WRITE, CMD_DISC = 0, 1, 2


def fail(msg):
    print(msg)
    sys.exit(1)


class Conn:
    def __init__(self, host, port):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Small and fixed (no autotuning): the replies overrun it.
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.connect((host, port))
        self.tls = None

    def recv_exact(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                fail("connection closed after %d of %d bytes" % (len(b), n))
            b += c
        return b

    def start_tls(self, ca, cert=None, key=None):
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
        self.inb, self.outb = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inb, self.outb, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.flush(slow=True)
                c = self.s.recv(65536)
                if not c:
                    fail("closed during the TLS handshake")
                self.inb.write(c)
        self.flush(slow=True)

    def flush(self, slow=False):
        data = self.outb.read()
        if slow:
            for i in range(len(data)):
                self.s.sendall(data[i:i + 1])
        elif data:
            self.s.sendall(data)

    def send(self, data):
        self.tls.write(data)
        self.flush()

    def read(self, n):
        b = b""
        while len(b) < n:
            try:
                b += self.tls.read(n - len(b))
            except ssl.SSLWantReadError:
                c = self.s.recv(1 << 20)
                if not c:
                    fail("TLS connection closed after %d of %d bytes" % (len(b), n))
                self.inb.write(c)
        return b


def option(c, send, read, opt, data=b""):
    send(struct.pack(">QII", MAGIC_OPTS, opt, len(data)) + data)
    replies = []
    while True:
        magic, o, typ, ln = struct.unpack(">QIII", read(20))
        payload = read(ln) if ln else b""
        if o != opt:
            fail("reply for option %d, expected %d" % (o, opt))
        replies.append((typ, payload))
        if typ == REP_ACK or typ & 0x80000000:
            return replies


def main():
    host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cert, key = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else (None, None)
    c = Conn(host, port)
    g = c.recv_exact(18)
    if g[:8] != b"NBDMAGIC":
        fail("bad greeting")
    c.s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
    r = option(c, c.s.sendall, c.recv_exact, OPT_STARTTLS)
    if r[-1][0] != REP_ACK:
        fail("STARTTLS refused: %r" % (r,))
    c.start_tls(ca, cert, key)
    r = option(c, c.send, c.read, OPT_GO, struct.pack(">I", 0) + struct.pack(">H", 0))
    if r[-1][0] != REP_ACK:
        fail("GO refused: %r" % (r,))
    size = None
    for typ, p in r:
        if typ == REP_INFO and struct.unpack(">H", p[:2])[0] == 0:
            size = struct.unpack(">Q", p[2:10])[0]
    if not size or size < (16 << 20):
        fail("export too small or no size: %r" % size)

    # 16 MiB of 1 MiB writes; each 4 KiB page holds one byte repeated.
    blk = 1 << 20
    for i in range(16):
        off = i * blk
        data = b"".join(bytes([((off + p) * 7 + 3) & 0xFF]) * 4096 for p in range(0, blk, 4096))
        c.send(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_WRITE, 1000 + i, off, blk) + data)
    for i in range(16):
        magic, err, h = struct.unpack(">IIQ", c.read(16))
        if magic != SIMPLE_REPLY or err or not 1000 <= h < 1016:
            fail("bad write reply: %x %d %d" % (magic, err, h))
    # 256 reads of 64 KiB queued before reading any reply.
    rl = 64 << 10
    for i in range(256):
        c.tls.write(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_READ, i, i * rl, rl))
    c.flush()
    seen = set()
    for _ in range(256):
        magic, err, h = struct.unpack(">IIQ", c.read(16))
        if magic != SIMPLE_REPLY or err or h in seen or h >= 256:
            fail("bad read reply: %x %d %d" % (magic, err, h))
        seen.add(h)
        data = c.read(rl)
        off = h * rl
        for p in range(0, rl, 4096):
            want = ((off + p) * 7 + 3) & 0xFF
            if data[p] != want or data[p + 4095] != want:
                fail("read %d: wrong data at +%d" % (h, p))
    c.send(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_DISC, 9999, 0, 0))
    c.s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
