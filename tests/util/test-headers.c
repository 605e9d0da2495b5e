/* Every public header compiles on its own and together (the umbrella). */
#include "iocore/iocore.h"
#include "iocore/iocore.h" /* include guards hold */

#include "tap.h"

static void test_umbrella_links(void)
{
	/* One symbol from each layer must resolve against libiocore. */
	ASSERT_NOT_NULL((void *)ioc_loop_new);
	ASSERT_NOT_NULL((void *)ioc_co_create);
	ASSERT_NOT_NULL((void *)ioc_pool_new);
	ASSERT_NOT_NULL((void *)ioc_wq_new);
	ASSERT_NOT_NULL((void *)ioc_blk_open);
	ASSERT_EQ(IOC_VERSION_MAJOR, 0);
}

IOC_TEST_MAIN(
	IOC_TEST(test_umbrella_links),
)
