/* Codec layer: frames, zero frames, seek table, scanning, hostile input. */
#include <zlib.h>
#include <zstd.h>

#include "tap.h"
#include "ioc-config.h"
#include "src/zip/codec.h"
#include "zip-test-util.h"

static ssize_t compress_one(enum ioc_zip_format fmt, int level, enum ioc_zip_deflate be,
			    const uint8_t *src, size_t n, uint8_t **out, bool *zero)
{
	struct ioc__zip_cctx c;
	size_t cap = ioc__zip_compress_bound(fmt, n);
	uint32_t sum;
	ssize_t r;

	ASSERT_OK(ioc__zip_cctx_init(&c, fmt, level, true, be));
	*out = malloc(cap);
	ASSERT_NOT_NULL(*out);
	r = ioc__zip_compress(&c, *out, cap, src, n, &sum, zero);
	ioc__zip_cctx_fini(&c);
	return r;
}

static void roundtrip(enum ioc_zip_format fmt, int level, enum ioc_zip_deflate be, size_t n)
{
	uint8_t *src = zt_data(n, n + (size_t)level), *dst, *back = malloc(n + 1);
	struct ioc__zip_frame f = { 0 };
	struct ioc__zip_dctx d;
	const char *why = NULL;
	bool zero;
	ssize_t clen = compress_one(fmt, level, be, src, n, &dst, &zero);

	ASSERT_GT(clen, 0);
	ASSERT_EQ(ioc__zip_scan(&f, dst, (size_t)clen, &why), 1);
	ASSERT_UEQ(f.csize, (uint64_t)clen);
	ASSERT_TRUE(f.sized);
	if (fmt == IOC_ZIP_ZSTD) {
		ASSERT_UEQ(f.dsize, n);
		ASSERT_TRUE(f.has_sum);
		/* A stock decoder agrees. */
		ASSERT_UEQ(ZSTD_decompress(back, n + 1, dst, (size_t)clen), n);
		ASSERT_MEM_EQ(back, src, n);
	} else {
		ASSERT_UEQ(ioc__zip_le32(dst + clen - 4), n);
	}
	ASSERT_OK(ioc__zip_dctx_init(&d, 0, be));
	memset(back, 0xaa, n);
	ASSERT_OK(ioc__zip_decompress(&d, f.kind, back, n, dst, (size_t)clen, &why));
	ASSERT_MEM_EQ(back, src, n);
	ioc__zip_dctx_fini(&d);
	free(src);
	free(dst);
	free(back);
}

static void test_zstd_roundtrip(void)
{
	static const size_t sizes[] = { 0, 1, 100, 4096, 131073, 1u << 20 };
	static const int levels[] = { 1, 3, 9, 19 };

	for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++)
		for (size_t j = 0; j < IOC_ARRAY_SIZE(levels); j++)
			if (levels[j] < 19 || sizes[i] <= 4096)
				roundtrip(IOC_ZIP_ZSTD, levels[j], 0, sizes[i]);
}

static void test_gzip_roundtrip(void)
{
	static const size_t sizes[] = { 0, 1, 100, 65536, 300001 };

	/* Every level through every deflater built in (igzip clamps levels
	 * above 3 to 3, zlib above 9 to 9: still round trips). */
	for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++)
		for (int level = 1; level <= 12; level++) {
			if (level <= 9)
				roundtrip(IOC_ZIP_GZIP, level, IOC_ZIP_DEFLATE_ZLIB, sizes[i]);
			if (IOC_HAVE_LIBDEFLATE)
				roundtrip(IOC_ZIP_GZIP, level, IOC_ZIP_DEFLATE_LIBDEFLATE,
					  sizes[i]);
			if (IOC_HAVE_ISAL && level <= 4)
				roundtrip(IOC_ZIP_GZIP, level, IOC_ZIP_DEFLATE_ISAL, sizes[i]);
			roundtrip(IOC_ZIP_GZIP, level, IOC_ZIP_DEFLATE_DEFAULT, sizes[i]);
		}
}

/* Incompressible blocks fit the compress bound with every deflater (each
 * falls back to stored blocks), and zlib's inflate (gzip -d's) reads the
 * member, header, CRC and length included. */
