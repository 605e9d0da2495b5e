# A Linux guest under TCG for tests that serve it a device (vhost-user-blk
# today).  Source it from a bash test:
#
#   . "$IOC_SOURCE_ROOT/tests/harness/guest.sh"
#   guest_check || skip "$GUEST_SKIP"         # 77 only for a missing package
#   guest_initramfs "$dir" "$dir/test.sh"     # test.sh runs inside the guest
#   guest_run "$dir" "$sock" 2 120            # socket, num-queues, timeout (s)
#   grep -q 'GUEST-DONE rc=0' "$dir/console.log"
#
# The guest: the installed Debian kernel (/boot/vmlinuz-*, linux-image-amd64),
# a busybox-static initramfs built in the test's directory (nothing binary
# is committed), the virtio modules of that kernel, 512 MiB of shared memfd
# memory (vhost-user maps it) and one vhost-user-blk-pci device on the
# socket.  /init mounts /proc, /sys, /dev, loads the modules, waits (at
# most 10 s) for /dev/vda, runs /test.sh and prints "GUEST-DONE rc=N"
# before powering off.  The console goes to $dir/console.log.  Every wait
# is bounded: the whole run by `timeout`, the device by a count.
#
# GUEST_SMP (default 1) sets the vCPUs: Linux uses min(num-queues, vCPUs)
# queues, so a multiqueue test wants 2.  GUEST_DEVICE_OPTS adds options to
# the device (",event_idx=off"), GUEST_QEMU_ARGS arguments to QEMU,
# GUEST_CHARDEV_OPTS options to the socket chardev (",reconnect=1").
#
# GUEST_BINARIES (default none) lists host programs for the initramfs,
# "PATH" or "PATH:NAME", each copied to /bin/NAME (its own name by
# default) with the shared libraries ldd lists, at their paths.  Name a
# program busybox also has otherwise ("/usr/sbin/blkdiscard:ul-blkdiscard"):
# busybox's shell runs its own applet before any file of that name.
# guest_check_binaries says which one is missing.
#
# guest_start runs the same guest in the background with more arguments
# (a QMP socket, -incoming for a migration's destination), for tests that
# talk to QEMU while the guest runs.

GUEST_MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk"

# Sets GUEST_KERNEL, GUEST_KVER, GUEST_BUSYBOX; returns 1 with GUEST_SKIP
# naming what is missing.
guest_check() {
	GUEST_SKIP=
	for p in qemu-system-x86_64 cpio gzip timeout; do
		if ! command -v "$p" >/dev/null 2>&1; then
			GUEST_SKIP="$p not installed"
			return 1
		fi
	done
	GUEST_KERNEL=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
	if [ -z "$GUEST_KERNEL" ] || [ ! -r "$GUEST_KERNEL" ]; then
		GUEST_SKIP="no readable kernel in /boot (linux-image-amd64)"
		return 1
	fi
	GUEST_KVER=${GUEST_KERNEL#/boot/vmlinuz-}
	GUEST_BUSYBOX=
	for b in /bin/busybox /usr/bin/busybox; do
		if [ -x "$b" ] && file -L "$b" 2>/dev/null | grep -q 'statically linked'; then
			GUEST_BUSYBOX=$b
			break
		fi
	done
	if [ -z "$GUEST_BUSYBOX" ]; then
		GUEST_SKIP="no static busybox (busybox-static)"
		return 1
	fi
	for m in $GUEST_MODULES; do
		if [ -z "$(find "/lib/modules/$GUEST_KVER" -name "$m.ko*" 2>/dev/null | head -n 1)" ]; then
			GUEST_SKIP="module $m of kernel $GUEST_KVER not installed"
			return 1
		fi
	done
	return 0
}

# guest_initramfs DIR SCRIPT: DIR/initramfs.gz with SCRIPT as /test.sh.
guest_initramfs() {
	local dir=$1 script=$2 root=$1/initramfs.d m f
	rm -rf "$root"
	mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/lib/modules" "$root/tmp"
	cp "$GUEST_BUSYBOX" "$root/bin/busybox"
	for m in $GUEST_MODULES; do
		f=$(find "/lib/modules/$GUEST_KVER" -name "$m.ko*" | head -n 1)
		case $f in
		*.ko.xz) xz -dc "$f" >"$root/lib/modules/$m.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$m.ko" ;;
		*.ko.gz) gzip -dc "$f" >"$root/lib/modules/$m.ko" ;;
		*) cp "$f" "$root/lib/modules/$m.ko" ;;
		esac
	done
	guest_copy_binaries "$root" || return 1
	cp "$script" "$root/test.sh"
	cat >"$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $GUEST_MODULES; do
	insmod /lib/modules/\$m.ko || echo "GUEST-MODULE-FAILED \$m"
