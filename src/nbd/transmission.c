/*
 * NBD transmission: request parsing, request execution against the
 * export's backend, reply building and gathered sends, with no socket in
 * sight (the sans-I/O design is described in handshake.c).
 *
 * - Requests are validated at parse time (flags, bounds, read-only,
 *   negotiated features) so the execute step only runs sane requests.  A
 *   refused WRITE still has its payload consumed so the stream stays in
 *   sync; a payload over the advertised maximum is a hard disconnect.
 * - READ data is read by the backend straight into req->buf, which the
 *   reply iovec points at.  A transport that sets zc_read_min offers a
 *   pipe for large reads in the clear (a NULL iovec base stands for it);
 *   all the data is in the pipe before the reply is built, or the read is
 *   done the ordinary way, so an error never follows a header sent.  With
 *   map_reads the iovec may point into a tmpfs image's mapping instead;
 *   under IOC_NBD_MAP_ALONE_MIN (64 KiB) only while the thread serves
 *   other connections or the connection rests (map_small, conn.c), since
 *   lending to a lone client saves nothing there.
 * - Reads of at least IOC_NBD_SPARSE_READ_MIN bytes (a page over TLS) ask
 *   for block status first and send OFFSET_HOLE chunks for zero extents.
 *
 * Rejected (bench/nbd/NOTES.md): block status on every read (QEMU): a
 * SEEK_DATA per small read of a hole, and the block layer's remembered
 * data region thrashes; the 64 KiB threshold over TLS, where every byte
 * sent costs the client a decryption.
 *
 * Cost: a fixed ~1.5 KiB header area per request, so sparse reads never
 * allocate per chunk; paid once per in-flight slot (requests are recycled).
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "nbd-proto.h"
#include "util/buf.h"

/* ---- transmission: parsing ------------------------------------------------ */

static bool out_of_range(const struct ioc__nbd_export *e, uint64_t off, uint64_t len)
{
	return off > e->size || len > e->size - off;
}

/* Decide the NBD error of a request before running it (0: run it). */
static int check_request(const struct ioc__nbd_conn *c, uint16_t flags,
			 uint16_t type, uint64_t off, uint64_t len)
{
	const struct ioc__nbd_export *e = c->exp;
	uint16_t allowed = NBD_CMD_FLAG_FUA; /* harmless everywhere (as QEMU) */
	bool write = false, sized = true;
	int range_err = NBD_EINVAL;

	switch (type) {
	case NBD_CMD_READ:
		if (c->structured)
			allowed |= NBD_CMD_FLAG_DF;
		break;
	case NBD_CMD_WRITE:
		write = true;
		range_err = NBD_ENOSPC;
		if (c->extended)
			allowed |= NBD_CMD_FLAG_PAYLOAD_LEN;
		break;
	case NBD_CMD_DISC:
		return 0;
	case NBD_CMD_FLUSH:
		if (flags & ~allowed)
			return NBD_EINVAL;
		return (off || len) ? NBD_EINVAL : 0;
	case NBD_CMD_TRIM:
		if (!e->can_trim && !e->read_only)
			return NBD_EINVAL;
		write = true;
		break;
	case NBD_CMD_WRITE_ZEROES:
		if (!e->can_zero && !e->read_only)
			return NBD_EINVAL;
		allowed |= NBD_CMD_FLAG_NO_HOLE;
		if (e->can_fast_zero)
			allowed |= NBD_CMD_FLAG_FAST_ZERO;
		write = true;
		range_err = NBD_ENOSPC;
		break;
	case NBD_CMD_CACHE:
		if (!e->can_cache)
			return NBD_EINVAL;
		break;
	case NBD_CMD_BLOCK_STATUS:
		if (!c->meta_base_alloc && !c->meta_depth && !c->meta_nbitmaps)
			return NBD_EINVAL;
		allowed |= NBD_CMD_FLAG_REQ_ONE;
		sized = false; /* alignment of the tail is not required */
		break;
	default:
		return NBD_EINVAL;
	}
	if (flags & ~allowed)
		return NBD_EINVAL;
	if (write && e->read_only)
		return NBD_EPERM;
	if (len == 0)
		return NBD_EINVAL;
	if ((type == NBD_CMD_READ || type == NBD_CMD_WRITE) && len > e->max_block)
		return NBD_EOVERFLOW;
	if (out_of_range(e, off, len))
		return range_err;
	if (sized && c->enforce_block_size && e->min_block > 1 &&
	    ((off | len) & (e->min_block - 1)))
		return NBD_EINVAL;
	return 0;
}

