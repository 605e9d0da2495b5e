/*
 * The coroutine pool: recycled coroutines with their stacks.
 *
 * Problem: mapping a stack, its guard and a first frame costs microseconds
 * and system calls, where a request's life in a coroutine should cost far
 * less; and coroutines are often made on one thread and finish on another,
 * so a per-thread free list alone drains on one side, overflows on the other.
 *
 * Design:
 *  - Each thread keeps a private list of at most `batch` coroutines (16):
 *    create pops and terminate pushes with plain loads and stores.
 *  - A terminate that finds it full moves the whole list, as one unit, onto
 *    a global lock-free stack of batches; a create that finds it empty takes
 *    one batch.  Shared memory is touched once per `batch` operations, and
 *    after warm-up no new stack is ever mapped.
 *  - ABA: the global stacks are Treiber stacks of *indices* into descriptors
 *    allocated once and never freed, with a 32-bit generation in the top
 *    word bumped by every push and pop; a stale `next` is harmless to read.
 *  - The bound: each stack is a VMA or two, and thousands of pooled stacks
 *    can exhaust vm.max_map_count, so at most a quarter of it (capped at
 *    4096) are pooled.  Threads reserve `batch` slots of a global counter
 *    (a relaxed CAS, slow path only) before their list may hold anything,
 *    batches carry their reservation, and pooled <= reserved <= max at
 *    every instant; a terminate that cannot reserve frees the stack.
 *  - Thread exit: a key destructor pushes a full list as a batch and frees
 *    a partial one, returning the reservation.
 *
 * Rejected: one list under a mutex (a lock per operation); a global counter
 * per coroutine (an atomic RMW on every create); a pointer-based Treiber
 * stack of batches (reads `next` from a stack another thread may have
 * unmapped) or a 128-bit CAS (not everywhere without libatomic's locks).
 */
#include "co-int.h"
#include "util/list.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum {
	DEFAULT_STACK_SIZE = 1 << 20,
	DEFAULT_BATCH = 16,
	DEFAULT_CAP = 4096,
	MIN_STACK_SIZE = 16 << 10,
	MAX_BATCH = 4096,
};

struct batch_desc {
	_Atomic uint32_t next;	/* index + 1 of the next descriptor, 0 = end */
	struct ioc_co *head;	/* owned by whoever popped the descriptor */
};

struct pool_tls {
	struct ioc_co *head;
	_Atomic unsigned count;	/* owner: relaxed store; stats: relaxed load */
	unsigned cap;		/* reserved slots: 0 or batch */
	bool registered;
	bool dead;		/* after the key destructor: pool nothing */
	_Atomic uint64_t created, reused, freed; /* same discipline as count */
	struct pool_tls *reg_next, *reg_prev;
};

static struct {
	pthread_once_t once;
	pthread_mutex_t lock;	/* configuration, registry, retired counters */
	bool started;
	size_t stack_size;
	unsigned batch;
	uint64_t max_pooled;

	struct batch_desc *descs;
	uint32_t ndesc;
	pthread_key_t key;
	bool key_ok;

	struct pool_tls *threads;	/* registry, for stats */
	uint64_t retired_created, retired_reused, retired_freed;

