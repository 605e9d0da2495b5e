/*
 * The NBD handshake: greeting, option haggling (INFO, GO, LIST,
 * STARTTLS, structured replies, extended headers, meta contexts), up to
 * the transmission phase, with no socket in sight.  Also the connection
 * state both phases share.
 *
 * Problem.  An NBD server is a network parser fed by hostile bytes, and
 * a data path that must move millions of small requests a second.  The
 * two want different things: the parser wants to be small, total and
 * fuzzable; the data path wants batching, concurrency and zero copies.
 *
 * Design.  "Sans-I/O": the core (this file and transmission.c) consumes
 * bytes from conn->in and produces bytes (handshake replies in conn->out)
 * or request objects whose replies are iovecs pointing into the request.
 * Transports own the sockets: conn.c drives it from event-loop handlers
 * with one coroutine per request; the blocking driver of the tests and
 * the fuzzer drives it on one thread.  Both share every line that
 * interprets the protocol, so the fuzzer exercises what production runs.
 *
 * - The handshake is a loop over complete options: an option is handled
 *   only once its header and data are all in the buffer, so there is no
 *   partial-option state.  Option data is bounded (IOC_NBD_MAX_OPT_LEN);
 *   a larger option is skipped and answered NBD_REP_ERR_TOO_BIG, and an
 *   absurd one (> IOC_NBD_MAX_OPT_SKIP) ends the connection.  The number
 *   of options per handshake is bounded too; the transport bounds time.
 * - TLS is the transport's business: the core answers STARTTLS (or
 *   refuses it, or in FORCEDTLS answers every other option TLS_REQD) and
 *   returns IOC_NBD_STARTTLS; the transport sends the ACK, runs the TLS
 *   handshake and reports it with ioc__nbd_tls_started().
 *
 * Alternatives rejected.  A coroutine per connection that reads the
 * handshake with blocking-style calls (QEMU's nbd/server.c) is natural to
 * write but cannot be fuzzed without the whole runtime and keeps a stack
 * per idle client.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "nbd-proto.h"
#include "util/buf.h"

/* ---- connection state ---------------------------------------------------- */

int ioc__nbd_conn_init(struct ioc__nbd_conn *c, const struct ioc__nbd_cfg *cfg,
		       size_t in_cap)
{
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	if (in_cap < IOC_NBD_MAX_OPT_LEN + 64)
		in_cap = IOC_NBD_MAX_OPT_LEN + 64;
	c->in = malloc(in_cap);
	if (!c->in)
		return -ENOMEM;
	c->in_cap = in_cap;
	c->phase = IOC_NBD_PHASE_GREETING;
	return 0;
}

void ioc__nbd_conn_destroy(struct ioc__nbd_conn *c)
{
	free(c->in);
	free(c->out);
	c->in = NULL;
	c->out = NULL;
	c->phase = IOC_NBD_PHASE_CLOSED;
}

void ioc__nbd_conn_compact(struct ioc__nbd_conn *c)
{
	if (c->in_start == c->in_end) {
		c->in_start = c->in_end = 0;
	} else if (c->in_start > 0) {
		memmove(c->in, c->in + c->in_start, c->in_end - c->in_start);
		c->in_end -= c->in_start;
		c->in_start = 0;
	}
}

/* ---- handshake output ------------------------------------------------------ */

static int out_reserve(struct ioc__nbd_conn *c, size_t n)
{
	if (c->out_len + n <= c->out_cap)
		return 0;
	uint8_t *p = ioc__buf_grow(c->out, &c->out_cap, c->out_len + n, 512);
	if (!p)
		return -ENOMEM;
	c->out = p;
	return 0;
}

static int out_put(struct ioc__nbd_conn *c, const void *data, size_t n)
{
	if (out_reserve(c, n) < 0)
		return -ENOMEM;
	if (n)
		memcpy(c->out + c->out_len, data, n);
	c->out_len += n;
	return 0;
}

/* An option reply whose data is head followed by tail. */
static int rep2(struct ioc__nbd_conn *c, uint32_t opt, uint32_t type,
		const void *head, size_t hlen, const void *tail, size_t tlen)
{
	uint8_t h[20], *p = h;

	p = ioc_nbd_st64(p, NBD_MAGIC_OPT_REPLY);
	p = ioc_nbd_st32(p, opt);
	p = ioc_nbd_st32(p, type);
	ioc_nbd_st32(p, (uint32_t)(hlen + tlen));
	if (out_put(c, h, sizeof(h)) < 0 || out_put(c, head, hlen) < 0 ||
	    out_put(c, tail, tlen) < 0)
		return -ENOMEM;
	return 0;
}

