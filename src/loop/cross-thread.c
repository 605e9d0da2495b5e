/*
 * The loop's cross-thread half: tasks, BHs, notify, the sleep/wake handshake.
 *
 * Problem: pool completions, workqueue deliveries, coroutine wakeups and
 * ioc_loop_call() hand a loop work from other threads: no syscall while it is
 * awake, none lost while it sleeps, no touch of a loop that may be freed
 * (once its owner saw its last work, maybe before the post returned).
 *
 * - Two Treiber stacks (tasks, BHs): a producer's release CAS pairs with the
 *   loop's acquire exchange, which takes the whole stack (so it sees
 *   task->next and the poster's writes; AArch64 could follow a stale next)
 *   and reverses it to FIFO onto a private queue; nobody pops single items:
 *   no ABA.  ioc_loop_notify() sets a third word, kicked.  A BH keeps PENDING
 *   and SCHEDULED in one word: schedule is one fetch_or, pushing only on the
 *   0 -> PENDING edge.
 * - Sleep markers: before blocking, the loop CASes each of the three words
 *   from empty to a marker (SLEEP_MARK on a stack, kicked = KICK_SLEEPING); a
 *   failure means work came: no sleep.  A producer whose CAS replaces a
 *   marker publishes its item and learns in the same step that the loop
 *   sleeps: it alone owes one eventfd write (the loop, taking its markers
 *   back after the wait, counts those replaced).  Each decision is an RMW on
 *   one word, needing no order beyond it: that word's modification order
 *   alone rules out a lost wakeup (no store-buffering argument, no seq_cst).
 * - Lifetime (loop.h): a loop may be freed once a post is visible.  Only a
 *   producer owing a wake touches it after its CAS, ending with a release
 *   increment of wakes_done; ioc_loop_free() waits (ioc__loop_quiesce()) for
 *   it to match the wakes owed: a short wait, spanning a write(2) at most.
 * - ioc_loop_stop() publishes, then notifies, so the loop may stop and be
 *   freed before the notify's exchange: the stopper counts itself in the
 *   request's word before setting it and uncounts last, and
 *   ioc__loop_quiesce() waits for that too.
 *
 * Rejected: a seq_cst "sleeping" flag read after the push (QEMU's
 * aio_notify): a second access to a loop that may be freed once the item is
 * visible.  A reference count per post: two more shared RMWs, for an access
 * needed only while the loop sleeps.  IORING_OP_MSG_RING: the message
 * completes later, on some kernels only when the target's thread runs, so a
 * free would wait on another loop.  A locked BH list (older QEMU), an eventfd
 * write per post (libuv): a lock, a syscall, per post.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loop-int.h"

/* BH flags. */
#define BH_PENDING   (1u << 0) /* on the incoming stack or loop->bhq */
#define BH_SCHEDULED (1u << 1) /* run when popped */
#define BH_DELETED   (1u << 2) /* free when popped */
#define BH_ONESHOT   (1u << 3) /* free after running */

/* A stack that holds only this is empty and its loop may be asleep.  Real
 * nodes are at least pointer-aligned, so they never equal it. */
#define TASKS_ASLEEP ((struct ioc_task *)(uintptr_t)1)
#define BHS_ASLEEP   ((struct ioc_bh *)(uintptr_t)1)

/* loop->kicked */
enum { KICK_NONE = 0, KICK_SET = 1, KICK_SLEEPING = 2 };

/* ---- the owed wake ------------------------------------------------------ */

/*
 * The caller replaced a sleep marker: wake the loop.  The last access to
 * *loop is the release increment; after it the loop may be gone.
 */
