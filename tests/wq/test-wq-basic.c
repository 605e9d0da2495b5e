/* Workqueue semantics: submit/collect, -EAGAIN, policies, timeouts, stats,
 * the sleep/wake handshake. */
#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>

#include "iocore/wq.h"
#include "tap.h"

struct tjob {
	struct ioc_wq_job job;
	uint64_t id;
	_Atomic unsigned runs;
	sem_t *gate;            /* if set, the job waits on it */
};

static void tjob_fn(struct ioc_wq_job *job)
{
	struct tjob *t = ioc_container_of(job, struct tjob, job);

	if (t->gate)
		sem_wait(t->gate);
	atomic_fetch_add_explicit(&t->runs, 1, memory_order_relaxed);
}

static void test_defaults(void)
{
	struct ioc_wq *wq;
	struct ioc_wq_opts bad = { .ring_size = 3 };

	ASSERT_EQ(ioc_wq_new(&wq, &bad), -EINVAL);
	ASSERT_NULL(wq);
	bad = (struct ioc_wq_opts){ .policy = 7 };
	ASSERT_EQ(ioc_wq_new(&wq, &bad), -EINVAL);
	ASSERT_OK(ioc_wq_new(&wq, NULL));
	ASSERT_UEQ(ioc_wq_workers(wq), (unsigned)sysconf(_SC_NPROCESSORS_ONLN));
	ASSERT_EQ(ioc_wq_set_workers(wq, 0), -EINVAL);
	ioc_wq_free(wq);
}

static void test_submit_collect(void)
{
	struct ioc_wq_opts o = { .workers = 1, .ring_size = 4 };
	struct ioc_wq *wq;
	struct tjob jobs[5] = { 0 };
	struct ioc_wq_job *out[8];
	int n, total = 0;

	ASSERT_OK(ioc_wq_new(&wq, &o));
	ASSERT_EQ(ioc_wq_wait_done(wq, out, 8, -1), 0);  /* nothing in flight */
	for (int i = 0; i < 4; i++) {
		jobs[i].job.fn = tjob_fn;
		ASSERT_OK(ioc_wq_submit(wq, &jobs[i].job));
		ASSERT_UEQ(jobs[i].job.seq, (uint64_t)i);
		ASSERT_UEQ(jobs[i].job.worker, 0);
	}
	/* The only worker has 4 uncollected jobs: full until we collect. */
	jobs[4].job.fn = tjob_fn;
	ASSERT_EQ(ioc_wq_submit(wq, &jobs[4].job), -EAGAIN);
	ASSERT_UEQ(ioc_wq_in_flight(wq), 4);
	while (total < 4) {
		n = ioc_wq_wait_done(wq, out + total, 8 - total, -1);
		ASSERT_GT(n, 0);
		total += n;
	}
	ASSERT_EQ(total, 4);
	for (int i = 0; i < 4; i++) {
		ASSERT_PTR_EQ(out[i], &jobs[i].job); /* one worker: FIFO */
		ASSERT_EQ(atomic_load(&jobs[i].runs), 1);
	}
	ASSERT_UEQ(ioc_wq_in_flight(wq), 0);
	ASSERT_OK(ioc_wq_submit(wq, &jobs[4].job));
	ASSERT_EQ(ioc_wq_wait_done(wq, out, 8, -1), 1);
	ASSERT_EQ(ioc_wq_poll_done(wq, out, 8), 0);
	ioc_wq_free(wq);
}

static void test_wait_timeout(void)
{
	struct ioc_wq_opts o = { .workers = 1, .spin_ns = 1000 };
	struct ioc_wq *wq;
	struct tjob job = { 0 };
	struct ioc_wq_job *out[1];
	sem_t gate;

	ASSERT_EQ(sem_init(&gate, 0, 0), 0);
	ASSERT_OK(ioc_wq_new(&wq, &o));
	job.job.fn = tjob_fn;
	job.gate = &gate;
	ASSERT_OK(ioc_wq_submit(wq, &job.job));
	/* The job cannot finish before we open the gate. */
	ASSERT_EQ(ioc_wq_wait_done(wq, out, 1, 1000000), 0);
	ASSERT_EQ(ioc_wq_poll_done(wq, out, 1), 0);
	ASSERT_EQ(ioc_wq_wait_done(wq, out, 1, 0), 0);
	sem_post(&gate);
	ASSERT_EQ(ioc_wq_wait_done(wq, out, 1, -1), 1);
	ASSERT_PTR_EQ(out[0], &job.job);
	ioc_wq_free(wq);
	sem_destroy(&gate);
}

