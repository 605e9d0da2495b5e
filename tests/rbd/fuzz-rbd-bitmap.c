/*
 * Fuzz target and hostile-object tests: the parser of the object that
 * holds an rbd image's persistent bitmaps (src/node/rbd-bitmap-format.c).
 * The cluster's contents are outside input, so every input must give
 * either entries that lie inside it or an error with a reason, and never
 * a read outside it.  Each input is parsed as it is and again with its
 * crc made right, so mutations reach past the checksum into the entries.
 * Standalone (IOC_FUZZ_STANDALONE): objects built by the builder (none,
 * one clean bitmap, one in use, three mixed) must parse back to what was
 * put in; every truncation of them is refused with a reason; and their
 * mutations run through the target.  --write-corpus writes the seeds.
 */
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "node/rbd-bitmap-format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *p, size_t n)
{
	struct rbm_entry *e = NULL;
	uint32_t count = 9;
	uint64_t covers;
	char err[256] = "";
	int r = ioc__rbm_parse(p, n, &e, &count, &covers, err, sizeof(err));

	if (r < 0) {
		if (!err[0] || e || count)
			abort();
		return;
	}
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *nm = (const uint8_t *)e[i].name;

		if (nm < p || nm + e[i].name_len > p + n || !e[i].name_len)
			abort();
		if (e[i].nbytes && (e[i].bits < p || e[i].nbytes > (uint64_t)(p + n - e[i].bits)))
			abort();
		if (!e[i].granularity || (e[i].granularity & (e[i].granularity - 1)))
			abort();
	}
	free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *c;

	check(data, size);
	if (size < RBM_HDR_LEN + RBM_CRC_LEN)
		return 0;
	c = malloc(size);
	if (!c)
		return 0;
	memcpy(c, data, size);
	{
		uint32_t crc = htole32((uint32_t)crc32(0, c, (uInt)(size - RBM_CRC_LEN)));

		memcpy(c + size - RBM_CRC_LEN, &crc, 4);
	}
	check(c, size);
	free(c);
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-standalone.h"

struct seed_bm {
	const char *name;
	uint32_t flags;
	uint64_t gran;
};

/* An object of the bitmaps given over size bytes; bits a pattern. */
static uint8_t *build(const struct seed_bm *v, int n, uint64_t size, size_t *len)
{
	uint64_t total = RBM_HDR_LEN + RBM_CRC_LEN;
	uint8_t *buf;
	size_t pos;

	for (int i = 0; i < n; i++)
		total += ioc__rbm_entry_len((uint32_t)strlen(v[i].name),
					    (v[i].flags & RBM_IN_USE) ? 0 :
					    ioc__rbm_bits_len(size, v[i].gran));
	buf = calloc(1, (size_t)total);
	ASSERT_NOT_NULL(buf);
	ioc__rbm_begin(buf, size, &pos);
	for (int i = 0; i < n; i++) {
		uint64_t nb = (v[i].flags & RBM_IN_USE) ? 0 : ioc__rbm_bits_len(size, v[i].gran);
		uint8_t *bits = ioc__rbm_put(buf, &pos, v[i].name, v[i].flags, v[i].gran, nb);

		for (uint64_t k = 0; k < nb; k++)
			bits[k] = (uint8_t)(k * 37 + (uint64_t)i);
	}
	*len = ioc__rbm_finish(buf, pos, (uint32_t)n);
	ASSERT_UEQ(*len, total);
	return buf;
}

static const struct seed_bm set1[] = { { "b0", RBM_AUTO, 65536 } };
static const struct seed_bm set2[] = { { "in-use", RBM_IN_USE | RBM_AUTO, 4096 } };
static const struct seed_bm set3[] = {
	{ "a", 0, 1u << 20 }, { "longer.name-with_chars", RBM_IN_USE, 65536 },
	{ "c", RBM_AUTO, 512 },
};
static const struct {
	const struct seed_bm *v;
	int n;
	uint64_t size;
} seeds[] = {
	{ NULL, 0, 1u << 30 }, { set1, 1, (1u << 30) + 4096 }, { set2, 1, 1u << 20 },
	{ set3, 3, 10u << 20 },
};