/* Move payload bytes from the input buffer into (or past) c->partial. */
static struct ioc__nbd_req *take_payload(struct ioc__nbd_conn *c)
{
	struct ioc__nbd_req *r = c->partial;
	uint64_t want = r->len - c->partial_got;
	size_t left = ioc__nbd_in_avail(c);
	size_t n = left < want ? left : (size_t)want;

	if (!r->error)
		memcpy(r->buf + c->partial_got, c->in + c->in_start, n);
	c->in_start += n;
	c->partial_got += n;
	if (c->partial_got < r->len)
		return NULL;
	c->partial = NULL;
	return r;
}

struct ioc__nbd_req *ioc__nbd_payload_arrived(struct ioc__nbd_conn *c, size_t n)
{
	struct ioc__nbd_req *r = c->partial;

	c->partial_got += n;
	if (c->partial_got < r->len)
		return NULL;
	c->partial = NULL;
	return r;
}

int ioc__nbd_parse_request(struct ioc__nbd_conn *c, ioc__nbd_req_alloc *alloc,
			   void *opaque, struct ioc__nbd_req **out)
{
	*out = NULL;
	if (c->disc)
		return IOC_NBD_CLOSE; /* nothing may follow NBD_CMD_DISC */
	if (c->partial) {
		struct ioc__nbd_req *r = take_payload(c);
		if (!r)
			return IOC_NBD_MORE;
		*out = r;
		return IOC_NBD_READY;
	}

	size_t hsz = c->extended ? NBD_EXT_REQUEST_SIZE : NBD_REQUEST_SIZE;
	if (ioc__nbd_in_avail(c) < hsz)
		return IOC_NBD_MORE;
	const uint8_t *h = c->in + c->in_start;
	uint32_t magic = ioc_nbd_ld32(h);
	if (magic != (c->extended ? NBD_MAGIC_EXT_REQUEST : NBD_MAGIC_REQUEST))
		return -EPROTO;
	uint16_t flags = ioc_nbd_ld16(h + 4), type = ioc_nbd_ld16(h + 6);
	uint64_t cookie = ioc_nbd_ld64(h + 8), off = ioc_nbd_ld64(h + 16);
	uint64_t len = c->extended ? ioc_nbd_ld64(h + 24) : ioc_nbd_ld32(h + 24);
	c->in_start += hsz;

	/* Bytes that follow the header: a WRITE's data, or (extended headers)
	 * a payload announced by NBD_CMD_FLAG_PAYLOAD_LEN on any command. */
	uint64_t payload = 0;
	if (type == NBD_CMD_WRITE ||
	    (c->extended && (flags & NBD_CMD_FLAG_PAYLOAD_LEN)))
		payload = len;
	if (payload > IOC_NBD_MAX_PAYLOAD)
		return -EPROTO; /* cannot be skipped at a bounded cost */

	int err = check_request(c, flags, type, off, len);
	if (!err && type != NBD_CMD_READ && type != NBD_CMD_WRITE && payload)
		err = NBD_EINVAL; /* no other command takes a payload here */
	size_t bufsz = (!err && (type == NBD_CMD_READ || type == NBD_CMD_WRITE))
		       ? (size_t)len : 0;
	struct ioc__nbd_req *r = alloc(opaque, bufsz);
	if (!r)
		return -ENOMEM;
	r->next = NULL;
	r->flags = flags;
	r->type = type;
	r->cookie = cookie;
	r->offset = off;
	r->len = len;
	r->error = err;
	r->iovcnt = r->iov_done = 0;
	r->iov_off = 0;
	r->no_reply = false;
	r->mapped = false;
	r->pipe = NULL;
	if (type == NBD_CMD_DISC)
		c->disc = true;
	if (payload) {
		r->len = payload;
		c->partial = r;
		c->partial_got = 0;
		if (!take_payload(c))
			return IOC_NBD_MORE;
	}
	*out = r;
	return IOC_NBD_READY;
}

/* ---- replies ------------------------------------------------------------------ */

/* A backend's error.  NBD_EOVERFLOW, NBD_ENOTSUP and NBD_ESHUTDOWN have
 * protocol meanings (a request too large, a fast zero that would be slow,
 * the server going away) that a failing disk does not have, and older
 * clients do not know them: from the backend they are I/O errors.  The
 * protocol's own uses of them are made where they arise. */
