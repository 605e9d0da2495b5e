/*
 * Private to src/zip: the codec layer, independent of scheduling.
 *
 * Everything here works on whole buffers owned by the caller and keeps no
 * global state; a context (cctx/dctx) is used by one thread at a time.
 * Errors are -errno plus, where useful, a static reason string (*why).
 */
#ifndef IOC_ZIP_CODEC_H
#define IOC_ZIP_CODEC_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>
#include <zlib.h>

#include "iocore/zip.h"

#define IOC__ZIP_ZSTD_MAGIC      0xFD2FB528u
#define IOC__ZIP_SKIP_MAGIC      0x184D2A50u   /* low 4 bits free */
#define IOC__ZIP_SKIP_MASK       0xFFFFFFF0u
#define IOC__ZIP_SEEK_SKIP_MAGIC 0x184D2A5Eu
#define IOC__ZIP_SEEKABLE_MAGIC  0x8F92EAB1u
#define IOC__ZIP_SEEK_FOOTER     9u
#define IOC__ZIP_SEEK_MAX_FRAMES 0x8000000u    /* as zstd's seekable code */
#define IOC__ZIP_GZ_HEADER       20u           /* our member header */
#define IOC__ZIP_GZ_TRAILER      8u
#define IOC__ZIP_ZSTD_BLOCK_MAX  (128u << 10)
/* Page checks (codec.c): iocore-zip's skippable frame just before the
 * seek table, a checksum per 4 KiB page of each stored frame. */
#define IOC__ZIP_PCK_SKIP_MAGIC  0x184D2A5Bu
#define IOC__ZIP_PCK_TAG         0x50434F49u   /* "IOCP" */
#define IOC__ZIP_PCK_HEAD        24u           /* skippable header + ours */
#define IOC__ZIP_PAGE            4096u

static inline uint32_t ioc__zip_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline void ioc__zip_put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* ---- compression -------------------------------------------------- */

/* Which deflate implementation a gzip cctx runs (see codec.c's essay). */
enum ioc__zip_deflater {
	IOC__ZIP_D_ZLIB = 1,
	IOC__ZIP_D_LIBDEFLATE,
	IOC__ZIP_D_ISAL,
};

struct ioc__zip_cctx {
	enum ioc_zip_format format;
	int level;                  /* as asked (gzip's XFL says it) */
	int lib_level;              /* what the deflater runs (gzip) */
	bool checksum;
	enum ioc__zip_deflater deflater;
	struct ZSTD_CCtx_s *zc;
	struct libdeflate_compressor *ld;
	struct isal_zstream *iz;    /* igzip: stream state and its level buffer */
	uint8_t *iz_lbuf;
	uint32_t iz_lbuf_size;
	z_stream zs;
	bool zs_ready;
	/* Zero-block cache: the checksum (zstd) or the whole member (gzip)
	 * of the last all-zero block size seen, computed once per size. */
	size_t zero_len;
	uint32_t zero_sum;
	uint8_t *zero_member;
	size_t zero_member_len;
};

int ioc__zip_cctx_init(struct ioc__zip_cctx *c, enum ioc_zip_format format, int level,
		       bool checksum, enum ioc_zip_deflate deflate);
void ioc__zip_cctx_fini(struct ioc__zip_cctx *c);

/* The deflater a gzip cctx at this level would use, or -ENOTSUP. */
int ioc__zip_deflater_for(int level, enum ioc_zip_deflate deflate);

/* The deflater and the level of that library a gzip level runs at: with
 * DEFAULT, the calibration table in codec.c's essay (the fastest setting
 * whose output is no bigger than zlib's at that level); an explicit
 * deflater runs at the level as given (clamped to what it has).  Returns
 * the deflater (enum ioc__zip_deflater) or -ENOTSUP / -EINVAL. */
int ioc__zip_deflate_pick(int level, enum ioc_zip_deflate deflate, int *lib_level);

/* Worst-case output of one block of n bytes. */
size_t ioc__zip_compress_bound(enum ioc_zip_format format, size_t n);