static void test_gzip_incompressible(void)
{
	static const enum ioc_zip_deflate be[] = {
		IOC_ZIP_DEFLATE_ZLIB, IOC_ZIP_DEFLATE_LIBDEFLATE, IOC_ZIP_DEFLATE_ISAL,
	};
	static const size_t sizes[] = { 1, 65535, 65536, 65537, 1u << 20 };

	for (size_t b = 0; b < IOC_ARRAY_SIZE(be); b++)
		for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++)
			for (int level = 1; level <= 9; level += 2) {
				size_t n = sizes[i];
				uint8_t *src = malloc(n), *dst, *back = malloc(n);
				uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
				z_stream zs = { 0 };
				bool zero;
				ssize_t clen;

				if (ioc__zip_deflater_for(level, be[b]) < 0) {
					free(src);
					free(back);
					continue;
				}
				for (size_t k = 0; k < n; k++) {
					x ^= x << 13;
					x ^= x >> 7;
					x ^= x << 17;
					src[k] = (uint8_t)x;
				}
				clen = compress_one(IOC_ZIP_GZIP, level, be[b], src, n, &dst, &zero);
				ASSERT_GT(clen, 0);
				ASSERT_UEQ((size_t)clen, ioc__zip_le32(dst + 16));
				ASSERT_TRUE((size_t)clen <= ioc__zip_compress_bound(IOC_ZIP_GZIP, n));
				ASSERT_EQ(inflateInit2(&zs, 31), Z_OK);
				zs.next_in = dst;
				zs.avail_in = (uInt)clen;
				zs.next_out = back;
				zs.avail_out = (uInt)n;
				ASSERT_EQ(inflate(&zs, Z_FINISH), Z_STREAM_END);
				ASSERT_UEQ(zs.total_out, n);
				ASSERT_UEQ(zs.avail_in, 0);
				ASSERT_MEM_EQ(back, src, n);
				inflateEnd(&zs);
				free(src);
				free(dst);
				free(back);
			}
}

/* Which deflater the default picks per level, and refusals. */
static void test_deflater_choice(void)
{
	for (int level = 1; level <= 12; level++) {
		int want = IOC_HAVE_ISAL && level <= 3 ? IOC__ZIP_D_ISAL
			 : IOC_HAVE_LIBDEFLATE ? IOC__ZIP_D_LIBDEFLATE : IOC__ZIP_D_ZLIB;

		ASSERT_EQ(ioc__zip_deflater_for(level, IOC_ZIP_DEFLATE_DEFAULT), want);
		ASSERT_EQ(ioc__zip_deflater_for(level, IOC_ZIP_DEFLATE_ZLIB), IOC__ZIP_D_ZLIB);
	}
	ASSERT_EQ(ioc__zip_deflater_for(1, IOC_ZIP_DEFLATE_ISAL),
		  IOC_HAVE_ISAL ? IOC__ZIP_D_ISAL : -ENOTSUP);
	ASSERT_EQ(ioc__zip_deflater_for(1, IOC_ZIP_DEFLATE_LIBDEFLATE),
		  IOC_HAVE_LIBDEFLATE ? IOC__ZIP_D_LIBDEFLATE : -ENOTSUP);
	ASSERT_EQ(ioc__zip_deflater_for(1, (enum ioc_zip_deflate)99), -EINVAL);
}

/* The level calibration table of codec.c's essay, as DEFAULT must apply it:
 * gzip level -> (deflater, that library's level), with and without ISA-L.
 * Explicit deflaters run the level as given. */
