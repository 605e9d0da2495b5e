/*
 * The coroutine pool: the cross-thread pattern of a server (created on
 * thread A, finished on thread B), the global bound, and thread exit.
 *
 * The process-wide pool is configured once, at the start of main, with
 * batch 16 and a bound of 128 coroutines.
 */
#include "iocore/co.h"
#include "tap.h"

#include <pthread.h>
#include <stdatomic.h>

enum { BATCH = 16, BOUND = 128, QCAP = 32 };

static void ensure_configured(void)
{
	static bool done;
	struct ioc_co_pool_opts o = {
		.stack_size = 64 << 10,
		.batch_size = BATCH,
		.max_pooled = BOUND,
	};

	if (!done) {
		ASSERT_EQ(ioc_co_pool_configure(&o), 0);
		done = true;
	}
}

/* A bounded handoff queue of started coroutines from A to B. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct ioc_co *slot[QCAP];
	unsigned head, tail;
	bool closed;
} q = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void q_put(struct ioc_co *co)
{
	pthread_mutex_lock(&q.lock);
	while (q.tail - q.head == QCAP)
		pthread_cond_wait(&q.cond, &q.lock);
	q.slot[q.tail++ % QCAP] = co;
	pthread_cond_broadcast(&q.cond);
	pthread_mutex_unlock(&q.lock);
}

static struct ioc_co *q_get(void)
{
	struct ioc_co *co = NULL;

	pthread_mutex_lock(&q.lock);
	while (q.tail == q.head && !q.closed)
		pthread_cond_wait(&q.cond, &q.lock);
	if (q.tail != q.head)
		co = q.slot[q.head++ % QCAP];
	pthread_cond_broadcast(&q.cond);
	pthread_mutex_unlock(&q.lock);
	return co;
}

static void q_close(void)
{
	pthread_mutex_lock(&q.lock);
	q.closed = true;
	pthread_cond_broadcast(&q.cond);
	pthread_mutex_unlock(&q.lock);
}


/* Starts on A, yields, and is finished by B. */
static void ioc_coroutine_fn request_fn(void *opaque)
{
	atomic_ulong *done = opaque;

	ioc_co_yield();
	atomic_fetch_add_explicit(done, 1, memory_order_relaxed);
}

static unsigned long iterations;
/* started: stored by A after its last create (release), polled by main
 * (acquire); finished: counted by the coroutines B finishes.  After the
 * joins both are read relaxed: the joins order them. */
static atomic_ulong started, finished;
static int64_t deadline;
static bool migrated_ok = true;

static void *thread_a(void *arg)
{
	unsigned long i;

	/* Bounded by count and, every 256 requests, by the deadline. */
	for (i = 0; i < iterations && (i % 256 || ioc_now_ns() < deadline); i++) {
		struct ioc_co *co = ioc_co_create(request_fn, &finished);

		if (!co) {
			migrated_ok = false;
			break;
		}
		ioc_co_enter(co);	/* runs until its yield */
		q_put(co);
	}
	atomic_store_explicit(&started, i, memory_order_release);
	q_close();
	return NULL;
}

static void *thread_b(void *arg)
{
	struct ioc_co *co;

	while ((co = q_get()))
		ioc_co_enter(co);	/* resumes on B and terminates here */
	return NULL;
}

static void ioc_coroutine_fn nop_fn(void *opaque)
{
}

/* Fill the pool past what the pattern can ever need (QCAP in flight, one
 * in each thread's hands, B's local list), from a helper thread whose
 * full batches it leaves on the global stack at exit. */
static void *prewarm(void *arg)
{
	unsigned n = *(unsigned *)arg;
	struct ioc_co **cos = calloc(n, sizeof(*cos));

	for (unsigned i = 0; i < n; i++)
		cos[i] = ioc_co_create(nop_fn, NULL);
	for (unsigned i = 0; i < n; i++)
		if (cos[i])
			ioc_co_enter(cos[i]);
	free(cos);
	return NULL;
}

