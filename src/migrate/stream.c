/*
 * The migration stream's codec (stream.h): byte layouts, the checks that
 * stand between a hostile peer and the image, payload decoding, and the
 * per-block CRCs from which both sides compute the image checksum.
 *
 * Problem.  Everything here runs on bytes off a socket.  A length is a
 * promise, not a fact: it is checked against the stream's header and fixed
 * limits before anything is allocated, read or written on its strength.  And
 * both sides must reach the same image checksum without rereading it.
 *
 * Design.
 *  - Decoding is pure: a header or record buffer in, a struct and a reason
 *    out.  Every rejection names the field and, for records, the offset, so
 *    the destination's log tells a buggy sender from a flaky link.
 *  - zstd payloads are checked three ways: the frame's stated content size
 *    equals the record's length, its compressed size is exactly the payload
 *    (one frame, nothing trailing), and the decoder produced exactly length
 *    bytes.  Decoding is single-shot into the caller's buffer of length
 *    bytes, so no frame makes the decoder allocate a window of its choosing.
 *  - Several threads (decompression or compression workers) write the
 *    per-block CRC array at once, each on its own blocks: the CRCs are plain
 *    32-bit stores to distinct elements, while the "set" bitmap packs 64
 *    blocks to a word and takes an atomic OR.  Whoever computes the checksum
 *    has synchronised with the writers by other means (joined the workers,
 *    collected the jobs).
 *  - The CRC of a run of zeros is computed by doubling with crc32_combine()
 *    (logarithmic in the length) and cached per length in a small table of
 *    single 64-bit words, so no reader sees half an entry.
 *  - A record's data CRC is not recomputed over the record when its blocks'
 *    CRCs are known: ioc_mig_crcs_set() combines them, so the receiver reads
 *    each decoded byte once for checking.
 *
 * Rejected.  A bitmap of bytes instead of bits (no atomics, but 8x the
 * memory for a 1 TiB image); a lock around the CRC array (the workers would
 * serialise on it at every record); streaming zstd decoding (it needs
 * ZSTD_d_windowLogMax to bound memory; the one-shot decoder on a checked
 * content size is bounded and faster).
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "ioc-config.h"
#if IOC_HAVE_ISAL
#include <isa-l/crc.h>
#elif IOC_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif
#include "iocore/common.h"
#include "stream-int.h"

/* Big-endian helpers. */
static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

/* The CRC-32 of zlib, gzip and ISA-L's crc32_gzip_refl (reflected
 * 0xedb88320, initial and final inversion), chained by passing the
 * previous value: the libraries agree bit for bit (test-migrate-stream.c
 * holds them to zlib's crc32()), so the choice changes speed, not the stream.  ISA-L
 * and libdeflate fold with carry-less multiplication (~10 GB/s on 4 KiB
 * blocks here, against zlib's ~2 GB/s table code). */
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t len)
{
#if IOC_HAVE_ISAL
	return crc32_gzip_refl(crc, p, len);
#elif IOC_HAVE_LIBDEFLATE
	return libdeflate_crc32(crc, p, len);
#else
	/* zlib takes uInt lengths. */
	while (len) {
		uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;

		crc = (uint32_t)crc32(crc, p, n);
		p += n;
		len -= n;
	}
	return crc;
#endif
}

uint32_t ioc_mig_crc(const void *buf, size_t len)
{
	return crc_update(0, buf, len);
}

/* CRC of a || b given crc(a), crc(b) and len(b). */
static uint32_t crc_combine(uint32_t a, uint32_t b, uint64_t blen)
{
	return (uint32_t)crc32_combine64(a, b, (z_off64_t)blen);
}

/* Appending one block of a fixed length many times: zlib (1.2.12 on)
 * precomputes the operator for the length once, then each combine is one
 * multiplication modulo the polynomial instead of a square-and-multiply
 * over the length's bits. */
struct combiner {
	uint64_t len;
#if ZLIB_VERNUM >= 0x12c0
	uLong op;
#endif
};

static void combiner_init(struct combiner *k, uint64_t len)
{
	k->len = len;
#if ZLIB_VERNUM >= 0x12c0
	k->op = crc32_combine_gen64((z_off64_t)len);
#endif
}

