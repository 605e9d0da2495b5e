#!/usr/bin/env python3
"""A WRITE whose payload stops half-way until told to go on, for
iocore-nbd's tests.

Usage: nbd-split-write.py SOCKET EXPORT OFFSET LENGTH FIRST GOFILE

Over the Unix socket it negotiates EXPORT (simple replies), sends a WRITE
of LENGTH bytes at OFFSET and the first FIRST bytes of its payload (nbdraw.pattern()), waits until the file GOFILE
exists, sends the rest and prints the reply's error number (0, or the
NBD error, such as 108 for ESHUTDOWN), "closed" if the server hung up
first, or "no reply" after a minute without one.
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nbdraw import CMD_WRITE, connect, fail, pattern, reply, request  # noqa: E402


def main():
    if len(sys.argv) != 7:
        fail(__doc__)
    off, length, first = (int(a) for a in sys.argv[3:6])
    s, _size = connect(sys.argv[1], sys.argv[2])
    data = pattern(length)
    s.sendall(request(0, CMD_WRITE, 7, off, length) + data[:first])
    # Not a timing assertion: a bounded wait for the test's signal, longer
    # than the test waits for anything (so that a server that waits for
    # this payload fails the test's wait, not ours).
    deadline = time.monotonic() + 1200
    while not os.path.exists(sys.argv[6]):
        if time.monotonic() > deadline:
            fail("no go file")
        time.sleep(0.01)
    s.settimeout(60)  # a server that never answers fails the test
    try:
        s.sendall(data[first:])
        err, cookie = reply(s)
    except socket.timeout:
        print("no reply")
        return
    except (BrokenPipeError, ConnectionResetError, SystemExit):
        print("closed")
        return
    print(err if cookie == 7 else "cookie %d" % cookie)


if __name__ == "__main__":
    main()