static void test_level_calibration(void)
{
	static const struct {
		int level, lib_level;
	} ld[] = {
		{ 1, 1 }, { 2, 1 }, { 3, 2 }, { 4, 4 }, { 5, 5 }, { 6, 5 },
		{ 7, 6 }, { 8, 6 }, { 9, 6 }, { 10, 10 }, { 11, 11 }, { 12, 12 },
		{ 19, 12 }, { 0, 5 },   /* 0 = the default level, 6 */
	};
	int lib_level;

	for (size_t i = 0; i < IOC_ARRAY_SIZE(ld); i++) {
		int level = ld[i].level, d = ioc__zip_deflate_pick(level, 0, &lib_level);

		if (IOC_HAVE_ISAL && level >= 1 && level <= 3) {
			ASSERT_EQ(d, IOC__ZIP_D_ISAL);
			ASSERT_EQ(lib_level, level);
		} else if (IOC_HAVE_LIBDEFLATE) {
			ASSERT_EQ(d, IOC__ZIP_D_LIBDEFLATE);
			ASSERT_EQ(lib_level, ld[i].lib_level);
		} else {
			ASSERT_EQ(d, IOC__ZIP_D_ZLIB);
			ASSERT_EQ(lib_level, level < 1 ? 6 : level > 9 ? 9 : level);
		}
		ASSERT_EQ(ioc__zip_deflater_for(level, 0), d);
	}
	for (int level = 1; level <= 19; level++) {
		if (IOC_HAVE_LIBDEFLATE) {
			ASSERT_EQ(ioc__zip_deflate_pick(level, IOC_ZIP_DEFLATE_LIBDEFLATE,
							&lib_level), IOC__ZIP_D_LIBDEFLATE);
			ASSERT_EQ(lib_level, level > 12 ? 12 : level);
		}
		if (IOC_HAVE_ISAL) {
			ASSERT_EQ(ioc__zip_deflate_pick(level, IOC_ZIP_DEFLATE_ISAL, &lib_level),
				  IOC__ZIP_D_ISAL);
			ASSERT_EQ(lib_level, level > 3 ? 3 : level);
		}
		ASSERT_EQ(ioc__zip_deflate_pick(level, IOC_ZIP_DEFLATE_ZLIB, &lib_level),
			  IOC__ZIP_D_ZLIB);
		ASSERT_EQ(lib_level, level > 9 ? 9 : level);
	}
	ASSERT_EQ(ioc__zip_deflate_pick(6, (enum ioc_zip_deflate)99, &lib_level), -EINVAL);
}

/* A cctx really runs the picked level: DEFAULT at N deflates byte for byte
 * what the explicit library at the mapped level does (the header's XFL
 * still tells the level asked for: 4 at 1, 2 at 9 and up). */
static void test_level_calibration_output(void)
{
	size_t n = 300001;
	uint8_t *src = zt_data(n, 77);

	for (int level = 1; level <= 12; level++) {
		int lib_level, d = ioc__zip_deflate_pick(level, 0, &lib_level);
		enum ioc_zip_deflate be = d == IOC__ZIP_D_ISAL ? IOC_ZIP_DEFLATE_ISAL
				      : d == IOC__ZIP_D_LIBDEFLATE ? IOC_ZIP_DEFLATE_LIBDEFLATE
				      : IOC_ZIP_DEFLATE_ZLIB;
		uint8_t *a, *b;
		bool zero;
		ssize_t la = compress_one(IOC_ZIP_GZIP, level, 0, src, n, &a, &zero);
		ssize_t lb = compress_one(IOC_ZIP_GZIP, lib_level, be, src, n, &b, &zero);

		ASSERT_GT(la, IOC__ZIP_GZ_HEADER);
		ASSERT_EQ(la, lb);
		ASSERT_MEM_EQ(a + IOC__ZIP_GZ_HEADER, b + IOC__ZIP_GZ_HEADER,
			      (size_t)la - IOC__ZIP_GZ_HEADER);
		ASSERT_EQ(a[8], level >= 9 ? 2 : level == 1 ? 4 : 0);
		free(a);
		free(b);
	}
	free(src);
}

/* Two members concatenated must read as one stream with zlib (gzip -d). */
static void test_gzip_multimember_zlib(void)
{
	size_t n = 70000;
	uint8_t *a = zt_data(n, 1), *b = zt_data(n, 2), *ca, *cb, *cat, *back = malloc(2 * n);
	bool zero;
	ssize_t la = compress_one(IOC_ZIP_GZIP, 6, 0, a, n, &ca, &zero);
	ssize_t lb = compress_one(IOC_ZIP_GZIP, 6, 0, b, n, &cb, &zero);
	z_stream zs = { 0 };
	size_t got = 0, off = 0;

	ASSERT_GT(la, 0);
	ASSERT_GT(lb, 0);
	cat = malloc((size_t)(la + lb));
	memcpy(cat, ca, (size_t)la);
	memcpy(cat + la, cb, (size_t)lb);
	ASSERT_EQ(inflateInit2(&zs, 31), Z_OK);
	while (off < (size_t)(la + lb)) {
		zs.next_in = cat + off;
		zs.avail_in = (uInt)((size_t)(la + lb) - off);
		zs.next_out = back + got;
		zs.avail_out = (uInt)(2 * n - got);
		int r = inflate(&zs, Z_FINISH);
		ASSERT_TRUE(r == Z_STREAM_END);
		off = (size_t)(zs.next_in - cat);
		got = (size_t)(zs.next_out - back);
		ASSERT_EQ(inflateReset(&zs), Z_OK);
	}
	inflateEnd(&zs);
	ASSERT_UEQ(got, 2 * n);
	ASSERT_MEM_EQ(back, a, n);
	ASSERT_MEM_EQ(back + n, b, n);
	free(a); free(b); free(ca); free(cb); free(cat); free(back);
}