static uint32_t combine_with(const struct combiner *k, uint32_t a, uint32_t b,
			     uint64_t blen)
{
#if ZLIB_VERNUM >= 0x12c0
	if (blen == k->len)
		return (uint32_t)crc32_combine_op(a, b, k->op);
#else
	(void)k;
#endif
	return crc_combine(a, b, blen);
}

static uint32_t crc_zero_compute(uint64_t len)
{
	static const uint8_t zero;
	uint32_t one = ioc_mig_crc(&zero, 1), crc = 0;
	uint64_t have = 0;

	/* Binary expansion from the top bit: double, then add a byte. */
	for (int bit = 63; bit >= 0; bit--) {
		if (have)
			crc = crc_combine(crc, crc, have);
		have *= 2;
		if (len >> bit & 1) {
			crc = have ? crc_combine(crc, one, 1) : one;
			have++;
		}
	}
	return crc;
}

/* Cache entries: len << 32 | crc, for lengths below 2^32; 0 is empty. */
#define ZCACHE 16
static _Atomic uint64_t zcache[ZCACHE];

uint32_t ioc_mig_crc_zero(size_t len)
{
	uint64_t l = len;
	unsigned slot = (unsigned)((l * 0x9e3779b97f4a7c15ull) >> 60) % ZCACHE;
	uint64_t e;
	uint32_t crc;

	if (l == 0)
		return 0;
	if (l >> 32)
		return crc_zero_compute(l);
	/* Relaxed load and store: an entry is one self-contained word that
	 * publishes no other memory, so it pairs with nothing; a reader sees
	 * either an old entry (whose length it checks) or the new one. */
	e = atomic_load_explicit(&zcache[slot], memory_order_relaxed);
	if (e >> 32 == l)
		return (uint32_t)e;
	crc = crc_zero_compute(l);
	atomic_store_explicit(&zcache[slot], l << 32 | crc, memory_order_relaxed);
	return crc;
}

/* ---- header and records ------------------------------------------- */

void ioc_mig_hdr_encode(const struct ioc_mig_hdr *h, uint8_t *buf)
{
	put64(buf, IOC_MIG_MAGIC);
	put32(buf + 8, h->version);
	put32(buf + 12, h->flags);
	put64(buf + 16, h->image_size);
	put32(buf + 24, h->block_size);
	put32(buf + 28, ioc_mig_crc(buf, 28));
}

void ioc_mig_rec_encode(const struct ioc_mig_rec *r, uint8_t *buf)
{
	put32(buf, r->type);
	put32(buf + 4, r->flags);
	put64(buf + 8, r->offset);
	put32(buf + 16, r->length);
	put32(buf + 20, r->payload_len);
	put32(buf + 24, r->data_crc);
	put32(buf + 28, ioc_mig_crc(buf, 28));
}

static int reject(const char **why, const char *reason, int err)
{
	if (why)
		*why = reason;
	return err;
}

uint64_t ioc__mig_nblocks(uint64_t image_size, uint32_t block_size)
{
	return image_size / block_size + (image_size % block_size != 0);
}

int ioc_mig_hdr_decode(const uint8_t *buf, struct ioc_mig_hdr *h,
		       const char **why)
{
	uint32_t bs;

	memset(h, 0, sizeof(*h));
	if (get64(buf) != IOC_MIG_MAGIC)
		return reject(why, "header: bad magic (not an iocore migration stream)",
			      -EPROTONOSUPPORT);
	if (get32(buf + 28) != ioc_mig_crc(buf, 28))
		return reject(why, "header: header CRC mismatch", -EPROTO);
	h->version = get32(buf + 8);
	h->flags = get32(buf + 12);
	h->image_size = get64(buf + 16);
	h->block_size = bs = get32(buf + 24);
	if (h->version != IOC_MIG_VERSION)
		return reject(why, "header: unsupported version", -EPROTONOSUPPORT);
	if (h->flags & ~IOC_MIG_F_HANDOVER)
		return reject(why, "header: unknown flags", -EPROTO);
	if (bs < IOC_MIG_MIN_BLOCK || bs > IOC_MIG_MAX_BLOCK || (bs & (bs - 1)))
		return reject(why, "header: block size not a power of two in [4 KiB, 64 MiB]",
			      -EPROTO);
	if (h->image_size == 0)
		return reject(why, "header: image size 0", -EPROTO);
	if (ioc__mig_nblocks(h->image_size, bs) > IOC_MIG_MAX_BLOCKS)
		return reject(why, "header: image size above 2^28 blocks of its block size",
			      -EPROTO);
	return 0;
}

