/*
 * The real iocore-nbd binary against a raw C client: hostile input,
 * resource bounds, and the shutdown / crash guarantees.
 *
 * The server is started with --fork --pid-file: the parent exits only once
 * the child listens, so waitpid() is the readiness signal (no sleeps).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tap.h"
#include "nbd-client.h"
#include "nbd-test-server.h"

#define IMG_SIZE (64u << 20)

/* When nonzero, the server runs with this many fds at most. */
static rlim_t child_nofile;
/* When set, the image lives here instead of ioc_test_tmpdir(). */
static const char *srv_base;

/* Start iocore-nbd on a fresh image; extra is a NULL-terminated list. */
static void srv_start(struct ts_srv *s, const char *const *extra)
{
	ts_prepare(s, srv_base, IMG_SIZE);
	s->nofile = child_nofile;
	ts_start(s, extra);
}

static void srv_connect(const struct ts_srv *s, struct cl_conn *c, bool structured)
{
	ts_connect(s, c, structured);
	ASSERT_UEQ(c->size, IMG_SIZE);
}

/* A healthy client can still do I/O. */
static void check_alive(const struct ts_srv *s)
{
	struct cl_conn c;
	uint8_t b[4096];

	srv_connect(s, &c, true);
	memset(b, 0x3c, sizeof(b));
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 8192, sizeof(b), b), 0);
	memset(b, 0, sizeof(b));
	ASSERT_EQ(cl_pread(&c, 0, b, 8192, sizeof(b), NULL, NULL), 0);
	ASSERT_EQ(b[0], 0x3c);
	ASSERT_EQ(b[4095], 0x3c);
	close(c.fd);
}

static void test_bad_input(void)
{
	struct ts_srv s;
	struct cl_conn c;
	uint8_t b[65536] = { 0 };

	srv_start(&s, NULL);
	/* Garbage instead of the client flags and options. */
	int fd = cl_connect_unix(s.sock);
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_write(fd, "\x01\x02\x03\x04garbage-garbage-garbage", 27));
	ASSERT_TRUE(cl_closed(fd));
	close(fd);
	/* Unknown client flags. */
	fd = cl_connect_unix(s.sock);
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, 0x80000001u));
	ASSERT_TRUE(cl_closed(fd));
	close(fd);
	/* An option length of 4 GiB. */
	fd = cl_connect_unix(s.sock);
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	uint8_t h[16], *p = ioc_nbd_st64(h, NBD_MAGIC_OPTS);
	p = ioc_nbd_st32(p, NBD_OPT_GO);
	ioc_nbd_st32(p, 0xffffffffu);
	ASSERT_OK(cl_write(fd, h, 16));
	ASSERT_TRUE(cl_closed(fd));
	close(fd);
	/* Transmission: past the end, overflowing, zero length, unknown. */
	srv_connect(&s, &c, true);
	ASSERT_EQ(cl_pread(&c, 0, b, IMG_SIZE - 512, 4096, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_pread(&c, 0, b, UINT64_MAX - 511, 4096, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, IMG_SIZE, 512, b), NBD_ENOSPC);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, 0, b), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(&c, 0, 200, 0, 512, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(&c, 0x4000, NBD_CMD_READ, 0, 512, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_BLOCK_STATUS, 0, 512, NULL), NBD_EINVAL);
	/* Disconnect in the middle of a write payload. */
	ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 9, 0, sizeof(b), NULL));
	ASSERT_OK(cl_write(c.fd, b, 1000));
	close(c.fd);
	/* A bad request magic: disconnected. */
	srv_connect(&s, &c, false);
	ASSERT_OK(cl_write(c.fd, b, 28));
	ASSERT_TRUE(cl_closed(c.fd));
	close(c.fd);
	check_alive(&s);
	ts_stop(&s);
}

