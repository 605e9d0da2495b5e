/*
 * The NBD protocol core over a socketpair: the blocking transport serves
 * the in-memory backend on a thread; the test speaks raw protocol to it.
 * Covers the handshake options, the commands, simple/structured/extended
 * replies and the bad inputs that must be refused or disconnected.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "tap.h"
#include "nbd-client.h"
#include "nbd-support.h"

#define EXP_SIZE (4u << 20)

struct fixture {
	struct ioc__nbd_export *exp[2];
	struct ioc__nbd_export *list[2];
	struct ioc__nbd_cfg cfg;
	int sv[2];
	pthread_t th;
	int ret;
	struct cl_conn c;
};

static void *server_main(void *arg)
{
	struct fixture *f = arg;

	f->ret = ioc__nbd_serve_sync(f->sv[1], &f->cfg);
	close(f->sv[1]);
	return NULL;
}

static void start_tls(struct fixture *f, enum ioc__nbd_tls_mode tls)
{
	memset(f, 0, sizeof(*f));
	f->cfg.tls = tls;
	ASSERT_OK(ioc__nbd_mem_export_new(&f->exp[0], "disk", EXP_SIZE, false));
	ASSERT_OK(ioc__nbd_mem_export_new(&f->exp[1], "ro", EXP_SIZE, true));
	f->exp[0]->description = strdup("a test disk");
	f->list[0] = f->exp[0];
	f->list[1] = f->exp[1];
	f->cfg.exports = f->list;
	f->cfg.nexports = 2;
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, f->sv));
	ASSERT_EQ(pthread_create(&f->th, NULL, server_main, f), 0);
	f->c.fd = f->sv[0];
}

static void start(struct fixture *f)
{
	start_tls(f, IOC__NBD_TLS_OFF);
}

/* Close our end, join the server; returns its result. */
static int finish(struct fixture *f)
{
	close(f->sv[0]);
	pthread_join(f->th, NULL);
	ioc__nbd_mem_export_free(f->exp[0]);
	ioc__nbd_mem_export_free(f->exp[1]);
	return f->ret;
}

static void go(struct fixture *f, const char *name, bool structured,
	       bool extended, bool meta)
{
	start(f);
	f->c.structured = structured;
	f->c.extended = extended;
	f->c.meta = meta;
	ASSERT_EQ(cl_go(&f->c, name), 0);
	ASSERT_UEQ(f->c.size, EXP_SIZE);
}

static void test_greeting_and_abort(void)
{
	struct fixture f;

	start(&f);
	int fl = cl_greeting(f.c.fd);
	ASSERT_EQ(fl, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_EQ(cl_opt_simple(f.c.fd, NBD_OPT_ABORT), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), 0);
}

static void test_bad_client_flags(void)
{
	struct fixture f;

	start(&f);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, 1u << 7));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void test_garbage_handshake(void)
{
	struct fixture f;
	static const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";

	start(&f);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_write(f.c.fd, junk, sizeof(junk)));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void test_options(void)
{
	struct fixture f;
	uint8_t d[256];
	uint32_t l;

	start(&f);
	int fd = f.c.fd;
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	/* Unknown option: UNSUP, and the session goes on. */
	ASSERT_OK(cl_opt(fd, 4242, "abc", 3));
	ASSERT_EQ(cl_opt_reply(fd, 4242, NULL, 0, NULL), (long)NBD_REP_ERR_UNSUP);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STARTTLS), (long)NBD_REP_ERR_POLICY);
	/* LIST: one REP_SERVER per export then ACK. */
	ASSERT_OK(cl_opt(fd, NBD_OPT_LIST, NULL, 0));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_SERVER);
	ASSERT_EQ(ioc_nbd_ld32(d), 4);
	ASSERT_MEM_EQ(d + 4, "disk", 4);
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_SERVER);
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_ACK);
	/* LIST with data is invalid. */
	ASSERT_OK(cl_opt(fd, NBD_OPT_LIST, "x", 1));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST, NULL, 0, NULL), (long)NBD_REP_ERR_INVALID);
	/* Meta contexts need structured replies first. */
	uint8_t q[64], *p = q;
	p = ioc_nbd_st32(p, 0);
	p = ioc_nbd_st32(p, 0);
	ASSERT_OK(cl_opt(fd, NBD_OPT_LIST_META_CONTEXT, q, (uint32_t)(p - q)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST_META_CONTEXT, NULL, 0, NULL),
		  (long)NBD_REP_ERR_INVALID);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY), NBD_REP_ACK);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY), (long)NBD_REP_ERR_INVALID);
	/* LIST_META_CONTEXT with no query lists base:allocation. */
	ASSERT_OK(cl_opt(fd, NBD_OPT_LIST_META_CONTEXT, q, (uint32_t)(p - q)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST_META_CONTEXT, d, sizeof(d), &l),
		  NBD_REP_META_CONTEXT);
	ASSERT_EQ(l, 4 + 15);
	ASSERT_MEM_EQ(d + 4, "base:allocation", 15);
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_LIST_META_CONTEXT, NULL, 0, NULL), NBD_REP_ACK);
	/* A lying query length. */
	p = q;
	p = ioc_nbd_st32(p, 0);
	p = ioc_nbd_st32(p, 1);
	p = ioc_nbd_st32(p, 1000);
	ASSERT_OK(cl_opt(fd, NBD_OPT_SET_META_CONTEXT, q, (uint32_t)(p - q)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_SET_META_CONTEXT, NULL, 0, NULL),
		  (long)NBD_REP_ERR_INVALID);
	/* Extended headers after structured: fine once, then invalid. */
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_EXTENDED_HEADERS), NBD_REP_ACK);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_EXTENDED_HEADERS), (long)NBD_REP_ERR_INVALID);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY),
		  (long)NBD_REP_ERR_EXT_HEADER_REQD);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_ABORT), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(fd));
	ASSERT_EQ(finish(&f), 0);
}