static int rep(struct ioc__nbd_conn *c, uint32_t opt, uint32_t type)
{
	return rep2(c, opt, type, NULL, 0, NULL, 0);
}

static int rep_err(struct ioc__nbd_conn *c, uint32_t opt, uint32_t type,
		   const char *msg)
{
	return rep2(c, opt, type, msg, strlen(msg), NULL, 0);
}

void ioc__nbd_hs_start(struct ioc__nbd_conn *c)
{
	uint8_t g[18], *p = g;

	p = ioc_nbd_st64(p, NBD_MAGIC_INIT);
	p = ioc_nbd_st64(p, NBD_MAGIC_OPTS);
	ioc_nbd_st16(p, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
	/* The greeting fits the initial allocation; on -ENOMEM out_len stays
	 * 0 and the transport sees a connection with nothing to say. */
	(void)out_put(c, g, sizeof(g));
	c->phase = IOC_NBD_PHASE_CLIENT_FLAGS;
}

/* ---- exports ---------------------------------------------------------------- */

static const struct ioc__nbd_export *find_export(const struct ioc__nbd_conn *c,
						 const char *name)
{
	const struct ioc__nbd_cfg *cfg = c->cfg;

	unsigned n = ioc__nbd_cfg_nexports(cfg);
	const struct ioc__nbd_export *e, *first = NULL;

	for (unsigned i = 0; i < n; i++) {
		if (!(e = ioc__nbd_cfg_export(cfg, i)))
			continue;
		if (strcmp(e->name, name) == 0)
			return e;
		if (!first)
			first = e;
	}
	/* The empty name is reserved for the default export (proto.md). */
	return name[0] == '\0' ? first : NULL;
}

static uint16_t tflags_of(const struct ioc__nbd_conn *c,
			  const struct ioc__nbd_export *e)
{
	uint16_t t = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH;

	if (e->read_only) {
		t |= NBD_FLAG_READ_ONLY;
	} else {
		if (e->can_fua)
			t |= NBD_FLAG_SEND_FUA;
		if (e->can_trim)
			t |= NBD_FLAG_SEND_TRIM;
		if (e->can_zero)
			t |= NBD_FLAG_SEND_WRITE_ZEROES;
		if (e->can_zero && e->can_fast_zero)
			t |= NBD_FLAG_SEND_FAST_ZERO;
	}
	if (e->can_cache)
		t |= NBD_FLAG_SEND_CACHE;
	if (e->multi_conn)
		t |= NBD_FLAG_CAN_MULTI_CONN;
	if (c->structured)
		t |= NBD_FLAG_SEND_DF;
	return t;
}

/* Copy a wire string into a NUL-terminated buffer; false if it contains NUL
 * or is too long. */
static bool get_string(char *dst, const uint8_t *src, uint32_t len)
{
	if (len > IOC_NBD_MAX_STRING || memchr(src, 0, len))
		return false;
	memcpy(dst, src, len);
	dst[len] = '\0';
	return true;
}

static void enter_transmission(struct ioc__nbd_conn *c,
			       const struct ioc__nbd_export *e)
{
	c->exp = e;
	c->tflags = tflags_of(c, e);
	/* Contexts selected for another export do not apply to this one
	 * (compared after name resolution: "" and the default export's own
	 * name are the same export). */
	if (c->meta_base_alloc &&
	    (c->meta_export != e ||
	     !e->can_block_status))
		c->meta_base_alloc = false;
	if (c->meta_export != e) {
		c->meta_depth = false;
		c->meta_nbitmaps = 0;
	}
	c->phase = IOC_NBD_PHASE_TRANSMISSION;
}

/* NBD_OPT_INFO / NBD_OPT_GO. */
static int opt_info(struct ioc__nbd_conn *c, uint32_t opt, const uint8_t *d,
		    uint32_t len)
{
	char name[IOC_NBD_MAX_STRING + 1];
	bool want_name = false, want_desc = false, want_bs = false;

	if (len < 6)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "option too short");
	uint32_t nlen = ioc_nbd_ld32(d);
	if (nlen > len - 6)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "name length too large");
	uint16_t nreq = ioc_nbd_ld16(d + 4 + nlen);
	if ((uint64_t)len != 4ull + nlen + 2 + 2ull * nreq)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "inconsistent length");
	if (!get_string(name, d + 4, nlen))
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "bad export name");
	for (unsigned i = 0; i < nreq; i++) {
		switch (ioc_nbd_ld16(d + 4 + nlen + 2 + 2 * i)) {
		case NBD_INFO_NAME: want_name = true; break;
		case NBD_INFO_DESCRIPTION: want_desc = true; break;
		case NBD_INFO_BLOCK_SIZE: want_bs = true; break;
		default: break; /* unknown or EXPORT (always sent) */
		}
	}
	const struct ioc__nbd_export *e = find_export(c, name);
	if (!e)
		return rep_err(c, opt, NBD_REP_ERR_UNKNOWN, "unknown export");

	uint8_t b[16], *p;
	p = ioc_nbd_st16(b, NBD_INFO_EXPORT);
	p = ioc_nbd_st64(p, e->size);
	ioc_nbd_st16(p, tflags_of(c, e));
	if (rep2(c, opt, NBD_REP_INFO, b, 12, NULL, 0) < 0)
		return -ENOMEM;
	if (want_name) {
		ioc_nbd_st16(b, NBD_INFO_NAME);
		if (rep2(c, opt, NBD_REP_INFO, b, 2, e->name, strlen(e->name)) < 0)
			return -ENOMEM;
	}
	if (want_desc && e->description) {
		ioc_nbd_st16(b, NBD_INFO_DESCRIPTION);
		if (rep2(c, opt, NBD_REP_INFO, b, 2, e->description,
			 strlen(e->description)) < 0)
			return -ENOMEM;
	}
	/* Always sent: the maximum matters to every client.  The minimum is
	 * enforced only for clients that asked (others get bounce buffers). */
	p = ioc_nbd_st16(b, NBD_INFO_BLOCK_SIZE);
	p = ioc_nbd_st32(p, e->min_block);
	p = ioc_nbd_st32(p, e->pref_block);
	ioc_nbd_st32(p, e->max_block);
	if (rep2(c, opt, NBD_REP_INFO, b, 14, NULL, 0) < 0 ||
	    rep(c, opt, NBD_REP_ACK) < 0)
		return -ENOMEM;
	if (opt == NBD_OPT_GO) {
		c->enforce_block_size = want_bs;
		enter_transmission(c, e);
		return IOC_NBD_READY;
	}
	return 0;
}

/* NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT. */

static bool qeq(const char *q, uint32_t qlen, const char *s)
{
	return qlen == strlen(s) && memcmp(q, s, qlen) == 0;
}

/* What one query selects (SET: exact names) or lists (LIST: also the
 * namespace "base:" or "qemu:" and the prefix "qemu:dirty-bitmap:").
 * Bitmaps asked for by name are matched against the export's bitmaps
 * afterwards (bitmap_asked()), so any number of them may be asked. */
struct meta_sel {
	bool base, depth;
	bool all_bitmaps;
	bool some_bitmap;          /* at least one qemu:dirty-bitmap:NAME */
};

static void meta_query(const char *q, uint32_t qlen, bool list, struct meta_sel *m)
{
	size_t plen = strlen(NBD_META_QEMU_BITMAP);

	if (qeq(q, qlen, NBD_META_BASE_ALLOCATION) || (list && qeq(q, qlen, "base:")))
		m->base = true;
	if (qeq(q, qlen, NBD_META_QEMU_DEPTH))
		m->depth = true;
	if (list && qeq(q, qlen, "qemu:")) {
		m->depth = true;
		m->all_bitmaps = true;
	}
	if (list && qeq(q, qlen, NBD_META_QEMU_BITMAP))
		m->all_bitmaps = true;
	if (qlen > plen && qlen - plen < IOC_NBD_BITMAP_NAME_MAX &&
	    memcmp(q, NBD_META_QEMU_BITMAP, plen) == 0)
		m->some_bitmap = true;
}

/* Whether the (already validated) nq queries from d name bitmap bname. */
static bool bitmap_asked(const uint8_t *d, uint32_t nq, const char *bname)
{
	size_t plen = strlen(NBD_META_QEMU_BITMAP), blen = strlen(bname);
	uint64_t pos = 0;

	for (uint32_t i = 0; i < nq; i++) {
		uint32_t qlen = ioc_nbd_ld32(d + pos);
		const char *q = (const char *)d + pos + 4;

		if (qlen == plen + blen && memcmp(q, NBD_META_QEMU_BITMAP, plen) == 0 &&
		    memcmp(q + plen, bname, blen) == 0)
			return true;
		pos += 4 + qlen;
	}
	return false;
}

