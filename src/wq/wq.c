/*
 * Threaded workqueue: one submitter hands CPU jobs to N worker threads.
 *
 * Problem: one producer (the compressor's reader, a migration thread) spreads
 * small jobs (a page to checksum or compress) over a few cores.  A shared
 * mutex+condvar queue costs each a contended lock and often a futex wake;
 * QEMU's first threaded workqueue shared its workers' state lines and put
 * one job at a time on each worker: a sleep/wake per job.
 *
 * - Per worker an SPSC request ring and done ring, one cache-aligned block
 *   with a line per writer: 0 read-only plus submitter-private, 1 the sleep
 *   word and stop flag (written on transitions only), 2 the statistics.
 * - `inflight` (a worker's jobs submitted, not collected) never exceeds the
 *   ring size, so no ring overflows; it is LEAST_LOADED's free load metric.
 *   FILL, the default (bench/wq/NOTES.md), fills one worker's ring before
 *   moving on, so fewer workers wake; ROUND_ROBIN rotates per job.
 * - In order: a small FIFO (`order`) says which worker got sequence s; each
 *   completes in order, so the next release heads a known done ring.
 * - Workers spin adaptively (at most spin_ns, yielding now and then: QEMU's
 *   adaptive polling), then sleep on a futex, woken by a syscall only once
 *   declared asleep.  A submitter in wait_done is woken only as a worker is
 *   about to run dry (the low-water rule, notify_completion()): completions
 *   come in batches; it spins first if the workers leave a CPU free, until
 *   it finds itself descheduled (WQ_PREEMPTED_NS).  These handshakes are
 *   written out above futex_wait(), modelled by src/wq/wq-sleep.pml.
 * - With opts.loop, a batch's first completion schedules a BH that drains
 *   every done ring and calls opts.done on the loop's thread.
 *
 * Rejected: one MPSC done ring (every completion would write one shared
 * producer line, what made QEMU's slow; N SPSC rings cost a scan per poll,
 * cheap for a machine's few workers); work stealing (MC rings, and it breaks
 * the per-worker FIFO that makes in-order release free; the submitter
 * balances already); a condvar per worker (a mutex round trip per wake
 * check; the futex word makes "worker awake" one load).  Cost: a submit is
 * a push, a seq_cst fence and a load of the worker's state line, a
 * completion a fence and two read-mostly loads; the low-water wake trades a
 * completion's latency for throughput; busy_ns, two clock reads per busy
 * period; poll_done, O(workers), or O(jobs) in order.  set_workers blocks,
 * shrinking, until the retired workers drained their rings.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "iocore/ring.h"
#include "iocore/wq.h"

#define WQ_MAX_WORKERS 1024
#define WQ_DEFAULT_RING 64
#define WQ_DEFAULT_SPIN_NS 50000
#define WQ_BURST 16
#define WQ_BIG_JOB_NS 2000      /* see the wake rule in worker_main() */
#define WQ_PREEMPTED_NS 30000   /* see ioc_wq_wait_done() */

enum { W_RUNNING = 0, W_SLEEPING = 1 };

struct wq_worker {
	/* Line 0: set at creation, then submitter-private. */
	struct ioc_wq *wq;
	struct ioc_ring *req;      /* SPSC: submitter pushes, worker pops */
	struct ioc_ring *done;     /* SPSC: worker pushes, submitter pops */
	unsigned index;
	bool running;              /* submitter: the thread exists */
	pthread_t thread;
	uint32_t inflight;         /* submitter: submitted, not collected */
	uint64_t wakeups;          /* submitter: futex wakes issued */

	/* Line 1: sleep word and stop flag (handshakes before futex_wait()). */
	_Atomic uint32_t state IOC_CACHE_ALIGNED;
	_Atomic bool stop;

	/* Line 2: statistics, written by the worker only (relaxed stores,
	 * read by ioc_wq_get_stats: snapshots, order nothing). */
	_Atomic uint64_t jobs IOC_CACHE_ALIGNED;
	_Atomic uint64_t busy_ns;
	_Atomic uint64_t sleeps;
};

