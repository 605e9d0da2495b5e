/*
 * Faults on every I/O path of the real server, seen from a client: each
 * failing request gets the protocol's error, exactly the affected requests
 * fail, and everyone else (other ranges, other connections) is served.
 *
 * - injected EIO on a range (iocore-nbd --inject-faults): reads and writes
 *   inside it fail, requests beside it in the same pipeline succeed;
 * - the errno -> NBD error mapping, one injected errno per range;
 * - a failed flush stays failed (the write-back error rule in blk.c): the
 *   next flushes, FUA writes and FUA trims fail on every connection, even
 *   though the disk would now say yes;
 * - ENOSPC for real: the image on a small tmpfs that fills up;
 * - the image truncated under the server: reads past the new end read
 *   zeroes (what a sparse tail reads; the block layer's rule), reads
 *   before it keep their data, writes past it extend the file again.
 * - EIO for real, where the kernel has device-mapper: a device whose
 *   second half is an "error" target (skipped otherwise: containers rarely
 *   have it, and the injected EIO above covers the same paths).
 */
#include <sys/mount.h>
#include <sys/wait.h>

#include "nbd-test-server.h"

#define IMG_SIZE (16u << 20)
#define BS 4096u

static void fill(uint8_t *b, uint64_t off, size_t n, uint8_t salt)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(((off + i) >> 9) * 31 + salt);
}

struct preq {
	uint16_t type, flags;
	uint64_t off, len;
	uint32_t expect;  /* NBD error expected */
	uint32_t got;
	bool done;
};

/* Send every request at once (a pipeline), then collect the replies in
 * whatever order they come; each request's error lands in its slot.
 * Reads and writes are BS bytes (simple replies need to know the length). */
static void pipeline(const struct cl_conn *c, struct preq *q, int n)
{
	static uint8_t buf[BS];
	uint8_t *pl = malloc(BS + 64);

	for (int i = 0; i < n; i++) {
		fill(buf, q[i].off, BS, 1);
		ASSERT_OK(cl_req(c, q[i].flags, q[i].type, (uint64_t)i, q[i].off, q[i].len,
				 q[i].type == NBD_CMD_WRITE ? buf : NULL));
	}
	for (int left = n; left > 0;) {
		struct cl_reply rep;
		uint32_t e;
		if (!c->structured) {
			/* A simple reply's data length depends on the request it
			 * answers, known only from its cookie. */
			uint8_t h[16];
			ASSERT_OK(cl_read(c->fd, h, sizeof(h)));
			ASSERT_UEQ(ioc_nbd_ld32(h), NBD_MAGIC_SIMPLE_REPLY);
			rep.simple = true;
			rep.cookie = ioc_nbd_ld64(h + 8);
			e = ioc_nbd_ld32(h + 4);
			ASSERT_ULT(rep.cookie, (uint64_t)n);
			if (!e && q[rep.cookie].type == NBD_CMD_READ)
				ASSERT_OK(cl_read(c->fd, pl, BS));
		} else {
			ASSERT_OK(cl_reply(c, &rep, pl, BS + 64, 0));
			e = cl_reply_error(&rep, pl);
		}
		ASSERT_ULT(rep.cookie, (uint64_t)n);
		struct preq *r = &q[rep.cookie];
		ASSERT_FALSE(r->done);
		if (e && !r->got)
			r->got = e;
		if (rep.simple || (rep.flags & NBD_REPLY_FLAG_DONE)) {
			r->done = true;
			left--;
		}
	}
	for (int i = 0; i < n; i++) {
		if (q[i].got != q[i].expect)
			ioc_test_diag("request %d (type %u at %llu): error %u, want %u", i,
				      q[i].type, (unsigned long long)q[i].off, q[i].got,
				      q[i].expect);
		ASSERT_EQ(q[i].got, q[i].expect);
	}
	free(pl);
}

static void expect_data(const struct cl_conn *c, uint64_t off, uint8_t salt)
{
	uint8_t b[BS], want[BS];

	ASSERT_EQ(cl_pread(c, 0, b, off, BS, NULL, NULL), 0);
	fill(want, off, BS, salt);
	ASSERT_MEM_EQ(b, want, BS);
}

