/*
 * Coroutines on loops: wake from another thread, move between loops
 * (iothreads), sleep, wait for an fd, and the await protocol with the
 * callback racing the yield from another thread.
 */
#include "iocore/co.h"
#include "tap.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

static struct ioc_loop *main_loop(void)
{
	struct ioc_loop *l = ioc_loop_current();

	if (!l)
		ASSERT_OK(ioc_loop_new(&l, NULL));
	ASSERT_PTR_EQ(ioc_loop_current(), l);
	return l;
}

/* Run the calling thread's loop until *flag (set by a coroutine). */
static void run_until(struct ioc_loop *l, _Atomic int *flag, int want)
{
	while (atomic_load_explicit(flag, memory_order_acquire) < want)
		ioc_loop_poll(l, true);
}

/* ---- wake from another thread ---------------------------------------- */

static _Atomic int woke_done;

static void ioc_coroutine_fn wait_for_wake(void *opaque)
{
	struct ioc_loop *home = opaque;

	ioc_co_yield();
	if (ioc_loop_current() == home)
		atomic_fetch_add_explicit(&woke_done, 1, memory_order_release);
}

static void *waker(void *arg)
{
	ioc_co_wake(arg);
	return NULL;
}

static void test_wake_from_thread(void)
{
	struct ioc_loop *l = main_loop();
	int n = (int)ioc_test_scaled(200);

	for (int i = 0; i < n; i++) {
		struct ioc_co *co = ioc_co_create(wait_for_wake, l);
		pthread_t t;

		ASSERT_PTR_EQ(ioc_co_home(co), l);
		ioc_co_enter(co);
		ASSERT_EQ(pthread_create(&t, NULL, waker, co), 0);
		run_until(l, &woke_done, i + 1);
		pthread_join(t, NULL);
	}
	ASSERT_EQ(atomic_load(&woke_done), n);
}

/* ---- move between loops -------------------------------------------------- */

struct mover {
	struct ioc_loop *loops[3];
	int rounds;
	int bad;
	_Atomic int *done;
};

static void ioc_coroutine_fn mover_fn(void *opaque)
{
	struct mover *m = opaque;

	for (int r = 0; r < m->rounds; r++) {
		for (int i = 1; i <= 3; i++) {
			struct ioc_loop *to = m->loops[i % 3];

			ioc_co_move_to(to);
			if (ioc_loop_current() != to || ioc_co_home(ioc_co_self()) != to)
				m->bad++;
		}
	}
	atomic_fetch_add_explicit(m->done, 1, memory_order_release);
}

static void test_move_to(void)
{
	struct ioc_loop *l = main_loop();
	struct ioc_iothread *t1, *t2;
	static _Atomic int done;
	enum { NCO = 8 };
	struct mover m[NCO];

	ASSERT_OK(ioc_iothread_start(&t1, &(struct ioc_iothread_opts){ .name = "co-t1", .cpu = -1 }));
	ASSERT_OK(ioc_iothread_start(&t2, &(struct ioc_iothread_opts){ .name = "co-t2", .cpu = -1 }));
	for (int i = 0; i < NCO; i++) {
		m[i] = (struct mover){
			.loops = { l, ioc_iothread_loop(t1), ioc_iothread_loop(t2) },
			.rounds = (int)ioc_test_scaled(100),
			.done = &done,
		};
		ioc_co_enter(ioc_co_create(mover_fn, &m[i]));
	}
	run_until(l, &done, NCO);
	for (int i = 0; i < NCO; i++)
		ASSERT_EQ(m[i].bad, 0);
	ioc_iothread_stop(t1);
	ioc_iothread_stop(t2);
}

/* ---- sleep ------------------------------------------------------------------ */

static _Atomic int slept;

static void ioc_coroutine_fn sleeper(void *opaque)
{
	int64_t *elapsed = opaque;
	int64_t t0 = ioc_now_ns();

	ioc_co_sleep_ns(2000000);
	*elapsed = ioc_now_ns() - t0;
	atomic_fetch_add_explicit(&slept, 1, memory_order_release);
}

static void test_sleep(void)
{
	struct ioc_loop *l = main_loop();
	int64_t elapsed[4] = { 0 };

	for (int i = 0; i < 4; i++)
		ioc_co_enter(ioc_co_create(sleeper, &elapsed[i]));
	ASSERT_EQ(atomic_load(&slept), 0);
	run_until(l, &slept, 4);
	for (int i = 0; i < 4; i++)
		ASSERT_GE(elapsed[i], 2000000);	/* never early */
}

/* ---- wait for an fd ---------------------------------------------------------- */

struct fdw {
	int fd, events, got;
	char byte;
};
static _Atomic int fd_done;

static void ioc_coroutine_fn fd_waiter(void *opaque)
{
	struct fdw *w = opaque;

	w->got = ioc_co_wait_fd(w->fd, w->events);
	if (w->got == IOC_CO_READ && read(w->fd, &w->byte, 1) != 1)
		w->got = -1;
	atomic_fetch_add_explicit(&fd_done, 1, memory_order_release);
}

