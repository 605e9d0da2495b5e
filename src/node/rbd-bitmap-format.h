/*
 * The object that holds an rbd image's persistent dirty bitmaps
 * (rbd-bitmap.c says why one object and how it is kept): its layout, its
 * builder and its parser.  Builds without librbd, for the fuzz target.
 *
 * Layout, little-endian:
 *   0  magic "IOCRBDBM"         8  version (1), u32     12  count, u32
 *   16 image size the bits cover, u64
 *   24 count entries:  name_len u32, flags u32 (RBM_IN_USE, RBM_AUTO),
 *      granularity u64, nbytes u64 (the bit array's length: 0 while in
 *      use, else the granules rounded up to whole 64-bit words),
 *      the name (no NUL) padded with zeroes to 8 bytes, the bit array
 *      (bit i of byte j is granule 8j + i, ioc_blk_dirty_export()'s order)
 *   end-4  crc32 (zlib's) of everything before it, u32
 */
#ifndef IOC_NODE_RBD_BITMAP_FORMAT_H
#define IOC_NODE_RBD_BITMAP_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define RBM_MAGIC "IOCRBDBM"
#define RBM_VERSION 1u
#define RBM_HDR_LEN 24u
#define RBM_ENT_LEN 24u
#define RBM_CRC_LEN 4u
#define RBM_IN_USE 1u                /* open for writing, or not written back */
#define RBM_AUTO 2u                  /* recording */
#define RBM_FLAGS_KNOWN (RBM_IN_USE | RBM_AUTO)

/* One bitmap of a parsed object; name and bits point into its buffer. */
struct rbm_entry {
	const char *name;            /* not NUL-terminated */
	uint32_t name_len;
	uint32_t flags;
	uint64_t granularity;
	uint64_t nbytes;
	const uint8_t *bits;         /* NULL when nbytes is 0 */
};

/* Bytes of the bit array of a bitmap of gran over size bytes, 0 when it
 * does not fit a size_t (the builder refuses such a bitmap). */
uint64_t ioc__rbm_bits_len(uint64_t size, uint64_t gran);
/* Bytes an entry takes in the object (header, padded name, bits). */
uint64_t ioc__rbm_entry_len(uint32_t name_len, uint64_t nbytes);

/*
 * Check buf (len bytes, all of the object) and describe its bitmaps:
 * *out gets a calloc'ed array of *count entries (free() it), *size the
 * image size the bits cover.  -EINVAL (bad magic, crc, length, flags,
 * granularity, duplicate or empty name) or -ENOTSUP (a later version),
 * with the reason in err; never reads outside buf.
 */
int ioc__rbm_parse(const uint8_t *buf, size_t len, struct rbm_entry **out, uint32_t *count,
		   uint64_t *size, char *err, size_t errlen);

/* Writing: ioc__rbm_begin() lays down the header into buf (at least
 * RBM_HDR_LEN bytes), each ioc__rbm_put() an entry at *pos (the caller
 * sized buf with ioc__rbm_entry_len()) and returns where its bits go,
 * ioc__rbm_finish() the count and the crc; returns the object's length. */
void ioc__rbm_begin(uint8_t *buf, uint64_t size, size_t *pos);
uint8_t *ioc__rbm_put(uint8_t *buf, size_t *pos, const char *name, uint32_t flags,
		      uint64_t gran, uint64_t nbytes);
size_t ioc__rbm_finish(uint8_t *buf, size_t pos, uint32_t count);

#endif
