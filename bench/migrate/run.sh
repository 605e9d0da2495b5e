#!/bin/sh
# bench/migrate/run.sh BUILD_DIR [--quick] [--size=MIB] [--rounds=N] [--links=lo,veth]
#                      [--live-secs=S] [--live-compress=on|off]
#                      [--live-auto-converge=both|on|off] [--no-live] [--no-idle]
#
# Live storage migration between two iocore-nbd against its peers, in the
# same run, on the same image (2 GiB by default, 256 MiB with --quick: a
# tar of /usr, random data and zeros in 1 MiB runs, thirds as in
# bench/nbd/zip.sh), in /dev/shm.
#
# Idle copy, on each link (loopback; a veth pair between two network
# namespaces this script creates, addresses in a private /30 inside them,
# each end shaped with tc tbf to 1 Gbit/s):
#   iocore        iocore-nbd -> iocore-nbd --incoming, compress off: time
#                 from QMP migrate to the MIGRATION completed event
#   iocore-zstd   the same with capability compress, compress-level 1,
#                 compress-threads 2
#   qsd-background, qsd-write-blocking
#                 qemu-storage-daemon blockdev-mirror sync=full to a
#                 qemu-nbd target: time to BLOCK_JOB_READY (then
#                 block-job-complete)
#   nbdcopy       nbdcopy from one qemu-nbd to another
#   zstd-socat    zstd -T0 -1 | socat to socat | zstd -d > file
# Live copy (loopback): fio's nbd engine writes 4 KiB at random over the
# whole image at 20k IOPS through the source's NBD socket while iocore
# (iocore-zstd with --live-compress=on) migrates (until completed) and
# while qsd's write-blocking mirror runs (until ready); the time, the bytes
# copied per byte of image, fio's write p99 inside that window, iocore's
# downtime and the compression workers' busy-time spread.
# The live case runs iocore twice by default (--live-auto-converge=both):
# as configured by default, and as "iocore+auto-converge" with QEMU's
# capability auto-converge on (QEMU's default throttle parameters); the
# summary labels the second one's rows so.
#
# Rounds are interleaved (each round runs every peer once, in a rotated
# order) and medians are compared.  One JSON row per line on stdout (the
# bench/README.md format), the summary table on stderr.  Needs root for the
# namespaces (without it, loopback only, on the host's 127.0.0.1 with
# kernel-picked ports).  Everything it starts is stopped, the namespaces
# deleted and the images removed at exit; every wait has a deadline.  Not
# part of make test.  Numbers from a shared, busy machine are indicative.
exec python3 "$(dirname "$0")/migrate.py" "$@"
