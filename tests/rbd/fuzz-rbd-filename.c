/*
 * Fuzz target: the "rbd:" file-name parser.  The input, as a string, is
 * parsed; a result must be an object with non-empty pool and image
 * strings, and parsing the same name twice must give equal objects (the
 * parser works on a private copy and keeps no state).
 */
#include <stdlib.h>
#include <string.h>

#include "node/rbd.h"
#include "fuzz.h"

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