static void test_zero_blocks(void)
{
	static const size_t sizes[] = { 1, 255, 256, 4096, 65791, 65792, 131072, 131073,
					(4u << 20) };
	struct ioc__zip_cctx c;
	struct ioc__zip_dctx d;

	ASSERT_OK(ioc__zip_dctx_init(&d, 0, 0));
	for (int fmt = 0; fmt < 2; fmt++) {
		ASSERT_OK(ioc__zip_cctx_init(&c, (enum ioc_zip_format)fmt, 3, true, 0));
		for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++) {
			size_t n = sizes[i], cap = ioc__zip_compress_bound(c.format, n);
			uint8_t *z = calloc(1, n), *out = malloc(cap), *back = malloc(n);
			const char *why = NULL;

			/* Twice: the first learns the checksum, the second
			 * takes the cached shortcut; both must decode. */
			for (int rep = 0; rep < 2; rep++) {
				struct ioc__zip_frame f = { 0 };
				uint32_t sum;
				bool zero;
				ssize_t r = ioc__zip_compress(&c, out, cap, z, n, &sum, &zero);

				ASSERT_GT(r, 0);
				ASSERT_TRUE(zero);
				if (fmt == IOC_ZIP_ZSTD) {
					ASSERT_UEQ((size_t)r, ioc__zip_zero_frame_size(n, true));
					/* libzstd verifies the checksum too. */
					memset(back, 1, n);
					ASSERT_UEQ(ZSTD_decompress(back, n, out, (size_t)r), n);
					ASSERT_TRUE(ioc__zip_all_zero(back, n));
				}
				ASSERT_EQ(ioc__zip_scan(&f, out, (size_t)r, &why), 1);
				ASSERT_UEQ(f.csize, (uint64_t)r);
				memset(back, 1, n);
				ASSERT_OK(ioc__zip_decompress(&d, f.kind, back, n, out,
							      (size_t)r, &why));
				ASSERT_TRUE(ioc__zip_all_zero(back, n));
			}
			free(z); free(out); free(back);
		}
		ioc__zip_cctx_fini(&c);
	}
	ioc__zip_dctx_fini(&d);
}

static void test_all_zero(void)
{
	uint8_t buf[1000] = { 0 };

	ASSERT_TRUE(ioc__zip_all_zero(buf, 0));
	ASSERT_TRUE(ioc__zip_all_zero(buf, sizeof(buf)));
	for (size_t i = 0; i < sizeof(buf); i += 37) {
		buf[i] = 1;
		ASSERT_FALSE(ioc__zip_all_zero(buf, sizeof(buf)));
		buf[i] = 0;
	}
	buf[999] = 1;
	ASSERT_FALSE(ioc__zip_all_zero(buf, sizeof(buf)));
}

/* Stored frames are recognised from their bytes, and the page-check
 * frame's head is checked against the seek table it goes with. */
