/*
 * The standalone form of every fuzz target (built with IOC_FUZZ_STANDALONE):
 * an ordinary TAP test that feeds the target's LLVMFuzzerTestOneInput its
 * seeds and deterministic mutations of them, so the suite and CI exercise
 * each target without libFuzzer; the same source, without the macro, is
 * the libFuzzer binary.
 *
 * What every target shares lives here: a run on a private copy of the
 * input (so ASan catches a read one past the end on the exact
 * allocation), the mutation engine (truncations, bit flips, random and
 * meaningful bytes, runs of 0xff, splices of two seeds, edits aimed at the
 * tail where trailers and seek tables live), reading a corpus directory
 * (the checked-in one under IOC_SOURCE_ROOT, or one given on the command
 * line, saved by a real fuzzing run), writing seeds as a corpus, and main:
 *   test-X                     the target's cases
 *   test-X DIR                 the same, DIR for the checked-in corpus
 *   test-X --write-corpus DIR  the generated seeds as files, for libFuzzer
 * What each target keeps: its own cases (which seeds, what a valid seed
 * must do) and its checks.  Every mutation is seeded, so a failure
 * reproduces.  Rejected: a runner library per directory (there were four
 * copies), and libFuzzer's -runs=N mode in the suite (needs clang and
 * -fsanitize=fuzzer on every build, gcc and the cross build included).
 */
#ifndef IOC_TEST_FUZZ_STANDALONE_H
#define IOC_TEST_FUZZ_STANDALONE_H

#include <dirent.h>
#include <stdint.h>

#include "iocore/common.h"
#include "tap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long ioc_fuzz_runs;    /* inputs run so far */
static const char *ioc_fuzz_dir;       /* a corpus directory from argv */

/* One input, on a private copy; LLVMFuzzerTestOneInput's value. */
static inline int ioc_fuzz_run(const void *p, size_t n)
{
	uint8_t *c = malloc(n ? n : 1);
	int r;

	ASSERT_NOT_NULL(c);
	memcpy(c, p, n);
	r = LLVMFuzzerTestOneInput(c, n);
	free(c);
	ioc_fuzz_runs++;
	return r;
}