done
i=0
while [ ! -b /dev/vda ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i + 1)); done
sh /test.sh
echo "GUEST-DONE rc=\$?"
sync
poweroff -f
INIT
	chmod +x "$root/init"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initramfs.gz"
	rm -rf "$root"
}

# guest_check_binaries: 1 with GUEST_SKIP naming the first program of
# GUEST_BINARIES that is not installed (or ldd that is missing).
guest_check_binaries() {
	local b
	GUEST_SKIP=
	[ -z "${GUEST_BINARIES:-}" ] && return 0
	if ! command -v ldd >/dev/null 2>&1; then
		GUEST_SKIP="ldd not installed"
		return 1
	fi
	for b in $GUEST_BINARIES; do
		if [ ! -x "${b%%:*}" ]; then
			GUEST_SKIP="${b%%:*} not installed"
			return 1
		fi
	done
	return 0
}

# guest_copy_binaries ROOT: GUEST_BINARIES and their libraries into ROOT.
guest_copy_binaries() {
	local root=$1 b src name lib
	for b in ${GUEST_BINARIES:-}; do
		src=${b%%:*}
		name=${b##*:}
		[ "$name" = "$b" ] && name=$(basename "$src")
		cp -L "$src" "$root/bin/$name" || return 1
		# "libx.so => /lib/.../libx.so (0x...)" and "/lib64/ld-linux... (0x...)".
		for lib in $(ldd "$src" | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p'); do
			[ -e "$root$lib" ] && continue
			mkdir -p "$root$(dirname "$lib")"
			cp -L "$lib" "$root$lib" || return 1
		done
	done
	return 0
}

# guest_start DIR SOCK NUM_QUEUES NAME TIMEOUT_S [QEMU ARGS...]: the guest
# of guest_run in the background, its console in DIR/NAME.console and
# QEMU's output in DIR/NAME.qemu.log, with the extra arguments; killed
# after TIMEOUT_S at the latest.  GUEST_PID is the process to wait for or
# kill (timeout(1), which passes a SIGTERM on to QEMU).
guest_start() {
	local dir=$1 sock=$2 nq=$3 name=$4 t=$5
	shift 5
	timeout --kill-after=5 "$t" qemu-system-x86_64 \
		-accel tcg -m 512M -smp "${GUEST_SMP:-1}" \
		-nodefaults -no-user-config -display none -no-reboot \
		-serial "file:$dir/$name.console" \
		-kernel "$GUEST_KERNEL" -initrd "$dir/initramfs.gz" \
		-append "console=ttyS0 panic=-1 quiet loglevel=4" \
		-object memory-backend-memfd,id=mem,size=512M,share=on \
		-numa node,memdev=mem \
		-chardev "socket,id=c0,path=$sock" \
		-device "vhost-user-blk-pci,chardev=c0,num-queues=$nq${GUEST_DEVICE_OPTS:-}" \
		${GUEST_QEMU_ARGS:-} "$@" </dev/null >"$dir/$name.qemu.log" 2>&1 &
	GUEST_PID=$!
}

# guest_run DIR SOCK NUM_QUEUES TIMEOUT_S: boot, run, power off.  Returns
# qemu's status (124 when the timeout killed it).
guest_run() {
	local dir=$1 sock=$2 nq=$3 t=$4
	timeout --kill-after=5 "$t" qemu-system-x86_64 \
		-accel tcg -m 512M -smp "${GUEST_SMP:-1}" \
		-nodefaults -no-user-config -display none -no-reboot \
		-serial "file:$dir/console.log" \
		-kernel "$GUEST_KERNEL" -initrd "$dir/initramfs.gz" \
		-append "console=ttyS0 panic=-1 quiet loglevel=4" \
		-object memory-backend-memfd,id=mem,size=512M,share=on \
		-numa node,memdev=mem \
		-chardev "socket,id=c0,path=$sock${GUEST_CHARDEV_OPTS:-}" \
		-device "vhost-user-blk-pci,chardev=c0,num-queues=$nq${GUEST_DEVICE_OPTS:-}" \
		${GUEST_QEMU_ARGS:-} </dev/null >"$dir/qemu.log" 2>&1
}