struct ioc_wq {
	/* Submitter-private (the owner thread; the loop thread in loop mode). */
	struct wq_worker **workers;
	unsigned nalloc;           /* worker structs (active + retired) */
	unsigned nactive;          /* workers that receive new jobs */
	unsigned cursor;           /* policy position */
	unsigned poll_start;       /* rotates the unordered poll */
	enum ioc_wq_policy policy;
	uint32_t ring_size;
	bool in_order;
	bool in_notify;            /* inside the notify BH's drain */
	bool free_requested;       /* ioc_wq_free() called from a done callback */
	int64_t spin_ns;           /* spin cap (workers and wait_done) */
	int64_t wait_spin;         /* wait_done's current adaptive spin */
	unsigned ncpus;            /* CPUs this process may run on */
	char name[16];
	uint64_t submitted, collected;
	uint16_t *order;           /* in-order: worker of sequence s */
	uint64_t order_mask;
	struct ioc_loop *loop;
	void (*done)(struct ioc_wq_job *job, void *opaque);
	void *done_opaque;
	struct ioc_bh *notify_bh;  /* loop mode: delivers completions */

	/* The submitter's sleep word: written by the submitter before it
	 * sleeps in wait_done and by the worker that wakes it. */
	_Atomic uint32_t waiting IOC_CACHE_ALIGNED;
	/* Loop mode: a notification task is queued and not yet started. */
	_Atomic uint32_t notify_pending IOC_CACHE_ALIGNED;
};

/*
 * Sleep/wake handshakes (Dekker style: each side stores its own flag,
 * issues a seq_cst fence, then loads the other side's condition; at least
 * one side sees the other, so no wakeup is lost):
 *   worker sleeps:   state = SLEEPING; fence; if req ring non-empty or
 *                    stop: state = RUNNING, go on; else futex_wait(state,
 *                    SLEEPING) until state != SLEEPING.
 *   submitter wakes: push job (release of prod.tail); fence; if state ==
 *                    SLEEPING and exchange(state, RUNNING) == SLEEPING:
 *                    futex_wake.  A worker still spinning has state ==
 *                    RUNNING, so waking it costs the fence and one load of
 *                    a line it rarely writes: no syscall.
 *   submitter waits: waiting = 1; fence; poll the done rings; if nothing:
 *                    futex_wait(waiting, 1).
 *   worker completes: push to done ring; if at most low_water jobs are
 *                    left in its request ring (and queued * ratio <= done,
 *                    or nothing queued): fence; if waiting and
 *                    exchange(waiting, 0) == 1: futex_wake.  No lost wake:
 *                    a sleeping submitter submits nothing, so each worker
 *                    with jobs reaches an empty ring, and the completion
 *                    that empties it always checks, and sees waiting.
 *   loop notify:     worker: push; the same backlog rule (the loop thread
 *                    submits nothing while it is not told, or hits -EAGAIN
 *                    once a worker holds ring_size uncollected jobs, so
 *                    every worker drains); fence; if !pending and
 *                    exchange(pending, 1) == 0: ioc_bh_schedule.  BH on the
 *                    loop: exchange(pending, 0); fence; drain.  A push the
 *                    drain misses was followed by the worker's fence; its
 *                    load of pending then sees the BH's 0 (or a later 1
 *                    whose scheduler's BH will drain after it), so the
 *                    worker schedules again or another schedule covers it.
 *                    A BH, not a posted task: the loop owns it, so freeing
 *                    the wq (ioc_bh_delete) or the loop with one pending
 *                    frees it too; a posted task whose wq was gone had to
 *                    free itself when run, and leaked if the loop was
 *                    freed first (ASan caught it in test-wq-loop).
 *   The futex value check closes the window between "decide to sleep" and
 *   "sleep": the kernel refuses to sleep if the word changed meanwhile.
 *   src/wq/wq-sleep.pml is a Promela model of the worker and submitter
 *   handshakes (with the low-water rule); tests/wq/test-wq-model.sh checks
 *   it with spin, and checks that dropping either re-check is caught.
 */
