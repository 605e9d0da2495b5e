/*
 * The event loop: one struct ioc_loop per thread that runs it.
 *
 * Problem: one place per thread where the layers above get fd readiness,
 * cross-thread work, timers and io_uring completions dispatched, at a cost
 * flat in handlers and with no syscall on the cross-thread path while busy.
 *
 * - Handlers sit in an fd-indexed table, watched by a const struct
 *   ioc_fdmon_ops picked at run time (io_uring -> epoll -> poll) that pushes
 *   ready ones on one FIFO (loop->ready), popped one at a time: a nested
 *   ioc_loop_poll() goes on where the outer stopped.  A handler removed, from
 *   any callback, is marked and freed after the outermost iteration.  Also
 *   cross-thread.c (cross-thread work, its sleep/wake) and timer.c.
 * - Adaptive polling (QEMU's) over recently active handlers (as its fdmon
 *   split proposed): before sleeping, spin up to poll_ns on their io_poll,
 *   the incoming stacks and the CQ.  A handler joins when found ready, leaves
 *   after poll_idle_ns idle: rounds are O(active).  poll_ns: QEMU's block_ns
 *   rule plus a hit/miss score.  sched_yield() between rounds (unless
 *   opts.poll_spin): the producer awaited may need our CPU.  Handlers without
 *   io_poll get a wait(0) per round where cheap (epoll; poll(2) to
 *   POLL_CHECK_MAX_FDS fds; io_uring needs none), where QEMU stops polling.
 * - Back-off, for a peer that is the bottleneck (spinning saves little): per
 *   POLL_WINDOW polls, their cost (ns polling, less sched_yield()s that ran
 *   another thread, each capped at its window) against their saving
 *   (poll_wake_cost_ns per poll that found work); above it, no polling for
 *   BACKOFF_MIN_NS, doubling while the next probe is bad, to BACKOFF_MAX_NS.
 *   Per loop: one spin serves all handlers and the CQ, which finds most work
 *   and belongs to none (ioc_loop_get_poll_stats(); bench/loop/NOTES.md).
 *   The loop takes a slow peer for an idle one; the NBD server does not, and
 *   rests a connection whose client is behind (conn.c), so requests batch.
 * - NBD sockets are not polled handlers: io_uring's CQ peek shows their poll
 *   completions, epoll's wait(0) covers them: no recv(MSG_PEEK) per round.
 *
 * Rejected: RCU-protected handler lists (only the loop thread uses them);
 * polling every handler (QEMU before its fdmon split: O(handlers) a round);
 * thread CPU time as a poll's cost (a syscall per reading, no vDSO: as dear
 * as the wakeup it prices).  Cost: an empty iteration, two stack loads, a
 * timer-root and a clock read, the wait; a poll, a clock read per yield and
 * at its end; busy on epoll/poll, fds checked every FD_CHECK_EVERY iterations.
 */
#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ablation.h"
#include "loop-int.h"

#define POLL_DEFAULT_MAX_NS  32000
#define POLL_START_NS        4000
#define POLL_IDLE_DEFAULT_NS 1000000000 /* 1 s without progress: unpolled */
#define FD_CHECK_EVERY       8          /* busy iterations per fd check */
#define POLL_SCORE_MAX       8          /* memory of adjust_poll_ns() */
#define POLL_CHECK_MAX_FDS   64         /* poll(2) fd check while polling */
#define POLL_WAKE_COST_NS    6000       /* default cost of a sleep and wake */
#define POLL_WINDOW          64         /* polls per cost/benefit verdict */
#define YIELD_GAVE_CPU_NS    3000       /* a sched_yield() this long switched */
#define BACKOFF_MIN_NS       100000000  /* first back-off: 100 ms */
#define BACKOFF_MAX_NS       1000000000 /* longest: 1 s */

static __thread struct ioc_loop *current_loop;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/* ---- fd handlers --------------------------------------------------------- */

static inline bool handler_disables_poll(const struct ioc_handler *h)
{
	return !h->internal && h->events && !h->io_poll;
}

void ioc__loop_ready(struct ioc_loop *loop, struct ioc_handler *h, uint32_t rev)
{
	h->revents |= rev;
	if (h->on_ready)
		return;
	h->on_ready = true;
	IOC__FIFO_APPEND(loop->ready_head, loop->ready_tail, h, h, ready_next);
}

static void polled_add(struct ioc_loop *loop, struct ioc_handler *h)
{
	h->polled = true;
	IOC__LIST_PUSH(loop->polled, h, poll_prev, poll_next);
	loop->npolled++;
}

static void polled_remove(struct ioc_loop *loop, struct ioc_handler *h)
{
	if (!h->polled)
		return;
	/* poll_next stays valid so a walk that is standing on h goes on. */
	IOC__LIST_UNLINK(loop->polled, h, poll_prev, poll_next);
	h->polled = false;
	loop->npolled--;
}

static void handler_free_now(struct ioc_loop *loop, struct ioc_handler *h)
{
	(void)loop;
	free(h);
}

