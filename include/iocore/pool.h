/*
 * iocore thread pool: run blocking calls on worker threads and complete
 * them on the submitting loop.
 *
 * Each loop gets its own pool on first use (ioc_pool_for_loop), or several
 * loops share one created with ioc_pool_new.  A request completes on the
 * loop that was current on the submitting thread.
 */
#ifndef IOCORE_POOL_H
#define IOCORE_POOL_H

#include "iocore/common.h"
#include "iocore/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_pool;

struct ioc_pool_opts {
	unsigned min_threads;      /* kept even when idle; default 0 */
	unsigned max_threads;      /* default 64 */
	unsigned idle_timeout_ms;  /* idle workers above min exit; default 10000 */
	const char *name;          /* worker name prefix; default "ioc-pool"
	                            * (cut to 10 bytes: "<name>-<n>" fits the
	                            * kernel's 15) */
	/* Idle workers spin this long (adaptively, up to this bound) before
	 * sleeping.  0 = default (50000); negative disables spinning. */
	int64_t spin_max_ns;
	/* At most this many workers spin at once; 0 = default (online CPUs
	 * minus one, at least one). */
	unsigned max_spinners;
	/* Up to one thread per online CPU starts as soon as jobs wait.  Past
	 * that, a new thread starts only when the oldest queued job has waited
	 * this long (jobs that block in the kernel; short CPU-bound jobs do
	 * not need more threads than CPUs).  0 = default (200000); negative:
	 * start threads whenever no idle one can take a job (QEMU). */
	int64_t spawn_delay_ns;
	uint32_t flags;            /* reserved for options to come: must be 0 */
};

/* Runs on a worker thread.  Returns a result, by convention >= 0 or -errno. */
typedef int64_t ioc_pool_fn(void *arg);
/* Runs on the submitting loop with fn's result, or -ECANCELED. */
typedef void ioc_pool_done_cb(void *opaque, int64_t ret);

struct ioc_pool_port;

/* Embedded request: valid from submit until done returns.  Private. */
struct ioc_pool_req {
	struct ioc_pool_req *next;
	struct ioc_pool_req *prev;
	struct ioc_pool_port *port;
	struct ioc_task task;
	struct ioc_loop *loop;
	ioc_pool_fn *fn;
	void *arg;
	ioc_pool_done_cb *done;
	void *opaque;
	int64_t ret;
	int64_t queued_ns;
	int state;
};

int ioc_pool_new(struct ioc_pool **out, const struct ioc_pool_opts *opts);
/* Completes (or cancels with -ECANCELED) every request, joins every
 * thread.  Call from a thread that can still run the loops whose
 * requests are in flight (it runs their completions itself if needed).
 * Not from inside a done callback of this pool; not for the pool of
 * ioc_pool_for_loop(), which ioc_loop_free() frees.  A shared pool may be
 * freed before or after the loops that submitted to it, but not at the same
 * time as ioc_loop_free() of one of them: the caller orders the two (for
 * example by joining the loop's thread first). */
void ioc_pool_free(struct ioc_pool *pool);
/* The pool of loop, created on first use with default options; freed with
 * the loop.  NULL only on -ENOMEM. */
struct ioc_pool *ioc_pool_for_loop(struct ioc_loop *loop);

/* Queue fn(arg); done(opaque, ret) runs on the current loop (the calling
 * thread must have one), never inside ioc_pool_submit() itself.  pool may be
 * NULL: the current loop's pool.  Submissions made during one loop iteration
 * reach the workers together at its end (or at the end of the completion
 * batch that made them).  Loop thread. */
void ioc_pool_submit(struct ioc_pool *pool, struct ioc_pool_req *req,
		     ioc_pool_fn *fn, void *arg,
		     ioc_pool_done_cb *done, void *opaque);
/* Cancel a request that has not started: returns 0 and done will be
 * called with -ECANCELED; -EBUSY if it started or finished.  Call on the
 * submitting loop's thread. */
int ioc_pool_cancel(struct ioc_pool *pool, struct ioc_pool_req *req);
/* Coroutine form: submit and yield until the result is back.  pool may be
 * NULL: the current loop's pool. */
int64_t ioc_coroutine_fn ioc_pool_co_run(struct ioc_pool *pool,
					 ioc_pool_fn *fn, void *arg);

/* Change thread limits at run time (min <= max, max >= 1).  Workers above
 * a lowered max exit once their current job is done.  Any thread.
 * Returns 0 or -EINVAL (or -errno if starting new min threads failed). */
int ioc_pool_set_limits(struct ioc_pool *pool, unsigned min_threads,
			unsigned max_threads);

struct ioc_pool_stats {
	unsigned threads, idle_threads;
	uint64_t submitted, completed, cancelled;
	uint64_t worker_wakeups;     /* futex/condvar signals sent */
	uint64_t completion_batches; /* loop wakeups that delivered completions */
	uint64_t lag_yields;         /* workers that yielded to a lagging loop */
};
void ioc_pool_get_stats(struct ioc_pool *pool, struct ioc_pool_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_POOL_H */
