/*
 * The driver behind the storage daemon's NBD export: qemu-io sends a
 * fixed list of writes, write-zeroes (with and without unmap), discards
 * and flushes over NBD to a qcow2 overlay the daemon serves, and applies
 * the same list directly to a copy; once the daemon stopped (closing the
 * node), `qemu-img check` finds both clean and `qemu-img compare` equal.
 * Then a daemon killed with lazy refcounts, and the repair at open.
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

/* Lazy refcounts and a small L2 cache: qemu-io writes, flushes, writes
 * over many L2 slices (written back before their refcounts); the daemon
 * is killed with SIGKILL.  The image is dirty with wrong
 * refcounts; a writable open repairs it: clean, the flushed data there,
 * every later byte the new data or the old. */
static void test_kill_lazy(void)
{
	const char *root = getenv("IOC_BUILD_ROOT"), *dir = ioc_test_tmpdir();
	char pidpath[512], err[512], *img = q2t_path("k.qcow2"), *raw = q2t_path("k.raw");
	struct ioc_node *n;
	FILE *pf, *f;
	int pid = 0, st;
	size_t rl;
	uint8_t *got;

	if (!root)
		IOC_SKIP("IOC_BUILD_ROOT not set (run through meson test)");
	snprintf(pidpath, sizeof(pidpath), "%s/daemon.pid", dir);
	f = fopen(raw, "w");
	ASSERT_NOT_NULL(f);
	fprintf(f, "write -P 0x41 0 1M\nflush\n");
	for (uint64_t off = (2u << 20) + (128 << 10); off < (16u << 20); off += 256 << 10)
		fprintf(f, "write -P 0x42 %" PRIu64 " 4k\n", off);
	fprintf(f, "sleep 600000\n");
	fclose(f);
	/* Every L2 table there already (one a 2 MiB): a new table would
	 * write the refcounts before it. */
	Q2T_SH_OK("cd '%s' && rm -f k.qcow2 && qemu-img create -q -f qcow2 -o cluster_size=4k,"
		  "lazy_refcounts=on k.qcow2 16M && mv k.raw k.cmds && qemu-io -f qcow2 -c "
		  "'write -P 0x40 2M 4k' -c 'write -P 0x40 4M 4k' -c 'write -P 0x40 6M 4k' -c "
		  "'write -P 0x40 8M 4k' -c 'write -P 0x40 10M 4k' -c 'write -P 0x40 12M 4k' -c "
		  "'write -P 0x40 14M 4k' k.qcow2 >/dev/null", dir);
	Q2T_SH_OK("cd '%s' && %s '%s/tools/daemon/iocore-storage-daemon' "
		  "--blockdev driver=file,node-name=f0,filename=k.qcow2 "
		  "--blockdev driver=qcow2,node-name=q0,file=f0,lazy-refcounts=on,"
		  "l2-cache-entry-size=512,l2-cache-size=8192 "
		  "--nbd-server addr.type=unix,addr.path=%s/nbd.sock "
		  "--export type=nbd,id=e0,node-name=q0,writable=on "
		  "--pidfile %s --daemonize", dir, getenv("MESON_EXE_WRAPPER") ?
		  getenv("MESON_EXE_WRAPPER") : "", root, dir, pidpath);
	pf = fopen(pidpath, "r");
	ASSERT_NOT_NULL(pf);
	ASSERT_EQ(fscanf(pf, "%d", &pid), 1);
	fclose(pf);
	ioc_test_daemon_started(pid);
	/* qemu-io (writeback: no flush after each write) reports each write
	 * once its reply came; after the last it sleeps, connected (a client
	 * leaving makes the server flush), and the daemon is killed then. */
	{
		char cmd[2048], line[512], qpath[512];
		int writes = 0, qpid = 0;
		FILE *q;

		snprintf(qpath, sizeof(qpath), "%s/qemu-io.pid", dir);
		snprintf(cmd, sizeof(cmd), "cd '%s' && echo $$ > qemu-io.pid && exec stdbuf -oL "
			 "qemu-io -t writeback -f raw 'nbd+unix:///q0?socket=%s/nbd.sock' "
			 "< k.cmds 2>&1", dir, dir);
		q = popen(cmd, "r");
		ASSERT_NOT_NULL(q);
		while (writes < 57 && fgets(line, sizeof(line), q))
			for (char *w = line; (w = strstr(w, "wrote ")); w++)
				writes++;
		ASSERT_EQ(writes, 57);
		ASSERT_OK(kill(pid, SIGKILL));
		ASSERT_TRUE(ioc_test_daemon_wait_gone(pid, 20000));
		pf = fopen(qpath, "r");
		ASSERT_NOT_NULL(pf);
		ASSERT_EQ(fscanf(pf, "%d", &qpid), 1);
		fclose(pf);
		ASSERT_OK(kill(qpid, SIGKILL));
		pclose(q);
	}
	ASSERT_TRUE(q2t_sh("cd '%s' && qemu-img info k.qcow2 | grep -q 'lazy refcounts: true'",
			   dir) == 0);
	st = q2t_sh("qemu-img check -q '%s' >/dev/null 2>&1", img);
	ioc_test_diag("qemu-img check after SIGKILL: %d", st);
	ASSERT_NE(st, 0);

	if (q2t_open("r", img, false, "", &n, err, sizeof(err)) < 0)
		ioc_test_fail(__FILE__, __LINE__, "refused: %s", err);
	q2t_close(n);
	Q2T_SH_OK("qemu-img check -q '%s'", img);
	Q2T_SH_OK("qemu-img convert -O raw '%s' '%s'", img, raw);
	got = q2t_read_file(raw, &rl);
	ASSERT_UEQ(rl, 16u << 20);
	for (size_t i = 0; i < rl; i++) {
		bool late = i >= (2u << 20) && (i - (2u << 20)) % (256u << 10) >= (128u << 10) &&
			    (i - (2u << 20)) % (256u << 10) < (132u << 10);
		uint8_t old = i < (1u << 20) ? 0x41 : i % (2u << 20) < 4096 ? 0x40 : 0;

		if (got[i] != old && !(late && got[i] == 0x42))
			ioc_test_fail(__FILE__, __LINE__, "byte %zu reads %02x", i, got[i]);
	}
	free(got);
	Q2T_SH_OK("cd '%s' && rm -f k.qcow2 k.raw k.cmds daemon.pid qemu-io.pid nbd.sock", dir);
	free(img);
	free(raw);
	ioc_node_graph_free(q2t_graph);
	q2t_graph = NULL;
}

Q2T_MAIN(
	IOC_TEST(test_nbd_export),
	IOC_TEST(test_kill_lazy),
)
