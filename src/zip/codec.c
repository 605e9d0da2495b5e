/*
 * zip codec layer: one block in, one independent frame out, and back.
 * Problem: the pipeline (pipeline.c) hands a worker a block and wants back
 * bytes stock tools read, sharing no state between workers; the decoder must
 * split hostile input into frames trusting nothing it says.  Design:
 *  - zstd: each block is a whole frame from ZSTD_compress2() on a reused
 *    per-worker ZSTD_CCtx (making one costs more than compressing a small
 *    block), with content size and checksum so a decoder can size its buffer
 *    and verify.  The seek table is zstd's seekable format: a skippable frame
 *    of each frame's sizes and checksum, with a footer magic (0x8F92EAB1) to
 *    find it from the end.
 *  - gzip: each block is a member.  Members carry no length (finding the next
 *    means inflating), so ours put the compressed size in an FEXTRA subfield
 *    ('I','Z', 4 bytes), which gzip and pigz skip, as samtools' BGZF does.
 *  - A gzip level is a promise about size: gzip -N and pigz -N are zlib -N,
 *    so ours is no bigger, then as fast as possible.  Level N runs the
 *    fastest deflater setting that keeps that on the calibration corpora
 *    (ioc__zip_deflate_pick(), ld_level_for[]): ISA-L's igzip for 1-3 when
 *    built in, else (and above 3) libdeflate's calibrated level, zlib if
 *    neither is built.  CRC32 comes from the library that deflated the block
 *    (gz_crc()).  Inflate is libdeflate's, which beat igzip's on our members.
 *  - All-zero blocks (a memory image's zero pages; one memcmp pass finds
 *    them, and data blocks usually leave it at their first bytes) skip the
 *    compressor.  zstd gets a hand-built frame of RLE blocks; libzstd does
 *    not export XXH64, so rather than carry a second one the first zero block
 *    of each size is compressed once and its checksum kept.  gzip copies the
 *    kept member of the last zero-block size.
 *  - The scanner walks zstd block headers (3 bytes each) to a frame's end,
 *    incrementally as bytes arrive, without decoding; the frame header alone
 *    picks in-memory decoding (content size known, small) or streaming.
 *
 * Rejected (numbers, calibration: bench/zip/NOTES.md): libdeflate's level N
 * for gzip -N (its levels are not zlib's: slower than needed at 6-9, too big
 * at 4); libdeflate at 1-3 (much slower than igzip, whose output stays near
 * pigz's; on ELF binaries igzip 2 and 3 run bigger than zlib, and
 * IOC_ZIP_DEFLATE_LIBDEFLATE or -4 meet the size); hand-built stored deflate
 * blocks for zero members (bigger than libdeflate's, CRC work anyway);
 * libzstd's seekable contrib code (not packaged in Debian); trusting a
 * content size for allocation (bounded by max_frame).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "ioc-config.h"
#if IOC_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif
#if IOC_HAVE_ISAL
#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#endif
#if IOC_HAVE_XXHASH
#include <xxhash.h>
#endif

#include "codec.h"

bool ioc__zip_all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	size_t head = n < 64 ? n : 64;

	for (size_t i = 0; i < head; i++)
		if (b[i])
			return false;
	if (n <= 64)
		return true;
	/* The first 64 bytes are zero, so the block is zero iff every byte
	 * equals the one 64 bytes before it (overlapping memcmp is fine, it
	 * only reads). */
	return memcmp(b, b + 64, n - 64) == 0;
}

/* ---- zero frames -------------------------------------------------- */

static unsigned fcs_flag_for(uint64_t n)
{
	if (n < 256)
		return 0;
	if (n < 65536 + 256)
		return 1;
	if (n <= UINT32_MAX)
		return 2;
	return 3;
}

size_t ioc__zip_zero_frame_size(size_t n, bool with_sum)
{
	static const unsigned fcs_len[4] = { 1, 2, 4, 8 };
	size_t blocks = n ? (n + IOC__ZIP_ZSTD_BLOCK_MAX - 1) / IOC__ZIP_ZSTD_BLOCK_MAX : 1;

	return 4 + 1 + fcs_len[fcs_flag_for(n)] + blocks * 4 + (with_sum ? 4 : 0);
}

size_t ioc__zip_zero_frame(uint8_t *dst, size_t n, bool with_sum, uint32_t sum)
{
	unsigned flag = fcs_flag_for(n);
	uint8_t *p = dst;
	size_t left = n;

	ioc__zip_put_le32(p, IOC__ZIP_ZSTD_MAGIC);
	p += 4;
	/* Frame_Header_Descriptor: FCS flag, Single_Segment, Checksum. */
	*p++ = (uint8_t)(flag << 6 | 1u << 5 | (with_sum ? 1u << 2 : 0));
	switch (flag) {
	case 0:
		*p++ = (uint8_t)n;
		break;
	case 1:
		p[0] = (uint8_t)(n - 256);
		p[1] = (uint8_t)((n - 256) >> 8);
		p += 2;
		break;
	case 2:
		ioc__zip_put_le32(p, (uint32_t)n);
		p += 4;
		break;
	default:
		ioc__zip_put_le32(p, (uint32_t)n);
		ioc__zip_put_le32(p + 4, (uint32_t)((uint64_t)n >> 32));
		p += 8;
		break;
	}
	do {
		size_t b = left < IOC__ZIP_ZSTD_BLOCK_MAX ? left : IOC__ZIP_ZSTD_BLOCK_MAX;
		uint32_t last = left == b;
		/* Block header: Last_Block, Block_Type 1 (RLE), size = count. */
		uint32_t h = last | 1u << 1 | (uint32_t)b << 3;

		p[0] = (uint8_t)h;
		p[1] = (uint8_t)(h >> 8);
		p[2] = (uint8_t)(h >> 16);
		p[3] = 0;               /* the repeated byte */
		p += 4;
		left -= b;
	} while (left);
	if (with_sum) {
		ioc__zip_put_le32(p, sum);
		p += 4;
	}
	return (size_t)(p - dst);
}

