/*
 * Private state of the event loop, shared by loop.c, the timer heap and the
 * fd monitoring backends (fdmon-*.c).  Nothing here is part of the API.
 */
#ifndef IOC_LOOP_INT_H
#define IOC_LOOP_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include <liburing.h>

#include "iocore/loop.h"
#include "ablation.h"
#include "util/list.h"

/* Private revents bit: the handler's io_poll callback found work. */
#define IOC_REV_POLLED (1u << 30)
/* Readiness that runs the read (resp. write) callback. */
#define IOC_REV_READ  (POLLIN | POLLPRI | POLLHUP | POLLERR | POLLNVAL)
#define IOC_REV_WRITE (POLLOUT | POLLHUP | POLLERR | POLLNVAL)

/*
 * One registered fd.  Owned by the loop thread; never touched by others.
 * Removal marks it deleted and puts it on loop->dead; it is freed at the
 * end of the outermost iteration (no callback frame can still hold it)
 * and once the backend holds no reference (io_uring: no poll in flight).
 */
struct ioc_handler {
	int fd;
	uint32_t events;         /* POLLIN|POLLOUT wanted from fd monitoring */
	uint32_t revents;        /* readiness found, consumed by dispatch */
	bool deleted;
	bool on_ready;           /* linked on loop->ready */
	bool polled;             /* in the polled (active) set */
	bool internal;           /* loop's own (wakeup, private ring): not progress */
	bool backend_busy;       /* backend still references it (io_uring) */
	bool on_dead;            /* linked on loop->dead */

	ioc_fd_cb *io_read, *io_write, *io_poll_ready;
	ioc_poll_cb *io_poll;
	void *opaque;

	struct ioc_handler *ready_next;
	struct ioc_handler *poll_next, *poll_prev; /* polled set */
	int64_t poll_idle_deadline;                /* drops out of the set after */
	struct ioc_handler *dead_next;

	/* backend private */
	int pfd_idx;                  /* poll(2): index in the pollfd array */
	struct ioc_uring_op uop;      /* io_uring: the fd's poll operation */
	uint32_t armed_events;        /* io_uring: mask of the poll in flight */
	bool poll_multishot;          /* io_uring: in-flight poll is multishot */
	bool cancel_sent;             /* io_uring: a poll remove is in flight */
	struct ioc_handler *arm_next; /* io_uring: waiting for an SQE */
	bool on_arm;
	bool edge;                    /* callbacks drain: multishot is fine */
	struct ioc_loop *loop;
};

/*
 * fd monitoring backend.  Every member is called on the loop thread only.
 *   init:    set up; return 0 or -errno (the loop then tries the next one).
 *   fini:    tear down (handlers are already gone).
 *   update:  the wanted events of h changed from old to h->events (0 means
 *            removal; h->deleted may be set).  Return 0 or -errno.
 *   wait:    wait up to timeout_ns (-1 forever, 0 not at all) and push
 *            ready handlers with ioc__loop_ready(); return the number of
 *            events or -errno.
 *   pending: readiness visible from userspace without a syscall (io_uring
 *            CQ); NULL when the backend cannot tell.
 *   flush:   submit queued work at the end of an iteration (io_uring).
 */
struct ioc_fdmon_ops {
	const char *name;
	unsigned caps;
	int (*init)(struct ioc_loop *loop);
	void (*fini)(struct ioc_loop *loop);
	int (*update)(struct ioc_loop *loop, struct ioc_handler *h, uint32_t old);
	int (*wait)(struct ioc_loop *loop, int64_t timeout_ns);
	bool (*pending)(struct ioc_loop *loop);
	int (*flush)(struct ioc_loop *loop);
};

/* Capabilities. */
#define IOC_FDMON_CAP_USERSPACE_POLL (1u << 0) /* readiness via ->pending() */
#define IOC_FDMON_CAP_URING          (1u << 1) /* loop->ring is the backend's */
#define IOC_FDMON_CAP_CHEAP_CHECK    (1u << 2) /* wait(0) costs O(ready fds) */

extern const struct ioc_fdmon_ops ioc__fdmon_poll_ops;
extern const struct ioc_fdmon_ops ioc__fdmon_epoll_ops;
extern const struct ioc_fdmon_ops ioc__fdmon_uring_ops;

