/*
 * Large READs and WRITEs through the real iocore-nbd, where READ data
 * above the threshold (when asked for) goes from the page cache to the
 * socket by splice(2) and WRITE payloads from the socket to the file.
 * Both block-layer backends, Unix and TCP sockets, simple, structured and
 * extended replies, replies of many sizes pipelined on one socket (so a
 * spliced reply between copied ones would show any interleaving), and the
 * fallbacks: splice off, a socket that refuses it after the header went
 * out, a read that runs past a file cut short underneath, and a client
 * that hangs up with large replies unsent; WRITE payloads arriving in
 * small pieces, a client hanging up in the middle of one.  Every byte is
 * checked.
 *
 * IOC_NBD_TEST_SPLICE (read by the server, for tests only) is "off",
 * "refuse" or a threshold in bytes.
 */
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/magic.h>
#include <linux/sockios.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>

#include "nbd-test-server.h"

#define IMG_SIZE (32u << 20)

static int srv_port;

/* A port that was free a moment ago (the server takes it next). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ASSERT_GE(fd, 0);
	ASSERT_OK(bind(fd, (struct sockaddr *)&a, sizeof(a)));
	ASSERT_OK(getsockname(fd, (struct sockaddr *)&a, &l));
	close(fd);
	return ntohs(a.sin_port);
}

/* Start on s->img with backend aio over Unix or TCP, splice mode zc (NULL:
 * the default), which the forked server inherits from our environment. */
static void start(struct ts_srv *s, const char *aio, bool tcp, const char *zc)
{
	char port[16];
	const char *unix_opts[] = { "--aio", aio, NULL };
	const char *tcp_opts[] = { "--aio", aio, "-b", "127.0.0.1", "-p", port, NULL };

	if (tcp) {
		srv_port = free_port();
		snprintf(port, sizeof(port), "%d", srv_port);
	}
	if (zc)
		setenv("IOC_NBD_TEST_SPLICE", zc, 1);
	else
		unsetenv("IOC_NBD_TEST_SPLICE");
	ts_start(s, tcp ? tcp_opts : unix_opts);
	unsetenv("IOC_NBD_TEST_SPLICE");
}

static void connect_to(const struct ts_srv *s, bool tcp, struct cl_conn *c, int mode)
{
	memset(c, 0, sizeof(*c));
	if (tcp) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_port = htons((uint16_t)srv_port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ASSERT_GE(c->fd, 0);
		ASSERT_OK(connect(c->fd, (struct sockaddr *)&a, sizeof(a)));
	} else {
		c->fd = cl_connect_unix(s->sock);
		ASSERT_GE(c->fd, 0);
	}
	c->structured = mode >= 1;
	c->extended = mode == 2;
	ASSERT_EQ(cl_go(c, ""), 0);
	ASSERT_UEQ(c->size, IMG_SIZE);
}

/* The pattern byte at image offset off for generation gen. */
static uint8_t pat(uint64_t off, unsigned gen)
{
	return (uint8_t)((off * 2654435761u >> 13) ^ (off >> 12) ^ gen);
}

static void fill(uint8_t *b, uint64_t off, size_t len, unsigned gen)
{
	for (size_t i = 0; i < len; i++)
		b[i] = pat(off + i, gen);
}

/* Pipelined requests: sizes around and above the threshold, page
 * aligned and not, plus small ones between them. */
static const struct { uint64_t off, len; } reqs[] = {
	{ 0, 1u << 20 }, { 1u << 20, 4096 }, { (1u << 20) + 4096, 65536 },
	{ (2u << 20) + 512, 65536 + 1000 }, { 3u << 20, 65535 },
	{ (4u << 20) + 100, 3u << 20 }, { 8u << 20, 512 },
	{ (9u << 20) - 7, (1u << 20) + 13 }, { IMG_SIZE - 200000, 200000 },
};
#define NREQ (sizeof(reqs) / sizeof(reqs[0]))

/* Write every range with large pipelined WRITEs, then read them back
 * with pipelined READs (all sent before any reply is read), twice. */
