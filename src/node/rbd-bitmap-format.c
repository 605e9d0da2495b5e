/*
 * The rbd bitmap object's builder and parser (the layout is in
 * rbd-bitmap-format.h).  The object comes from the cluster, which any
 * client of the pool may write: it is outside input.  The parser checks
 * the crc first (a torn or foreign object is refused whole), then every
 * length against what is left before it is used, so a garbled object
 * gives a reason and never a read past the buffer; the fuzz target
 * (tests/rbd/fuzz-rbd-bitmap.c) holds it to that.  What the parser does
 * not know, it does not judge: names and granularities the block layer
 * refuses are refused at load, with the block layer's limits, so the
 * format carries no limit of today's block layer.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "node/rbd-bitmap-format.h"
#include "util/endian.h"

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)





/* zlib's crc32 takes a uInt length: feed it in pieces. */
static uint32_t crc_of(const uint8_t *p, size_t len)
{
	uLong c = crc32(0, Z_NULL, 0);

	while (len) {
		uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;

		c = crc32(c, p, n);
		p += n;
		len -= n;
	}
	return (uint32_t)c;
}

uint64_t ioc__rbm_bits_len(uint64_t size, uint64_t gran)
{
	uint64_t granules, words;

	if (gran == 0)
		return 0;
	granules = size / gran + (size % gran != 0);
	words = granules / 64 + (granules % 64 != 0);
	if (words > SIZE_MAX / 8 / 2)
		return 0;
	return words * 8;
}

uint64_t ioc__rbm_entry_len(uint32_t name_len, uint64_t nbytes)
{
	return RBM_ENT_LEN + (((uint64_t)name_len + 7) & ~7ull) + nbytes;
}

int ioc__rbm_parse(const uint8_t *buf, size_t len, struct rbm_entry **out, uint32_t *count,
		   uint64_t *size, char *err, size_t errlen)
{
	struct rbm_entry *e = NULL;
	uint32_t n, version;
	size_t pos, end;

	*out = NULL;
	*count = 0;
	if (len < RBM_HDR_LEN + RBM_CRC_LEN || memcmp(buf, RBM_MAGIC, 8) != 0) {
		ERR("not a bitmap object (%zu bytes, no magic)", len);
		return -EINVAL;
	}
	version = ioc__get_le32(buf + 8);
	if (version != RBM_VERSION) {
		ERR("bitmap object version %" PRIu32 " is not supported (only %u)", version,
		    RBM_VERSION);
		return -ENOTSUP;
	}
	end = len - RBM_CRC_LEN;
	if (ioc__get_le32(buf + end) != crc_of(buf, end)) {
		ERR("bitmap object checksum mismatch (torn or overwritten)");
		return -EINVAL;
	}
	n = ioc__get_le32(buf + 12);
	*size = ioc__get_le64(buf + 16);
	pos = RBM_HDR_LEN;
	/* Each entry takes RBM_ENT_LEN bytes at least: a count that cannot
	 * fit is refused before anything is allocated for it. */
	if (n > (end - pos) / RBM_ENT_LEN) {
		ERR("bitmap object: %" PRIu32 " bitmaps do not fit in %zu bytes", n, len);
		return -EINVAL;
	}
	e = calloc(n ? n : 1, sizeof(*e));
	if (!e) {
		ERR("%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct rbm_entry *x = &e[i];
		uint64_t padded, want;

		if (end - pos < RBM_ENT_LEN) {
			ERR("bitmap object: entry %" PRIu32 " is truncated", i);
			goto bad;
		}
		x->name_len = ioc__get_le32(buf + pos);
		x->flags = ioc__get_le32(buf + pos + 4);
		x->granularity = ioc__get_le64(buf + pos + 8);
		x->nbytes = ioc__get_le64(buf + pos + 16);
		pos += RBM_ENT_LEN;
		padded = ((uint64_t)x->name_len + 7) & ~7ull;
		if (x->name_len == 0 || padded > end - pos) {
			ERR("bitmap object: entry %" PRIu32 ": name length %" PRIu32
			    " invalid", i, x->name_len);
			goto bad;
		}
		x->name = (const char *)buf + pos;
		pos += (size_t)padded;
		if (memchr(x->name, 0, x->name_len)) {
			ERR("bitmap object: entry %" PRIu32 ": name contains a NUL", i);
			goto bad;
		}
		if (x->flags & ~RBM_FLAGS_KNOWN) {
			ERR("bitmap object: bitmap '%.*s': unknown flags %#" PRIx32,
			    (int)(x->name_len > 64 ? 64 : x->name_len), x->name, x->flags);
			goto bad;
		}
		if (x->granularity == 0 || (x->granularity & (x->granularity - 1))) {
			ERR("bitmap object: bitmap '%.*s': granularity %" PRIu64
			    " is not a power of two",
			    (int)(x->name_len > 64 ? 64 : x->name_len), x->name, x->granularity);
			goto bad;
		}
		want = (x->flags & RBM_IN_USE) ? 0 : ioc__rbm_bits_len(*size, x->granularity);
		if (x->nbytes != want || (!(x->flags & RBM_IN_USE) && want == 0 && *size) ||
		    x->nbytes > end - pos) {
			ERR("bitmap object: bitmap '%.*s': %" PRIu64 " bytes of bits, expected %"
			    PRIu64 " (of %zu left)",
			    (int)(x->name_len > 64 ? 64 : x->name_len), x->name, x->nbytes,
			    want, end - pos);
			goto bad;
		}
		x->bits = x->nbytes ? buf + pos : NULL;
		pos += (size_t)x->nbytes;
		for (uint32_t j = 0; j < i; j++) {
			if (e[j].name_len == x->name_len &&
			    !memcmp(e[j].name, x->name, x->name_len)) {
				ERR("bitmap object: bitmap '%.*s' appears twice",
				    (int)(x->name_len > 64 ? 64 : x->name_len), x->name);
				goto bad;
			}
		}
	}
	if (pos != end) {
		ERR("bitmap object: %zu bytes after the last bitmap", end - pos);
		goto bad;
	}
	*out = e;
	*count = n;
	return 0;
bad:
	free(e);
	return -EINVAL;
}

void ioc__rbm_begin(uint8_t *buf, uint64_t size, size_t *pos)
{
	memcpy(buf, RBM_MAGIC, 8);
	ioc__put_le32(buf + 8, RBM_VERSION);
	ioc__put_le32(buf + 12, 0);
	ioc__put_le64(buf + 16, size);
	*pos = RBM_HDR_LEN;
}

uint8_t *ioc__rbm_put(uint8_t *buf, size_t *pos, const char *name, uint32_t flags,
		      uint64_t gran, uint64_t nbytes)
{
	size_t nl = strlen(name), padded = (nl + 7) & ~(size_t)7;
	uint8_t *p = buf + *pos;

	ioc__put_le32(p, (uint32_t)nl);
	ioc__put_le32(p + 4, flags);
	ioc__put_le64(p + 8, gran);
	ioc__put_le64(p + 16, nbytes);
	memset(p + RBM_ENT_LEN, 0, padded);
	memcpy(p + RBM_ENT_LEN, name, nl);
	*pos += RBM_ENT_LEN + padded + nbytes;
	return p + RBM_ENT_LEN + padded;
}

size_t ioc__rbm_finish(uint8_t *buf, size_t pos, uint32_t count)
{
	ioc__put_le32(buf + 12, count);
	ioc__put_le32(buf + pos, crc_of(buf, pos));
	return pos + RBM_CRC_LEN;
}