int ioc_mig_rec_decode(const uint8_t *buf, const struct ioc_mig_hdr *h,
		       struct ioc_mig_rec *r, const char **why)
{
	uint64_t end;

	/* The fields first, so a caller's message can show what a corrupted
	 * record claimed. */
	r->type = get32(buf);
	r->flags = get32(buf + 4);
	r->offset = get64(buf + 8);
	r->length = get32(buf + 16);
	r->payload_len = get32(buf + 20);
	r->data_crc = get32(buf + 24);
	if (get32(buf + 28) != ioc_mig_crc(buf, 28))
		return reject(why, "record: header CRC mismatch", -EPROTO);
	if (r->type < IOC_MIG_DATA_RAW || r->type > IOC_MIG_READY)
		return reject(why, "record: unknown type", -EPROTO);
	if (r->flags != 0)
		return reject(why, "record: unknown flags", -EPROTO);
	if (h->flags & IOC_MIG_F_HANDOVER) {
		if (r->type != IOC_MIG_HANDOVER && r->type != IOC_MIG_READY &&
		    r->type != IOC_MIG_ACK)
			return reject(why, "record: not HANDOVER, READY or ACK in a hand-over stream",
				      -EPROTO);
	} else if (r->type == IOC_MIG_HANDOVER || r->type == IOC_MIG_READY) {
		return reject(why, "record: HANDOVER or READY in a copy stream", -EPROTO);
	}
	switch (r->type) {
	case IOC_MIG_HANDOVER:
		if (r->offset != h->image_size)
			return reject(why, "record: HANDOVER offset is not the image size", -EPROTO);
		if (r->length == 0 || r->length > IOC_MIG_MAX_SHARED_ID)
			return reject(why, "record: HANDOVER length outside [1, 1024]", -EPROTO);
		if (r->payload_len != r->length)
			return reject(why, "record: payload_len != length for HANDOVER", -EPROTO);
		break;
	case IOC_MIG_READY:
		if (r->length != 0 || r->payload_len != 0)
			return reject(why, "record: READY with a length or payload", -EPROTO);
		break;
	case IOC_MIG_DATA_RAW:
	case IOC_MIG_DATA_ZSTD:
	case IOC_MIG_ZERO:
	case IOC_MIG_MIRROR:
		if (r->length == 0)
			return reject(why, "record: length 0", -EPROTO);
		if (r->offset >= h->image_size)
			return reject(why, "record: offset outside the image", -EPROTO);
		end = r->offset + r->length; /* no overflow: offset < 2^54 */
		if (end > h->image_size)
			return reject(why, "record: offset + length beyond the image end",
				      -EPROTO);
		if (r->offset % h->block_size)
			return reject(why, "record: offset not block-aligned", -EPROTO);
		if (r->length % h->block_size && end != h->image_size)
			return reject(why, "record: length not whole blocks", -EPROTO);
		if (r->type == IOC_MIG_ZERO) {
			if (r->payload_len != 0)
				return reject(why, "record: payload_len not 0 for ZERO",
					      -EPROTO);
			break;
		}
		if (r->length > IOC_MIG_MAX_CHUNK)
			return reject(why, "record: length above the 64 MiB chunk limit",
				      -EPROTO);
		if ((r->type == IOC_MIG_DATA_RAW || r->type == IOC_MIG_MIRROR) &&
		    r->payload_len != r->length)
			return reject(why, "record: payload_len != length for DATA_RAW/MIRROR",
				      -EPROTO);
		if (r->type == IOC_MIG_DATA_ZSTD &&
		    (r->payload_len == 0 || r->payload_len > ZSTD_compressBound(r->length)))
			return reject(why, "record: payload_len outside zstd's bound for DATA_ZSTD",
				      -EPROTO);
		break;
	case IOC_MIG_PASS:
		if (r->offset == 0)
			return reject(why, "record: PASS number 0", -EPROTO);
		/* fallthrough */
	case IOC_MIG_END:
	case IOC_MIG_ACK:
	case IOC_MIG_MACK:
		if (r->length != 0)
			return reject(why, "record: length not 0 for PASS/END/ACK/MACK", -EPROTO);
		if (r->payload_len != 0)
			return reject(why, "record: payload_len not 0 for PASS/END/ACK/MACK",
				      -EPROTO);
		if (r->type == IOC_MIG_END && r->offset != h->image_size)
			return reject(why, "record: END offset is not the image size",
				      -EPROTO);
		break;
	}
	return 0;
}