static void test_page_check_frame(void)
{
	uint8_t rnd[12288], *out;
	uint8_t map[1] = { 0x02 };
	uint32_t checks[3] = { 1, 2, 3 };
	size_t len = ioc__zip_pck_size(5, 3), n = 0;
	uint8_t *t = malloc(len);
	const char *why = NULL;
	bool zero;
	ssize_t r;

	uint64_t x = 88172645463325252ull;

	for (size_t i = 0; i < sizeof(rnd); i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		rnd[i] = (uint8_t)x;
	}
	r = compress_one(IOC_ZIP_ZSTD, 3, 0, rnd, sizeof(rnd), &out, &zero);
	ASSERT_GT(r, 0);
	ASSERT_TRUE(ioc__zip_is_stored(out, (size_t)r, sizeof(rnd)));
	ASSERT_FALSE(ioc__zip_is_stored(out, (size_t)r, sizeof(rnd) - 1));
	out[(size_t)r - sizeof(rnd) - 5] ^= 2;          /* block type: RLE */
	ASSERT_FALSE(ioc__zip_is_stored(out, (size_t)r, sizeof(rnd)));
	free(out);
	memset(rnd, 'a', sizeof(rnd));
	r = compress_one(IOC_ZIP_ZSTD, 3, 0, rnd, sizeof(rnd), &out, &zero);
	ASSERT_GT(r, 0);
	ASSERT_FALSE(ioc__zip_is_stored(out, (size_t)r, sizeof(rnd)));
	free(out);

	ASSERT_NOT_NULL(t);
	ASSERT_UEQ(len, IOC__ZIP_PCK_HEAD + 1 + 12);
	ioc__zip_pck_write(t, 5, map, checks, 3);
	ASSERT_OK(ioc__zip_pck_head(t, len, 5, &n, &why));
	ASSERT_UEQ(n, 3);
	ASSERT_EQ(t[IOC__ZIP_PCK_HEAD], 0x02);
	ASSERT_UEQ(ioc__zip_le32(t + len - 4), 3);
	/* A frame for another table, of another length, or not ours. */
	ASSERT_EQ(ioc__zip_pck_head(t, len, 6, &n, &why), -EBADMSG);
	ASSERT_EQ(ioc__zip_pck_head(t, len + 4, 5, &n, &why), -EBADMSG);
	t[20] = 4;                                      /* check count */
	ASSERT_EQ(ioc__zip_pck_head(t, len, 5, &n, &why), -EBADMSG);
	t[20] = 3;
	t[13] = 2;                                      /* hash */
	ASSERT_EQ(ioc__zip_pck_head(t, len, 5, &n, &why), -EBADMSG);
	t[13] = 1;
	t[8] ^= 1;                                      /* tag */
	ASSERT_EQ(ioc__zip_pck_head(t, len, 5, &n, &why), -EBADMSG);
	t[8] ^= 1;
	t[0] ^= 1;                                      /* skippable magic */
	ASSERT_EQ(ioc__zip_pck_head(t, len, 5, &n, &why), -EBADMSG);
	t[0] ^= 1;
	ASSERT_OK(ioc__zip_pck_head(t, len, 5, &n, &why));
	free(t);
}

static void test_seektable(void)
{
	struct ioc__zip_seek_entry e[3] = { { 100, 1000, 7 }, { 50, 1000, 8 }, { 10, 5, 9 } };
	size_t len = ioc__zip_seektable_size(3, true);
	uint8_t *t = malloc(len);
	struct ioc_zip_index ix;
	const char *why = NULL;
	uint64_t fsize = 160 + len;

	ioc__zip_seektable_write(t, e, 3, true);
	ASSERT_OK(ioc__zip_seektable_parse(t, len, fsize, &ix, &why));
	ASSERT_UEQ(ix.nframes, 3);
	ASSERT_UEQ(ix.dsize, 2005);
	ASSERT_UEQ(ix.frames[1].coff, 100);
	ASSERT_UEQ(ix.frames[2].doff, 2000);
	ASSERT_UEQ(ix.frames[2].sum, 9);
	free(ix.frames);
	/* The table is also a frame the scanner skips whole. */
	struct ioc__zip_frame f = { 0 };
	ASSERT_EQ(ioc__zip_scan(&f, t, len, &why), 1);
	ASSERT_EQ(f.kind, IOC__ZIP_K_SKIP);
	ASSERT_UEQ(f.csize, len);

	ASSERT_UEQ(ix.pck_len, 0);
	/* Frames that end before the table leave a gap for page checks: the
	 * index reader checks it (test_page_check_frame). */
	ASSERT_OK(ioc__zip_seektable_parse(t, len, fsize + 30, &ix, &why));
	ASSERT_UEQ(ix.pck_off, 160);
	ASSERT_UEQ(ix.pck_len, 30);
	free(ix.frames);

	/* Lies. */
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, len, &ix, &why), -EBADMSG);
	t[len - 9] = 4;                          /* frame count */
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, fsize, &ix, &why), -EBADMSG);
	t[len - 9] = 0xff; t[len - 8] = 0xff; t[len - 7] = 0xff; t[len - 6] = 0x7f;
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, fsize, &ix, &why), -EBADMSG);
	t[len - 9] = 3; t[len - 8] = 0; t[len - 7] = 0; t[len - 6] = 0;
	t[len - 5] |= 0x04;                      /* reserved bit */
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, fsize, &ix, &why), -EBADMSG);
	t[len - 5] &= (uint8_t)~0x04;
	t[len - 1] ^= 1;                         /* seekable magic */
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, fsize, &ix, &why), -ENOENT);
	t[len - 1] ^= 1;
	t[0] ^= 1;                               /* skippable magic */
	ASSERT_EQ(ioc__zip_seektable_parse(t, len, fsize, &ix, &why), -EBADMSG);
	t[0] ^= 1;
	ASSERT_OK(ioc__zip_seektable_parse(t, len, fsize, &ix, &why));
	free(ix.frames);
	free(t);
}