/* Compress one block into one independent frame/member.  Returns its size
 * or -errno.  *sum gets the frame's checksum (XXH64 low 32 bits for zstd
 * when checksums are on, CRC32 for gzip); *zero says the block was all
 * zeros and took the shortcut. */
ssize_t ioc__zip_compress(struct ioc__zip_cctx *c, void *dst, size_t cap,
			  const void *src, size_t n, uint32_t *sum, bool *zero);

bool ioc__zip_all_zero(const void *p, size_t n);

/* The smallest valid zstd frame of n zero bytes: single-segment header
 * with content size, RLE blocks of 128 KiB, the given checksum if
 * with_sum.  Returns its size (cap must be >= ioc__zip_zero_frame_size). */
size_t ioc__zip_zero_frame_size(size_t n, bool with_sum);
size_t ioc__zip_zero_frame(uint8_t *dst, size_t n, bool with_sum, uint32_t sum);

/* ---- seek table --------------------------------------------------- */

struct ioc__zip_seek_entry {
	uint32_t csize, dsize, sum;
};

size_t ioc__zip_seektable_size(size_t n, bool with_sum);
void ioc__zip_seektable_write(uint8_t *dst, const struct ioc__zip_seek_entry *e, size_t n,
			      bool with_sum);
/* Parse the 9-byte footer. */
int ioc__zip_seektable_footer(const uint8_t *foot, uint32_t *nframes, bool *with_sum,
			      const char **why);
/* Parse a whole seek-table skippable frame (buf, len bytes, ending with the
 * footer) describing a file of file_size bytes that it ends.  Fills
 * ix->frames (malloc'd) and totals.  -EBADMSG with *why on any lie. */
int ioc__zip_seektable_parse(const uint8_t *buf, size_t len, uint64_t file_size,
			     struct ioc_zip_index *ix, const char **why);

/* The first of frames[lo, hi) whose data ends after off (hi if none): a
 * binary search on doff + dsize over any array of frames (struct
 * ioc_zip_frame_info, the image's own) in data order.  A macro, so the
 * image's read path keeps it inline whatever the element type. */
#define IOC__ZIP_FRAME_AFTER(frames, lo, hi, off) __extension__({                   \
	size_t lo_ = (lo), hi_ = (hi);                                              \
	uint64_t off_ = (off);                                                      \
	while (lo_ < hi_) {                                                         \
		size_t mid_ = lo_ + (hi_ - lo_) / 2;                                \
		if ((frames)[mid_].doff + (frames)[mid_].dsize <= off_)             \
			lo_ = mid_ + 1;                                             \
		else                                                                \
			hi_ = mid_;                                                 \
	}                                                                           \
	lo_;                                                                        \
})

/* ---- frame scanning ----------------------------------------------- */

enum ioc__zip_kind {
	IOC__ZIP_K_ZSTD = 1,
	IOC__ZIP_K_SKIP,
	IOC__ZIP_K_GZIP,
};

struct ioc__zip_frame {
	enum ioc__zip_kind kind;
	bool hdr_done;      /* header parsed: kind, dsize, sized known */
	bool sized;         /* csize can be found without decoding */
	bool has_sum;
	uint32_t skip_magic;
	uint64_t dsize;     /* content size; UINT64_MAX when unknown */
	uint64_t csize;     /* whole frame, valid when scan returned 1 */
	uint64_t pos;       /* scan progress (private) */
	unsigned hdr_len;
};

/* Delimit the frame that starts at p, with avail bytes buffered from its
 * start (call again with more as they arrive; f keeps the progress; zero
 * it before the first call).  Returns 1 when f->csize is known and
 * <= avail, 0 when more bytes are needed (f->hdr_done tells whether the
 * header is parsed; when !f->sized the frame can only be decoded
 * streaming), or -EBADMSG with *why. */
int ioc__zip_scan(struct ioc__zip_frame *f, const uint8_t *p, size_t avail, const char **why);

/* ---- decompression ------------------------------------------------ */