	_Atomic uint64_t full_top IOC_CACHE_ALIGNED; /* gen << 32 | index + 1 */
	_Atomic uint64_t free_top IOC_CACHE_ALIGNED;
	_Atomic uint64_t reserved IOC_CACHE_ALIGNED;
	_Atomic uint64_t nbatches;
} g = {
	.once = PTHREAD_ONCE_INIT,
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

static IOC_TLS struct pool_tls tls_pool;

/* ---- the generation-tagged index stacks ------------------------------ */

static void istack_push(_Atomic uint64_t *top, uint32_t idx)
{
	/* Relaxed load: the CAS below re-reads. */
	uint64_t old = atomic_load_explicit(top, memory_order_relaxed);
	uint64_t new;

	do {
		atomic_store_explicit(&g.descs[idx].next, (uint32_t)old,
				      memory_order_relaxed);
		new = (((old >> 32) + 1) << 32) | (idx + 1);
		/* Release: publishes descs[idx] (head, next and the batch's
		 * coroutines) to the acquire CAS in istack_pop().  On x86-64
		 * every CAS is a full barrier anyway; on a weakly ordered CPU
		 * such as AArch64, without this release a popper could see the
		 * new top but the old `next` or stale coroutine fields. */
	} while (!atomic_compare_exchange_weak_explicit(top, &old, new,
			memory_order_release, memory_order_relaxed));
}

static bool istack_pop(_Atomic uint64_t *top, uint32_t *idx)
{
	/* Acquire pairs with the release CAS in istack_push(), so `next` of
	 * the descriptor we read is the one it pushed with.  On a weakly
	 * ordered CPU such as AArch64, without it the relaxed load of `next`
	 * below could be satisfied before this load (x86-64 never reorders
	 * two loads). */
	uint64_t old = atomic_load_explicit(top, memory_order_acquire);
	uint64_t new;
	uint32_t i1;

	do {
		i1 = (uint32_t)old;
		if (!i1)
			return false;
		/* May be stale if another thread pops i1 first; then the
		 * generation has moved and the CAS fails. */
		new = (((old >> 32) + 1) << 32) |
		      atomic_load_explicit(&g.descs[i1 - 1].next,
					   memory_order_relaxed);
		/* Acquire pairs with istack_push()'s release CAS: on success
		 * we own the batch and read its coroutines; on failure `old`
		 * is reloaded and its `next` read next.  On AArch64 a relaxed
		 * CAS would order neither; on x86-64 the CAS is a full
		 * barrier. */
	} while (!atomic_compare_exchange_weak_explicit(top, &old, new,
			memory_order_acquire, memory_order_acquire));
	*idx = i1 - 1;
	return true;
}

/* ---- reservations ------------------------------------------------------ */

/* Relaxed: the counter only bounds the pool, it publishes no data. */
static bool reserve(uint64_t n)
{
	uint64_t r = atomic_load_explicit(&g.reserved, memory_order_relaxed);

	do {
		if (r + n > g.max_pooled)
			return false;
	} while (!atomic_compare_exchange_weak_explicit(&g.reserved, &r, r + n,
			memory_order_relaxed, memory_order_relaxed));
	return true;
}

static void unreserve(uint64_t n)
{
	atomic_fetch_sub_explicit(&g.reserved, n, memory_order_relaxed);
}

/* ---- global batches ------------------------------------------------------ */

static bool batch_push(struct ioc_co *head)
{
	uint32_t idx;

	if (!istack_pop(&g.free_top, &idx))
		return false;
	g.descs[idx].head = head;
	istack_push(&g.full_top, idx);
	/* Relaxed: a statistic. */
	atomic_fetch_add_explicit(&g.nbatches, 1, memory_order_relaxed);
	return true;
}

static struct ioc_co *batch_pop(void)
{
	struct ioc_co *head;
	uint32_t idx;

	if (!istack_pop(&g.full_top, &idx))
		return NULL;
	head = g.descs[idx].head;
	g.descs[idx].head = NULL;
	istack_push(&g.free_top, idx);
	atomic_fetch_sub_explicit(&g.nbatches, 1, memory_order_relaxed);
	return head;
}

/* ---- setup ----------------------------------------------------------------- */

static uint64_t map_count_limit(void)
{
	unsigned long mmc = 65530;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "re");

	if (f) {
		if (fscanf(f, "%lu", &mmc) != 1)
			mmc = 65530;
		fclose(f);
	}
	return mmc / 4 / ioc__co_stack_vmas();
}

static void thread_exit(void *arg);

