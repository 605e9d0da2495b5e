/*
 * iocore thread pool: blocking calls on worker threads, completions on the
 * submitting loop.
 *
 * The problem
 * -----------
 * Some calls block (preadv on a file without io_uring, fsync, getaddrinfo,
 * compression of a big buffer).  A loop hands them to a worker thread and
 * wants the result back on its own thread.  For small requests (4 KiB reads
 * from page cache) the call itself costs about a microsecond, so the pool's
 * own overhead -- locks, futex wakeups of workers, wakeups of the loop --
 * decides the request rate.  On this project's VMs waking a sleeping thread
 * costs tens of microseconds, so every avoided sleep/wake pair counts.
 *
 * The design
 * ----------
 * One queue per pool, a doubly linked list of the callers' embedded
 * requests under pool->lock (cancel unlinks in O(1)).  Workers wait on the
 * condition variable request_cond with the queue itself as the predicate
 * (seed 002): there is no semaphore whose count would have to track the
 * queue, and cancel just unlinks.
 *
 * Every (pool, loop) pair has a "port" (struct ioc_pool_port) that carries
 * both directions between that loop and the workers:
 *
 *  - Submissions.  ioc_pool_submit() appends to the port's pending list,
 *    which only the loop thread touches, and kicks the port's flush once
 *    per loop iteration (or, when the submission comes from a done
 *    callback, flushes at the end of that completion batch).  The flush
 *    takes pool->lock once for the whole batch and wakes at most one
 *    worker; a worker that takes a job and still sees more jobs than
 *    spinning or already-woken workers wakes the next one (a wake chain), so
 *    the loop pays one signal however long the batch.
 *  - Completions.  A worker pushes the finished request on the port's
 *    lock-free completion stack (a Treiber push) outside pool->lock (seed
 *    002: the completion is made visible to the loop outside the lock, so
 *    the worker's next critical section is short and the loop never waits
 *    for it).  Only the push that finds the stack empty kicks the loop; the
 *    kicked callback takes the whole stack with one exchange, reverses it to
 *    submission order and runs the callbacks.  So the completions that land
 *    while the loop is busy or waking up cost one loop wakeup, not one
 *    each.  The kick is a BH for the home port of a loop's own pool (the
 *    loop owns BHs, so ioc_loop_free() can drop a pending one safely) and
 *    an embedded ioc_loop_post() task for the ports of other loops.
 *  - Idle workers spin, bounded and adaptively, before sleeping: each worker
 *    keeps its own budget (<= spin_max_ns), doubled when a short sleep
 *    proved that spinning would have caught the next job, halved when a
 *    spin found nothing; at most max_spinners workers spin at once, and
 *    only while a CPU is spare (running workers + spinners + the loop's
 *    thread < CPUs).  The
 *    spinner reads only a mirror of the queue length (q_visible) and takes
 *    the lock when it becomes non-zero.  Submitters and chaining workers
 *    count spinning (and already-signalled, and starting) workers as spare
 *    and signal a sleeper only when the queue is longer than the spares.
 *  - Lag yield: a worker that finishes a job when the queue is down to two
 *    jobs per thread, and whose completion landed on a stack the loop has
 *    not collected yet, yields its CPU once (sched_yield) before taking
 *    the next job.  The loop thread is then most likely runnable but
 *    waiting for a CPU a worker holds; if it does not run before the
 *    queue drains, every worker goes to sleep and the loop must wake them
 *    again.  Where nothing else waits for the CPU the yield is one cheap
 *    syscall, and it only happens while the loop lags.
 *  - Threads: min..max, named "<name>-<n>", signals blocked.  Up to one per
 *    CPU starts as soon as jobs wait with nobody to take them.  Past that a
 *    thread only helps if the jobs block (in the kernel, on a lock, on each
 *    other): a per-port timer on the submitting loop looks every
 *    spawn_delay_ns while jobs wait uncovered, and starts one thread per
 *    look when the oldest job waited a whole period and the workers started
 *    fewer than 8 jobs each during it.  QEMU's rule (a thread whenever none
 *    is idle) grows a pool running 4 KiB page-cache reads to max_threads,
 *    and 64 threads on 2 CPUs only contend (variant eager-spawn below).  A
 *    worker whose timed wait expires with an empty queue exits while more
 *    than min remain; lowering max makes the extra workers exit after their
 *    current job.  Exited threads are joined lazily (next flush,
 *    set_limits, free).
 *
 * Measured, one step at a time (bench/pool: 4 KiB preadv from /dev/shm, 64
 * in flight from one loop, max 4 threads; each variant turns one step off).
 * The 2-core VM was shared with other builds (load average 11-18): wall
 * rates swing 3x between runs, so the table gives medians of 5 interleaved
 * 1 s runs, and CPU time per job (all threads), which the design controls
 * whatever the load; preadv itself costs ~1.23 us of CPU here.
 *
 *   variant                       requests/s      CPU/job (median, worst)
 *   all steps on (default)        149k            1.79 us, 1.92
 *   no submission batching        151k            1.91 us, 5.31
 *   no completion batching        100k            1.95 us, 8.97
 *   wake even if a worker spins   174k            1.80 us, 2.08
 *   no spinning                   186k            1.80 us, 1.83
 *   QEMU-like (all of the above)  106k            2.08 us, 7.62
 *   max 64 threads                200k            2.14 us, 2.52
 *   max 64, QEMU's eager spawn     88k            4.39 us, 4.90
 *   (GThreadPool 107k, 2.24 us; uv_queue_work 59k, 7.48 us)
 *
 * Kept, and why: completion batching (a third fewer requests/s and 5x CPU
 * tails without it); submission batching (same median, 3x CPU tails
 * without it: each submit then takes the lock against the workers); the
 * delayed thread start (QEMU's eager rule: 2.5x the CPU per job).  Under
 * this load spinning and not-waking-for-spinners are within the noise (the
 * spinner seldom gets a CPU to spin on); in the one run at a lighter load
 * (load 4-6) spinning was the largest single win, 563k vs 411k requests/s
 * without it, and not waking for spinners gave 563k vs 358k.  They are
 * kept, bounded by max_spinners and the adaptive budget.
 *
 * Spinning only on a spare CPU (spare_cpu(): running workers, spinners
 * and the submitting loop's thread each need one).  A quiet run, medians
 * of 5 interleaved 1 s rounds: default 685k requests/s, spinning also
 * while every CPU is busy (flag IOC_POOL_SPIN_BUSY, the old rule) 638k,
 * no spinning 603k; libuv 609k, GThreadPool 561k.  A spinner that takes
 * the CPU the loop thread needs delays the resubmissions it waits for.
 * Tried with it and dropped: workers at nice 5 or SCHED_BATCH so the loop
 * thread wins the CPU (627k, 647k: no better).
 *
 * And the spinner yields the CPU every 32 pauses (spin()): the loop
 * thread, woken to take completions and resubmit, is often queued behind
 * a spinner on the same CPU.  Medians of 5-7 interleaved 1 s rounds on a
 * quiet machine: 546k requests/s without the yield, 983k-1.18M with it
 * (yield every 32 pauses; every 128: 1.1M, every 512: 908k; 8 or 128
 * pauses per round instead of 32: no different); libuv 503-635k,
 * GThreadPool 583k.  This VM also has slow phases where everything runs
 * ~40% slower (ours 725k, libuv 456k, GThreadPool 436k, same rounds).
 * With the yield, spinning on a busy CPU (IOC_POOL_SPIN_BUSY) and not
 * spinning at all came out at 778k and 817k in a slow phase against 747k
 * for the default: within noise, so the spare-CPU rule stays for what it
 * saves in CPU time.
 *
 * The ceiling (bench/pool "ceiling-bare-threads": the same threads calling
 * preadv in a loop, no pool, no loop thread): 1.4-1.75M/s quiet, 750-920k
 * when other work shares the CPUs.  Before the yield the pool reached a
 * third of it (make bench: 595k vs 1.75M).
 *
 * Loop wakeups: with everything on, the loop slept and was woken by a
 * syscall once per ~32 preadv completions (0.03 notify syscalls per job;
 * 8.9 completions per dispatch, the rest found by the loop's own polling)
 * and once per ~140 empty jobs (63.7 completions per dispatch).
 *
 * Tried and dropped: taking up to 8 jobs per lock round trip from a deep
 * queue (no measurable CPU saving; it made cancel coarser).  Dispatching
 * the completion stack newest first with the next request prefetched,
 * to hide the pointer chase of the reversal (23% of the loop thread's
 * time): within noise, 5 interleaved rounds.
 *
 * Where the preadv row's time went before the lag yield (2026-11-22, 1.6-1.8
 * us of CPU per job against the bare threads' ~1.2): the loop thread ~0.42
 * us per job, half of it context switches of its yielding poll rounds, a
 * quarter the completion stack; the workers ~0.15 us above the preadv
 * itself.  A thread-local read buffer in the benchmark, which no pool could
 * offer, would be worth at most 4%.  A yield in the spin was once dropped
 * for costing CPU per job under heavy load; the measurements above, on a
 * quiet machine, brought it back.
 *
 * The lag yield.  perf sched on that row (2 workers, loop thread, 2 CPUs)
 * showed a fixed cycle: the loop shared a CPU with one worker, which ran
 * ~45 us, long enough to drain the 64-deep queue while the loop, having
 * yielded in its poll, waited behind it; then both workers slept, the
 * loop ran 7 us, resubmitted and woke them, and the other CPU idled ~14 us
 * per cycle for the wakeup (8.75% idle; 16k worker wakeups a second).
 * With the yield, the loop runs before the queue drains.  Five interleaved
 * 1.2 s rounds against the no-lag-yield variant (medians): worker wakeups
 * 21-32k -> 24-38 per run, ~4.5% of jobs yield, CPU per job 1553 -> 1473
 * ns, 1.20M -> 1.35M requests/s.  bench/pool --quick, three runs:
 * 1.37-1.41M requests/s against libuv's 661-677k (2.07-2.11x); make bench
 * QUICK=1 with 3 repeats: 2.11x and 2.04x.  Interleaved (5 rounds,
 * medians, a slow phase of the VM): depth 4, 386k -> 505k; depth 1, 331k
 * vs 313k, inside the rounds' spread (a lone request never finds the stack
 * busy, so it never yields); empty jobs 287 -> 254 ns.  Yielding whenever
 * the queue is low, without the lagging test, lost half the rate at depth
 * 1 (533k -> 282k): the worker then yields after every job.
 *
 * Alternatives rejected
 * ---------------------
 *  - A semaphore counting queued jobs (QEMU before 2022): an extra mutex and
 *    condvar inside the semaphore, and cancel must keep the count in step.
 *  - Per-worker queues with round-robin (seed 004): better for uniform CPU
 *    work, but a blocking call of unknown length would strand the jobs
 *    queued behind it while other workers idle.
 *  - A lock-free MPMC submission queue: the queue must also be the
 *    condition variable's predicate and support O(1) cancel; with
 *    submissions batched the lock is taken once per batch anyway.
 *  - Holding completions back until many have gathered (fewer loop
 *    wakeups still): a worker that defers the kick and then blocks in its
 *    next job would strand them, and nothing else would notice.
 *
 * Costs and limits
 * ----------------
 *  - A spinning worker burns a CPU for up to spin_max_ns (50 us) each time
 *    it runs out of work; the adaptive budget falls to zero when spinning
 *    stops paying, and only max_spinners workers (CPUs - 1) spin at once.
 *  - Deferring the hand-off of a submission to the end of the loop
 *    iteration adds the rest of that iteration to its latency.
 *  - Growth past one thread per CPU waits for the submitting loop's timer
 *    (spawn_delay_ns, 200 us by default): a loop that does not run does not
 *    grow its pool beyond that.
 *  - A shared pool looks its port up through a one-entry thread-local cache,
 *    else a list walk under the lock (O(loops), only on a cache miss).
 *  - Ports live as long as the pool.  A task-kicked port whose task or
 *    timer is still pending when the pool is freed is orphaned and freed by
 *    that task or timer when it runs; if its loop is freed first (with
 *    requests of the pool still in flight, a caller bug) it leaks.
 */
