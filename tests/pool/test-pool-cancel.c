/*
 * Cancellation: a request that has not started completes with -ECANCELED
 * and never runs; one that started (or finished) cannot be cancelled
 * (-EBUSY) and completes with its own result; cancel racing with workers
 * starting requests always lands on one side or the other, exactly once.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "iocore/pool.h"
#include "src/pool/pool-int.h"
#include "tap.h"

struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool started, open;
};

static int64_t gate_fn(void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->lock);
	g->started = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->open)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	return 42;
}

struct job {
	struct ioc_pool_req req;
	atomic_int ran;
	int completions;
	int64_t ret;
	bool cancel_ok;
	unsigned *left;
};

static int64_t job_fn(void *arg)
{
	struct job *j = arg;

	/* Pairs with nothing: read after the completion's own ordering. */
	atomic_fetch_add_explicit(&j->ran, 1, memory_order_relaxed);
	return 7;
}

static void job_done(void *opaque, int64_t ret)
{
	struct job *j = opaque;

	j->completions++;
	j->ret = ret;
	--*j->left;
}

static void check_job(struct job *j)
{
	int ran = atomic_load_explicit(&j->ran, memory_order_relaxed);

	ASSERT_EQ(j->completions, 1);
	if (j->cancel_ok) {
		ASSERT_EQ(j->ret, -ECANCELED);
		ASSERT_EQ(ran, 0);
	} else {
		ASSERT_EQ(j->ret, 7);
		ASSERT_EQ(ran, 1);
	}
}

static void test_cancel_states(void)
{
	struct gate g = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };
	struct ioc_pool_opts o = { .max_threads = 1 };
	struct ioc_pool_req gate_req;
	struct job jobs[10] = { 0 };
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	struct ioc_pool_stats st;
	unsigned left = 11;
	struct job gate_job = { .left = &left };

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc_pool_new(&pool, &o));

	ioc_pool_submit(pool, &gate_req, gate_fn, &g, job_done, &gate_job);
	/* Pending (not yet handed to the workers) can be cancelled... */
	for (int i = 0; i < 10; i++) {
		jobs[i].left = &left;
		ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i],
				job_done, &jobs[i]);
	}
	ASSERT_EQ(ioc_pool_cancel(pool, &jobs[0].req), 0);
	jobs[0].cancel_ok = true;
	ASSERT_EQ(ioc_pool_cancel(pool, &jobs[0].req), -EBUSY);
	/* ...and so can queued ones, behind the blocked worker. */
	while (!({ bool s; pthread_mutex_lock(&g.lock); s = g.started;
		   pthread_mutex_unlock(&g.lock); s; }))
		ioc_loop_poll(loop, false);
	ASSERT_EQ(ioc_pool_cancel(pool, &gate_req), -EBUSY); /* running */
	for (int i = 1; i < 10; i += 2) {
		ASSERT_EQ(ioc_pool_cancel(pool, &jobs[i].req), 0);
		jobs[i].cancel_ok = true;
	}
	pthread_mutex_lock(&g.lock);
	g.open = true;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	while (left)
		ioc_loop_poll(loop, true);
	ASSERT_EQ(gate_job.ret, 42);
	for (int i = 0; i < 10; i++)
		check_job(&jobs[i]);
	/* Finished: -EBUSY. */
	ASSERT_EQ(ioc_pool_cancel(pool, &jobs[2].req), -EBUSY);
	ioc_pool_get_stats(pool, &st);
	ASSERT_UEQ(st.cancelled, 6);
	ASSERT_UEQ(st.completed, 11);
	ioc_pool_free(pool);
	ioc_loop_free(loop);
}

static void race(uint32_t ablation)
{
	enum { K = 64 };
	struct ioc_pool_opts o = { .max_threads = 2 };
	unsigned rounds = ioc_test_scaled(400);
	int64_t deadline = ioc_now_ns() + 4000000000LL;
	uint64_t n_cancelled = 0, n_ran = 0;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	struct job *jobs = calloc(K, sizeof(*jobs));
	unsigned seed = 12345;

	ASSERT_NOT_NULL(jobs);
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc__pool_new_ablated(&pool, &o, ablation));
	for (unsigned r = 0; r < rounds && ioc_now_ns() < deadline; r++) {
		unsigned left = K;

		memset(jobs, 0, K * sizeof(*jobs));
		for (int i = 0; i < K; i++) {
			jobs[i].left = &left;
			ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i],
					job_done, &jobs[i]);
		}
		/* Cancel in a scrambled order while the workers start them,
		 * letting the loop hand submissions over now and then. */
		for (int i = 0; i < K; i++) {
			int k = (int)((i * 37 + r) % K);
			int rc;

			seed = seed * 1103515245 + 12345;
			if ((seed >> 16) % 4 == 0)
				ioc_loop_poll(loop, false);
			rc = ioc_pool_cancel(pool, &jobs[k].req);
			ASSERT_TRUE(rc == 0 || rc == -EBUSY);
			jobs[k].cancel_ok = rc == 0;
		}
		while (left)
			ioc_loop_poll(loop, true);
		for (int i = 0; i < K; i++) {
			check_job(&jobs[i]);
			n_cancelled += jobs[i].cancel_ok;
			n_ran += !jobs[i].cancel_ok;
		}
	}
	ioc_test_diag("ablation %u: %" PRIu64 " cancelled, %" PRIu64 " ran",
		      ablation, n_cancelled, n_ran);
	ioc_pool_free(pool);
	ioc_loop_free(loop);
	free(jobs);
}

static void test_cancel_race_batched(void)
{
	race(0);
}

static void test_cancel_race_unbatched(void)
{
	race(IOC__POOL_NO_SUBMIT_BATCH);
}

IOC_TEST_MAIN(
	IOC_TEST(test_cancel_states),
	IOC_TEST(test_cancel_race_batched),
	IOC_TEST(test_cancel_race_unbatched),
)