struct ioc_bh {
	struct ioc_bh *next;     /* incoming stack, then loop->bhq */
	_Atomic unsigned flags;
	struct ioc_loop *loop;
	ioc_bh_cb *cb;
	void *opaque;
};

struct ioc_loop_ext_slot {
	void *ptr;
	void (*free_fn)(void *ptr);
};

struct ioc_loop {
	/*
	 * Cross-thread line: what other threads write or read.  See the
	 * wakeup handshake in cross-thread.c.
	 */
	_Atomic(struct ioc_task *) tasks IOC_CACHE_ALIGNED; /* Treiber stack, or
							       * a sleep marker */
	_Atomic(struct ioc_bh *) bhs;                       /* likewise */
	atomic_uint kicked;     /* ioc_loop_notify() since the last check, or
				 * a sleep marker */
	atomic_uint stop;       /* IOC__LOOP_STOP_REQUESTED, plus one
				 * IOC__LOOP_STOP_CALLER per thread still
				 * inside ioc_loop_stop() */
	atomic_uintptr_t owner; /* pthread_self() of the running thread */
	_Atomic uint64_t wakes_done; /* owed wakes delivered (eventfd writes) */
	int wake_fd;            /* eventfd the backends watch */

	/* Loop-thread state. */
	const struct ioc_fdmon_ops *ops IOC_CACHE_ALIGNED;
	struct ioc_loop_opts opts;
	unsigned ablate;         /* IOC__LOOP_NO_* (ablation.h) */
	int depth;               /* nesting of ioc_loop_poll() */
	uint64_t wakes_owed;     /* sleep markers producers replaced */

	struct ioc_handler **by_fd;
	unsigned by_fd_cap;
	unsigned nhandlers;
	unsigned poll_disable_cnt; /* handlers with fd events but no io_poll */
	struct ioc_handler *wake_h;

	struct ioc_handler *ready_head, *ready_tail;
	struct ioc_handler *dead;
	struct ioc_handler *polled;  /* polled set (doubly linked) */
	unsigned npolled;

	struct ioc_task *taskq_head, *taskq_tail;
	struct ioc_bh *bhq_head, *bhq_tail;

	struct ioc_timer *timers;    /* pairing heap root */
	unsigned ntimers;

	int64_t poll_ns;             /* adaptive poll time */
	int64_t poll_wake_cost_ns;   /* back-off: a sleep's cost (<0: never) */
	int64_t backoff_min_ns, backoff_max_ns;
	int64_t backoff_ns;          /* last back-off period, 0 after a good window */
	int64_t backoff_until;       /* polling off until then, 0: not backing off */
	uint64_t win_cost_ns;        /* this window: ns spent polling */
	unsigned win_polls, win_hits;
	int poll_score;              /* recent poll hits minus misses */
	int64_t poll_max_ns;
	int64_t poll_idle_ns;
	unsigned busy_iters;

	struct ioc_loop_ext_slot ext[IOC_LOOP_EXT_MAX];

	/* io_uring: the backend's ring, or the private ring for get_sqe. */
	struct io_uring ring;
	bool has_ring;
	bool ring_enabled;           /* R_DISABLED ring enabled by its runner */
	bool ring_private;           /* ring is not the backend's */
	int ring_error;              /* why there is no ring (-errno) */
	unsigned sq_queued;          /* SQEs prepared, not yet submitted */
	struct ioc_handler *ring_h;  /* private ring's fd handler */
	struct ioc_handler *arm_head, *arm_tail; /* uring: polls to arm */
	bool flush_deferred;         /* end-of-iteration submit left to the next wait */
	unsigned ring_setup_flags;

	/* backend state */
	int epfd;
	void *evbuf;
	struct pollfd *pfds;
	struct ioc_handler **pfd_h;
	unsigned npfds, pfds_cap;

	/* Polling counters: written by the loop thread only, read by any
	 * thread (ioc_loop_get_poll_stats()).  Own cache line so that a
	 * reader does not disturb the loop-thread state above. */
	struct {
		_Atomic uint64_t ns_total, polls, hits, empty, backoffs, sleeps;
		_Atomic int64_t poll_ns;
		atomic_bool backing_off;
	} pst IOC_CACHE_ALIGNED;