static void test_read_only(void)
{
	static const char *const ro[] = { "-r", NULL };
	struct ts_srv s;
	struct cl_conn c;
	uint8_t b[4096] = { 0 };

	srv_start(&s, ro);
	srv_connect(&s, &c, true);
	ASSERT_TRUE(c.tflags & NBD_FLAG_READ_ONLY);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, sizeof(b), b), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE_ZEROES, 0, 4096, NULL), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_TRIM, 0, 4096, NULL), NBD_EPERM);
	ASSERT_EQ(cl_pread(&c, 0, b, 0, sizeof(b), NULL, NULL), 0);
	close(c.fd);
	ts_stop(&s);
}

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* Bytes the process has read through read-like syscalls (pread included). */
static long long rchar(pid_t pid)
{
	char path[64], line[256];
	long long v = -1;

	snprintf(path, sizeof(path), "/proc/%d/io", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "rchar: %lld", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* A client that sends reads and never reads the replies stalls only
 * itself, and the server's memory stays bounded. */
static void test_client_never_reads(void)
{
	struct ts_srv s;
	struct cl_conn c;
	enum { REQS = 400000 };
	uint8_t *batch = malloc(REQS * 28), *p = batch;

	srv_start(&s, NULL);
	srv_connect(&s, &c, false);
	for (int i = 0; i < REQS; i++) {
		p = ioc_nbd_st32(p, NBD_MAGIC_REQUEST);
		p = ioc_nbd_st16(p, 0);
		p = ioc_nbd_st16(p, NBD_CMD_READ);
		p = ioc_nbd_st64(p, (uint64_t)i);
		p = ioc_nbd_st64(p, 0);
		p = ioc_nbd_st32(p, 1u << 20);
	}
	/* Non-blocking: the server stops reading, so our send fills up. */
	int fl = fcntl(c.fd, F_GETFL);
	ASSERT_OK(fcntl(c.fd, F_SETFL, fl | O_NONBLOCK));
	size_t off = 0, total = (size_t)(p - batch);
	for (int tries = 0; off < total && tries < 2000; tries++) {
		ssize_t r = send(c.fd, batch + off, total - off, MSG_NOSIGNAL);
		if (r > 0) {
			off += (size_t)r;
			tries = 0;
			continue;
		}
		ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK);
		struct pollfd pfd = { .fd = c.fd, .events = POLLOUT };
		if (poll(&pfd, 1, 200) == 0)
			break; /* the server stopped reading: what we wanted */
	}
	ASSERT_ULT(off, total); /* it did stop reading */
	check_alive(&s);
	long rss = rss_kib(s.pid);
	ioc_test_diag("server RSS with a stalled client: %ld KiB", rss);
	ASSERT_GT(rss, 0);
	ASSERT_LT(rss, 512 * 1024);
	close(c.fd);
	free(batch);
	check_alive(&s);
	ts_stop(&s);
}

/*
 * A client queues thousands of 1 MiB reads in one write and hangs up at
 * once.  The server finds the socket dead at its first batch of replies and
 * drops the rest of what it had buffered instead of serving it to nobody.
 * With one I/O thread the next connection is handled only after the dead
 * one, so by then the server has read what it will ever read for it.
 */
static void test_hangup_drops_buffered(void)
{
	static const char *const opts[] = { "--iothreads", "1", NULL };
	enum { REQS = 4000 };
	uint8_t *batch = malloc(REQS * 28), *p = batch;
	uint8_t b[4096];
	struct ts_srv s;
	struct cl_conn c;
	long long before, after;

	ASSERT_NOT_NULL(batch);
	srv_start(&s, opts);
	srv_connect(&s, &c, false);
	/* Data at offset 0, so the reads below go to the file. */
	memset(b, 0x5a, sizeof(b));
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, sizeof(b), b), 0);
	for (int i = 0; i < REQS; i++) {
		p = ioc_nbd_st32(p, NBD_MAGIC_REQUEST);
		p = ioc_nbd_st16(p, 0);
		p = ioc_nbd_st16(p, NBD_CMD_READ);
		p = ioc_nbd_st64(p, (uint64_t)i);
		p = ioc_nbd_st64(p, 0);
		p = ioc_nbd_st32(p, 1u << 20);
	}
	before = rchar(s.pid);
	ASSERT_GE(before, 0);
	ASSERT_OK(cl_write(c.fd, batch, (size_t)(p - batch)));
	close(c.fd);
	free(batch);
	check_alive(&s);
	after = rchar(s.pid);
	ioc_test_diag("read for the %d requests of a client that hung up: %lld MiB",
		      REQS, (after - before) >> 20);
	/* At most what was in flight (the server bounds it at 64 MiB) when
	 * it found the socket dead; serving them all would be ~4 GiB. */
	ASSERT_LT(after - before, 128ll << 20);
	ts_stop(&s);
}

/* Hundreds of idle connections: others are served; the handshake timeout
 * closes the idle ones. */
