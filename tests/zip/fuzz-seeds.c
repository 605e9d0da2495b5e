/*
 * The standalone cases of the zip fuzz targets (fuzz-frame.c,
 * fuzz-seektable.c; the runner is tests/harness/fuzz-standalone.h): a
 * corpus generated deterministically (valid zstd and gzip files from our
 * compressor with several blocks, zero blocks and a seek table, a foreign
 * single zstd frame, garbage behind the formats' magic numbers), each
 * mutated with half the edits in the last 64 bytes (the seek table); then
 * the checked-in seeds of tests/zip/corpus/<target>/ (small files made
 * with iocore-zip, zstd and gzip), or the directory given as the argument.
 */
#include <zstd.h>

#include "fuzz-standalone.h"
#include "iocore/zip.h"
#include "zip-test-util.h"

struct obuf {
	uint8_t *p;
	size_t len, cap;
};

static int obuf_write(void *opaque, const void *buf, size_t len)
{
	struct obuf *b = opaque;

	if (b->len + len > b->cap) {
		b->cap = (b->len + len) * 2;
		b->p = realloc(b->p, b->cap);
		ASSERT_NOT_NULL(b->p);
	}
	memcpy(b->p + b->len, buf, len);
	b->len += len;
	return 0;
}

static void mutate(const uint8_t *p, size_t n, uint64_t seed)
{
	struct ioc_fuzz_mut m = { .rounds = 40, .tail = 64, .seed = seed };

	ioc_fuzz_mutate(p, n, &m);
}

static void compressed(enum ioc_zip_format fmt, size_t n, size_t block, bool zeros,
		       struct obuf *out)
{
	uint8_t *src = zeros ? calloc(1, n ? n : 1) : zt_data(n, n);
	struct ioc_zip_opts o = { .format = fmt, .block_size = block, .workers = 2,
				  .write = obuf_write, .opaque = out };
	struct ioc_zip *z;

	if (zeros && n > 8192)
		zt_fill(src + 4096, 4096, 1);
	out->len = 0;
	ASSERT_OK(ioc_zip_compressor_new(&z, &o));
	ASSERT_OK(ioc_zip_write(z, src, n, 0));
	ASSERT_OK(ioc_zip_finish(z));
	ioc_zip_free(z);
	free(src);
}

static void test_generated_corpus(void)
{
	static const size_t sizes[] = { 0, 1, 1000, 70000, 200000 };
	struct obuf b = { 0 };
	uint64_t seed = 1;

	for (int fmt = 0; fmt < 2; fmt++)
		for (size_t i = 0; i < IOC_ARRAY_SIZE(sizes); i++) {
			compressed((enum ioc_zip_format)fmt, sizes[i], 65536, false, &b);
			mutate(b.p, b.len, seed++);
		}
	for (int fmt = 0; fmt < 2; fmt++) {
		compressed((enum ioc_zip_format)fmt, 65536, 4096, true, &b);
		mutate(b.p, b.len, seed++);
	}
	/* A foreign frame without content size. */
	{
		size_t n = 100000, cap = ZSTD_compressBound(n);
		uint8_t *src = zt_data(n, 7), *dst = malloc(cap);
		ZSTD_CCtx *zc = ZSTD_createCCtx();
		ZSTD_inBuffer ib = { src, n, 0 };
		ZSTD_outBuffer ob = { dst, cap, 0 };

		ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_continue);
		ib.size = ib.pos;
		ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_end);
		mutate(dst, ob.pos, seed++);
		ZSTD_freeCCtx(zc);
		free(src);
		free(dst);
	}
	/* Garbage and near-misses of the magic numbers. */
	{
		uint8_t g[4096];
		static const uint8_t heads[][4] = {
			{ 0x28, 0xb5, 0x2f, 0xfd }, { 0x5e, 0x2a, 0x4d, 0x18 },
			{ 0x1f, 0x8b, 0x08, 0x04 }, { 0x1f, 0x8b, 0x08, 0x00 },
		};

		for (int i = 0; i < 64; i++) {
			zt_fill(g, sizeof(g), 1000 + (uint64_t)i);
			memcpy(g, heads[i % 4], 4);
			ioc_fuzz_run(g, (size_t)(i * 61) % sizeof(g));
		}
	}
	free(b.p);
	ioc_test_diag("%lu inputs", ioc_fuzz_runs);
	ASSERT_UGT(ioc_fuzz_runs, 500);
}

static void run_file(const char *name, const uint8_t *p, size_t n, void *opaque)
{
	(void)name;
	(void)opaque;
	ioc_fuzz_run(p, n);
}

static void test_saved_corpus(void)
{
	ioc_fuzz_corpus("tests/zip/corpus/" IOC_FUZZ_TARGET, run_file, NULL);
}

IOC_FUZZ_MAIN(NULL, IOC_TEST(test_generated_corpus), IOC_TEST(test_saved_corpus))