static void test_info(void)
{
	struct fixture f;
	uint8_t b[64], d[128], *p;
	uint32_t l;
	long t;
	bool seen_export = false, seen_name = false, seen_desc = false, seen_bs = false;

	start(&f);
	int fd = f.c.fd;
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES));
	/* Unknown export. */
	p = ioc_nbd_st32(b, 4);
	memcpy(p, "nope", 4);
	p = ioc_nbd_st16(p + 4, 0);
	ASSERT_OK(cl_opt(fd, NBD_OPT_INFO, b, (uint32_t)(p - b)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_INFO, NULL, 0, NULL), (long)NBD_REP_ERR_UNKNOWN);
	/* Name length lying past the option. */
	p = ioc_nbd_st32(b, 400);
	p = ioc_nbd_st16(p, 0);
	ASSERT_OK(cl_opt(fd, NBD_OPT_GO, b, (uint32_t)(p - b)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_GO, NULL, 0, NULL), (long)NBD_REP_ERR_INVALID);
	/* Request count inconsistent with the length. */
	p = ioc_nbd_st32(b, 0);
	p = ioc_nbd_st16(p, 9);
	ASSERT_OK(cl_opt(fd, NBD_OPT_GO, b, (uint32_t)(p - b)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_GO, NULL, 0, NULL), (long)NBD_REP_ERR_INVALID);
	/* INFO on "disk" asking for name, description and block size. */
	p = ioc_nbd_st32(b, 4);
	memcpy(p, "disk", 4);
	p = ioc_nbd_st16(p + 4, 3);
	p = ioc_nbd_st16(p, NBD_INFO_NAME);
	p = ioc_nbd_st16(p, NBD_INFO_DESCRIPTION);
	p = ioc_nbd_st16(p, NBD_INFO_BLOCK_SIZE);
	ASSERT_OK(cl_opt(fd, NBD_OPT_INFO, b, (uint32_t)(p - b)));
	while ((t = cl_opt_reply(fd, NBD_OPT_INFO, d, sizeof(d), &l)) == NBD_REP_INFO) {
		switch (ioc_nbd_ld16(d)) {
		case NBD_INFO_EXPORT:
			ASSERT_EQ(l, 12);
			ASSERT_UEQ(ioc_nbd_ld64(d + 2), EXP_SIZE);
			ASSERT_TRUE(ioc_nbd_ld16(d + 10) & NBD_FLAG_HAS_FLAGS);
			ASSERT_TRUE(ioc_nbd_ld16(d + 10) & NBD_FLAG_CAN_MULTI_CONN);
			seen_export = true;
			break;
		case NBD_INFO_NAME:
			ASSERT_EQ(l, 6);
			ASSERT_MEM_EQ(d + 2, "disk", 4);
			seen_name = true;
			break;
		case NBD_INFO_DESCRIPTION:
			ASSERT_MEM_EQ(d + 2, "a test disk", 11);
			seen_desc = true;
			break;
		case NBD_INFO_BLOCK_SIZE:
			ASSERT_EQ(l, 14);
			ASSERT_EQ(ioc_nbd_ld32(d + 2), 1);
			ASSERT_EQ(ioc_nbd_ld32(d + 10), IOC_NBD_MAX_PAYLOAD);
			seen_bs = true;
			break;
		}
	}
	ASSERT_EQ(t, NBD_REP_ACK);
	ASSERT_TRUE(seen_export && seen_name && seen_desc && seen_bs);
	/* Oversized option: skipped and answered TOO_BIG. */
	uint32_t big = IOC_NBD_MAX_OPT_LEN + 100;
	uint8_t *junk = calloc(1, big);
	ASSERT_OK(cl_opt(fd, NBD_OPT_INFO, junk, big));
	free(junk);
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_INFO, NULL, 0, NULL), (long)NBD_REP_ERR_TOO_BIG);
	/* Old-style EXPORT_NAME ends the handshake: size, flags, no zeroes. */
	ASSERT_OK(cl_opt(fd, NBD_OPT_EXPORT_NAME, "disk", 4));
	ASSERT_OK(cl_read(fd, d, 10));
	ASSERT_UEQ(ioc_nbd_ld64(d), EXP_SIZE);
	ASSERT_FALSE(ioc_nbd_ld16(d + 8) & NBD_FLAG_SEND_DF);
	f.c.structured = false;
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	ASSERT_EQ(finish(&f), 0);
}