static void test_cross_thread_no_new_creations(void)
{
	struct ioc_co_pool_stats s0, s1, s;
	unsigned warm = 5 * BATCH;	/* >= QCAP + 2 + BATCH + 1 */
	pthread_t a, b, w;
	unsigned long nstarted;

	ensure_configured();
	ASSERT_EQ(pthread_create(&w, NULL, prewarm, &warm), 0);
	pthread_join(w, NULL);
	ioc_co_pool_get_stats(&s0);
	ASSERT_UEQ(s0.max_pooled, BOUND);
	ASSERT_UGE(s0.pooled, warm);

	iterations = ioc_test_scaled(1000000);
	deadline = ioc_now_ns() + (int64_t)ioc_test_scaled(3000) * 1000000;
	ASSERT_EQ(pthread_create(&b, NULL, thread_b, NULL), 0);
	ASSERT_EQ(pthread_create(&a, NULL, thread_a, NULL), 0);
	/* Sample the bound while the pattern runs. */
	while (!atomic_load_explicit(&started, memory_order_acquire) &&
	       ioc_now_ns() < deadline) {
		ioc_co_pool_get_stats(&s);
		ASSERT_ULE(s.reserved, BOUND);
		sched_yield();
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	nstarted = atomic_load_explicit(&started, memory_order_relaxed);
	ASSERT_TRUE(migrated_ok);
	ASSERT_UEQ(atomic_load_explicit(&finished, memory_order_relaxed),
		   nstarted);
	ASSERT_UGE(nstarted, 1000);

	ioc_co_pool_get_stats(&s1);
	ASSERT_UEQ(s1.created, s0.created);	/* no creation after warm-up */
	ASSERT_UGE(s1.reused - s0.reused, nstarted);
	ASSERT_ULE(s1.pooled, BOUND);
	ASSERT_ULE(s1.reserved, BOUND);
	ioc_test_diag("%lu requests, created %lu in warm-up, 0 after; pooled %lu",
		      nstarted, (unsigned long)s0.created,
		      (unsigned long)s1.pooled);
}

static void *burst(void *arg)
{
	unsigned n = *(unsigned *)arg;
	struct ioc_co **cos = calloc(n, sizeof(*cos));
	struct ioc_co_pool_stats s;

	for (unsigned i = 0; i < n; i++)
		cos[i] = ioc_co_create(nop_fn, NULL);
	for (unsigned i = 0; i < n; i++) {
		if (cos[i])
			ioc_co_enter(cos[i]);
		if (i % 50 == 0) {
			ioc_co_pool_get_stats(&s);
			if (s.reserved > BOUND)
				migrated_ok = false;
		}
	}
	free(cos);
	return NULL;
}

/* 1000 coroutines alive at once, then all terminated: the pool keeps at
 * most BOUND and frees the rest. */
static void test_bound(void)
{
	struct ioc_co_pool_stats s0, s1;
	unsigned n = 1000;
	pthread_t t;

	ensure_configured();
	ioc_co_pool_get_stats(&s0);
	ASSERT_EQ(pthread_create(&t, NULL, burst, &n), 0);
	pthread_join(t, NULL);
	ASSERT_TRUE(migrated_ok);
	ioc_co_pool_get_stats(&s1);
	ASSERT_ULE(s1.pooled, BOUND);
	ASSERT_ULE(s1.reserved, BOUND);
	ASSERT_UGE(s1.freed - s0.freed, n - BOUND);
	ASSERT_UEQ(s1.created + s1.reused - s0.created - s0.reused, n);
}

/* A thread that exits with a partial local list frees it and gives its
 * reservation back; full batches stay for others. */
static void test_thread_exit(void)
{
	struct ioc_co_pool_stats s0, s1, s2;
	unsigned n = 2 * BATCH + 5;
	pthread_t t;

	ensure_configured();
	ioc_co_pool_get_stats(&s0);
	ASSERT_EQ(pthread_create(&t, NULL, burst, &n), 0);
	pthread_join(t, NULL);
	ioc_co_pool_get_stats(&s1);
	/* No thread holds a local list now except the main thread (which
	 * never pooled anything): pooled == reserved == whole batches. */
	ASSERT_UEQ(s1.pooled % BATCH, 0);
	ASSERT_UEQ(s1.reserved, s1.pooled);
	/* Taking them back from this thread creates nothing new. */
	ASSERT_EQ(pthread_create(&t, NULL, burst, &n), 0);
	pthread_join(t, NULL);
	ioc_co_pool_get_stats(&s2);
	ASSERT_ULE(s2.created - s1.created, n - (s1.pooled < n ? s1.pooled : n));
}

static void test_configure_errors(void)
{
	struct ioc_co_pool_opts bad = { .stack_size = 4096 };
	struct ioc_co_pool_opts late = { .batch_size = 8 };

	ensure_configured();
	ASSERT_EQ(ioc_co_pool_configure(&bad), -EINVAL);
	ASSERT_EQ(ioc_co_pool_configure(NULL), -EINVAL);
	ASSERT_EQ(ioc_co_pool_configure(&late), -EBUSY);	/* pool in use */
}

IOC_TEST_MAIN(
	IOC_TEST(test_cross_thread_no_new_creations),
	IOC_TEST(test_configure_errors),
	IOC_TEST(test_bound),
	IOC_TEST(test_thread_exit),
)