int ioc__nbd_errno_to_nbd(int err)
{
	switch (err < 0 ? -err : err) {
	case 0: return 0;
	case EPERM: case EROFS: case EACCES: return NBD_EPERM;
	case ENOMEM: return NBD_ENOMEM;
	case EINVAL: return NBD_EINVAL;
	case ENOSPC: case EDQUOT: case EFBIG: return NBD_ENOSPC;
	default: return NBD_EIO;
	}
}

static void add_iov(struct ioc__nbd_req *r, void *base, size_t len)
{
	/* Bounded by construction (IOC_NBD_MAX_READ_CHUNKS). */
	if (r->iovcnt >= (int)IOC_ARRAY_SIZE(r->iov))
		return;
	r->iov[r->iovcnt].iov_base = base;
	r->iov[r->iovcnt].iov_len = len;
	r->iovcnt++;
}

/* Write a structured (or extended) chunk header at p; returns its end. */
static uint8_t *chunk_hdr(const struct ioc__nbd_conn *c, uint8_t *p,
			  const struct ioc__nbd_req *r, uint16_t flags,
			  uint16_t type, uint64_t plen)
{
	if (c->extended) {
		p = ioc_nbd_st32(p, NBD_MAGIC_EXT_REPLY);
		p = ioc_nbd_st16(p, flags);
		p = ioc_nbd_st16(p, type);
		p = ioc_nbd_st64(p, r->cookie);
		p = ioc_nbd_st64(p, r->offset);
		return ioc_nbd_st64(p, plen);
	}
	p = ioc_nbd_st32(p, NBD_MAGIC_STRUCT_REPLY);
	p = ioc_nbd_st16(p, flags);
	p = ioc_nbd_st16(p, type);
	p = ioc_nbd_st64(p, r->cookie);
	return ioc_nbd_st32(p, (uint32_t)plen);
}