static void test_export_name_zeroes_and_unknown(void)
{
	struct fixture f;
	uint8_t d[134];

	start(&f);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_OK(cl_opt(f.c.fd, NBD_OPT_EXPORT_NAME, "", 0));
	ASSERT_OK(cl_read(f.c.fd, d, sizeof(d)));
	for (int i = 10; i < 134; i++)
		ASSERT_EQ(d[i], 0);
	ASSERT_EQ(finish(&f), 0);

	start(&f);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_OK(cl_opt(f.c.fd, NBD_OPT_EXPORT_NAME, "missing", 7));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void test_huge_option_disconnects(void)
{
	struct fixture f;
	uint8_t h[16], *p = h;

	start(&f);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	p = ioc_nbd_st64(p, NBD_MAGIC_OPTS);
	p = ioc_nbd_st32(p, NBD_OPT_GO);
	ioc_nbd_st32(p, 0xfffffff0u);
	ASSERT_OK(cl_write(f.c.fd, h, 16));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void fill_pattern(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(i * 31 + seed);
}

static void rw_roundtrip(bool structured, bool extended)
{
	struct fixture f;
	size_t n = 256 << 10;
	uint8_t *w = malloc(n), *r = malloc(n);
	int chunks, holes;

	go(&f, "disk", structured, extended, false);
	fill_pattern(w, n, 7);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, 65536, n, w), 0);
	ASSERT_EQ(cl_cmd(&f.c, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 0, 512, w), 0);
	ASSERT_EQ(cl_pread(&f.c, 0, r, 65536, n, &chunks, &holes), 0);
	ASSERT_MEM_EQ(r, w, n);
	ASSERT_EQ(cl_pread(&f.c, 0, r, 0, 512, NULL, NULL), 0);
	ASSERT_MEM_EQ(r, w, 512);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	/* Zeroes and trim read back as zero. */
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE_ZEROES, 65536, 4096, NULL), 0);
	ASSERT_EQ(cl_cmd(&f.c, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 70000, 100, NULL), 0);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_TRIM, 131072, 65536, NULL), 0);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_CACHE, 0, 4096, NULL), 0);
	ASSERT_EQ(cl_pread(&f.c, 0, r, 65536, n, NULL, NULL), 0);
	memset(w, 0, 4096);
	memset(w + 70000 - 65536, 0, 100);
	memset(w + 65536, 0, 65536);
	ASSERT_MEM_EQ(r, w, n);
	/* DISC: the server closes after finishing what came before. */
	ASSERT_OK(cl_req(&f.c, 0, NBD_CMD_DISC, 1, 0, 0, NULL));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), 0);
	free(w);
	free(r);
}

static void test_rw_simple(void) { rw_roundtrip(false, false); }
static void test_rw_structured(void) { rw_roundtrip(true, false); }
static void test_rw_extended(void) { rw_roundtrip(true, true); }

static void errors(bool structured)
{
	struct fixture f;
	uint8_t buf[4096] = { 0 };

	go(&f, "disk", structured, false, false);
	struct cl_conn *c = &f.c;
	ASSERT_EQ(cl_pread(c, 0, buf, EXP_SIZE - 100, 4096, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_pread(c, 0, buf, UINT64_MAX - 10, 4096, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_WRITE, EXP_SIZE - 100, 4096, buf), NBD_ENOSPC);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_WRITE, UINT64_MAX - 100, 4096, buf), NBD_ENOSPC);
	ASSERT_EQ(cl_pread(c, 0, buf, 0, 0, NULL, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_WRITE, 0, 0, buf), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_TRIM, EXP_SIZE, 1, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_WRITE_ZEROES, EXP_SIZE - 1, 2, NULL), NBD_ENOSPC);
	ASSERT_EQ(cl_cmd(c, 0, 99, 0, 4096, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 1u << 12, NBD_CMD_FLUSH, 0, 0, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_FLUSH, 4096, 0, NULL), NBD_EINVAL);
	ASSERT_EQ(cl_cmd(c, NBD_CMD_FLAG_REQ_ONE, NBD_CMD_WRITE, 0, 16, buf), NBD_EINVAL);
	/* No meta context negotiated: block status is refused. */
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_BLOCK_STATUS, 0, 4096, NULL), NBD_EINVAL);
	if (!structured)
		ASSERT_EQ(cl_pread(c, NBD_CMD_FLAG_DF, buf, 0, 16, NULL, NULL), NBD_EINVAL);
	/* Too large a read. */
	ASSERT_EQ(cl_pread(c, 0, buf, 0, IOC_NBD_MAX_PAYLOAD + 1ull, NULL, NULL),
		  NBD_EOVERFLOW);
	/* Still healthy afterwards. */
	ASSERT_EQ(cl_cmd(c, 0, NBD_CMD_WRITE, 0, 16, buf), 0);
	ASSERT_EQ(finish(&f), 0);
}

