/* The error convention: -errno in, text out, either sign. */
#include <errno.h>
#include <string.h>

#include "iocore/common.h"
#include "tap.h"

static void test_strerror_signs(void)
{
	ASSERT_STR_EQ(ioc_strerror(-ENOMEM), ioc_strerror(ENOMEM));
	ASSERT_STR_EQ(ioc_strerror(-EINVAL), "Invalid argument");
	ASSERT_STR_EQ(ioc_strerror(0), "Success");
}

static void test_strerror_unknown(void)
{
	ASSERT_STR_EQ(ioc_strerror(-100000), "Unknown error");
}

static void test_version(void)
{
	ASSERT_STR_EQ(ioc_version(), "0.2.0");
}

static void test_clock_monotonic(void)
{
	int64_t a = ioc_now_ns(), b = ioc_now_ns();

	ASSERT_GT(a, 0);
	ASSERT_LE(a, b);
}

IOC_TEST_MAIN(
	IOC_TEST(test_strerror_signs),
	IOC_TEST(test_strerror_unknown),
	IOC_TEST(test_version),
	IOC_TEST(test_clock_monotonic),
)