int ioc__mig_payload_decode(const struct ioc_mig_rec *r, const void *payload,
			    void *out, ZSTD_DCtx *dctx, const char **why)
{
	unsigned long long fsize;
	size_t n;

	switch (r->type) {
	case IOC_MIG_DATA_RAW:
	case IOC_MIG_MIRROR:
		if (r->payload_len != r->length)
			return reject(why, "payload: payload_len != length for DATA_RAW",
				      -EPROTO);
		if (out != payload)
			memcpy(out, payload, r->length);
		return 0;
	case IOC_MIG_DATA_ZSTD:
		fsize = ZSTD_getFrameContentSize(payload, r->payload_len);
		if (fsize == ZSTD_CONTENTSIZE_ERROR)
			return reject(why, "payload: not a zstd frame", -EBADMSG);
		if (fsize == ZSTD_CONTENTSIZE_UNKNOWN)
			return reject(why, "payload: zstd frame without a content size",
				      -EBADMSG);
		if (fsize != r->length)
			return reject(why, "payload: zstd content size != record length",
				      -EBADMSG);
		n = ZSTD_findFrameCompressedSize(payload, r->payload_len);
		if (ZSTD_isError(n) || n != r->payload_len)
			return reject(why, "payload: zstd frame size != payload_len",
				      -EBADMSG);
		n = dctx ? ZSTD_decompressDCtx(dctx, out, r->length, payload, r->payload_len)
			 : ZSTD_decompress(out, r->length, payload, r->payload_len);
		if (ZSTD_isError(n))
			return reject(why, "payload: zstd decoding failed", -EBADMSG);
		if (n != r->length)
			return reject(why, "payload: zstd decoded size != record length",
				      -EBADMSG);
		return 0;
	default:
		return reject(why, "payload: not a DATA record", -EPROTO);
	}
}

int ioc_mig_handover_decode(const struct ioc_mig_rec *r, const void *payload, char *id,
			    size_t idlen, const char **why)
{
	if (r->type != IOC_MIG_HANDOVER || r->payload_len != r->length ||
	    r->length == 0 || r->length > IOC_MIG_MAX_SHARED_ID || idlen <= r->length)
		return reject(why, "payload: not a HANDOVER record", -EPROTO);
	if (ioc_mig_crc(payload, r->length) != r->data_crc)
		return reject(why, "payload: HANDOVER CRC mismatch", -EBADMSG);
	if (memchr(payload, 0, r->length))
		return reject(why, "payload: HANDOVER shared id holds a NUL byte", -EPROTO);
	memcpy(id, payload, r->length);
	id[r->length] = '\0';
	return 0;
}

int ioc_mig_payload_decode(const struct ioc_mig_rec *r, const void *payload,
			   void *out, const char **why)
{
	int ret = ioc__mig_payload_decode(r, payload, out, NULL, why);

	if (ret == 0 && ioc_mig_crc(out, r->length) != r->data_crc)
		return reject(why, "payload: data CRC mismatch", -EBADMSG);
	return ret;
}

/* ---- per-block CRCs ------------------------------------------------ */

struct ioc_mig_crcs {
	uint64_t image_size;
	uint64_t nblocks;
	uint32_t block_size;
	uint32_t *crc;
	/* Bit b of word b / 64: block b has been set.  Atomic OR from any
	 * thread (see ioc_mig_crcs_set()). */
	_Atomic uint64_t *set;
};