static void test_errors_simple(void) { errors(false); }
static void test_errors_structured(void) { errors(true); }

static void test_read_only(void)
{
	struct fixture f;
	uint8_t buf[512] = { 0 };

	go(&f, "ro", true, false, false);
	ASSERT_TRUE(f.c.tflags & NBD_FLAG_READ_ONLY);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, 0, 512, buf), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_TRIM, 0, 512, NULL), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE_ZEROES, 0, 512, NULL), NBD_EPERM);
	ASSERT_EQ(cl_pread(&f.c, 0, buf, 0, 512, NULL, NULL), 0);
	ASSERT_EQ(finish(&f), 0);
}

/* Block status and sparse reads, plain and extended. */
static void sparse(bool extended)
{
	struct fixture f;
	uint8_t pl[4096];
	size_t n = 1 << 20;
	uint8_t *w = malloc(n), *r = malloc(n);
	struct cl_reply rep;
	int chunks, holes;

	go(&f, "disk", true, extended, true);
	/* Data in [64K, 128K) and [512K, 576K); the rest never written. */
	fill_pattern(w, 65536, 3);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, 65536, 65536, w), 0);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, 524288, 65536, w), 0);
	ASSERT_OK(cl_req(&f.c, 0, NBD_CMD_BLOCK_STATUS, 77, 0, n, NULL));
	ASSERT_OK(cl_reply(&f.c, &rep, pl, sizeof(pl), 0));
	ASSERT_UEQ(rep.cookie, 77);
	ASSERT_TRUE(rep.flags & NBD_REPLY_FLAG_DONE);
	ASSERT_EQ(rep.type, extended ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
				     : NBD_REPLY_TYPE_BLOCK_STATUS);
	ASSERT_EQ(ioc_nbd_ld32(pl), NBD_META_ID_BASE_ALLOC);
	uint64_t expect[][2] = {
		{ 65536, NBD_STATE_HOLE | NBD_STATE_ZERO }, { 65536, 0 },
		{ 393216, NBD_STATE_HOLE | NBD_STATE_ZERO }, { 65536, 0 },
		{ 458752, NBD_STATE_HOLE | NBD_STATE_ZERO },
	};
	if (extended) {
		ASSERT_EQ(ioc_nbd_ld32(pl + 4), 5);
		ASSERT_UEQ(rep.plen, 8 + 5 * 16);
		for (int i = 0; i < 5; i++) {
			ASSERT_UEQ(ioc_nbd_ld64(pl + 8 + 16 * i), expect[i][0]);
			ASSERT_UEQ(ioc_nbd_ld64(pl + 16 + 16 * i), expect[i][1]);
		}
	} else {
		ASSERT_UEQ(rep.plen, 4 + 5 * 8);
		for (int i = 0; i < 5; i++) {
			ASSERT_UEQ(ioc_nbd_ld32(pl + 4 + 8 * i), expect[i][0]);
			ASSERT_UEQ(ioc_nbd_ld32(pl + 8 + 8 * i), expect[i][1]);
		}
	}
	/* REQ_ONE: exactly one descriptor. */
	ASSERT_OK(cl_req(&f.c, NBD_CMD_FLAG_REQ_ONE, NBD_CMD_BLOCK_STATUS, 78, 0, n, NULL));
	ASSERT_OK(cl_reply(&f.c, &rep, pl, sizeof(pl), 0));
	ASSERT_UEQ(rep.plen, extended ? 8 + 16 : 4 + 8);
	/* Past the end. */
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_BLOCK_STATUS, EXP_SIZE - 1, 2, NULL), NBD_EINVAL);
	/* A sparse read: holes come as OFFSET_HOLE chunks. */
	ASSERT_EQ(cl_pread(&f.c, 0, r, 0, n, &chunks, &holes), 0);
	ASSERT_EQ(chunks, 5);
	ASSERT_EQ(holes, 3);
	memset(w + 65536, 0, n - 65536);
	memcpy(w + 65536, w, 65536);
	memcpy(w + 524288, w, 65536);
	memset(w, 0, 65536);
	ASSERT_MEM_EQ(r, w, n);
	/* DF: one content chunk. */
	ASSERT_EQ(cl_pread(&f.c, NBD_CMD_FLAG_DF, r, 0, n, &chunks, &holes), 0);
	ASSERT_EQ(chunks, 1);
	ASSERT_MEM_EQ(r, w, n);
	ASSERT_EQ(finish(&f), 0);
	free(w);
	free(r);
}

