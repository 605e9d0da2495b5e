/* The tools' size parser: suffixes, bases, garbage and overflow. */
#include <errno.h>

#include "parse-size.h"
#include "tap.h"

static void test_plain_and_suffixes(void)
{
	uint64_t v;

	ASSERT_OK(ioc_tool_parse_size("4096", &v));
	ASSERT_UEQ(v, 4096);
	ASSERT_OK(ioc_tool_parse_size("0x1000", &v));
	ASSERT_UEQ(v, 4096);
	ASSERT_OK(ioc_tool_parse_size("64K", &v));
	ASSERT_UEQ(v, 65536);
	ASSERT_OK(ioc_tool_parse_size("4m", &v));
	ASSERT_UEQ(v, 4u << 20);
	ASSERT_OK(ioc_tool_parse_size("1GB", &v));
	ASSERT_UEQ(v, 1ull << 30);
	ASSERT_OK(ioc_tool_parse_size("2T", &v));
	ASSERT_UEQ(v, 2ull << 40);
	ASSERT_OK(ioc_tool_parse_size("0", &v));
	ASSERT_UEQ(v, 0);
}

static void test_garbage(void)
{
	uint64_t v = 7;

	ASSERT_EQ(ioc_tool_parse_size("", &v), -EINVAL);
	ASSERT_EQ(ioc_tool_parse_size("K", &v), -EINVAL);
	ASSERT_EQ(ioc_tool_parse_size("12Q", &v), -EINVAL);
	ASSERT_EQ(ioc_tool_parse_size("1MX", &v), -EINVAL);
	ASSERT_EQ(ioc_tool_parse_size("-1", &v), -EINVAL);
	ASSERT_UEQ(v, 7); /* untouched on error */
}

static void test_overflow(void)
{
	uint64_t v = 7;

	ASSERT_EQ(ioc_tool_parse_size("99999999999T", &v), -ERANGE);
	ASSERT_EQ(ioc_tool_parse_size("99999999999999999999999", &v), -ERANGE);
	ASSERT_OK(ioc_tool_parse_size("16777215T", &v));
	ASSERT_UEQ(v, 16777215ull << 40);
	ASSERT_EQ(ioc_tool_parse_size("16777216T", &v), -ERANGE);
}

IOC_TEST_MAIN(
	IOC_TEST(test_plain_and_suffixes),
	IOC_TEST(test_garbage),
	IOC_TEST(test_overflow),
)