	/* stats */
	bool uring_denied;
	int uring_error;
	uint64_t iterations, blocking_waits, poll_hits, poll_misses;
};

/* A backend wait's timeout in ns (-1: forever) as the timespec that
 * ppoll and epoll_pwait2 take: NULL for forever, else ts filled in. */
static inline struct timespec *ioc__wait_timespec(int64_t timeout_ns,
						   struct timespec *ts)
{
	if (timeout_ns < 0)
		return NULL;
	ts->tv_sec = timeout_ns / 1000000000;
	ts->tv_nsec = timeout_ns % 1000000000;
	return ts;
}

/* Push h on the ready queue with rev (loop thread; backends call this). */
void ioc__loop_ready(struct ioc_loop *loop, struct ioc_handler *h, uint32_t rev);
/* loop->stop: the request bit, and the count of callers still inside
 * ioc_loop_stop() above it (ioc__loop_quiesce() waits for them). */
#define IOC__LOOP_STOP_REQUESTED 1u
#define IOC__LOOP_STOP_CALLER    2u
/* The backend dropped its last reference to a deleted handler. */
void ioc__loop_handler_released(struct ioc_loop *loop, struct ioc_handler *h);
/* Cross-thread half (cross-thread.c), loop thread only. */
/* The wakeup eventfd fired (read it). */
void ioc__loop_wake_read(void *opaque);
/* Before a wait that may block: set the sleep markers.  False when work or
 * a notify arrived (then do not block; a notify is consumed). */
bool ioc__loop_sleep_prepare(struct ioc_loop *loop);
/* After that wait: take the markers back and count the owed wakes. */
void ioc__loop_sleep_finish(struct ioc_loop *loop);
/* Run the tasks and BHs posted so far; true if any ran. */
bool ioc__loop_run_incoming(struct ioc_loop *loop);
/* Work or a notify waiting, seen without a syscall (relaxed). */
bool ioc__loop_incoming_peek(struct ioc_loop *loop);
/* A poll round found work: a pending notify is consumed by it. */
void ioc__loop_consume_kick(struct ioc_loop *loop);
/* ioc_loop_free(): wait until every owed wake has been delivered. */
void ioc__loop_quiesce(struct ioc_loop *loop);
/* ioc_loop_free(): drop pending tasks, free the BHs the loop owns. */
void ioc__loop_drop_incoming(struct ioc_loop *loop);
/* Owed wakes delivered so far (the notifies statistic). */
uint64_t ioc__loop_wakes(struct ioc_loop *loop);

/* The thread that ran loop is done with it (drops per-thread io_uring
 * registrations); the loop may then be freed from another thread. */
void ioc__loop_thread_exit(struct ioc_loop *loop);
/* Run the ext slots' free functions now (on the loop's thread). */
void ioc__loop_free_exts(struct ioc_loop *loop);

/* Timers (timer.c). */
void ioc__timers_run(struct ioc_loop *loop, bool *progress);
int64_t ioc__timers_deadline(struct ioc_loop *loop);
void ioc__timers_cancel_all(struct ioc_loop *loop);

/* io_uring helpers (uring-ops.c), below loop.c and the backends. */
/* Create loop->ring; backend rings get SINGLE_ISSUER + DEFER_TASKRUN (or
 * COOP_TASKRUN) and start disabled until the running thread enables them. */
int ioc__uring_setup(struct ioc_loop *loop, bool backend);
void ioc__uring_enable(struct ioc_loop *loop);
/* Dispatch every CQE to its op (copied out first: callbacks may nest). */
int ioc__uring_reap(struct ioc_loop *loop);
/* An SQE, submitting first when the SQ is full; NULL if none. */
struct io_uring_sqe *ioc__uring_sqe(struct ioc_loop *loop);
/* Completions or deferred task work visible from userspace. */
bool ioc__uring_pending(struct ioc_loop *loop);
void ioc__uring_private_fini(struct ioc_loop *loop);
int ioc__loop_set_internal_fd(struct ioc_loop *loop, int fd, ioc_fd_cb *cb,
			      void *opaque);

#endif /* IOC_LOOP_INT_H */