static void test_sparse(void) { sparse(false); }
static void test_sparse_extended(void) { sparse(true); }

/* Meta contexts belong to the export SET_META_CONTEXT named: they survive
 * GO on the same export (also through the default name "") and are dropped
 * by GO on another. */
static void meta_then_go(const char *set_name, const char *go_name, long expect)
{
	struct fixture f;
	uint8_t b[64], *p;

	start(&f);
	int fd = f.c.fd;
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES));
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY), NBD_REP_ACK);
	size_t nl = strlen(set_name);
	p = ioc_nbd_st32(b, (uint32_t)nl);
	memcpy(p, set_name, nl);
	p = ioc_nbd_st32(p + nl, 1);
	p = ioc_nbd_st32(p, 15);
	memcpy(p, "base:allocation", 15);
	ASSERT_OK(cl_opt(fd, NBD_OPT_SET_META_CONTEXT, b, (uint32_t)(p + 15 - b)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_SET_META_CONTEXT, NULL, 0, NULL),
		  NBD_REP_META_CONTEXT);
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_SET_META_CONTEXT, NULL, 0, NULL), NBD_REP_ACK);
	nl = strlen(go_name);
	p = ioc_nbd_st32(b, (uint32_t)nl);
	memcpy(p, go_name, nl);
	p = ioc_nbd_st16(p + nl, 0);
	ASSERT_OK(cl_opt(fd, NBD_OPT_GO, b, (uint32_t)(p - b)));
	long t;
	while ((t = cl_opt_reply(fd, NBD_OPT_GO, NULL, 0, NULL)) == NBD_REP_INFO)
		;
	ASSERT_EQ(t, NBD_REP_ACK);
	f.c.structured = true;
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_BLOCK_STATUS, 0, 4096, NULL), expect);
	ASSERT_EQ(finish(&f), 0);
}

static void test_meta_context_follows_export(void)
{
	meta_then_go("disk", "disk", 0);
	meta_then_go("disk", "", 0);   /* "" is the default export: disk */
	meta_then_go("ro", "disk", NBD_EINVAL);
}

/* Many requests in one send, replies gathered. */
static void test_pipelined(void)
{
	struct fixture f;
	enum { N = 200 };
	uint8_t *batch = malloc(N * (28 + 512)), *p = batch;
	struct cl_reply rep;
	uint8_t buf[512];

	go(&f, "disk", false, false, false);
	for (int i = 0; i < N; i++) {
		p = ioc_nbd_st32(p, NBD_MAGIC_REQUEST);
		p = ioc_nbd_st16(p, 0);
		p = ioc_nbd_st16(p, NBD_CMD_WRITE);
		p = ioc_nbd_st64(p, (uint64_t)i);
		p = ioc_nbd_st64(p, (uint64_t)i * 512);
		p = ioc_nbd_st32(p, 512);
		memset(p, i & 0xff, 512);
		p += 512;
	}
	ASSERT_OK(cl_write(f.c.fd, batch, (size_t)(p - batch)));
	for (int i = 0; i < N; i++) {
		ASSERT_OK(cl_reply(&f.c, &rep, NULL, 0, 0));
		ASSERT_TRUE(rep.simple);
		ASSERT_EQ(rep.error, 0);
		ASSERT_UEQ(rep.cookie, (uint64_t)i);
	}
	for (int i = 0; i < N; i += 37) {
		ASSERT_EQ(cl_pread(&f.c, 0, buf, (uint64_t)i * 512, 512, NULL, NULL), 0);
		ASSERT_EQ(buf[0], i & 0xff);
		ASSERT_EQ(buf[511], i & 0xff);
	}
	ASSERT_EQ(finish(&f), 0);
	free(batch);
}

static void test_bad_request_magic(void)
{
	struct fixture f;
	uint8_t h[28] = { 0xde, 0xad };

	go(&f, "disk", false, false, false);
	ASSERT_OK(cl_write(f.c.fd, h, sizeof(h)));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void test_oversized_write_disconnects(void)
{
	struct fixture f;

	go(&f, "disk", false, false, false);
	ASSERT_OK(cl_req(&f.c, 0, NBD_CMD_WRITE, 1, 0, 0xfffffff0u, NULL));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

static void test_refused_write_payload_skipped(void)
{
	struct fixture f;
	uint8_t *b = calloc(1, 1 << 20);

	go(&f, "ro", false, false, false);
	/* The payload of a refused write is consumed: the stream stays in sync. */
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, 0, 1 << 20, b), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_WRITE, EXP_SIZE, 4096, b), NBD_EPERM);
	ASSERT_EQ(cl_cmd(&f.c, 0, NBD_CMD_FLUSH, 0, 0, NULL), 0);
	ASSERT_EQ(finish(&f), 0);
	free(b);
}

