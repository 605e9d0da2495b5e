/*
 * iocore event loop: fd handlers, bottom halves, timers, io_uring operations.
 *
 * One struct ioc_loop per thread that runs it (QEMU's AioContext).  Unless a
 * function says "any thread", call it from the thread that runs the loop
 * (or, before the loop first runs, from the thread that created it).
 *
 * fd monitoring is a run-time choice among io_uring, epoll and poll(2),
 * behind a const ops table, with fallback io_uring -> epoll -> poll.
 *
 * With the io_uring backend the ring is single-issuer: the first thread
 * that polls the loop (or fills its submission queue) owns it for good.
 *
 * The thread's current loop: ioc_loop_new() makes the new loop current for
 * the calling thread when that thread has none; ioc_loop_poll()/run() make
 * the polled loop current; ioc_loop_free() clears it.  Coroutines, the
 * thread pool and the block layer use the current loop as "home".
 */
#ifndef IOCORE_LOOP_H
#define IOCORE_LOOP_H

#include "iocore/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_loop;
struct io_uring_sqe; /* from <liburing.h>, for ioc_loop_get_sqe() users */

enum ioc_fdmon {
	IOC_FDMON_AUTO = 0, /* io_uring, else epoll, else poll */
	IOC_FDMON_POLL,
	IOC_FDMON_EPOLL,
	IOC_FDMON_IO_URING,
};

struct ioc_loop_opts {
	/* Backend.  AUTO picks io_uring, else epoll, else poll.  Forcing
	 * io_uring where it is denied fails with the error io_uring_setup
	 * returned. */
	enum ioc_fdmon fdmon;
	/* Adaptive userspace polling cap in ns before blocking.  0 means the
	 * default (32000); a negative value disables polling. */
	int64_t poll_max_ns;
	/* Grow/shrink factors for the adaptive poll time (0 = defaults 2, 2). */
	unsigned poll_grow, poll_shrink;
	/* io_uring ring entries (0 = 256). */
	unsigned uring_entries;
	/* A handler whose io_poll found no work for this long leaves the
	 * polled set and is watched by fd monitoring only (0 = 1 s). */
	int64_t poll_idle_ns;
	/* Adaptive polling spins with a pause instruction between rounds
	 * instead of yielding the CPU (sched_yield) to other threads: for
	 * loops that own a CPU. */
	bool poll_spin;
	/* What one sleep and wake costs the loop's thread, against which
	 * polling is judged: over a window of polls, when the ns spent
	 * polling exceed the polls that found work times this, polling
	 * backs off (0 = default, 6000; negative: never back off). */
	int64_t poll_wake_cost_ns;
	/* The first back-off lasts poll_backoff_min_ns and doubles while the
	 * probe after it is still bad, up to poll_backoff_max_ns (0 =
	 * defaults 100 ms and 1 s). */
	int64_t poll_backoff_min_ns, poll_backoff_max_ns;
};

/* Create a loop.  opts may be NULL for defaults.  Returns 0 or -errno. */
int ioc_loop_new(struct ioc_loop **out, const struct ioc_loop_opts *opts);
/*
 * Free a loop that is not running.  Runs no pending BH or task (posted
 * tasks are dropped unread); cancels timers.
 *
 * Lifetime rule for everything that hands work to a loop from another
 * thread (ioc_loop_post(), ioc_bh_schedule(), ioc_loop_oneshot(),
 * ioc_loop_notify(), and what is built on them: thread-pool completions,
 * workqueue deliveries, coroutine wakeups): once the loop has seen a
 * posted item, its owner may free the loop at once, even while the
 * posting call has not yet returned on the other thread.  The poster
 * touches the loop after its item became visible only to deliver a wake
 * it owes, and ioc_loop_free() waits for that delivery.  What the caller
 * must still guarantee: no post, schedule or notify *starts* after
 * ioc_loop_free() has begun (stop the producers, or know they are done,
 * first), and a BH is deleted only on its loop's thread.
 */
void ioc_loop_free(struct ioc_loop *loop);
/* The calling thread's current loop, or NULL.  Any thread. */
struct ioc_loop *ioc_loop_current(void);
void ioc_loop_set_current(struct ioc_loop *loop);

/* Run one iteration: dispatch ready BHs, fd handlers, expired timers and
 * io_uring completions; when blocking and nothing was ready, poll
 * adaptively and then sleep until something happens.  Returns true if any
 * callback made progress. */
bool ioc_loop_poll(struct ioc_loop *loop, bool blocking);
/* Run until ioc_loop_stop().  Returns 0. */
int ioc_loop_run(struct ioc_loop *loop);
/* Make ioc_loop_run() return after its current iteration.  Any thread;
 * the loop may be freed as soon as it has stopped, even while this call has
 * not yet returned (ioc_loop_free() waits for it). */
void ioc_loop_stop(struct ioc_loop *loop);
/* Wake a sleeping loop (no-op cost when it is busy).  Any thread.  The
 * notify itself is the hand-off the lifetime rule covers: if the caller
 * first sets a condition on which the owner may free the loop, the owner
 * can see it before the notify starts, so post a task instead. */
