/*
 * Destroying a pool with requests still queued: the running one finishes
 * with its result, every queued or not-yet-handed-over one completes with
 * -ECANCELED without running, every callback runs exactly once, every
 * thread is joined and nothing leaks (ASan checks the last part).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "iocore/pool.h"
#include "src/pool/pool-int.h"
#include "tap.h"

enum { NQUEUED = 100 };

struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool started, open;
};

static struct gate g = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };

static int64_t gate_fn(void *arg)
{
	pthread_mutex_lock(&g.lock);
	g.started = true;
	pthread_cond_broadcast(&g.cond);
	while (!g.open)
		pthread_cond_wait(&g.cond, &g.lock);
	pthread_mutex_unlock(&g.lock);
	return 42;
}

struct job {
	struct ioc_pool_req req;
	atomic_int ran;
	int completions;
	int64_t ret;
};

static int64_t job_fn(void *arg)
{
	struct job *j = arg;

	atomic_fetch_add_explicit(&j->ran, 1, memory_order_relaxed);
	return 7;
}

static void job_done(void *opaque, int64_t ret)
{
	struct job *j = opaque;

	j->completions++;
	j->ret = ret;
}

static void reset_gate(void)
{
	pthread_mutex_lock(&g.lock);
	g.started = g.open = false;
	pthread_mutex_unlock(&g.lock);
}

static void wait_gate_started(void)
{
	pthread_mutex_lock(&g.lock);
	while (!g.started)
		pthread_cond_wait(&g.cond, &g.lock);
	pthread_mutex_unlock(&g.lock);
}

/* Opens the gate once the pool being destroyed has cancelled the queue:
 * ioc_pool_free() counts the queued requests as cancelled before it waits
 * for the running one, so the queue is certainly still full then. */
struct opener {
	struct ioc_pool *pool;
	uint64_t want_cancelled;
};

static void *opener_main(void *arg)
{
	struct opener *op = arg;
	struct ioc_pool_stats st;

	do {
		sched_yield();
		ioc_pool_get_stats(op->pool, &st);
	} while (st.cancelled < op->want_cancelled);
	pthread_mutex_lock(&g.lock);
	g.open = true;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	return NULL;
}

static void check_jobs(struct job *jobs, unsigned n, unsigned *cancelled)
{
	*cancelled = 0;
	for (unsigned i = 0; i < n; i++) {
		ASSERT_EQ(jobs[i].completions, 1);
		if (jobs[i].ret == -ECANCELED) {
			ASSERT_EQ(atomic_load(&jobs[i].ran), 0);
			++*cancelled;
		} else {
			ASSERT_EQ(jobs[i].ret, 7);
			ASSERT_EQ(atomic_load(&jobs[i].ran), 1);
		}
	}
}

static void test_free_with_queue(void)
{
	struct ioc_pool_opts o = { .max_threads = 1 };
	struct job gate_job = { 0 };
	struct job *jobs = calloc(NQUEUED + 10, sizeof(*jobs));
	struct opener op;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	pthread_t tid;
	unsigned cancelled;

	ASSERT_NOT_NULL(jobs);
	reset_gate();
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc_pool_new(&pool, &o));
	ioc_pool_submit(pool, &gate_job.req, gate_fn, NULL, job_done, &gate_job);
	for (int i = 0; i < NQUEUED; i++)
		ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i], job_done,
				&jobs[i]);
	ioc_loop_poll(loop, false); /* hand them over: now queued */
	wait_gate_started();
	/* Ten more that the loop has not handed over yet. */
	for (int i = NQUEUED; i < NQUEUED + 10; i++)
		ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i], job_done,
				&jobs[i]);
	op.pool = pool;
	op.want_cancelled = NQUEUED;
	ASSERT_EQ(pthread_create(&tid, NULL, opener_main, &op), 0);
	ioc_pool_free(pool);
	pthread_join(tid, NULL);

	ASSERT_EQ(gate_job.completions, 1);
	ASSERT_EQ(gate_job.ret, 42);
	check_jobs(jobs, NQUEUED + 10, &cancelled);
	ASSERT_EQ(cancelled, NQUEUED + 10);
	/* The loop still has the pool's posted tasks; running them must be
	 * harmless (they free the orphaned port). */
	while (ioc_loop_poll(loop, false))
		;
	ioc_loop_free(loop);
	free(jobs);
}

/* A loop's own pool goes with the loop: the same, through ioc_loop_free. */
static void test_loop_free_with_queue(void)
{
	struct ioc_pool_opts o = { .max_threads = 1 };
	struct job gate_job = { 0 };
	struct job *jobs = calloc(NQUEUED, sizeof(*jobs));
	struct opener op;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	pthread_t tid;
	unsigned cancelled;

	(void)o;
	ASSERT_NOT_NULL(jobs);
	reset_gate();
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	pool = ioc_pool_for_loop(loop);
	ASSERT_NOT_NULL(pool);
	ASSERT_OK(ioc_pool_set_limits(pool, 0, 1));
	ioc_pool_submit(pool, &gate_job.req, gate_fn, NULL, job_done, &gate_job);
	for (int i = 0; i < NQUEUED; i++)
		ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i], job_done,
				&jobs[i]);
	ioc_loop_poll(loop, false);
	wait_gate_started();
	op.pool = pool;
	op.want_cancelled = NQUEUED;
	ASSERT_EQ(pthread_create(&tid, NULL, opener_main, &op), 0);
	ioc_loop_free(loop);
	pthread_join(tid, NULL);
	ASSERT_EQ(gate_job.completions, 1);
	ASSERT_EQ(gate_job.ret, 42);
	check_jobs(jobs, NQUEUED, &cancelled);
	ASSERT_EQ(cancelled, NQUEUED);
	free(jobs);
}

/* Freeing right after submitting (nothing handed over), and freeing a busy
 * pool whose jobs complete while it shuts down, many times. */
static void test_free_churn(void)
{
	unsigned rounds = ioc_test_scaled(200);
	struct job *jobs = calloc(64, sizeof(*jobs));
	struct ioc_loop *loop;
	uint64_t total_cancelled = 0;

	ASSERT_NOT_NULL(jobs);
	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	for (unsigned r = 0; r < rounds; r++) {
		struct ioc_pool_opts o = { .max_threads = 1 + r % 3,
					   .min_threads = r % 2 };
		uint32_t ablation = r % 4 == 3 ? IOC__POOL_NO_SUBMIT_BATCH : 0;
		struct ioc_pool *pool;
		unsigned cancelled;

		memset(jobs, 0, 64 * sizeof(*jobs));
		ASSERT_OK(ioc__pool_new_ablated(&pool, &o, ablation));
		for (int i = 0; i < 64; i++)
			ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i],
					job_done, &jobs[i]);
		if (r % 2)
			ioc_loop_poll(loop, false);
		ioc_pool_free(pool);
		check_jobs(jobs, 64, &cancelled);
		total_cancelled += cancelled;
		while (ioc_loop_poll(loop, false))
			;
	}
	ASSERT_UGT(total_cancelled, 0);
	ioc_loop_free(loop);
	free(jobs);
}

IOC_TEST_MAIN(
	IOC_TEST(test_free_with_queue),
	IOC_TEST(test_loop_free_with_queue),
	IOC_TEST(test_free_churn),
)