static void test_idle_connections(void)
{
	static const char *const opts[] = { "--handshake-timeout", "1", NULL };
	enum { N = 300 };
	struct ts_srv s;
	int fds[N];

	srv_start(&s, opts);
	for (int i = 0; i < N; i++) {
		fds[i] = cl_connect_unix(s.sock);
		ASSERT_GE(fds[i], 0);
	}
	check_alive(&s);
	/* The idle ones get the greeting, then are closed by the deadline
	 * (cl_closed waits up to CL_TIMEOUT_MS, well above 1 s). */
	for (int i = 0; i < N; i += 7) {
		ASSERT_GE(cl_greeting(fds[i]), 0);
		ASSERT_TRUE(cl_closed(fds[i]));
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	check_alive(&s);
	ts_stop(&s);
}

static void test_max_connections(void)
{
	static const char *const opts[] = { "--max-connections", "2", NULL };
	struct ts_srv s;
	struct cl_conn a, b;

	srv_start(&s, opts);
	srv_connect(&s, &a, false);
	srv_connect(&s, &b, false);
	int fd = cl_connect_unix(s.sock);
	ASSERT_GE(fd, 0);
	ASSERT_TRUE(cl_closed(fd));
	close(fd);
	close(a.fd);
	close(b.fd);
	ts_stop(&s);
}

/* SIGTERM with requests in flight: every request already sent is answered
 * successfully and its data is in the image. */
static void test_sigterm_drains(void)
{
	struct ts_srv s;
	struct cl_conn c;
	enum { N = 256, SZ = 65536 };
	uint8_t *batch = malloc((size_t)N * (28 + SZ)), *p = batch;
	struct cl_reply rep;

	srv_start(&s, NULL);
	srv_connect(&s, &c, false);
	for (int i = 0; i < N; i++) {
		p = ioc_nbd_st32(p, NBD_MAGIC_REQUEST);
		p = ioc_nbd_st16(p, 0);
		p = ioc_nbd_st16(p, NBD_CMD_WRITE);
		p = ioc_nbd_st64(p, (uint64_t)i);
		p = ioc_nbd_st64(p, (uint64_t)i * SZ);
		p = ioc_nbd_st32(p, SZ);
		memset(p, (i % 250) + 1, SZ);
		p += SZ;
	}
	/* Send part of the batch, signal, send the rest: whatever reached the
	 * server before it stopped reading must be answered. */
	size_t total = (size_t)(p - batch), half = total / 2;
	ASSERT_OK(cl_write(c.fd, batch, half));
	ASSERT_OK(kill(s.pid, SIGTERM));
	int fl = fcntl(c.fd, F_GETFL);
	ASSERT_OK(fcntl(c.fd, F_SETFL, fl | O_NONBLOCK));
	size_t off = half;
	while (off < total) {
		ssize_t r = send(c.fd, batch + off, total - off, MSG_NOSIGNAL);
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	ASSERT_OK(fcntl(c.fd, F_SETFL, fl));
	/* Replies may come in any order; the answered set must be a prefix
	 * of what we sent (the server reads a prefix of the stream). */
	bool seen[N] = { false };
	int answered = 0;
	for (int i = 0; i < N; i++) {
		if (cl_reply(&c, &rep, NULL, 0, 0) < 0)
			break;
		ASSERT_TRUE(rep.simple);
		ASSERT_EQ(rep.error, 0);
		ASSERT_ULT(rep.cookie, N);
		ASSERT_FALSE(seen[rep.cookie]);
		seen[rep.cookie] = true;
		answered++;
	}
	for (int i = 0; i < answered; i++)
		ASSERT_TRUE(seen[i]);
	/* At least everything sent before the signal was answered. */
	ASSERT_GE((long)answered * (28 + SZ), (long)half - (28 + SZ));
	ioc_test_diag("%d of %d writes answered after SIGTERM", answered, N);
	ASSERT_TRUE(ts_wait_gone(&s, 10000));
	/* The answered writes are in the image. */
	int fd = open(s.img, O_RDONLY);
	ASSERT_GE(fd, 0);
	uint8_t *b = malloc(SZ);
	for (int i = 0; i < answered; i++) {
		ASSERT_EQ(pread(fd, b, SZ, (off_t)i * SZ), SZ);
		ASSERT_EQ(b[0], (i % 250) + 1);
		ASSERT_EQ(b[SZ - 1], (i % 250) + 1);
	}
	close(fd);
	free(b);
	free(batch);
	close(c.fd);
	unlink(s.img);
	rmdir(s.dir);
}

/* Data written with FUA or followed by a flush survives kill -9. */
static void test_kill9_after_fua_and_flush(void)
{
	struct ts_srv s;
	struct cl_conn c;
	uint8_t b[8192];

	srv_start(&s, NULL);
	srv_connect(&s, &c, true);
	memset(b, 0xa5, sizeof(b));
	ASSERT_EQ(cl_cmd(&c, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 1 << 20, sizeof(b), b), 0);
	memset(b, 0x5a, sizeof(b));
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 2 << 20, sizeof(b), b), 0);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	ASSERT_OK(kill(s.pid, SIGKILL));
	ASSERT_TRUE(ts_wait_gone(&s, 10000));
	close(c.fd);
	int fd = open(s.img, O_RDONLY);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(pread(fd, b, sizeof(b), 1 << 20), (ssize_t)sizeof(b));
	ASSERT_EQ(b[0], 0xa5);
	ASSERT_EQ(b[8191], 0xa5);
	ASSERT_EQ(pread(fd, b, sizeof(b), 2 << 20), (ssize_t)sizeof(b));
	ASSERT_EQ(b[0], 0x5a);
	ASSERT_EQ(b[8191], 0x5a);
	close(fd);
	unlink(s.img);
	unlink(s.sock);
	unlink(s.pidf);
	rmdir(s.dir);
}