static void pool_init(void)
{
	uint64_t limit = map_count_limit();

	pthread_mutex_lock(&g.lock);
	g.started = true;
	if (!g.stack_size)
		g.stack_size = DEFAULT_STACK_SIZE;
	if (!g.batch)
		g.batch = DEFAULT_BATCH;
	if (!g.max_pooled)
		g.max_pooled = DEFAULT_CAP;
	if (g.max_pooled > limit)
		g.max_pooled = limit;
	g.max_pooled -= g.max_pooled % g.batch;
	g.ndesc = (uint32_t)(g.max_pooled / g.batch);
	if (g.ndesc) {
		g.descs = calloc(g.ndesc, sizeof(*g.descs));
		if (!g.descs) {
			g.ndesc = 0;
			g.max_pooled = 0;
		}
	}
	for (uint32_t i = 0; i < g.ndesc; i++)
		istack_push(&g.free_top, i);
	g.key_ok = pthread_key_create(&g.key, thread_exit) == 0;
	if (!g.key_ok)
		g.max_pooled = 0;	/* cannot return pools at thread exit */
	pthread_mutex_unlock(&g.lock);
}

static void ensure_init(void)
{
	pthread_once(&g.once, pool_init);
}

int ioc_co_pool_configure(const struct ioc_co_pool_opts *opts)
{
	int ret = 0;

	if (!opts || (opts->stack_size && opts->stack_size < MIN_STACK_SIZE) ||
	    opts->batch_size > MAX_BATCH)
		return -EINVAL;
	pthread_mutex_lock(&g.lock);
	if (g.started) {
		ret = -EBUSY;
	} else {
		g.stack_size = opts->stack_size;
		g.batch = opts->batch_size;
		g.max_pooled = opts->max_pooled;
	}
	pthread_mutex_unlock(&g.lock);
	return ret;
}

