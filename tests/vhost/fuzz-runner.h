/*
 * The standalone mode of the vhost fuzz targets (IOC_FUZZ_STANDALONE), on
 * the shared runner (tests/harness/fuzz-standalone.h): the target builds
 * its starting inputs in make_inputs() (up to MAX_INPUTS buffers, filled
 * with put()), each is run and mutated (splices from the next input
 * included), and fuzz_report() says whether the runs reached far enough
 * (a mutation run that never got past the first check proves little).
 * "--write-corpus DIR" stores the starting inputs for a libFuzzer run:
 *   test-vhost-fuzz-msg --write-corpus corpus/ && fuzz-vhost-msg corpus/
 */
#ifndef IOC_VHOST_FUZZ_RUNNER_H
#define IOC_VHOST_FUZZ_RUNNER_H

#include "fuzz-standalone.h"

#define MAX_INPUTS 32
#define INPUT_MAX  (128 * 1024)

struct input {
	unsigned char b[INPUT_MAX];
	size_t n;
};

static inline void put(struct input *in, const void *p, size_t n)
{
	if (in->n + n > sizeof(in->b))
		abort();
	memcpy(in->b + in->n, p, n);
	in->n += n;
}

static unsigned make_inputs(struct input *in);
static bool fuzz_report(void);

static struct input fuzz_ins[MAX_INPUTS];

static void test_inputs(void)
{
	unsigned n = make_inputs(fuzz_ins);

	for (unsigned k = 0; k < n; k++) {
		const struct input *o = &fuzz_ins[(k + 1) % n];
		struct ioc_fuzz_mut m = { .rounds = 300, .other = o->b, .other_n = o->n,
					  .seed = k + 1 };

		ioc_fuzz_mutate(fuzz_ins[k].b, fuzz_ins[k].n, &m);
	}
	ioc_test_diag("%u inputs, %lu runs", n, ioc_fuzz_runs);
	ASSERT_TRUE(fuzz_report());
}

static void write_corpus(const char *dir)
{
	unsigned n = make_inputs(fuzz_ins);

	for (unsigned k = 0; k < n; k++) {
		char name[32];

		snprintf(name, sizeof(name), "input-%02u", k);
		ioc_fuzz_write(dir, name, fuzz_ins[k].b, fuzz_ins[k].n);
	}
}

IOC_FUZZ_MAIN(write_corpus, IOC_TEST(test_inputs))

#endif
