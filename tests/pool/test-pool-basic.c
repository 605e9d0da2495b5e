/*
 * Thread pool basics: results come back on the submitting loop's thread,
 * in full; the loop's own pool; the coroutine form; worker names; limits;
 * idle workers above min exit; stats add up.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "iocore/co.h"
#include "iocore/pool.h"
#include "src/pool/pool-int.h"
#include "tap.h"

struct ctx {
	struct ioc_loop *loop;
	pthread_t loop_thread;
	unsigned done, expected;
	unsigned bad_thread;
	int64_t sum;
};

struct job {
	struct ioc_pool_req req;
	struct ctx *ctx;
	int64_t value;
};

static int64_t job_fn(void *arg)
{
	struct job *j = arg;

	return j->value * 3;
}

static void job_done(void *opaque, int64_t ret)
{
	struct job *j = opaque;
	struct ctx *c = j->ctx;

	if (!pthread_equal(pthread_self(), c->loop_thread) ||
	    ioc_loop_current() != c->loop)
		c->bad_thread++;
	ASSERT_EQ(ret, j->value * 3);
	c->sum += ret;
	c->done++;
	if (c->done == c->expected)
		ioc_loop_stop(c->loop);
}

static void run_jobs(struct ioc_pool *pool, struct ioc_loop *loop, unsigned n)
{
	struct job *jobs = calloc(n, sizeof(*jobs));
	struct ctx c = { .loop = loop, .loop_thread = pthread_self(),
			 .expected = n };
	int64_t want = 0;

	ASSERT_NOT_NULL(jobs);
	for (unsigned i = 0; i < n; i++) {
		jobs[i].ctx = &c;
		jobs[i].value = i;
		want += 3 * (int64_t)i;
		ioc_pool_submit(pool, &jobs[i].req, job_fn, &jobs[i],
				job_done, &jobs[i]);
	}
	/* done never runs inside submit. */
	ASSERT_EQ(c.done, 0);
	ioc_loop_run(loop);
	ASSERT_EQ(c.done, n);
	ASSERT_EQ(c.bad_thread, 0);
	ASSERT_EQ(c.sum, want);
	free(jobs);
}

static void test_submit_own_pool(void)
{
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	struct ioc_pool_stats st;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	pool = ioc_pool_for_loop(loop);
	ASSERT_NOT_NULL(pool);
	ASSERT_PTR_EQ(ioc_pool_for_loop(loop), pool);
	run_jobs(pool, loop, 1000);
	run_jobs(NULL, loop, 100); /* NULL: the current loop's pool */
	ioc_pool_get_stats(pool, &st);
	ASSERT_UEQ(st.submitted, 1100);
	ASSERT_UEQ(st.completed, 1100);
	ASSERT_UEQ(st.cancelled, 0);
	ASSERT_UGE(st.threads, 1);
	ASSERT_UGE(st.completion_batches, 1);
	ASSERT_ULE(st.completion_batches, 1100);
	ioc_test_diag("1100 jobs: %" PRIu64 " completion batches, %" PRIu64
		      " worker wakeups, %u threads", st.completion_batches,
		      st.worker_wakeups, st.threads);
	/* The pool goes with the loop, completing what is in flight. */
	ioc_loop_free(loop);
}

static void test_ablation(void)
{
	static const uint32_t variants[] = {
		IOC__POOL_NO_SUBMIT_BATCH, IOC__POOL_NO_COMPLETE_BATCH,
		IOC__POOL_WAKE_ALWAYS, IOC__POOL_NO_LAG_YIELD,
		IOC__POOL_NO_SUBMIT_BATCH | IOC__POOL_NO_COMPLETE_BATCH |
			IOC__POOL_WAKE_ALWAYS | IOC__POOL_NO_LAG_YIELD,
	};
	struct ioc_loop *loop;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	for (unsigned i = 0; i < IOC_ARRAY_SIZE(variants); i++) {
		struct ioc_pool_opts o = { .max_threads = 3,
					   .spin_max_ns = i & 1 ? -1 : 0 };
		struct ioc_pool *pool;
		struct ioc_pool_stats st;

		ASSERT_OK(ioc__pool_new_ablated(&pool, &o, variants[i]));
		run_jobs(pool, loop, 500);
		ioc_pool_get_stats(pool, &st);
		ASSERT_UEQ(st.completed, 500);
		ASSERT_ULE(st.threads, 3);
		ioc_pool_free(pool);
	}
	ioc_loop_free(loop);
}

/* ---- lag yield -------------------------------------------------------- */