static inline uint64_t ioc_fuzz_rand(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* How ioc_fuzz_mutate() edits a seed.  Zero fields take the defaults. */
struct ioc_fuzz_mut {
	unsigned rounds;          /* mutated copies (scaled); default 200 */
	const uint8_t *special;   /* bytes the syntax gives meaning to */
	size_t nspecial;          /* default: 0, 0xff, 0x7f, 0x80 */
	size_t head;              /* half the edits land in the first head bytes */
	size_t tail;              /* half the edits land in the last tail bytes */
	const void *other;        /* a second seed to splice from */
	size_t other_n;
	uint64_t seed;
	int (*run)(const void *p, size_t n);   /* default ioc_fuzz_run */
};

/* base as it is, cut at every length (at 32 lengths past 256 bytes),
 * then m->rounds copies with 1 to 4 edits each. */
static inline void ioc_fuzz_mutate(const void *base, size_t n, const struct ioc_fuzz_mut *m)
{
	static const uint8_t dflt[] = { 0, 0xff, 0x7f, 0x80 };
	const uint8_t *sp = m->special ? m->special : dflt;
	size_t nsp = m->special ? m->nspecial : sizeof(dflt);
	int (*run)(const void *, size_t) = m->run ? m->run : ioc_fuzz_run;
	unsigned long rounds = ioc_test_scaled(m->rounds ? m->rounds : 200);
	uint64_t x = m->seed * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *b = malloc(n + 1);

	ASSERT_NOT_NULL(b);
	run(base, n);
	for (size_t k = 0; k < n; k += n <= 256 ? 1 : n / 32 + 1)
		run(base, k);
	for (unsigned long i = 0; n && i < rounds; i++) {
		size_t len = n;

		memcpy(b, base, n);
		for (int e = 0, edits = 1 + (int)(ioc_fuzz_rand(&x) % 4); e < edits; e++) {
			uint64_t r = ioc_fuzz_rand(&x);
			size_t at = (m->tail && (r & 1)) ?
				len - 1 - (size_t)(r >> 8) % (len < m->tail ? len : m->tail) :
				(m->head && (r & 1)) ?
				(size_t)(r >> 8) % (len < m->head ? len : m->head) :
				(size_t)(r >> 8) % len;

			switch ((r >> 1) % 6) {
			case 0: b[at] ^= (uint8_t)(1u << ((r >> 4) % 8)); break;
			case 1: b[at] = (uint8_t)(r >> 40); break;
			case 2: b[at] = nsp ? sp[(r >> 40) % nsp] : 0; break;
			case 3: memset(b + at, 0xff, len - at < 4 ? len - at : 4); break;
			case 4: len = at ? at : len; break;
			default:
				if (m->other && m->other_n) {
					size_t from = (size_t)(r >> 32) % m->other_n;
					size_t k = m->other_n - from < len - at ? m->other_n - from
										 : len - at;

					memcpy(b + at, (const uint8_t *)m->other + from, k);
				}
				break;
			}
		}
		run(b, len);
	}
	free(b);
}

typedef void ioc_fuzz_file_fn(const char *name, const uint8_t *p, size_t n, void *opaque);

/* Each file of the corpus: the directory from argv, or subdir under
 * IOC_SOURCE_ROOT (NULL: none is checked in, the case skips without an
 * argument).  Missing or empty fails the case: a corpus test that runs
 * nothing proves nothing. */
static inline unsigned long ioc_fuzz_corpus(const char *subdir, ioc_fuzz_file_fn *fn,
					    void *opaque)
{
	char path[4096], dflt[2048];
	const char *dir = ioc_fuzz_dir;
	unsigned long files = 0;
	struct dirent *e;
	DIR *d;

	if (!dir && !subdir)
		IOC_SKIP("no corpus directory given");
	if (!dir) {
		const char *root = getenv("IOC_SOURCE_ROOT");

		ASSERT_NOT_NULL(root);
		snprintf(dflt, sizeof(dflt), "%.1000s/%.1000s", root, subdir);
		dir = dflt;
	}
	d = opendir(dir);
	if (!d)
		ioc_test_fail(__FILE__, __LINE__, "corpus %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		uint8_t *p;
		long n;
		FILE *f;

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
		fclose(f);
		fn(e->d_name, p, (size_t)n, opaque);
		free(p);
		files++;
	}
	closedir(d);
	ioc_test_diag("%lu corpus files from %s, %lu inputs so far", files, dir, ioc_fuzz_runs);
	ASSERT_UGT(files, 0);
	return files;
}

/* One seed as DIR/NAME, for --write-corpus; exits 1 when it cannot. */
static inline void ioc_fuzz_write(const char *dir, const char *name, const void *p, size_t n)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* main: the cases given, or write_corpus(DIR) for --write-corpus DIR (NULL:
 * the target's corpus is the checked-in one); with _SETUP, setup() first
 * (where a missing tool skips the whole file). */
#define IOC_FUZZ_MAIN(write_corpus, ...) IOC_FUZZ_MAIN_SETUP(NULL, write_corpus, __VA_ARGS__)
#define IOC_FUZZ_MAIN_SETUP(setup, write_corpus, ...)                           \
	int main(int argc, char **argv)                                         \
	{                                                                       \
		static const struct ioc_test ioc_fuzz_cases[] = { __VA_ARGS__ }; \
		void (*wc)(const char *) = (write_corpus);                      \
		void (*su)(void) = (setup);                                     \
		if (su)                                                         \
			su();                                                   \
		if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) {      \
			if (!wc) {                                              \
				fprintf(stderr, "no generated seeds: the corpus " \
					"is checked in\n");                     \
				return 1;                                       \
			}                                                       \
			wc(argv[2]);                                            \
			return 0;                                               \
		}                                                               \
		if (argc > 1)                                                   \
			ioc_fuzz_dir = argv[1];                                 \
		return ioc_test_run(ioc_fuzz_cases,                             \
				    (int)IOC_ARRAY_SIZE(ioc_fuzz_cases));       \
	}

#endif
