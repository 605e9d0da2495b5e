/*
 * Coroutines on loops: wake from another thread, move between loops
 * (iothreads), sleep, wait for an fd, and the await protocol with the
 * callback racing the yield from another thread.  The wake's direct path:
 * entered at once on the home thread outside a coroutine, deferred to the
 * loop from inside one, posted from other threads, and all three mixed
 * under load (run it under TSan and ASan).
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

/* ---- direct wake on the home thread ------------------------------------- */

static void ioc_coroutine_fn count_after_yield(void *opaque)
{
	int *runs = opaque;

	ioc_co_yield();
	(*runs)++;
}

struct wake_job {
	struct ioc_task task;
	struct ioc_co *co;
	int *runs;
	int seen;	/* *runs right after the wake returned */
	bool done;
};

static void wake_job_fn(struct ioc_task *t)
{
	struct wake_job *j = ioc_container_of(t, struct wake_job, task);

	ioc_co_wake(j->co);
	j->seen = *j->runs;
	j->done = true;
}

static void test_wake_direct(void)
{
	struct ioc_loop *l = main_loop();
	int runs = 0;
	struct ioc_co *co;
	struct wake_job j = { .runs = &runs };

	/* This thread runs l (an iteration makes it the owner). */
	ioc_loop_poll(l, false);
	ASSERT_TRUE(ioc_loop_in_thread(l));

	/* From the loop's owner between polls: co has run when wake returns. */
	co = ioc_co_create(count_after_yield, &runs);
	ioc_co_enter(co);
	ASSERT_EQ(runs, 0);
	ioc_co_wake(co);
	ASSERT_EQ(runs, 1);

	/* From a task the loop runs: the same. */
	j.co = ioc_co_create(count_after_yield, &runs);
	ioc_co_enter(j.co);
	j.task.fn = wake_job_fn;
	ioc_loop_post(l, &j.task);
	while (!j.done)
		ioc_loop_poll(l, true);
	ASSERT_EQ(j.seen, 2);
	ASSERT_EQ(runs, 2);
}

/* A wake from inside a coroutine on the home thread goes through the
 * loop: the woken coroutine has not run when wake returns, runs once,
 * and a self-wake still yields to the loop (the other wake runs first). */
struct nest {
	struct ioc_co *sleeper;
	int runs;
	int seen_after_wake;
	int seen_after_self_wake;
	bool done;
};

static void ioc_coroutine_fn nest_waker(void *opaque)
{
	struct nest *n = opaque;

	ioc_co_wake(n->sleeper);
	n->seen_after_wake = n->runs;
	ioc_co_wake(ioc_co_self());
	ioc_co_yield();
	n->seen_after_self_wake = n->runs;
	n->done = true;
}

static void test_wake_nested_deferred(void)
{
	struct ioc_loop *l = main_loop();
	struct nest n = { 0 };

	ioc_loop_poll(l, false);
	n.sleeper = ioc_co_create(count_after_yield, &n.runs);
	ioc_co_enter(n.sleeper);
	ioc_co_enter(ioc_co_create(nest_waker, &n));
	ASSERT_EQ(n.seen_after_wake, 0);
	ASSERT_EQ(n.runs, 0);		/* not drained when the waker yields */
	while (!n.done)
		ioc_loop_poll(l, true);
	ASSERT_EQ(n.seen_after_self_wake, 1);
	while (ioc_loop_poll(l, false))
		;
	ASSERT_EQ(n.runs, 1);
}

/* restart_all() from outside a coroutine enters the waiters directly; one
 * that queues itself again is not woken again by the same call. */
static struct ioc_co_queue rq;
static int rq_runs;
static bool rq_go;

static void ioc_coroutine_fn requeue_fn(void *opaque)
{
	(void)opaque;
	while (!rq_go) {
		ioc_co_queue_wait(&rq, NULL);
		rq_runs++;
	}
}

static void test_restart_all_direct(void)
{
	struct ioc_loop *l = main_loop();

	ioc_loop_poll(l, false);
	ioc_co_queue_init(&rq);
	ioc_co_enter(ioc_co_create(requeue_fn, NULL));
	ioc_co_enter(ioc_co_create(requeue_fn, NULL));
	ioc_co_queue_restart_all(&rq);
	ASSERT_EQ(rq_runs, 2);
	ASSERT_FALSE(ioc_co_queue_empty(&rq));
	rq_go = true;
	ioc_co_queue_restart_all(&rq);
	ASSERT_EQ(rq_runs, 4);
	ASSERT_TRUE(ioc_co_queue_empty(&rq));
}

/* A thread whose *current* loop is another thread's loop (ioc_loop_new()
 * or set_current() can do that) does not own it: its wake posts. */
static struct ioc_co *_Atomic far_co;
static _Atomic int far_done;
static pthread_t far_thread;	/* the iothread, written before far_co */
static bool far_same_thread;

static void ioc_coroutine_fn far_fn(void *opaque)
{
	(void)opaque;
	ioc_co_yield();
	far_same_thread = pthread_equal(pthread_self(), far_thread);
	/* Release pairs with the acquire loads in test_wake_not_owner(). */
	atomic_fetch_add_explicit(&far_done, 1, memory_order_release);
}

static void far_start(struct ioc_task *t)
{
	(void)t;
	struct ioc_co *co = ioc_co_create(far_fn, NULL);

	far_thread = pthread_self();
	ioc_co_enter(co);
	/* Release pairs with the acquire load in test_wake_not_owner(). */
	atomic_store_explicit(&far_co, co, memory_order_release);
}

