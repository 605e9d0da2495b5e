/*
 * Limits changed at run time: shrinking max while every worker is busy
 * makes the extra workers exit after their current job, and from then on
 * no more than max jobs run at once; raising max lets the pool grow again.
 */
#include <pthread.h>
#include <sched.h>

#include "iocore/pool.h"
#include "tap.h"

struct board {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned running, max_running, started;
	unsigned rendezvous;        /* jobs wait until this many started */
	bool open;                  /* or until the gate opens */
};

static struct board b = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };

static int64_t job_fn(void *arg)
{
	pthread_mutex_lock(&b.lock);
	b.started++;
	if (++b.running > b.max_running)
		b.max_running = b.running;
	pthread_cond_broadcast(&b.cond);
	while (!b.open && !(b.rendezvous && b.started >= b.rendezvous))
		pthread_cond_wait(&b.cond, &b.lock);
	b.running--;
	pthread_mutex_unlock(&b.lock);
	return 1;
}

static void job_done(void *opaque, int64_t ret)
{
	unsigned *left = opaque;

	ASSERT_EQ(ret, 1);
	--*left;
}

static void wave_reset(unsigned rendezvous)
{
	pthread_mutex_lock(&b.lock);
	b.running = b.max_running = b.started = 0;
	b.rendezvous = rendezvous;
	b.open = false;
	pthread_mutex_unlock(&b.lock);
}

static void open_gate(void)
{
	pthread_mutex_lock(&b.lock);
	b.open = true;
	pthread_cond_broadcast(&b.cond);
	pthread_mutex_unlock(&b.lock);
}

/* Past one thread per CPU the pool grows from the submitting loop (it
 * looks again while jobs wait), so keep the loop turning meanwhile. */
static void wait_started(struct ioc_loop *loop, unsigned n)
{
	for (;;) {
		bool ok;

		pthread_mutex_lock(&b.lock);
		ok = b.started >= n;
		pthread_mutex_unlock(&b.lock);
		if (ok)
			return;
		ioc_loop_poll(loop, false);
		sched_yield();
	}
}

static void test_shrink_while_busy(void)
{
	struct ioc_pool_opts o = { .max_threads = 6, .name = "limits" };
	struct ioc_pool_req reqs[40];
	struct ioc_pool_stats st;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	unsigned left;
	int64_t deadline;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc_pool_new(&pool, &o));

	/* Wave 1: six jobs that hold six workers until the gate opens. */
	wave_reset(0);
	left = 6;
	for (int i = 0; i < 6; i++)
		ioc_pool_submit(pool, &reqs[i], job_fn, NULL, job_done, &left);
	wait_started(loop, 6);
	ioc_pool_get_stats(pool, &st);
	ASSERT_UEQ(st.threads, 6);
	ASSERT_OK(ioc_pool_set_limits(pool, 0, 2));
	open_gate();
	while (left)
		ioc_loop_poll(loop, true);

	/* Wave 2: forty gated jobs; at most two may run. */
	wave_reset(0);
	left = 40;
	for (int i = 0; i < 40; i++)
		ioc_pool_submit(pool, &reqs[i], job_fn, NULL, job_done, &left);
	wait_started(loop, 2);
	/* The four extra workers exit (they finished their wave-1 job);
	 * had any of them taken a wave-2 job it would now be stuck at the
	 * gate and this would not converge. */
	deadline = ioc_now_ns() + 5000000000LL;
	do {
		sched_yield();
		ioc_pool_get_stats(pool, &st);
	} while (st.threads > 2 && ioc_now_ns() < deadline);
	ASSERT_UEQ(st.threads, 2);
	pthread_mutex_lock(&b.lock);
	ASSERT_EQ(b.max_running, 2);
	ASSERT_EQ(b.started, 2);
	pthread_mutex_unlock(&b.lock);
	open_gate();
	while (left)
		ioc_loop_poll(loop, true);
	ASSERT_LE(b.max_running, 2);

	/* Wave 3: raise max; five jobs that need five threads at once. */
	ASSERT_OK(ioc_pool_set_limits(pool, 0, 5));
	wave_reset(5);
	left = 5;
	for (int i = 0; i < 5; i++)
		ioc_pool_submit(pool, &reqs[i], job_fn, NULL, job_done, &left);
	while (left)
		ioc_loop_poll(loop, true);
	ASSERT_EQ(b.max_running, 5);
	ioc_pool_get_stats(pool, &st);
	ASSERT_ULE(st.threads, 5);
	ioc_pool_free(pool);
	ioc_loop_free(loop);
}

IOC_TEST_MAIN(
	IOC_TEST(test_shrink_while_busy),
)