static void test_disconnect_mid_payload(void)
{
	struct fixture f;
	uint8_t b[1000] = { 0 };

	go(&f, "disk", false, false, false);
	ASSERT_OK(cl_req(&f.c, 0, NBD_CMD_WRITE, 1, 0, 65536, NULL));
	ASSERT_OK(cl_write(f.c.fd, b, sizeof(b)));
	/* finish() closes our end: the server must simply end. */
	ASSERT_EQ(finish(&f), 0);
}

/* FORCEDTLS: every option but STARTTLS and ABORT is refused with
 * TLS_REQD, and STARTTLS is acknowledged (the blocking transport has no
 * TLS, so it then ends the session with -ENOTSUP). */
static void test_tls_required(void)
{
	struct fixture f;
	uint8_t q[16], *p = q;

	start_tls(&f, IOC__NBD_TLS_REQUIRE);
	int fd = f.c.fd;
	ASSERT_GE(cl_greeting(fd), 0);
	ASSERT_OK(cl_flags(fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_LIST), (long)NBD_REP_ERR_TLS_REQD);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STRUCTURED_REPLY), (long)NBD_REP_ERR_TLS_REQD);
	p = ioc_nbd_st32(p, 4);
	memcpy(p, "disk", 4);
	p += 4;
	p = ioc_nbd_st16(p, 0);
	ASSERT_OK(cl_opt(fd, NBD_OPT_GO, q, (uint32_t)(p - q)));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_GO, NULL, 0, NULL), (long)NBD_REP_ERR_TLS_REQD);
	ASSERT_EQ(cl_opt_simple(fd, 4242), (long)NBD_REP_ERR_TLS_REQD);
	/* STARTTLS carries no data. */
	ASSERT_OK(cl_opt(fd, NBD_OPT_STARTTLS, "x", 1));
	ASSERT_EQ(cl_opt_reply(fd, NBD_OPT_STARTTLS, NULL, 0, NULL), (long)NBD_REP_ERR_INVALID);
	ASSERT_EQ(cl_opt_simple(fd, NBD_OPT_STARTTLS), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(fd));
	ASSERT_EQ(finish(&f), -ENOTSUP);

	/* EXPORT_NAME cannot be refused with an error: the session ends. */
	start_tls(&f, IOC__NBD_TLS_REQUIRE);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_OK(cl_opt(f.c.fd, NBD_OPT_EXPORT_NAME, "disk", 4));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);

	/* ABORT is served before TLS. */
	start_tls(&f, IOC__NBD_TLS_REQUIRE);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_EQ(cl_opt_simple(f.c.fd, NBD_OPT_ABORT), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), 0);
}

/* SELECTIVETLS: plain options work; STARTTLS needs fixed newstyle; bytes
 * sent behind STARTTLS (before our ACK could arrive) end the session. */
static void test_tls_optional(void)
{
	struct fixture f;
	uint8_t d[256];
	uint32_t l;

	start_tls(&f, IOC__NBD_TLS_ON);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_OK(cl_opt(f.c.fd, NBD_OPT_LIST, NULL, 0));
	ASSERT_EQ(cl_opt_reply(f.c.fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_SERVER);
	ASSERT_EQ(cl_opt_reply(f.c.fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_SERVER);
	ASSERT_EQ(cl_opt_reply(f.c.fd, NBD_OPT_LIST, d, sizeof(d), &l), NBD_REP_ACK);
	ASSERT_EQ(cl_opt_simple(f.c.fd, NBD_OPT_STARTTLS), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -ENOTSUP);

	start_tls(&f, IOC__NBD_TLS_ON);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, 0));
	ASSERT_EQ(cl_opt_simple(f.c.fd, NBD_OPT_STARTTLS), (long)NBD_REP_ERR_POLICY);
	ASSERT_EQ(cl_opt_simple(f.c.fd, NBD_OPT_ABORT), NBD_REP_ACK);
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), 0);

	/* STARTTLS and a ClientHello-like blob in one write. */
	uint8_t two[16 + 16], *p = two;
	p = ioc_nbd_st64(p, NBD_MAGIC_OPTS);
	p = ioc_nbd_st32(p, NBD_OPT_STARTTLS);
	p = ioc_nbd_st32(p, 0);
	memset(p, 0x16, 16);
	start_tls(&f, IOC__NBD_TLS_ON);
	ASSERT_GE(cl_greeting(f.c.fd), 0);
	ASSERT_OK(cl_flags(f.c.fd, NBD_FLAG_C_FIXED_NEWSTYLE));
	ASSERT_OK(cl_write(f.c.fd, two, sizeof(two)));
	ASSERT_TRUE(cl_closed(f.c.fd));
	ASSERT_EQ(finish(&f), -EPROTO);
}

/* The protocol core driven directly, with no transport: bytes go into
 * c.in, replies come out of c.out and the request objects. */
struct core {
	struct ioc__nbd_export *e, *list[1];
	struct ioc__nbd_cfg cfg;
	struct ioc__nbd_conn c;
};

