/*
 * Coroutine locks: CoMutex, CoQueue, CoRwlock, event (latch).
 *
 * Waiting never blocks a thread: a waiter yields with a node on its stack
 * linked into the lock; ioc_co_wake() resumes it on its home loop from any
 * thread, even before it switched out (co-loop.c's home-thread invariant).
 *
 * CoMutex (the others are told where they start), shared by coroutines on
 * several loops, must be FIFO-fair, cost one atomic uncontended, and never
 * lose a wakeup when unlock races a new waiter.  `locked` counts the holder
 * plus each announced waiter; arrivals push a node on `from_push` (a Treiber
 * stack, any thread); `to_pop` holds them in FIFO order, owned by whoever has
 * the *pop right*.  Lock: a CAS 0 -> 1 takes a free mutex (only at 0: it
 * never overtakes an announced waiter); else push the node FIRST, then
 * increment `locked`.  If that found 0, the mutex was released meanwhile and
 * we hold the pop right: grant the oldest node, to ourselves (return) or an
 * earlier arrival (wake it); otherwise, or then, yield until granted.
 * Unlock: decrement; unless from 1, it has the pop right: grant the oldest.
 *
 * No lost wakeup: a node is pushed before its increment and `locked` changes
 * only by RMWs, so the later RMW in its modification order (an unlocker
 * seeing > 1, an arrival seeing 0) sees every node whose increment came
 * earlier: an unlocker seeing > 1 always finds one (the holder's was popped
 * at its grant).  A node granted before its owner's increment (pushed, popped
 * by another) leaves the owner seeing > 0, the granter still counted: it
 * yields, and the posted wake resumes it.  The pop right is exclusive: it
 * passes from unlocker to woken holder (the loop's release/acquire post) and,
 * at 0, to the arrival whose increment reads that 0, all ordered by
 * `locked`'s RMW chain, so `to_pop` needs no atomics.  src/co/comutex.pml
 * checks these steps (3 coroutines, 3 threads, 2 rounds, every interleaving)
 * for mutual exclusion, an exclusive pop right, no counted waiter missed, no
 * lost wakeup; with push and increment swapped it finds the lost waiter.
 *
 * Rejected: QEMU's CoMutex (a lock-free queue plus a handoff/sequence
 * protocol for the window between a waiter's increment and its push, which
 * pushing first closes with no handoff state); a spinlock around the queue (a
 * preempted holder stalls every loop).  Cost: uncontended, a CAS and a
 * fetch_sub; contended, a push CAS, a fetch_add, an exchange per batch of
 * arrivals and a loop post per handoff.
 */
#include "co-int.h"

#include <assert.h>

struct ioc_co_waiter {
	struct ioc_co_waiter *next;
	struct ioc_co *co;
};

/* ---- CoMutex ---------------------------------------------------------------- */

void ioc_co_mutex_init(struct ioc_co_mutex *m)
{
	*m = (struct ioc_co_mutex){ 0 };
}

static void push_arrival(struct ioc_co_mutex *m, struct ioc_co_waiter *w)
{
	/* Relaxed: only a guess for the CAS below. */
	struct ioc_co_waiter *head =
		atomic_load_explicit(&m->from_push, memory_order_relaxed);

	do {
		w->next = head;
		/* Release: publishes *w to pop_oldest()'s acquire exchange. */
	} while (!atomic_compare_exchange_weak_explicit(&m->from_push, &head,
						       w, memory_order_release,
						       memory_order_relaxed));
}

/* Pop-right holder only. */
static struct ioc_co_waiter *pop_oldest(struct ioc_co_mutex *m)
{
	struct ioc_co_waiter *w = m->to_pop;

	if (!w) {
		/* Acquire pairs with push_arrival()'s release CAS. */
		struct ioc_co_waiter *l =
			atomic_exchange_explicit(&m->from_push, NULL,
						 memory_order_acquire);

		while (l) {		/* reverse: oldest first */
			struct ioc_co_waiter *next = l->next;

			l->next = w;
			w = l;
			l = next;
		}
	}
	if (w)
		m->to_pop = w->next;
	return w;
}

/* Give the mutex to w's owner.  Read co before waking: w lives on the
 * owner's stack and may be gone as soon as it runs. */