#include "ioc-config.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "iocore/co.h"
#include "iocore/pool.h"

enum {
	DEFAULT_MAX_THREADS = 64,
	DEFAULT_IDLE_TIMEOUT_MS = 10000,
	DEFAULT_SPIN_MAX_NS = 50000,
	DEFAULT_SPAWN_DELAY_NS = 200000,
	SPIN_GROW_MIN_NS = 2000, /* a grown budget starts here */
	SPIN_SHRINK_FLOOR_NS = 500, /* below this, stop spinning */
	SPAWN_JOBS_PER_THREAD = 8,  /* see port_spawn_timer() */
};

/* req->state.  Written by the loop thread (IDLE, PENDING, QUEUED before
 * the flush publishes it) or under pool->lock (QUEUED -> RUNNING/DONE). */
enum {
	REQ_IDLE = 0,  /* not submitted, or done dispatched */
	REQ_PENDING,   /* on its port's pending list (loop thread) */
	REQ_QUEUED,    /* on the pool queue */
	REQ_RUNNING,   /* taken by a worker, or completed and not dispatched */
	REQ_DONE,      /* cancelled or failed, completion pending */
};

/* port->live bits: who still references a port whose pool may be gone. */
enum {
	LIVE_POOL = 1u << 0,  /* the pool exists */
	LIVE_DONE = 1u << 1,  /* done_task is posted and has not started */
	LIVE_FLUSH = 1u << 2, /* flush_task is posted and has not started */
	LIVE_TIMER = 1u << 3, /* spawn_timer is armed */
};