static long futex_wait(_Atomic uint32_t *addr, uint32_t val,
		       const struct timespec *rel)
{
	return syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, rel, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static int64_t adapt_spin(int64_t spin, int64_t spin_max, int64_t slept);

/* ---- worker side ---------------------------------------------------- */

/*
 * After a completion: wake the submitter or notify the loop if needed.
 * A sleeping submitter is woken only when this worker is about to run dry
 * (low_water or fewer jobs still queued for it), not on every completion:
 * while a worker has a backlog nobody is waiting on the submitter, and
 * letting completions pile up turns one futex wake per job into one per
 * batch.  Every worker with jobs eventually drains its ring to zero, so a
 * sleeping submitter is always woken (the handshakes before futex_wait()).
 */
static void notify_completion(struct ioc_wq *wq, struct ioc_ring *req,
			      uint32_t *queued_seen, struct ioc_ring *done,
			      uint32_t low_water, uint32_t ratio,
			      struct ioc_bh *notify_bh)
{
	uint32_t queued = *queued_seen;

	/* With a backlog nobody needs to hear from us yet: skip the fence.
	 * "Backlog" is more than low_water jobs queued, or (for windows
	 * smaller than the ring) more than 1/ratio of what already waits to
	 * be collected, so one wake hands back a batch either way.
	 * *queued_seen is the request ring's count as the worker last read
	 * it.  Only the submitter adds to the ring, so an old count is a
	 * lower bound: above low_water it settles the question without
	 * touching the ring's producer line (the submitter's, written on
	 * every submit, so reading it per job cost a cache-line transfer per
	 * job: crc4k with one worker ran 6-10% faster without); otherwise it
	 * is read again.  Stale reads only make queued smaller and the done
	 * count larger, i.e. make us check more often, never less; at queued
	 * == 0 we always check. */
	if (queued <= low_water)
		*queued_seen = queued = ioc_ring_count(req);
	if (queued > low_water ||
	    (queued && queued * ratio > ioc_ring_count(done)))
		return;
	/* Pairs with the fence in ioc_wq_wait_done() after it sets waiting,
	 * and with the fence in notify_bh() after it clears pending: either
	 * they see our done-ring push or we see their flag.  A store then a
	 * load: x86-64 needs this fence too (mfence), unlike the acquires
	 * and releases in this file. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&wq->waiting, memory_order_relaxed) &&
	    atomic_exchange_explicit(&wq->waiting, 0, memory_order_relaxed))
		futex_wake(&wq->waiting);
	/* Acq_rel exchange: pairs with the exchange in notify_bh(); the
	 * load before it only skips the RMW when a run is already due.  On
	 * a weakly ordered CPU such as AArch64, without the release our
	 * done-ring pushes need not be visible to the BH this schedules. */
	if (notify_bh && !atomic_load_explicit(&wq->notify_pending, memory_order_relaxed) &&
	    !atomic_exchange_explicit(&wq->notify_pending, 1, memory_order_acq_rel))
		ioc_bh_schedule(notify_bh);
}

static void *worker_main(void *arg)
{
	struct wq_worker *w = arg;
	/* Locals: the worker never reads line 0 again (the submitter writes
	 * inflight there on every submit). */
	struct ioc_wq *wq = w->wq;
	struct ioc_ring *req = w->req, *done = w->done;
	struct ioc_bh *notify_bh = wq->notify_bh;
	int64_t spin_max = wq->spin_ns, spin = spin_max;
	/* Wake rule (notify_completion), chosen per busy period from the
	 * jobs' average length: tiny jobs wake the submitter late, when a
	 * quarter of the ring is left and three times that is done (big
	 * batches amortise the wake); jobs longer than WQ_BIG_JOB_NS wake it
	 * at half the ring (a wake is cheap next to them, and the submitter,
	 * which may wait for a CPU on a loaded machine, needs the slack so
	 * the worker does not run dry). */
	uint32_t ring_size = wq->ring_size, low_water = ring_size / 4, ratio = 3;
	uint64_t jobs = 0, busy_ns = 0, sleeps = 0;

	{
		char tname[16];

		snprintf(tname, sizeof(tname), "%.10s-%u", wq->name, w->index);
		pthread_setname_np(pthread_self(), tname);
	}
	for (;;) {
		void *batch[WQ_BURST];
		unsigned n = ioc_ring_pop_burst_spsc(req, batch, WQ_BURST);

		if (n) {
			int64_t t0 = ioc_now_ns(), now;
			uint64_t period_start = jobs;

			/* A busy period: run jobs while the ring has any.  The
			 * clock is read once per burst (up to WQ_BURST jobs), for
			 * busy_ns and for the wake rule's job length. */
			do {
				/* The request ring's count, read once per burst
				 * right after the pop brought its lines in, then
				 * only when it says the ring runs low (see
				 * notify_completion()). */
				uint32_t queued = ioc_ring_count(req);

				for (unsigned i = 0; i < n; i++) {
					struct ioc_wq_job *job = batch[i];
					bool ok;

					/* The next job's header was last written by
					 * the submitter's CPU: start its transfer now
					 * rather than on the call through job->fn. */
					if (i + 1 < n)
						__builtin_prefetch(batch[i + 1], 1);
					job->fn(job);
					ok = ioc_ring_push_spsc(done, job);
					/* inflight <= ring size: never full. */
					assert(ok);
					(void)ok;
					notify_completion(wq, req, &queued, done,
							  low_water, ratio, notify_bh);
				}
				jobs += n;
				atomic_store_explicit(&w->jobs, jobs, memory_order_relaxed);
				now = ioc_now_ns();
				if (now - t0 > (int64_t)(jobs - period_start) * WQ_BIG_JOB_NS) {
					low_water = ring_size / 2;
					ratio = 1;
				} else {
					low_water = ring_size / 4;
					ratio = 3;
				}
				n = ioc_ring_pop_burst_spsc(req, batch, WQ_BURST);
			} while (n);
			busy_ns += (uint64_t)(now - t0);
			atomic_store_explicit(&w->busy_ns, busy_ns, memory_order_relaxed);
		}

		/* Acquire pairs with the release store of stop in
		 * stop_worker(): every job pushed before it is visible, so one
		 * more empty pop means the ring is drained for good.  On a
		 * weakly ordered CPU such as AArch64, without it the emptiness
		 * check below could read the ring from before those pushes. */
		if (atomic_load_explicit(&w->stop, memory_order_acquire)) {
			if (ioc_ring_empty(req))
				break;
			continue;
		}

		/* Bounded spin: a job arriving now costs the submitter no
		 * syscall and us no sleep.  The spin yields the CPU every
		 * ~100 pauses: on a machine with more runnable threads than
		 * cores the thread we wait for (the submitter) may need our
		 * CPU to produce the job. */
		if (spin > 0) {
			int64_t deadline = ioc_now_ns() + spin;
			bool found = false;

			for (unsigned k = 1;; k++) {
				if (!ioc_ring_empty(req) ||
				    atomic_load_explicit(&w->stop, memory_order_relaxed)) {
					found = true;
					break;
				}
				ioc_ring_relax();
				if (k % 128 == 0) {
					if (ioc_now_ns() > deadline)
						break;
					sched_yield();
				}
			}
			if (found)
				continue;
		}

		/* Sleep handshake, worker half (before futex_wait()). */
		atomic_store_explicit(&w->state, W_SLEEPING, memory_order_relaxed);
		/* Pairs with the fence in kick() between the submitter's push
		 * (or stop store) and its load of state. */
		atomic_thread_fence(memory_order_seq_cst);
		if (!ioc_ring_empty(req) ||
		    atomic_load_explicit(&w->stop, memory_order_relaxed)) {
			atomic_store_explicit(&w->state, W_RUNNING, memory_order_relaxed);
			continue;
		}
		/* Release pairs with the acquire load in ioc_wq_get_stats():
		 * a reader that sees this count sees the stats stored above
		 * (on AArch64, without it the stats could lag the count). */
		atomic_store_explicit(&w->sleeps, ++sleeps, memory_order_release);
		int64_t slept = ioc_now_ns();

		/* Acquire pairs with the exchange in kick(); spurious futex
		 * returns (signals, EINTR) loop back here.  On a weakly ordered
		 * CPU such as AArch64, without it the pops after waking could
		 * miss the push that the kicker made before its release. */
		while (atomic_load_explicit(&w->state, memory_order_acquire) == W_SLEEPING)
			futex_wait(&w->state, W_SLEEPING, NULL);
		/* Adapt the spin (QEMU's adaptive polling): a sleep shorter
		 * than the cap would have been covered by spinning longer, so
		 * grow; a longer one means spinning is wasted, so shrink. */
		spin = adapt_spin(spin, spin_max, ioc_now_ns() - slept);
	}
	return NULL;
}

/* ---- submitter side ------------------------------------------------- */

/* Wake w if it declared itself asleep.  Called after a push or stop. */
static void kick(struct wq_worker *w)
{
	/* Pairs with the worker's fence after it stores SLEEPING. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&w->state, memory_order_relaxed) == W_SLEEPING &&
	    atomic_exchange_explicit(&w->state, W_RUNNING, memory_order_release) ==
		    W_SLEEPING) {
		futex_wake(&w->state);
		w->wakeups++;
	}
}

static int start_worker(struct wq_worker *w)
{
	int err;

	atomic_store_explicit(&w->stop, false, memory_order_relaxed);
	atomic_store_explicit(&w->state, W_RUNNING, memory_order_relaxed);
	/* pthread_create orders everything above before the thread starts. */
	err = pthread_create(&w->thread, NULL, worker_main, w);
	if (err)
		return -err;
	w->running = true;
	return 0;
}

static void stop_worker(struct wq_worker *w)
{
	if (!w->running)
		return;
	/* Release pairs with the worker's acquire load of stop (on AArch64,
	 * without it the worker could see stop before our last pushes). */
	atomic_store_explicit(&w->stop, true, memory_order_release);
	kick(w);
	pthread_join(w->thread, NULL);
	w->running = false;
}

static void free_worker(struct wq_worker *w)
{
	if (!w)
		return;
	ioc_ring_free(w->req);
	ioc_ring_free(w->done);
	free(w);
}

static int alloc_worker(struct ioc_wq *wq, unsigned index,
			struct wq_worker **out)
{
	size_t sz = (sizeof(struct wq_worker) + IOC_CACHELINE - 1) &
		    ~(size_t)(IOC_CACHELINE - 1);
	struct wq_worker *w = aligned_alloc(IOC_CACHELINE, sz);
	int ret;

	if (!w)
		return -ENOMEM;
	memset(w, 0, sizeof(*w));
	w->wq = wq;
	w->index = index;
	atomic_init(&w->state, W_RUNNING);
	atomic_init(&w->stop, false);
	atomic_init(&w->jobs, 0);
	atomic_init(&w->busy_ns, 0);
	atomic_init(&w->sleeps, 0);
	ret = ioc_ring_new(&w->req, wq->ring_size);
	if (!ret)
		ret = ioc_ring_new(&w->done, wq->ring_size);
	if (ret) {
		free_worker(w);
		return ret;
	}
	*out = w;
	return 0;
}

/* In-order FIFO big enough for every job that can be in flight. */
static int grow_order(struct ioc_wq *wq, unsigned nworkers)
{
	uint64_t need = (uint64_t)nworkers * wq->ring_size, cap = 2;
	uint16_t *order;

	if (!wq->in_order || (wq->order && need <= wq->order_mask + 1))
		return 0;
	while (cap < need)
		cap <<= 1;
	order = calloc(cap, sizeof(*order));
	if (!order)
		return -ENOMEM;
	for (uint64_t s = wq->collected; s < wq->submitted; s++)
		order[s & (cap - 1)] = wq->order[s & wq->order_mask];
	free(wq->order);
	wq->order = order;
	wq->order_mask = cap - 1;
	return 0;
}

int ioc_wq_set_workers(struct ioc_wq *wq, unsigned n)
{
	int ret;

	if (n == 0 || n > WQ_MAX_WORKERS)
		return -EINVAL;
	if (n > wq->nalloc) {
		struct wq_worker **ws = realloc(wq->workers, n * sizeof(*ws));

		if (!ws)
			return -ENOMEM;
		wq->workers = ws;
		ret = grow_order(wq, n);
		if (ret)
			return ret;
		while (wq->nalloc < n) {
			ret = alloc_worker(wq, wq->nalloc, &ws[wq->nalloc]);
			if (ret)
				return ret;
			wq->nalloc++;
		}
	}
	/* Grow: start threads (retired workers restart on their old rings,
	 * whose done entries are still collected in order). */
	while (wq->nactive < n) {
		ret = start_worker(wq->workers[wq->nactive]);
		if (ret)
			return ret;
		wq->nactive++;
	}
	/* Shrink: stop taking new jobs first, then drain and join.  Their
	 * done rings stay in the poll set until collected. */
	if (n < wq->nactive) {
		unsigned old = wq->nactive;

		wq->nactive = n;
		for (unsigned i = n; i < old; i++)
			stop_worker(wq->workers[i]);
	}
	if (wq->cursor >= wq->nactive)
		wq->cursor = 0;
	return 0;
}

unsigned ioc_wq_workers(struct ioc_wq *wq)
{
	return wq->nactive;
}

static void notify_bh(void *opaque);

/* CPUs the process may run on (its affinity mask), at least 1. */
static unsigned usable_cpus(void)
{
	cpu_set_t set;
	long n;

	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return (unsigned)CPU_COUNT(&set);
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}

/* Workers that hold jobs (submitted, not collected): they run, or will.
 * Submitter-private counts, so this reads no line a worker writes. */
static unsigned busy_workers(const struct ioc_wq *wq)
{
	unsigned busy = 0;

	for (unsigned i = 0; i < wq->nalloc; i++)
		busy += wq->workers[i]->inflight != 0;
	return busy;
}

int ioc_wq_new(struct ioc_wq **out, const struct ioc_wq_opts *opts)
{
	static const struct ioc_wq_opts defaults;
	struct ioc_wq *wq;
	unsigned n;
	int ret;

	*out = NULL;
	if (!opts)
		opts = &defaults;
	n = opts->workers;
	if (n == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		n = cpus > 0 ? (unsigned)cpus : 1;
		if (n > WQ_MAX_WORKERS)
			n = WQ_MAX_WORKERS;
	}
	if (n > WQ_MAX_WORKERS)
		return -EINVAL;
	if (opts->ring_size &&
	    (opts->ring_size < 2 || opts->ring_size > (1u << 20) ||
	     (opts->ring_size & (opts->ring_size - 1))))
		return -EINVAL;
	if (opts->policy > IOC_WQ_LEAST_LOADED)
		return -EINVAL;
	if (opts->loop && !opts->done)
		return -EINVAL;

	wq = aligned_alloc(IOC_CACHELINE, (sizeof(*wq) + IOC_CACHELINE - 1) &
					  ~(size_t)(IOC_CACHELINE - 1));
	if (!wq)
		return -ENOMEM;
	memset(wq, 0, sizeof(*wq));
	atomic_init(&wq->waiting, 0);
	atomic_init(&wq->notify_pending, 0);
	wq->policy = opts->policy;
	wq->ring_size = opts->ring_size ? opts->ring_size : WQ_DEFAULT_RING;
	wq->in_order = opts->in_order;
	wq->spin_ns = opts->spin_ns == 0 ? WQ_DEFAULT_SPIN_NS :
		      opts->spin_ns < 0 ? 0 : opts->spin_ns;
	wq->wait_spin = wq->spin_ns;
	wq->ncpus = usable_cpus();
	snprintf(wq->name, sizeof(wq->name), "%s", opts->name ? opts->name : "ioc-wq");
	wq->loop = opts->loop;
	wq->done = opts->done;
	wq->done_opaque = opts->done_opaque;
	if (wq->loop) {
		wq->notify_bh = ioc_bh_new(wq->loop, notify_bh, wq);
		if (!wq->notify_bh) {
			free(wq);
			return -ENOMEM;
		}
	}
	ret = ioc_wq_set_workers(wq, n);
	if (ret) {
		ioc_wq_free(wq);
		return ret;
	}
	*out = wq;
	return 0;
}

static void destroy(struct ioc_wq *wq)
{
	for (unsigned i = 0; i < wq->nalloc; i++)
		stop_worker(wq->workers[i]);
	/* All workers are joined: nobody schedules it any more.  Safe from
	 * inside the BH itself (the free_requested path). */
	if (wq->notify_bh)
		ioc_bh_delete(wq->notify_bh);
	for (unsigned i = 0; i < wq->nalloc; i++)
		free_worker(wq->workers[i]);
	free(wq->workers);
	free(wq->order);
	free(wq);
}

void ioc_wq_free(struct ioc_wq *wq)
{
	if (!wq)
		return;
	if (wq->in_notify) {
		/* Called from a done callback: run what was submitted now,
		 * free when the drain unwinds (notify_bh). */
		for (unsigned i = 0; i < wq->nalloc; i++)
			stop_worker(wq->workers[i]);
		wq->free_requested = true;
		return;
	}
	destroy(wq);
}

static struct wq_worker *pick_worker(struct ioc_wq *wq)
{
	unsigned n = wq->nactive, i = wq->cursor;
	uint32_t cap = wq->ring_size;

	switch (wq->policy) {
	case IOC_WQ_FILL:
		for (unsigned k = 0; k < n; k++) {
			if (wq->workers[i]->inflight < cap) {
				wq->cursor = i;
				return wq->workers[i];
			}
			if (++i == n)
				i = 0;
		}
		return NULL;
	case IOC_WQ_ROUND_ROBIN:
		for (unsigned k = 0; k < n; k++) {
			if (++i >= n)
				i = 0;
			if (wq->workers[i]->inflight < cap) {
				wq->cursor = i;
				return wq->workers[i];
			}
		}
		return NULL;
	case IOC_WQ_LEAST_LOADED: {
		struct wq_worker *best = NULL;

		/* Start after the last pick so ties rotate. */
		for (unsigned k = 0; k < n; k++) {
			struct wq_worker *w;

			if (++i >= n)
				i = 0;
			w = wq->workers[i];
			if (w->inflight < cap && (!best || w->inflight < best->inflight)) {
				best = w;
				wq->cursor = i;
				if (!w->inflight)
					break;
			}
		}
		return best;
	}
	}
	return NULL;
}

int ioc_wq_submit(struct ioc_wq *wq, struct ioc_wq_job *job)
{
	struct wq_worker *w = pick_worker(wq);
	bool ok;

	if (!w)
		return -EAGAIN;
	job->seq = wq->submitted;
	job->worker = w->index;
	if (wq->in_order)
		wq->order[job->seq & wq->order_mask] = (uint16_t)w->index;
	/* inflight < ring size, so the request ring has room. */
	ok = ioc_ring_push_spsc(w->req, job);
	assert(ok);
	(void)ok;
	w->inflight++;
	wq->submitted++;
	kick(w);
	return 0;
}

static unsigned poll_unordered(struct ioc_wq *wq, struct ioc_wq_job **jobs,
			       unsigned max)
{
	unsigned n = wq->nalloc, got = 0, i = wq->poll_start;

	if (i >= n)
		i = 0;
	for (unsigned k = 0; k < n && got < max; k++) {
		struct wq_worker *w = wq->workers[i];

		if (w->inflight) {
			unsigned c = ioc_ring_pop_burst_spsc(w->done,
							     (void **)(jobs + got),
							     max - got);
			w->inflight -= c;
			got += c;
		}
		if (++i == n)
			i = 0;
	}
	/* Rotate so one busy worker cannot starve the others' rings. */
	wq->poll_start = i;
	return got;
}

static unsigned poll_ordered(struct ioc_wq *wq, struct ioc_wq_job **jobs,
			     unsigned max)
{
	unsigned got = 0;

	while (got < max && wq->collected + got < wq->submitted) {
		uint64_t s = wq->collected + got;
		struct wq_worker *w = wq->workers[wq->order[s & wq->order_mask]];
		void *p;

		/* w's jobs complete in its submission order and all of its
		 * earlier ones are collected: its oldest is sequence s. */
		if (!ioc_ring_pop_spsc(w->done, &p))
			break;
		assert(((struct ioc_wq_job *)p)->seq == s);
		w->inflight--;
		jobs[got++] = p;
	}
	return got;
}

int ioc_wq_poll_done(struct ioc_wq *wq, struct ioc_wq_job **jobs, unsigned max)
{
	unsigned got;

	if (max > INT_MAX)
		max = INT_MAX;
	got = wq->in_order ? poll_ordered(wq, jobs, max)
			   : poll_unordered(wq, jobs, max);
	wq->collected += got;
	return (int)got;
}

/* Grow or shrink an adaptive spin after a sleep that lasted `slept` ns:
 * a sleep shorter than the cap would have been covered by spinning, a
 * longer one means spinning would only have burnt CPU (QEMU's adaptive
 * polling, with the same doubling/halving). */
static int64_t adapt_spin(int64_t spin, int64_t spin_max, int64_t slept)
{
	if (slept < spin_max)
		return spin ? (spin * 2 < spin_max ? spin * 2 : spin_max) :
		       (spin_max < 1000 ? spin_max : 1000);
	return spin / 2 < 500 ? 0 : spin / 2;
}

int ioc_wq_wait_done(struct ioc_wq *wq, struct ioc_wq_job **jobs, unsigned max,
		     int64_t timeout_ns)
{
	int64_t start = ioc_now_ns(), deadline, spin_end, last = start;
	unsigned rounds = 0;
	int n;

	if (max == 0)
		return -EINVAL;
	deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	spin_end = start + wq->wait_spin;
	for (;;) {
		n = ioc_wq_poll_done(wq, jobs, max);
		if (n || wq->collected == wq->submitted)
			return n;  /* nothing in flight: nothing to wait for */
		int64_t now = ioc_now_ns();

		/* A spin round takes a microsecond or two; a much longer gap
		 * means we lost the CPU to another thread, maybe the worker
		 * we wait for: stop spinning and let the spin budget rebuild
		 * from the sleeps that follow. */
		if (now - last > WQ_PREEMPTED_NS) {
			spin_end = 0;
			wq->wait_spin = 0;
		}
		last = now;

		/* Spin when our CPU is not needed by a worker: the workers
		 * that hold jobs leave a CPU free (one worker, or a window
		 * that keeps only some of them fed), or they are about to run
		 * dry (no more jobs in flight than workers), when our
		 * reaction time is their idle time.  Otherwise sleep and let
		 * the low-water wake batch the completions: with every CPU
		 * taken by a busy worker, spinning steals one of them
		 * (bench/wq crc4k, 2 workers on 2 CPUs, rings full: 4.4M
		 * jobs/s sleeping, 3.1M spinning).  With a CPU to spare the
		 * sleep is what costs: the worker drains its last quarter
		 * ring (~5 us of checksum jobs) faster than a futex wake
		 * gets us back on a CPU, and then idles (1 worker: 1.9M
		 * jobs/s sleeping, 3.1M spinning, same CPU per job; a
		 * 16-job window: 1.0M vs 3.1M).  The spin adapts: it pays
		 * when completions come faster than a sleep/wake round trip
		 * and shrinks to nothing otherwise. */
		if ((wq->submitted - wq->collected <= wq->nactive ||
		     busy_workers(wq) < wq->ncpus) &&
		    now < spin_end && now < deadline) {
			for (int k = 0; k < 64; k++)
				ioc_ring_relax();
			/* Now and then offer the CPU: when the CPU we
			 * counted as spare is taken by another process, the
			 * worker we wait for may be queued behind us on this
			 * one, and would otherwise wait out our whole spin. */
			if (++rounds % 2 == 0)
				sched_yield();
			continue;
		}
		/* Sleep handshake, submitter half (before futex_wait()). */
		atomic_store_explicit(&wq->waiting, 1, memory_order_relaxed);
		/* Pairs with the fence in notify_completion() after the
		 * worker's done-ring push. */
		atomic_thread_fence(memory_order_seq_cst);
		n = ioc_wq_poll_done(wq, jobs, max);
		if (n) {
			atomic_store_explicit(&wq->waiting, 0, memory_order_relaxed);
			return n;
		}
		if (now >= deadline) {
			atomic_store_explicit(&wq->waiting, 0, memory_order_relaxed);
			return 0;
		}
		if (timeout_ns < 0) {
			futex_wait(&wq->waiting, 1, NULL);
		} else {
			int64_t left = deadline - now;
			struct timespec ts = { left / 1000000000, left % 1000000000 };

			futex_wait(&wq->waiting, 1, &ts);
		}
		atomic_store_explicit(&wq->waiting, 0, memory_order_relaxed);
		wq->wait_spin = adapt_spin(wq->wait_spin, wq->spin_ns,
					   ioc_now_ns() - now);
		spin_end = 0;  /* spun already in this call */
	}
}

uint64_t ioc_wq_in_flight(struct ioc_wq *wq)
{
	return wq->submitted - wq->collected;
}

int ioc_wq_get_stats(struct ioc_wq *wq, struct ioc_wq_worker_stats *st,
		     unsigned max)
{
	for (unsigned i = 0; i < wq->nactive && i < max; i++) {
		struct wq_worker *w = wq->workers[i];

		/* Acquire pairs with the worker's release store of sleeps;
		 * the rest are relaxed snapshots. */
		uint64_t sleeps = atomic_load_explicit(&w->sleeps, memory_order_acquire);

		st[i] = (struct ioc_wq_worker_stats){
			.jobs = atomic_load_explicit(&w->jobs, memory_order_relaxed),
			.busy_ns = atomic_load_explicit(&w->busy_ns, memory_order_relaxed),
			.sleeps = sleeps,
			.wakeups = w->wakeups,
		};
	}
	return (int)wq->nactive;
}

/* ---- loop mode ------------------------------------------------------ */

static void notify_bh(void *opaque)
{
	struct ioc_wq *wq = opaque;
	struct ioc_wq_job *jobs[WQ_BURST];
	int n;

	/* Acq_rel: pairs with the workers' exchange that scheduled us (their
	 * pushes before it are visible; on a weakly ordered CPU such as
	 * AArch64 that takes the acquire, on x86-64 any RMW is a full
	 * barrier); the fence pairs with the fence in notify_completion()
	 * for pushes made after this point. */
	atomic_exchange_explicit(&wq->notify_pending, 0, memory_order_acq_rel);
	atomic_thread_fence(memory_order_seq_cst);
	wq->in_notify = true;
	while (!wq->free_requested && (n = ioc_wq_poll_done(wq, jobs, WQ_BURST)) > 0) {
		for (int i = 0; i < n; i++) {
			wq->done(jobs[i], wq->done_opaque);
			if (wq->free_requested)
				break;
		}
	}
	wq->in_notify = false;
	if (wq->free_requested)
		destroy(wq);
}
