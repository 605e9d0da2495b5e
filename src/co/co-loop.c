/*
 * Coroutines on event loops: wake, move, sleep, fd waits, awaited callbacks.
 *
 * Problem: a coroutine waits for things finishing on other threads (a
 * worker's completion, a mutex released on another loop) and must resume on
 * its own loop, exactly once, without locks or allocation; yet most
 * completions arrive on that loop (an io_uring CQE) and should cost a call.
 *
 * Design.  Every coroutine embeds an ioc_task; ioc_co_wake() posts it to the
 * home loop (a lock-free Treiber push), where it enters the coroutine.  The
 * *home-thread invariant* makes that safe: a coroutine that may be woken runs
 * on its home loop's thread, so the loop cannot run the wake before the
 * coroutine has finished yielding (the thread is busy running it), and a
 * waker on another thread may wake one that published itself as a waiter but
 * has not yet switched out.  Rejected: entering from another thread (it may
 * still run); a mutex + condvar per wait (allocates or blocks the loop).
 *
 * Direct path (QEMU's aio_co_wake): a waker on the home loop's thread outside
 * every coroutine (a loop callback, a task, the owner between polls) enters
 * at once: by the invariant the coroutine cannot be mid-yield, and depth
 * stays one coroutine, as only non-coroutine code enters directly.  The price
 * is re-entrancy: the waker's caller must not touch what the coroutine may
 * free (co.h).  A waker *inside* a coroutine posts: entering would nest
 * without bound, re-enter a running coroutine on a self-wake before its
 * yield, and "wake myself, yield" must still yield to the loop.  Rejected
 * there: QEMU's co_queue_wakeup (a list drained when the waker yields) runs
 * woken coroutines inside whatever entered the waker, spreading re-entrancy
 * to every ioc_co_enter() caller, and starves the loop on a self-wake; the
 * post costs one CAS.
 *
 * ioc_co_move_to() (QEMU's aio_co_reschedule_self) posts to the *current*
 * loop a task that, after the yield, sets the new home and wakes it there: a
 * post to the new loop from the old could be entered mid-yield.
 *
 * ioc_co_await: INIT -> WAITING (the coroutine's CAS, before yielding) or
 * INIT -> DONE (the callback, first, by exchange).  Only the side seeing the
 * other's mark acts: done() wakes only if it replaced WAITING, await() yields
 * only if its CAS from INIT succeeded: one resume, on the home loop, in
 * either order, whatever thread done() runs on.
 */
#include "co-int.h"

#include <assert.h>
#include <errno.h>

static void wake_task_fn(struct ioc_task *t)
{
	struct ioc_co *co = ioc_container_of(t, struct ioc_co, wake_task);

	assert(!co->entered && "woken coroutine still running");
	ioc_co_enter(co);
}

void ioc_co_wake(struct ioc_co *co)
{
	struct ioc_loop *home = co->home;

	assert(home && "ioc_co_wake() needs a home loop");
	/* The direct path (see above): this thread runs home and is outside
	 * every coroutine, so co has finished yielding.  Both loop checks:
	 * ioc_loop_new() makes a loop current on a thread that may never run
	 * it; the owner is the thread that last iterated it. */
	if (ioc_loop_current() == home && !ioc_in_coroutine() &&
	    ioc_loop_in_thread(home)) {
		assert(!co->entered && "woken coroutine still running");
		ioc_co_enter(co);
		return;
	}
	co->wake_task.fn = wake_task_fn;
	/* The post is a release push; the loop's pop is its acquire, so
	 * everything the waker wrote before is visible to the coroutine. */
	ioc_loop_post(home, &co->wake_task);
}

struct ioc_loop *ioc_co_home(struct ioc_co *co)
{
	return co->home;
}

void ioc_co_set_home(struct ioc_co *co, struct ioc_loop *loop)
{
	assert(!co->entered);
	co->home = loop;
}

static void move_task_fn(struct ioc_task *t)
{
	struct ioc_co *co = ioc_container_of(t, struct ioc_co, wake_task);

	/* Runs on the old loop after the coroutine yielded. */
	co->home = co->move_dest;
	co->move_dest = NULL;
	ioc_co_wake(co);
}

