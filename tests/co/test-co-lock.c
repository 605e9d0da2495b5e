/*
 * Coroutine locks.  The main case: a CoMutex contended by coroutines on 4
 * loops in 4 threads -- mutual exclusion (an owner flag and a plain
 * counter) and no lost wakeup (every coroutine finishes).  Plus CoQueue,
 * CoRwlock and the event, single- and multi-threaded.
 */
#include "iocore/co.h"
#include "tap.h"

#include <pthread.h>
#include <stdatomic.h>

static struct ioc_loop *main_loop(void)
{
	struct ioc_loop *l = ioc_loop_current();

	if (!l)
		ASSERT_OK(ioc_loop_new(&l, NULL));
	return l;
}

static void run_until(struct ioc_loop *l, _Atomic int *flag, int want)
{
	while (atomic_load_explicit(flag, memory_order_acquire) < want)
		ioc_loop_poll(l, true);
}

/* Let the loop run other things, then continue (on the home loop). */
static void ioc_coroutine_fn yield_to_loop(void)
{
	ioc_co_wake(ioc_co_self());
	ioc_co_yield();
}

/* ---- CoMutex across 4 loops ------------------------------------------------- */

enum { NTHREADS = 4, PER_THREAD = 8 };

static struct {
	struct ioc_co_mutex m;
	_Atomic int owner;	/* 0 or the holder's id: checks exclusion */
	unsigned long counter;	/* plain: only touched under m */
	int violations;		/* under m */
	int iters;
	int64_t deadline;
	_Atomic unsigned long total;	/* lock/unlock pairs done */
	_Atomic int finished;
	struct ioc_loop *report;
} mx;

static void ioc_coroutine_fn mutex_worker(void *opaque)
{
	int id = (int)(intptr_t)opaque;
	int i;

	/* Bounded by count and, every 64 rounds, by the deadline. */
	for (i = 0; i < mx.iters && (i % 64 || ioc_now_ns() < mx.deadline); i++) {
		ioc_co_mutex_lock(&mx.m);
		if (atomic_exchange_explicit(&mx.owner, id, memory_order_relaxed) != 0)
			mx.violations++;
		mx.counter++;
		if (i % 4 == 0)
			yield_to_loop();	/* hold it across a yield */
		if (atomic_exchange_explicit(&mx.owner, 0, memory_order_relaxed) != id)
			mx.violations++;
		ioc_co_mutex_unlock(&mx.m);
		if (i % 3 == 0)
			yield_to_loop();
	}
	atomic_fetch_add_explicit(&mx.total, (unsigned long)i, memory_order_relaxed);
	ioc_co_move_to(mx.report);	/* report on the main thread's loop */
	atomic_fetch_add_explicit(&mx.finished, 1, memory_order_release);
}

static int start_workers(void *arg)
{
	int base = (int)(intptr_t)arg;

	for (int k = 0; k < PER_THREAD; k++) {
		struct ioc_co *co = ioc_co_create(mutex_worker,
						  (void *)(intptr_t)(base + k + 1));

		if (!co)
			return -12;
		ioc_co_enter(co);
	}
	return 0;
}

static void test_mutex_four_loops(void)
{
	struct ioc_iothread *t[NTHREADS];
	struct ioc_loop *l = main_loop();

	ioc_co_mutex_init(&mx.m);
	mx.report = l;
	mx.iters = (int)ioc_test_scaled(20000);
	mx.deadline = ioc_now_ns() + 3000000000LL;
	for (int i = 0; i < NTHREADS; i++)
		ASSERT_OK(ioc_iothread_start(&t[i], &(struct ioc_iothread_opts){ .name = "co-mx", .cpu = -1 }));
	for (int i = 0; i < NTHREADS; i++)
		ASSERT_OK(ioc_iothread_call(t[i], start_workers,
					    (void *)(intptr_t)(i * PER_THREAD)));
	/* Every coroutine finishing is the "no lost wakeup" check: a lost
	 * grant leaves its waiter (and everyone queued behind it) asleep
	 * forever and the test times out. */
	run_until(l, &mx.finished, NTHREADS * PER_THREAD);
	for (int i = 0; i < NTHREADS; i++)
		ioc_iothread_stop(t[i]);
	ASSERT_EQ(mx.violations, 0);
	ASSERT_UEQ(mx.counter, atomic_load(&mx.total));
	ASSERT_UGE(mx.counter, (unsigned long)NTHREADS * PER_THREAD * 64);
	ioc_test_diag("%lu lock/unlock pairs on %d loops", mx.counter, NTHREADS);
	ASSERT_EQ(atomic_load(&mx.owner), 0);
	ASSERT_EQ(mx.m.locked, 0);
}

/* FIFO: waiters get the mutex in arrival order (one loop). */
static int order[8], norder;
static struct ioc_co_mutex fm;
static _Atomic int fifo_done;

static void ioc_coroutine_fn fifo_worker(void *opaque)
{
	ioc_co_mutex_lock(&fm);
	order[norder++] = (int)(intptr_t)opaque;
	ioc_co_mutex_unlock(&fm);
	atomic_fetch_add(&fifo_done, 1);
}

static void ioc_coroutine_fn fifo_holder(void *opaque)
{
	ioc_co_mutex_lock(&fm);
	for (int i = 0; i < 6; i++)	/* the others queue up meanwhile */
		ioc_co_enter(ioc_co_create(fifo_worker, (void *)(intptr_t)i));
	ioc_co_mutex_unlock(&fm);
	atomic_fetch_add(&fifo_done, 1);
}