/* ---- compression -------------------------------------------------- */

#if IOC_HAVE_ISAL
/* igzip's level buffer (hash tables and token space), its "default" size
 * per level: 0 for level 0, some 280-340 KiB for 1-3. */
static const uint32_t isal_lbuf_size[ISAL_DEF_MAX_LEVEL + 1] = {
	ISAL_DEF_LVL0_DEFAULT, ISAL_DEF_LVL1_DEFAULT, ISAL_DEF_LVL2_DEFAULT,
	ISAL_DEF_LVL3_DEFAULT,
};
#endif

/* libdeflate's level for each gzip level 0-12 under DEFAULT, from the
 * calibration in bench/zip/NOTES.md.  Levels 10-12 have no zlib counterpart (zlib stops at
 * 9) and stay libdeflate's own. */
static const int8_t ld_level_for[13] = {
	[1] = 1, [2] = 1, [3] = 2, [4] = 4, [5] = 5, [6] = 5,
	[7] = 6, [8] = 6, [9] = 6, [10] = 10, [11] = 11, [12] = 12,
};

int ioc__zip_deflate_pick(int level, enum ioc_zip_deflate deflate, int *lib_level)
{
	int d = -EINVAL;

	if (level < 1)
		level = 6;
	switch (deflate) {
	case IOC_ZIP_DEFLATE_DEFAULT:
		if (IOC_HAVE_ISAL && level <= 3) {
			/* igzip 1-3 as they are (the opening comment). */
			*lib_level = level;
			return IOC__ZIP_D_ISAL;
		}
		if (!IOC_HAVE_LIBDEFLATE)
			break;          /* zlib is the reference: as asked */
		*lib_level = ld_level_for[level > 12 ? 12 : level];
		return IOC__ZIP_D_LIBDEFLATE;
	case IOC_ZIP_DEFLATE_LIBDEFLATE:
		d = IOC_HAVE_LIBDEFLATE ? IOC__ZIP_D_LIBDEFLATE : -ENOTSUP;
		break;
	case IOC_ZIP_DEFLATE_ISAL:
		d = IOC_HAVE_ISAL ? IOC__ZIP_D_ISAL : -ENOTSUP;
		break;
	case IOC_ZIP_DEFLATE_ZLIB:
		break;
	default:
		return -EINVAL;
	}
	if (deflate == IOC_ZIP_DEFLATE_DEFAULT || deflate == IOC_ZIP_DEFLATE_ZLIB)
		d = IOC__ZIP_D_ZLIB;
	if (d < 0)
		return d;
	switch (d) {
	case IOC__ZIP_D_ZLIB:
		*lib_level = level > 9 ? 9 : level;
		break;
	case IOC__ZIP_D_LIBDEFLATE:
		*lib_level = level > 12 ? 12 : level;
		break;
	default:
		*lib_level = level;
#if IOC_HAVE_ISAL
		if (level > ISAL_DEF_MAX_LEVEL)
			*lib_level = ISAL_DEF_MAX_LEVEL;
#endif
		break;
	}
	return d;
}

int ioc__zip_deflater_for(int level, enum ioc_zip_deflate deflate)
{
	int lib_level;

	return ioc__zip_deflate_pick(level, deflate, &lib_level);
}