struct ioc__zip_dctx {
	struct ZSTD_DCtx_s *zd;
	struct libdeflate_decompressor *ld;
	z_stream zs;
	bool zs_ready;
	bool use_zlib;
	unsigned window_log_max;
	/* streaming state */
	enum ioc__zip_kind skind;
	bool streaming;
};

int ioc__zip_dctx_init(struct ioc__zip_dctx *d, unsigned window_log_max,
		       enum ioc_zip_deflate deflate);
void ioc__zip_dctx_fini(struct ioc__zip_dctx *d);

/* Decode one whole delimited frame of kind k (csize bytes) whose content
 * is exactly dsize bytes into dst.  Returns 0 or -EBADMSG with *why. */
int ioc__zip_decompress(struct ioc__zip_dctx *d, enum ioc__zip_kind k, void *dst,
			size_t dsize, const void *src, size_t csize, const char **why);

/* Streaming decode of one frame that cannot be decoded in memory.
 * Begin with ioc__zip_stream_begin; then each call consumes input and
 * produces output; returns 1 when the frame ended (rest of the input
 * untouched), 0 when it needs more input or output room, -EBADMSG. */
int ioc__zip_stream_begin(struct ioc__zip_dctx *d, enum ioc__zip_kind k, const char **why);
int ioc__zip_stream(struct ioc__zip_dctx *d, const uint8_t *in, size_t inlen, size_t *used,
		    uint8_t *out, size_t outcap, size_t *produced, const char **why);

/* ---- page checks of stored frames ----------------------------------- */

/* A stored frame is zstd's answer to data it cannot shrink: the frame
 * header, one raw block and the checksum.  True if frame (csize bytes,
 * dsize of data, checksum flag set) is one, from its bytes. */
bool ioc__zip_is_stored(const uint8_t *frame, size_t csize, size_t dsize);

/* Pages of a stored frame of dsize bytes (0 above IOC__ZIP_ZSTD_BLOCK_MAX:
 * such frames get no checks). */
static inline unsigned ioc__zip_pck_pages(size_t dsize)
{
	return dsize && dsize <= IOC__ZIP_ZSTD_BLOCK_MAX ?
	       (unsigned)((dsize + IOC__ZIP_PAGE - 1) / IOC__ZIP_PAGE) : 0;
}

/* The check of one page (at most IOC__ZIP_PAGE bytes): XXH64's low 32
 * bits, as a zstd frame's own checksum.  Needs IOC_HAVE_XXHASH. */
uint32_t ioc__zip_page_check(const void *p, size_t len);

/* The page-check frame for nframes frames: size, and writing it from a
 * bitmap of stored frames (bit i of map[i / 8]) and their checks. */
size_t ioc__zip_pck_size(size_t nframes, size_t nchecks);
void ioc__zip_pck_write(uint8_t *dst, size_t nframes, const uint8_t *map,
			const uint32_t *checks, size_t nchecks);

/* Checks the head (IOC__ZIP_PCK_HEAD bytes) of what should be a page-check
 * frame of len bytes in all describing nframes frames; on success sets
 * *nchecks.  -EBADMSG otherwise (*why says why). */
int ioc__zip_pck_head(const uint8_t *head, uint64_t len, size_t nframes, size_t *nchecks,
		      const char **why);

/* pipeline.c: offsets in a decompressor's messages start at off (used by
 * range extraction, which feeds it from the middle of a file). */
void ioc__zip_set_base(struct ioc_zip *z, uint64_t off);

/* index.c, shared with image.c: format a message into msg (when given)
 * and return err; read exactly len bytes at off, or fill n iovecs (which
 * it advances) from off (-ENODATA at EOF). */
int ioc__zip_say(char *msg, size_t msglen, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int ioc__zip_pread_all(int fd, void *buf, size_t len, uint64_t off);
struct iovec;
int ioc__zip_preadv_all(int fd, struct iovec *iov, int n, uint64_t off);

#endif /* IOC_ZIP_CODEC_H */