/*
 * A worker yields its CPU after a job when the queue is down to two jobs
 * per thread and the loop has not collected earlier completions.  Make the
 * loop lag on purpose: its first done callback waits until the one worker
 * has run every job.  The loop takes the completion stack once before
 * that, so of the last three jobs (queue 2, 1, 0 behind them) at most one
 * pushes onto an empty stack: two or three yields, and none with the flag.
 */
#define LAG_JOBS 8

struct lag_ctx {
	struct ioc_loop *loop;
	atomic_uint ran;
	unsigned done;
};

struct lag_job {
	struct ioc_pool_req req;
	struct lag_ctx *c;
};

static int64_t lag_fn(void *arg)
{
	struct lag_job *j = arg;

	/* Release: pairs with the acquire in lag_done(). */
	atomic_fetch_add_explicit(&j->c->ran, 1, memory_order_release);
	return 0;
}

static void lag_done(void *opaque, int64_t ret)
{
	struct lag_job *j = opaque;
	struct lag_ctx *c = j->c;

	ASSERT_EQ(ret, 0);
	if (c->done++ == 0)
		while (atomic_load_explicit(&c->ran, memory_order_acquire) < LAG_JOBS)
			sched_yield();
	if (c->done == LAG_JOBS)
		ioc_loop_stop(c->loop);
}

static uint64_t lag_yields(struct ioc_loop *loop, uint32_t ablation)
{
	struct ioc_pool_opts o = { .max_threads = 1 };
	struct lag_ctx c = { .loop = loop };
	struct lag_job jobs[LAG_JOBS];
	struct ioc_pool_stats st;
	struct ioc_pool *pool;

	ASSERT_OK(ioc__pool_new_ablated(&pool, &o, ablation));
	for (unsigned i = 0; i < LAG_JOBS; i++) {
		jobs[i].c = &c;
		ioc_pool_submit(pool, &jobs[i].req, lag_fn, &jobs[i], lag_done, &jobs[i]);
	}
	ioc_loop_run(loop);
	ASSERT_UEQ(c.done, LAG_JOBS);
	ioc_pool_get_stats(pool, &st);
	ASSERT_UEQ(st.threads, 1);
	ioc_pool_free(pool);
	return st.lag_yields;
}

static void test_lag_yield(void)
{
	struct ioc_loop *loop;
	uint64_t n;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	for (int round = 0; round < 20; round++) {
		n = lag_yields(loop, 0);
		ASSERT_UGE(n, 2);
		ASSERT_ULE(n, 3);
		ASSERT_UEQ(lag_yields(loop, IOC__POOL_NO_LAG_YIELD), 0);
	}
	ioc_loop_free(loop);
}

/* ---- coroutine form --------------------------------------------------- */

struct co_ctx {
	struct ioc_pool *pool;
	struct ioc_loop *loop;
	int64_t total;
	unsigned finished;
	unsigned ncos;
};

static int64_t add_one(void *arg)
{
	return (int64_t)(intptr_t)arg + 1;
}

static void ioc_coroutine_fn co_body(void *opaque)
{
	struct co_ctx *c = opaque;

	for (intptr_t i = 0; i < 50; i++) {
		int64_t r = ioc_pool_co_run(c->pool, add_one, (void *)i);

		ASSERT_EQ(r, i + 1);
		ASSERT_PTR_EQ(ioc_loop_current(), c->loop);
		c->total += r;
	}
	if (++c->finished == c->ncos)
		ioc_loop_stop(c->loop);
}

static void test_coroutine(void)
{
	struct co_ctx c = { .ncos = 8 };
	struct ioc_pool_opts o = { .max_threads = 4 };

	ASSERT_OK(ioc_loop_new(&c.loop, NULL));
	ioc_loop_set_current(c.loop);
	ASSERT_OK(ioc_pool_new(&c.pool, &o));
	for (unsigned i = 0; i < c.ncos; i++) {
		struct ioc_co *co = ioc_co_create(co_body, &c);

		ASSERT_NOT_NULL(co);
		ioc_co_enter(co);
	}
	ioc_loop_run(c.loop);
	ASSERT_EQ(c.finished, c.ncos);
	ASSERT_EQ(c.total, 8 * (50 * 51 / 2));
	ioc_pool_free(c.pool);
	ioc_loop_free(c.loop);
}

/* ---- names, limits, idle exit ------------------------------------------ */

static int64_t name_fn(void *arg)
{
	char *name = arg;

	return pthread_getname_np(pthread_self(), name, 16) ? -1 : 0;
}

static void name_done(void *opaque, int64_t ret)
{
	int64_t *out = opaque;

	*out = ret;
	ioc_loop_stop(ioc_loop_current());
}