/* Out of file descriptors: the server neither dies nor stops accepting
 * for good; connections queued meanwhile are served once fds free up. */
static void test_out_of_fds(void)
{
	enum { N = 80 };
	struct ts_srv s;
	struct cl_conn c[N];
	int extra;

	child_nofile = 48;
	srv_start(&s, NULL);
	child_nofile = 0;
	for (int i = 0; i < N; i++) {
		c[i].fd = cl_connect_unix(s.sock);
		ASSERT_GE(c[i].fd, 0); /* queued in the backlog at worst */
	}
	/* Free the server's fds, then a newcomer is served. */
	for (int i = 0; i < N; i++)
		close(c[i].fd);
	extra = cl_connect_unix(s.sock);
	ASSERT_GE(extra, 0);
	ASSERT_GE(cl_greeting(extra), 0);
	close(extra);
	check_alive(&s);
	ts_stop(&s);
}

/* --cache none: O_DIRECT needs aligned requests; a client that negotiated
 * block sizes is held to the advertised minimum (EINVAL otherwise). */
static void test_cache_none_alignment(void)
{
	static const char *const opts[] = { "--cache", "none", NULL };
	char base[] = "/var/tmp/ioc-nbd-direct-XXXXXX";
	struct ts_srv s;
	struct cl_conn c;
	uint8_t *b = NULL;

	/* tmpfs may lack O_DIRECT: use a disk-backed directory, and skip only
	 * when the kernel refuses O_DIRECT there; any other failure of the
	 * server to start is a failure. */
	if (!mkdtemp(base))
		ioc_test_fail(__FILE__, __LINE__, "mkdtemp %s: %s", base,
			      strerror(errno));
	char probe[sizeof(base) + 16];
	snprintf(probe, sizeof(probe), "%s/probe", base);
	int pfd = open(probe, O_RDWR | O_CREAT | O_DIRECT, 0600);
	int perr = errno;
	if (pfd >= 0)
		close(pfd);
	unlink(probe);
	if (pfd < 0) {
		rmdir(base);
		if (perr == EINVAL || perr == EOPNOTSUPP)
			IOC_SKIP("the file system under /var/tmp refuses O_DIRECT");
		ioc_test_fail(__FILE__, __LINE__, "open(O_DIRECT) in %s: %s", base,
			      strerror(perr));
	}
	srv_base = base;
	srv_start(&s, opts);
	srv_base = NULL;
	srv_connect(&s, &c, true);
	ASSERT_GT(c.min_block, 1);
	ASSERT_OK(posix_memalign((void **)&b, 4096, 8192));
	memset(b, 0x42, 8192);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, 8192, b), 0);
	ASSERT_EQ(cl_pread(&c, 0, b, 0, 8192, NULL, NULL), 0);
	ASSERT_EQ(b[8191], 0x42);
	ASSERT_EQ(cl_pread(&c, 0, b, 1, 512, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, 100, b), NBD_EINVAL);
	close(c.fd);
	free(b);
	ts_stop(&s);
	rmdir(base);
}

static void test_cleanup(void)
{
	ASSERT_OK(rmdir(ioc_test_tmpdir()));
}

IOC_TEST_MAIN(
	IOC_TEST(test_bad_input),
	IOC_TEST(test_read_only),
	IOC_TEST(test_client_never_reads),
	IOC_TEST(test_hangup_drops_buffered),
	IOC_TEST(test_idle_connections),
	IOC_TEST(test_max_connections),
	IOC_TEST(test_out_of_fds),
	IOC_TEST(test_cache_none_alignment),
	IOC_TEST(test_sigterm_drains),
	IOC_TEST(test_kill9_after_fua_and_flush),
	IOC_TEST(test_cleanup),
)