/* EIO on [1 MiB, 1 MiB + 64 KiB) for reads and writes. */
static void test_eio_exactly_the_range(void)
{
	static const char *const opts[] = {
		"--inject-faults", "read,write=EIO@1048576+65536", NULL };
	const uint64_t lo = 1u << 20, hi = lo + 65536;
	struct ts_srv s;
	struct cl_conn a, b;
	uint8_t buf[BS];

	ts_prepare(&s, NULL, IMG_SIZE);
	ts_start(&s, opts);
	ts_connect(&s, &a, true);
	ts_connect(&s, &b, false);
	/* Data around the range, written by b. */
	for (uint64_t off = lo - 4 * BS; off < hi + 4 * BS; off += BS) {
		fill(buf, off, BS, 1);
		ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_WRITE, off, BS, buf),
			  off >= lo && off < hi ? NBD_EIO : 0);
	}
	for (int round = 0; round < 2; round++) {
		const struct cl_conn *c = round ? &b : &a;
		struct preq q[] = {
			{ NBD_CMD_READ, 0, lo - BS, BS, 0 },
			{ NBD_CMD_READ, 0, lo, BS, NBD_EIO },
			{ NBD_CMD_WRITE, 0, lo + BS, BS, NBD_EIO },
			{ NBD_CMD_READ, 0, lo - BS / 2, BS, NBD_EIO },   /* straddles */
			{ NBD_CMD_WRITE, 0, lo - 2 * BS, BS, 0 },
			{ NBD_CMD_READ, 0, hi - BS, BS, NBD_EIO },
			{ NBD_CMD_READ, 0, hi, BS, 0 },
			{ NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, hi + BS, BS, 0 },
			{ NBD_CMD_WRITE_ZEROES, 0, lo + 2 * BS, BS, 0 }, /* not injected */
			{ NBD_CMD_TRIM, 0, lo + 3 * BS, BS, 0 },
			{ NBD_CMD_FLUSH, 0, 0, 0, 0 },
			{ NBD_CMD_READ, 0, 0, BS, 0 },
		};
		pipeline(c, q, (int)IOC_ARRAY_SIZE(q));
	}
	/* The other ranges kept their data, on both connections. */
	expect_data(&a, lo - BS, 1);
	expect_data(&b, lo - 2 * BS, 1);
	expect_data(&a, hi, 1);
	expect_data(&b, hi + BS, 1);
	close(a.fd);
	close(b.fd);
	ts_stop(&s);
}

/* One injected errno per 4 KiB range of writes: what the client sees. */
static void test_errno_mapping(void)
{
	static const struct { const char *err; uint32_t nbd; } map[] = {
		{ "ENOSPC", NBD_ENOSPC }, { "EDQUOT", NBD_ENOSPC },
		{ "EFBIG", NBD_ENOSPC }, { "EROFS", NBD_EPERM },
		{ "EACCES", NBD_EPERM }, { "EPERM", NBD_EPERM },
		{ "ENOTSUP", NBD_EIO }, { "EOVERFLOW", NBD_EIO },
		{ "ESHUTDOWN", NBD_EIO }, { "EAGAIN", NBD_EIO },
		{ "ENOMEM", NBD_ENOMEM }, { "EINVAL", NBD_EINVAL },
		{ "EIO", NBD_EIO },
	};
	enum { N = IOC_ARRAY_SIZE(map) };
	const char *argv[2 * (N + 1) + 1];
	char rules[N + 1][64];
	struct ts_srv s;
	struct cl_conn c;
	uint8_t buf[BS] = { 0 };
	int n = 0;

	for (int i = 0; i < N; i++) {
		snprintf(rules[i], sizeof(rules[i]), "write=%s@%u+%u", map[i].err,
			 i * BS, BS);
		argv[n++] = "--inject-faults";
		argv[n++] = rules[i];
	}
	/* Write-zeroes refused as "not fast": ENOTSUP only with FAST_ZERO. */
	snprintf(rules[N], sizeof(rules[N]), "zero=ENOTSUP@%u+%u", 64 * BS, 2 * BS);
	argv[n++] = "--inject-faults";
	argv[n++] = rules[N];
	argv[n] = NULL;
	ts_prepare(&s, NULL, IMG_SIZE);
	ts_start(&s, argv);
	for (int structured = 0; structured < 2; structured++) {
		ts_connect(&s, &c, structured);
		for (int i = 0; i < N; i++) {
			long e = cl_cmd(&c, 0, NBD_CMD_WRITE, (uint64_t)i * BS, BS, buf);
			if (e != (long)map[i].nbd)
				ioc_test_diag("%s gave %ld", map[i].err, e);
			ASSERT_EQ(e, (long)map[i].nbd);
		}
		ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, (uint64_t)N * BS, BS, buf), 0);
		ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE_ZEROES, 64 * BS, BS, NULL), NBD_EIO);
		if (c.tflags & NBD_FLAG_SEND_FAST_ZERO)
			ASSERT_EQ(cl_cmd(&c, NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_WRITE_ZEROES,
					 65 * BS, BS, NULL), NBD_ENOTSUP);
		close(c.fd);
	}
	ts_stop(&s);
}

