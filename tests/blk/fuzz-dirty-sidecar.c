/*
 * Fuzz target for the dirty-bitmap sidecar parser (ioc__blk_dirty_parse in
 * src/blk/dirty-bitmap.c): the input is a whole sidecar file, checked
 * against the image size its header claims and against 1 MiB, under the
 * name "x".  It must accept or refuse (-EUCLEAN), never read outside the
 * buffer.
 *
 * Built two ways, like tests/nbd/fuzz-nbd.c: a libFuzzer target with
 * -Dfuzz=true and clang, and always an ordinary test (IOC_FUZZ_STANDALONE):
 * a real sidecar written by the block layer, then every single-byte flip
 * of its header and words and every truncation must be refused (the
 * checksums see them), and random damage must never crash.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/blk/blk-int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int parse(const uint8_t *data, size_t size, uint64_t image_size)
{
	const uint8_t *words;
	uint64_t gran;
	uint32_t flags;
	int r = ioc__blk_dirty_parse(data, size, image_size, "x", &gran, &flags, &words);

	if (r == 0) {
		/* Touch every word the parser vouched for. */
		uint64_t nw = (image_size / gran + 64) / 64, acc = 0;

		for (uint64_t i = 0; i < nw && (size_t)(words - data) + i * 8 + 8 <= size; i++)
			acc += words[i * 8];
		(void)acc;
	} else if (r != -EUCLEAN) {
		abort();
	}
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t claimed = 0;

	if (size >= 24)
		memcpy(&claimed, data + 16, 8);
	parse(data, size, claimed);
	parse(data, size, 1 << 20);
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "../blk/blk-test.h"

static uint8_t *clean_sidecar(size_t *len, uint64_t *img_size)
{
	char *path = bt_make_image(NULL, "fz.img", 3u << 20, false), *sc;
	struct ioc_blk *blk;
	struct ioc_blk_opts o = { .aio = IOC_BLK_AIO_THREADS };
	uint8_t *buf;
	FILE *f;
	long n;

	bt_get_loop();
	ASSERT_OK(ioc_blk_open(&blk, path, &o));
	ASSERT_OK(ioc_blk_dirty_add(blk, &(struct ioc_blk_dirty_opts){
		.name = "x", .persistent = true, .granularity = 4096 }, NULL));
	for (uint64_t off = 0; off < (3u << 20); off += 3 * 65536 + 4096)
		ASSERT_OK(ioc__blk_dirty_mark(blk, off, 4096));
	ioc_blk_close(blk);
	ASSERT_GT(asprintf(&sc, "%s.x.iocbm", path), 0);
	f = fopen(sc, "rb");
	ASSERT_NOT_NULL(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n);
	ASSERT_EQ(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	unlink(sc);
	unlink(path);
	free(sc);
	free(path);
	*len = (size_t)n;
	*img_size = 3u << 20;
	return buf;
}

static void test_flips_and_cuts(void)
{
	uint64_t isz;
	size_t len;
	uint8_t *good = clean_sidecar(&len, &isz);

	ASSERT_EQ(parse(good, len, isz), 0);
	ASSERT_EQ(parse(good, len, isz + 4096), -EUCLEAN); /* the image grew */
	for (size_t i = 0; i < len; i++) {
		bool covered = i < 180 || i >= 4096;

		if (!covered)
			continue; /* header padding: unused, not checked */
		for (int bit = 0; bit < 8; bit += 3) {
			good[i] ^= (uint8_t)(1u << bit);
			if (parse(good, len, isz) != -EUCLEAN) {
				printf("# flip of bit %d at %zu accepted\n", bit, i);
				ASSERT_TRUE(false);
			}
			good[i] ^= (uint8_t)(1u << bit);
		}
	}
	for (size_t cut = 0; cut < len; cut += cut < 4200 ? 1 : 97)
		ASSERT_EQ(parse(good, cut, isz), -EUCLEAN);
	free(good);
}

static void test_random_damage(void)
{
	uint64_t isz, r = 0x9E3779B97F4A7C15ull;
	size_t len;
	uint8_t *good = clean_sidecar(&len, &isz);
	uint8_t *b = malloc(len);
	unsigned long rounds = ioc_test_scaled(5000);

	for (unsigned long i = 0; i < rounds; i++) {
		memcpy(b, good, len);
		for (int k = 0; k < 4; k++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			b[(r >> 17) % len] = (uint8_t)(r >> 40);
		}
		LLVMFuzzerTestOneInput(b, len - (r >> 50) % 64);
	}
	free(b);
	free(good);
}

IOC_TEST_MAIN(
	IOC_TEST(test_flips_and_cuts),
	IOC_TEST(test_random_damage),
)
#endif
