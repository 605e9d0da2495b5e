/*
 * ioc_loop_free() with work still posted: tasks are dropped unread, even
 * when an extension's free function releases the memory they live in (the
 * thread pool's completion ports do).  ASan turns a read of such a task into
 * a failure; the plain build checks that no dropped task ever runs.
 *
 * And a loop freed as soon as ioc_loop_run() returns, while the thread that
 * called ioc_loop_stop() may still be inside it (the lifetime rule at
 * ioc_loop_free()): ThreadSanitizer reports a stopper that touches the loop
 * after its stop became visible.
 */
#include <pthread.h>
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

/* Round hand-off from the owner to the stopper. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct ioc_loop *round_loop;
static unsigned round_no;
static bool quit;

static void *stopper_main(void *arg)
{
	unsigned seen = 0;

	(void)arg;
	for (;;) {
		struct ioc_loop *loop;

		pthread_mutex_lock(&lock);
		while (round_no == seen && !quit)
			pthread_cond_wait(&cond, &lock);
		if (quit) {
			pthread_mutex_unlock(&lock);
			return NULL;
		}
		seen = round_no;
		loop = round_loop;
		pthread_mutex_unlock(&lock);
		ioc_loop_stop(loop);
	}
}

/* Keeps the loop busy, so that it sees the stop request on its own rather
 * than being woken for it. */
static void busy_cb(void *opaque)
{
	ioc_bh_schedule(*(struct ioc_bh **)opaque);
}

static void test_free_right_after_stop(void)
{
	unsigned rounds = (unsigned)ioc_test_scaled(1000);
	pthread_t tid;

	ASSERT_EQ(pthread_create(&tid, NULL, stopper_main, NULL), 0);
	for (unsigned r = 0; r < rounds; r++) {
		struct ioc_loop *loop;
		struct ioc_bh *busy;

		ASSERT_OK(ioc_loop_new(&loop, NULL));
		ioc_loop_set_current(loop);
		busy = ioc_bh_new(loop, busy_cb, &busy);
		ASSERT_NOT_NULL(busy);
		/* Every other round the loop is left idle, so that the
		 * stop has to wake it. */
		if (r & 1)
			ioc_bh_schedule(busy);
		pthread_mutex_lock(&lock);
		round_loop = loop;
		round_no++;
		pthread_cond_broadcast(&cond);
		pthread_mutex_unlock(&lock);
		ASSERT_OK(ioc_loop_run(loop));
		ioc_bh_delete(busy);
		ioc_loop_free(loop);
	}
	pthread_mutex_lock(&lock);
	quit = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	pthread_join(tid, NULL);
	ioc_test_diag("%u rounds", rounds);
}

IOC_TEST_MAIN(
	IOC_TEST(test_posted_tasks_in_ext_memory),
	IOC_TEST(test_pending_bh_not_run),
	IOC_TEST(test_free_right_after_stop),
)
