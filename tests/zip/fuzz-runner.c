/*
 * Runs a fuzz target's entry point over a small fixed corpus, as an
 * ordinary TAP test, so CI exercises the fuzz targets without libFuzzer.
 * The corpus is generated deterministically: valid zstd and gzip files
 * from our compressor (several blocks, zero blocks, a seek table), a
 * foreign single zstd frame, and for each of them truncations, byte flips
 * spread over the file and concentrated on the seek table, and garbage.
 * Then the target's checked-in seed corpus (tests/zip/corpus/<target>/:
 * small files made with iocore-zip, zstd and gzip), or, with a directory
 * argument, the files in it (a corpus saved by a real fuzzing run).
 */
#include <dirent.h>
#include <zstd.h>

#include "tap.h"
#include "iocore/zip.h"
#include "fuzz.h"
#include "zip-test-util.h"

static const char *extra_dir;
static unsigned long runs;

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

static void run(const uint8_t *p, size_t n)
{
	/* A private copy, so a target that read past the end is caught by
	 * ASan on the exact allocation. */
	uint8_t *c = malloc(n ? n : 1);

	memcpy(c, p, n);
	LLVMFuzzerTestOneInput(c, n);
	free(c);
	runs++;
}

static void mutate_all(const uint8_t *base, size_t n, uint64_t seed)
{
	uint8_t *m = malloc(n + 1);
	uint64_t x = seed | 1;

	run(base, n);
	for (int i = 1; i <= 8; i++)
		run(base, n * (size_t)i / 9);
	for (int i = 0; i < (int)ioc_test_scaled(40); i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		memcpy(m, base, n);
		if (!n)
			break;
		/* Half the flips land in the last 64 bytes (seek table). */
		size_t pos = (i & 1) ? (size_t)(x % n)
				     : n - 1 - (size_t)(x % (n < 64 ? n : 64));
		m[pos] ^= (uint8_t)(x >> 32 | 1);
		run(m, n);
	}
	free(m);
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
			mutate_all(b.p, b.len, seed++);
		}
	for (int fmt = 0; fmt < 2; fmt++) {
		compressed((enum ioc_zip_format)fmt, 65536, 4096, true, &b);
		mutate_all(b.p, b.len, seed++);
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
		mutate_all(dst, ob.pos, seed++);
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
			run(g, (size_t)(i * 61) % sizeof(g));
		}
	}
	free(b.p);
	ioc_test_diag("%lu inputs", runs);
	ASSERT_UGT(runs, 500);
}

/* The checked-in seed corpus, tests/zip/corpus/<target>/ (IOC_FUZZ_TARGET,
 * set by meson), or the directory given as the argument.  Missing or empty
 * is a failure: a corpus test that runs nothing proves nothing. */
static void test_saved_corpus(void)
{
	char path[1024], dflt[768];
	const char *dir = extra_dir;
	unsigned long files = 0;
	struct dirent *e;
	DIR *d;

	if (!dir) {
		const char *root = getenv("IOC_SOURCE_ROOT");

		ASSERT_NOT_NULL(root);
		snprintf(dflt, sizeof(dflt), "%.600s/tests/zip/corpus/%s", root,
			 IOC_FUZZ_TARGET);
		dir = dflt;
	}
	d = opendir(dir);
	if (!d)
		ioc_test_fail(__FILE__, __LINE__, "corpus %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		FILE *f;
		uint8_t *p;
		long n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		f = fopen(path, "rb");
		ASSERT_NOT_NULL(f);
		ASSERT_OK(fseek(f, 0, SEEK_END));
		n = ftell(f);
		ASSERT_GE(n, 0);
		rewind(f);
		p = malloc((size_t)n + 1);
		ASSERT_NOT_NULL(p);
		ASSERT_UEQ(fread(p, 1, (size_t)n, f), (size_t)n);
		run(p, (size_t)n);
		files++;
		free(p);
		fclose(f);
	}
	closedir(d);
	ioc_test_diag("%lu corpus files from %s", files, dir);
	ASSERT_UGT(files, 0);
}

int main(int argc, char **argv)
{
	static const struct ioc_test tests[] = {
		IOC_TEST(test_generated_corpus),
		IOC_TEST(test_saved_corpus),
	};

	if (argc > 1)
		extra_dir = argv[1];
	return ioc_test_run(tests, (int)IOC_ARRAY_SIZE(tests));
}
