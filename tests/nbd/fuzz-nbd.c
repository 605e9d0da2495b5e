/*
 * Fuzz target for the NBD server: the input is everything a client sends,
 * handshake and transmission alike.  A thread writes it into one end of a
 * socketpair (then half-closes and drains the replies); the blocking
 * transport serves the other end with the in-memory backend, so the whole
 * protocol core runs exactly as in production.
 *
 * Built two ways:
 *  - with -Dfuzz=true and clang: a libFuzzer target (LLVMFuzzerTestOneInput);
 *  - always: an ordinary test (IOC_FUZZ_STANDALONE) that runs built-in
 *    seeds (valid sessions of each kind) and deterministic mutations of
 *    them, and checks the server ends every session without error other
 *    than a protocol disconnect.  "--write-corpus DIR" stores the seeds
 *    as a starting corpus for the libFuzzer build:
 *      test-nbd-fuzz-corpus --write-corpus corpus/
 *      fuzz-nbd -max_total_time=300 corpus/
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nbd-support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct feeder {
	int fd;
	const uint8_t *data;
	size_t size;
	size_t received;
};

static size_t last_received; /* reply bytes of the last run (standalone checks) */

static void *feed(void *arg)
{
	struct feeder *f = arg;
	uint8_t sink[65536];
	size_t off = 0;

	while (off < f->size) {
		ssize_t r = send(f->fd, f->data + off, f->size - off, MSG_NOSIGNAL);
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	shutdown(f->fd, SHUT_WR);
	for (;;) {
		ssize_t r = recv(f->fd, sink, sizeof(sink), 0);
		if (r <= 0)
			break;
		f->received += (size_t)r;
	}
	return NULL;
}

static int run_one(const uint8_t *data, size_t size, enum ioc__nbd_tls_mode tls)
{
	struct ioc__nbd_export *exp[2];
	struct ioc__nbd_cfg cfg = { .exports = exp, .nexports = 2, .tls = tls };
	struct feeder f;
	pthread_t th;
	int sv[2], ret;

	if (ioc__nbd_mem_export_new(&exp[0], "", 1 << 20, false) < 0)
		return -ENOMEM;
	if (ioc__nbd_mem_export_new(&exp[1], "ro", 1 << 20, true) < 0) {
		ioc__nbd_mem_export_free(exp[0]);
		return -ENOMEM;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	f.fd = sv[0];
	f.data = data;
	f.size = size;
	f.received = 0;
	if (pthread_create(&th, NULL, feed, &f) != 0)
		abort();
	ret = ioc__nbd_serve_sync(sv[1], &cfg);
	close(sv[1]);
	pthread_join(th, NULL);
	last_received = f.received;
	close(sv[0]);
	ioc__nbd_mem_export_free(exp[0]);
	ioc__nbd_mem_export_free(exp[1]);
	return ret;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1u << 20))
		return 0;
	/* The server's TLS mode from the input's length, so one corpus
	 * explores all three (the blocking transport ends a session at an
	 * accepted STARTTLS: the core's decisions are what is fuzzed). */
	run_one(data, size, (enum ioc__nbd_tls_mode)(size % 3));
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-standalone.h"

/* ---- seeds ---------------------------------------------------------------- */

struct buf {
	uint8_t b[8192];
	size_t n;
};

static void put(struct buf *s, const void *p, size_t n)
{
	if (s->n + n > sizeof(s->b))
		abort();
	if (n)
		memcpy(s->b + s->n, p, n);
	s->n += n;
}
static void put32(struct buf *s, uint32_t v) { uint8_t b[4]; ioc_nbd_st32(b, v); put(s, b, 4); }
static void put16(struct buf *s, uint16_t v) { uint8_t b[2]; ioc_nbd_st16(b, v); put(s, b, 2); }
static void put64(struct buf *s, uint64_t v) { uint8_t b[8]; ioc_nbd_st64(b, v); put(s, b, 8); }

static void opt(struct buf *s, uint32_t o, const void *d, uint32_t n)
{
	put64(s, NBD_MAGIC_OPTS);
	put32(s, o);
	put32(s, n);
	put(s, d, n);
}

static void go(struct buf *s, const char *name, bool sr, bool ext, bool meta, bool tls)
{
	uint8_t d[64];
	size_t nl = strlen(name);

	put32(s, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
	/* Refused (POLICY) by a server without TLS, so the session goes on
	 * in the clear; mutations run it against the TLS modes too. */
	if (tls)
		opt(s, NBD_OPT_STARTTLS, NULL, 0);
	if (ext)
		opt(s, NBD_OPT_EXTENDED_HEADERS, NULL, 0);
	else if (sr)
		opt(s, NBD_OPT_STRUCTURED_REPLY, NULL, 0);
	if (meta) {
		uint8_t *p = ioc_nbd_st32(d, (uint32_t)nl);
		memcpy(p, name, nl);
		p = ioc_nbd_st32(p + nl, 1);
		p = ioc_nbd_st32(p, 15);
		memcpy(p, "base:allocation", 15);
		opt(s, NBD_OPT_SET_META_CONTEXT, d, (uint32_t)(p + 15 - d));
	}
	opt(s, NBD_OPT_LIST, NULL, 0);
	uint8_t *p = ioc_nbd_st32(d, (uint32_t)nl);
	memcpy(p, name, nl);
	p = ioc_nbd_st16(p + nl, 2);
	p = ioc_nbd_st16(p, NBD_INFO_NAME);
	p = ioc_nbd_st16(p, NBD_INFO_BLOCK_SIZE);
	opt(s, NBD_OPT_INFO, d, (uint32_t)(p - d));
	opt(s, NBD_OPT_GO, d, (uint32_t)(p - d));
}

static void req(struct buf *s, bool ext, uint16_t fl, uint16_t type, uint64_t off,
		uint32_t len)
{
	put32(s, ext ? NBD_MAGIC_EXT_REQUEST : NBD_MAGIC_REQUEST);
	put16(s, fl);
	put16(s, type);
	put64(s, 42);
	put64(s, off);
	if (ext)
		put64(s, len);
	else
		put32(s, len);
	if (type == NBD_CMD_WRITE)
		for (uint32_t i = 0; i < len; i++)
			put(s, &(uint8_t){ (uint8_t)i }, 1);
}

static void session(struct buf *s, const char *name, bool sr, bool ext, bool meta,
		    bool tls)
{
	s->n = 0;
	go(s, name, sr, ext, meta, tls);
	req(s, ext, 0, NBD_CMD_WRITE, 4096, 512);
	req(s, ext, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 70000, 100);
	req(s, ext, 0, NBD_CMD_READ, 0, 8192);
	req(s, ext, 0, NBD_CMD_READ, 0, 131072);
	req(s, ext, NBD_CMD_FLAG_DF, NBD_CMD_READ, 0, 65536);
	req(s, ext, 0, NBD_CMD_BLOCK_STATUS, 0, 1 << 20);
	req(s, ext, NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 0, 1 << 20);
	req(s, ext, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 0, 4096);
	req(s, ext, NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_WRITE_ZEROES, 0, 65536);
	req(s, ext, 0, NBD_CMD_TRIM, 65536, 65536);
	req(s, ext, 0, NBD_CMD_CACHE, 0, 4096);
	req(s, ext, 0, NBD_CMD_FLUSH, 0, 0);
	req(s, ext, 0, NBD_CMD_READ, (1 << 20) - 1, 2);
	req(s, ext, 0, 77, 0, 0);
	req(s, ext, 0, NBD_CMD_DISC, 0, 0);
}

/* xorshift64: deterministic mutations, so a failure reproduces. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static int check(const struct buf *s, const char *what, enum ioc__nbd_tls_mode tls)
{
	int r = run_one(s->b, s->n, tls);

	/* Acceptable ends: clean, protocol disconnect, peer gone, and an
	 * accepted STARTTLS (no TLS in the blocking transport). */
	if (r == 0 || r == -EPROTO || r == -EPIPE || r == -ECONNRESET ||
	    (r == -ENOTSUP && tls != IOC__NBD_TLS_OFF))
		return 0;
	printf("# %s: serve returned %d (%s)\n", what, r, strerror(-r));
	return 1;
}

static const struct { const char *name; bool sr, ext, meta, tls; } kinds[] = {
	{ "", false, false, false, false }, { "", true, false, true, false },
	{ "", true, true, true, false }, { "ro", true, false, false, false },
	{ "ro", false, false, false, false }, { "", true, false, true, true },
};

/* --write-corpus DIR: the seed sessions as a libFuzzer corpus. */
static void write_corpus(const char *dir)
{
	static struct buf s;

	for (size_t k = 0; k < IOC_ARRAY_SIZE(kinds); k++) {
		char name[32];

		session(&s, kinds[k].name, kinds[k].sr, kinds[k].ext, kinds[k].meta,
			kinds[k].tls);
		snprintf(name, sizeof(name), "seed-%zu", k);
		ioc_fuzz_write(dir, name, s.b, s.n);
	}
}

/* Each kind of session: the seed must end cleanly (DISC) after the server
 * sent at least the 8 KiB read; its mutations, each against one of the
 * TLS modes in turn, may end only as check() allows. */
static void test_sessions(void)
{
	unsigned long per_seed = ioc_test_scaled(400);
	static struct buf s, m;

	for (size_t k = 0; k < IOC_ARRAY_SIZE(kinds); k++) {
		int r;

		session(&s, kinds[k].name, kinds[k].sr, kinds[k].ext, kinds[k].meta,
			kinds[k].tls);
		r = run_one(s.b, s.n, IOC__NBD_TLS_OFF);
		if (r != 0 || last_received < 8192)
			ioc_test_fail(__FILE__, __LINE__, "seed %zu: ret %d, %zu reply bytes",
				      k, r, last_received);
		for (unsigned long i = 0; i < per_seed; i++) {
			m = s;
			int edits = 1 + (int)(next_rand() % 4);
			for (int e = 0; e < edits; e++) {
				size_t pos = next_rand() % m.n;
				switch (next_rand() % 4) {
				case 0: m.b[pos] ^= (uint8_t)(1u << (next_rand() % 8)); break;
				case 1: m.b[pos] = (uint8_t)next_rand(); break;
				case 2: m.n = pos; break; /* truncate mid-message */
				default: memset(m.b + pos, 0xff, m.n - pos < 4 ? m.n - pos : 4); break;
				}
				if (m.n == 0)
					break;
			}
			if (check(&m, "mutation", (enum ioc__nbd_tls_mode)(i % 3)))
				ioc_test_fail(__FILE__, __LINE__, "mutation %lu of seed %zu", i, k);
		}
		ioc_test_diag("seed %zu and %lu mutations", k, per_seed);
	}
}

IOC_FUZZ_MAIN(write_corpus, IOC_TEST(test_sessions))
#endif