static void test_worker_names(void)
{
	struct ioc_pool_opts o = { .name = "blkthreads-long-name" };
	struct ioc_pool_req req;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	char name[16] = "";
	int64_t ret = 1;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc_pool_new(&pool, &o));
	ioc_pool_submit(pool, &req, name_fn, name, name_done, &ret);
	ioc_loop_run(loop);
	ASSERT_EQ(ret, 0);
	/* Prefix cut to 10 bytes, then "-<n>". */
	ASSERT_EQ(strncmp(name, "blkthreads-", 11), 0);
	ioc_pool_free(pool);
	ioc_loop_free(loop);
}

static void test_limits_invalid(void)
{
	struct ioc_pool_opts bad = { .min_threads = 5, .max_threads = 2 };
	struct ioc_pool_opts reserved = { .flags = 1 };
	struct ioc_pool *pool;

	ASSERT_EQ(ioc_pool_new(&pool, &bad), -EINVAL);
	/* No public flags yet, and no ablation bit beyond pool-int.h's. */
	ASSERT_EQ(ioc_pool_new(&pool, &reserved), -EINVAL);
	ASSERT_EQ(ioc__pool_new_ablated(&pool, NULL,
					IOC__POOL_ABLATION_ALL + 1), -EINVAL);
	ASSERT_OK(ioc_pool_new(&pool, NULL));
	ASSERT_EQ(ioc_pool_set_limits(pool, 3, 2), -EINVAL);
	ASSERT_EQ(ioc_pool_set_limits(pool, 0, 0), -EINVAL);
	ASSERT_OK(ioc_pool_set_limits(pool, 2, 2));
	ioc_pool_free(pool);
}

/* Jobs that all wait until `want` of them run at once: only possible with
 * `want` threads. */
struct rendezvous {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned arrived, want;
};

static int64_t rendezvous_fn(void *arg)
{
	struct rendezvous *r = arg;

	pthread_mutex_lock(&r->lock);
	if (++r->arrived >= r->want)
		pthread_cond_broadcast(&r->cond);
	while (r->arrived < r->want)
		pthread_cond_wait(&r->cond, &r->lock);
	pthread_mutex_unlock(&r->lock);
	return 0;
}

static void count_done(void *opaque, int64_t ret)
{
	unsigned *left = opaque;

	ASSERT_EQ(ret, 0);
	if (--*left == 0)
		ioc_loop_stop(ioc_loop_current());
}

static void test_min_threads_and_idle_exit(void)
{
	struct ioc_pool_opts o = { .min_threads = 1, .max_threads = 4,
				   .idle_timeout_ms = 20 };
	struct rendezvous r = { PTHREAD_MUTEX_INITIALIZER,
				PTHREAD_COND_INITIALIZER, 0, 4 };
	struct ioc_pool_req reqs[4];
	struct ioc_pool_stats st;
	struct ioc_loop *loop;
	struct ioc_pool *pool;
	unsigned left = 4;
	int64_t deadline;

	ASSERT_OK(ioc_loop_new(&loop, NULL));
	ioc_loop_set_current(loop);
	ASSERT_OK(ioc_pool_new(&pool, &o));
	ioc_pool_get_stats(pool, &st);
	ASSERT_UEQ(st.threads, 1); /* min threads start at once */
	for (int i = 0; i < 4; i++)
		ioc_pool_submit(pool, &reqs[i], rendezvous_fn, &r, count_done,
				&left);
	/* Finishes only if the pool grew to 4 threads. */
	ioc_loop_run(loop);
	ASSERT_EQ(left, 0);
	ioc_pool_get_stats(pool, &st);
	ASSERT_ULE(st.threads, 4); /* some may already have timed out */
	/* Idle workers above min exit after 20 ms; wait for it (bounded). */
	deadline = ioc_now_ns() + 5000000000LL;
	do {
		sched_yield();
		ioc_pool_get_stats(pool, &st);
	} while (st.threads > 1 && ioc_now_ns() < deadline);
	ASSERT_UEQ(st.threads, 1);
	/* Raising min starts threads at once. */
	ASSERT_OK(ioc_pool_set_limits(pool, 3, 4));
	ioc_pool_get_stats(pool, &st);
	ASSERT_UGE(st.threads, 3);
	ioc_pool_free(pool);
	ioc_loop_free(loop);
}

IOC_TEST_MAIN(
	IOC_TEST(test_submit_own_pool),
	IOC_TEST(test_ablation),
	IOC_TEST(test_lag_yield),
	IOC_TEST(test_coroutine),
	IOC_TEST(test_worker_names),
	IOC_TEST(test_limits_invalid),
	IOC_TEST(test_min_threads_and_idle_exit),
)