static void test_roundtrip(void)
{
	for (size_t s = 0; s < IOC_ARRAY_SIZE(seeds); s++) {
		struct rbm_entry *e;
		uint32_t count;
		uint64_t covers;
		size_t len;
		char err[256];
		uint8_t *buf = build(seeds[s].v, seeds[s].n, seeds[s].size, &len);

		ASSERT_EQ(ioc__rbm_parse(buf, len, &e, &count, &covers, err, sizeof(err)), 0);
		ASSERT_UEQ(count, (unsigned)seeds[s].n);
		ASSERT_UEQ(covers, seeds[s].size);
		for (int i = 0; i < seeds[s].n; i++) {
			ASSERT_UEQ(e[i].name_len, strlen(seeds[s].v[i].name));
			ASSERT_MEM_EQ(e[i].name, seeds[s].v[i].name, e[i].name_len);
			ASSERT_UEQ(e[i].flags, seeds[s].v[i].flags);
			ASSERT_UEQ(e[i].granularity, seeds[s].v[i].gran);
			if (!(e[i].flags & RBM_IN_USE)) {
				ASSERT_UEQ(e[i].nbytes, ioc__rbm_bits_len(seeds[s].size,
									 seeds[s].v[i].gran));
				ASSERT_UEQ(e[i].bits[1], (uint8_t)(37 + i));
			} else {
				ASSERT_UEQ(e[i].nbytes, 0);
			}
		}
		free(e);
		free(buf);
	}
}

/* Every truncation of every seed, with its crc made right or not, is
 * refused with a reason; so are a later version and a wrong magic. */
static void test_hostile(void)
{
	for (size_t s = 0; s < IOC_ARRAY_SIZE(seeds); s++) {
		size_t len;
		uint8_t *buf = build(seeds[s].v, seeds[s].n, seeds[s].size, &len);

		for (size_t cut = 0; cut < len; cut++) {
			struct rbm_entry *e;
			uint32_t count;
			uint64_t covers;
			char err[256] = "";
			uint8_t *c = malloc(cut ? cut : 1);

			ASSERT_NOT_NULL(c);
			memcpy(c, buf, cut);
			if (cut >= RBM_HDR_LEN + RBM_CRC_LEN) {
				uint32_t crc = htole32((uint32_t)crc32(0, c, (uInt)(cut - 4)));

				memcpy(c + cut - 4, &crc, 4);
			}
			ASSERT_LT(ioc__rbm_parse(c, cut, &e, &count, &covers, err, sizeof(err)), 0);
			ASSERT_TRUE(err[0] != 0);
			LLVMFuzzerTestOneInput(c, cut);
			free(c);
		}
		{
			struct rbm_entry *e;
			uint32_t count;
			uint64_t covers;
			char err[256];

			buf[8] = 2;    /* version 2 */
			ASSERT_EQ(ioc__rbm_parse(buf, len, &e, &count, &covers, err, sizeof(err)),
				  -ENOTSUP);
			buf[0] = 'X';
			ASSERT_EQ(ioc__rbm_parse(buf, len, &e, &count, &covers, err, sizeof(err)),
				  -EINVAL);
		}
		free(buf);
	}
}

static void test_mutations(void)
{
	for (size_t s = 0; s < IOC_ARRAY_SIZE(seeds); s++) {
		size_t len;
		uint8_t *buf = build(seeds[s].v, seeds[s].n, seeds[s].size, &len);
		struct ioc_fuzz_mut m = { .seed = s + 1 };

		ioc_fuzz_mutate(buf, len, &m);
		free(buf);
	}
}

static void write_corpus(const char *dir)
{
	for (size_t s = 0; s < IOC_ARRAY_SIZE(seeds); s++) {
		char name[32];
		size_t len;
		uint8_t *buf = build(seeds[s].v, seeds[s].n, seeds[s].size, &len);

		snprintf(name, sizeof(name), "seed-%zu", s);
		ioc_fuzz_write(dir, name, buf, len);
		free(buf);
	}
}

IOC_FUZZ_MAIN(write_corpus, IOC_TEST(test_roundtrip), IOC_TEST(test_hostile),
	      IOC_TEST(test_mutations))
#endif