static int rep_context(struct ioc__nbd_conn *c, uint32_t opt, uint32_t id,
		       const char *prefix, const char *name)
{
	char full[IOC_NBD_BITMAP_NAME_MAX + 32];
	size_t pl = strlen(prefix), nl = strnlen(name, IOC_NBD_BITMAP_NAME_MAX - 1);
	uint8_t idb[4];

	/* prefix is one of the context names above (< 32 bytes). */
	memcpy(full, prefix, pl);
	memcpy(full + pl, name, nl);
	full[pl + nl] = '\0';
	ioc_nbd_st32(idb, id);
	return rep2(c, opt, NBD_REP_META_CONTEXT, idb, 4, full, strlen(full));
}

static int opt_meta(struct ioc__nbd_conn *c, uint32_t opt, const uint8_t *d,
		    uint32_t len)
{
	char name[IOC_NBD_MAX_STRING + 1];
	bool list = opt == NBD_OPT_LIST_META_CONTEXT;
	struct meta_sel m = { 0 };
	const char *selected[IOC_NBD_META_BITMAPS];
	unsigned nsel = 0;

	if (!c->structured)
		return rep_err(c, opt, NBD_REP_ERR_INVALID,
			       "structured replies not negotiated");
	if (len < 8)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "option too short");
	uint32_t nlen = ioc_nbd_ld32(d);
	if (nlen > len - 8)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "name length too large");
	if (!get_string(name, d + 4, nlen))
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "bad export name");
	uint32_t nq = ioc_nbd_ld32(d + 4 + nlen);
	uint64_t pos = 8ull + nlen;
	/* Validate the whole query list before answering anything. */
	for (uint32_t i = 0; i < nq; i++) {
		if (pos + 4 > len)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "truncated query");
		uint32_t qlen = ioc_nbd_ld32(d + pos);
		if (qlen > IOC_NBD_MAX_STRING || pos + 4 + qlen > len)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "bad query length");
		meta_query((const char *)d + pos + 4, qlen, list, &m);
		pos += 4 + qlen;
	}
	if (pos != len)
		return rep_err(c, opt, NBD_REP_ERR_INVALID, "inconsistent length");
	const struct ioc__nbd_export *e = find_export(c, name);
	if (!e)
		return rep_err(c, opt, NBD_REP_ERR_UNKNOWN, "unknown export");
	if (list && nq == 0)
		m.base = m.depth = m.all_bitmaps = true;
	if (!e->can_block_status)
		m.base = false;
	if (!e->ops->dirty_status)
		m.all_bitmaps = m.some_bitmap = false;
	if (!e->ops->dirty_status && !e->ops->depth_status)
		m.depth = false;
	if (m.base && rep_context(c, opt, list ? 0 : NBD_META_ID_BASE_ALLOC,
				  NBD_META_BASE_ALLOCATION, "") < 0)
		return -ENOMEM;
	if (m.depth && rep_context(c, opt, list ? 0 : NBD_META_ID_QEMU_DEPTH,
				   NBD_META_QEMU_DEPTH, "") < 0)
		return -ENOMEM;
	if (e->ops->dirty_names && (m.all_bitmaps || m.some_bitmap)) {
		int n = e->ops->dirty_names(e->be, NULL, 0);
		const char **names = n > 0 ? malloc((size_t)n * sizeof(*names)) : NULL;
		const uint8_t *queries = d + 8 + nlen;
		int ret = 0;

		if (n > 0 && !names)
			return -ENOMEM;
		if (names)
			n = e->ops->dirty_names(e->be, names, n);
		/* LIST: every match.  SET: the matches in creation order,
		 * up to IOC_NBD_META_BITMAPS of them (as QEMU serves several
		 * bitmaps of one export); any beyond are not acknowledged,
		 * which the protocol allows. */
		for (int i = 0; i < n && ret == 0; i++) {
			if (!m.all_bitmaps && !bitmap_asked(queries, nq, names[i]))
				continue;
			if (!list && nsel == IOC_NBD_META_BITMAPS)
				continue;
			if (!list)
				selected[nsel] = names[i];
			ret = rep_context(c, opt, list ? 0 : NBD_META_ID_QEMU_BITMAP + nsel,
					  NBD_META_QEMU_BITMAP, names[i]);
			if (!list)
				nsel++;
		}
		if (ret == 0 && !list) {
			for (unsigned i = 0; i < nsel; i++)
				snprintf(c->meta_bitmap[i], sizeof(c->meta_bitmap[i]), "%s",
					 selected[i]);
		}
		free(names);
		if (ret < 0)
			return -ENOMEM;
	}
	if (!list) {
		c->meta_export = e;
		c->meta_base_alloc = m.base;
		c->meta_depth = m.depth;
		c->meta_nbitmaps = nsel;
	}
	return rep(c, opt, NBD_REP_ACK);
}