struct ioc_pool_port {
	/* Loop-thread side. */
	struct ioc_pool *pool;
	struct ioc_loop *loop;
	struct ioc_pool_port *next;  /* pool->ports, under pool->lock */
	struct ioc_pool_req *pend_head, *pend_tail;
	unsigned npend;
	unsigned in_dispatch;        /* running done callbacks */
	bool flush_posted;           /* flush_bh/flush_task is pending */
	/* The home port of a loop's own pool kicks the loop with BHs, which
	 * the loop owns and ioc_loop_free() can delete; other ports post
	 * tasks embedded here (see pool_destroy()). */
	struct ioc_bh *done_bh, *flush_bh;
	struct ioc_task flush_task;
	struct ioc_timer spawn_timer;  /* re-checks a stalled queue */
	uint64_t started_snap;         /* pool->jobs_started when armed */
	/* Written only by the loop thread; atomic so get_stats may read. */
	_Atomic uint64_t submitted, completed, batches;

	/* Worker side: the completion stack, on its own cache line. */
	_Atomic(struct ioc_pool_req *) done_head IOC_CACHE_ALIGNED;
	atomic_uint live;
	struct ioc_task done_task;
};

struct worker {
	struct ioc_pool *pool;
	struct worker *next;         /* pool->zombies, under pool->lock */
	pthread_t tid;
	unsigned id;
	int64_t spin_ns;             /* this worker's adaptive budget */
};

struct ioc_pool {
	pthread_mutex_t lock;
	pthread_cond_t request_cond;   /* queue became non-empty, or limits */
	pthread_cond_t worker_stopped; /* a worker exited (for free) */

	/* Under lock. */
	struct ioc_pool_req *q_head, *q_tail;
	unsigned q_len;
	unsigned nthreads;   /* started and not exited (includes starting) */
	unsigned nstarting;  /* created, not yet at their first queue check */
	unsigned nsleeping;  /* in pthread_cond_timedwait */
	unsigned nwoken;     /* signalled, not yet back from the wait */
	unsigned nspinning;  /* spinning outside the lock */
	unsigned nrunning;   /* running a job */
	unsigned min_threads, max_threads;
	unsigned next_id;
	bool stopping;
	struct worker *zombies;        /* exited, not joined */
	struct ioc_pool_port *ports;
	uint64_t cancelled, wakeups, lag_yields;
	uint64_t jobs_started;

	/* Mirror of q_len for spinners, which read it without the lock.
	 * Stored under the lock; see spin(). */
	atomic_uint q_visible IOC_CACHE_ALIGNED;

	/* Constant after creation. */
	struct ioc_loop *home_loop;    /* set for ioc_pool_for_loop() pools */
	struct ioc_pool_port *home_port;
	uint64_t id;
	int64_t idle_timeout_ns;
	int64_t spin_max_ns;           /* 0: no spinning */
	unsigned max_spinners;
	unsigned ncpu;                 /* online CPUs */
	unsigned eager_threads;        /* start at once up to this many */
	int64_t spawn_delay_ns;        /* then only after a job waited this */
	uint32_t flags;
	char name[11];
};

static atomic_uint_fast64_t pool_ids = 1;

/* One-entry cache of the last port used by this thread (shared pools).
 * pool->id tells a new pool at a recycled address from the old one. */
static __thread struct {
	struct ioc_pool *pool;
	uint64_t id;
	struct ioc_loop *loop;
	struct ioc_pool_port *port;
} tl_port;

static void *worker_main(void *opaque);
static void port_done_task(struct ioc_task *task);
static void port_flush_task(struct ioc_task *task);

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/* ---- queue (under pool->lock) ---------------------------------------- */

static void queue_unlink(struct ioc_pool *pool, struct ioc_pool_req *req)
{
	if (req->prev)
		req->prev->next = req->next;
	else
		pool->q_head = req->next;
	if (req->next)
		req->next->prev = req->prev;
	else
		pool->q_tail = req->prev;
	req->next = req->prev = NULL;
	pool->q_len--;
	/* Pairs with the relaxed load in spin(); the lock orders the rest. */
	atomic_store_explicit(&pool->q_visible, pool->q_len,
			      memory_order_relaxed);
}

/* Append the chain first..last (n requests, linked through next/prev). */
static void queue_splice(struct ioc_pool *pool, struct ioc_pool_req *first,
			 struct ioc_pool_req *last, unsigned n)
{
	first->prev = pool->q_tail;
	last->next = NULL;
	if (pool->q_tail)
		pool->q_tail->next = first;
	else
		pool->q_head = first;
	pool->q_tail = last;
	pool->q_len += n;
	/* Pairs with the relaxed load in spin(). */
	atomic_store_explicit(&pool->q_visible, pool->q_len,
			      memory_order_relaxed);
}

/* Take the whole queue (for failure and shutdown). */
static struct ioc_pool_req *queue_take_all(struct ioc_pool *pool)
{
	struct ioc_pool_req *list = pool->q_head;

	pool->q_head = pool->q_tail = NULL;
	pool->q_len = 0;
	atomic_store_explicit(&pool->q_visible, 0, memory_order_relaxed);
	for (struct ioc_pool_req *r = list; r; r = r->next)
		r->state = REQ_DONE;
	return list;
}

/*
 * Who takes the jobs now queued?  Under pool->lock, after the queue grew or
 * a worker took a job.  Spinning workers, workers already signalled and
 * workers still starting will all look at the queue soon: they are spare.
 * Signal a sleeper only when the queue is longer than the spares.  With no
 * sleeper to signal, start a thread if there are fewer than eager_threads
 * (one per CPU), or if may_grow: port_spawn_timer() found that the jobs
 * block rather than compute, so another thread adds parallelism instead of
 * contention.
 */
enum wake { WAKE_NONE, WAKE_SIGNAL, WAKE_SPAWN };

static unsigned spare_workers(const struct ioc_pool *pool)
{
	if (pool->flags & IOC_POOL_WAKE_ALWAYS)
		return pool->nwoken + pool->nstarting;
	return pool->nspinning + pool->nwoken + pool->nstarting;
}

static enum wake want_wake(struct ioc_pool *pool, bool may_grow)
{
	if (pool->q_len <= spare_workers(pool) || pool->stopping)
		return WAKE_NONE;
	if (pool->nsleeping > pool->nwoken) {
		pool->nwoken++;
		pool->wakeups++;
		return WAKE_SIGNAL;
	}
	if (pool->nthreads < pool->max_threads &&
	    (pool->nthreads < pool->eager_threads || may_grow)) {
		pool->nthreads++;
		pool->nstarting++;
		return WAKE_SPAWN;
	}
	return WAKE_NONE;
}

/* More jobs wait than spare workers will take, and the pool may grow: the
 * submitting loop looks again after spawn_delay_ns (port_spawn_timer()).
 * Sleepers just signalled count as spare, but may block in their job as
 * well, so this does not require that none sleeps.  Under pool->lock. */
static bool stalled(const struct ioc_pool *pool)
{
	return !pool->stopping && pool->q_len > spare_workers(pool) &&
	       pool->nthreads < pool->max_threads;
}

/* ---- completions ------------------------------------------------------ */

