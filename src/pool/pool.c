/*
 * Thread pool: blocking calls on workers, results on the submitting loop.
 *
 * Problem: of the blocking calls (preadv without io_uring, fsync, getaddrinfo)
 * a page-cache read costs about one lock or wakeup: the pool's overhead rules.
 *
 * - One queue per pool: a list of embedded requests under pool->lock (O(1)
 *   cancel); workers wait on request_cond with the queue as the predicate.
 * - A port (struct ioc_pool_port) per (pool, loop) carries both ways.
 *   Submissions gather on a loop-private list, flushed per loop iteration
 *   or completion batch (one lock trip, at most one signal); a worker taking
 *   a job while more wait than spare workers wakes the next (a wake chain).
 *   Completions go on the port's lock-free stack outside pool->lock; only a
 *   push finding it empty kicks the loop (a BH for its own pool, droppable
 *   by ioc_loop_free(); else an embedded ioc_loop_post() task), which takes
 *   it by one exchange and runs it in submission order.
 * - Idle workers spin before sleeping: an adaptive budget (<= spin_max_ns),
 *   at most max_spinners, only while a CPU is spare (running workers +
 *   spinners + the loop's thread < CPUs), reading only q_visible, yielding
 *   every 32 pauses for a loop thread queued behind.  Submitters count
 *   spinning, signalled and starting workers as spare before signalling.
 * - Lag yield: its completion uncollected, with <= 2 jobs per thread left, a
 *   worker yields once: the loop likely waits for its CPU (else all sleep).
 * - Threads: min..max, "<name>-<n>", signals blocked; one per CPU starts as
 *   soon as jobs wait uncovered, then a per-port timer adds one per
 *   spawn_delay_ns if the oldest job waited it out while workers started
 *   under 8 jobs each (jobs that block); idle ones above min exit after
 *   idle_timeout.  Ablations: pool-int.h, measured in bench/pool/NOTES.md.
 *
 * Rejected: a semaphore of queued jobs (QEMU's older pool: one more mutex
 * and condvar, a count cancel must keep in step); per-worker round-robin
 * queues (a blocking call strands the jobs behind it); a lock-free MPMC
 * queue (it must be the condvar's predicate and cancel in O(1), and the lock
 * is taken once per batch anyway); holding completions back (a worker that
 * defers the kick, then blocks, strands them); QEMU's spawn rule, a thread
 * whenever none is idle (on few CPUs they only contend).  Costs: a spinner
 * burns a CPU up to spin_max_ns per idle spell; submissions wait for their
 * loop iteration's end, growth past a thread per CPU for the loop's timer.
 * Port lifetime: the LIVE_* bits; ioc_loop_free() detaches its loop's ports.
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
#include "pool-int.h"
#include "util/list.h"

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

/* port->live bits: who still references a port whose pool may be gone;
 * whoever clears the last one frees it.  ioc_loop_free() detaches its
 * loop's ports (port_leave_loop()), so a loop at a recycled address never
 * finds an old port.  The caller orders the frees of a pool and of a loop
 * that used it (pool.h). */
enum {
	LIVE_POOL = 1u << 0,  /* the pool exists */
	LIVE_DONE = 1u << 1,  /* done_task is posted and has not started */
	LIVE_FLUSH = 1u << 2, /* flush_task is posted and has not started */
	LIVE_TIMER = 1u << 3, /* spawn_timer is armed */
	LIVE_LOOP = 1u << 4,  /* on its loop's IOC_LOOP_EXT_POOL_PORTS list */
};

struct ioc_pool_port {
	/* Loop-thread side. */
	struct ioc_pool *pool;
	struct ioc_loop *loop;
	struct ioc_pool_port *next;  /* pool->ports, under pool->lock */
	struct ioc_pool_port *loop_next; /* the loop's list (shared pools) */
	uint64_t pool_id;            /* pool->id, for the loop's list */
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
	/* Counters of ports detached by their loops' ioc_loop_free(). */
	uint64_t gone_submitted, gone_completed, gone_batches;

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
	uint32_t ablation;             /* IOC__POOL_* (pool-int.h) */
	char name[11];
};

/* pool->id tells a new pool at a recycled address from an old one whose
 * port is still on a loop's list. */
static atomic_uint_fast64_t pool_ids = 1;

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

/* Take req off a list linked through next/prev: the queue, or a port's
 * pending list. */
static void req_unlink(struct ioc_pool_req **head, struct ioc_pool_req **tail,
		       struct ioc_pool_req *req)
{
	IOC__LIST_UNLINK(*head, req, prev, next);
	if (!req->next)
		*tail = req->prev;
}