/* A flush fails once; it must never be acknowledged as clean again. */
static void test_failed_flush_stays_failed(void)
{
	static const char *const opts[] = { "--inject-faults", "flush=EIO#1", NULL };
	struct ts_srv s;
	struct cl_conn a, b, c;
	uint8_t buf[BS];

	ts_prepare(&s, NULL, IMG_SIZE);
	ts_start(&s, opts);
	ts_connect(&s, &a, true);
	ts_connect(&s, &b, false);
	fill(buf, 0, BS, 1);
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_WRITE, 0, BS, buf), 0);
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	/* The injection is spent; the disk would now report success. */
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	fill(buf, BS, BS, 1);
	ASSERT_EQ(cl_cmd(&b, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, BS, BS, buf), NBD_EIO);
	ASSERT_EQ(cl_cmd(&a, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE_ZEROES, 2 * BS, BS, NULL),
		  NBD_EIO);
	ASSERT_EQ(cl_cmd(&a, NBD_CMD_FLAG_FUA, NBD_CMD_TRIM, 3 * BS, BS, NULL), NBD_EIO);
	/* Reads and plain writes still work, on every connection. */
	fill(buf, 4 * BS, BS, 1);
	ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_WRITE, 4 * BS, BS, buf), 0);
	expect_data(&a, 0, 1);
	expect_data(&a, 4 * BS, 1);
	/* A new connection does not get a clean slate either. */
	ts_connect(&s, &c, true);
	expect_data(&c, 0, 1);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	close(a.fd);
	close(b.fd);
	close(c.fd);
	ts_stop(&s);
}