int ioc__zip_cctx_init(struct ioc__zip_cctx *c, enum ioc_zip_format format, int level,
		       bool checksum, enum ioc_zip_deflate deflate)
{
	int r;

	memset(c, 0, sizeof(*c));
	c->format = format;
	c->checksum = checksum;
	if (format == IOC_ZIP_ZSTD) {
		if (level <= 0)
			level = 3;
		if (level > ZSTD_maxCLevel())
			level = ZSTD_maxCLevel();
		c->level = level;
		c->zc = ZSTD_createCCtx();
		if (!c->zc)
			return -ENOMEM;
		if (ZSTD_isError(ZSTD_CCtx_setParameter(c->zc, ZSTD_c_compressionLevel, level)) ||
		    ZSTD_isError(ZSTD_CCtx_setParameter(c->zc, ZSTD_c_checksumFlag, checksum)) ||
		    ZSTD_isError(ZSTD_CCtx_setParameter(c->zc, ZSTD_c_contentSizeFlag, 1))) {
			ioc__zip_cctx_fini(c);
			return -EINVAL;
		}
		return 0;
	}
	if (format != IOC_ZIP_GZIP)
		return -EINVAL;
	if (level <= 0)
		level = 6;
	r = ioc__zip_deflate_pick(level, deflate, &c->lib_level);
	if (r < 0)
		return r;
	c->level = level;
	c->deflater = (enum ioc__zip_deflater)r;
	switch (c->deflater) {
	case IOC__ZIP_D_ZLIB:
		if (deflateInit2(&c->zs, c->lib_level, Z_DEFLATED, -15, 8,
				 Z_DEFAULT_STRATEGY) != Z_OK)
			return -ENOMEM;
		c->zs_ready = true;
		return 0;
	case IOC__ZIP_D_LIBDEFLATE:
#if IOC_HAVE_LIBDEFLATE
		c->ld = libdeflate_alloc_compressor(c->lib_level);
		if (!c->ld)
			return -ENOMEM;
#endif
		return 0;
	case IOC__ZIP_D_ISAL:
#if IOC_HAVE_ISAL
		c->iz_lbuf_size = isal_lbuf_size[c->lib_level];
		c->iz = malloc(sizeof(*c->iz));
		/* Zeroed, so nothing igzip reads before writing comes from
		 * the allocator.  igzip's output still does not repeat byte
		 * for byte from run to run (zip.h), and the cause is in ISA-L
		 * 2.30: with everything it is given identical -- zeroed
		 * stream, zeroed level buffer, the same input, output room
		 * and prior output bytes -- a block compressed with the
		 * isal_zstream at another address can come out a few bytes
		 * different (measured outside iocore: the stream moved to 63
		 * places across 4 GiB, 16 KiB blocks of a /usr tar: 1-2 of
		 * 381 blocks differed at 2-3 of the places; moving the input,
		 * the output or the level buffer alone changed nothing, nor
		 * did garbage in the stream, the level buffer, the stack or
		 * the vector registers, nor other threads running meanwhile).
		 * malloc puts the stream somewhere else on each run (and in
		 * each worker), so ~1 gzip -1 member in 10^4 differs between
		 * runs; always valid, always decoding to the same data. */
		c->iz_lbuf = calloc(1, c->iz_lbuf_size);
		if (!c->iz || !c->iz_lbuf) {
			ioc__zip_cctx_fini(c);
			return -ENOMEM;
		}
#endif
		return 0;
	}
	return -EINVAL;
}

void ioc__zip_cctx_fini(struct ioc__zip_cctx *c)
{
	ZSTD_freeCCtx(c->zc);
#if IOC_HAVE_LIBDEFLATE
	if (c->ld)
		libdeflate_free_compressor(c->ld);
#endif
	if (c->zs_ready)
		deflateEnd(&c->zs);
	free(c->iz);
	free(c->iz_lbuf);
	free(c->zero_member);
	memset(c, 0, sizeof(*c));
}

size_t ioc__zip_compress_bound(enum ioc_zip_format format, size_t n)
{
	if (format == IOC_ZIP_ZSTD)
		return ZSTD_compressBound(n);
	/* Incompressible input falls back to stored blocks: libdeflate and
	 * igzip cut them at 64 KiB (5 bytes each), zlib with memLevel 8 at
	 * its 16 KiB literal buffer (deflateBound's n/4096 + n/16384 + n/2^25
	 * + 13; test_gzip_incompressible overflowed the 64 KiB-only bound
	 * with zlib).  Take the larger, plus header and trailer. */
	return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + (n / 65535 + 1) * 5 + 64 +
	       IOC__ZIP_GZ_HEADER + IOC__ZIP_GZ_TRAILER;
}

static ssize_t zstd_block(struct ioc__zip_cctx *c, uint8_t *dst, size_t cap,
			  const void *src, size_t n, uint32_t *sum)
{
	size_t r = ZSTD_compress2(c->zc, dst, cap, src, n);

	if (ZSTD_isError(r))
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -ENOSPC : -EIO;
	*sum = c->checksum ? ioc__zip_le32(dst + r - 4) : 0;
	return (ssize_t)r;
}

/* CRC32 of a whole block, by the library that just deflated it.  Mixing
 * them costs: ISA-L's CRC (AVX-512 folding, ~26 GB/s alone against
 * libdeflate's ~14 GB/s) made the next libdeflate -6 block slower, 245
 * vs 256 MB/s per core on the memory image (usr 94 vs 96), while after
 * igzip it is the faster one (memory image -1: 1821 vs 1657 MB/s, -3:
 * 492 vs 447; usr -1 706 vs 677).  Measured through ioc__zip_compress()
 * on one thread, 1 MiB blocks, 200 MB corpora. */
static uint32_t gz_crc(const struct ioc__zip_cctx *c, const void *src, size_t n)
{
#if IOC_HAVE_ISAL
	if (c->deflater == IOC__ZIP_D_ISAL)
		return crc32_gzip_refl(0, src, n);
#endif
#if IOC_HAVE_LIBDEFLATE
	if (c->deflater == IOC__ZIP_D_LIBDEFLATE)
		return libdeflate_crc32(0, src, n);
#endif
	return (uint32_t)crc32(crc32(0, NULL, 0), src, (uInt)n);
}