void ioc_coroutine_fn ioc_co_move_to(struct ioc_loop *loop)
{
	struct ioc_co *co = ioc_co_self();
	struct ioc_loop *here = ioc_loop_current();

	assert(co && "ioc_co_move_to() outside a coroutine");
	if (loop == here) {
		co->home = loop;
		return;
	}
	assert(here && "ioc_co_move_to() from a thread without a loop");
	co->move_dest = loop;
	co->wake_task.fn = move_task_fn;
	ioc_loop_post(here, &co->wake_task);
	ioc_co_yield();
}

/* ---- sleep ---------------------------------------------------------------- */

static void sleep_cb(void *opaque)
{
	ioc_co_enter(opaque);
}

void ioc_coroutine_fn ioc_co_sleep_ns(int64_t ns)
{
	struct ioc_co *co = ioc_co_self();
	struct ioc_timer t;

	assert(co);
	ioc__co_check_home(co);
	ioc_timer_init(&t, co->home, sleep_cb, co);
	ioc_timer_arm_in(&t, ns);
	ioc_co_yield();
}

/* ---- wait for an fd ------------------------------------------------------- */

struct fd_wait {
	struct ioc_co *co;
	struct ioc_loop *loop;
	int fd;
	int fired;
};

static void fd_fire(struct fd_wait *w, int ev)
{
	w->fired = ev;
	/* Level-triggered: remove the handler before the coroutine runs so
	 * it does not fire again (allowed from inside the handler). */
	ioc_loop_set_fd(w->loop, w->fd, NULL, NULL, NULL, NULL, NULL);
	ioc_co_enter(w->co);
}

static void fd_readable(void *opaque)
{
	fd_fire(opaque, IOC_CO_READ);
}

static void fd_writable(void *opaque)
{
	fd_fire(opaque, IOC_CO_WRITE);
}

int ioc_coroutine_fn ioc_co_wait_fd(int fd, int events)
{
	struct ioc_co *co = ioc_co_self();
	struct fd_wait w = { .co = co, .fd = fd };
	int ret;

	assert(co);
	ioc__co_check_home(co);
	if (!(events & (IOC_CO_READ | IOC_CO_WRITE)))
		return -EINVAL;
	w.loop = co->home;
	ret = ioc_loop_set_fd(w.loop, fd,
			      (events & IOC_CO_READ) ? fd_readable : NULL,
			      (events & IOC_CO_WRITE) ? fd_writable : NULL,
			      NULL, NULL, &w);
	if (ret < 0)
		return ret;
	ioc_co_yield();
	return w.fired;
}

/* ---- await ------------------------------------------------------------------ */

enum { AW_INIT, AW_WAITING, AW_DONE };

void ioc_co_await_init(struct ioc_co_await *aw)
{
	aw->co = ioc_co_self();
	aw->result = 0;
	/* Relaxed: aw reaches another thread only through the submit that
	 * follows, and that hand-off orders it. */
	atomic_store_explicit(&aw->state, AW_INIT, memory_order_relaxed);
}

int64_t ioc_coroutine_fn ioc_co_await(struct ioc_co_await *aw)
{
	int expected = AW_INIT;

	assert(aw->co == ioc_co_self());
	/* Acquire on failure pairs with the release exchange in
	 * ioc_co_await_done(): the result is visible when we skip the yield. */
	if (atomic_compare_exchange_strong_explicit(&aw->state, &expected,
						    AW_WAITING,
						    memory_order_acq_rel,
						    memory_order_acquire)) {
		ioc__co_check_home(aw->co);
		ioc_co_yield();
		/* Woken by done(); the wake task's post/pop (or program
		 * order, when done() entered us directly) already orders
		 * this, the acquire load states it. */
		expected = atomic_load_explicit(&aw->state, memory_order_acquire);
		assert(expected == AW_DONE);
	}
	return aw->result;
}

void ioc_co_await_done(struct ioc_co_await *aw, int64_t result)
{
	struct ioc_co *co = aw->co;	/* aw may die once state is DONE */

	aw->result = result;
	/* Release pairs with the acquires in ioc_co_await(); acquire pairs
	 * with its CAS so we see WAITING only after the coroutine committed
	 * to yielding. */
	if (atomic_exchange_explicit(&aw->state, AW_DONE,
				     memory_order_acq_rel) == AW_WAITING)
		ioc_co_wake(co);
}
