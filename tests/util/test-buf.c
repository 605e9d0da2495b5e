/* Growing buffers and arrays by doubling: the capacity each call ends
 * with, the contents kept, and a request that cannot fit refused. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "tap.h"

static void test_buf_doubles_from_min(void)
{
	size_t cap = 0;
	char *b = ioc__buf_grow(NULL, &cap, 1, 16);

	ASSERT_NOT_NULL(b);
	ASSERT_UEQ(cap, 16);
	memcpy(b, "0123456789abcdef", 16);
	b = ioc__buf_grow(b, &cap, 17, 16);
	ASSERT_NOT_NULL(b);
	ASSERT_UEQ(cap, 32);
	ASSERT_MEM_EQ(b, "0123456789abcdef", 16);
	/* Far past the capacity: doubled as often as it takes. */
	b = ioc__buf_grow(b, &cap, 1000, 16);
	ASSERT_NOT_NULL(b);
	ASSERT_UEQ(cap, 1024);
	ASSERT_MEM_EQ(b, "0123456789abcdef", 16);
	free(b);
}

static void test_array_counts_elements(void)
{
	size_t cap = 0;
	uint64_t *a = ioc__array_grow(NULL, &cap, 1, 4, sizeof(*a));

	ASSERT_NOT_NULL(a);
	ASSERT_UEQ(cap, 4);
	for (unsigned i = 0; i < 4; i++)
		a[i] = 0x0101010101010101ull * i;
	a = ioc__array_grow(a, &cap, 9, 4, sizeof(*a));
	ASSERT_NOT_NULL(a);
	ASSERT_UEQ(cap, 16);
	/* Every element of the new capacity is there to be written. */
	for (unsigned i = 4; i < 16; i++)
		a[i] = i;
	for (unsigned i = 0; i < 4; i++)
		ASSERT_UEQ(a[i], 0x0101010101010101ull * i);
	free(a);
}

static void test_array_overflow_refused(void)
{
	size_t cap = 4;
	uint64_t *a = malloc(4 * sizeof(*a)), *p;

	ASSERT_NOT_NULL(a);
	a[3] = 42;
	/* need * elem does not fit in a size_t: NULL, a and cap unchanged. */
	p = ioc__array_grow(a, &cap, SIZE_MAX / 4, 4, sizeof(*a));
	ASSERT_NULL(p);
	ASSERT_UEQ(cap, 4);
	ASSERT_UEQ(a[3], 42);
	/* A capacity that doubling cannot reach without wrapping. */
	p = ioc__array_grow(a, &cap, SIZE_MAX, 4, 1);
	ASSERT_NULL(p);
	ASSERT_UEQ(cap, 4);
	free(a);
}

IOC_TEST_MAIN(
	IOC_TEST(test_buf_doubles_from_min),
	IOC_TEST(test_array_counts_elements),
	IOC_TEST(test_array_overflow_refused),
)