static ssize_t gzip_member(struct ioc__zip_cctx *c, uint8_t *dst, size_t cap,
			   const void *src, size_t n, uint32_t *sum)
{
	size_t body_cap, body;
	uint32_t crc, total;

	if (cap < IOC__ZIP_GZ_HEADER + IOC__ZIP_GZ_TRAILER)
		return -ENOSPC;
	body_cap = cap - IOC__ZIP_GZ_HEADER - IOC__ZIP_GZ_TRAILER;
	switch (c->deflater) {
	case IOC__ZIP_D_ZLIB:
		if (deflateReset(&c->zs) != Z_OK)
			return -EIO;
		c->zs.next_in = (Bytef *)(uintptr_t)src;
		c->zs.avail_in = (uInt)n;
		c->zs.next_out = dst + IOC__ZIP_GZ_HEADER;
		c->zs.avail_out = (uInt)body_cap;
		if (deflate(&c->zs, Z_FINISH) != Z_STREAM_END)
			return -ENOSPC;
		body = body_cap - c->zs.avail_out;
		crc = gz_crc(c, src, n);
		break;
	case IOC__ZIP_D_LIBDEFLATE:
#if IOC_HAVE_LIBDEFLATE
		body = libdeflate_deflate_compress(c->ld, src, n, dst + IOC__ZIP_GZ_HEADER, body_cap);
		if (!body)
			return -ENOSPC;
		crc = gz_crc(c, src, n);
		break;
#else
		return -ENOTSUP;
#endif
	case IOC__ZIP_D_ISAL:
#if IOC_HAVE_ISAL
		/* Stateless: the whole block in one call, raw deflate (we
		 * write our own header), no history kept between members. */
		isal_deflate_stateless_init(c->iz);
		c->iz->level = (uint32_t)c->lib_level;
		c->iz->level_buf = c->iz_lbuf;
		c->iz->level_buf_size = c->iz_lbuf_size;
		c->iz->gzip_flag = IGZIP_DEFLATE;
		c->iz->flush = NO_FLUSH;
		c->iz->end_of_stream = 1;
		c->iz->next_in = (uint8_t *)(uintptr_t)src;
		c->iz->avail_in = (uint32_t)n;
		c->iz->next_out = dst + IOC__ZIP_GZ_HEADER;
		c->iz->avail_out = (uint32_t)(body_cap > UINT32_MAX ? UINT32_MAX : body_cap);
		switch (isal_deflate_stateless(c->iz)) {
		case COMP_OK:
			break;
		case STATELESS_OVERFLOW:
			return -ENOSPC;
		default:
			return -EIO;
		}
		body = c->iz->total_out;
		crc = gz_crc(c, src, n);
		break;
#else
		return -ENOTSUP;
#endif
	default:
		return -EINVAL;
	}
	total = (uint32_t)(IOC__ZIP_GZ_HEADER + body + IOC__ZIP_GZ_TRAILER);
	/* Header: ID1 ID2 CM=deflate FLG=FEXTRA, MTIME 0, XFL, OS=Unix,
	 * XLEN=8, subfield 'I' 'Z' LEN=4 <member size>. */
	dst[0] = 0x1f;
	dst[1] = 0x8b;
	dst[2] = 8;
	dst[3] = 4;
	memset(dst + 4, 0, 4);
	dst[8] = c->level >= 9 ? 2 : c->level == 1 ? 4 : 0;
	dst[9] = 3;
	dst[10] = 8;
	dst[11] = 0;
	dst[12] = 'I';
	dst[13] = 'Z';
	dst[14] = 4;
	dst[15] = 0;
	ioc__zip_put_le32(dst + 16, total);
	ioc__zip_put_le32(dst + IOC__ZIP_GZ_HEADER + body, crc);
	ioc__zip_put_le32(dst + IOC__ZIP_GZ_HEADER + body + 4, (uint32_t)n);
	*sum = crc;
	return total;
}

ssize_t ioc__zip_compress(struct ioc__zip_cctx *c, void *dst, size_t cap,
			  const void *src, size_t n, uint32_t *sum, bool *zero)
{
	ssize_t r;

	*zero = false;
	*sum = 0;
	if (n == 0 || !ioc__zip_all_zero(src, n)) {
		if (c->format == IOC_ZIP_ZSTD)
			return zstd_block(c, dst, cap, src, n, sum);
		return gzip_member(c, dst, cap, src, n, sum);
	}
	*zero = true;
	if (c->format == IOC_ZIP_ZSTD) {
		if (c->checksum && c->zero_len != n) {
			/* First zero block of this size: learn XXH64(zeros)
			 * from the compressor once (see the essay above). */
			r = zstd_block(c, dst, cap, src, n, sum);
			if (r < 0)
				return r;
			c->zero_len = n;
			c->zero_sum = *sum;
		}
		if (cap < ioc__zip_zero_frame_size(n, c->checksum))
			return -ENOSPC;
		*sum = c->checksum ? c->zero_sum : 0;
		return (ssize_t)ioc__zip_zero_frame(dst, n, c->checksum, *sum);
	}
	if (c->zero_len != n || !c->zero_member) {
		r = gzip_member(c, dst, cap, src, n, sum);
		if (r < 0)
			return r;
		free(c->zero_member);
		c->zero_member = malloc((size_t)r);
		c->zero_len = 0;
		if (!c->zero_member)
			return r;      /* still a valid member, just not cached */
		memcpy(c->zero_member, dst, (size_t)r);
		c->zero_member_len = (size_t)r;
		c->zero_len = n;
		c->zero_sum = *sum;
		return r;
	}
	if (cap < c->zero_member_len)
		return -ENOSPC;
	memcpy(dst, c->zero_member, c->zero_member_len);
	*sum = c->zero_sum;
	return (ssize_t)c->zero_member_len;
}