static void count_add(_Atomic uint64_t *c, uint64_t n)
{
	/* Owner-only counter: a relaxed load and store, no RMW.  Pairs with
	 * the relaxed loads in ioc_co_pool_get_stats(). */
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

static void register_thread(struct pool_tls *p)
{
	if (p->registered || p->dead)
		return;
	ensure_init();
	pthread_mutex_lock(&g.lock);
	IOC__LIST_PUSH(g.threads, p, reg_prev, reg_next);
	pthread_mutex_unlock(&g.lock);
	p->registered = true;
	if (g.key_ok)
		pthread_setspecific(g.key, p);
}

static void free_co(struct pool_tls *p, struct ioc_co *co)
{
	ioc__co_fini_context(co);
	ioc__co_stack_free(co);
	count_add(&p->freed, 1);
}

static void thread_exit(void *arg)
{
	struct pool_tls *p = arg;
	unsigned n = atomic_load_explicit(&p->count, memory_order_relaxed);

	if (n && n == g.batch && batch_push(p->head)) {
		/* The reservation travels with the batch. */
	} else {
		struct ioc_co *co = p->head, *next;

		for (; co; co = next) {
			next = co->pool_next;
			free_co(p, co);
		}
		if (p->cap)
			unreserve(p->cap);
	}
	p->head = NULL;
	p->cap = 0;
	atomic_store_explicit(&p->count, 0, memory_order_relaxed);
	p->dead = true;

	pthread_mutex_lock(&g.lock);
	g.retired_created += atomic_load_explicit(&p->created, memory_order_relaxed);
	g.retired_reused += atomic_load_explicit(&p->reused, memory_order_relaxed);
	g.retired_freed += atomic_load_explicit(&p->freed, memory_order_relaxed);
	atomic_store_explicit(&p->created, 0, memory_order_relaxed);
	atomic_store_explicit(&p->reused, 0, memory_order_relaxed);
	atomic_store_explicit(&p->freed, 0, memory_order_relaxed);
	IOC__LIST_UNLINK(g.threads, p, reg_prev, reg_next);
	p->registered = false;
	pthread_mutex_unlock(&g.lock);
}

/* ---- create / terminate ---------------------------------------------------- */

static struct ioc_co *pool_get_slow(struct pool_tls *p)
{
	struct ioc_co *co;

	register_thread(p);
	if (!p->dead && (co = batch_pop())) {
		/* The batch brings its reservation; drop ours if we had one. */
		if (p->cap)
			unreserve(p->cap);
		p->cap = g.batch;
		p->head = co->pool_next;
		atomic_store_explicit(&p->count, g.batch - 1, memory_order_relaxed);
		count_add(&p->reused, 1);
		co->terminated = false;
		return co;
	}
	ensure_init();
	co = ioc__co_stack_alloc(g.stack_size);
	if (!co)
		return NULL;
	ioc__co_init_context(co);
	count_add(&p->created, 1);
	return co;
}

struct ioc_co *ioc__co_pool_get(void)
{
	struct pool_tls *p = &tls_pool;
	struct ioc_co *co = p->head;

	if (ioc_likely(co)) {
		p->head = co->pool_next;
		atomic_store_explicit(&p->count,
			atomic_load_explicit(&p->count, memory_order_relaxed) - 1,
			memory_order_relaxed);
		count_add(&p->reused, 1);
		co->terminated = false;
		return co;
	}
	return pool_get_slow(p);
}

static void pool_put_slow(struct pool_tls *p, struct ioc_co *co)
{
	register_thread(p);
	if (p->dead)
		goto free;
	if (p->cap && p->head) {
		/* Local list full: it becomes a global batch. */
		if (!batch_push(p->head))
			goto free;	/* unreachable while reserved <= bound */
		p->head = NULL;
		p->cap = 0;
		atomic_store_explicit(&p->count, 0, memory_order_relaxed);
	}
	if (!p->cap) {
		if (!reserve(g.batch))
			goto free;
		p->cap = g.batch;
	}
	co->pool_next = p->head;
	p->head = co;
	atomic_store_explicit(&p->count,
		atomic_load_explicit(&p->count, memory_order_relaxed) + 1,
		memory_order_relaxed);
	return;
free:
	free_co(p, co);
}

void ioc__co_pool_put(struct ioc_co *co)
{
	struct pool_tls *p = &tls_pool;
	unsigned n = atomic_load_explicit(&p->count, memory_order_relaxed);

	if (ioc_likely(n < p->cap)) {
		co->pool_next = p->head;
		p->head = co;
		atomic_store_explicit(&p->count, n + 1, memory_order_relaxed);
		return;
	}
	pool_put_slow(p, co);
}

/* ---- stats --------------------------------------------------------------- */

void ioc_co_pool_get_stats(struct ioc_co_pool_stats *st)
{
	uint64_t pooled = 0;

	pthread_mutex_lock(&g.lock);
	if (!g.started) {
		/* Nothing created yet; do not fix the configuration. */
		pthread_mutex_unlock(&g.lock);
		*st = (struct ioc_co_pool_stats){ 0 };
		return;
	}
	st->created = g.retired_created;
	st->reused = g.retired_reused;
	st->freed = g.retired_freed;
	for (struct pool_tls *p = g.threads; p; p = p->reg_next) {
		/* Relaxed loads pair with the owner's relaxed stores
		 * (count_add() and the list-length updates). */
		st->created += atomic_load_explicit(&p->created, memory_order_relaxed);
		st->reused += atomic_load_explicit(&p->reused, memory_order_relaxed);
		st->freed += atomic_load_explicit(&p->freed, memory_order_relaxed);
		pooled += atomic_load_explicit(&p->count, memory_order_relaxed);
	}
	pthread_mutex_unlock(&g.lock);
	pooled += atomic_load_explicit(&g.nbatches, memory_order_relaxed) * g.batch;
	st->pooled = pooled;
	st->max_pooled = g.max_pooled;
	st->reserved = atomic_load_explicit(&g.reserved, memory_order_relaxed);
}