static void core_open(struct core *k, enum ioc__nbd_tls_mode tls)
{
	memset(k, 0, sizeof(*k));
	ASSERT_OK(ioc__nbd_mem_export_new(&k->e, "disk", EXP_SIZE, false));
	k->list[0] = k->e;
	k->cfg = (struct ioc__nbd_cfg){ .exports = k->list, .nexports = 1, .tls = tls };
	ASSERT_OK(ioc__nbd_conn_init(&k->c, &k->cfg, 4096));
	ioc__nbd_hs_start(&k->c);
	k->c.out_len = 0;
	ioc_nbd_st32(k->c.in, NBD_FLAG_C_FIXED_NEWSTYLE);
	k->c.in_end = 4;
}

static void core_close(struct core *k)
{
	ioc__nbd_conn_destroy(&k->c);
	ioc__nbd_mem_export_free(k->e);
}

/* Append an option (data only for EXPORT_NAME's name) to the input. */
static void core_opt(struct core *k, uint32_t opt, const char *data)
{
	uint32_t n = data ? (uint32_t)strlen(data) : 0;
	uint8_t *p;

	ioc__nbd_conn_compact(&k->c);
	p = k->c.in + k->c.in_end;
	p = ioc_nbd_st64(p, NBD_MAGIC_OPTS);
	p = ioc_nbd_st32(p, opt);
	p = ioc_nbd_st32(p, n);
	if (n)
		memcpy(p, data, n);
	k->c.in_end = (size_t)(p + n - k->c.in);
}

/* STARTTLS, acknowledged; then the transport reports TLS up. */
static void core_starttls(struct core *k)
{
	core_opt(k, NBD_OPT_STARTTLS, NULL);
	ASSERT_EQ(ioc__nbd_hs_step(&k->c), IOC_NBD_STARTTLS);
	ASSERT_UEQ(k->c.out_len, 20u); /* magic, option, type (ACK), length 0 */
	ASSERT_EQ(ioc_nbd_ld32(k->c.out + 12), (long)NBD_REP_ACK);
	k->c.out_len = 0;
	ioc__nbd_tls_started(&k->c);
}

/* Once the transport reports TLS, STARTTLS is invalid and FORCEDTLS serves
 * every option (driven on the core directly: no TLS in this test). */
static void test_tls_after_start(void)
{
	struct core k;

	core_open(&k, IOC__NBD_TLS_REQUIRE);
	core_starttls(&k);
	core_opt(&k, NBD_OPT_STARTTLS, NULL);
	core_opt(&k, NBD_OPT_STRUCTURED_REPLY, NULL);
	ASSERT_EQ(ioc__nbd_hs_step(&k.c), IOC_NBD_MORE);
	/* Two replies: INVALID for STARTTLS (with a message), ACK after. */
	ASSERT_EQ(ioc_nbd_ld32(k.c.out + 12), (long)NBD_REP_ERR_INVALID);
	uint32_t l1 = ioc_nbd_ld32(k.c.out + 16);
	ASSERT_EQ(ioc_nbd_ld32(k.c.out + 20 + l1 + 12), (long)NBD_REP_ACK);
	ASSERT_TRUE(k.c.structured);
	core_close(&k);
}

static struct ioc__nbd_req *alloc_req(void *opaque, size_t len)
{
	struct ioc__nbd_req *r = calloc(1, sizeof(*r));

	(void)opaque;
	ASSERT_NOT_NULL(r);
	if (len)
		ASSERT_EQ(posix_memalign((void **)&r->buf, 4096, len), 0);
	r->buf_cap = len;
	return r;
}

/* Queue a plain (compact) READ request in k's input buffer. */
static void put_read(struct core *k, uint64_t handle, uint64_t off, uint32_t len)
{
	uint8_t *p;

	ioc__nbd_conn_compact(&k->c);
	p = k->c.in + k->c.in_end;
	p = ioc_nbd_st32(p, NBD_MAGIC_REQUEST);
	p = ioc_nbd_st16(p, 0);
	p = ioc_nbd_st16(p, NBD_CMD_READ);
	p = ioc_nbd_st64(p, handle);
	p = ioc_nbd_st64(p, off);
	p = ioc_nbd_st32(p, len);
	k->c.in_end = (size_t)(p - k->c.in);
}

/* The chunk type of the first reply chunk to a 4 KiB structured READ of
 * an unwritten block, on a connection with or without TLS. */