/* ENOSPC for real: an 8 MiB sparse image on a 1 MiB tmpfs. */
static void test_full_tmpfs(void)
{
	char base[256];
	struct ts_srv s;
	struct cl_conn a, b;
	uint8_t buf[65536];
	bool ok[64] = { false };
	int enospc = 0, good = 0;

	snprintf(base, sizeof(base), "%.200s/full", ioc_test_tmpdir());
	ASSERT_OK(mkdir(base, 0700));
	if (mount("ioc-nbd-full", base, "tmpfs", 0, "size=1m") < 0) {
		rmdir(base);
		IOC_SKIP("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)");
	}
	ts_prepare(&s, base, 8u << 20);
	ts_start(&s, NULL);
	ts_connect(&s, &a, true);
	ts_connect(&s, &b, false);
	for (int i = 0; i < 64; i++) {
		uint64_t off = (uint64_t)i * sizeof(buf);
		fill(buf, off, sizeof(buf), 7);
		long e = cl_cmd(&a, 0, NBD_CMD_WRITE, off, sizeof(buf), buf);
		ASSERT_TRUE(e == 0 || e == NBD_ENOSPC);
		ok[i] = e == 0;
		good += e == 0;
		enospc += e == NBD_ENOSPC;
	}
	ioc_test_diag("%d writes succeeded, %d got ENOSPC", good, enospc);
	ASSERT_GT(enospc, 0);
	ASSERT_GT(good, 0);
	/* What succeeded is there, seen from the other connection. */
	for (int i = 0; i < 64; i++) {
		if (!ok[i])
			continue;
		uint8_t want[BS], got[BS];
		uint64_t off = (uint64_t)i * sizeof(buf) + sizeof(buf) - BS;
		ASSERT_EQ(cl_pread(&b, 0, got, off, BS, NULL, NULL), 0);
		fill(want, off, BS, 7);
		ASSERT_MEM_EQ(got, want, BS);
	}
	/* Nothing that was acknowledged was lost: flush is clean. */
	ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	/* Freeing space makes writes succeed again. */
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_TRIM, 0, 4u << 20, NULL), 0);
	int last = 63;
	fill(buf, (uint64_t)last * sizeof(buf), sizeof(buf), 9);
	ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_WRITE, (uint64_t)last * sizeof(buf), sizeof(buf),
			 buf), 0);
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	close(a.fd);
	close(b.fd);
	ts_stop(&s);
	/* The server and all its threads are gone, so nothing of ours holds
	 * the tmpfs; the kernel may still be dropping an exited process's
	 * last file references (EBUSY), a bounded wait for that. */
	int r, tries = 0;
	while ((r = umount(base)) < 0 && errno == EBUSY && tries++ < 1000)
		usleep(10000);
	if (r < 0)
		ioc_test_fail(__FILE__, __LINE__, "umount(%s): %s", base, strerror(errno));
	ASSERT_OK(rmdir(base));
}