/* One complete option.  Returns 0 (continue), IOC_NBD_READY, IOC_NBD_CLOSE,
 * -EPROTO (hard disconnect) or -ENOMEM. */
static int handle_option(struct ioc__nbd_conn *c, uint32_t opt,
			 const uint8_t *d, uint32_t len)
{
	char name[IOC_NBD_MAX_STRING + 1];
	bool stopping = atomic_load_explicit(&c->cfg->shutting_down,
					     memory_order_relaxed);
	/* relaxed: a hint only; pairs with the relaxed store in the server's
	 * shutdown, and a late observation just serves one more option. */

	if (stopping && opt != NBD_OPT_ABORT) {
		if (opt == NBD_OPT_EXPORT_NAME)
			return -EPROTO; /* cannot be answered with an error */
		return rep_err(c, opt, NBD_REP_ERR_SHUTDOWN, "server shutting down");
	}

	/* FORCEDTLS: before TLS, only STARTTLS and ABORT are served. */
	if (c->cfg->tls == IOC__NBD_TLS_REQUIRE && !c->tls &&
	    opt != NBD_OPT_STARTTLS && opt != NBD_OPT_ABORT) {
		if (opt == NBD_OPT_EXPORT_NAME)
			return -EPROTO; /* cannot be answered with an error */
		return rep_err(c, opt, NBD_REP_ERR_TLS_REQD,
			       "TLS required: send NBD_OPT_STARTTLS first");
	}

	switch (opt) {
	case NBD_OPT_EXPORT_NAME: {
		if (!get_string(name, d, len))
			return -EPROTO;
		const struct ioc__nbd_export *e = find_export(c, name);
		if (!e)
			return -EPROTO; /* MUST terminate the session */
		uint8_t b[10 + 124] = { 0 };
		ioc_nbd_st64(b, e->size);
		ioc_nbd_st16(b + 8, tflags_of(c, e));
		if (out_put(c, b, c->no_zeroes ? 10 : sizeof(b)) < 0)
			return -ENOMEM;
		c->enforce_block_size = false;
		enter_transmission(c, e);
		return IOC_NBD_READY;
	}
	case NBD_OPT_ABORT:
		if (rep(c, opt, NBD_REP_ACK) < 0)
			return -ENOMEM;
		return IOC_NBD_CLOSE;
	case NBD_OPT_LIST:
		if (len != 0)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "unexpected data");
		for (unsigned i = 0, ne = ioc__nbd_cfg_nexports(c->cfg); i < ne; i++) {
			const struct ioc__nbd_export *e = ioc__nbd_cfg_export(c->cfg, i);

			if (!e)
				continue;
			uint8_t nl[4];
			size_t n = strlen(e->name);
			size_t dl = e->description ? strlen(e->description) : 0;
			ioc_nbd_st32(nl, (uint32_t)n);
			/* REP_SERVER: name length, name, then the description as
			 * the human-readable details the spec allows. */
			uint8_t *tmp = malloc(4 + n + dl);
			if (!tmp)
				return -ENOMEM;
			memcpy(tmp, nl, 4);
			memcpy(tmp + 4, e->name, n);
			if (dl)
				memcpy(tmp + 4 + n, e->description, dl);
			int r = rep2(c, opt, NBD_REP_SERVER, tmp, 4 + n + dl, NULL, 0);
			free(tmp);
			if (r < 0)
				return r;
		}
		return rep(c, opt, NBD_REP_ACK);
	case NBD_OPT_STARTTLS:
		/* Without fixed newstyle the server is NOTLS (proto.md). */
		if (c->cfg->tls == IOC__NBD_TLS_OFF || !c->fixed)
			return rep_err(c, opt, NBD_REP_ERR_POLICY, "TLS not configured");
		if (c->tls)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "TLS already started");
		if (len != 0)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "unexpected data");
		/* The client must wait for our ACK before its TLS handshake,
		 * so anything already behind STARTTLS was sent in the clear
		 * where only TLS may follow: no ACK, end the session. */
		if (ioc__nbd_in_avail(c) != 0)
			return -EPROTO;
		if (rep(c, opt, NBD_REP_ACK) < 0)
			return -ENOMEM;
		return IOC_NBD_STARTTLS;
	case NBD_OPT_INFO:
	case NBD_OPT_GO:
		return opt_info(c, opt, d, len);
	case NBD_OPT_STRUCTURED_REPLY:
		if (len != 0)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "unexpected data");
		if (c->extended)
			return rep_err(c, opt, NBD_REP_ERR_EXT_HEADER_REQD,
				       "extended headers already negotiated");
		if (c->structured)
			return rep_err(c, opt, NBD_REP_ERR_INVALID,
				       "structured replies already negotiated");
		c->structured = true;
		return rep(c, opt, NBD_REP_ACK);
	case NBD_OPT_EXTENDED_HEADERS:
		if (len != 0)
			return rep_err(c, opt, NBD_REP_ERR_INVALID, "unexpected data");
		if (c->extended)
			return rep_err(c, opt, NBD_REP_ERR_INVALID,
				       "extended headers already negotiated");
		c->extended = c->structured = true;
		return rep(c, opt, NBD_REP_ACK);
	case NBD_OPT_LIST_META_CONTEXT:
	case NBD_OPT_SET_META_CONTEXT:
		return opt_meta(c, opt, d, len);
	default:
		return rep_err(c, opt, NBD_REP_ERR_UNSUP, "unknown option");
	}
}

