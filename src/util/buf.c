#include <stdlib.h>

#include "buf.h"

void *ioc__buf_grow(void *buf, size_t *cap, size_t need, size_t min)
{
	size_t c = *cap ? *cap : min;
	void *p;

	while (c < need)
		c *= 2;
	p = realloc(buf, c);
	if (p)
		*cap = c;
	return p;
}