static void run_policy(enum ioc_wq_policy policy)
{
	enum { NJOBS = 256 };
	struct ioc_wq_opts o = { .workers = 3, .ring_size = 8, .policy = policy };
	struct ioc_wq *wq;
	static struct tjob jobs[NJOBS];
	struct ioc_wq_job *out[NJOBS];
	struct ioc_wq_worker_stats st[4];
	unsigned rounds = (unsigned)ioc_test_scaled(200), used[3] = { 0 };
	uint64_t sum = 0;

	ASSERT_OK(ioc_wq_new(&wq, &o));
	for (unsigned r = 0; r < rounds; r++) {
		unsigned sub = 0, got = 0;

		memset(jobs, 0, sizeof(jobs));
		for (; sub < NJOBS; sub++) {
			jobs[sub].job.fn = tjob_fn;
			jobs[sub].id = sub;
			if (ioc_wq_submit(wq, &jobs[sub].job) == -EAGAIN)
				break;
			ASSERT_ULT(jobs[sub].job.worker, 3);
			used[jobs[sub].job.worker]++;
		}
		/* 3 workers x 8 slots, nothing collected. */
		ASSERT_UEQ(sub, 24);
		while (got < sub) {
			int n = ioc_wq_wait_done(wq, out + got, NJOBS - got, -1);

			ASSERT_GT(n, 0);
			got += (unsigned)n;
		}
		ASSERT_UEQ(got, sub);
		for (unsigned i = 0; i < sub; i++)
			ASSERT_EQ(atomic_load(&jobs[i].runs), 1);
		for (unsigned i = 0; i < got; i++) {
			struct tjob *t = ioc_container_of(out[i], struct tjob, job);

			ASSERT_EQ(atomic_fetch_add(&t->runs, 1), 1); /* once each */
		}
	}
	/* Every policy fills all three rings when nothing is collected. */
	for (int i = 0; i < 3; i++)
		ASSERT_UEQ(used[i], 8 * rounds);
	ASSERT_EQ(ioc_wq_get_stats(wq, st, 4), 3);
	ioc_wq_free(wq);
	(void)sum;
}

static void test_policy_fill(void) { run_policy(IOC_WQ_FILL); }
static void test_policy_rr(void) { run_policy(IOC_WQ_ROUND_ROBIN); }
static void test_policy_least(void) { run_policy(IOC_WQ_LEAST_LOADED); }

/* FILL sends consecutive jobs to one worker, ROUND_ROBIN rotates. */
static void test_policy_shapes(void)
{
	struct tjob jobs[4] = { 0 };
	struct ioc_wq_job *out[4];
	struct ioc_wq *wq;
	enum ioc_wq_policy pols[2] = { IOC_WQ_FILL, IOC_WQ_ROUND_ROBIN };

	for (int p = 0; p < 2; p++) {
		struct ioc_wq_opts o = { .workers = 2, .ring_size = 4, .policy = pols[p] };
		int got = 0;

		ASSERT_OK(ioc_wq_new(&wq, &o));
		for (int i = 0; i < 4; i++) {
			jobs[i].job.fn = tjob_fn;
			ASSERT_OK(ioc_wq_submit(wq, &jobs[i].job));
		}
		if (pols[p] == IOC_WQ_FILL) {
			for (int i = 0; i < 4; i++)
				ASSERT_UEQ(jobs[i].job.worker, jobs[0].job.worker);
		} else {
			ASSERT_UEQ(jobs[0].job.worker, jobs[2].job.worker);
			ASSERT_UEQ(jobs[1].job.worker, jobs[3].job.worker);
			ASSERT_UEQ(jobs[0].job.worker ^ jobs[1].job.worker, 1);
		}
		while (got < 4)
			got += ioc_wq_wait_done(wq, out + got, 4 - got, -1);
		ioc_wq_free(wq);
	}
}

/* The handshake: a worker that went to sleep is woken by exactly one
 * syscall per submission; stats say so. */
static void test_sleep_wake(void)
{
	struct ioc_wq_opts o = { .workers = 1, .spin_ns = -1 };
	struct ioc_wq *wq;
	struct tjob job = { 0 };
	struct ioc_wq_job *out[1];
	struct ioc_wq_worker_stats st;
	unsigned rounds = (unsigned)ioc_test_scaled(50);

	ASSERT_OK(ioc_wq_new(&wq, &o));
	job.job.fn = tjob_fn;
	for (unsigned r = 0; r < rounds; r++) {
		/* Wait (by observing its counter) until the worker sleeps. */
		do {
			ASSERT_EQ(ioc_wq_get_stats(wq, &st, 1), 1);
		} while (st.sleeps < r + 1);
		ASSERT_OK(ioc_wq_submit(wq, &job.job));
		ASSERT_EQ(ioc_wq_wait_done(wq, out, 1, -1), 1);
		ioc_wq_get_stats(wq, &st, 1);
		ASSERT_UEQ(st.wakeups, r + 1);
	}
	/* After the last job the worker sleeps again; its job count was
	 * stored before that. */
	do {
		ioc_wq_get_stats(wq, &st, 1);
	} while (st.sleeps < rounds + 1);
	ASSERT_UEQ(st.jobs, rounds);
	ASSERT_EQ(atomic_load(&job.runs), (int)rounds);
	ioc_wq_free(wq);
}

IOC_TEST_MAIN(
	IOC_TEST(test_defaults),
	IOC_TEST(test_submit_collect),
	IOC_TEST(test_wait_timeout),
	IOC_TEST(test_policy_fill),
	IOC_TEST(test_policy_rr),
	IOC_TEST(test_policy_least),
	IOC_TEST(test_policy_shapes),
	IOC_TEST(test_sleep_wake),
)