static void exercise(const struct ts_srv *s, bool tcp, int mode, unsigned gen)
{
	struct cl_conn c;
	uint8_t *b = malloc(4u << 20), *got = malloc(4u << 20);

	ASSERT_NOT_NULL(b);
	ASSERT_NOT_NULL(got);
	connect_to(s, tcp, &c, mode);
	for (unsigned i = 0; i < NREQ; i++) {
		fill(b, reqs[i].off, reqs[i].len, gen);
		/* FUA on every third: those are written the ordinary way. */
		ASSERT_OK(cl_req(&c, i % 3 == 2 ? NBD_CMD_FLAG_FUA : 0, NBD_CMD_WRITE,
				 100 + i, reqs[i].off, reqs[i].len, b));
	}
	for (unsigned i = 0; i < NREQ; i++) {
		struct cl_reply rep;
		uint8_t pl[512];

		ASSERT_OK(cl_reply(&c, &rep, pl, sizeof(pl), 0));
		ASSERT_TRUE(rep.cookie >= 100 && rep.cookie < 100 + NREQ);
		ASSERT_EQ(cl_reply_error(&rep, pl), 0);
	}
	for (int round = 0; round < 2; round++) {
		for (unsigned i = 0; i < NREQ; i++)
			ASSERT_OK(cl_req(&c, 0, NBD_CMD_READ, 200 + i, reqs[i].off,
					 reqs[i].len, NULL));
		/* Replies come in any order; each is one simple reply or,
		 * structured, chunks of one request only (data then DONE). */
		for (unsigned k = 0; k < NREQ; k++) {
			struct cl_reply rep;
			uint8_t *pl = malloc((4u << 20) + 64);
			uint64_t ck = 0, have = 0;
			unsigned i = 0;

			ASSERT_NOT_NULL(pl);
			for (;;) {
				ASSERT_OK(cl_reply(&c, &rep, pl, (4u << 20) + 64, 0));
				if (!ck) {
					ck = rep.cookie;
					ASSERT_TRUE(ck >= 200 && ck < 200 + NREQ);
					i = (unsigned)(ck - 200);
				}
				ASSERT_UEQ(rep.cookie, ck);
				if (rep.simple) {
					ASSERT_EQ(rep.error, 0);
					/* The data follows the header. */
					ASSERT_OK(cl_read(c.fd, got, reqs[i].len));
					have = reqs[i].len;
					break;
				}
				if (rep.type == NBD_REPLY_TYPE_OFFSET_DATA) {
					uint64_t o = ioc_nbd_ld64(pl);

					ASSERT_TRUE(o >= reqs[i].off &&
						    o + rep.plen - 8 <= reqs[i].off + reqs[i].len);
					memcpy(got + (o - reqs[i].off), pl + 8, rep.plen - 8);
					have += rep.plen - 8;
				} else {
					ASSERT_EQ(rep.type, NBD_REPLY_TYPE_NONE);
				}
				if (rep.flags & NBD_REPLY_FLAG_DONE)
					break;
			}
			ASSERT_UEQ(have, reqs[i].len);
			fill(b, reqs[i].off, reqs[i].len, gen);
			ASSERT_OK(memcmp(got, b, reqs[i].len));
			free(pl);
		}
	}
	close(c.fd);
	free(b);
	free(got);
}

/* The pipes among the server's open files, by inode (up to max). */
static int server_pipes_ino(const struct ts_srv *s, unsigned long *ino, int max)
{
	char path[64], link[64];
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)s->pid);
	DIR *d = opendir(path);
	ASSERT_NOT_NULL(d);
	for (struct dirent *e; (e = readdir(d));) {
		char fp[512];
		ssize_t l;

		snprintf(fp, sizeof(fp), "%s/%.255s", path, e->d_name);
		l = readlink(fp, link, sizeof(link) - 1);
		if (l > 0) {
			link[l] = 0;
			if (strncmp(link, "pipe:[", 6) == 0 && n < max)
				ino[n++] = strtoul(link + 6, NULL, 10);
		}
	}
	closedir(d);
	return n;
}

static int server_pipes(const struct ts_srv *s)
{
	unsigned long ino[256];

	return server_pipes_ino(s, ino, 256);
}

/* Pipes the server opened for one large read on a fresh connection: the
 * spliced path keeps its pipes per connection.  Pipes of other
 * connections (or the start-up handshake with --fork) may only go away
 * meanwhile, so only new ones count. */
static int pipes_after_large_read(const struct ts_srv *s, bool tcp)
{
	struct cl_conn c;
	uint8_t *b = malloc(1u << 20);
	unsigned long before[256], after[256];
	int nb, na, fresh = 0;

	ASSERT_NOT_NULL(b);
	connect_to(s, tcp, &c, 1);
	nb = server_pipes_ino(s, before, 256);
	ASSERT_EQ(cl_pread(&c, 0, b, 0, 1u << 20, NULL, NULL), 0);
	na = server_pipes_ino(s, after, 256);
	for (int i = 0; i < na; i++) {
		bool old = false;

		for (int j = 0; j < nb; j++)
			old = old || after[i] == before[j];
		fresh += !old;
	}
	close(c.fd);
	free(b);
	return fresh;
}

