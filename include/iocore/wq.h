/*
 * iocore workqueue: CPU jobs on N worker threads with per-worker rings.
 *
 * One submitter (the thread that owns the wq) submits jobs and collects
 * completions; workers never share a written cache line.  Jobs are
 * caller-allocated objects that embed struct ioc_wq_job (container_of),
 * so the hot path allocates nothing.
 */
#ifndef IOCORE_WQ_H
#define IOCORE_WQ_H

#include "iocore/common.h"
#include "iocore/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ioc_wq;

/* Embedded job.  fn runs on a worker; the job is handed back through
 * ioc_wq_poll_done()/wait_done() or the done callback.  Valid from
 * submit until it is handed back.  Fields other than fn are private. */
struct ioc_wq_job {
	void (*fn)(struct ioc_wq_job *job);
	uint64_t seq;
	unsigned worker;
};

enum ioc_wq_policy {
	IOC_WQ_FILL = 0,        /* fill one worker's ring, then the next (batching) */
	IOC_WQ_ROUND_ROBIN,
	IOC_WQ_LEAST_LOADED,
};

struct ioc_wq_opts {
	unsigned workers;       /* 0 = number of online CPUs */
	unsigned ring_size;     /* per-worker request ring, power of two; 0 = 64 */
	enum ioc_wq_policy policy;
	bool in_order;          /* hand jobs back in submission order */
	int64_t spin_ns;        /* cap of the adaptive spin before sleeping, for
				 * workers and wait_done; 0 = default (50 us),
				 * <0 = never spin */
	const char *name;       /* worker thread name prefix; default "ioc-wq" */
	/* Optional: completions delivered by a handler on this loop, calling
	 * done(job, done_opaque) on the loop's thread.  Without a loop, use
	 * poll_done/wait_done. */
	struct ioc_loop *loop;
	void (*done)(struct ioc_wq_job *job, void *opaque);
	void *done_opaque;
};

int ioc_wq_new(struct ioc_wq **out, const struct ioc_wq_opts *opts);
/* Waits for submitted jobs to run, then joins the workers.  Jobs not yet
 * collected are dropped (their memory is the caller's). */
void ioc_wq_free(struct ioc_wq *wq);
/* (ioc_wq_free may be called from inside the done callback: the workers are
 * joined at once and the memory is released when the callback returns.) */

/* Queue a job.  Returns 0, or -EAGAIN when every ring is full (collect
 * completions and retry).  A worker's ring counts its jobs until they are
 * collected, so at most workers * ring_size jobs are in flight.  Call from
 * the owner thread only (the loop's thread when opts.loop is set). */
int ioc_wq_submit(struct ioc_wq *wq, struct ioc_wq_job *job);
/* Collect up to max finished jobs without blocking; returns the count. */
int ioc_wq_poll_done(struct ioc_wq *wq, struct ioc_wq_job **jobs, unsigned max);
/* As poll_done, but waits up to timeout_ns (-1 = forever) for at least one;
 * returns the count, 0 on timeout (or at once when nothing is in flight),
 * or -errno.  When the workers still have queued jobs it may sleep until a
 * worker is close to running dry rather than return at the first
 * completion: completions come back in batches, one wake per batch. */
int ioc_wq_wait_done(struct ioc_wq *wq, struct ioc_wq_job **jobs, unsigned max,
		     int64_t timeout_ns);
/* Jobs submitted and not yet handed back. */
uint64_t ioc_wq_in_flight(struct ioc_wq *wq);

/* Change the number of workers at run time (1..1024).  Shrinking stops
 * new submissions to the retired workers, then waits for them to run what
 * they hold; their finished jobs are still handed back (in order, in
 * in_order mode).  Owner thread.  Returns 0 or -errno. */
int ioc_wq_set_workers(struct ioc_wq *wq, unsigned n);
unsigned ioc_wq_workers(struct ioc_wq *wq);

struct ioc_wq_worker_stats {
	uint64_t jobs;
	uint64_t busy_ns;
	uint64_t sleeps;   /* times it went to sleep in the kernel */
	uint64_t wakeups;  /* wakeups that needed a syscall */
};
/* Fills up to max entries, returns the number of workers.  Snapshots:
 * jobs and busy_ns are published once per run of jobs.  Owner thread. */
int ioc_wq_get_stats(struct ioc_wq *wq, struct ioc_wq_worker_stats *st, unsigned max);

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_WQ_H */
