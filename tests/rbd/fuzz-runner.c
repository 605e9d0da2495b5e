/*
 * Runs a fuzz target's entry point as an ordinary TAP test, so CI
 * exercises it without libFuzzer: the checked-in seeds of
 * tests/rbd/corpus/<target>/ (or the directory given as the argument, a
 * corpus saved by a real fuzzing run), each as it is, truncated at every
 * length, and with bytes replaced by the characters the syntax gives
 * meaning to (':', '@', '/', '\\', '=', NUL) at pseudo-random places.
 */
#include <dirent.h>

#include "tap.h"
#include "iocore/common.h"
#include "fuzz.h"

static const char *extra_dir;
static unsigned long runs;

static void run(const uint8_t *p, size_t n)
{
	/* A private copy, so a read past the end is caught on the exact
	 * allocation under ASan. */
	uint8_t *c = malloc(n ? n : 1);

	ASSERT_NOT_NULL(c);
	memcpy(c, p, n);
	LLVMFuzzerTestOneInput(c, n);
	free(c);
	runs++;
}

static void mutate_all(const uint8_t *base, size_t n, uint64_t seed)
{
	static const uint8_t special[] = { ':', '@', '/', '\\', '=', 0, 'r', 0xff };
	uint8_t *m = malloc(n + 1);
	uint64_t x = seed | 1;

	ASSERT_NOT_NULL(m);
	for (size_t k = 0; k <= n; k++)
		run(base, k);
	for (unsigned long i = 0; n && i < ioc_test_scaled(200); i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		memcpy(m, base, n);
		for (int f = 0; f < 1 + (int)(x >> 60) % 3; f++)
			m[(x >> (8 * f)) % n] = special[(x >> (40 + 3 * f)) % sizeof(special)];
		run(m, n);
	}
	free(m);
}

static void test_seed_corpus(void)
{
	char path[1024], dflt[768];
	const char *dir = extra_dir;
	unsigned long files = 0;
	struct dirent *e;
	DIR *d;

	if (!dir) {
		const char *root = getenv("IOC_SOURCE_ROOT");

		ASSERT_NOT_NULL(root);
		snprintf(dflt, sizeof(dflt), "%.600s/tests/rbd/corpus/%s", root,
			 IOC_FUZZ_TARGET);
		dir = dflt;
	}
	d = opendir(dir);
	if (!d)
		ioc_test_fail(__FILE__, __LINE__, "corpus %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		uint8_t p[4096];
		size_t n;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		f = fopen(path, "rb");
		ASSERT_NOT_NULL(f);
		n = fread(p, 1, sizeof(p), f);
		fclose(f);
		mutate_all(p, n, ++files);
	}
	closedir(d);
	ioc_test_diag("%lu corpus files from %s, %lu inputs", files, dir, runs);
	/* Missing or empty is a failure: a corpus test that runs nothing
	 * proves nothing. */
	ASSERT_UGT(files, 0);
}

int main(int argc, char **argv)
{
	static const struct ioc_test tests[] = {
		IOC_TEST(test_seed_corpus),
	};

	if (argc > 1)
		extra_dir = argv[1];
	return ioc_test_run(tests, (int)IOC_ARRAY_SIZE(tests));
}