/* The image shrinks under the server (another program truncates it). */
static void test_truncated_under_server(void)
{
	struct ts_srv s;
	struct cl_conn a, b;
	uint8_t buf[BS], zero[BS] = { 0 };
	const uint64_t cut = 1u << 20;

	ts_prepare(&s, NULL, 0);
	int fd = open(s.img, O_CREAT | O_RDWR | O_TRUNC, 0644);
	ASSERT_GE(fd, 0);
	for (uint64_t off = 0; off < (4u << 20); off += BS) {
		fill(buf, off, BS, 3);
		ASSERT_EQ(pwrite(fd, buf, BS, (off_t)off), (ssize_t)BS);
	}
	/* Lend 4 KiB reads too (a connection alone on its thread would copy
	 * them), so that the cut meets data lent from the mapping. */
	ASSERT_OK(setenv("IOC_NBD_TEST_MAP", "all", 1));
	ts_start(&s, NULL);
	ASSERT_OK(unsetenv("IOC_NBD_TEST_MAP"));
	ts_connect(&s, &a, true);
	ts_connect(&s, &b, false);
	expect_data(&a, 2u << 20, 3);
	ASSERT_OK(ftruncate(fd, (off_t)cut));
	close(fd);
	/* Before the cut: the data.  After: zeroes, no error, no hang. */
	expect_data(&a, 0, 3);
	expect_data(&b, cut - BS, 3);
	for (int k = 0; k < 2; k++) {
		const struct cl_conn *c = k ? &b : &a;
		ASSERT_EQ(cl_pread(c, 0, buf, 2u << 20, BS, NULL, NULL), 0);
		ASSERT_MEM_EQ(buf, zero, BS);
		ASSERT_EQ(cl_pread(c, 0, buf, cut - BS / 2, BS, NULL, NULL), 0);
		uint8_t want[BS / 2];
		fill(want, cut - BS / 2, BS / 2, 3);
		ASSERT_MEM_EQ(buf, want, BS / 2);
		ASSERT_MEM_EQ(buf + BS / 2, zero, BS / 2);
	}
	/* A write past the end extends the file again and reads back. */
	fill(buf, 3u << 20, BS, 5);
	ASSERT_EQ(cl_cmd(&a, 0, NBD_CMD_WRITE, 3u << 20, BS, buf), 0);
	expect_data(&b, 3u << 20, 5);
	ASSERT_EQ(cl_cmd(&b, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	close(a.fd);
	close(b.fd);
	ts_stop(&s);
}

static int sh(const char *cmd)
{
	int st = system(cmd);

	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* Whether the kernel offers device-mapper (without touching /dev). */
static bool have_dm(void)
{
	char line[128];
	bool found = false;
	FILE *f = fopen("/proc/misc", "r");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, "device-mapper") != NULL;
	fclose(f);
	return found && sh("command -v dmsetup >/dev/null && command -v losetup >/dev/null") == 0;
}

/* A 4 MiB device: 2 MiB on a loop device, then 2 MiB of "error".  Reads of
 * the error half fail with EIO, a write there fails at the flush, and the
 * flushes after it keep failing. */
static void test_dm_error_target(void)
{
	char cmd[1024], dev[128], loopdev[64] = "", name[64];
	struct ts_srv s;
	struct cl_conn c;
	uint8_t buf[BS];

	if (geteuid() != 0 || !have_dm())
		IOC_SKIP("no device-mapper in this kernel (or not root): injected EIO stands in");
	ts_prepare(&s, NULL, 2u << 20);
	snprintf(name, sizeof(name), "ioc-nbd-err-%d", (int)getpid());
	snprintf(cmd, sizeof(cmd), "losetup -f --show %s", s.img);
	FILE *p = popen(cmd, "r");
	ASSERT_NOT_NULL(p);
	if (!fgets(loopdev, sizeof(loopdev), p))
		loopdev[0] = 0;
	pclose(p);
	loopdev[strcspn(loopdev, "\n")] = 0;
	if (!loopdev[0]) {
		ts_stop_files(&s);
		IOC_SKIP("no free loop device");
	}
	snprintf(cmd, sizeof(cmd), "printf '0 4096 linear %s 0\\n4096 4096 error\\n' | "
		 "dmsetup create %s", loopdev, name);
	if (sh(cmd) != 0) {
		snprintf(cmd, sizeof(cmd), "losetup -d %s", loopdev);
		sh(cmd);
		ts_stop_files(&s);
		IOC_SKIP("dmsetup create refused here");
	}
	snprintf(dev, sizeof(dev), "/dev/mapper/%s", name);
	snprintf(s.img, sizeof(s.img), "%s", dev);
	ts_start(&s, NULL);
	ts_connect(&s, &c, true);
	fill(buf, 0, BS, 1);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, BS, buf), 0);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	expect_data(&c, 0, 1);
	ASSERT_EQ(cl_pread(&c, 0, buf, (3u << 20), BS, NULL, NULL), NBD_EIO);
	/* Buffered: the write lands in the page cache, the flush fails. */
	long w = cl_cmd(&c, 0, NBD_CMD_WRITE, (3u << 20) + BS, BS, buf);
	ASSERT_TRUE(w == 0 || w == NBD_EIO);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EIO);
	expect_data(&c, 0, 1);
	close(c.fd);
	ASSERT_OK(kill(s.pid, SIGTERM));
	ASSERT_TRUE(ts_wait_gone(&s, 10000));
	snprintf(cmd, sizeof(cmd), "dmsetup remove %s && losetup -d %s", name, loopdev);
	ASSERT_EQ(sh(cmd), 0);
	snprintf(s.img, sizeof(s.img), "%s/img", s.dir);
	ts_stop_files(&s);
}

static void test_cleanup(void)
{
	ASSERT_OK(rmdir(ioc_test_tmpdir()));
}

IOC_TEST_MAIN(
	IOC_TEST(test_eio_exactly_the_range),
	IOC_TEST(test_errno_mapping),
	IOC_TEST(test_failed_flush_stays_failed),
	IOC_TEST(test_full_tmpfs),
	IOC_TEST(test_truncated_under_server),
	IOC_TEST(test_dm_error_target),
	IOC_TEST(test_cleanup),
)
