/*
 * The standalone mode of the vhost fuzz targets (IOC_FUZZ_STANDALONE): an
 * ordinary TAP test that runs LLVMFuzzerTestOneInput over the target's
 * built-in starting inputs and deterministic mutations of them (bit
 * flips, byte sets, truncations, splices), so CI exercises the targets
 * without libFuzzer.  "--write-corpus DIR" stores the starting inputs as
 * a corpus for a libFuzzer run:
 *   test-vhost-fuzz-msg --write-corpus corpus/ && fuzz-vhost-msg corpus/
 * The target defines make_inputs(), filling up to MAX_INPUTS buffers.
 */
#ifndef IOC_VHOST_FUZZ_RUNNER_H
#define IOC_VHOST_FUZZ_RUNNER_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
/* The target's counts of what the runs reached; false fails the test
 * (a mutation run that never got past the first check proves little). */
static bool fuzz_report(void);

static uint64_t fuzz_rand_state = 0x9e3779b97f4a7c15ull;
static uint64_t fuzz_rand(void)
{
	uint64_t x = fuzz_rand_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return fuzz_rand_state = x;
}

int main(int argc, char **argv)
{
	static struct input ins[MAX_INPUTS], m;
	const char *scale = getenv("IOC_TEST_SCALE");
	int per = (int)(300 * (scale ? atof(scale) : 1.0));
	unsigned n = make_inputs(ins);

	if (per < 1)
		per = 1;
	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) {
		for (unsigned k = 0; k < n; k++) {
			char path[4096];
			FILE *f;

			snprintf(path, sizeof(path), "%s/input-%02u", argv[2], k);
			f = fopen(path, "wb");
			if (!f || fwrite(ins[k].b, 1, ins[k].n, f) != ins[k].n)
				return 1;
			fclose(f);
		}
		return 0;
	}
	printf("1..%u\n", n);
	for (unsigned k = 0; k < n; k++) {
		LLVMFuzzerTestOneInput(ins[k].b, ins[k].n);
		for (int i = 0; i < per; i++) {
			m = ins[k];
			int edits = 1 + (int)(fuzz_rand() % 4);

			for (int e = 0; e < edits && m.n; e++) {
				size_t pos = fuzz_rand() % m.n;

				switch (fuzz_rand() % 5) {
				case 0: m.b[pos] ^= (unsigned char)(1u << (fuzz_rand() % 8)); break;
				case 1: m.b[pos] = (unsigned char)fuzz_rand(); break;
				case 2: m.b[pos] = (fuzz_rand() & 1) ? 0xff : 0; break;
				case 3: m.n = pos; break;
				default: {
					/* Splice in bytes from another input. */
					const struct input *o = &ins[fuzz_rand() % n];
					size_t len = o->n ? fuzz_rand() % (o->n < 64 ? o->n : 64) : 0;

					if (pos + len <= m.n && len)
						memcpy(m.b + pos, o->b + fuzz_rand() % (o->n - len + 1), len);
				}
				}
			}
			LLVMFuzzerTestOneInput(m.b, m.n);
		}
		/* Reaching here is the check: no crash, no leak, no abort. */
		printf("ok %u - input %u and %d mutations\n", k + 1, k, per);
	}
	return fuzz_report() ? 0 : 1;
}

#endif
