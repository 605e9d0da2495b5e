/*
 * The driver behind the storage daemon's NBD export: qemu-io sends a
 * fixed list of writes, write-zeroes (with and without unmap), discards
 * and flushes over NBD to a qcow2 overlay the daemon serves, and applies
 * the same list directly to a copy; once the daemon stopped (closing the
 * node), `qemu-img check` finds both clean and `qemu-img compare` equal.
 */
#include <signal.h>

#include "q2-test.h"

static void write_cmds(const char *path)
{
	FILE *f = fopen(path, "w");
	uint64_t x = 4242;

	ASSERT_NOT_NULL(f);
	for (int i = 0; i < 120; i++) {
		uint64_t r = q2t_rand(&x), len = q2t_rand(&x) % (256 << 10) + 1;
		uint64_t off = q2t_rand(&x) % ((16u << 20) - len);

		if (r % 3)
			len = (len + 511) / 512 * 512, off = off / 512 * 512;
		switch (r % 10) {
		case 0: fprintf(f, "write -z %" PRIu64 " %" PRIu64 "\n", off, len); break;
		case 1: fprintf(f, "write -z -u %" PRIu64 " %" PRIu64 "\n", off, len); break;
		case 2: fprintf(f, "discard %" PRIu64 " %" PRIu64 "\n", off, len); break;
		case 3: fprintf(f, "flush\n"); break;
		case 4: fprintf(f, "write -f -P 0x%02x %" PRIu64 " %" PRIu64 "\n",
				(unsigned)(r >> 20) & 0xff, off, len); break;
		default: fprintf(f, "write -P 0x%02x %" PRIu64 " %" PRIu64 "\n",
				 (unsigned)(r >> 20) & 0xff, off, len); break;
		}
	}
	fclose(f);
}

static void test_nbd_export(void)
{
	const char *root = getenv("IOC_BUILD_ROOT"), *dir = ioc_test_tmpdir();
	char pidpath[512];
	FILE *pf;
	int pid = 0;

	if (!root)
		IOC_SKIP("IOC_BUILD_ROOT not set (run through meson test)");
	snprintf(pidpath, sizeof(pidpath), "%s/daemon.pid", dir);
	Q2T_SH_OK("cd '%s' && qemu-img create -q -f qcow2 base.qcow2 16M && qemu-io -f qcow2 "
		  "-c 'write -P 0x41 0 6M' -c 'write -P 0x43 10M 2M' base.qcow2 >/dev/null && "
		  "qemu-img create -q -f qcow2 -o cluster_size=16k -b base.qcow2 -F qcow2 a.qcow2 "
		  "&& cp a.qcow2 b.qcow2", dir);
	char *cmds = q2t_path("cmds");

	write_cmds(cmds);
	free(cmds);
	Q2T_SH_OK("cd '%s' && %s '%s/tools/daemon/iocore-storage-daemon' "
		  "--blockdev driver=file,node-name=f0,filename=a.qcow2,discard=unmap "
		  "--blockdev driver=qcow2,node-name=q0,file=f0,discard=unmap "
		  "--nbd-server addr.type=unix,addr.path=%s/nbd.sock "
		  "--export type=nbd,id=e0,node-name=q0,writable=on "
		  "--pidfile %s --daemonize", dir, getenv("MESON_EXE_WRAPPER") ?
		  getenv("MESON_EXE_WRAPPER") : "", root, dir, pidpath);
	pf = fopen(pidpath, "r");
	ASSERT_NOT_NULL(pf);
	ASSERT_EQ(fscanf(pf, "%d", &pid), 1);
	fclose(pf);
	ioc_test_daemon_started(pid);
	Q2T_SH_OK("cd '%s' && qemu-io -f raw 'nbd+unix:///q0?socket=%s/nbd.sock' < cmds "
		  ">/dev/null", dir, dir);
	Q2T_SH_OK("cd '%s' && qemu-io -f qcow2 b.qcow2 < cmds >/dev/null", dir);
	/* While it serves: the export reads as the copy. */
	Q2T_SH_OK("cd '%s' && qemu-img compare -q -f raw -F qcow2 "
		  "'nbd+unix:///q0?socket=%s/nbd.sock' b.qcow2", dir, dir);
	ASSERT_OK(kill(pid, SIGTERM));
	ASSERT_TRUE(ioc_test_daemon_wait_gone(pid, 20000));
	Q2T_SH_OK("cd '%s' && qemu-img check -q a.qcow2 && qemu-img check -q b.qcow2 && "
		  "qemu-img compare -q a.qcow2 b.qcow2", dir);
	Q2T_SH_OK("cd '%s' && rm -f a.qcow2 b.qcow2 base.qcow2 cmds daemon.pid nbd.sock", dir);
}

int main(void)
{
	static const struct ioc_test tests[] = {
		IOC_TEST(test_nbd_export),
	};

	q2t_require_qemu();
	return ioc_test_run(tests, (int)IOC_ARRAY_SIZE(tests));
}