static void queue_unlink(struct ioc_pool *pool, struct ioc_pool_req *req)
{
	req_unlink(&pool->q_head, &pool->q_tail, req);
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
	IOC__FIFO_APPEND(pool->q_head, pool->q_tail, first, last, next);
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
	if (pool->ablation & IOC__POOL_WAKE_ALWAYS)
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
 * needed (workers push outside it, so their next critical section stays
 * short).  post false is for pool_destroy(), which drains the stacks itself.
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

	if (port->pool->ablation & IOC__POOL_NO_COMPLETE_BATCH && post) {
		ioc_loop_post(port->loop, &req->task);
		return false;
	}
	old = atomic_load_explicit(&port->done_head, memory_order_relaxed);
	do {
		req->next = old;
		/* Release: publishes req->ret and req->next.  Acquire: when
		 * old is NULL we read the exchange in port_dispatch(), and the
		 * loop's use of done_task (its links) must come before our
		 * posting it again.  Pairs with that acq_rel exchange.  On
		 * x86-64 the CAS is a full barrier whatever the order says; on
		 * a weakly ordered CPU such as AArch64, without the release
		 * the loop could pop req and read its result before the
		 * worker's store of it. */
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
	 * finds the stack empty and kicks again.  On a weakly ordered CPU
	 * such as AArch64, without the acquire our reads of each req's ret
	 * and next could see values from before the worker pushed it. */
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

/* Add port's counters to the totals.  Relaxed: pairs with the
 * single-writer stores of its loop thread (ioc_pool_submit(),
 * port_dispatch()); a statistic. */
static void port_add_counts(struct ioc_pool_port *port, uint64_t *submitted,
			    uint64_t *completed, uint64_t *batches)
{
	*submitted += atomic_load_explicit(&port->submitted, memory_order_relaxed);
	*completed += atomic_load_explicit(&port->completed, memory_order_relaxed);
	*batches += atomic_load_explicit(&port->batches, memory_order_relaxed);
}

static void port_free_if_orphan(struct ioc_pool_port *port, unsigned was,
				unsigned bit)
{
	if ((was & ~bit) == 0)
		free(port);
}

/*
 * A posted task or the spawn timer starts: clear its bit in live.  False
 * when the pool is gone, and then the port is freed if that was its last
 * bit: the caller returns at once.  The fetch_and pairs with the fetch_or
 * that set bit (port_push_done() for LIVE_DONE, ioc_pool_submit() for
 * LIVE_FLUSH, port_arm_spawn_timer() for LIVE_TIMER) and with the one
 * clearing LIVE_POOL in pool_destroy().  Acq_rel matters on a weakly
 * ordered CPU such as AArch64: whoever sees the last bit cleared frees the
 * port, after everything the other side did with it.
 */
static bool port_unpost(struct ioc_pool_port *port, unsigned bit)
{
	unsigned was = atomic_fetch_and_explicit(&port->live, ~bit,
						 memory_order_acq_rel);

	if (was & LIVE_POOL)
		return true;
	port_free_if_orphan(port, was, bit);
	return false;
}

static void port_done_task(struct ioc_task *task)
{
	struct ioc_pool_port *port =
		ioc_container_of(task, struct ioc_pool_port, done_task);

	if (!port_unpost(port, LIVE_DONE))
		return;
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

/* IOC__POOL_NO_COMPLETE_BATCH: one task per completion. */
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
	if (pool->ablation & IOC__POOL_SPIN_BUSY)
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
			    !(pool->ablation & IOC__POOL_NO_LAG_YIELD)) {
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
	 * shrank, pass it on: else the job waits for some later wakeup. */
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

/*
 * port leaves its loop's list, because the loop is being freed or because
 * port's pool is gone.  In ioc_loop_free() or on the loop's thread, so the
 * timer may be cancelled here.  A live pool is not being freed meanwhile
 * (the caller orders the frees, pool.h), so its lock may be taken.
 */
static void port_leave_loop(struct ioc_pool_port *port)
{
	unsigned drop = LIVE_LOOP;
	unsigned was;

	if (ioc_timer_pending(&port->spawn_timer)) {
		ioc_timer_cancel(&port->spawn_timer);
		drop |= LIVE_TIMER;
	}
	/* Acquire: pairs with the release half of pool_destroy()'s fetch_and
	 * of LIVE_POOL, so a pool seen gone is done with the port. */
	if (atomic_load_explicit(&port->live, memory_order_acquire) & LIVE_POOL) {
		struct ioc_pool *pool = port->pool;
		struct ioc_pool_port **pp = &pool->ports;

		pthread_mutex_lock(&pool->lock);
		while (*pp != port)
			pp = &(*pp)->next;
		*pp = port->next;
		/* The counts of a port that leaves stay in the pool's. */
		port_add_counts(port, &pool->gone_submitted, &pool->gone_completed,
				&pool->gone_batches);
		pthread_mutex_unlock(&pool->lock);
		drop |= LIVE_POOL;
	}
	/* Pairs with the fetch_and in the port tasks, port_spawn_timer() and
	 * pool_destroy(): whoever clears the last bit frees the port.  A port
	 * with a task still posted had requests in flight: its loop's free
	 * drops that task and the port is leaked (a caller bug). */
	was = atomic_fetch_and_explicit(&port->live, ~drop, memory_order_acq_rel);
	if ((was & ~drop) == 0)
		free(port);
}

/* IOC_LOOP_EXT_POOL_PORTS's free_fn: ioc_loop_free() detaches its ports. */
static void loop_ports_free(void *ptr)
{
	struct ioc_pool_port *port = ptr, *next;

	for (; port; port = next) {
		next = port->loop_next;
		port_leave_loop(port);
	}
}

/*
 * The port of (pool, loop).  Loop thread.  A loop's own pool has its home
 * port; shared pools find theirs on the loop's list, matched by pool->id so
 * that a new pool at a recycled address does not take an old pool's port.
 */
static struct ioc_pool_port *port_get(struct ioc_pool *pool,
				      struct ioc_loop *loop)
{
	struct ioc_pool_port *head, *port, **pp;

	if (loop == pool->home_loop)
		return pool->home_port;
	head = ioc_loop_get_ext(loop, IOC_LOOP_EXT_POOL_PORTS);
	for (port = head; port; port = port->loop_next)
		if (port->pool == pool && port->pool_id == pool->id)
			return port;
	/* A miss (once per pool and loop): drop the ports of freed pools. */
	for (pp = &head; (port = *pp);) {
		/* Acquire: pairs with pool_destroy()'s fetch_and of LIVE_POOL. */
		if (atomic_load_explicit(&port->live, memory_order_acquire) &
		    LIVE_POOL) {
			pp = &port->loop_next;
			continue;
		}
		*pp = port->loop_next;
		port_leave_loop(port);
	}
	port = port_new(pool, loop, false);
	if (port) {
		port->pool_id = pool->id;
		/* Not yet shared: published by the unlock below. */
		atomic_store_explicit(&port->live, LIVE_POOL | LIVE_LOOP,
				      memory_order_relaxed);
		pthread_mutex_lock(&pool->lock);
		port->next = pool->ports;
		pool->ports = port;
		pthread_mutex_unlock(&pool->lock);
		port->loop_next = head;
		head = port;
	}
	ioc_loop_set_ext(loop, IOC_LOOP_EXT_POOL_PORTS, head, loop_ports_free);
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
	enum wake wk;
	bool arm, blocking;
	int64_t now;

	if (!port_unpost(port, LIVE_TIMER))
		return;
	now = ioc_now_ns();
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

	if (!port_unpost(port, LIVE_FLUSH))
		return;
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
	IOC__FIFO_APPEND(port->pend_head, port->pend_tail, req, req, next);
	port->npend++;
	/* Single writer (this loop thread); atomic for get_stats. */
	atomic_store_explicit(&port->submitted,
		atomic_load_explicit(&port->submitted, memory_order_relaxed) + 1,
		memory_order_relaxed);

	if (pool->ablation & IOC__POOL_NO_SUBMIT_BATCH) {
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
		req_unlink(&port->pend_head, &port->pend_tail, req);
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
		       uint32_t ablation, struct ioc_loop *home)
{
	struct ioc_pool_opts o = opts ? *opts : (struct ioc_pool_opts){ 0 };
	pthread_condattr_t ca;
	struct ioc_pool *pool;
	long ncpu;
	int rc;

	if (o.flags || (ablation & ~(uint32_t)IOC__POOL_ABLATION_ALL))
		return -EINVAL;
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
	pool->ablation = ablation;
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
	return pool_create(out, opts, 0, NULL);
}

int ioc__pool_new_ablated(struct ioc_pool **out,
			  const struct ioc_pool_opts *opts, uint32_t ablation)
{
	return pool_create(out, opts, ablation, NULL);
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
	if (pool_create(&pool, NULL, 0, loop) < 0)
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
	st->submitted = pool->gone_submitted;
	st->completed = pool->gone_completed;
	st->completion_batches = pool->gone_batches;
	for (struct ioc_pool_port *p = pool->ports; p; p = p->next)
		port_add_counts(p, &st->submitted, &st->completed, &st->completion_batches);
	pthread_mutex_unlock(&pool->lock);
}