void ioc_loop_notify(struct ioc_loop *loop);
/* True when called on the thread currently running loop. */
bool ioc_loop_in_thread(struct ioc_loop *loop);

/* ---- fd handlers ----------------------------------------------------- */

typedef void ioc_fd_cb(void *opaque);
/* Userspace poll callback: check for work without a syscall; return true
 * when it made progress. */
typedef bool ioc_poll_cb(void *opaque);

/*
 * Register, update or (with io_read, io_write and io_poll all NULL) remove
 * the handler of fd.  Readiness is level-triggered on every backend (see
 * ioc_loop_set_fd_edge() for the exception).  io_poll, if given, is called
 * during adaptive polling while the handler is active: fd monitoring found
 * it ready, or io_poll found work, within the last poll_idle_ns; a handler
 * with io_poll and no fd callbacks is always polled.  io_poll_ready is
 * called after io_poll found work, instead of io_read.  With the epoll and
 * poll backends the loop polls only while every fd handler has an io_poll
 * (otherwise fd events would wait for the poll to end); io_uring watches
 * every fd while polling.  Safe from inside any callback, including the
 * handler's own.  Returns 0 or -errno.
 */
int ioc_loop_set_fd(struct ioc_loop *loop, int fd,
		    ioc_fd_cb *io_read, ioc_fd_cb *io_write,
		    ioc_poll_cb *io_poll, ioc_fd_cb *io_poll_ready,
		    void *opaque);

/*
 * Declare that fd's callbacks consume all readiness (read or write until
 * EAGAIN), so edge-triggered notification is enough.  The io_uring backend
 * then keeps one multishot poll armed rather than re-arming a one-shot
 * poll after each event; epoll and poll ignore it.  Call after
 * ioc_loop_set_fd(); -ENOENT if fd has no handler.
 */
int ioc_loop_set_fd_edge(struct ioc_loop *loop, int fd, bool edge);

/* ---- tasks: the lock-free cross-thread primitive ---------------------- */

/*
 * An embedded one-shot callback posted to a loop.  The caller owns the
 * memory; it must stay valid until fn starts and must not be posted again
 * before then.  Posting is lock-free (a Treiber push), allocates nothing and
 * wakes the loop only when it may be sleeping.  Any thread.  The loop may
 * be freed once it has seen the task (the rule at ioc_loop_free()).
 * Coroutine wakeups and thread-pool completions are built on this.
 */
struct ioc_task {
	struct ioc_task *next; /* private */
	void (*fn)(struct ioc_task *task);
};
void ioc_loop_post(struct ioc_loop *loop, struct ioc_task *task);

/* ---- bottom halves --------------------------------------------------- */

struct ioc_bh;
typedef void ioc_bh_cb(void *opaque);

/* NULL only on -ENOMEM. */
struct ioc_bh *ioc_bh_new(struct ioc_loop *loop, ioc_bh_cb *cb, void *opaque);
/* Schedule: lock-free, any thread, idempotent while pending. */
void ioc_bh_schedule(struct ioc_bh *bh);
/* Cancel a pending run (no-op if not pending).  Any thread. */
void ioc_bh_cancel(struct ioc_bh *bh);
/* Cancel and free.  Loop thread (or loop not running); safe from inside the
 * BH's own callback. */
void ioc_bh_delete(struct ioc_bh *bh);
/* Run cb(opaque) once on loop soon; allocates, frees itself.  Any thread. */
int ioc_loop_oneshot(struct ioc_loop *loop, ioc_bh_cb *cb, void *opaque);
/* Run fn(arg) on loop's thread and wait for its return value.  Call from a
 * thread other than loop's (from its own thread it just calls fn). */
int ioc_loop_call(struct ioc_loop *loop, int (*fn)(void *arg), void *arg);

/* ---- timers ---------------------------------------------------------- */

typedef void ioc_timer_cb(void *opaque);

/* Embedded timer; arming never allocates.  Loop thread only.  The fields
 * are private (an intrusive heap node). */
struct ioc_timer {
	int64_t deadline;
	struct ioc_timer *child, *sibling, *prev; /* pairing heap links */
	struct ioc_loop *loop;
	ioc_timer_cb *cb;
	void *opaque;
	bool armed;
};

void ioc_timer_init(struct ioc_timer *t, struct ioc_loop *loop,
		    ioc_timer_cb *cb, void *opaque);
/* Arm (or re-arm) at an absolute CLOCK_MONOTONIC deadline in ns. */
void ioc_timer_arm(struct ioc_timer *t, int64_t deadline_ns);
/* Arm (or re-arm) delay_ns from now. */
void ioc_timer_arm_in(struct ioc_timer *t, int64_t delay_ns);
void ioc_timer_cancel(struct ioc_timer *t);
static inline bool ioc_timer_pending(const struct ioc_timer *t)
{
	return t->armed;
}

/* ---- io_uring operations on the loop's ring --------------------------- */

