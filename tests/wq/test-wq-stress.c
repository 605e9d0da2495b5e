/*
 * Workqueue under load: millions of tiny jobs across worker-count changes,
 * in-order release, destroy while busy.  Bounded by count and deadline.
 */
#include <errno.h>
#include <stdatomic.h>

#include "iocore/wq.h"
#include "tap.h"

struct tjob {
	struct ioc_wq_job job;
	uint64_t id;            /* submission number, set by the test */
	uint64_t result;
	unsigned work;          /* loop iterations, to vary job length */
	_Atomic unsigned runs;
};

static _Atomic uint64_t total_runs;

static void tjob_fn(struct ioc_wq_job *job)
{
	struct tjob *t = ioc_container_of(job, struct tjob, job);
	uint64_t x = t->id;

	for (unsigned i = 0; i < t->work; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	t->result = x ^ t->id;
	atomic_fetch_add_explicit(&t->runs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&total_runs, 1, memory_order_relaxed);
}

static uint64_t expect(uint64_t id, unsigned work)
{
	uint64_t x = id;

	for (unsigned i = 0; i < work; i++)
		x = x * 6364136223846793005ull + 1442695040888963407ull;
	return x ^ id;
}

/*
 * Keep a pool of jobs cycling through the wq: submit every free one,
 * collect, check, resubmit.  Every `resize_every` jobs, change the worker
 * count.  In in-order mode the collected ids must be exactly 0, 1, 2, ...
 */
static void churn(const struct ioc_wq_opts *o, uint64_t njobs,
		  uint64_t resize_every, unsigned pool_size)
{
	struct ioc_wq *wq;
	struct tjob *pool = calloc(pool_size, sizeof(*pool));
	struct tjob **free_list = calloc(pool_size, sizeof(*free_list));
	struct ioc_wq_job **out = calloc(pool_size, sizeof(*out));
	unsigned nfree = pool_size, sizes[] = { 1, 3, 2, 4, 1, 2 }, si = 0;
	uint64_t next_id = 0, next_expected = 0, done = 0, next_resize = resize_every;
	int64_t deadline = ioc_now_ns() + (int64_t)ioc_test_scaled(3000) * 1000000;

	ASSERT_NOT_NULL(pool);
	ASSERT_OK(ioc_wq_new(&wq, o));
	for (unsigned i = 0; i < pool_size; i++)
		free_list[i] = &pool[i];

	while (done < next_id || (next_id < njobs && ioc_now_ns() < deadline)) {
		/* Submit while we have jobs and room. */
		while (nfree && next_id < njobs) {
			struct tjob *t = free_list[nfree - 1];

			t->job.fn = tjob_fn;
			t->id = next_id;
			t->work = (next_id % 97 == 0) ? 2000 : (unsigned)(next_id % 7);
			atomic_store_explicit(&t->runs, 0, memory_order_relaxed);
			if (ioc_wq_submit(wq, &t->job) == -EAGAIN)
				break;
			ASSERT_UEQ(t->job.seq, next_id);
			ASSERT_ULT(t->job.worker, ioc_wq_workers(wq));
			nfree--;
			next_id++;
			if (ioc_now_ns() > deadline)
				njobs = next_id;   /* stop submitting, drain */
		}
		int n = ioc_wq_wait_done(wq, out, pool_size, -1);

		ASSERT_GE(n, 0);
		for (int i = 0; i < n; i++) {
			struct tjob *t = ioc_container_of(out[i], struct tjob, job);

			ASSERT_EQ(atomic_load_explicit(&t->runs, memory_order_relaxed), 1);
			ASSERT_UEQ(t->result, expect(t->id, t->work));
			if (o->in_order)
				ASSERT_UEQ(t->id, next_expected);
			next_expected++;
			free_list[nfree++] = t;
		}
		done += (uint64_t)n;
		if (done >= next_resize) {
			ASSERT_OK(ioc_wq_set_workers(wq, sizes[si++ % IOC_ARRAY_SIZE(sizes)]));
			next_resize += resize_every;
		}
	}
	ASSERT_UEQ(done, next_id);
	ASSERT_UEQ(ioc_wq_in_flight(wq), 0);
	ASSERT_UEQ(nfree, pool_size);
	ioc_test_diag("%" PRIu64 " jobs, %u resizes", done, si);
	ioc_wq_free(wq);
	free(pool);
	free(free_list);
	free(out);
}

static void test_tiny_jobs_resize(void)
{
	static const enum ioc_wq_policy pols[] = {
		IOC_WQ_FILL, IOC_WQ_ROUND_ROBIN, IOC_WQ_LEAST_LOADED
	};

	for (unsigned p = 0; p < IOC_ARRAY_SIZE(pols); p++) {
		struct ioc_wq_opts o = { .workers = 2, .ring_size = 64, .policy = pols[p] };

		churn(&o, ioc_test_scaled(1000000), ioc_test_scaled(50000), 512);
	}
}

static void test_in_order(void)
{
	struct ioc_wq_opts o = { .workers = 3, .ring_size = 16, .in_order = true,
				 .policy = IOC_WQ_ROUND_ROBIN };

	churn(&o, ioc_test_scaled(300000), ioc_test_scaled(20000), 200);
	o.policy = IOC_WQ_FILL;
	o.spin_ns = -1;
	churn(&o, ioc_test_scaled(200000), ioc_test_scaled(30000), 100);
	/* iocore-zip's configuration: least loaded, deep rings. */
	o.policy = IOC_WQ_LEAST_LOADED;
	o.spin_ns = 0;
	o.ring_size = 256;
	churn(&o, ioc_test_scaled(200000), ioc_test_scaled(40000), 600);
}

/* Free with jobs queued and running: every submitted job runs first. */
static void test_destroy_busy(void)
{
	enum { N = 1024 };
	static struct tjob jobs[N];
	unsigned rounds = (unsigned)ioc_test_scaled(20);

	for (unsigned r = 0; r < rounds; r++) {
		struct ioc_wq_opts o = { .workers = 1 + r % 4, .ring_size = 256,
					 .policy = (enum ioc_wq_policy)(r % 3) };
		struct ioc_wq *wq;
		unsigned sub = 0;

		memset(jobs, 0, sizeof(jobs));
		atomic_store(&total_runs, 0);
		ASSERT_OK(ioc_wq_new(&wq, &o));
		for (; sub < N; sub++) {
			jobs[sub].job.fn = tjob_fn;
			jobs[sub].id = sub;
			jobs[sub].work = 500;
			if (ioc_wq_submit(wq, &jobs[sub].job) < 0)
				break;
		}
		ASSERT_UEQ(sub, N < o.workers * 256 ? N : o.workers * 256);
		if (r & 1) {
			/* Collect a few, leave the rest. */
			struct ioc_wq_job *out[4];

			ASSERT_GT(ioc_wq_wait_done(wq, out, 4, -1), 0);
		}
		ioc_wq_free(wq);
		ASSERT_UEQ(atomic_load(&total_runs), sub);
		for (unsigned i = 0; i < sub; i++)
			ASSERT_EQ(atomic_load(&jobs[i].runs), 1);
	}
}

IOC_TEST_MAIN(
	IOC_TEST(test_tiny_jobs_resize),
	IOC_TEST(test_in_order),
	IOC_TEST(test_destroy_busy),
)