static void deliver_wake(struct ioc_loop *loop)
{
	static const uint64_t one = 1;

	while (write(loop->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
	/* EAGAIN (counter saturated) still leaves the fd readable.
	 * Release: pairs with the acquire load in ioc__loop_quiesce(). */
	atomic_fetch_add_explicit(&loop->wakes_done, 1, memory_order_release);
}

void ioc__loop_wake_read(void *opaque)
{
	struct ioc_loop *loop = opaque;
	uint64_t v;

	while (read(loop->wake_fd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
}

/*
 * Take back the first n sleep markers (tasks, BHs, kicked, in that order)
 * and count the wakes owed by producers that replaced them.
 */
static void unmark(struct ioc_loop *loop, int n)
{
	struct ioc_task *t = TASKS_ASLEEP;
	struct ioc_bh *b = BHS_ASLEEP;

	/* A marker still in place goes back to empty; one that is gone was
	 * replaced by a push, whose producer owes a wake.  Relaxed, as in
	 * ioc__loop_sleep_prepare(). */
	if (n >= 1 && !atomic_compare_exchange_strong_explicit(&loop->tasks,
			&t, NULL, memory_order_relaxed, memory_order_relaxed))
		loop->wakes_owed++;
	if (n >= 2 && !atomic_compare_exchange_strong_explicit(&loop->bhs,
			&b, NULL, memory_order_relaxed, memory_order_relaxed))
		loop->wakes_owed++;
	/* Acquire: pairs with the release exchange in ioc_loop_notify(), so
	 * what the notifier wrote before it (stop, a condition) is seen.  The
	 * kick is consumed by the wait it ended. */
	if (n >= 3 && atomic_exchange_explicit(&loop->kicked, KICK_NONE,
				memory_order_acquire) == KICK_SET)
		loop->wakes_owed++;
}

bool ioc__loop_sleep_prepare(struct ioc_loop *loop)
{
	struct ioc_task *t = NULL;
	struct ioc_bh *b = NULL;
	unsigned k = KICK_NONE;

	/* Relaxed CASes: a marker publishes nothing, and producers read it
	 * with their own RMW on the same word.  A failed CAS means work or a
	 * kick is there; run_incoming() takes work with acquire. */
	if (!atomic_compare_exchange_strong_explicit(&loop->tasks, &t,
			TASKS_ASLEEP, memory_order_relaxed, memory_order_relaxed))
		return false;
	if (!atomic_compare_exchange_strong_explicit(&loop->bhs, &b,
			BHS_ASLEEP, memory_order_relaxed, memory_order_relaxed)) {
		unmark(loop, 1);
		return false;
	}
	if (!atomic_compare_exchange_strong_explicit(&loop->kicked, &k,
			KICK_SLEEPING, memory_order_relaxed, memory_order_relaxed)) {
		/* A notify: consumed by the wait it cancels (acquire, as in
		 * unmark()). */
		atomic_exchange_explicit(&loop->kicked, KICK_NONE,
					 memory_order_acquire);
		unmark(loop, 2);
		return false;
	}
	return true;
}

void ioc__loop_sleep_finish(struct ioc_loop *loop)
{
	unmark(loop, 3);
}

void ioc__loop_quiesce(struct ioc_loop *loop)
{
	/* Acquire: pairs with the release increment in deliver_wake(); the
	 * producer's write(2) on wake_fd happens before we close it. */
	while (atomic_load_explicit(&loop->wakes_done, memory_order_acquire) !=
	       loop->wakes_owed)
		sched_yield();
	/* Acquire: pairs with the release fetch_sub in ioc_loop_stop().  A
	 * stopper whose request the loop saw was counted before it (same
	 * word), so the count read here includes it until it is done. */
	while (atomic_load_explicit(&loop->stop, memory_order_acquire) >=
	       IOC__LOOP_STOP_CALLER)
		sched_yield();
}

uint64_t ioc__loop_wakes(struct ioc_loop *loop)
{
	/* Relaxed: a statistic. */
	return atomic_load_explicit(&loop->wakes_done, memory_order_relaxed);
}

/* ---- producers ------------------------------------------------------------ */

void ioc_loop_notify(struct ioc_loop *loop)
{
	/* Release: what the caller wrote before notifying (ioc_loop_stop()'s
	 * stop flag, a condition) is seen by the loop's acquire exchange in
	 * unmark() or ioc__loop_consume_kick().  Replacing KICK_SLEEPING
	 * makes this caller the one that owes the wake. */
	if (atomic_exchange_explicit(&loop->kicked, KICK_SET,
				     memory_order_release) == KICK_SLEEPING)
		deliver_wake(loop);
}

void ioc_loop_stop(struct ioc_loop *loop)
{
	/* Relaxed: only counts this caller ahead of the request below in the
	 * word's modification order; ioc__loop_quiesce() reads the count. */
	atomic_fetch_add_explicit(&loop->stop, IOC__LOOP_STOP_CALLER,
				  memory_order_relaxed);
	/* Release: pairs with the acquire load in ioc_loop_run().  From here
	 * the loop may stop and its owner start ioc_loop_free(). */
	atomic_fetch_or_explicit(&loop->stop, IOC__LOOP_STOP_REQUESTED,
				 memory_order_release);
	ioc_loop_notify(loop);
	/* Release: pairs with the acquire load in ioc__loop_quiesce(); the
	 * notify above happens before the free.  The last access to *loop. */
	atomic_fetch_sub_explicit(&loop->stop, IOC__LOOP_STOP_CALLER,
				  memory_order_release);
}

void ioc_loop_post(struct ioc_loop *loop, struct ioc_task *task)
{
	/* Relaxed: only a guess for the CAS below, which re-reads on
	 * failure. */
	struct ioc_task *head = atomic_load_explicit(&loop->tasks,
						     memory_order_relaxed);

	/* Release CAS: publishes task->next and what the poster wrote to the
	 * acquire exchange in drain_incoming().  Replacing the sleep marker
	 * publishes the task and takes on the wake in one step; otherwise
	 * the loop is not touched again after this CAS. */
	do {
		task->next = head == TASKS_ASLEEP ? NULL : head;
	} while (!atomic_compare_exchange_weak_explicit(&loop->tasks, &head,
			task, memory_order_release, memory_order_relaxed));
	if (head == TASKS_ASLEEP)
		deliver_wake(loop);
}

static void bh_push(struct ioc_loop *loop, struct ioc_bh *bh)
{
	/* Relaxed: a guess for the CAS, as in ioc_loop_post(). */
	struct ioc_bh *head = atomic_load_explicit(&loop->bhs,
						   memory_order_relaxed);

	/* Release CAS: as in ioc_loop_post(); pairs with the acquire
	 * exchange in drain_incoming(). */
	do {
		bh->next = head == BHS_ASLEEP ? NULL : head;
	} while (!atomic_compare_exchange_weak_explicit(&loop->bhs, &head, bh,
			memory_order_release, memory_order_relaxed));
	if (head == BHS_ASLEEP)
		deliver_wake(loop);
}

struct ioc_bh *ioc_bh_new(struct ioc_loop *loop, ioc_bh_cb *cb, void *opaque)
{
	struct ioc_bh *bh = malloc(sizeof(*bh));

	if (!bh)
		return NULL;
	bh->next = NULL;
	atomic_init(&bh->flags, 0);
	bh->loop = loop;
	bh->cb = cb;
	bh->opaque = opaque;
	return bh;
}

void ioc_bh_schedule(struct ioc_bh *bh)
{
	/* acq_rel: the release half publishes what the scheduler wrote
	 * before scheduling to the callback (pairs with the acq_rel fetch_and
	 * in run_incoming()); the acquire half orders our push after a
	 * previous run's fetch_and so bh->next is ours to write. */
	unsigned old = atomic_fetch_or_explicit(&bh->flags,
			BH_PENDING | BH_SCHEDULED, memory_order_acq_rel);

	if (old & BH_PENDING)
		return; /* queued already; it will see SCHEDULED */
	bh_push(bh->loop, bh);
}

void ioc_bh_cancel(struct ioc_bh *bh)
{
	/* Relaxed is enough: the flag only decides whether the callback runs;
	 * it pairs with nothing beyond the fetch_and in run_incoming(). */
	atomic_fetch_and_explicit(&bh->flags, ~BH_SCHEDULED,
				  memory_order_relaxed);
}

void ioc_bh_delete(struct ioc_bh *bh)
{
	/* Loop thread: the only other writer of PENDING is run_incoming() on
	 * this same thread, so the decision below cannot race with it.
	 * acq_rel orders against concurrent (buggy but harmless) schedules. */
	unsigned old = atomic_fetch_or_explicit(&bh->flags, BH_DELETED,
						memory_order_acq_rel);

	/* Relaxed: run_incoming() reads it next, on this same thread. */
	atomic_fetch_and_explicit(&bh->flags, ~BH_SCHEDULED,
				  memory_order_relaxed);
	if (!(old & BH_PENDING))
		free(bh);
	/* else run_incoming() (or ioc_loop_free()) frees it when popped. */
}

int ioc_loop_oneshot(struct ioc_loop *loop, ioc_bh_cb *cb, void *opaque)
{
	struct ioc_bh *bh = ioc_bh_new(loop, cb, opaque);

	if (!bh)
		return -ENOMEM;
	/* Not yet visible to anybody: relaxed. */
	atomic_store_explicit(&bh->flags,
			      BH_PENDING | BH_SCHEDULED | BH_ONESHOT,
			      memory_order_relaxed);
	bh_push(loop, bh);
	return 0;
}

/* ---- the loop's side ------------------------------------------------------ */

bool ioc__loop_incoming_peek(struct ioc_loop *loop)
{
	/* Relaxed peek for the polling loop; the real take is the acquire
	 * exchange in drain_incoming().  No marker while the loop polls. */
	return atomic_load_explicit(&loop->tasks, memory_order_relaxed) ||
	       atomic_load_explicit(&loop->bhs, memory_order_relaxed) ||
	       atomic_load_explicit(&loop->kicked, memory_order_relaxed);
}

void ioc__loop_consume_kick(struct ioc_loop *loop)
{
	/* Relaxed test; acquire exchange as in unmark(). */
	if (atomic_load_explicit(&loop->kicked, memory_order_relaxed))
		atomic_exchange_explicit(&loop->kicked, KICK_NONE,
					 memory_order_acquire);
}

/* Move both stacks to the loop-private FIFO queues.  Never sees a marker:
 * the loop takes its markers back before it runs anything. */
static void drain_incoming(struct ioc_loop *loop)
{
	if (atomic_load_explicit(&loop->tasks, memory_order_relaxed)) {
		/* Acquire: pairs with the release CAS in ioc_loop_post(). */
		struct ioc_task *t = atomic_exchange_explicit(&loop->tasks,
				NULL, memory_order_acquire);
		struct ioc_task *last = t;

		assert(t && t != TASKS_ASLEEP);
		IOC__CHAIN_REVERSE(t, next);
		IOC__FIFO_APPEND(loop->taskq_head, loop->taskq_tail, t, last, next);
	}
	if (atomic_load_explicit(&loop->bhs, memory_order_relaxed)) {
		/* Acquire: pairs with the release CAS in bh_push(). */
		struct ioc_bh *b = atomic_exchange_explicit(&loop->bhs, NULL,
				memory_order_acquire);
		struct ioc_bh *last = b;

		assert(b && b != BHS_ASLEEP);
		IOC__CHAIN_REVERSE(b, next);
		IOC__FIFO_APPEND(loop->bhq_head, loop->bhq_tail, b, last, next);
	}
}

/*
 * Run tasks and BHs queued so far.  Work posted while they run lands on the
 * stacks and runs in the next pass, so a BH that reschedules itself cannot
 * starve the loop.
 */
bool ioc__loop_run_incoming(struct ioc_loop *loop)
{
	bool progress = false;
	struct ioc_task *t;
	struct ioc_bh *bh;

	drain_incoming(loop);
	while ((t = loop->taskq_head)) {
		loop->taskq_head = t->next;
		if (!t->next)
			loop->taskq_tail = NULL;
		t->fn(t); /* may free or re-post t */
		progress = true;
	}
	while ((bh = loop->bhq_head)) {
		unsigned old;

		loop->bhq_head = bh->next;
		if (!bh->next)
			loop->bhq_tail = NULL;
		/* acq_rel: acquire pairs with the release in ioc_bh_schedule()
		 * (the callback sees the scheduler's writes); release lets a
		 * schedule that sees PENDING clear re-push (bh->next no longer
		 * read by us). */
		old = atomic_fetch_and_explicit(&bh->flags,
				~(BH_PENDING | BH_SCHEDULED),
				memory_order_acq_rel);
		if (old & BH_DELETED) {
			free(bh);
			continue;
		}
		if (!(old & BH_SCHEDULED))
			continue; /* cancelled */
		bh->cb(bh->opaque);
		if (old & BH_ONESHOT)
			free(bh);
		progress = true;
	}
	return progress;
}

void ioc__loop_drop_incoming(struct ioc_loop *loop)
{
	struct ioc_bh *bh, *next;

	/* Pending tasks are never run.  Their memory is the posters', and the
	 * extension free functions may already have released it (the pool's
	 * completion ports), so drop the lists without reading a node.
	 * Relaxed: no thread may post to a loop that is being freed. */
	atomic_store_explicit(&loop->tasks, NULL, memory_order_relaxed);
	loop->taskq_head = loop->taskq_tail = NULL;

	/* Pending BHs: free the ones the loop owns (deleted, one-shot). */
	drain_incoming(loop);
	for (bh = loop->bhq_head; bh; bh = next) {
		/* Relaxed: no other thread may touch a BH of a dying loop. */
		unsigned f = atomic_load_explicit(&bh->flags,
						  memory_order_relaxed);

		next = bh->next;
		if (f & (BH_DELETED | BH_ONESHOT))
			free(bh);
		else
			atomic_store_explicit(&bh->flags, 0,
					      memory_order_relaxed);
	}
	loop->bhq_head = loop->bhq_tail = NULL;
}

/* ---- ioc_loop_call ------------------------------------------------------ */

struct loop_call {
	struct ioc_task task;
	int (*fn)(void *arg);
	void *arg;
	int ret;
	atomic_int done;
};

static void loop_call_task(struct ioc_task *task)
{
	struct loop_call *c = ioc_container_of(task, struct loop_call, task);

	c->ret = c->fn(c->arg);
	/* Release: pairs with the acquire load in ioc_loop_call(); after
	 * this store the caller may return and c may be gone.  FUTEX_WAKE
	 * only uses the address, it never reads c. */
	atomic_store_explicit(&c->done, 1, memory_order_release);
	syscall(SYS_futex, &c->done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

int ioc_loop_call(struct ioc_loop *loop, int (*fn)(void *arg), void *arg)
{
	struct loop_call c = { .task.fn = loop_call_task, .fn = fn, .arg = arg };

	if (ioc_loop_in_thread(loop))
		return fn(arg);
	atomic_init(&c.done, 0);
	ioc_loop_post(loop, &c.task);
	/* Sleep/wake: we sleep only while done == 0 (FUTEX_WAIT checks it
	 * atomically); the loop sets done before FUTEX_WAKE. */
	while (!atomic_load_explicit(&c.done, memory_order_acquire))
		syscall(SYS_futex, &c.done, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
	return c.ret;
}

bool ioc_loop_in_thread(struct ioc_loop *loop)
{
	/* Relaxed: only the running thread stores its own id. */
	return atomic_load_explicit(&loop->owner, memory_order_relaxed) ==
	       (uintptr_t)pthread_self();
}
