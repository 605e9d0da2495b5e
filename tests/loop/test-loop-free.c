/*
 * ioc_loop_free() with work still posted: tasks are dropped unread, even
 * when an extension's free function releases the memory they live in (the
 * thread pool's completion ports do).  ASan turns a read of such a task into
 * a failure; the plain build checks that no dropped task ever runs.
 */
#include <stdlib.h>

#include "iocore/loop.h"
#include "tap.h"

static int ran;

static void task_fn(struct ioc_task *t)
{
	(void)t;
	ran++;
}

struct ext_state {
	struct ioc_task tasks[8];
};

static void ext_free(void *p)
{
	struct ext_state *st = p;

	/* Poison first, so a plain build that walked the tasks would crash
	 * on the garbage next pointers instead of passing quietly. */
	memset(st, 0xa5, sizeof(*st));
	free(st);
}

static void test_posted_tasks_in_ext_memory(void)
{
	struct ioc_loop *loop;
	struct ext_state *st = calloc(1, sizeof(*st));

	ASSERT_NOT_NULL(st);
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	for (unsigned i = 0; i < 8; i++) {
		st->tasks[i].fn = task_fn;
		ioc_loop_post(loop, &st->tasks[i]);
	}
	/* The tasks sit on the loop's incoming stack when the ext is freed. */
	ioc_loop_set_ext(loop, IOC_LOOP_EXT_USER, st, ext_free);
	ioc_loop_free(loop);
	ASSERT_EQ(ran, 0);
}

static void bh_cb(void *opaque)
{
	(*(int *)opaque)++;
}

static void test_pending_bh_not_run(void)
{
	struct ioc_loop *loop;
	struct ioc_bh *bh;
	int n = 0;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	bh = ioc_bh_new(loop, bh_cb, &n);
	ASSERT_NOT_NULL(bh);
	ioc_bh_schedule(bh);
	ASSERT_OK(ioc_loop_oneshot(loop, bh_cb, &n));
	ioc_bh_delete(bh);
	ioc_loop_free(loop);
	ASSERT_EQ(n, 0);
}

IOC_TEST_MAIN(
	IOC_TEST(test_posted_tasks_in_ext_memory),
	IOC_TEST(test_pending_bh_not_run),
)