static void run(const char *aio, bool tcp, const char *zc)
{
	struct ts_srv s;

	ts_prepare(&s, NULL, IMG_SIZE);
	start(&s, aio, tcp, zc);
	for (int mode = 0; mode < 3; mode++)
		exercise(&s, tcp, mode, (unsigned)mode * 7 + (tcp ? 3 : 0));
	int fresh = pipes_after_large_read(&s, tcp);
	/* Reads are spliced only when asked for (not by default). */
	if (!zc || strcmp(zc, "off") == 0)
		ASSERT_EQ(fresh, 0);
	else
		ASSERT_GT(fresh, 0); /* the spliced path was taken */
	ts_stop(&s);
}

static void test_default(void) { run("io_uring", false, NULL); }
static void test_uring_unix(void) { run("io_uring", false, "65536"); }
static void test_threads_unix(void) { run("threads", false, "65536"); }
static void test_uring_tcp(void) { run("io_uring", true, "65536"); }
static void test_threads_tcp(void) { run("threads", true, "65536"); }
static void test_splice_off(void) { run("io_uring", false, "off"); }
static void test_splice_refused_unix(void) { run("io_uring", false, "refuse"); }
static void test_splice_refused_tcp(void) { run("threads", true, "refuse"); }
static void test_low_threshold(void) { run("io_uring", false, "4096"); }

/* The same through the command line: --splice-reads turns spliced reads
 * on (test_default shows they are off without it). */
static void test_splice_reads_option(void)
{
	struct ts_srv s;
	const char *opts[] = { "--splice-reads", "64K", NULL };

	ts_prepare(&s, NULL, IMG_SIZE);
	unsetenv("IOC_NBD_TEST_SPLICE");
	ts_start(&s, opts);
	for (int mode = 0; mode < 3; mode++)
		exercise(&s, false, mode, (unsigned)mode * 5 + 1);
	ASSERT_GT(pipes_after_large_read(&s, false), 0);
	ts_stop(&s);
}

/* The file shrinks under the server: the part past the new end reads as
 * zeroes (the block layer's rule), so the splice falls short and the read
 * is copied instead; the stream stays in order. */
static void test_file_cut_short(void)
{
	struct ts_srv s;
	struct cl_conn c;
	uint8_t *b = malloc(2u << 20), *want = malloc(2u << 20);

	ASSERT_NOT_NULL(b);
	ASSERT_NOT_NULL(want);
	ts_prepare(&s, NULL, IMG_SIZE);
	start(&s, "io_uring", false, "65536");
	connect_to(&s, false, &c, 1);
	fill(b, 0, 2u << 20, 5);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, IMG_SIZE - (2u << 20), 2u << 20, b), 0);
	ASSERT_OK(truncate(s.img, IMG_SIZE - (1u << 20)));
	memcpy(want, b, 1u << 20);
	memset(want + (1u << 20), 0, 1u << 20);
	memset(b, 0xee, 2u << 20);
	ASSERT_EQ(cl_pread(&c, 0, b, IMG_SIZE - (2u << 20), 2u << 20, NULL, NULL), 0);
	ASSERT_OK(memcmp(b, want, 2u << 20));
	memset(b, 0xee, 1u << 20);
	ASSERT_EQ(cl_pread(&c, 0, b, 0, 1u << 20, NULL, NULL), 0);
	ASSERT_EQ(b[0], 0);
	close(c.fd);
	free(b);
	free(want);
	ts_stop(&s);
}

/* A client queues large reads and hangs up without reading: the server
 * drops them, closes their pipes, and serves the next client. */