/* ---- seek table --------------------------------------------------- */

size_t ioc__zip_seektable_size(size_t n, bool with_sum)
{
	return 8 + n * (with_sum ? 12 : 8) + IOC__ZIP_SEEK_FOOTER;
}

void ioc__zip_seektable_write(uint8_t *dst, const struct ioc__zip_seek_entry *e, size_t n,
			      bool with_sum)
{
	size_t total = ioc__zip_seektable_size(n, with_sum);
	uint8_t *p = dst;

	ioc__zip_put_le32(p, IOC__ZIP_SEEK_SKIP_MAGIC);
	ioc__zip_put_le32(p + 4, (uint32_t)(total - 8));
	p += 8;
	for (size_t i = 0; i < n; i++) {
		ioc__zip_put_le32(p, e[i].csize);
		ioc__zip_put_le32(p + 4, e[i].dsize);
		p += 8;
		if (with_sum) {
			ioc__zip_put_le32(p, e[i].sum);
			p += 4;
		}
	}
	ioc__zip_put_le32(p, (uint32_t)n);
	p[4] = with_sum ? 0x80 : 0;
	ioc__zip_put_le32(p + 5, IOC__ZIP_SEEKABLE_MAGIC);
}

int ioc__zip_seektable_footer(const uint8_t *foot, uint32_t *nframes, bool *with_sum,
			      const char **why)
{
	if (ioc__zip_le32(foot + 5) != IOC__ZIP_SEEKABLE_MAGIC) {
		*why = "no seekable magic in the footer";
		return -ENOENT;
	}
	if (foot[4] & 0x7c) {
		*why = "seek table descriptor has reserved bits set";
		return -EBADMSG;
	}
	*nframes = ioc__zip_le32(foot);
	*with_sum = foot[4] & 0x80;
	if (*nframes > IOC__ZIP_SEEK_MAX_FRAMES) {
		*why = "seek table claims too many frames";
		return -EBADMSG;
	}
	return 0;
}

int ioc__zip_seektable_parse(const uint8_t *buf, size_t len, uint64_t file_size,
			     struct ioc_zip_index *ix, const char **why)
{
	uint32_t n;
	bool with_sum;
	size_t esize, need;
	uint64_t coff = 0, doff = 0;
	const uint8_t *p;
	int r;

	memset(ix, 0, sizeof(*ix));
	if (len < 8 + IOC__ZIP_SEEK_FOOTER) {
		*why = "seek table too short";
		return -EBADMSG;
	}
	r = ioc__zip_seektable_footer(buf + len - IOC__ZIP_SEEK_FOOTER, &n, &with_sum, why);
	if (r < 0)
		return r;
	esize = with_sum ? 12 : 8;
	need = ioc__zip_seektable_size(n, with_sum);
	if (need != len || need > file_size) {
		*why = "seek table size does not match its frame count";
		return -EBADMSG;
	}
	if (ioc__zip_le32(buf) != IOC__ZIP_SEEK_SKIP_MAGIC ||
	    ioc__zip_le32(buf + 4) != need - 8) {
		*why = "seek table is not a well-formed skippable frame";
		return -EBADMSG;
	}
	ix->frames = calloc(n ? n : 1, sizeof(*ix->frames));
	if (!ix->frames)
		return -ENOMEM;
	p = buf + 8;
	for (uint32_t i = 0; i < n; i++, p += esize) {
		struct ioc_zip_frame_info *f = &ix->frames[i];

		f->coff = coff;
		f->doff = doff;
		f->csize = ioc__zip_le32(p);
		f->dsize = ioc__zip_le32(p + 4);
		f->has_sum = with_sum;
		f->sum = with_sum ? ioc__zip_le32(p + 8) : 0;
		coff += f->csize;
		doff += f->dsize;
		if (f->csize == 0 || coff > file_size - need) {
			*why = "seek table frame sizes do not add up to the file size";
			goto bad;
		}
	}
	/* A gap before the table may be our page checks: the caller reads
	 * its head (ioc__zip_pck_head()) and fails the file if it is not. */
	if (coff != file_size - need) {
		ix->pck_off = coff;
		ix->pck_len = file_size - need - coff;
	}
	ix->format = IOC_ZIP_ZSTD;
	ix->nframes = n;
	ix->csize = file_size;
	ix->dsize = doff;
	return 0;
bad:
	free(ix->frames);
	ix->frames = NULL;
	return -EBADMSG;
}

/* ---- page checks ------------------------------------------------- */

