/* Shared helpers for tests/zip: deterministic test data. */
#ifndef IOC_ZIP_TEST_UTIL_H
#define IOC_ZIP_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Compressible but not trivial: words from a small vocabulary chosen by an
 * xorshift generator, with stretches of random bytes and zeros. */
static inline void zt_fill(uint8_t *p, size_t n, uint64_t seed)
{
	static const char *words[] = { "iocore ", "zstd ", "block ", "frame ",
				       "worker ", "ring ", "0123456789 ", "\n" };
	uint64_t x = seed * 2654435761u + 88172645463325252ull;
	size_t i = 0;

	while (i < n) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if ((x & 63) == 0) {
			for (int k = 0; k < 64 && i < n; k++)
				p[i++] = (uint8_t)(x >> (k & 56));
		} else if ((x & 63) == 1) {
			for (int k = 0; k < 300 && i < n; k++)
				p[i++] = 0;
		} else {
			const char *w = words[x % 8];
			for (; *w && i < n; w++)
				p[i++] = (uint8_t)*w;
		}
	}
}

static inline uint8_t *zt_data(size_t n, uint64_t seed)
{
	uint8_t *p = malloc(n ? n : 1);

	if (p)
		zt_fill(p, n, seed);
	return p;
}

#endif