static void test_hangup_with_large_replies(void)
{
	struct ts_srv s;
	struct cl_conn c;
	uint8_t *b = malloc(1u << 20);

	ASSERT_NOT_NULL(b);
	ts_prepare(&s, NULL, IMG_SIZE);
	start(&s, "io_uring", false, "65536");
	int before = server_pipes(&s);
	for (int k = 0; k < 3; k++) {
		connect_to(&s, false, &c, k & 1);
		for (unsigned i = 0; i < 24; i++)
			ASSERT_OK(cl_req(&c, 0, NBD_CMD_READ, i, (uint64_t)i << 20, 1u << 20,
					 NULL));
		close(c.fd);
	}
	connect_to(&s, false, &c, 1);
	fill(b, 0, 1u << 20, 9);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, 1u << 20, b), 0);
	memset(b, 0, 1u << 20);
	ASSERT_EQ(cl_pread(&c, 0, b, 0, 1u << 20, NULL, NULL), 0);
	uint8_t *want = malloc(1u << 20);
	ASSERT_NOT_NULL(want);
	fill(want, 0, 1u << 20, 9);
	ASSERT_OK(memcmp(b, want, 1u << 20));
	close(c.fd);
	/* Every connection is gone once the server closed its socket: then
	 * its pipes are closed too.  A bounded wait for that, polled. */
	int n = before + 1;
	for (int i = 0; i < 10000 && n > before; i++) {
		n = server_pipes(&s);
		if (n > before)
			usleep(1000);
	}
	/* At most as many: the --fork start-up pipe may close meanwhile. */
	ASSERT_LE(n, before);
	free(b);
	free(want);
	ts_stop(&s);
}

/* Read len bytes at off back on c and compare with generation gen. */
static void check_range(struct cl_conn *c, uint64_t off, size_t len, unsigned gen)
{
	uint8_t *got = malloc(len), *want = malloc(len);

	ASSERT_NOT_NULL(got);
	ASSERT_NOT_NULL(want);
	ASSERT_EQ(cl_pread(c, 0, got, off, len, NULL, NULL), 0);
	fill(want, off, len, gen);
	ASSERT_OK(memcmp(got, want, len));
	free(got);
	free(want);
}

/* len bytes of b in pieces of 100 + (k * mul) % mod bytes, yielding
 * after every few: the server sees the socket run dry again and again. */
static void send_pieces(int fd, const uint8_t *b, size_t len, size_t mul, size_t mod,
			unsigned every)
{
	for (size_t at = 0, k = 0; at < len; k++) {
		size_t piece = 100 + (k * mul) % mod;

		if (piece > len - at)
			piece = len - at;
		ASSERT_OK(cl_write(fd, b + at, piece));
		at += piece;
		if (k % every == 0)
			sched_yield();
	}
}

/* The next n replies, each without an error. */
static void replies_ok(struct cl_conn *c, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct cl_reply rep;
		uint8_t pl[512];

		ASSERT_OK(cl_reply(c, &rep, pl, sizeof(pl), 0));
		ASSERT_EQ(cl_reply_error(&rep, pl), 0);
	}
}

/* Large WRITE payloads that arrive in many small pieces (the spliced
 * path sees the socket run dry again and again, and a pipe's slots fill
 * with small segments; the direct path gets the next header with a
 * payload's end or without it), pipelined with small requests, on both
 * sockets, spliced or not: every byte lands. */
static void test_payload_in_pieces(void)
{
	static const struct { uint64_t off, len; } w[] = {
		{ 0, 1u << 20 }, { (2u << 20) + 100, (3u << 20) + 5 }, { 7u << 20, 300000 },
	};
	uint8_t *b = malloc(4u << 20);

	ASSERT_NOT_NULL(b);
	for (int run = 0; run < 4; run++) {
		struct ts_srv s;
		struct cl_conn c;
		bool tcp = run & 1;

		ts_prepare(&s, NULL, IMG_SIZE);
		/* Spliced, then received into the request's buffer. */
		start(&s, "io_uring", tcp, run < 2 ? NULL : "off");
		connect_to(&s, tcp, &c, 1);
		for (unsigned i = 0; i < 3; i++) {
			fill(b, w[i].off, w[i].len, 11);
			ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 10 + i, w[i].off, w[i].len, NULL));
			send_pieces(c.fd, b, w[i].len, 997, 3000, 16);
			/* A small request between the large ones. */
			ASSERT_OK(cl_req(&c, 0, NBD_CMD_FLUSH, 20 + i, 0, 0, NULL));
		}
		replies_ok(&c, 6);
		for (unsigned i = 0; i < 3; i++)
			check_range(&c, w[i].off, w[i].len, 11);
		close(c.fd);
		ts_stop(&s);
	}
	free(b);
}

/* A client sends large WRITEs and stops in the middle of the last one's
 * payload: the complete ones are written and answered, the cut one
 * writes nothing, then the server closes.  Another sends large WRITEs and
 * hangs up at once, with writes still on the writer thread: the server
 * goes on serving. */