static void test_mutex_fifo(void)
{
	struct ioc_loop *l = main_loop();

	ioc_co_mutex_init(&fm);
	ioc_co_enter(ioc_co_create(fifo_holder, NULL));
	run_until(l, &fifo_done, 7);
	ASSERT_EQ(norder, 6);
	for (int i = 0; i < 6; i++)
		ASSERT_EQ(order[i], i);
}

/* ---- CoQueue as a condition variable ------------------------------------------ */

static struct ioc_co_mutex qm;
static struct ioc_co_queue qq;
static int items, consumed;
static _Atomic int q_done;

static void ioc_coroutine_fn consumer(void *opaque)
{
	ioc_co_mutex_lock(&qm);
	while (items == 0)
		ioc_co_queue_wait(&qq, &qm);
	items--;
	consumed++;
	ioc_co_mutex_unlock(&qm);
	atomic_fetch_add(&q_done, 1);
}

static void ioc_coroutine_fn producer(void *opaque)
{
	for (int i = 0; i < 5; i++) {
		ioc_co_mutex_lock(&qm);
		items++;
		ioc_co_queue_next(&qq);
		ioc_co_mutex_unlock(&qm);
		yield_to_loop();
	}
}

static void test_queue(void)
{
	struct ioc_loop *l = main_loop();

	ioc_co_mutex_init(&qm);
	ioc_co_queue_init(&qq);
	for (int i = 0; i < 5; i++)
		ioc_co_enter(ioc_co_create(consumer, NULL));
	ASSERT_FALSE(ioc_co_queue_empty(&qq));
	ioc_co_enter(ioc_co_create(producer, NULL));
	run_until(l, &q_done, 5);
	ASSERT_EQ(consumed, 5);
	ASSERT_EQ(items, 0);
	ASSERT_TRUE(ioc_co_queue_empty(&qq));
	ASSERT_FALSE(ioc_co_queue_next(&qq));
}

/* ---- CoRwlock ---------------------------------------------------------------------- */

static struct ioc_co_rwlock rw;
static int readers_in, writers_in, rw_bad, max_readers;
static _Atomic int rw_done;

static void ioc_coroutine_fn rw_worker(void *opaque)
{
	bool writer = (intptr_t)opaque & 1;

	for (int i = 0; i < 50; i++) {
		if (writer) {
			ioc_co_rwlock_wrlock(&rw);
			if (writers_in || readers_in)
				rw_bad++;
			writers_in++;
			yield_to_loop();
			writers_in--;
		} else {
			ioc_co_rwlock_rdlock(&rw);
			if (writers_in)
				rw_bad++;
			readers_in++;
			if (readers_in > max_readers)
				max_readers = readers_in;
			yield_to_loop();
			readers_in--;
		}
		ioc_co_rwlock_unlock(&rw);
		yield_to_loop();
	}
	atomic_fetch_add(&rw_done, 1);
}

static void test_rwlock(void)
{
	struct ioc_loop *l = main_loop();

	ioc_co_rwlock_init(&rw);
	for (int i = 0; i < 8; i++)
		ioc_co_enter(ioc_co_create(rw_worker, (void *)(intptr_t)(i % 4 == 0)));
	run_until(l, &rw_done, 8);
	ASSERT_EQ(rw_bad, 0);
	ASSERT_GT(max_readers, 1);	/* readers do share */
}

/* ---- event, set from another thread ---------------------------------------------- */

static struct ioc_co_event ev;
static _Atomic int ev_waiting, ev_done;

static void ioc_coroutine_fn ev_waiter(void *opaque)
{
	atomic_fetch_add(&ev_waiting, 1);
	ioc_co_event_wait(&ev);
	atomic_fetch_add_explicit(&ev_done, 1, memory_order_release);
}

static void *ev_setter(void *arg)
{
	while (atomic_load(&ev_waiting) < 3)
		sched_yield();
	ioc_co_event_set(&ev);
	return NULL;
}

static void test_event(void)
{
	struct ioc_loop *l = main_loop();
	int rounds = (int)ioc_test_scaled(200);

	ioc_co_event_init(&ev);
	for (int r = 0; r < rounds; r++) {
		pthread_t t;

		atomic_store(&ev_waiting, 0);
		atomic_store(&ev_done, 0);
		ioc_co_event_reset(&ev);
		ASSERT_FALSE(ioc_co_event_is_set(&ev));
		ASSERT_EQ(pthread_create(&t, NULL, ev_setter, NULL), 0);
		for (int i = 0; i < 3; i++)
			ioc_co_enter(ioc_co_create(ev_waiter, NULL));
		run_until(l, &ev_done, 3);
		pthread_join(t, NULL);
		ASSERT_TRUE(ioc_co_event_is_set(&ev));
		/* Waiting on a set event returns at once. */
		atomic_store(&ev_done, 0);
		ioc_co_enter(ioc_co_create(ev_waiter, NULL));
		ASSERT_EQ(atomic_load(&ev_done), 1);
	}
}

IOC_TEST_MAIN(
	IOC_TEST(test_mutex_four_loops),
	IOC_TEST(test_mutex_fifo),
	IOC_TEST(test_queue),
	IOC_TEST(test_rwlock),
	IOC_TEST(test_event),
)