static uint16_t small_hole_read(bool tls)
{
	struct core k;
	struct ioc__nbd_req *r = NULL;
	uint16_t type;

	core_open(&k, IOC__NBD_TLS_ON);
	if (tls)
		core_starttls(&k);
	core_opt(&k, NBD_OPT_STRUCTURED_REPLY, NULL);
	core_opt(&k, NBD_OPT_EXPORT_NAME, "disk");
	ASSERT_EQ(ioc__nbd_hs_step(&k.c), IOC_NBD_READY);
	put_read(&k, 7, 65536, 4096);
	ASSERT_EQ(ioc__nbd_parse_request(&k.c, alloc_req, NULL, &r), IOC_NBD_READY);
	ioc__nbd_execute(&k.c, r);
	ASSERT_GE(r->iovcnt, 1);
	/* Structured reply chunk: magic, flags, type, ... */
	type = ioc_nbd_ld16((const uint8_t *)r->iov[0].iov_base + 6);
	free(r->buf);
	free(r->ext);
	free(r);
	core_close(&k);
	return type;
}

/* A backend that lends every read from one static buffer. */
static uint8_t lent_buf[2u << 20];

static const void *lend_all(void *be, uint64_t off, size_t len)
{
	(void)be;
	return off + len <= sizeof(lent_buf) ? lent_buf + off : NULL;
}

static int lend_fault(void *be, uint64_t off, void *buf, size_t len)
{
	(void)be;
	memcpy(buf, lent_buf + off, len);
	return 0;
}

/* Whether a plain READ of len bytes on a connection with map_small as
 * given points its data iovec at what the backend lent. */
static bool read_lent(size_t len, bool map_small)
{
	struct ioc__nbd_backend_ops ops;
	struct core k;
	struct ioc__nbd_req *r = NULL;
	bool lent;

	core_open(&k, IOC__NBD_TLS_OFF);
	core_opt(&k, NBD_OPT_EXPORT_NAME, "disk");
	ASSERT_EQ(ioc__nbd_hs_step(&k.c), IOC_NBD_READY);
	ops = *k.e->ops;
	ops.map_read = lend_all;
	ops.map_fault = lend_fault;
	k.e->ops = &ops;
	k.c.map_reads = true;
	k.c.map_small = map_small;
	put_read(&k, 9, 4096, (uint32_t)len);
	ASSERT_EQ(ioc__nbd_parse_request(&k.c, alloc_req, NULL, &r), IOC_NBD_READY);
	ioc__nbd_execute(&k.c, r);
	ASSERT_EQ(r->iovcnt, 2);
	ASSERT_UEQ(r->iov[1].iov_len, len);
	lent = r->iov[1].iov_base == lent_buf + 4096;
	ASSERT_TRUE(lent || r->iov[1].iov_base == r->buf);
	ASSERT_TRUE(lent == r->mapped);
	free(r->buf);
	free(r);
	core_close(&k);
	return lent;
}

/* Small reads are lent only while the thread has other connections
 * (map_small); from IOC_NBD_MAP_ALONE_MIN on, always. */
static void test_map_small_reads(void)
{
	ASSERT_FALSE(read_lent(4096, false));
	ASSERT_TRUE(read_lent(4096, true));
	ASSERT_FALSE(read_lent(IOC_NBD_MAP_ALONE_MIN - 4096, false));
	ASSERT_TRUE(read_lent(IOC_NBD_MAP_ALONE_MIN, false));
	ASSERT_TRUE(read_lent(IOC_NBD_MAP_ALONE_MIN, true));
}

/* Over TLS every byte costs the client a decryption, so reads of a page
 * or more look for holes; in the clear only from IOC_NBD_SPARSE_READ_MIN
 * (transmission.c says why). */
static void test_tls_small_reads_send_holes(void)
{
	ASSERT_EQ(small_hole_read(true), NBD_REPLY_TYPE_OFFSET_HOLE);
	ASSERT_EQ(small_hole_read(false), NBD_REPLY_TYPE_OFFSET_DATA);
}

IOC_TEST_MAIN(
	IOC_TEST(test_tls_small_reads_send_holes),
	IOC_TEST(test_map_small_reads),
	IOC_TEST(test_tls_required),
	IOC_TEST(test_tls_optional),
	IOC_TEST(test_tls_after_start),
	IOC_TEST(test_greeting_and_abort),
	IOC_TEST(test_bad_client_flags),
	IOC_TEST(test_garbage_handshake),
	IOC_TEST(test_options),
	IOC_TEST(test_info),
	IOC_TEST(test_export_name_zeroes_and_unknown),
	IOC_TEST(test_huge_option_disconnects),
	IOC_TEST(test_rw_simple),
	IOC_TEST(test_rw_structured),
	IOC_TEST(test_rw_extended),
	IOC_TEST(test_errors_simple),
	IOC_TEST(test_errors_structured),
	IOC_TEST(test_read_only),
	IOC_TEST(test_sparse),
	IOC_TEST(test_sparse_extended),
	IOC_TEST(test_meta_context_follows_export),
	IOC_TEST(test_pipelined),
	IOC_TEST(test_bad_request_magic),
	IOC_TEST(test_oversized_write_disconnects),
	IOC_TEST(test_refused_write_payload_skipped),
	IOC_TEST(test_disconnect_mid_payload),
)