static void test_hangup_mid_payload(void)
{
	struct ts_srv s;
	struct cl_conn c;
	uint8_t *b = malloc(1u << 20);
	char eof;

	ASSERT_NOT_NULL(b);
	ts_prepare(&s, NULL, IMG_SIZE);
	start(&s, "io_uring", false, NULL);
	connect_to(&s, false, &c, 1);
	fill(b, 8u << 20, 1u << 20, 5);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 8u << 20, 1u << 20, b), 0);
	for (unsigned i = 0; i < 4; i++) {
		fill(b, (uint64_t)i << 20, 1u << 20, 3);
		ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 30 + i, (uint64_t)i << 20, 1u << 20, b));
	}
	fill(b, 8u << 20, 1u << 20, 4);
	ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 40, 8u << 20, 1u << 20, NULL));
	ASSERT_OK(cl_write(c.fd, b, 600000));
	ASSERT_OK(shutdown(c.fd, SHUT_WR));
	for (unsigned i = 0; i < 4; i++) {
		struct cl_reply rep;
		uint8_t pl[512];

		ASSERT_OK(cl_reply(&c, &rep, pl, sizeof(pl), 0));
		ASSERT_TRUE(rep.cookie >= 30 && rep.cookie < 34);
		ASSERT_EQ(cl_reply_error(&rep, pl), 0);
	}
	ASSERT_EQ(read(c.fd, &eof, 1), 0); /* closed once all was answered */
	close(c.fd);
	connect_to(&s, false, &c, 1);
	for (unsigned i = 0; i < 4; i++)
		check_range(&c, (uint64_t)i << 20, 1u << 20, 3);
	check_range(&c, 8u << 20, 1u << 20, 5); /* the cut write: untouched */
	close(c.fd);

	for (int k = 0; k < 3; k++) {
		connect_to(&s, false, &c, k & 1);
		fill(b, 12u << 20, 1u << 20, 6);
		for (unsigned i = 0; i < 8; i++)
			ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, i, 12u << 20, 1u << 20, b));
		close(c.fd);
	}
	connect_to(&s, false, &c, 1);
	fill(b, 20u << 20, 1u << 20, 7);
	ASSERT_EQ(cl_cmd(&c, 0, NBD_CMD_WRITE, 20u << 20, 1u << 20, b), 0);
	check_range(&c, 20u << 20, 1u << 20, 7);
	close(c.fd);
	free(b);
	ts_stop(&s);
}

/* An image the block layer maps: every block allocated (a sparse one is
 * never mapped; see ioc_blk_map_read()).  True when WRITE payloads may be
 * received into that mapping: tmpfs with no swap configured. */
static bool prepare_mapped(struct ts_srv *s)
{
	struct statfs sf;
	char line[256];
	int lines = 0;
	int fd;
	FILE *f;

	ts_prepare(s, NULL, IMG_SIZE);
	fd = open(s->img, O_RDWR);
	ASSERT_GE(fd, 0);
	ASSERT_OK(fallocate(fd, 0, 0, IMG_SIZE));
	ASSERT_OK(fstatfs(fd, &sf));
	close(fd);
	f = fopen("/proc/swaps", "r");
	while (f && fgets(line, sizeof(line), f))
		lines++;
	if (f)
		fclose(f);
	return sf.f_type == TMPFS_MAGIC && f && lines == 1;
}

/* Until the server has read everything sent on fd (a Unix socket:
 * SIOCOUTQ counts what the peer has not read), for at most 10 s. */
static void wait_read(int fd)
{
	int q = -1;

	for (int i = 0; i < 100000; i++) {
		ASSERT_OK(ioctl(fd, SIOCOUTQ, &q));
		if (q == 0)
			break;
		usleep(100);
	}
	ASSERT_EQ(q, 0);
}

/* Payloads received into the image's mapping (the default on a mapped
 * image): the pipelined mix, and payloads arriving in small pieces, large
 * ones and small ones whose header the server read first. */