/*
 * Make req's completion visible to its loop.  Any thread, no pool lock
 * needed (and none held by workers: seed 002).  post false is for
 * pool_destroy(), which drains the stacks itself.
 *
 * Handshake with port_done_task(): the push that finds the stack empty owns
 * the duty to post the task; the task clears LIVE_DONE first and then takes
 * the stack with an exchange, so a push that lands after the exchange finds
 * the stack empty again and posts again (the task has started, so posting
 * it again is allowed by ioc_loop_post()).  A push that lands before the
 * exchange is taken by it.  No completion is left without a posted task.
 *
 * Returns whether the stack already held completions, i.e. the loop has
 * not yet collected ones pushed before this (a hint for the lag yield; the
 * acquire of the CAS is not needed for it).
 */
static bool port_push_done(struct ioc_pool_port *port,
			   struct ioc_pool_req *req, bool post)
{
	struct ioc_pool_req *old;

	if (port->pool->flags & IOC_POOL_NO_COMPLETE_BATCH && post) {
		ioc_loop_post(port->loop, &req->task);
		return false;
	}
	old = atomic_load_explicit(&port->done_head, memory_order_relaxed);
	do {
		req->next = old;
		/* Release: publishes req->ret and req->next.  Acquire: when
		 * old is NULL we read the exchange in port_dispatch(), and the
		 * loop's use of done_task (its links) must come before our
		 * posting it again.  Pairs with that acq_rel exchange. */
	} while (!atomic_compare_exchange_weak_explicit(&port->done_head, &old,
			req, memory_order_acq_rel, memory_order_relaxed));
	if (old == NULL && post) {
		if (port->done_bh) {
			ioc_bh_schedule(port->done_bh);
			return false;
		}
		/* Pairs with the fetch_and in port_done_task(). */
		atomic_fetch_or_explicit(&port->live, LIVE_DONE,
					 memory_order_relaxed);
		ioc_loop_post(port->loop, &port->done_task);
	}
	return old != NULL;
}

static void complete_list(struct ioc_pool_req *list, int64_t ret, bool post)
{
	while (list) {
		struct ioc_pool_req *next = list->next;

		list->ret = ret;
		port_push_done(list->port, list, post);
		list = next;
	}
}

static void port_flush(struct ioc_pool_port *port);
static void port_arm_spawn_timer(struct ioc_pool_port *port);
static void port_spawn_timer(void *opaque);

/* Run the callbacks of everything on port's completion stack.  Loop thread
 * (or pool_destroy()).  Returns the number dispatched. */
static unsigned port_dispatch(struct ioc_pool_port *port)
{
	struct ioc_pool_req *list, *fifo = NULL;
	unsigned n = 0;

	/* Acquire: pairs with the release CAS in port_push_done(); release:
	 * orders our use of the kick (task links) before the next push that
	 * finds the stack empty and kicks again. */
	list = atomic_exchange_explicit(&port->done_head, NULL,
					memory_order_acq_rel);
	while (list) {
		struct ioc_pool_req *next = list->next;

		list->next = fifo;
		fifo = list;
		list = next;
	}
	port->in_dispatch++;
	while (fifo) {
		struct ioc_pool_req *next = fifo->next;

		fifo->state = REQ_IDLE;
		fifo->next = fifo->prev = NULL;
		/* fifo may be freed or resubmitted by its callback. */
		fifo->done(fifo->opaque, fifo->ret);
		fifo = next;
		n++;
	}
	port->in_dispatch--;
	if (n) {
		/* Single writer (this loop thread); atomic for get_stats. */
		atomic_store_explicit(&port->completed,
			atomic_load_explicit(&port->completed,
					     memory_order_relaxed) + n,
			memory_order_relaxed);
		atomic_store_explicit(&port->batches,
			atomic_load_explicit(&port->batches,
					     memory_order_relaxed) + 1,
			memory_order_relaxed);
	}
	return n;
}

static void port_free_if_orphan(struct ioc_pool_port *port, unsigned was,
				unsigned bit)
{
	if ((was & ~bit) == 0)
		free(port);
}

static void port_done_task(struct ioc_task *task)
{
	struct ioc_pool_port *port =
		ioc_container_of(task, struct ioc_pool_port, done_task);
	/* Pairs with the fetch_or in port_push_done() (and the one clearing
	 * LIVE_POOL in pool_destroy()). */
	unsigned was = atomic_fetch_and_explicit(&port->live, ~(unsigned)LIVE_DONE,
						 memory_order_acq_rel);

	if (!(was & LIVE_POOL)) {
		port_free_if_orphan(port, was, LIVE_DONE);
		return;
	}
	port_dispatch(port);
	/* Submissions made by the callbacks go out as one batch. */
	if (port->npend)
		port_flush(port);
}

static void port_done_bh(void *opaque)
{
	struct ioc_pool_port *port = opaque;

	port_dispatch(port);
	if (port->npend)
		port_flush(port);
}

/* IOC_POOL_NO_COMPLETE_BATCH: one task per completion. */
static void req_done_task(struct ioc_task *task)
{
	struct ioc_pool_req *req =
		ioc_container_of(task, struct ioc_pool_req, task);
	struct ioc_pool_port *port = req->port;

	port->in_dispatch++;
	req->state = REQ_IDLE;
	req->next = req->prev = NULL;
	req->done(req->opaque, req->ret);
	port->in_dispatch--;
	atomic_store_explicit(&port->completed,
		atomic_load_explicit(&port->completed, memory_order_relaxed) + 1,
		memory_order_relaxed);
	atomic_store_explicit(&port->batches,
		atomic_load_explicit(&port->batches, memory_order_relaxed) + 1,
		memory_order_relaxed);
	if (port->npend)
		port_flush(port);
}

/* ---- threads ---------------------------------------------------------- */

/* Start the worker reserved by want_wake() (nthreads and nstarting already
 * counted).  Without pool->lock.  On failure, and if no worker is left to
 * run the queue, the queued requests fail with the error. */