int ioc__nbd_hs_step(struct ioc__nbd_conn *c)
{
	for (;;) {
		if (c->phase == IOC_NBD_PHASE_CLIENT_FLAGS) {
			if (ioc__nbd_in_avail(c) < 4)
				return IOC_NBD_MORE;
			uint32_t f = ioc_nbd_ld32(c->in + c->in_start);
			c->in_start += 4;
			/* MUST drop the connection on unknown client flags. */
			if (f & ~(uint32_t)(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
				return -EPROTO;
			c->fixed = f & NBD_FLAG_C_FIXED_NEWSTYLE;
			c->no_zeroes = f & NBD_FLAG_C_NO_ZEROES;
			c->phase = IOC_NBD_PHASE_OPTIONS;
			continue;
		}
		if (c->phase != IOC_NBD_PHASE_OPTIONS)
			return -EPROTO;
		if (c->opt_skip) {
			size_t left = ioc__nbd_in_avail(c);
			size_t n = left < c->opt_skip ? left : c->opt_skip;
			c->in_start += n;
			c->opt_skip -= n;
			if (c->opt_skip)
				return IOC_NBD_MORE;
			if (rep_err(c, c->opt_skip_opt, NBD_REP_ERR_TOO_BIG,
				    "option too large") < 0)
				return -ENOMEM;
			continue;
		}
		if (ioc__nbd_in_avail(c) < 16)
			return IOC_NBD_MORE;
		const uint8_t *h = c->in + c->in_start;
		if (ioc_nbd_ld64(h) != NBD_MAGIC_OPTS)
			return -EPROTO;
		uint32_t opt = ioc_nbd_ld32(h + 8), len = ioc_nbd_ld32(h + 12);
		if (++c->nopts > IOC_NBD_MAX_OPTIONS)
			return -EPROTO;
		if (len > IOC_NBD_MAX_OPT_LEN) {
			if (len > IOC_NBD_MAX_OPT_SKIP || opt == NBD_OPT_EXPORT_NAME)
				return -EPROTO;
			c->in_start += 16;
			c->opt_skip = len;
			c->opt_skip_opt = opt;
			continue;
		}
		if (ioc__nbd_in_avail(c) < 16u + len)
			return IOC_NBD_MORE;
		c->in_start += 16 + len;
		int r = handle_option(c, opt, h + 16, len);
		if (r != 0)
			return r;
	}
}

void ioc__nbd_tls_started(struct ioc__nbd_conn *c)
{
	c->tls = true;
}