static void test_map_writes(void)
{
	static const struct { uint64_t off, len; } w[] = {
		{ 100, 1u << 20 }, { (2u << 20) + 4096, (3u << 20) + 5 }, { 7u << 20, 300000 },
		{ (10u << 20) + 300, 4096 }, { 11u << 20, 8192 }, { (12u << 20) - 100, 6000 },
	};
	uint8_t *b = malloc(4u << 20);
	struct ts_srv s;
	struct cl_conn c;

	ASSERT_NOT_NULL(b);
	if (!prepare_mapped(&s))
		ioc_test_diag("map writes: the test directory is not tmpfs without swap");
	start(&s, "io_uring", false, "off");
	for (int mode = 0; mode < 3; mode++)
		exercise(&s, false, mode, (unsigned)mode * 3 + 40);
	connect_to(&s, false, &c, 1);
	for (unsigned i = 0; i < 6; i++) {
		fill(b, w[i].off, w[i].len, 12);
		ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 10 + i, w[i].off, w[i].len, NULL));
		if (w[i].len < 16384)
			wait_read(c.fd);
		send_pieces(c.fd, b, w[i].len, 7919, 9000, 8);
	}
	replies_ok(&c, 6);
	for (unsigned i = 0; i < 6; i++)
		check_range(&c, w[i].off, w[i].len, 12);
	close(c.fd);
	ts_stop(&s);
	free(b);
}

/* A client hangs up in the middle of a payload going into the mapping:
 * the whole 4 KiB blocks of the image that arrived are written, the block
 * the payload stopped in and everything after it are not (no block is
 * torn); a payload sent in one piece or many, from a block boundary or
 * not; a large one, and a small one (8 KiB) whose header the server read
 * before any of it came.  Without the mapping nothing of the cut write
 * lands. */
static void test_map_write_hangup(void)
{
	uint8_t *b = malloc(1u << 20), *got = malloc(1u << 20), *want = malloc(1u << 20);

	ASSERT_NOT_NULL(b);
	ASSERT_NOT_NULL(got);
	ASSERT_NOT_NULL(want);
	for (int run = 0; run < 8; run++) {
		bool small = run >= 4;
		const size_t len = small ? 8192 : 1u << 20, sent = small ? 5000 : 600000;
		uint64_t off = (8u << 20) + (run & 1 ? 1000 : 0), landed = 0;
		struct ts_srv s;
		struct cl_conn c;
		bool mapped = prepare_mapped(&s);
		char eof;

		start(&s, "io_uring", false, NULL);
		connect_to(&s, false, &c, 1);
		fill(b, off, len, 21);
		ASSERT_OK(cl_req(&c, 0, NBD_CMD_WRITE, 1, off, len, NULL));
		if (small)
			wait_read(c.fd);
		for (size_t at = 0, k = 0; at < sent; k++) {
			size_t piece = run & 2 ? 1 + (k * 4049) % 7000 : sent;

			if (piece > sent - at)
				piece = sent - at;
			ASSERT_OK(cl_write(c.fd, b + at, piece));
			at += piece;
			if (k % 8 == 0)
				sched_yield();
		}
		ASSERT_OK(shutdown(c.fd, SHUT_WR));
		ASSERT_EQ(read(c.fd, &eof, 1), 0); /* nothing answered, closed */
		close(c.fd);
		if (mapped)
			landed = (off + sent) / 4096 * 4096 - off;
		else
			ioc_test_diag("map writes: the test directory is not tmpfs without swap");
		memcpy(want, b, landed);
		memset(want + landed, 0, len - landed);
		connect_to(&s, false, &c, 1);
		ASSERT_EQ(cl_pread(&c, 0, got, off, len, NULL, NULL), 0);
		ASSERT_OK(memcmp(got, want, len));
		close(c.fd);
		ts_stop(&s);
	}
	free(b);
	free(got);
	free(want);
}

static void test_cleanup(void)
{
	ASSERT_OK(rmdir(ioc_test_tmpdir()));
}

IOC_TEST_MAIN(
	IOC_TEST(test_default),
	IOC_TEST(test_uring_unix),
	IOC_TEST(test_threads_unix),
	IOC_TEST(test_uring_tcp),
	IOC_TEST(test_threads_tcp),
	IOC_TEST(test_splice_off),
	IOC_TEST(test_splice_refused_unix),
	IOC_TEST(test_splice_refused_tcp),
	IOC_TEST(test_low_threshold),
	IOC_TEST(test_splice_reads_option),
	IOC_TEST(test_file_cut_short),
	IOC_TEST(test_hangup_with_large_replies),
	IOC_TEST(test_payload_in_pieces),
	IOC_TEST(test_hangup_mid_payload),
	IOC_TEST(test_map_writes),
	IOC_TEST(test_map_write_hangup),
	IOC_TEST(test_cleanup),
)