/* Feeding the scanner one byte at a time finds the same end. */
static void test_scan_incremental(void)
{
	for (int fmt = 0; fmt < 2; fmt++) {
		size_t n = 300000;
		uint8_t *src = zt_data(n, 5), *dst;
		bool zero;
		ssize_t clen = compress_one((enum ioc_zip_format)fmt, 3, 0, src, n, &dst, &zero);
		struct ioc__zip_frame f = { 0 };
		const char *why = NULL;
		size_t avail;
		int r = 0;

		for (avail = 0; avail <= (size_t)clen; avail++) {
			r = ioc__zip_scan(&f, dst, avail, &why);
			if (r != 0)
				break;
		}
		ASSERT_EQ(r, 1);
		ASSERT_UEQ(avail, (size_t)clen);
		ASSERT_UEQ(f.csize, (uint64_t)clen);
		free(src);
		free(dst);
	}
}

static void test_hostile_frames(void)
{
	size_t n = 200000;
	uint8_t *src = zt_data(n, 9), *dst, *back = malloc(n + 100);
	bool zero;
	ssize_t clen = compress_one(IOC_ZIP_ZSTD, 3, 0, src, n, &dst, &zero);
	struct ioc__zip_dctx d;
	const char *why = NULL;

	ASSERT_OK(ioc__zip_dctx_init(&d, 0, 0));
	/* Truncated. */
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_ZSTD, back, n, dst, (size_t)clen - 1, &why),
		  -EBADMSG);
	/* Lying content size: claim more and less than the truth. */
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_ZSTD, back, n + 100, dst, (size_t)clen,
				      &why), -EBADMSG);
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_ZSTD, back, n - 1, dst, (size_t)clen, &why),
		  -EBADMSG);
	/* Corrupt payload: checksum or structure error, never a crash. */
	for (size_t i = 12; i < (size_t)clen; i += (size_t)clen / 17) {
		dst[i] ^= 0x55;
		ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_ZSTD, back, n, dst, (size_t)clen,
					      &why), -EBADMSG);
		dst[i] ^= 0x55;
	}
	/* Garbage. */
	struct ioc__zip_frame f = { 0 };
	const uint8_t junk[8] = "garbage!";
	ASSERT_EQ(ioc__zip_scan(&f, junk, sizeof(junk), &why), -EBADMSG);
	/* Reserved block type. */
	uint8_t bad[16] = { 0x28, 0xb5, 0x2f, 0xfd, 0x20, 10, 0x07, 0, 0 };
	memset(&f, 0, sizeof(f));
	ASSERT_EQ(ioc__zip_scan(&f, bad, sizeof(bad), &why), -EBADMSG);
	/* Huge window, no content size: the streaming decoder refuses it. */
	uint8_t huge[] = { 0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0x01, 0, 0, 'x' };
	size_t used, produced;
	memset(&f, 0, sizeof(f));
	ASSERT_EQ(ioc__zip_scan(&f, huge, sizeof(huge), &why), 1);
	ASSERT_TRUE(f.hdr_done);
	ASSERT_UEQ(f.dsize, UINT64_MAX);
	ASSERT_OK(ioc__zip_stream_begin(&d, IOC__ZIP_K_ZSTD, &why));
	ASSERT_EQ(ioc__zip_stream(&d, huge, sizeof(huge), &used, back, n, &produced, &why),
		  -EBADMSG);
	ioc__zip_dctx_fini(&d);
	free(src); free(dst); free(back);
}

