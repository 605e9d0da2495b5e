/*
 * Test helpers for the migration stream: a builder that encodes a stream
 * into memory the way a sender would (header, DATA_RAW, DATA_ZSTD, ZERO,
 * MIRROR, PASS, END; or a hand-over's HANDOVER), keeping a model of the image it describes so a test can
 * compare the receiver's file with it byte for byte.  The model's image
 * checksum is computed here from zlib directly, not with ioc_mig_crcs_*,
 * so the tests check the codec's checksum against an independent one.
 */
#ifndef IOC_MIG_TEST_UTIL_H
#define IOC_MIG_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "stream.h"

struct mt_stream {
	uint8_t *p;
	size_t len, cap;
	uint64_t image_size;
	uint32_t block_size;
	uint8_t *model;         /* the image the stream describes */
};

static inline void mt_put(struct mt_stream *s, const void *buf, size_t n)
{
	if (s->len + n > s->cap) {
		s->cap = (s->len + n) * 2 + 256;
		s->p = realloc(s->p, s->cap);
		if (!s->p)
			abort();
	}
	memcpy(s->p + s->len, buf, n);
	s->len += n;
}

/* Deterministic bytes: compressible when text is set, else noise. */
static inline void mt_fill(uint8_t *p, size_t n, uint64_t salt, int text)
{
	uint64_t x = salt * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = text ? (uint8_t)("migrate the image "[(i + salt) % 18]) ^
			      (uint8_t)((x % 64) == 0)
			    : (uint8_t)(x >> 24);
	}
}

static inline void mt_begin(struct mt_stream *s, uint64_t image_size, uint32_t bs)
{
	struct ioc_mig_hdr h = { .version = IOC_MIG_VERSION, .image_size = image_size,
				 .block_size = bs };
	uint8_t b[IOC_MIG_HDR_SIZE];

	memset(s, 0, sizeof(*s));
	s->image_size = image_size;
	s->block_size = bs;
	s->model = calloc(1, (size_t)image_size);
	if (!s->model)
		abort();
	ioc_mig_hdr_encode(&h, b);
	mt_put(s, b, sizeof(b));
}

/* A hand-over stream: the header with its flag, then HANDOVER naming id. */
static inline void mt_handover(struct mt_stream *s, uint64_t image_size, const char *id)
{
	struct ioc_mig_hdr h = { .version = IOC_MIG_VERSION, .flags = IOC_MIG_F_HANDOVER,
				 .image_size = image_size, .block_size = IOC_MIG_MIN_BLOCK };
	struct ioc_mig_rec r = { .type = IOC_MIG_HANDOVER, .offset = image_size,
				 .length = (uint32_t)strlen(id),
				 .payload_len = (uint32_t)strlen(id),
				 .data_crc = (uint32_t)crc32(0, (const Bytef *)id,
							     (uInt)strlen(id)) };
	uint8_t b[IOC_MIG_HDR_SIZE];

	memset(s, 0, sizeof(*s));
	s->image_size = image_size;
	s->block_size = IOC_MIG_MIN_BLOCK;
	ioc_mig_hdr_encode(&h, b);
	mt_put(s, b, sizeof(b));
	ioc_mig_rec_encode(&r, b);
	mt_put(s, b, IOC_MIG_REC_SIZE);
	mt_put(s, id, strlen(id));
}

static inline void mt_rec(struct mt_stream *s, uint32_t type, uint64_t off,
			  uint32_t len, uint32_t plen, uint32_t crc)
{
	struct ioc_mig_rec r = { .type = type, .offset = off, .length = len,
				 .payload_len = plen, .data_crc = crc };
	uint8_t b[IOC_MIG_REC_SIZE];

	ioc_mig_rec_encode(&r, b);
	mt_put(s, b, sizeof(b));
}

static inline void mt_raw(struct mt_stream *s, uint64_t off, const void *data, uint32_t len)
{
	mt_rec(s, IOC_MIG_DATA_RAW, off, len, len, (uint32_t)crc32(0, data, len));
	mt_put(s, data, len);
	memcpy(s->model + off, data, len);
}

static inline void mt_zstd(struct mt_stream *s, uint64_t off, const void *data, uint32_t len)
{
	size_t cap = ZSTD_compressBound(len), n;
	void *z = malloc(cap);

	n = ZSTD_compress(z, cap, data, len, 3);
	if (!z || ZSTD_isError(n))
		abort();
	mt_rec(s, IOC_MIG_DATA_ZSTD, off, len, (uint32_t)n, (uint32_t)crc32(0, data, len));
	mt_put(s, z, n);
	memcpy(s->model + off, data, len);
	free(z);
}

/* A MIRROR record (raw, may overlap anything before it). */
static inline void mt_mirror(struct mt_stream *s, uint64_t off, const void *data,
			     uint32_t len)
{
	mt_rec(s, IOC_MIG_MIRROR, off, len, len, (uint32_t)crc32(0, data, len));
	mt_put(s, data, len);
	memcpy(s->model + off, data, len);
}

static inline void mt_zero(struct mt_stream *s, uint64_t off, uint32_t len)
{
	mt_rec(s, IOC_MIG_ZERO, off, len, 0, 0);
	memset(s->model + off, 0, len);
}

static inline void mt_pass(struct mt_stream *s, uint64_t n)
{
	mt_rec(s, IOC_MIG_PASS, n, 0, 0, 0);
}

/* The model image's checksum, from zlib: CRC-32 of the big-endian array
 * of block CRCs. */
static inline uint32_t mt_checksum(const struct mt_stream *s)
{
	uLong sum = crc32(0, Z_NULL, 0);

	for (uint64_t off = 0; off < s->image_size; off += s->block_size) {
		uint64_t n = s->image_size - off < s->block_size ? s->image_size - off
								 : s->block_size;
		uint32_t c = (uint32_t)crc32(0, s->model + off, (uInt)n);
		uint8_t be[4] = { (uint8_t)(c >> 24), (uint8_t)(c >> 16),
				  (uint8_t)(c >> 8), (uint8_t)c };

		sum = crc32(sum, be, 4);
	}
	return (uint32_t)sum;
}

static inline void mt_end(struct mt_stream *s, uint32_t sum)
{
	mt_rec(s, IOC_MIG_END, s->image_size, 0, 0, sum);
}

static inline void mt_free(struct mt_stream *s)
{
	free(s->p);
	free(s->model);
	memset(s, 0, sizeof(*s));
}

#endif
