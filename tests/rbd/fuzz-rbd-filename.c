/*
 * Fuzz target: the "rbd:" file-name parser.  The input, as a string, is
 * parsed; a result must be an object with non-empty pool and image
 * strings, and parsing the same name twice must give equal objects (the
 * parser works on a private copy and keeps no state).  Standalone
 * (IOC_FUZZ_STANDALONE): the checked-in seeds of tests/rbd/corpus/filename/,
 * each mutated with the characters the syntax gives meaning to.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node/rbd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256], *s = malloc(size + 5);
	json_t *a, *b;

	if (!s)
		return 0;
	/* Half the inputs get the prefix, so the fuzzer need not find it. */
	if (size && (data[0] & 1)) {
		memcpy(s, "rbd:", 4);
		memcpy(s + 4, data + 1, size - 1);
		s[size + 3] = '\0';
	} else {
		memcpy(s, data, size);
		s[size] = '\0';
	}
	a = ioc__rbd_parse_filename(s, err, sizeof(err));
	b = ioc__rbd_parse_filename(s, err, sizeof(err));
	if (!a != !b)
		abort();
	if (a) {
		const char *pool = json_string_value(json_object_get(a, "pool"));
		const char *image = json_string_value(json_object_get(a, "image"));

		if (!pool || !*pool || !image || !*image || !json_equal(a, b))
			abort();
	} else if (!err[0]) {
		abort();
	}
	json_decref(a);
	json_decref(b);
	free(s);
	return 0;
}

#ifdef IOC_FUZZ_STANDALONE
#include "fuzz-standalone.h"

static void one_seed(const char *name, const uint8_t *p, size_t n, void *opaque)
{
	static const uint8_t special[] = { ':', '@', '/', '\\', '=', 0, 'r', 0xff };
	struct ioc_fuzz_mut m = { .special = special, .nspecial = sizeof(special),
				  .seed = ++*(uint64_t *)opaque };

	(void)name;
	ioc_fuzz_mutate(p, n, &m);
}

static void test_seed_corpus(void)
{
	uint64_t k = 0;

	ioc_fuzz_corpus("tests/rbd/corpus/filename", one_seed, &k);
}

IOC_FUZZ_MAIN(NULL, IOC_TEST(test_seed_corpus))
#endif