/*
 * A stored frame's own checksum covers all of it, so its first read had to
 * read and hash the whole frame (12-128 KiB) for a 4 KiB request.  The
 * page-check frame carries a checksum per 4 KiB page of each stored frame;
 * a read checks only the pages it reads.  Layout, little-endian: the
 * skippable frame header (magic, size), the tag "IOCP", the page shift
 * (12), the hash (1: XXH64's low 32 bits), two reserved zero bytes, the
 * frame count, the check count, a bitmap of stored frames (bit i of byte
 * i / 8) and the checks, frame by frame.  It sits between the last data
 * frame and the seek table, where a zstd decoder skips it and zstd's
 * seekable reader never looks.
 */
bool ioc__zip_is_stored(const uint8_t *frame, size_t csize, size_t dsize)
{
	struct ioc__zip_frame f = { 0 };
	const char *why = NULL;
	size_t h;
	uint32_t bh;

	if (csize < dsize + 12 || csize > dsize + 25)
		return false;
	h = csize - dsize - 4;
	(void)ioc__zip_scan(&f, frame, h, &why);
	if (!f.hdr_done || f.kind != IOC__ZIP_K_ZSTD || !f.has_sum || f.hdr_len + 3 != h ||
	    f.dsize != dsize)
		return false;
	bh = (uint32_t)frame[h - 3] | (uint32_t)frame[h - 2] << 8 | (uint32_t)frame[h - 1] << 16;
	return bh == ((uint32_t)dsize << 3 | 1);
}

#if IOC_HAVE_XXHASH
uint32_t ioc__zip_page_check(const void *p, size_t len)
{
	return (uint32_t)XXH64(p, len, 0);
}
#endif

size_t ioc__zip_pck_size(size_t nframes, size_t nchecks)
{
	return IOC__ZIP_PCK_HEAD + (nframes + 7) / 8 + nchecks * 4;
}

void ioc__zip_pck_write(uint8_t *dst, size_t nframes, const uint8_t *map,
			const uint32_t *checks, size_t nchecks)
{
	size_t len = ioc__zip_pck_size(nframes, nchecks);
	uint8_t *p = dst + IOC__ZIP_PCK_HEAD;

	ioc__zip_put_le32(dst, IOC__ZIP_PCK_SKIP_MAGIC);
	ioc__zip_put_le32(dst + 4, (uint32_t)(len - 8));
	ioc__zip_put_le32(dst + 8, IOC__ZIP_PCK_TAG);
	dst[12] = 12;
	dst[13] = 1;
	dst[14] = dst[15] = 0;
	ioc__zip_put_le32(dst + 16, (uint32_t)nframes);
	ioc__zip_put_le32(dst + 20, (uint32_t)nchecks);
	memcpy(p, map, (nframes + 7) / 8);
	p += (nframes + 7) / 8;
	for (size_t i = 0; i < nchecks; i++, p += 4)
		ioc__zip_put_le32(p, checks[i]);
}

int ioc__zip_pck_head(const uint8_t *head, uint64_t len, size_t nframes, size_t *nchecks,
		      const char **why)
{
	uint64_t n;

	if (len < IOC__ZIP_PCK_HEAD || ioc__zip_le32(head) != IOC__ZIP_PCK_SKIP_MAGIC ||
	    ioc__zip_le32(head + 4) != len - 8 || ioc__zip_le32(head + 8) != IOC__ZIP_PCK_TAG) {
		*why = "seek table frame sizes do not add up to the file size";
		return -EBADMSG;
	}
	n = ioc__zip_le32(head + 20);
	if (head[12] != 12 || head[13] != 1 || head[14] || head[15] ||
	    ioc__zip_le32(head + 16) != nframes || ioc__zip_pck_size(nframes, n) != len) {
		*why = "page-check frame does not match the seek table";
		return -EBADMSG;
	}
	*nchecks = (size_t)n;
	return 0;
}

/* ---- frame scanning ----------------------------------------------- */

static int scan_zstd_header(struct ioc__zip_frame *f, const uint8_t *p, size_t avail,
			    const char **why)
{
	static const unsigned did_len[4] = { 0, 1, 2, 4 };
	unsigned fhd, fcs_flag, single, hlen, fcs_len;
	uint64_t fcs = 0;

	if (avail < 5)
		return 0;
	fhd = p[4];
	fcs_flag = fhd >> 6;
	single = (fhd >> 5) & 1;
	if (fhd & 0x08) {
		*why = "zstd frame header has the reserved bit set";
		return -EBADMSG;
	}
	fcs_len = fcs_flag == 0 ? (single ? 1 : 0) : 1u << fcs_flag;
	hlen = 5 + !single + did_len[fhd & 3] + fcs_len;
	if (avail < hlen)
		return 0;
	for (unsigned i = 0; i < fcs_len; i++)
		fcs |= (uint64_t)p[hlen - fcs_len + i] << (8 * i);
	if (fcs_len == 2)
		fcs += 256;
	f->dsize = fcs_len ? fcs : UINT64_MAX;
	f->has_sum = (fhd >> 2) & 1;
	f->hdr_len = hlen;
	f->pos = hlen;
	f->sized = true;
	f->hdr_done = true;
	return 1;
}

