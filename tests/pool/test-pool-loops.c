/*
 * Many requests from several loops at once: three I/O threads each keep
 * requests in flight on a pool shared by all of them and on their own
 * loop's pool.  Every completion must come back exactly once, with its
 * own result, on the loop that submitted it.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "iocore/pool.h"
#include "tap.h"

enum { NLOOPS = 3, DEPTH = 16 };

struct client;

struct job {
	struct ioc_pool_req req;
	struct client *cl;
	uint64_t seq;
	bool shared;
};

struct client {
	struct ioc_loop *loop;
	struct ioc_pool *shared, *own;
	struct job jobs[DEPTH];
	uint64_t next_seq, target, done;
	uint64_t wrong_loop;
	uint64_t nshared;
	uint64_t sum, want_sum;
	unsigned *seen;            /* per seq: completions seen */
	pthread_mutex_t *lock;
	pthread_cond_t *cond;
	unsigned *finished;
};

static int64_t job_fn(void *arg)
{
	struct job *j = arg;

	/* Something a little more than nothing, to overlap threads. */
	uint64_t x = j->seq;
	for (int i = 0; i < 64; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	(void)x;
	return (int64_t)(j->seq * 7 + 1);
}

static void submit_next(struct client *cl, struct job *j);

static void job_done(void *opaque, int64_t ret)
{
	struct job *j = opaque;
	struct client *cl = j->cl;

	if (ioc_loop_current() != cl->loop)
		cl->wrong_loop++;
	ASSERT_EQ(ret, (int64_t)(j->seq * 7 + 1));
	cl->seen[j->seq]++;
	cl->sum += (uint64_t)ret;
	cl->done++;
	if (cl->next_seq < cl->target) {
		submit_next(cl, j);
	} else if (cl->done == cl->target) {
		pthread_mutex_lock(cl->lock);
		(*cl->finished)++;
		pthread_cond_signal(cl->cond);
		pthread_mutex_unlock(cl->lock);
	}
}

static void submit_next(struct client *cl, struct job *j)
{
	j->seq = cl->next_seq++;
	j->shared = !j->shared;
	cl->want_sum += j->seq * 7 + 1;
	cl->nshared += j->shared;
	ioc_pool_submit(j->shared ? cl->shared : cl->own, &j->req, job_fn, j,
			job_done, j);
}

static int client_start(void *arg)
{
	struct client *cl = arg;

	cl->loop = ioc_loop_current();
	cl->own = ioc_pool_for_loop(cl->loop);
	if (!cl->own)
		return -ENOMEM;
	for (unsigned i = 0; i < DEPTH; i++) {
		cl->jobs[i].cl = cl;
		cl->jobs[i].shared = i & 1;
		submit_next(cl, &cl->jobs[i]);
	}
	return 0;
}

static void test_many_loops(void)
{
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	struct ioc_pool_opts o = { .max_threads = 4, .name = "shared" };
	struct ioc_iothread *threads[NLOOPS];
	struct client *cls[NLOOPS];
	struct ioc_pool *shared;
	struct ioc_pool_stats st;
	unsigned finished = 0;
	uint64_t nshared = 0;
	uint64_t per_loop = ioc_test_scaled(20000);

	ASSERT_OK(ioc_pool_new(&shared, &o));
	for (int i = 0; i < NLOOPS; i++) {
		struct ioc_iothread_opts to = { .name = "pool-test", .cpu = -1 };

		cls[i] = calloc(1, sizeof(*cls[i]));
		ASSERT_NOT_NULL(cls[i]);
		cls[i]->seen = calloc(per_loop, sizeof(unsigned));
		ASSERT_NOT_NULL(cls[i]->seen);
		cls[i]->shared = shared;
		cls[i]->target = per_loop;
		cls[i]->lock = &lock;
		cls[i]->cond = &cond;
		cls[i]->finished = &finished;
		ASSERT_OK(ioc_iothread_start(&threads[i], &to));
	}
	/* Start them all, then wait for all of them. */
	for (int i = 0; i < NLOOPS; i++)
		ASSERT_OK(ioc_iothread_call(threads[i], client_start, cls[i]));
	pthread_mutex_lock(&lock);
	while (finished < NLOOPS)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);

	for (int i = 0; i < NLOOPS; i++) {
		struct client *cl = cls[i];

		ASSERT_UEQ(cl->done, per_loop);
		ASSERT_UEQ(cl->wrong_loop, 0);
		ASSERT_UEQ(cl->sum, cl->want_sum);
		for (uint64_t s = 0; s < per_loop; s++)
			ASSERT_EQ(cl->seen[s], 1);
		nshared += cl->nshared;
	}
	/* Each loop's own pool goes with its loop.  Stop them first: a loop
	 * counts a completion batch after its callbacks returned. */
	for (int i = 0; i < NLOOPS; i++)
		ioc_iothread_stop(threads[i]);
	ioc_pool_get_stats(shared, &st);
	ASSERT_UGT(nshared, 0);
	ASSERT_UEQ(st.submitted, nshared);
	ASSERT_UEQ(st.completed, nshared);
	ASSERT_ULE(st.threads, 4);
	ioc_test_diag("shared pool: %" PRIu64 " jobs in %" PRIu64
		      " completion batches, %" PRIu64 " worker wakeups",
		      st.completed, st.completion_batches, st.worker_wakeups);
	ioc_pool_free(shared);
	for (int i = 0; i < NLOOPS; i++) {
		free(cls[i]->seen);
		free(cls[i]);
	}
}

IOC_TEST_MAIN(
	IOC_TEST(test_many_loops),
)