/*
 * Other modules (block layer, NBD server) submit their own operations on
 * the loop's ring and get cb on the loop thread.  Valid from
 * ioc_loop_get_sqe() until cb returns.  cb runs once per CQE; with
 * IORING_CQE_F_MORE set in cqe_flags more CQEs follow for the same op.
 */
struct ioc_uring_op {
	void (*cb)(struct ioc_uring_op *op, int res, uint32_t cqe_flags);
};

/* An SQE whose user_data is already set to op; the caller fills it with an
 * io_uring_prep_*() call (which must not touch user_data afterwards, i.e.
 * use io_uring_sqe_set_data(sqe, op) again if the prep helper clears it).
 * Submitted at the end of the current iteration, or at once when the
 * submission queue is full.  Returns NULL when the loop has no ring (with
 * the poll/epoll backend a small private ring is used if io_uring works at
 * all; NULL means io_uring is unavailable: fall back, -ENOTSUP).  Loop
 * thread only. */
struct io_uring_sqe *ioc_loop_get_sqe(struct ioc_loop *loop,
				      struct ioc_uring_op *op);
/* True when ioc_loop_get_sqe() can succeed on this loop. */
bool ioc_loop_has_uring(struct ioc_loop *loop);
/* Submit what is queued now rather than at the end of the iteration. */
int ioc_loop_flush_sqes(struct ioc_loop *loop);

/* ---- per-loop extensions (used by higher layers) ---------------------- */

/* Higher layers hang per-loop state here (the pool of a loop, ...); free_fn
 * is called by ioc_loop_free(), from the last slot to the first, so the
 * first slot's state is the last to go.  Loop thread. */
enum ioc_loop_ext {
	IOC_LOOP_EXT_POOL_PORTS,  /* this loop's ports of shared pools */
	IOC_LOOP_EXT_POOL,
	IOC_LOOP_EXT_BLK,
	IOC_LOOP_EXT_USER,
	IOC_LOOP_EXT_MAX,
};
void *ioc_loop_get_ext(struct ioc_loop *loop, enum ioc_loop_ext which);
void ioc_loop_set_ext(struct ioc_loop *loop, enum ioc_loop_ext which,
		      void *ptr, void (*free_fn)(void *ptr));

/* ---- stats ----------------------------------------------------------- */

struct ioc_loop_stats {
	const char *backend;       /* "io_uring", "epoll", "poll" */
	bool uring_denied;         /* io_uring was tried and refused */
	int uring_error;           /* -errno from io_uring_setup, if denied */
	uint64_t iterations;
	uint64_t blocking_waits;   /* iterations that slept in the kernel */
	uint64_t poll_hits;        /* adaptive polling found work */
	uint64_t poll_misses;      /* adaptive polling timed out */
	uint64_t notifies;         /* cross-thread wakeups that made a syscall */
	unsigned handlers;         /* registered fd handlers */
	unsigned polled_handlers;  /* handlers in the polled (active) set */
	int64_t poll_ns;           /* current adaptive poll time */
	bool has_uring;            /* ioc_loop_get_sqe() works */
	bool uring_private;        /* ... on a private ring (poll/epoll backend) */
	unsigned uring_setup_flags;/* IORING_SETUP_* the ring got */
};
/* Loop thread (from elsewhere, through ioc_loop_call()). */
void ioc_loop_get_stats(struct ioc_loop *loop, struct ioc_loop_stats *st);

/* Adaptive polling counters since the loop was created. */
struct ioc_loop_poll_stats {
	uint64_t poll_ns_total;    /* time spent polling (wall clock) */
	uint64_t polls;            /* poll windows started */
	uint64_t polls_hit;        /* ... that found work */
	uint64_t polls_empty;      /* ... that ended empty (the loop slept) */
	uint64_t backoffs;         /* back-offs entered (polling did not pay) */
	uint64_t sleeps;           /* waits that could block in the kernel */
	int64_t poll_ns;           /* current poll window, 0 when not polling */
	bool backing_off;          /* inside a back-off period */
};
/* Any thread, no lock: each counter is read with a relaxed load (the loop
 * thread, their only writer, stores them relaxed), so a snapshot from
 * another thread is not one instant; every counter only grows. */
void ioc_loop_get_poll_stats(struct ioc_loop *loop,
			     struct ioc_loop_poll_stats *st);

/* ---- I/O threads ----------------------------------------------------- */

struct ioc_iothread;
struct ioc_iothread_opts {
	const char *name;          /* thread name (15 chars max), default "ioc-io" */
	int cpu;                   /* pin to this CPU; -1 = no pinning */
	struct ioc_loop_opts loop;
};
/* Start a thread that creates and runs its own loop.  Returns 0 or -errno. */
int ioc_iothread_start(struct ioc_iothread **out,
		       const struct ioc_iothread_opts *opts);
struct ioc_loop *ioc_iothread_loop(struct ioc_iothread *t);
/* Run fn(arg) on the thread's loop and return its result. */
int ioc_iothread_call(struct ioc_iothread *t, int (*fn)(void *arg), void *arg);
/* Stop the loop, join the thread, free everything. */
void ioc_iothread_stop(struct ioc_iothread *t);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_LOOP_H */