/* Free dead handlers nobody can reference any more (outermost level). */
static void reap_dead(struct ioc_loop *loop)
{
	struct ioc_handler **pp = &loop->dead;

	while (*pp) {
		struct ioc_handler *h = *pp;

		if (h->backend_busy || h->on_ready) {
			pp = &h->dead_next;
			continue;
		}
		*pp = h->dead_next;
		handler_free_now(loop, h);
	}
}

void ioc__loop_handler_released(struct ioc_loop *loop, struct ioc_handler *h)
{
	h->backend_busy = false;
	if (h->deleted && loop->depth == 0)
		reap_dead(loop);
}

static int grow_fd_table(struct ioc_loop *loop, int fd)
{
	unsigned cap = loop->by_fd_cap ? loop->by_fd_cap : 64;
	struct ioc_handler **t;

	while (cap <= (unsigned)fd)
		cap *= 2;
	t = realloc(loop->by_fd, cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	memset(t + loop->by_fd_cap, 0, (cap - loop->by_fd_cap) * sizeof(*t));
	loop->by_fd = t;
	loop->by_fd_cap = cap;
	return 0;
}

static int handler_remove(struct ioc_loop *loop, struct ioc_handler *h)
{
	uint32_t old = h->events;

	if (handler_disables_poll(h))
		loop->poll_disable_cnt--;
	polled_remove(loop, h);
	h->deleted = true;
	h->events = 0;
	if (old)
		loop->ops->update(loop, h, old); /* removal cannot fail */
	loop->by_fd[h->fd] = NULL;
	loop->nhandlers--;
	h->io_read = h->io_write = h->io_poll_ready = NULL;
	h->io_poll = NULL;
	h->on_dead = true;
	h->dead_next = loop->dead;
	loop->dead = h;
	if (loop->depth == 0)
		reap_dead(loop);
	return 0;
}

static int set_fd(struct ioc_loop *loop, int fd, ioc_fd_cb *io_read,
		  ioc_fd_cb *io_write, ioc_poll_cb *io_poll,
		  ioc_fd_cb *io_poll_ready, void *opaque, bool internal)
{
	struct ioc_handler *h, saved;
	uint32_t old, events;
	bool is_new = false;
	int r;

	if (fd < 0)
		return -EBADF;
	h = (unsigned)fd < loop->by_fd_cap ? loop->by_fd[fd] : NULL;
	if (!io_read && !io_write && !io_poll)
		return h ? handler_remove(loop, h) : 0;

	events = (io_read ? POLLIN : 0) | (io_write ? POLLOUT : 0);
	if (!h) {
		if ((unsigned)fd >= loop->by_fd_cap) {
			r = grow_fd_table(loop, fd);
			if (r < 0)
				return r;
		}
		h = calloc(1, sizeof(*h));
		if (!h)
			return -ENOMEM;
		h->fd = fd;
		h->pfd_idx = -1;
		h->internal = internal;
		is_new = true;
	}
	saved = *h;
	if (!is_new && handler_disables_poll(h))
		loop->poll_disable_cnt--;
	old = is_new ? 0 : h->events;
	h->io_read = io_read;
	h->io_write = io_write;
	h->io_poll = io_poll;
	h->io_poll_ready = io_poll_ready;
	h->opaque = opaque;
	h->events = events;
	if (events != old) {
		r = loop->ops->update(loop, h, old);
		if (r < 0) {
			if (is_new) {
				free(h);
				return r;
			}
			*h = saved;
			if (handler_disables_poll(h))
				loop->poll_disable_cnt++;
			return r;
		}
	}
	if (handler_disables_poll(h))
		loop->poll_disable_cnt++;
	if (!io_poll)
		polled_remove(loop, h);
	if (is_new) {
		loop->by_fd[fd] = h;
		loop->nhandlers++;
		/* A handler that only polls is active from the start. */
		if (io_poll && !events) {
			h->poll_idle_deadline = ioc_now_ns() + loop->poll_idle_ns;
			polled_add(loop, h);
		}
	}
	return 0;
}

int ioc_loop_set_fd_edge(struct ioc_loop *loop, int fd, bool edge)
{
	struct ioc_handler *h = fd >= 0 && (unsigned)fd < loop->by_fd_cap ?
				loop->by_fd[fd] : NULL;

	if (!h)
		return -ENOENT;
	h->edge = edge; /* takes effect at the next arm */
	return 0;
}

int ioc_loop_set_fd(struct ioc_loop *loop, int fd,
		    ioc_fd_cb *io_read, ioc_fd_cb *io_write,
		    ioc_poll_cb *io_poll, ioc_fd_cb *io_poll_ready,
		    void *opaque)
{
	return set_fd(loop, fd, io_read, io_write, io_poll, io_poll_ready,
		      opaque, false);
}

/* Internal handler (wakeup eventfd, private ring): not counted as
 * progress, does not disable polling, never polled. */
int ioc__loop_set_internal_fd(struct ioc_loop *loop, int fd, ioc_fd_cb *cb,
			      void *opaque)
{
	int r = set_fd(loop, fd, cb, NULL, NULL, NULL, opaque, true);

	if (r == 0 && cb)
		loop->nhandlers--; /* stats count the user's handlers */
	else if (r == 0)
		loop->nhandlers++; /* removal decremented it */
	return r;
}

/* The clock, read at most once per phase: *now == 0 means not read yet.
 * A read costs 20-70 ns here, several per iteration would be ~5% of a
 * pipe ping-pong round trip. */
static inline int64_t clock_once(int64_t *now)
{
	if (!*now)
		*now = ioc_now_ns();
	return *now;
}

/* Pop and run ready handlers until the queue is empty. */
static bool dispatch_ready(struct ioc_loop *loop, int64_t *now)
{
	struct ioc_handler *h;
	bool progress = false;

	while ((h = loop->ready_head)) {
		uint32_t rev;

		loop->ready_head = h->ready_next;
		if (!h->ready_next)
			loop->ready_tail = NULL;
		h->on_ready = false;
		rev = h->revents;
		h->revents = 0;
		if (h->deleted)
			continue;
		if (h->io_poll) {
			/* Activity: (re)join the polled set. */
			h->poll_idle_deadline = clock_once(now) +
						loop->poll_idle_ns;
			if (!h->polled)
				polled_add(loop, h);
		}
		if (rev & IOC_REV_POLLED) {
			/* Instead of io_read: readiness the backend reported in
			 * the same round is likely what io_poll found, and
			 * level-triggered monitoring reports it again if not. */
			if (h->io_poll_ready) {
				h->io_poll_ready(h->opaque);
				rev &= ~(uint32_t)(POLLIN | POLLPRI);
			}
			progress = true;
			if (h->deleted)
				continue;
		}
		if ((rev & IOC_REV_READ) && h->io_read) {
			h->io_read(h->opaque);
			if (!h->internal)
				progress = true;
			if (h->deleted)
				continue;
		}
		if ((rev & IOC_REV_WRITE) && h->io_write) {
			h->io_write(h->opaque);
			progress = true;
		}
	}
	return progress;
}

/* ---- adaptive polling ---------------------------------------------------- */

/*
 * Must a poll round ask the kernel about fd readiness itself?  Only when
 * some handler has no io_poll (it would otherwise wait up to poll_ns) and
 * the backend cannot show readiness in userspace (io_uring's CQ).
 */
static inline bool poll_checks_fds(struct ioc_loop *loop)
{
	return loop->poll_disable_cnt > 0 &&
	       !(loop->ops->caps & IOC_FDMON_CAP_USERSPACE_POLL);
}

/*
 * Can it afford to?  epoll_wait(0) costs O(ready fds); poll(2) with a zero
 * timeout still walks every registered fd, so the poll backend does it
 * only for small sets (past that, a round would cost more than the
 * cross-thread wakeup it saves, and such a loop sleeps as QEMU's does).
 */
static inline bool fd_check_affordable(struct ioc_loop *loop)
{
	return (loop->ops->caps & IOC_FDMON_CAP_CHEAP_CHECK) ||
	       (loop->ops == &ioc__fdmon_poll_ops &&
		loop->npfds <= POLL_CHECK_MAX_FDS);
}

static inline bool poll_allowed(struct ioc_loop *loop)
{
	return loop->poll_max_ns > 0 &&
	       (!poll_checks_fds(loop) || fd_check_affordable(loop));
}

/* Something for the loop that needs no syscall to see? */
static inline bool userspace_ready(struct ioc_loop *loop)
{
	if (ioc__loop_incoming_peek(loop))
		return true;
	return loop->ops->pending && loop->ops->pending(loop);
}

/*
 * Spin until end calling the polled handlers' io_poll and peeking at the
 * sources visible from userspace.  Returns true when something was found.
 * Cost per round: O(polled set), independent of idle handlers.
 */
static bool run_poll_handlers(struct ioc_loop *loop, int64_t *now, int64_t end,
			      bool *fds_checked, int64_t *given_ns)
{
	for (;;) {
		bool found = false;
		struct ioc_handler *h, *next;

		for (h = loop->polled; h; h = next) {
			next = h->poll_next;
			if (h->io_poll(h->opaque)) {
				h->poll_idle_deadline = *now + loop->poll_idle_ns;
				ioc__loop_ready(loop, h, IOC_REV_POLLED);
				found = true;
			}
		}
		if (found || userspace_ready(loop))
			return true;
		/* Handlers without io_poll: ask the kernel, without blocking
		 * (poll_allowed() checked that the backend can afford it).
		 * What it finds is on loop->ready, dispatched as usual. */
		if (poll_checks_fds(loop)) {
			*fds_checked = true;
			if (loop->ops->wait(loop, 0) > 0 || loop->ready_head)
				return true;
		}
		*now = ioc_now_ns();
		if (*now >= end)
			return false;
		/*
		 * Between rounds, give the CPU to whoever else wants it: on a
		 * machine with more runnable threads than CPUs the event we
		 * wait for is often produced by one of them.  Measured on a
		 * loaded 2-vCPU VM: pipe ping-pong 1.5x and cross-thread BH
		 * round trips 2.5x per CPU-second against a pause-only spin.
		 * With nothing else runnable sched_yield() returns at once.
		 * Yielding only every 8 or 32 rounds (pauses between): no
		 * different on bench/pool preadv (1785, 1700 vs 1710 ns/job).
		 */
		if (loop->opts.poll_spin) {
			cpu_relax();
		} else {
			int64_t t = *now;

			sched_yield();
			/* A yield that took long ran another thread: time
			 * given away, not spent spinning (the back-off's cost
			 * leaves it out).  A bare sched_yield() is < 1 us. */
			*now = ioc_now_ns();
			if (*now - t > YIELD_GAVE_CPU_NS)
				*given_ns += *now - t;
		}
	}
}

/* Handlers idle past their deadline leave the polled set; O(polled). */
static void remove_idle_poll_handlers(struct ioc_loop *loop, int64_t now)
{
	struct ioc_handler *h, *next;

	for (h = loop->polled; h; h = next) {
		next = h->poll_next;
		if (now >= h->poll_idle_deadline && h->events)
			polled_remove(loop, h);
	}
}

/*
 * QEMU's rule: keep poll_ns on a hit, shrink after long sleeps, grow after
 * short ones (polling a bit longer would have caught them).  One change:
 * poll_score tracks recent hits (+1) and misses (-1); while misses
 * dominate, a short sleep shrinks instead of growing.  On a machine with
 * more runnable threads than CPUs the event we spin for is often produced
 * by a thread that cannot run while we spin, and QEMU's rule then keeps
 * growing a poll that never hits (measured: pipe ping-pong between two
 * loops on a loaded 2-CPU VM fell from 50k to 10k round trips/s).
 */
static void adjust_poll_ns(struct ioc_loop *loop, int64_t block_ns)
{
	int64_t p = loop->poll_ns;

	if (block_ns <= p)
		return;
	/* Not polling and the sleep was short: evidence for polling that
	 * slowly lets a loop that gave up polling try again. */
	if (p == 0 && block_ns < loop->poll_max_ns && loop->poll_score < 0)
		loop->poll_score++;
	if (block_ns > loop->poll_max_ns || loop->poll_score < 0) {
		p = loop->opts.poll_shrink ? p / loop->opts.poll_shrink : 0;
		if (p < POLL_START_NS / 2)
			p = 0; /* a poll of a few ns only costs the clock reads */
	} else if (p < loop->poll_max_ns && block_ns < loop->poll_max_ns) {
		p = p ? p * loop->opts.poll_grow : POLL_START_NS;
		if (p > loop->poll_max_ns)
			p = loop->poll_max_ns;
	}
	loop->poll_ns = p;
}

/* ---- back-off: polling that does not pay --------------------------------- */

/* The polling counters have one writer, the loop thread: a relaxed load
 * and store, no read-modify-write.  Pairs with the relaxed loads in
 * ioc_loop_get_poll_stats(). */
static inline void pst_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

static inline void publish_poll_ns(struct ioc_loop *loop)
{
	/* Relaxed load of our own store, relaxed store: pairs with the
	 * relaxed load in ioc_loop_get_poll_stats(). */
	if (atomic_load_explicit(&loop->pst.poll_ns, memory_order_relaxed) !=
	    loop->poll_ns)
		atomic_store_explicit(&loop->pst.poll_ns, loop->poll_ns,
				      memory_order_relaxed);
}

/* Relaxed store: pairs with the relaxed load in ioc_loop_get_poll_stats(). */
static inline void publish_backing_off(struct ioc_loop *loop, bool on)
{
	atomic_store_explicit(&loop->pst.backing_off, on, memory_order_relaxed);
}

/*
 * A poll window that began cost_ns ago ended at now, with work found or
 * not.  Every POLL_WINDOW polls, compare what polling cost (ns spent in
 * it) with what it saved (one sleep and wake per poll that found work).
 * A bad window turns polling off for a back-off period, which doubles
 * while the probe after it is bad again; a good window resets it.
 */
static void poll_account(struct ioc_loop *loop, int64_t cost_ns, bool hit,
			 int64_t now)
{
	bool bad;

	if (cost_ns < 0)
		cost_ns = 0;
	pst_add(&loop->pst.ns_total, (uint64_t)cost_ns);
	pst_add(&loop->pst.polls, 1);
	pst_add(hit ? &loop->pst.hits : &loop->pst.empty, 1);
	if (loop->poll_wake_cost_ns < 0)
		return;
	loop->win_cost_ns += (uint64_t)cost_ns;
	loop->win_hits += hit;
	if (++loop->win_polls < POLL_WINDOW)
		return;
	bad = loop->win_cost_ns >
	      (uint64_t)loop->win_hits * (uint64_t)loop->poll_wake_cost_ns;
	loop->win_cost_ns = 0;
	loop->win_polls = loop->win_hits = 0;
	if (!bad) {
		loop->backoff_ns = 0;
		return;
	}
	loop->backoff_ns = loop->backoff_ns ? loop->backoff_ns * 2 :
			   loop->backoff_min_ns;
	if (loop->backoff_ns > loop->backoff_max_ns)
		loop->backoff_ns = loop->backoff_max_ns;
	loop->backoff_until = now + loop->backoff_ns;
	loop->poll_ns = 0;
	pst_add(&loop->pst.backoffs, 1);
	publish_backing_off(loop, true);
}

/* Inside a back-off period?  When it has just expired, probe: poll again
 * at the full window (poll_max_ns; from the old, often tiny, window the
 * probe would only measure the window growing), judged like any other. */
static bool backing_off(struct ioc_loop *loop, int64_t now)
{
	if (now < loop->backoff_until)
		return true;
	loop->backoff_until = 0;
	loop->poll_ns = loop->poll_max_ns;
	loop->poll_score = 0;
	publish_backing_off(loop, false);
	return false;
}

/* ---- the iteration -------------------------------------------------------- */

struct ioc_loop *ioc_loop_current(void)
{
	return current_loop;
}

void ioc_loop_set_current(struct ioc_loop *loop)
{
	current_loop = loop;
}

/* Submit what the iteration queued on the loop's ring. */
static void flush_ring(struct ioc_loop *loop)
{
	loop->flush_deferred = false;
	if (loop->ops->flush)
		loop->ops->flush(loop);
	else if (loop->has_ring && loop->ring_enabled &&
		 io_uring_sq_ready(&loop->ring))
		io_uring_submit(&loop->ring);
}

/* Non-blocking fd check while busy: free with io_uring (a look at shared
 * memory, which also submits deferred SQEs), every FD_CHECK_EVERY
 * iterations otherwise. */
static inline bool want_fd_check(struct ioc_loop *loop)
{
	if (loop->ops->pending)
		return true;
	return (loop->busy_iters++ % FD_CHECK_EVERY) == 0;
}

/* Sleep in the backend, with the handshake in cross-thread.c. */
static void loop_wait(struct ioc_loop *loop, int64_t deadline, int64_t now)
{
	int64_t timeout = -1;

	/* The io_uring backend submits in the same enter as its wait. */
	if (!loop->ops->flush)
		flush_ring(loop);
	/* Relaxed stop: a stopper also notifies, which the markers see. */
	if (loop->ready_head ||
	    (atomic_load_explicit(&loop->stop, memory_order_relaxed) &
	     IOC__LOOP_STOP_REQUESTED))
		timeout = 0;
	else if (deadline >= 0)
		timeout = deadline > now ? deadline - now : 0;
	/* Only a wait that may block needs the markers; failing to set them
	 * means work (or a notify, now consumed) arrived. */
	if (timeout != 0 && !ioc__loop_sleep_prepare(loop))
		timeout = 0;
	if (timeout == 0) {
		loop->ops->wait(loop, 0);
		return;
	}
	loop->blocking_waits++;
	pst_add(&loop->pst.sleeps, 1);
	loop->ops->wait(loop, timeout);
	ioc__loop_sleep_finish(loop);
}

static bool loop_iterate(struct ioc_loop *loop, bool blocking, bool in_run)
{
	uintptr_t self = (uintptr_t)pthread_self();
	bool progress = false;
	int64_t now = 0;

	current_loop = loop;
	/* Relaxed: read by ioc_loop_in_thread() for identity only. */
	if (atomic_load_explicit(&loop->owner, memory_order_relaxed) != self)
		atomic_store_explicit(&loop->owner, self, memory_order_relaxed);
	if (!loop->ring_enabled && loop->has_ring)
		ioc__uring_enable(loop);
	loop->depth++;
	loop->iterations++;
	progress |= ioc__loop_run_incoming(loop);
	progress |= dispatch_ready(loop, &now);
	ioc__timers_run(loop, &progress);

	if (blocking && !progress &&
	    !(atomic_load_explicit(&loop->stop, memory_order_relaxed) &
	      IOC__LOOP_STOP_REQUESTED)) {
		int64_t deadline = ioc__timers_deadline(loop);
		bool pollable = poll_allowed(loop);
		int64_t start = 0;
		bool found = false, fds_checked = false;

		/* The clock only when something needs it. */
		now = 0;
		if (pollable || deadline >= 0 || loop->npolled)
			start = now = ioc_now_ns();
		if (pollable && loop->backoff_until && backing_off(loop, now))
			pollable = false;
		if (pollable && loop->poll_ns > 0) {
			int64_t end = start + loop->poll_ns, t0 = start;
			int64_t given = 0, cost;

			/* Do not hold this iteration's I/O back while spinning
			 * (nor count the submit as polling). */
			if (loop->has_ring && loop->ring_enabled &&
			    (loop->flush_deferred ||
			     io_uring_sq_ready(&loop->ring))) {
				flush_ring(loop);
				t0 = ioc_now_ns();
			}

			if (deadline >= 0 && deadline < end)
				end = deadline;
			found = run_poll_handlers(loop, &now, end,
						  &fds_checked, &given);
			if (found)
				now = ioc_now_ns();
			/* Less the time other threads ran, and at most the
			 * window: a thread preempted was not spinning. */
			cost = now - t0 - given;
			if (cost > end - t0)
				cost = end - t0;
			poll_account(loop, cost, found, now);
			if (found) {
				loop->poll_hits++;
				if (loop->poll_score < POLL_SCORE_MAX)
					loop->poll_score++;
			} else {
				loop->poll_misses++;
				if (loop->poll_score > -POLL_SCORE_MAX)
					loop->poll_score--;
			}
		}
		if (loop->npolled)
			remove_idle_poll_handlers(loop, now);
		if (found) {
			/* A notify is consumed by the poll that found it:
			 * the caller of ioc_loop_poll() re-checks its
			 * condition after this iteration returns. */
			ioc__loop_consume_kick(loop);
			/* A poll round that just asked the kernel saves the
			 * non-blocking check. */
			if (!fds_checked && want_fd_check(loop))
				loop->ops->wait(loop, 0);
		} else {
			loop_wait(loop, deadline, now);
			now = 0;
			if (pollable && !loop->backoff_until)
				adjust_poll_ns(loop, clock_once(&now) - start);
		}
		publish_poll_ns(loop);
	} else {
		if (!blocking || want_fd_check(loop))
			loop->ops->wait(loop, 0);
		now = 0;
	}
	if (loop->ring_private && io_uring_cq_ready(&loop->ring))
		ioc__uring_reap(loop);

	progress |= dispatch_ready(loop, &now);
	progress |= ioc__loop_run_incoming(loop);
	ioc__timers_run(loop, &progress);
	/*
	 * End-of-iteration submission.  Inside ioc_loop_run() with the
	 * io_uring backend the next iteration follows at once and submits
	 * in its wait (one enter for submit + wait) or in its non-blocking
	 * check, so the submit is left to it.
	 */
	if (in_run && loop->depth == 1 && loop->ops->pending)
		loop->flush_deferred = true;
	else
		flush_ring(loop);

	if (--loop->depth == 0 && loop->dead)
		reap_dead(loop);
	return progress;
}

bool ioc_loop_poll(struct ioc_loop *loop, bool blocking)
{
	return loop_iterate(loop, blocking, false);
}

int ioc_loop_run(struct ioc_loop *loop)
{
	/* Acquire: pairs with the release fetch_or in ioc_loop_stop(). */
	while (!(atomic_load_explicit(&loop->stop, memory_order_acquire) &
		 IOC__LOOP_STOP_REQUESTED))
		loop_iterate(loop, true, true);
	flush_ring(loop);
	/* Relaxed: the request is consumed by this thread alone; the callers
	 * counted in the same word are left to ioc__loop_quiesce(). */
	atomic_fetch_and_explicit(&loop->stop, ~IOC__LOOP_STOP_REQUESTED,
				  memory_order_relaxed);
	return 0;
}

/* ---- io_uring operations: the private ring and the public side ----------- */

static void private_ring_read(void *opaque)
{
	ioc__uring_reap(opaque);
}

static int private_ring_get(struct ioc_loop *loop)
{
	int r;

	if (loop->has_ring)
		return 0;
	if (loop->ring_error)
		return loop->ring_error;
	r = ioc__uring_setup(loop, false);
	if (r < 0)
		return r;
	loop->ring_private = true;
	r = ioc__loop_set_internal_fd(loop, loop->ring.ring_fd,
				      private_ring_read, loop);
	if (r < 0) {
		io_uring_queue_exit(&loop->ring);
		loop->has_ring = false;
		loop->ring_error = r;
		return r;
	}
	loop->ring_h = loop->by_fd[loop->ring.ring_fd];
	return 0;
}

void ioc__uring_private_fini(struct ioc_loop *loop)
{
	if (!loop->has_ring || !loop->ring_private)
		return;
	ioc__loop_set_internal_fd(loop, loop->ring.ring_fd, NULL, NULL);
	io_uring_queue_exit(&loop->ring);
	loop->has_ring = false;
}

bool ioc_loop_has_uring(struct ioc_loop *loop)
{
	return private_ring_get(loop) == 0;
}

struct io_uring_sqe *ioc_loop_get_sqe(struct ioc_loop *loop,
				      struct ioc_uring_op *op)
{
	struct io_uring_sqe *sqe;

	if (ioc_unlikely(!loop->has_ring) && private_ring_get(loop) < 0)
		return NULL;
	sqe = ioc__uring_sqe(loop);
	if (!sqe)
		return NULL;
	/* Prep helpers leave user_data alone; a zeroed SQE keeps stale
	 * fields of an earlier operation out of this one. */
	memset(sqe, 0, sizeof(*sqe));
	io_uring_sqe_set_data(sqe, op);
	return sqe;
}

int ioc_loop_flush_sqes(struct ioc_loop *loop)
{
	int r;

	if (!loop->has_ring)
		return 0;
	if (loop->ops->flush && !loop->ring_private)
		return loop->ops->flush(loop);
	if (!loop->ring_enabled || !io_uring_sq_ready(&loop->ring))
		return 0;
	r = io_uring_submit(&loop->ring);
	return r < 0 ? r : 0;
}

/* ---- creation ------------------------------------------------------------ */

static const struct ioc_fdmon_ops *const backends[] = {
	[IOC_FDMON_POLL] = &ioc__fdmon_poll_ops,
	[IOC_FDMON_EPOLL] = &ioc__fdmon_epoll_ops,
	[IOC_FDMON_IO_URING] = &ioc__fdmon_uring_ops,
};

enum ioc_fdmon ioc__loop_auto_fdmon = IOC_FDMON_AUTO;

static int pick_backend(struct ioc_loop *loop, enum ioc_fdmon want)
{
	static const enum ioc_fdmon order[] = {
		IOC_FDMON_IO_URING, IOC_FDMON_EPOLL, IOC_FDMON_POLL,
	};
	int r = -ENOSYS;

	if (want != IOC_FDMON_AUTO) {
		loop->ops = backends[want];
		r = loop->ops->init(loop);
		if (r < 0 && want == IOC_FDMON_IO_URING) {
			loop->uring_denied = true;
			loop->uring_error = r;
		}
		return r;
	}
	for (size_t i = 0; i < IOC_ARRAY_SIZE(order); i++) {
		loop->ops = backends[order[i]];
		r = loop->ops->init(loop);
		if (r == 0)
			return 0;
		if (order[i] == IOC_FDMON_IO_URING) {
			loop->uring_denied = true;
			loop->uring_error = r;
		}
	}
	return r;
}

int ioc__loop_new_ablated(struct ioc_loop **out,
			  const struct ioc_loop_opts *opts, unsigned ablate)
{
	struct ioc_loop *loop;
	enum ioc_fdmon want;
	int r;

	*out = NULL;
	if (opts && (unsigned)opts->fdmon > IOC_FDMON_IO_URING)
		return -EINVAL;
	loop = aligned_alloc(IOC_CACHELINE,
			     (sizeof(*loop) + IOC_CACHELINE - 1) &
			     ~(size_t)(IOC_CACHELINE - 1));
	if (!loop)
		return -ENOMEM;
	memset(loop, 0, sizeof(*loop));
	atomic_init(&loop->tasks, NULL);
	atomic_init(&loop->bhs, NULL);
	atomic_init(&loop->kicked, 0);
	atomic_init(&loop->stop, 0);
	atomic_init(&loop->owner, (uintptr_t)pthread_self());
	atomic_init(&loop->wakes_done, 0);
	atomic_init(&loop->pst.ns_total, 0);
	atomic_init(&loop->pst.polls, 0);
	atomic_init(&loop->pst.hits, 0);
	atomic_init(&loop->pst.empty, 0);
	atomic_init(&loop->pst.backoffs, 0);
	atomic_init(&loop->pst.sleeps, 0);
	atomic_init(&loop->pst.poll_ns, 0);
	atomic_init(&loop->pst.backing_off, false);
	loop->epfd = -1;
	if (opts)
		loop->opts = *opts;
	loop->ablate = ablate;
	if (!loop->opts.poll_grow)
		loop->opts.poll_grow = 2;
	if (!loop->opts.poll_shrink)
		loop->opts.poll_shrink = 2;
	if (!loop->opts.uring_entries)
		loop->opts.uring_entries = 256;
	loop->poll_max_ns = loop->opts.poll_max_ns == 0 ? POLL_DEFAULT_MAX_NS :
			    loop->opts.poll_max_ns < 0 ? 0 : loop->opts.poll_max_ns;
	loop->poll_wake_cost_ns = loop->opts.poll_wake_cost_ns ?
				  loop->opts.poll_wake_cost_ns : POLL_WAKE_COST_NS;
	loop->backoff_min_ns = loop->opts.poll_backoff_min_ns > 0 ?
			       loop->opts.poll_backoff_min_ns : BACKOFF_MIN_NS;
	loop->backoff_max_ns = loop->opts.poll_backoff_max_ns > 0 ?
			       loop->opts.poll_backoff_max_ns : BACKOFF_MAX_NS;
	if (loop->backoff_max_ns < loop->backoff_min_ns)
		loop->backoff_max_ns = loop->backoff_min_ns;
	loop->poll_idle_ns = loop->opts.poll_idle_ns > 0 ?
			     loop->opts.poll_idle_ns : POLL_IDLE_DEFAULT_NS;

	loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (loop->wake_fd < 0) {
		r = -errno;
		free(loop);
		return r;
	}
	want = loop->opts.fdmon;
	if (want == IOC_FDMON_AUTO)
		want = ioc__loop_auto_fdmon;
	r = pick_backend(loop, want);
	if (r < 0)
		goto fail;
	r = ioc__loop_set_internal_fd(loop, loop->wake_fd, ioc__loop_wake_read,
				      loop);
	if (r < 0) {
		loop->ops->fini(loop);
		goto fail;
	}
	loop->wake_h = loop->by_fd[loop->wake_fd];
	loop->wake_h->edge = true; /* its callback drains the counter */
	if (!current_loop)
		current_loop = loop;
	*out = loop;
	return 0;
fail:
	close(loop->wake_fd);
	free(loop->by_fd);
	free(loop);
	return r;
}

int ioc_loop_new(struct ioc_loop **out, const struct ioc_loop_opts *opts)
{
	return ioc__loop_new_ablated(out, opts, 0);
}

/* Free the higher layers' per-loop state, last slot first (blk before
 * pool).  ioc_iothread runs this on the loop's own thread. */
void ioc__loop_free_exts(struct ioc_loop *loop)
{
	for (int i = IOC_LOOP_EXT_MAX - 1; i >= 0; i--) {
		struct ioc_loop_ext_slot *s = &loop->ext[i];

		if (s->free_fn && s->ptr)
			s->free_fn(s->ptr);
		s->ptr = NULL;
		s->free_fn = NULL;
	}
}

void ioc_loop_free(struct ioc_loop *loop)
{
	if (!loop)
		return;
	assert(loop->depth == 0);
	/* A producer whose post the owner has already seen may still be
	 * writing the wake it owed: wait for it (the lifetime rule). */
	ioc__loop_quiesce(loop);
	ioc__loop_free_exts(loop);
	ioc__timers_cancel_all(loop);
	/* Handlers: remove all (the user's fds stay open). */
	for (unsigned fd = 0; fd < loop->by_fd_cap; fd++)
		if (loop->by_fd[fd])
			handler_remove(loop, loop->by_fd[fd]);
	loop->ready_head = loop->ready_tail = NULL;
	ioc__uring_private_fini(loop);
	loop->ops->fini(loop);
	while (loop->dead) {
		struct ioc_handler *h = loop->dead;

		loop->dead = h->dead_next;
		free(h);
	}

	ioc__loop_drop_incoming(loop);
	close(loop->wake_fd);
	free(loop->by_fd);
	if (current_loop == loop)
		current_loop = NULL;
	free(loop);
}

/* ---- extensions and stats ---------------------------------------------- */

void *ioc_loop_get_ext(struct ioc_loop *loop, enum ioc_loop_ext which)
{
	assert((unsigned)which < IOC_LOOP_EXT_MAX);
	return loop->ext[which].ptr;
}

void ioc_loop_set_ext(struct ioc_loop *loop, enum ioc_loop_ext which,
		      void *ptr, void (*free_fn)(void *ptr))
{
	assert((unsigned)which < IOC_LOOP_EXT_MAX);
	loop->ext[which].ptr = ptr;
	loop->ext[which].free_fn = free_fn;
}

void ioc_loop_get_stats(struct ioc_loop *loop, struct ioc_loop_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->backend = loop->ops->name;
	st->uring_denied = loop->uring_denied;
	st->uring_error = loop->uring_error;
	st->iterations = loop->iterations;
	st->blocking_waits = loop->blocking_waits;
	st->poll_hits = loop->poll_hits;
	st->poll_misses = loop->poll_misses;
	/* Relaxed: a statistic. */
	st->notifies = ioc__loop_wakes(loop);
	st->handlers = loop->nhandlers;
	st->polled_handlers = loop->npolled;
	st->poll_ns = loop->poll_ns;
	st->has_uring = loop->has_ring;
	st->uring_private = loop->has_ring && loop->ring_private;
	st->uring_setup_flags = loop->has_ring ? loop->ring_setup_flags : 0;
}

/* Relaxed: pairs with the loop thread's relaxed store in pst_add(): a
 * statistic, nothing is ordered by it. */
static uint64_t pst_read(const _Atomic uint64_t *counter)
{
	return atomic_load_explicit(counter, memory_order_relaxed);
}

void ioc_loop_get_poll_stats(struct ioc_loop *loop,
			     struct ioc_loop_poll_stats *st)
{
	st->poll_ns_total = pst_read(&loop->pst.ns_total);
	st->polls = pst_read(&loop->pst.polls);
	st->polls_hit = pst_read(&loop->pst.hits);
	st->polls_empty = pst_read(&loop->pst.empty);
	st->backoffs = pst_read(&loop->pst.backoffs);
	st->sleeps = pst_read(&loop->pst.sleeps);
	/* Relaxed, as pst_read(): pair with the relaxed stores in
	 * publish_poll_ns() and publish_backing_off(). */
	st->poll_ns = atomic_load_explicit(&loop->pst.poll_ns, memory_order_relaxed);
	st->backing_off = atomic_load_explicit(&loop->pst.backing_off,
					       memory_order_relaxed);
}