static int scan_gzip_header(struct ioc__zip_frame *f, const uint8_t *p, size_t avail,
			    const char **why)
{
	unsigned flg, xlen;

	if (avail < IOC__ZIP_GZ_HEADER && avail < 12)
		return 0;
	if (p[2] != 8) {
		*why = "gzip member with an unknown compression method";
		return -EBADMSG;
	}
	flg = p[3];
	if (flg & 0xe0) {
		*why = "gzip member header has reserved flags set";
		return -EBADMSG;
	}
	f->dsize = UINT64_MAX;
	f->has_sum = true;
	f->hdr_done = true;
	f->sized = false;
	if (!(flg & 4))
		return 1;               /* foreign member: stream it */
	if (avail < 12)
		return 0;
	xlen = p[10] | (unsigned)p[11] << 8;
	/* Ours: exactly one subfield 'I','Z' of 4 bytes. */
	if (xlen == 8 && avail >= IOC__ZIP_GZ_HEADER && p[12] == 'I' && p[13] == 'Z' &&
	    p[14] == 4 && p[15] == 0 && !(flg & 0x1a)) {
		f->csize = ioc__zip_le32(p + 16);
		if (f->csize < IOC__ZIP_GZ_HEADER + IOC__ZIP_GZ_TRAILER + 2) {
			*why = "gzip member size field is too small";
			return -EBADMSG;
		}
		f->sized = true;
		f->hdr_len = IOC__ZIP_GZ_HEADER;
	} else if (xlen == 8 && avail < IOC__ZIP_GZ_HEADER) {
		f->hdr_done = false;    /* could be ours: wait for the rest */
		return 0;
	}
	return 1;
}

int ioc__zip_scan(struct ioc__zip_frame *f, const uint8_t *p, size_t avail, const char **why)
{
	int r;

	if (!f->hdr_done) {
		uint32_t magic;

		if (avail < 4) {
			if (avail >= 2 && p[0] == 0x1f && p[1] == 0x8b)
				return 0;
			if (avail >= 1 && p[0] != 0x1f && p[0] != 0x28 &&
			    (p[0] & 0xf0) != 0x50) {
				*why = "not a zstd frame or gzip member";
				return -EBADMSG;
			}
			return 0;
		}
		magic = ioc__zip_le32(p);
		if (magic == IOC__ZIP_ZSTD_MAGIC) {
			f->kind = IOC__ZIP_K_ZSTD;
			r = scan_zstd_header(f, p, avail, why);
		} else if ((magic & IOC__ZIP_SKIP_MASK) == IOC__ZIP_SKIP_MAGIC) {
			if (avail < 8)
				return 0;
			f->kind = IOC__ZIP_K_SKIP;
			f->skip_magic = magic;
			f->csize = 8 + (uint64_t)ioc__zip_le32(p + 4);
			f->dsize = 0;
			f->sized = true;
			f->hdr_done = true;
			f->hdr_len = 8;
			r = 1;
		} else if (p[0] == 0x1f && p[1] == 0x8b) {
			f->kind = IOC__ZIP_K_GZIP;
			r = scan_gzip_header(f, p, avail, why);
		} else {
			*why = "not a zstd frame or gzip member";
			return -EBADMSG;
		}
		if (r <= 0)
			return r;
	}
	if (!f->sized)
		return 0;
	if (f->kind != IOC__ZIP_K_ZSTD)
		return avail >= f->csize ? 1 : 0;
	if (f->csize)
		return avail >= f->csize ? 1 : 0;
	/* Walk block headers from f->pos. */
	for (;;) {
		uint32_t h, type, size, last;

		if (avail < f->pos + 3)
			return 0;
		h = p[f->pos] | (uint32_t)p[f->pos + 1] << 8 | (uint32_t)p[f->pos + 2] << 16;
		last = h & 1;
		type = (h >> 1) & 3;
		size = h >> 3;
		if (type == 3) {
			*why = "zstd block of the reserved type";
			return -EBADMSG;
		}
		if (size > IOC__ZIP_ZSTD_BLOCK_MAX) {
			*why = "zstd block larger than 128 KiB";
			return -EBADMSG;
		}
		f->pos += 3 + (type == 1 ? 1 : size);
		if (last) {
			f->csize = f->pos + (f->has_sum ? 4 : 0);
			return avail >= f->csize ? 1 : 0;
		}
	}
}

/* ---- decompression ------------------------------------------------ */

int ioc__zip_dctx_init(struct ioc__zip_dctx *d, unsigned window_log_max,
		       enum ioc_zip_deflate deflate)
{
	memset(d, 0, sizeof(*d));
	d->window_log_max = window_log_max ? window_log_max : 27;
	d->zd = ZSTD_createDCtx();
	if (!d->zd)
		return -ENOMEM;
	if (ZSTD_isError(ZSTD_DCtx_setParameter(d->zd, ZSTD_d_windowLogMax,
						(int)d->window_log_max))) {
		ioc__zip_dctx_fini(d);
		return -EINVAL;
	}
	d->use_zlib = deflate == IOC_ZIP_DEFLATE_ZLIB || !IOC_HAVE_LIBDEFLATE;
#if IOC_HAVE_LIBDEFLATE
	if (!d->use_zlib) {
		d->ld = libdeflate_alloc_decompressor();
		if (!d->ld) {
			ioc__zip_dctx_fini(d);
			return -ENOMEM;
		}
	}
#endif
	return 0;
}