int ioc_mig_crcs_new(struct ioc_mig_crcs **out, uint64_t image_size,
		     uint32_t block_size)
{
	struct ioc_mig_crcs *c;
	uint64_t nb;

	*out = NULL;
	if (block_size == 0 || (block_size & (block_size - 1)) || image_size == 0)
		return -EINVAL;
	nb = ioc__mig_nblocks(image_size, block_size);
	if (nb > IOC_MIG_MAX_BLOCKS)
		return -EFBIG;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->image_size = image_size;
	c->block_size = block_size;
	c->nblocks = nb;
	/* calloc of a large array maps fresh zero pages: a hostile header
	 * costs address space, not memory, until blocks arrive. */
	c->crc = calloc((size_t)nb, sizeof(*c->crc));
	c->set = calloc((size_t)(nb + 63) / 64, sizeof(*c->set));
	if (!c->crc || !c->set) {
		ioc_mig_crcs_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

void ioc_mig_crcs_free(struct ioc_mig_crcs *c)
{
	if (!c)
		return;
	free(c->crc);
	free((void *)c->set);
	free(c);
}

static void mark(struct ioc_mig_crcs *c, uint64_t b, uint32_t crc)
{
	c->crc[b] = crc;
	/* Relaxed OR: concurrent setters own distinct blocks and only need
	 * the OR to be atomic; it pairs with no load here.  The reader of the
	 * bitmap and the CRCs (ioc_mig_crcs_checksum()) synchronises with
	 * the setters through whatever handed their work back (the
	 * workqueue's done ring, a join), which orders both stores. */
	atomic_fetch_or_explicit(&c->set[b / 64], UINT64_C(1) << (b % 64),
				 memory_order_relaxed);
}

uint32_t ioc_mig_crcs_set(struct ioc_mig_crcs *c, uint64_t offset,
			  uint64_t len, const void *buf)
{
	const uint8_t *p = buf;
	uint32_t whole = 0, zfull = 0;
	struct combiner k;
	uint64_t b, end;

	if (offset >= c->image_size || len == 0)
		return 0;
	if (len > c->image_size - offset)
		len = c->image_size - offset;
	end = offset + len;
	combiner_init(&k, c->block_size);
	if (!buf)
		zfull = ioc_mig_crc_zero(c->block_size);
	for (b = offset / c->block_size; offset < end; b++) {
		uint64_t n = end - offset < c->block_size ? end - offset : c->block_size;
		uint32_t crc;

		if (buf)
			crc = ioc_mig_crc(p, (size_t)n);
		else
			crc = n == c->block_size ? zfull : ioc_mig_crc_zero((size_t)n);
		/* A partial block can only be the image's last one (the
		 * caller's ranges cover whole blocks), so its CRC is of all
		 * its bytes. */
		mark(c, b, crc);
		whole = combine_with(&k, whole, crc, n);
		offset += n;
		if (buf)
			p += n;
	}
	return whole;
}

uint32_t ioc_mig_block_crcs(uint32_t block_size, const void *buf, uint64_t len,
			    uint32_t *out)
{
	const uint8_t *p = buf;
	uint32_t whole = 0;
	struct combiner k;

	combiner_init(&k, block_size);
	for (uint64_t i = 0; len; i++) {
		uint64_t n = len < block_size ? len : block_size;

		out[i] = ioc_mig_crc(p, (size_t)n);
		whole = combine_with(&k, whole, out[i], n);
		p += n;
		len -= n;
	}
	return whole;
}

void ioc_mig_crcs_put(struct ioc_mig_crcs *c, uint64_t offset, uint64_t len,
		      const uint32_t *crcs)
{
	if (offset >= c->image_size || len == 0)
		return;
	if (len > c->image_size - offset)
		len = c->image_size - offset;
	for (uint64_t b = offset / c->block_size, i = 0;
	     b <= (offset + len - 1) / c->block_size; b++, i++)
		mark(c, b, crcs[i]);
}

int ioc_mig_crcs_checksum(const struct ioc_mig_crcs *c, uint32_t *sum,
			  uint64_t *missing)
{
	uint8_t be[4096];
	uint32_t crc = 0;
	size_t fill = 0;

	*sum = 0;
	for (uint64_t w = 0; w < (c->nblocks + 63) / 64; w++) {
		/* Relaxed: see mark(). */
		uint64_t bits = atomic_load_explicit(&c->set[w], memory_order_relaxed);
		uint64_t want = w + 1 < (c->nblocks + 63) / 64 || c->nblocks % 64 == 0
					? ~UINT64_C(0)
					: (UINT64_C(1) << (c->nblocks % 64)) - 1;

		if (bits != want) {
			if (missing)
				*missing = w * 64 + (uint64_t)__builtin_ctzll(~bits);
			return -ENODATA;
		}
	}
	for (uint64_t b = 0; b < c->nblocks; b++) {
		put32(be + fill, c->crc[b]);
		fill += 4;
		if (fill == sizeof(be)) {
			crc = crc_update(crc, be, fill);
			fill = 0;
		}
	}
	*sum = crc_update(crc, be, fill);
	return 0;
}