static void reply_ok(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r)
{
	uint8_t *p = r->hdr, *e;

	if (c->extended) {
		e = chunk_hdr(c, p, r, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
	} else {
		e = ioc_nbd_st32(p, NBD_MAGIC_SIMPLE_REPLY);
		e = ioc_nbd_st32(e, 0);
		e = ioc_nbd_st64(e, r->cookie);
	}
	r->iovcnt = 0;
	add_iov(r, p, (size_t)(e - p));
}

void ioc__nbd_reply_error(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r,
			  int nbd_err, const char *msg)
{
	uint8_t *p = r->hdr, *e;

	r->iovcnt = 0;
	r->failed = true;
	if (r->type == NBD_CMD_DISC) {
		r->no_reply = true;
		return;
	}
	if (c->structured) {
		size_t ml = msg ? strlen(msg) : 0;
		if (ml > 200)
			ml = 200;
		e = chunk_hdr(c, p, r, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, 6 + ml);
		e = ioc_nbd_st32(e, (uint32_t)nbd_err);
		e = ioc_nbd_st16(e, (uint16_t)ml);
		if (ml)
			memcpy(e, msg, ml);
		e += ml;
	} else {
		e = ioc_nbd_st32(p, NBD_MAGIC_SIMPLE_REPLY);
		e = ioc_nbd_st32(e, (uint32_t)nbd_err);
		e = ioc_nbd_st64(e, r->cookie);
	}
	add_iov(r, p, (size_t)(e - p));
}

static void reply_status(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r,
			 int ret, const char *what)
{
	if (ret < 0)
		ioc__nbd_reply_error(c, r, ioc__nbd_errno_to_nbd(ret), what);
	else
		reply_ok(c, r);
}

static const char *error_text(int err)
{
	switch (err) {
	case NBD_EPERM: return "read-only export";
	case NBD_ENOSPC: return "request beyond the end of the export";
	case NBD_EOVERFLOW: return "request larger than the maximum block size";
	default: return "invalid request";
	}
}

/* Splice a large read's data into a pipe from the transport.  All of it
 * or nothing: the reply header goes out only for data known good (a
 * simple reply cannot report an error after its header). */
static bool read_to_pipe(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;
	struct ioc__nbd_pipe *p;

	if (!c->zc_read_min || r->len < c->zc_read_min || c->tls || !e->ops->splice_read ||
	    !(p = c->zc_get(r)))
		return false;
	ssize_t n = e->ops->splice_read(e->be, r->offset, (size_t)r->len, p->wfd, 0);
	p->fill = n > 0 ? (size_t)n : 0;
	if (n != (ssize_t)r->len) {
		c->zc_put(r, p);
		return false;
	}
	r->pipe = p;
	return true;
}

/* The read's data lent by the backend (see map_reads), or NULL. */
static const void *read_mapped(const struct ioc__nbd_conn *c, const struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;

	if (!c->map_reads || c->tls || !e->ops->map_read || !e->ops->map_fault ||
	    (r->len < IOC_NBD_MAP_ALONE_MIN && !c->map_small))
		return NULL;
	return e->ops->map_read(e->be, r->offset, (size_t)r->len);
}

/* A read without hole detection: one data chunk (or the simple reply). */
static void ioc_coroutine_fn read_plain(const struct ioc__nbd_conn *c,
					struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;
	bool piped = read_to_pipe(c, r);
	const void *mapped = piped ? NULL : read_mapped(c, r);
	int ret = piped || mapped ? 0 : e->ops->pread(e->be, r->offset, r->buf, r->len, 0);
	uint8_t *p = r->hdr, *end;

	if (ret < 0) {
		ioc__nbd_reply_error(c, r, ioc__nbd_errno_to_nbd(ret), "read failed");
		return;
	}
	r->iovcnt = 0;
	if (c->structured) {
		end = chunk_hdr(c, p, r, NBD_REPLY_FLAG_DONE,
				NBD_REPLY_TYPE_OFFSET_DATA, 8 + r->len);
		end = ioc_nbd_st64(end, r->offset);
	} else {
		end = ioc_nbd_st32(p, NBD_MAGIC_SIMPLE_REPLY);
		end = ioc_nbd_st32(end, 0);
		end = ioc_nbd_st64(end, r->cookie);
	}
	add_iov(r, p, (size_t)(end - p));
	add_iov(r, piped ? NULL : mapped ? (void *)mapped : r->buf, r->len);
	r->mapped = mapped != NULL;
}

int ioc__nbd_unmap_reads(const struct ioc__nbd_conn *c, struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;
	int n = 0;

	for (; r; r = r->next) {
		if (!r->mapped || r->type != NBD_CMD_READ)
			continue;
		int ret = e->ops->map_fault(e->be, r->offset, r->buf, (size_t)r->len);
		if (ret < 0)
			return ret;
		/* read_plain(): the header, then the data. */
		r->iov[1].iov_base = r->buf;
		r->mapped = false;
		n++;
	}
	return n;
}

/* A large structured read: OFFSET_HOLE chunks for zero extents. */
static void ioc_coroutine_fn read_sparse(const struct ioc__nbd_conn *c,
					 struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;
	uint64_t pos = r->offset, end = r->offset + r->len;
	uint8_t *p = r->hdr;
	int chunks = 0;

	r->iovcnt = 0;
	/* All data, the common case on a written image (and, with the block
	 * layer's remembered data region, no syscall to find out): one data
	 * chunk with DONE, as a plain read sends, not data plus NONE. */
	uint64_t first = 0;
	int st0 = e->ops->block_status(e->be, pos, end - pos, &first, 0);
	if (st0 < 0 || (!(st0 & NBD_STATE_ZERO) && first >= end - pos)) {
		read_plain(c, r);
		return;
	}
	while (pos < end) {
		uint64_t n = end - pos;
		int st = 0;
		/* The last chunk takes whatever is left, as data. */
		if (chunks == 0) {
			st = st0;
			n = first;
		} else if (chunks < IOC_NBD_MAX_READ_CHUNKS - 1) {
			st = e->ops->block_status(e->be, pos, end - pos, &n, 0);
			if (st < 0) {
				read_plain(c, r);
				return;
			}
		}
		if (n == 0 || n > end - pos)
			n = end - pos;
		bool hole = st & NBD_STATE_ZERO;
		uint8_t *h = p;
		if (hole) {
			p = chunk_hdr(c, p, r, 0, NBD_REPLY_TYPE_OFFSET_HOLE, 12);
			p = ioc_nbd_st64(p, pos);
			p = ioc_nbd_st32(p, (uint32_t)n);
			add_iov(r, h, (size_t)(p - h));
		} else {
			uint8_t *data = r->buf + (pos - r->offset);
			int ret = e->ops->pread(e->be, pos, data, (size_t)n, 0);
			if (ret < 0) {
				ioc__nbd_reply_error(c, r, ioc__nbd_errno_to_nbd(ret),
						     "read failed");
				return;
			}
			p = chunk_hdr(c, p, r, 0, NBD_REPLY_TYPE_OFFSET_DATA, 8 + n);
			p = ioc_nbd_st64(p, pos);
			add_iov(r, h, (size_t)(p - h));
			add_iov(r, data, (size_t)n);
		}
		chunks++;
		pos += n;
	}
	/* The final NONE chunk carries DONE. */
	uint8_t *h = p;
	p = chunk_hdr(c, p, r, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
	add_iov(r, h, (size_t)(p - h));
}

/* One block status descriptor: length and flags, 32-bit or (extended
 * headers) 64-bit fields. */
static void put_extent(const struct ioc__nbd_conn *c, uint8_t *q, uint64_t len,
		       uint32_t st)
{
	if (c->extended) {
		q = ioc_nbd_st64(q, len);
		ioc_nbd_st64(q, st);
	} else {
		q = ioc_nbd_st32(q, (uint32_t)len);
		ioc_nbd_st32(q, st);
	}
}

/* The status of one context at pos: flags, the run length in *pnum. */
static int ioc_coroutine_fn ctx_status(const struct ioc__nbd_conn *c, uint32_t id,
				       uint64_t pos, uint64_t len, uint64_t *pnum)
{
	const struct ioc__nbd_export *e = c->exp;

	switch (id) {
	case NBD_META_ID_BASE_ALLOC:
		return e->ops->block_status(e->be, pos, len, pnum, 0);
	case NBD_META_ID_QEMU_DEPTH:
		if (e->ops->depth_status)
			return e->ops->depth_status(e->be, pos, len, pnum, 0);
		/* A raw image has no backing chain: depth 1 ("local") everywhere. */
		*pnum = len;
		return 1;
	default: {
		int st = e->ops->dirty_status(e->be, c->meta_bitmap[id - NBD_META_ID_QEMU_BITMAP],
					      pos, len, pnum, 0);

		return st < 0 ? st : st ? (int)NBD_STATE_DIRTY : 0;
	}
	}
}

/*
 * The descriptors of the BLOCK_STATUS chunks, context after context, in
 * one buffer that grows as extents come (from room for EXT_FIRST of them
 * up to max): a 4 KiB request costs a small allocation, a walk of a
 * fragmented dirty bitmap over a terabyte gets few large replies instead
 * of one round trip per EXT_FIRST extents.
 */
#define EXT_FIRST 64u

struct ext_buf {
	uint8_t *p;
	size_t cap, used;       /* bytes */
};

static bool ext_reserve(struct ext_buf *b, size_t need)
{
	if (b->cap - b->used >= need)
		return true;
	uint8_t *p = ioc__buf_grow(b->p, &b->cap, b->used + need, 256);
	if (!p)
		return false;
	b->p = p;
	return true;
}

/* One BLOCK_STATUS chunk for context id: appends its descriptors (at most
 * max) to b; returns the extent count or -errno. */
static int ioc_coroutine_fn ctx_extents(const struct ioc__nbd_conn *c,
					struct ioc__nbd_req *r, uint32_t id,
					struct ext_buf *b, unsigned max)
{
	size_t dsz = c->extended ? 16 : 8;
	uint64_t pos = r->offset, end = r->offset + r->len;
	unsigned n = 0, room = 0;
	uint64_t last_len = 0;
	uint32_t last_st = 0;

	while (pos < end) {
		uint64_t pnum = end - pos;
		int st = ctx_status(c, id, pos, end - pos, &pnum);
		if (st < 0) {
			if (n == 0)
				return st;
			break;
		}
		if (pnum == 0 || pnum > end - pos)
			pnum = end - pos;
		if (n > 0 && (uint32_t)st == last_st &&
		    (c->extended || last_len + pnum <= UINT32_MAX)) {
			last_len += pnum;
		} else {
			if (n == max)
				break;
			if (n == room) {
				unsigned more = room ? room : (max < EXT_FIRST ? max : EXT_FIRST);
				if (more > max - room)
					more = max - room;
				if (!ext_reserve(b, dsz * (size_t)(n + more)))
					return n ? (int)n : -ENOMEM;
				room += more;
			}
			if (n > 0)
				put_extent(c, b->p + b->used + dsz * (n - 1), last_len, last_st);
			n++;
			last_len = pnum;
			last_st = (uint32_t)st;
		}
		pos += pnum;
	}
	put_extent(c, b->p + b->used + dsz * (n - 1), last_len, last_st);
	b->used += dsz * n;
	return (int)n;
}

/* One chunk per selected context, the last one flagged DONE. */
static void ioc_coroutine_fn do_block_status(const struct ioc__nbd_conn *c,
					     struct ioc__nbd_req *r)
{
	unsigned max = (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : IOC_NBD_MAX_EXTENTS;
	size_t dsz = c->extended ? 16 : 8, base = c->extended ? 8 : 4;
	struct ext_buf b = { NULL, 0, 0 };
	uint32_t ids[2 + IOC_NBD_META_BITMAPS];
	size_t at[2 + IOC_NBD_META_BITMAPS];
	int cnt[2 + IOC_NBD_META_BITMAPS];
	unsigned nids = 0;

	if (c->meta_base_alloc)
		ids[nids++] = NBD_META_ID_BASE_ALLOC;
	if (c->meta_depth)
		ids[nids++] = NBD_META_ID_QEMU_DEPTH;
	for (unsigned k = 0; k < c->meta_nbitmaps; k++)
		ids[nids++] = NBD_META_ID_QEMU_BITMAP + k;
	free(r->ext);
	r->ext = NULL;
	for (unsigned k = 0; k < nids; k++) {
		int n = -ENOMEM;

		/* The chunk's own header (context id, count) goes first. */
		if (ext_reserve(&b, base)) {
			at[k] = b.used;
			b.used += base;
			n = ctx_extents(c, r, ids[k], &b, max);
		}
		if (n < 0) {
			free(b.p);
			ioc__nbd_reply_error(c, r, ioc__nbd_errno_to_nbd(n),
					     n == -EUCLEAN ? "dirty bitmap inconsistent" :
					     n == -ENOENT ? "dirty bitmap removed" :
					     n == -ENOMEM ? "out of memory" :
					     "block status failed");
			return;
		}
		cnt[k] = n;
	}
	/* Only now, with the buffer at its final address, the iovecs. */
	r->ext = b.p;
	uint8_t *h = r->hdr;
	r->iovcnt = 0;
	for (unsigned k = 0; k < nids; k++) {
		uint8_t *payload = r->ext + at[k];
		size_t plen = base + dsz * (size_t)cnt[k];

		ioc_nbd_st32(payload, ids[k]);
		if (c->extended)
			ioc_nbd_st32(payload + 4, (uint32_t)cnt[k]);
		uint8_t *p = chunk_hdr(c, h, r, k + 1 == nids ? NBD_REPLY_FLAG_DONE : 0,
				       c->extended ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
						   : NBD_REPLY_TYPE_BLOCK_STATUS, plen);
		add_iov(r, h, (size_t)(p - h));
		add_iov(r, payload, plen);
		h = p;
	}
}

/* A WRITE whose payload the transport spliced into a pipe: written from
 * there (one copy, in the kernel), else read out into buf and written the
 * ordinary way.  The pipe goes back to the transport either way. */
static int ioc_coroutine_fn write_from_pipe(const struct ioc__nbd_conn *c,
					    struct ioc__nbd_req *r, uint32_t f)
{
	const struct ioc__nbd_export *e = c->exp;
	struct ioc__nbd_pipe *p = r->pipe;
	int ret = e->ops->splice_write ?
		  e->ops->splice_write(e->be, r->offset, (size_t)r->len, p->rfd, f) : -ENOTSUP;

	if (ret != -ENOTSUP) {
		p->fill = ret == 0 ? 0 : SIZE_MAX;
	} else {
		size_t got = 0;

		while (got < r->len) {
			ssize_t n = read(p->rfd, r->buf + got, (size_t)r->len - got);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		p->fill = 0;
		ret = got == r->len ? e->ops->pwrite(e->be, r->offset, r->buf, r->len, f)
				    : -EIO;
	}
	r->pipe = NULL;
	c->zc_put(r, p);
	return ret;
}

void ioc_coroutine_fn ioc__nbd_execute(const struct ioc__nbd_conn *c,
				       struct ioc__nbd_req *r)
{
	const struct ioc__nbd_export *e = c->exp;
	uint32_t f = (r->flags & NBD_CMD_FLAG_FUA) && e->can_fua ? IOC_NBD_BE_FUA : 0;
	int ret = 0;

	if (r->type == NBD_CMD_DISC) {
		r->no_reply = true;
		r->iovcnt = 0;
		return;
	}
	if (r->error) {
		ioc__nbd_reply_error(c, r, r->error, error_text(r->error));
		return;
	}
	switch (r->type) {
	case NBD_CMD_READ:
		if (c->structured && !(r->flags & NBD_CMD_FLAG_DF) && e->can_block_status &&
		    r->len >= (c->tls ? IOC_NBD_TLS_SPARSE_READ_MIN : IOC_NBD_SPARSE_READ_MIN))
			read_sparse(c, r);
		else
			read_plain(c, r);
		return;
	case NBD_CMD_WRITE:
		if (r->wmap_len) {
			/* In the image already, all or the first part. */
			ret = r->wmap_ret;
			if (ret == 0 && r->wmap_len < r->len)
				ret = e->ops->pwrite(e->be, r->offset + r->wmap_len,
						     r->buf + r->wmap_len,
						     r->len - r->wmap_len, f);
		} else if (r->pipe)
			ret = write_from_pipe(c, r, f);
		else
			ret = e->ops->pwrite(e->be, r->offset, r->buf, r->len, f);
		reply_status(c, r, ret, "write failed");
		return;
	case NBD_CMD_FLUSH:
		ret = e->ops->flush(e->be, 0);
		reply_status(c, r, ret, "flush failed");
		return;
	case NBD_CMD_TRIM:
		ret = e->ops->trim ? e->ops->trim(e->be, r->offset, r->len, f) : 0;
		if (ret == -ENOTSUP || ret == -EOPNOTSUPP)
			ret = 0; /* TRIM is advisory */
		if (ret == 0 && f)
			ret = e->ops->flush(e->be, 0);
		reply_status(c, r, ret, "trim failed");
		return;
	case NBD_CMD_WRITE_ZEROES:
		if (!(r->flags & NBD_CMD_FLAG_NO_HOLE))
			f |= IOC_NBD_BE_MAY_TRIM;
		if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
			f |= IOC_NBD_BE_FAST_ONLY;
		ret = e->ops->zero(e->be, r->offset, r->len, f);
		if (ret == -ENOTSUP && (f & IOC_NBD_BE_FAST_ONLY))
			ioc__nbd_reply_error(c, r, NBD_ENOTSUP, "zeroing would not be fast");
		else
			reply_status(c, r, ret, "write zeroes failed");
		return;
	case NBD_CMD_CACHE:
		ret = e->ops->cache ? e->ops->cache(e->be, r->offset, r->len, 0) : 0;
		reply_status(c, r, ret, "cache failed");
		return;
	case NBD_CMD_BLOCK_STATUS:
		do_block_status(c, r);
		return;
	default:
		ioc__nbd_reply_error(c, r, NBD_EINVAL, "unknown command");
		return;
	}
}

/* ---- gathered sends ------------------------------------------------------------ */

int ioc__nbd_gather_upto_pipe(struct ioc__nbd_req *r, struct iovec *iov, int max,
			      bool *at_pipe)
{
	int n = 0;

	*at_pipe = false;
	for (; r && n < max; r = r->next) {
		for (int i = r->iov_done; i < r->iovcnt && n < max; i++) {
			size_t skip = i == r->iov_done ? r->iov_off : 0;
			if (r->pipe && !r->iov[i].iov_base) {
				*at_pipe = true;
				return n;
			}
			iov[n].iov_base = (uint8_t *)r->iov[i].iov_base + skip;
			iov[n].iov_len = r->iov[i].iov_len - skip;
			n++;
		}
	}
	return n;
}

int ioc__nbd_gather(struct ioc__nbd_req *r, struct iovec *iov, int max)
{
	bool at_pipe;

	return ioc__nbd_gather_upto_pipe(r, iov, max, &at_pipe);
}

unsigned ioc__nbd_sent(struct ioc__nbd_req *r, size_t n)
{
	unsigned done = 0;

	for (; r; r = r->next) {
		while (r->iov_done < r->iovcnt) {
			size_t left = r->iov[r->iov_done].iov_len - r->iov_off;
			if (n < left) {
				r->iov_off += n;
				return done;
			}
			n -= left;
			r->iov_done++;
			r->iov_off = 0;
		}
		done++;
		if (n == 0)
			return done;
	}
	return done;
}