static int spawn_worker(struct ioc_pool *pool)
{
	struct ioc_pool_req *failed = NULL;
	sigset_t all, old;
	struct worker *w;
	int rc;

	w = calloc(1, sizeof(*w));
	if (!w) {
		rc = -ENOMEM;
		goto fail;
	}
	w->pool = pool;
	w->spin_ns = pool->spin_max_ns / 4;
	pthread_mutex_lock(&pool->lock);
	w->id = pool->next_id++;
	pthread_mutex_unlock(&pool->lock);
	/* Workers never take signals: they belong to the application's
	 * threads.  The new thread inherits the mask set here. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&w->tid, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc == 0)
		return 0;
	free(w);
fail:
	pthread_mutex_lock(&pool->lock);
	pool->nthreads--;
	pool->nstarting--;
	if (pool->nthreads == 0)
		failed = queue_take_all(pool);
	pthread_cond_broadcast(&pool->worker_stopped);
	pthread_mutex_unlock(&pool->lock);
	complete_list(failed, rc, true);
	return rc;
}

static void reap_zombies(struct ioc_pool *pool)
{
	struct worker *list;

	pthread_mutex_lock(&pool->lock);
	list = pool->zombies;
	pool->zombies = NULL;
	pthread_mutex_unlock(&pool->lock);
	while (list) {
		struct worker *next = list->next;

		pthread_join(list->tid, NULL);
		free(list);
		list = next;
	}
}

static void act(struct ioc_pool *pool, enum wake w)
{
	if (w == WAKE_SIGNAL)
		pthread_cond_signal(&pool->request_cond);
	else if (w == WAKE_SPAWN)
		spawn_worker(pool);
}

/*
 * Spin until the queue looks non-empty or the budget runs out.  Returns the
 * time spun when it saw work, -1 otherwise.  Without pool->lock: it reads
 * only q_visible (relaxed; the caller re-checks the queue under the lock,
 * which orders everything else).
 */
static int64_t spin(struct ioc_pool *pool, int64_t budget)
{
	int64_t start = ioc_now_ns(), now = start;

	while (now - start < budget) {
		for (int i = 0; i < 32; i++) {
			/* Pairs with the stores in queue_splice()/unlink(). */
			if (atomic_load_explicit(&pool->q_visible,
						 memory_order_relaxed))
				return now - start;
			cpu_relax();
		}
		/* Offer the CPU after every 32 pauses (~1-2 us): the thread
		 * that makes our next job -- the loop thread, woken to take
		 * completions and resubmit -- may be queued on this very CPU,
		 * and a spinner that holds it delays exactly the work it
		 * waits for.  With nothing else runnable this costs a cheap
		 * syscall.  See the measurements at the top of the file. */
		sched_yield();
		now = ioc_now_ns();
	}
	return -1;
}

/*
 * Whether an idle worker may spin: only on a CPU nobody else needs.  The
 * workers running jobs, those already spinning and the submitting loop's
 * thread (which must run to hand out more work and take completions) each
 * need one.  On 2 CPUs: spin only while no job runs.  Spinning past that
 * takes the CPU from the loop thread or a worker, i.e. from whoever would
 * produce the work the spinner waits for (bench/pool preadv, 4 threads, 2
 * CPUs: see the table at the top of the file).  Under pool->lock.
 */
static bool spare_cpu(const struct ioc_pool *pool)
{
	if (pool->flags & IOC_POOL_SPIN_BUSY)
		return true;
	return pool->nrunning + pool->nspinning + 1 < pool->ncpu;
}

static void spin_adapt(struct worker *w, int64_t max, bool useful)
{
	if (useful) {
		w->spin_ns = w->spin_ns * 2;
		if (w->spin_ns < SPIN_GROW_MIN_NS)
			w->spin_ns = SPIN_GROW_MIN_NS;
		if (w->spin_ns > max)
			w->spin_ns = max;
	} else {
		w->spin_ns /= 2;
		if (w->spin_ns < SPIN_SHRINK_FLOOR_NS)
			w->spin_ns = 0;
	}
}

/*
 * The worker.  Sleep/wake handshake with submitters (port_flush(),
 * chaining workers, set_limits, destroy):
 *   - A submitter appends to the queue and decides whom to wake, both under
 *     pool->lock, and signals after unlocking.
 *   - A worker checks the queue under pool->lock; if empty it either spins
 *     (nspinning++ under the lock, spin outside, nspinning-- and re-check
 *     under the lock) or sleeps (nsleeping++ and pthread_cond_timedwait,
 *     which releases the lock atomically).
 *   - If the append came before the worker's locked check, the worker sees
 *     the job.  If it came after, the worker was either counted in
 *     nspinning (it re-checks the queue under the lock when the spin ends,
 *     and a spinner only leaves the count under the lock: the submitter saw
 *     it as spare and rightly did not signal) or counted in nsleeping and
 *     already inside the wait (the condvar releases the lock only once the
 *     thread is waiting), so the signal reaches a waiter.  No wakeup is
 *     lost.  Spurious wakeups are harmless: the queue is the predicate.
 *   - nwoken is only a hint (any waking thread decrements it); correctness
 *     rests on every waking thread re-checking the queue.
 *   - Every path returns to the top of the loop with the lock held, so a
 *     stop or a lower max broadcast while a worker ran a job or spun is
 *     seen before it sleeps.
 * pool-wake.pml models this handshake (batched submits, the chain, spinners,
 * shutdown) and tests/pool/test-pool-model.sh checks it with spin: no job
 * is stranded while every worker sleeps, and the checker does find the
 * deadlocks of the mutations noted in the model.
 */
static void *worker_main(void *opaque)
{
	struct worker *w = opaque;
	struct ioc_pool *pool = w->pool;
	bool spun = false;  /* spun since the last job: sleep next */
	char name[16];
	enum wake wk;

	snprintf(name, sizeof(name), "%s-%u", pool->name, w->id);
	pthread_setname_np(pthread_self(), name);

	pthread_mutex_lock(&pool->lock);
	pool->nstarting--;
	for (;;) {
		struct ioc_pool_req *req;
		struct timespec ts;
		bool lagging;
		int64_t t0;
		int rc;

		/* Every path below comes back here with the lock held, so a
		 * stop or a lower max that was broadcast while we ran a job
		 * or spun is seen before we sleep. */
		if (pool->stopping || pool->nthreads > pool->max_threads)
			break;
		req = pool->q_head;
		if (req) {
			spun = false;
			queue_unlink(pool, req);
			req->state = REQ_RUNNING;
			pool->jobs_started++;
			pool->nrunning++;
			wk = want_wake(pool, false);
			pthread_mutex_unlock(&pool->lock);
			act(pool, wk);

			req->ret = req->fn(req->arg);
			/* req is the loop's once pushed (it may be freed). */
			lagging = port_push_done(req->port, req, true);

			pthread_mutex_lock(&pool->lock);
			pool->nrunning--;
			/* Lag yield: the queue is running low and the loop has
			 * not collected earlier completions, so its thread is
			 * likely waiting for a CPU -- maybe this one.  Offer it
			 * before the queue runs dry and the workers sleep. */
			if (lagging && pool->q_len <= 2 * pool->nthreads &&
			    !(pool->flags & IOC_POOL_NO_LAG_YIELD)) {
				pool->lag_yields++;
				pthread_mutex_unlock(&pool->lock);
				sched_yield();
				pthread_mutex_lock(&pool->lock);
			}
			continue;
		}

		if (!spun && w->spin_ns > 0 &&
		    pool->nspinning < pool->max_spinners &&
		    spare_cpu(pool)) {
			int64_t got;

			pool->nspinning++;
			pthread_mutex_unlock(&pool->lock);
			got = spin(pool, w->spin_ns);
			pthread_mutex_lock(&pool->lock);
			pool->nspinning--;
			spin_adapt(w, pool->spin_max_ns, got >= 0);
			spun = true;
			continue;
		}
		spun = false;

		t0 = ioc_now_ns();
		ts.tv_sec = (t0 + pool->idle_timeout_ns) / 1000000000;
		ts.tv_nsec = (t0 + pool->idle_timeout_ns) % 1000000000;
		pool->nsleeping++;
		rc = pthread_cond_timedwait(&pool->request_cond, &pool->lock, &ts);
		pool->nsleeping--;
		if (pool->nwoken)
			pool->nwoken--;
		if (rc == ETIMEDOUT && !pool->q_head &&
		    pool->nthreads > pool->min_threads)
			break;
		/* Woken soon after falling asleep: a spin would have caught
		 * this job without the two context switches. */
		if (rc == 0 && pool->spin_max_ns > 0 && pool->q_head &&
		    ioc_now_ns() - t0 < 2 * pool->spin_max_ns)
			spin_adapt(w, pool->spin_max_ns, true);
	}
	pool->nthreads--;
	w->next = pool->zombies;
	pool->zombies = w;
	/* If we consumed a signal meant for a job and exit because max
	 * shrank, pass it on (seed 002). */
	wk = WAKE_NONE;
	if (pool->q_head && !pool->stopping && pool->nsleeping > pool->nwoken) {
		pool->nwoken++;
		pool->wakeups++;
		wk = WAKE_SIGNAL;
	}
	pthread_cond_broadcast(&pool->worker_stopped);
	if (wk == WAKE_SIGNAL)
		pthread_cond_signal(&pool->request_cond);
	/* After this unlock the pool may only be touched by pool_destroy(),
	 * which joins this thread before freeing it. */
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

/* ---- ports and submission --------------------------------------------- */

static void port_done_bh(void *opaque);
static void port_flush_bh(void *opaque);

/* with_bh: the home port, created on its loop's thread. */
static struct ioc_pool_port *port_new(struct ioc_pool *pool,
				      struct ioc_loop *loop, bool with_bh)
{
	struct ioc_pool_port *port;

	if (posix_memalign((void **)&port, IOC_CACHELINE, sizeof(*port)))
		return NULL;
	memset(port, 0, sizeof(*port));
	if (with_bh) {
		port->done_bh = ioc_bh_new(loop, port_done_bh, port);
		port->flush_bh = ioc_bh_new(loop, port_flush_bh, port);
		if (!port->done_bh || !port->flush_bh) {
			if (port->done_bh)
				ioc_bh_delete(port->done_bh);
			if (port->flush_bh)
				ioc_bh_delete(port->flush_bh);
			free(port);
			return NULL;
		}
	}
	port->pool = pool;
	port->loop = loop;
	port->flush_task.fn = port_flush_task;
	port->done_task.fn = port_done_task;
	ioc_timer_init(&port->spawn_timer, loop, port_spawn_timer, port);
	atomic_init(&port->done_head, NULL);
	atomic_init(&port->live, LIVE_POOL);
	atomic_init(&port->submitted, 0);
	atomic_init(&port->completed, 0);
	atomic_init(&port->batches, 0);
	return port;
}

static struct ioc_pool_port *port_get(struct ioc_pool *pool,
				      struct ioc_loop *loop)
{
	struct ioc_pool_port *port;

	if (loop == pool->home_loop)
		return pool->home_port;
	if (tl_port.pool == pool && tl_port.id == pool->id &&
	    tl_port.loop == loop)
		return tl_port.port;
	pthread_mutex_lock(&pool->lock);
	for (port = pool->ports; port; port = port->next)
		if (port->loop == loop)
			break;
	if (!port) {
		port = port_new(pool, loop, false);
		if (port) {
			port->next = pool->ports;
			pool->ports = port;
		}
	}
	pthread_mutex_unlock(&pool->lock);
	if (port) {
		tl_port.pool = pool;
		tl_port.id = pool->id;
		tl_port.loop = loop;
		tl_port.port = port;
	}
	return port;
}

/* Hand the port's pending submissions to the workers.  Loop thread. */
static void port_flush(struct ioc_pool_port *port)
{
	struct ioc_pool *pool = port->pool;
	struct ioc_pool_req *first = port->pend_head, *last = port->pend_tail;
	unsigned n = port->npend;
	bool reap, arm;
	enum wake wk;
	int64_t now;

	if (!n)
		return;
	port->pend_head = port->pend_tail = NULL;
	port->npend = 0;
	now = ioc_now_ns();
	for (struct ioc_pool_req *r = first; r; r = r->next) {
		r->state = REQ_QUEUED;
		r->queued_ns = now;
	}

	pthread_mutex_lock(&pool->lock);
	if (pool->stopping) {
		/* Submitted during ioc_pool_free(): cancelled. */
		pool->cancelled += n;
		for (struct ioc_pool_req *r = first; r; r = r->next)
			r->state = REQ_DONE;
		pthread_mutex_unlock(&pool->lock);
		complete_list(first, -ECANCELED, false);
		return;
	}
	queue_splice(pool, first, last, n);
	wk = want_wake(pool, false);
	arm = stalled(pool) && !ioc_timer_pending(&port->spawn_timer);
	if (arm)
		port->started_snap = pool->jobs_started; /* period starts */
	reap = pool->zombies != NULL;
	pthread_mutex_unlock(&pool->lock);
	act(pool, wk);
	if (arm)
		port_arm_spawn_timer(port);
	if (reap)
		reap_zombies(pool);
}

/*
 * The stall check.  Nobody else would notice that every worker is stuck in
 * a long job while more wait (the loop submits nothing new, the workers do
 * not come back): so the loop that submitted looks again every
 * spawn_delay_ns while the queue stays uncovered, and starts one thread per
 * look once the oldest job has waited that long.  Loop thread.
 */
static void port_spawn_timer(void *opaque)
{
	struct ioc_pool_port *port = opaque;
	struct ioc_pool *pool = port->pool;
	/* Pairs with the fetch_or in port_arm_spawn_timer() and the
	 * fetch_and in pool_destroy(). */
	unsigned was = atomic_fetch_and_explicit(&port->live, ~(unsigned)LIVE_TIMER,
						 memory_order_acq_rel);
	enum wake wk;
	bool arm, blocking;
	int64_t now = ioc_now_ns();

	if (!(was & LIVE_POOL)) {
		port_free_if_orphan(port, was, LIVE_TIMER);
		return;
	}
	pthread_mutex_lock(&pool->lock);
	/* Blocking jobs: the oldest waited a whole period, and the workers
	 * started fewer than SPAWN_JOBS_PER_THREAD jobs each during it (so
	 * jobs take longer than spawn_delay_ns / SPAWN_JOBS_PER_THREAD).
	 * Short jobs delayed only by a busy or preempted CPU do not grow
	 * the pool: more threads would only contend. */
	blocking = pool->q_head &&
		   now - pool->q_head->queued_ns >= pool->spawn_delay_ns &&
		   pool->jobs_started - port->started_snap <
			(uint64_t)pool->nthreads * SPAWN_JOBS_PER_THREAD;
	wk = want_wake(pool, blocking);
	arm = stalled(pool);
	port->started_snap = pool->jobs_started;
	pthread_mutex_unlock(&pool->lock);
	act(pool, wk);
	if (arm)
		port_arm_spawn_timer(port);
}

static void port_arm_spawn_timer(struct ioc_pool_port *port)
{
	if (ioc_timer_pending(&port->spawn_timer))
		return;

	/* Pairs with the fetch_and in port_spawn_timer(). */
	atomic_fetch_or_explicit(&port->live, LIVE_TIMER, memory_order_relaxed);
	ioc_timer_arm_in(&port->spawn_timer, port->pool->spawn_delay_ns);
}

static void port_flush_task(struct ioc_task *task)
{
	struct ioc_pool_port *port =
		ioc_container_of(task, struct ioc_pool_port, flush_task);
	/* Pairs with the fetch_or in ioc_pool_submit() and the fetch_and
	 * in pool_destroy(). */
	unsigned was = atomic_fetch_and_explicit(&port->live, ~(unsigned)LIVE_FLUSH,
						 memory_order_acq_rel);

	if (!(was & LIVE_POOL)) {
		port_free_if_orphan(port, was, LIVE_FLUSH);
		return;
	}
	port->flush_posted = false;
	port_flush(port);
}

static void port_flush_bh(void *opaque)
{
	struct ioc_pool_port *port = opaque;

	port->flush_posted = false;
	port_flush(port);
}

/* Complete req with ret on loop without a port (out of memory). */
static void nomem_task(struct ioc_task *task)
{
	struct ioc_pool_req *req =
		ioc_container_of(task, struct ioc_pool_req, task);

	req->state = REQ_IDLE;
	req->done(req->opaque, req->ret);
}

void ioc_pool_submit(struct ioc_pool *pool, struct ioc_pool_req *req,
		     ioc_pool_fn *fn, void *arg,
		     ioc_pool_done_cb *done, void *opaque)
{
	struct ioc_loop *loop = ioc_loop_current();
	struct ioc_pool_port *port = NULL;

	assert(loop && "ioc_pool_submit needs a current loop");
	req->fn = fn;
	req->arg = arg;
	req->done = done;
	req->opaque = opaque;
	req->loop = loop;
	req->next = req->prev = NULL;
	req->ret = 0;
	if (!pool)
		pool = ioc_pool_for_loop(loop);
	if (pool)
		port = port_get(pool, loop);
	if (!port) {
		req->port = NULL;
		req->state = REQ_DONE;
		req->ret = -ENOMEM;
		req->task.fn = nomem_task;
		ioc_loop_post(loop, &req->task);
		return;
	}
	req->port = port;
	req->task.fn = req_done_task;
	req->state = REQ_PENDING;
	req->prev = port->pend_tail;
	if (port->pend_tail)
		port->pend_tail->next = req;
	else
		port->pend_head = req;
	port->pend_tail = req;
	port->npend++;
	/* Single writer (this loop thread); atomic for get_stats. */
	atomic_store_explicit(&port->submitted,
		atomic_load_explicit(&port->submitted, memory_order_relaxed) + 1,
		memory_order_relaxed);

	if (pool->flags & IOC_POOL_NO_SUBMIT_BATCH) {
		port_flush(port);
		return;
	}
	/* Inside a completion batch the batch flushes at its end; otherwise
	 * once per loop iteration through the flush task.  LIVE_FLUSH is set
	 * and cleared only on this thread, except by pool_destroy(). */
	if (!port->in_dispatch && !port->flush_posted) {
		port->flush_posted = true;
		if (port->flush_bh) {
			ioc_bh_schedule(port->flush_bh);
			return;
		}
		/* Pairs with the fetch_and in port_flush_task(). */
		atomic_fetch_or_explicit(&port->live, LIVE_FLUSH,
					 memory_order_relaxed);
		ioc_loop_post(loop, &port->flush_task);
	}
}

int ioc_pool_cancel(struct ioc_pool *pool, struct ioc_pool_req *req)
{
	struct ioc_pool_port *port = req->port;

	if (!port)
		return -EBUSY;
	pool = port->pool;
	pthread_mutex_lock(&pool->lock);
	if (req->state == REQ_PENDING) {
		/* Still on the port's list; this is its loop thread. */
		if (req->prev)
			req->prev->next = req->next;
		else
			port->pend_head = req->next;
		if (req->next)
			req->next->prev = req->prev;
		else
			port->pend_tail = req->prev;
		port->npend--;
	} else if (req->state == REQ_QUEUED) {
		queue_unlink(pool, req);
	} else {
		pthread_mutex_unlock(&pool->lock);
		return -EBUSY;
	}
	req->state = REQ_DONE;
	req->next = req->prev = NULL;
	pool->cancelled++;
	pthread_mutex_unlock(&pool->lock);
	req->ret = -ECANCELED;
	port_push_done(port, req, true);
	return 0;
}

/* ---- coroutine form --------------------------------------------------- */

static void co_run_done(void *opaque, int64_t ret)
{
	ioc_co_await_done(opaque, ret);
}

int64_t ioc_coroutine_fn ioc_pool_co_run(struct ioc_pool *pool,
					 ioc_pool_fn *fn, void *arg)
{
	struct ioc_pool_req req;
	struct ioc_co_await aw;

	ioc_co_await_init(&aw);
	ioc_pool_submit(pool, &req, fn, arg, co_run_done, &aw);
	return ioc_co_await(&aw);
}

/* ---- life cycle ------------------------------------------------------- */

static void pool_destroy(struct ioc_pool *pool, struct ioc_loop *dying);

static int pool_create(struct ioc_pool **out, const struct ioc_pool_opts *opts,
		       struct ioc_loop *home)
{
	struct ioc_pool_opts o = opts ? *opts : (struct ioc_pool_opts){ 0 };
	pthread_condattr_t ca;
	struct ioc_pool *pool;
	long ncpu;
	int rc;

	if (!o.max_threads)
		o.max_threads = DEFAULT_MAX_THREADS;
	if (o.min_threads > o.max_threads)
		return -EINVAL;
	if (!o.idle_timeout_ms)
		o.idle_timeout_ms = DEFAULT_IDLE_TIMEOUT_MS;
	if (!o.spin_max_ns)
		o.spin_max_ns = DEFAULT_SPIN_MAX_NS;
	if (o.spin_max_ns < 0)
		o.spin_max_ns = 0;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	if (!o.max_spinners)
		o.max_spinners = ncpu > 2 ? (unsigned)ncpu - 1 : 1;
	if (!o.spawn_delay_ns)
		o.spawn_delay_ns = DEFAULT_SPAWN_DELAY_NS;

	if (posix_memalign((void **)&pool, IOC_CACHELINE, sizeof(*pool)))
		return -ENOMEM;
	memset(pool, 0, sizeof(*pool));
	rc = -pthread_mutex_init(&pool->lock, NULL);
	if (rc)
		goto fail_free;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = -pthread_cond_init(&pool->request_cond, &ca);
	pthread_condattr_destroy(&ca);
	if (rc)
		goto fail_mutex;
	rc = -pthread_cond_init(&pool->worker_stopped, NULL);
	if (rc)
		goto fail_cond;
	pool->min_threads = o.min_threads;
	pool->max_threads = o.max_threads;
	pool->idle_timeout_ns = (int64_t)o.idle_timeout_ms * 1000000;
	pool->spin_max_ns = o.spin_max_ns;
	pool->max_spinners = o.max_spinners;
	pool->ncpu = (unsigned)ncpu;
	/* Negative delay: QEMU's rule, a thread whenever none is idle. */
	pool->eager_threads = o.spawn_delay_ns < 0 ? UINT_MAX : (unsigned)ncpu;
	pool->spawn_delay_ns = o.spawn_delay_ns < 0 ? 0 : o.spawn_delay_ns;
	pool->flags = o.flags;
	snprintf(pool->name, sizeof(pool->name), "%s", o.name ? o.name : "ioc-pool");
	pool->id = atomic_fetch_add_explicit(&pool_ids, 1, memory_order_relaxed);
	atomic_init(&pool->q_visible, 0);
	if (home) {
		pool->home_port = port_new(pool, home, true);
		if (!pool->home_port) {
			rc = -ENOMEM;
			goto fail_cond2;
		}
		pool->home_loop = home;
		pool->ports = pool->home_port;
	}
	/* Start the min threads now so they are warm. */
	if (pool->min_threads) {
		rc = ioc_pool_set_limits(pool, pool->min_threads,
					 pool->max_threads);
		if (rc < 0) {
			pool_destroy(pool, home);
			return rc;
		}
	}
	*out = pool;
	return 0;

fail_cond2:
	pthread_cond_destroy(&pool->worker_stopped);
fail_cond:
	pthread_cond_destroy(&pool->request_cond);
fail_mutex:
	pthread_mutex_destroy(&pool->lock);
fail_free:
	free(pool);
	return rc;
}

int ioc_pool_new(struct ioc_pool **out, const struct ioc_pool_opts *opts)
{
	return pool_create(out, opts, NULL);
}

/*
 * Shut down.  dying is the loop being freed with this pool (its posted
 * tasks will never run), or NULL.
 */
static void pool_destroy(struct ioc_pool *pool, struct ioc_loop *dying)
{
	struct ioc_pool_req *queued;
	struct ioc_pool_port *port, *next;
	bool again;

	pthread_mutex_lock(&pool->lock);
	pool->stopping = true;
	pool->cancelled += pool->q_len;
	queued = queue_take_all(pool);
	pthread_cond_broadcast(&pool->request_cond);
	/* Running jobs finish; every worker exits and says so. */
	while (pool->nthreads > 0)
		pthread_cond_wait(&pool->worker_stopped, &pool->lock);
	pthread_mutex_unlock(&pool->lock);
	reap_zombies(pool);

	complete_list(queued, -ECANCELED, false);
	/* Not yet handed over: cancelled.  Callbacks may submit again; those
	 * land on the pending lists and are cancelled on the next round. */
	do {
		again = false;
		for (port = pool->ports; port; port = port->next) {
			struct ioc_pool_req *pend = port->pend_head;

			assert(!port->in_dispatch);
			port->pend_head = port->pend_tail = NULL;
			pool->cancelled += port->npend;
			port->npend = 0;
			for (struct ioc_pool_req *r = pend; r; r = r->next)
				r->state = REQ_DONE;
			complete_list(pend, -ECANCELED, false);
			if (port_dispatch(port))
				again = true;
		}
	} while (again);

	for (port = pool->ports; port; port = next) {
		unsigned was;

		next = port->next;
		/* A timer can be cancelled on its own loop's thread only;
		 * elsewhere the port is orphaned and the timer frees it. */
		if ((port->loop == dying || port->loop == ioc_loop_current()) &&
		    ioc_timer_pending(&port->spawn_timer)) {
			ioc_timer_cancel(&port->spawn_timer);
			/* Pairs with the fetch_or in port_arm_spawn_timer(). */
			atomic_fetch_and_explicit(&port->live, ~(unsigned)LIVE_TIMER,
						  memory_order_relaxed);
		}
		if (port->loop == dying) {
			/* Pending BHs are cancelled and freed with the loop;
			 * the tasks of a port without BHs may still be on the
			 * loop's incoming stack, which ioc_loop_free() reads
			 * after us: such a port is kept (a leak, only when a
			 * dying loop still had requests of a shared pool). */
			if (port->done_bh) {
				ioc_bh_delete(port->done_bh);
				ioc_bh_delete(port->flush_bh);
				free(port);
				continue;
			}
		}
		assert(!port->done_bh);
		/* Pairs with the fetch_and in the two port tasks. */
		was = atomic_fetch_and_explicit(&port->live, ~(unsigned)LIVE_POOL,
						memory_order_acq_rel);
		port_free_if_orphan(port, was, LIVE_POOL);
	}
	if (tl_port.pool == pool)
		tl_port.pool = NULL;
	pthread_cond_destroy(&pool->worker_stopped);
	pthread_cond_destroy(&pool->request_cond);
	pthread_mutex_destroy(&pool->lock);
	free(pool);
}

void ioc_pool_free(struct ioc_pool *pool)
{
	if (!pool)
		return;
	assert(!pool->home_loop && "a loop's own pool is freed with the loop");
	pool_destroy(pool, NULL);
}

static void pool_free_with_loop(void *ptr)
{
	struct ioc_pool *pool = ptr;

	pool_destroy(pool, pool->home_loop);
}

struct ioc_pool *ioc_pool_for_loop(struct ioc_loop *loop)
{
	struct ioc_pool *pool = ioc_loop_get_ext(loop, IOC_LOOP_EXT_POOL);

	if (pool)
		return pool;
	if (pool_create(&pool, NULL, loop) < 0)
		return NULL;
	ioc_loop_set_ext(loop, IOC_LOOP_EXT_POOL, pool, pool_free_with_loop);
	return pool;
}

int ioc_pool_set_limits(struct ioc_pool *pool, unsigned min_threads,
			unsigned max_threads)
{
	unsigned start = 0;
	int rc = 0;

	if (max_threads == 0 || min_threads > max_threads)
		return -EINVAL;
	pthread_mutex_lock(&pool->lock);
	pool->min_threads = min_threads;
	pool->max_threads = max_threads;
	if (pool->nthreads > max_threads)
		/* Sleepers re-check nthreads > max and exit; busy workers
		 * exit after their job. */
		pthread_cond_broadcast(&pool->request_cond);
	if (!pool->stopping && pool->nthreads < min_threads) {
		start = min_threads - pool->nthreads;
		pool->nthreads += start;
		pool->nstarting += start;
	}
	pthread_mutex_unlock(&pool->lock);
	while (start--) {
		int r = spawn_worker(pool);

		if (r < 0 && !rc)
			rc = r;
	}
	reap_zombies(pool);
	return rc;
}

void ioc_pool_get_stats(struct ioc_pool *pool, struct ioc_pool_stats *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&pool->lock);
	st->threads = pool->nthreads;
	st->idle_threads = pool->nsleeping + pool->nspinning;
	st->cancelled = pool->cancelled;
	st->worker_wakeups = pool->wakeups;
	st->lag_yields = pool->lag_yields;
	for (struct ioc_pool_port *p = pool->ports; p; p = p->next) {
		/* Pairs with the single-writer stores in port_dispatch(). */
		st->submitted += atomic_load_explicit(&p->submitted,
						      memory_order_relaxed);
		st->completed += atomic_load_explicit(&p->completed,
						      memory_order_relaxed);
		st->completion_batches += atomic_load_explicit(&p->batches,
						memory_order_relaxed);
	}
	pthread_mutex_unlock(&pool->lock);
}
