/*
 * Freeing a loop right after it has seen the last piece of work posted to
 * it from other threads (the lifetime rule at ioc_loop_free()).
 *
 * Round after round a fresh loop gets completions from a shared thread
 * pool's workers, and tasks, one-shot BHs and notifies from two plain
 * threads; as soon as it has seen all of them the owner frees it, while
 * the posting calls may still be running on the other threads.  A poster
 * that touched the loop after its post became visible (reading a sleeping
 * flag, writing the eventfd without the loop waiting for it) reads freed
 * memory: ThreadSanitizer and AddressSanitizer report it, usually within
 * the first hundred rounds.  The plain build checks that nothing is lost.
 *
 * The other direction: a loop freed while a shared pool still has state
 * for it (the port's spawn timer armed in the loop's heap).  The loop must
 * take that state with it: otherwise the port leaks (AddressSanitizer's
 * leak check) and the next loop at the same address inherits a port whose
 * timer points into the old loop's heap.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "iocore/loop.h"
#include "iocore/pool.h"
#include "tap.h"

#define NPOSTERS 2
#define NJOBS    4

struct poster {
	pthread_t tid;
	struct ioc_task task;
	unsigned id;
};

/* Round hand-off from the owner to the posters. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct ioc_loop *round_loop;
static unsigned round_no;
static bool quit;

/* Loop-thread counters of one round. */
static unsigned tasks_seen, oneshots_seen, jobs_seen;

static void task_fn(struct ioc_task *t)
{
	(void)t;
	tasks_seen++;
}

static void oneshot_cb(void *opaque)
{
	(void)opaque;
	oneshots_seen++;
}

static void *poster_main(void *arg)
{
	struct poster *p = arg;
	unsigned seen = 0;

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

		/* In this order: the owner frees the loop once it has seen the
		 * task, so the task is this thread's last hand-off to it. */
		ioc_loop_notify(loop);
		ASSERT_OK(ioc_loop_oneshot(loop, oneshot_cb, NULL));
		p->task.fn = task_fn;
		ioc_loop_post(loop, &p->task);
	}
}

struct job {
	struct ioc_pool_req req;
	unsigned n;
};

static int64_t job_fn(void *arg)
{
	struct job *j = arg;

	return j->n;
}

static void job_done(void *opaque, int64_t ret)
{
	struct job *j = opaque;

	ASSERT_EQ(ret, (int64_t)j->n);
	jobs_seen++;
}

static void test_free_after_last_post(void)
{
	struct ioc_pool_opts po = { .max_threads = 2, .name = "lifetime" };
	struct poster posters[NPOSTERS];
	struct job jobs[NJOBS];
	unsigned rounds = (unsigned)ioc_test_scaled(2000);
	struct ioc_pool *shared;

	ASSERT_OK(ioc_pool_new(&shared, &po));
	for (unsigned i = 0; i < NPOSTERS; i++) {
		posters[i].id = i;
		ASSERT_EQ(pthread_create(&posters[i].tid, NULL, poster_main,
					 &posters[i]), 0);
	}
	for (unsigned r = 0; r < rounds; r++) {
		struct ioc_loop *loop;

		ASSERT_OK(ioc_loop_new(&loop, NULL));
		ioc_loop_set_current(loop);
		tasks_seen = oneshots_seen = jobs_seen = 0;
		for (unsigned i = 0; i < NJOBS; i++) {
			jobs[i].n = r * NJOBS + i;
			ioc_pool_submit(shared, &jobs[i].req, job_fn, &jobs[i],
					job_done, &jobs[i]);
		}
		pthread_mutex_lock(&lock);
		round_loop = loop;
		round_no++;
		pthread_cond_broadcast(&cond);
		pthread_mutex_unlock(&lock);

		while (tasks_seen < NPOSTERS || jobs_seen < NJOBS)
			ioc_loop_poll(loop, true);
		/* The one-shot BHs went out before the tasks; whichever has
		 * not run yet is freed with the loop. */
		ASSERT_ULE(oneshots_seen, NPOSTERS);
		ioc_loop_free(loop);
	}
	pthread_mutex_lock(&lock);
	quit = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	for (unsigned i = 0; i < NPOSTERS; i++)
		pthread_join(posters[i].tid, NULL);
	ioc_pool_free(shared);
	ioc_test_diag("%u rounds", rounds);
}

/* Blocking jobs: held at a gate until the owner opens it. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_open;

static int64_t gated_fn(void *arg)
{
	struct job *j = arg;

	pthread_mutex_lock(&gate_lock);
	while (!gate_open)
		pthread_cond_wait(&gate_cond, &gate_lock);
	pthread_mutex_unlock(&gate_lock);
	return j->n;
}

static void test_loop_freed_with_timer_armed(void)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned njobs = (unsigned)(ncpu > 0 ? ncpu : 1) + 1;
	/* More jobs than the threads started at once, a thread limit above
	 * that and a long delay: the flush arms the port's spawn timer, and
	 * it is still armed when the loop goes. */
	struct ioc_pool_opts po = {
		.max_threads = njobs + 1, .name = "lifetime",
		.spawn_delay_ns = 60 * 1000000000LL,
	};
	struct job *jobs = calloc(njobs, sizeof(*jobs));
	struct ioc_pool_stats st;
	struct ioc_pool *shared;
	unsigned total = 0;

	ASSERT_NOT_NULL(jobs);
	ASSERT_OK(ioc_pool_new(&shared, &po));
	for (unsigned r = 0; r < 8; r++) {
		struct ioc_loop *loop;

		ASSERT_OK(ioc_loop_new(&loop, NULL));
		ioc_loop_set_current(loop);
		pthread_mutex_lock(&gate_lock);
		gate_open = false;
		pthread_mutex_unlock(&gate_lock);
		jobs_seen = 0;
		for (unsigned i = 0; i < njobs; i++) {
			jobs[i].n = i;
			ioc_pool_submit(shared, &jobs[i].req, gated_fn, &jobs[i],
					job_done, &jobs[i]);
		}
		total += njobs;
		ioc_loop_poll(loop, false);     /* the flush */
		pthread_mutex_lock(&gate_lock);
		gate_open = true;
		pthread_cond_broadcast(&gate_cond);
		pthread_mutex_unlock(&gate_lock);
		while (jobs_seen < njobs)
			ioc_loop_poll(loop, true);
		ioc_loop_free(loop);
	}
	/* The counters of the ports that left with their loops remain. */
	ioc_pool_get_stats(shared, &st);
	ASSERT_EQ(st.submitted, (uint64_t)total);
	ASSERT_EQ(st.completed, (uint64_t)total);
	ioc_pool_free(shared);

	/* A second pool, perhaps at the first one's address, used by one more
	 * loop: nothing of the first may still be reachable (leak check). */
	ASSERT_OK(ioc_pool_new(&shared, &po));
	{
		struct ioc_loop *loop;

		ASSERT_OK(ioc_loop_new(&loop, NULL));
		ioc_loop_set_current(loop);
		pthread_mutex_lock(&gate_lock);
		gate_open = true;
		pthread_mutex_unlock(&gate_lock);
		jobs_seen = 0;
		jobs[0].n = 7;
		ioc_pool_submit(shared, &jobs[0].req, gated_fn, &jobs[0],
				job_done, &jobs[0]);
		while (jobs_seen < 1)
			ioc_loop_poll(loop, true);
		ioc_loop_free(loop);
	}
	ioc_pool_free(shared);
	free(jobs);
}

IOC_TEST_MAIN(
	IOC_TEST(test_free_after_last_post),
	IOC_TEST(test_loop_freed_with_timer_armed),
)