static void test_wake_not_owner(void)
{
	struct ioc_loop *l = main_loop(), *other;
	struct ioc_iothread *t;
	struct ioc_task task = { .fn = far_start };
	struct ioc_co *co;

	ASSERT_OK(ioc_iothread_start(&t, &(struct ioc_iothread_opts){ .name = "co-far", .cpu = -1 }));
	other = ioc_iothread_loop(t);
	ioc_loop_post(other, &task);
	while (!(co = atomic_load_explicit(&far_co, memory_order_acquire)))
		sched_yield();
	ioc_loop_set_current(other);
	ioc_co_wake(co);
	ioc_loop_set_current(l);
	while (atomic_load_explicit(&far_done, memory_order_acquire) < 1)
		sched_yield();
	ASSERT_TRUE(far_same_thread);
	ioc_iothread_stop(t);
}

/* ---- mixed wakes under load ---------------------------------------------- */

/* Each round a coroutine awaits a completion delivered one of three ways:
 * by a worker thread (posted), by a task on the home loop (direct), or by
 * whichever home-thread code runs next -- another coroutine (deferred) or
 * the main loop between polls (direct). */
enum { MIX_CO = 8 };

struct mix_req {
	struct ioc_task task;
	struct ioc_co_await *aw;
	int64_t val;
	struct mix_req *next;
};

static pthread_mutex_t mix_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mix_req *mix_remote;	/* under mix_lock */
static struct mix_req *mix_local;	/* home thread only */
static _Atomic bool mix_stop;
static int mix_finished, mix_bad, mix_resumes;
static pthread_t mix_home;

static void mix_complete(struct mix_req *r)
{
	/* r is on the awaiting coroutine's stack: done() is the last touch. */
	ioc_co_await_done(r->aw, r->val);
}

static void *mix_worker(void *arg)
{
	(void)arg;
	while (!atomic_load_explicit(&mix_stop, memory_order_acquire)) {
		struct mix_req *r;

		pthread_mutex_lock(&mix_lock);
		r = mix_remote;
		mix_remote = NULL;
		pthread_mutex_unlock(&mix_lock);
		if (!r)
			sched_yield();
		while (r) {
			struct mix_req *next = r->next;

			mix_complete(r);
			r = next;
		}
	}
	return NULL;
}

static void mix_task(struct ioc_task *t)
{
	mix_complete(ioc_container_of(t, struct mix_req, task));
}

static void mix_drain_local(void)
{
	while (mix_local) {
		struct mix_req *r = mix_local;

		mix_local = r->next;
		mix_complete(r);
	}
}

struct mix_co {
	int id;
	int rounds;
	struct ioc_loop *home;
};

static void ioc_coroutine_fn mix_fn(void *opaque)
{
	struct mix_co *m = opaque;

	for (int i = 0; i < m->rounds; i++) {
		struct ioc_co_await aw;
		struct mix_req r = { .aw = &aw, .val = (int64_t)i * 31 + m->id };

		ioc_co_await_init(&aw);
		mix_drain_local();	/* others' completions, from a coroutine */
		switch ((i + m->id) % 3) {
		case 0:
			pthread_mutex_lock(&mix_lock);
			r.next = mix_remote;
			mix_remote = &r;
			pthread_mutex_unlock(&mix_lock);
			break;
		case 1:
			r.task.fn = mix_task;
			ioc_loop_post(m->home, &r.task);
			break;
		default:
			r.next = mix_local;
			mix_local = &r;
			break;
		}
		if (ioc_co_await(&aw) != r.val)
			mix_bad++;
		if (!pthread_equal(pthread_self(), mix_home) ||
		    ioc_loop_current() != m->home)
			mix_bad++;
		mix_resumes++;
	}
	mix_finished++;
}

static void test_wake_mixed_stress(void)
{
	struct ioc_loop *l = main_loop();
	struct mix_co m[MIX_CO];
	int rounds = (int)ioc_test_scaled(3000);
	pthread_t w;

	mix_home = pthread_self();
	ioc_loop_poll(l, false);
	ASSERT_EQ(pthread_create(&w, NULL, mix_worker, NULL), 0);
	for (int i = 0; i < MIX_CO; i++) {
		m[i] = (struct mix_co){ .id = i, .rounds = rounds, .home = l };
		ioc_co_enter(ioc_co_create(mix_fn, &m[i]));
	}
	while (mix_finished < MIX_CO) {
		mix_drain_local();	/* from outside any coroutine: direct */
		ioc_loop_poll(l, false);
	}
	atomic_store_explicit(&mix_stop, true, memory_order_release);
	pthread_join(w, NULL);
	ASSERT_EQ(mix_bad, 0);
	ASSERT_EQ(mix_resumes, MIX_CO * rounds);
	ASSERT_TRUE(mix_local == NULL && mix_remote == NULL);
}

IOC_TEST_MAIN(
	IOC_TEST(test_wake_from_thread),
	IOC_TEST(test_edges),
	IOC_TEST(test_move_to),
	IOC_TEST(test_sleep),
	IOC_TEST(test_wait_fd),
	IOC_TEST(test_await_races),
	IOC_TEST(test_wake_direct),
	IOC_TEST(test_wake_nested_deferred),
	IOC_TEST(test_restart_all_direct),
	IOC_TEST(test_wake_not_owner),
	IOC_TEST(test_wake_mixed_stress),
)