/* A frame without content size (streaming zstd, as `zstd` writes from a
 * pipe) decodes through the streaming path, fed in small pieces. */
static void test_stream_foreign(void)
{
	size_t n = 500000, cap = ZSTD_compressBound(n) + 64, clen, got = 0, off = 0;
	uint8_t *src = zt_data(n, 11), *dst = malloc(cap), *back = malloc(n);
	ZSTD_CCtx *zc = ZSTD_createCCtx();
	ZSTD_inBuffer ib = { src, n, 0 };
	ZSTD_outBuffer ob = { dst, cap, 0 };
	struct ioc__zip_dctx d;
	struct ioc__zip_frame f = { 0 };
	const char *why = NULL;
	int r = 0;

	/* continue-then-end: libzstd cannot know the size up front. */
	ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_continue)));
	ASSERT_UEQ(ib.pos, n);
	ib.size = ib.pos;
	ASSERT_UEQ(ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_end), 0);
	clen = ob.pos;
	ZSTD_freeCCtx(zc);
	ASSERT_EQ(ioc__zip_scan(&f, dst, clen, &why), 1);   /* delimitable, */
	ASSERT_UEQ(f.dsize, UINT64_MAX);                    /* but unsized */
	ASSERT_OK(ioc__zip_dctx_init(&d, 0, 0));
	ASSERT_OK(ioc__zip_stream_begin(&d, IOC__ZIP_K_ZSTD, &why));
	while (r == 0) {
		size_t used, produced, in = clen - off < 1000 ? clen - off : 1000;
		size_t room = n - got < 7000 ? n - got : 7000;

		r = ioc__zip_stream(&d, dst + off, in, &used, back + got, room, &produced, &why);
		ASSERT_GE(r, 0);
		off += used;
		got += produced;
	}
	ASSERT_UEQ(off, clen);
	ASSERT_UEQ(got, n);
	ASSERT_MEM_EQ(back, src, n);
	ioc__zip_dctx_fini(&d);
	free(src); free(dst); free(back);
}

static void test_gzip_hostile(void)
{
	size_t n = 100000;
	uint8_t *src = zt_data(n, 3), *dst, *back = malloc(n + 10);
	bool zero;
	ssize_t clen = compress_one(IOC_ZIP_GZIP, 6, 0, src, n, &dst, &zero);
	struct ioc__zip_dctx d;
	const char *why = NULL;

	ASSERT_OK(ioc__zip_dctx_init(&d, 0, 0));
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_GZIP, back, n + 10, dst, (size_t)clen, &why),
		  -EBADMSG);
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_GZIP, back, n - 10, dst, (size_t)clen, &why),
		  -EBADMSG);
	dst[clen - 6] ^= 1;                      /* CRC */
	ASSERT_EQ(ioc__zip_decompress(&d, IOC__ZIP_K_GZIP, back, n, dst, (size_t)clen, &why),
		  -EBADMSG);
	dst[clen - 6] ^= 1;
	ASSERT_OK(ioc__zip_decompress(&d, IOC__ZIP_K_GZIP, back, n, dst, (size_t)clen, &why));
	/* A size field smaller than any member. */
	struct ioc__zip_frame f = { 0 };
	dst[16] = 3; dst[17] = 0; dst[18] = 0; dst[19] = 0;
	ASSERT_EQ(ioc__zip_scan(&f, dst, (size_t)clen, &why), -EBADMSG);
	ioc__zip_dctx_fini(&d);
	free(src); free(dst); free(back);
}

IOC_TEST_MAIN(
	IOC_TEST(test_all_zero),
	IOC_TEST(test_zstd_roundtrip),
	IOC_TEST(test_gzip_roundtrip),
	IOC_TEST(test_gzip_incompressible),
	IOC_TEST(test_deflater_choice),
	IOC_TEST(test_level_calibration),
	IOC_TEST(test_level_calibration_output),
	IOC_TEST(test_gzip_multimember_zlib),
	IOC_TEST(test_zero_blocks),
	IOC_TEST(test_seektable),
	IOC_TEST(test_page_check_frame),
	IOC_TEST(test_scan_incremental),
	IOC_TEST(test_hostile_frames),
	IOC_TEST(test_stream_foreign),
	IOC_TEST(test_gzip_hostile),
)