void ioc__zip_dctx_fini(struct ioc__zip_dctx *d)
{
	ZSTD_freeDCtx(d->zd);
#if IOC_HAVE_LIBDEFLATE
	if (d->ld)
		libdeflate_free_decompressor(d->ld);
#endif
	if (d->zs_ready)
		inflateEnd(&d->zs);
	memset(d, 0, sizeof(*d));
}

static int zlib_ready(struct ioc__zip_dctx *d)
{
	if (d->zs_ready)
		return inflateReset2(&d->zs, 31) == Z_OK ? 0 : -EIO;
	memset(&d->zs, 0, sizeof(d->zs));
	if (inflateInit2(&d->zs, 31) != Z_OK)
		return -ENOMEM;
	d->zs_ready = true;
	return 0;
}

int ioc__zip_decompress(struct ioc__zip_dctx *d, enum ioc__zip_kind k, void *dst,
			size_t dsize, const void *src, size_t csize, const char **why)
{
	if (k == IOC__ZIP_K_ZSTD) {
		size_t r = ZSTD_decompressDCtx(d->zd, dst, dsize, src, csize);

		if (ZSTD_isError(r)) {
			*why = ZSTD_getErrorName(r);
			return -EBADMSG;
		}
		if (r != dsize) {
			*why = "frame content size lies";
			return -EBADMSG;
		}
		return 0;
	}
	if (k != IOC__ZIP_K_GZIP) {
		*why = "not a compressed frame";
		return -EINVAL;
	}
#if IOC_HAVE_LIBDEFLATE
	if (!d->use_zlib) {
		size_t in_used = 0, out_used = 0;
		enum libdeflate_result r;

		r = libdeflate_gzip_decompress_ex(d->ld, src, csize, dst, dsize, &in_used,
						  &out_used);
		switch (r) {
		case LIBDEFLATE_SUCCESS:
			break;
		case LIBDEFLATE_INSUFFICIENT_SPACE:
			*why = "gzip member larger than its recorded size";
			return -EBADMSG;
		default:
			*why = "corrupt gzip member (bad deflate data or CRC)";
			return -EBADMSG;
		}
		if (in_used != csize || out_used != dsize) {
			*why = "gzip member sizes lie";
			return -EBADMSG;
		}
		return 0;
	}
#endif
	if (zlib_ready(d) < 0)
		return -ENOMEM;
	d->zs.next_in = (Bytef *)(uintptr_t)src;
	d->zs.avail_in = (uInt)csize;
	d->zs.next_out = dst;
	d->zs.avail_out = (uInt)dsize;
	int zr = inflate(&d->zs, Z_FINISH);

	if (zr != Z_STREAM_END) {
		*why = zr == Z_BUF_ERROR ? "gzip member larger than its recorded size"
					 : "corrupt gzip member (bad deflate data or CRC)";
		return -EBADMSG;
	}
	if (d->zs.avail_in || d->zs.avail_out) {
		*why = "gzip member sizes lie";
		return -EBADMSG;
	}
	return 0;
}

int ioc__zip_stream_begin(struct ioc__zip_dctx *d, enum ioc__zip_kind k, const char **why)
{
	d->skind = k;
	d->streaming = true;
	if (k == IOC__ZIP_K_ZSTD) {
		ZSTD_DCtx_reset(d->zd, ZSTD_reset_session_only);
		return 0;
	}
	if (k == IOC__ZIP_K_GZIP)
		return zlib_ready(d);
	*why = "cannot stream this frame kind";
	return -EINVAL;
}

int ioc__zip_stream(struct ioc__zip_dctx *d, const uint8_t *in, size_t inlen, size_t *used,
		    uint8_t *out, size_t outcap, size_t *produced, const char **why)
{
	if (d->skind == IOC__ZIP_K_ZSTD) {
		ZSTD_inBuffer ib = { in, inlen, 0 };
		ZSTD_outBuffer ob = { out, outcap, 0 };
		size_t r = ZSTD_decompressStream(d->zd, &ob, &ib);

		*used = ib.pos;
		*produced = ob.pos;
		if (ZSTD_isError(r)) {
			*why = ZSTD_getErrorName(r);
			return -EBADMSG;
		}
		if (r == 0) {
			d->streaming = false;
			return 1;
		}
		return 0;
	}
	d->zs.next_in = (Bytef *)(uintptr_t)in;
	d->zs.avail_in = (uInt)(inlen > UINT32_MAX ? UINT32_MAX : inlen);
	d->zs.next_out = out;
	d->zs.avail_out = (uInt)(outcap > UINT32_MAX ? UINT32_MAX : outcap);
	int zr = inflate(&d->zs, Z_NO_FLUSH);

	*used = (size_t)(d->zs.next_in - in);
	*produced = (size_t)(d->zs.next_out - out);
	if (zr == Z_STREAM_END) {
		d->streaming = false;
		return 1;
	}
	if (zr == Z_OK || (zr == Z_BUF_ERROR && (*used || *produced || !inlen || !outcap)))
		return 0;
	*why = zr == Z_DATA_ERROR ? "corrupt gzip member (bad deflate data or CRC)"
				  : "gzip decoder error";
	return -EBADMSG;
}
