#include <stdint.h>
#include <stdlib.h>

#include "buf.h"

void *ioc__buf_grow(void *buf, size_t *cap, size_t need, size_t min)
{
	return ioc__array_grow(buf, cap, need, min, 1);
}

void *ioc__array_grow(void *a, size_t *cap, size_t need, size_t min, size_t elem)
{
	size_t c = *cap ? *cap : min;
	void *p;

	while (c < need) {
		if (c > SIZE_MAX / 2)
			return NULL;
		c *= 2;
	}
	if (c > SIZE_MAX / elem)
		return NULL;
	p = realloc(a, c * elem);
	if (p)
		*cap = c;
	return p;
}