static void grant(struct ioc_co_waiter *w)
{
	struct ioc_co *co = w->co;

	ioc_co_wake(co);
}

void ioc_coroutine_fn ioc_co_mutex_lock(struct ioc_co_mutex *m)
{
	struct ioc_co *self = ioc_co_self();
	struct ioc_co_waiter w = { .co = self };
	int zero = 0;

	assert(self && "ioc_co_mutex_lock() outside a coroutine");
	/* Acquire pairs with the release fetch_sub in unlock. */
	if (atomic_compare_exchange_strong_explicit(&m->locked, &zero, 1,
						    memory_order_acquire,
						    memory_order_relaxed)) {
		m->holder = self;
		return;
	}
	ioc__co_check_home(self);
	push_arrival(m, &w);
	/* Acq_rel: orders our push before the increment (release) for the
	 * unlocker that reads it, and makes the previous unlocker's writes
	 * (to_pop) visible when we read 0 and take the pop right. */
	if (atomic_fetch_add_explicit(&m->locked, 1,
				      memory_order_acq_rel) == 0) {
		struct ioc_co_waiter *first = pop_oldest(m);

		assert(first);
		if (first == &w) {
			m->holder = self;
			return;
		}
		grant(first);
	}
	ioc_co_yield();	/* until someone grants our node */
	m->holder = self;
}

void ioc_coroutine_fn ioc_co_mutex_unlock(struct ioc_co_mutex *m)
{
	assert(m->holder == ioc_co_self() && "unlocking a mutex we do not hold");
	m->holder = NULL;
	/* Acq_rel: release our critical section to the next taker; acquire
	 * the pushes of every waiter counted before us (see above). */
	if (atomic_fetch_sub_explicit(&m->locked, 1,
				      memory_order_acq_rel) == 1)
		return;
	struct ioc_co_waiter *w = pop_oldest(m);

	assert(w && "a counted waiter must be queued");
	grant(w);
}

/* ---- CoQueue -------------------------------------------------------------- */

/* A plain FIFO: callers serialise, normally with the mutex they pass to
 * wait. */

void ioc_co_queue_init(struct ioc_co_queue *q)
{
	q->head = q->tail = NULL;
}

void ioc_coroutine_fn ioc_co_queue_wait(struct ioc_co_queue *q,
					struct ioc_co_mutex *m)
{
	struct ioc_co_waiter w = { .co = ioc_co_self() };

	assert(w.co && "ioc_co_queue_wait() outside a coroutine");
	ioc__co_check_home(w.co);
	if (q->tail)
		q->tail->next = &w;
	else
		q->head = &w;
	q->tail = &w;
	if (m)
		ioc_co_mutex_unlock(m);
	ioc_co_yield();	/* woken by next()/restart_all() */
	if (m)
		ioc_co_mutex_lock(m);
}

bool ioc_co_queue_next(struct ioc_co_queue *q)
{
	struct ioc_co_waiter *w = q->head;

	if (!w)
		return false;
	q->head = w->next;
	if (!q->head)
		q->tail = NULL;
	grant(w);
	return true;
}

/* Detach the list first: a waiter woken directly (ioc_co_wake() from
 * outside a coroutine) runs before grant() returns and may queue itself
 * again, and must not be woken a second time by this call.  Read next
 * before each grant: the node is on the waiter's stack. */
void ioc_co_queue_restart_all(struct ioc_co_queue *q)
{
	struct ioc_co_waiter *w = q->head;

	q->head = q->tail = NULL;
	while (w) {
		struct ioc_co_waiter *next = w->next;

		grant(w);
		w = next;
	}
}

bool ioc_co_queue_empty(const struct ioc_co_queue *q)
{
	return q->head == NULL;
}

/* ---- CoRwlock --------------------------------------------------------------- */

/* A mutex, a queue and counts; a waiting writer blocks new readers so
 * writers do not starve. */

void ioc_co_rwlock_init(struct ioc_co_rwlock *l)
{
	ioc_co_mutex_init(&l->mutex);
	ioc_co_queue_init(&l->queue);
	l->readers = 0;
	l->pending_writers = 0;
	l->writer = false;
}