static void *write_later(void *arg)
{
	int fd = *(int *)arg;

	ASSERT_EQ(write(fd, "x", 1), 1);
	return NULL;
}

static void test_wait_fd(void)
{
	struct ioc_loop *l = main_loop();
	int p[2];
	struct fdw r, w;
	pthread_t t;

	ASSERT_OK(pipe(p));
	r = (struct fdw){ .fd = p[0], .events = IOC_CO_READ };
	w = (struct fdw){ .fd = p[1], .events = IOC_CO_WRITE };
	ioc_co_enter(ioc_co_create(fd_waiter, &r));
	ioc_co_enter(ioc_co_create(fd_waiter, &w));
	run_until(l, &fd_done, 1);
	ASSERT_EQ(w.got, IOC_CO_WRITE);		/* an empty pipe is writable */
	ASSERT_EQ(r.got, 0);			/* still waiting */
	ASSERT_EQ(pthread_create(&t, NULL, write_later, &p[1]), 0);
	run_until(l, &fd_done, 2);
	pthread_join(t, NULL);
	ASSERT_EQ(r.got, IOC_CO_READ);
	ASSERT_EQ(r.byte, 'x');
	close(p[0]);
	close(p[1]);
}

/* ---- await ------------------------------------------------------------------------ */

/* A worker completes whatever await is published in `slot`. */
static struct ioc_co_await *_Atomic slot;
static _Atomic bool worker_stop;

static void *completer(void *arg)
{
	unsigned long n = 0;

	while (!atomic_load_explicit(&worker_stop, memory_order_acquire)) {
		/* Acquire pairs with the release store in await_fn. */
		struct ioc_co_await *aw = atomic_exchange_explicit(&slot, NULL,
						memory_order_acquire);

		if (aw)
			ioc_co_await_done(aw, (int64_t)++n * 7);
		else
			sched_yield();
	}
	return NULL;
}

static _Atomic int await_done;
static int await_bad;

static void ioc_coroutine_fn await_fn(void *opaque)
{
	int rounds = *(int *)opaque;
	int64_t expect = 0;

	for (int i = 0; i < rounds; i++) {
		struct ioc_co_await aw;
		int64_t res;

		ioc_co_await_init(&aw);
		atomic_store_explicit(&slot, &aw, memory_order_release);
		/* Sometimes give the worker time to finish before we wait. */
		if (i % 3 == 0)
			for (int k = 0; k < 200 && atomic_load(&slot); k++)
				sched_yield();
		res = ioc_co_await(&aw);
		expect += 7;
		if (res != expect)
			await_bad++;
	}
	/* And the synchronous case: done before await, same coroutine. */
	struct ioc_co_await aw;

	ioc_co_await_init(&aw);
	ioc_co_await_done(&aw, -5);
	if (ioc_co_await(&aw) != -5)
		await_bad++;
	atomic_fetch_add_explicit(&await_done, 1, memory_order_release);
}

static void test_await_races(void)
{
	struct ioc_loop *l = main_loop();
	int rounds = (int)ioc_test_scaled(3000);
	pthread_t t;

	ASSERT_EQ(pthread_create(&t, NULL, completer, NULL), 0);
	ioc_co_enter(ioc_co_create(await_fn, &rounds));
	run_until(l, &await_done, 1);
	atomic_store_explicit(&worker_stop, true, memory_order_release);
	pthread_join(t, NULL);
	ASSERT_EQ(await_bad, 0);
}

/* Edge cases that must not yield: bad events, moving to the loop we are
 * on; and set_home on a suspended coroutine redirects its wake. */
static int edge_ret;
static struct ioc_loop *edge_seen;
static _Atomic int edge_done;

static void ioc_coroutine_fn edge_fn(void *opaque)
{
	struct ioc_loop *back = opaque;

	edge_ret = ioc_co_wait_fd(0, 0);
	ioc_co_move_to(ioc_loop_current());
	ioc_co_yield();
	edge_seen = ioc_loop_current();
	ioc_co_move_to(back);
	atomic_store_explicit(&edge_done, 1, memory_order_release);
}

static void test_edges(void)
{
	struct ioc_loop *l = main_loop(), *other;
	struct ioc_iothread *t;
	struct ioc_co *co = ioc_co_create(edge_fn, l);

	ioc_co_enter(co);
	ASSERT_EQ(edge_ret, -EINVAL);
	ASSERT_TRUE(ioc_co_home(co) == l);
	ASSERT_OK(ioc_iothread_start(&t, &(struct ioc_iothread_opts){ .name = "co-edge", .cpu = -1 }));
	other = ioc_iothread_loop(t);
	ioc_co_set_home(co, other);
	ioc_co_wake(co);	/* runs on the iothread, then comes back */
	run_until(l, &edge_done, 1);
	ioc_iothread_stop(t);
	ASSERT_PTR_EQ(edge_seen, other);
}

IOC_TEST_MAIN(
	IOC_TEST(test_wake_from_thread),
	IOC_TEST(test_edges),
	IOC_TEST(test_move_to),
	IOC_TEST(test_sleep),
	IOC_TEST(test_wait_fd),
	IOC_TEST(test_await_races),
)