void ioc_coroutine_fn ioc_co_rwlock_rdlock(struct ioc_co_rwlock *l)
{
	ioc_co_mutex_lock(&l->mutex);
	while (l->writer || l->pending_writers)
		ioc_co_queue_wait(&l->queue, &l->mutex);
	l->readers++;
	ioc_co_mutex_unlock(&l->mutex);
}

void ioc_coroutine_fn ioc_co_rwlock_wrlock(struct ioc_co_rwlock *l)
{
	ioc_co_mutex_lock(&l->mutex);
	l->pending_writers++;
	while (l->writer || l->readers)
		ioc_co_queue_wait(&l->queue, &l->mutex);
	l->pending_writers--;
	l->writer = true;
	ioc_co_mutex_unlock(&l->mutex);
}

void ioc_coroutine_fn ioc_co_rwlock_unlock(struct ioc_co_rwlock *l)
{
	ioc_co_mutex_lock(&l->mutex);
	if (l->writer) {
		l->writer = false;
	} else {
		assert(l->readers > 0);
		l->readers--;
	}
	/* Everyone re-checks; O(waiters) per release, fine for the short
	 * queues storage code has. */
	if (!l->readers)
		ioc_co_queue_restart_all(&l->queue);
	ioc_co_mutex_unlock(&l->mutex);
}

/* ---- event ---------------------------------------------------------------------- */

/* One atomic word: NULL, a stack of waiter nodes, or EVENT_SET.  set()
 * exchanges in EVENT_SET and wakes the stack it took; wait() pushes with a
 * CAS that fails if EVENT_SET arrived, so a waiter either sees the event
 * set or is in the stack set() takes. */
#define EVENT_SET ((struct ioc_co_waiter *)(uintptr_t)1)

void ioc_co_event_init(struct ioc_co_event *e)
{
	/* Relaxed: before the event is shared. */
	atomic_store_explicit(&e->head, NULL, memory_order_relaxed);
}

void ioc_co_event_set(struct ioc_co_event *e)
{
	/* Acq_rel: release what the setter wrote to the waiters that see
	 * SET; acquire the nodes pushed by ioc_co_event_wait()'s CAS. */
	struct ioc_co_waiter *l = atomic_exchange_explicit(&e->head, EVENT_SET,
							   memory_order_acq_rel);
	struct ioc_co_waiter *fifo = NULL;

	if (l == EVENT_SET)
		return;
	while (l) {
		struct ioc_co_waiter *next = l->next;

		l->next = fifo;
		fifo = l;
		l = next;
	}
	while (fifo) {
		struct ioc_co_waiter *next = fifo->next;

		grant(fifo);
		fifo = next;
	}
}

void ioc_co_event_reset(struct ioc_co_event *e)
{
	struct ioc_co_waiter *set = EVENT_SET;

	/* Only SET -> clear; waiters (if any) stay.  Relaxed: clearing
	 * publishes nothing; a later set() orders itself. */
	atomic_compare_exchange_strong_explicit(&e->head, &set, NULL,
						memory_order_relaxed,
						memory_order_relaxed);
}

bool ioc_co_event_is_set(struct ioc_co_event *e)
{
	/* Acquire pairs with the exchange in ioc_co_event_set(). */
	return atomic_load_explicit(&e->head, memory_order_acquire) == EVENT_SET;
}

void ioc_coroutine_fn ioc_co_event_wait(struct ioc_co_event *e)
{
	struct ioc_co_waiter w = { .co = ioc_co_self() };
	/* Acquire pairs with the exchange in ioc_co_event_set(). */
	struct ioc_co_waiter *head =
		atomic_load_explicit(&e->head, memory_order_acquire);

	assert(w.co && "ioc_co_event_wait() outside a coroutine");
	ioc__co_check_home(w.co);
	do {
		if (head == EVENT_SET)
			return;
		w.next = head;
		/* Release publishes w to set()'s exchange; acquire on failure
		 * for the SET check above. */
	} while (!atomic_compare_exchange_weak_explicit(&e->head, &head, &w,
						       memory_order_release,
						       memory_order_acquire));
	ioc_co_yield();	/* until set() wakes us */
}
