/*
 * iocore lockless rings: bounded, power-of-two FIFOs of pointers or of
 * fixed-size elements, in SPSC, MPSC and MPMC regimes.
 *
 * The regime is part of every function name; each side of a ring (push,
 * pop) is used in one regime for the ring's whole life: the single-thread
 * paths do not maintain the head index the multi-thread paths reserve on.
 * A ring is created either for pointers (ioc_ring_new) or for elements of a
 * fixed size (ioc_ring_new_elem); use only the matching family:
 *
 *                  single                 burst (up to n, returns count)
 *   pointers       ioc_ring_push_spsc     ioc_ring_push_burst_spsc
 *                  ioc_ring_pop_spsc      ioc_ring_pop_burst_spsc
 *   elements       ioc_ring_push_elem_spsc ioc_ring_push_elem_burst_spsc
 *                  ioc_ring_pop_elem_spsc ioc_ring_pop_elem_burst_spsc
 * and the same with _mpsc and _mpmc.  The push side of _spsc is "single
 * producer", the pop side of _mpsc is "single consumer", and so on.
 *
 * Layout: the producer side (head, tail, cached consumer limit) and the
 * consumer side (head, tail, cached producer limit) each sit on their own
 * IOC_CACHELINE-aligned line, with private copies of the ring geometry, and
 * the slots start on a further line.  Indices are free-running uint32_t
 * masked by size - 1.  Each side keeps a cached bound derived from the
 * other side's index and only reads the shared one when the cache says the
 * ring is full (empty), so in steady state each side touches the other
 * side's line about once per lap, not once per element.  With several
 * producers (consumers) the cache is shared by them and only ever lags:
 * a lagging bound is conservative, it just causes an extra refresh.
 *
 * Progress guarantees (each function's comment repeats its own):
 *   - single-producer push, single-consumer pop: wait-free (bounded steps,
 *     no loops that depend on other threads).
 *   - multi-producer push: a CAS loop reserves slots (lock-free), then the
 *     producer waits until earlier reservations are published before it
 *     publishes its own.  So it is NOT lock-free: a producer preempted
 *     between reservation and publication stalls later producers' publication
 *     (never their reservation) until it runs again.  Same as DPDK's default
 *     rte_ring mode and ck_ring's MP enqueue.  The wait spins with a pause
 *     and yields the CPU now and then (oversubscribed machines).
 *   - multi-consumer pop of pointers: lock-free.  The consumer reads the
 *     slots, then claims them with one CAS on the consumer index; a failed
 *     CAS means another consumer made progress.
 *   - multi-consumer pop of elements: reserve with a CAS, copy, then wait for
 *     earlier consumers to release their slots (blocking like MP push):
 *     copying arbitrary bytes out of a slot a producer might be rewriting
 *     would be a data race, pointers are read with atomic loads instead.
 *
 * Memory ordering: a producer's slot writes are published by the release
 * store of prod.tail and seen by the consumer's acquire load of prod.tail;
 * a consumer's slot reads are finished before the release store (or CAS) of
 * cons.tail, which the producer reads with acquire before reusing a slot.
 * A bound cached by one of several producers (consumers) is stored with
 * release after its refresher's acquire of the other side's tail, and read
 * with acquire, so a thread using someone else's bound inherits that
 * happens-before edge.
 *
 * On x86-64 (TSO) every one of these acquires and releases compiles to a
 * plain load or store and only stops the compiler: the CPU keeps stores in
 * order and never moves a store before an earlier load.  On a weakly
 * ordered CPU such as AArch64 they become ldar/stlr (or barriers) and are
 * what keeps a consumer from reading a slot before it is written and a
 * producer from overwriting one still being read; each is commented with
 * what goes wrong there without it.  make check-aarch64 runs the stress
 * tests for AArch64 under qemu-aarch64; qemu runs the guest's threads on
 * the host's stronger order, so that proves the code generated for AArch64
 * works, not that every barrier is needed: the comments carry that.
 *
 * All functions are safe from any thread within their regime; none
 * allocates, none sleeps (MP/MC waits may sched_yield()).
 */
#ifndef IOCORE_RING_H
#define IOCORE_RING_H

#include <stdatomic.h>
#include <string.h>

#include "iocore/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest ring: indices are 32-bit and the distance head - tail must fit. */
#define IOC_RING_MAX_SIZE (1u << 30)

/* One side of the ring; written only by that side's threads. */
struct ioc_ring_side {
	_Atomic uint32_t head;  /* next position to reserve (MP/MC only) */
	_Atomic uint32_t tail;  /* positions below are published/released */
	/* Cached bound derived from the other side's tail (producers: the
	 * consumer tail + size; consumers: the producer tail).  A single
	 * side reads and writes it relaxed; a multi side with acquire and
	 * release, so that whoever uses a bound another thread refreshed
	 * also inherits that thread's acquire of the other side's tail. */
	_Atomic uint32_t limit;
	uint32_t mask;          /* size - 1; private copy of the geometry */
	uint32_t esize;         /* element size in bytes */
};

struct ioc_ring {
	/* Producers write this line, consumers only read tail. */
	struct ioc_ring_side prod IOC_CACHE_ALIGNED;
	/* Consumers write this line, producers only read tail. */
	struct ioc_ring_side cons IOC_CACHE_ALIGNED;
	/* size * esize bytes of slots, on their own lines. */
	unsigned char slots[] IOC_CACHE_ALIGNED;
};

/*
 * Create a ring of size slots (a power of two, 2..IOC_RING_MAX_SIZE) of
 * pointers, or of esize-byte elements (esize 1..65536).  Returns 0,
 * -EINVAL or -ENOMEM.
 */
int ioc_ring_new(struct ioc_ring **out, uint32_t size);
int ioc_ring_new_elem(struct ioc_ring **out, uint32_t size, uint32_t esize);
void ioc_ring_free(struct ioc_ring *r);
/* For rings in caller memory: bytes needed (0 if the geometry is invalid);
 * init on IOC_CACHELINE-aligned memory of that many bytes. */
size_t ioc_ring_memsize(uint32_t size, uint32_t esize);
int ioc_ring_init(struct ioc_ring *r, uint32_t size, uint32_t esize);

/* Slow path of the MP/MC publication wait (src/ring/ring.c). */
void ioc__ring_wait_turn(_Atomic uint32_t *idx, uint32_t want);

static inline void ioc_ring_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline uint32_t ioc_ring_capacity(const struct ioc_ring *r)
{
	return r->prod.mask + 1;
}

/* Elements in the ring: exact when both sides are quiescent, a snapshot
 * otherwise.  Any thread. */
static inline uint32_t ioc_ring_count(struct ioc_ring *r)
{
	/* Relaxed: a statistic, orders nothing. */
	uint32_t c = atomic_load_explicit(&r->cons.tail, memory_order_relaxed);
	uint32_t p = atomic_load_explicit(&r->prod.tail, memory_order_relaxed);
	uint32_t n = p - c;

	return n > r->prod.mask + 1 ? 0 : n;
}

static inline bool ioc_ring_empty(struct ioc_ring *r)
{
	return ioc_ring_count(r) == 0;
}

static inline _Atomic(uintptr_t) *ioc__ring_ptrs(struct ioc_ring *r)
{
	return (_Atomic(uintptr_t) *)(void *)r->slots;
}

/* ---- producer side ---------------------------------------------------- */

/* Single producer: up to n free positions starting at *headp. */
static inline uint32_t ioc__ring_sp_reserve(struct ioc_ring *r, uint32_t n,
					    uint32_t *headp)
{
	/* Relaxed: only this producer writes prod.tail. */
	uint32_t head = atomic_load_explicit(&r->prod.tail, memory_order_relaxed);
	/* Relaxed: only this producer uses prod.limit. */
	uint32_t limit = atomic_load_explicit(&r->prod.limit, memory_order_relaxed);
	uint32_t room = limit - head;

	if (ioc_unlikely(room < n)) {
		/* Acquire pairs with the release store (or release CAS) of
		 * cons.tail in the consumer's pop: its reads of the slots we
		 * are about to overwrite are done.  On a weakly ordered CPU
		 * such as AArch64, without this acquire our slot writes could
		 * land before the consumer's reads of the last lap. */
		limit = atomic_load_explicit(&r->cons.tail, memory_order_acquire) +
			r->prod.mask + 1;
		atomic_store_explicit(&r->prod.limit, limit, memory_order_relaxed);
		room = limit - head;
		if (room < n)
			n = room;
	}
	*headp = head;
	return n;
}

static inline void ioc__ring_sp_publish(struct ioc_ring *r, uint32_t head,
					uint32_t n)
{
	/* Release pairs with the acquire load of prod.tail in the pops:
	 * publishes the slot writes above.  On a weakly ordered CPU such as
	 * AArch64, without this release the new tail could be visible before
	 * the slot writes and a consumer would read stale slots. */
	atomic_store_explicit(&r->prod.tail, head + n, memory_order_release);
}

/* Multi producer: claim up to n positions with a CAS on prod.head. */
static inline uint32_t ioc__ring_mp_reserve(struct ioc_ring *r, uint32_t n,
					    uint32_t *headp)
{
	uint32_t head = atomic_load_explicit(&r->prod.head, memory_order_relaxed);
	uint32_t size = r->prod.mask + 1;
	for (;;) {
		uint32_t want;
		/* Acquire pairs with the release store below by whichever
		 * producer last refreshed the bound.  On a weakly ordered CPU
		 * such as AArch64, without it our slot writes are not ordered
		 * after the consumers' reads that the refresher saw finish. */
		uint32_t limit = atomic_load_explicit(&r->prod.limit,
						      memory_order_acquire);
		/* Signed: a lagging bound may be below head. */
		int32_t room = (int32_t)(limit - head);

		if (ioc_unlikely(room < (int32_t)n)) {
			/* Acquire pairs with the consumers' release of
			 * cons.tail, as in the single-producer reserve. */
			limit = atomic_load_explicit(&r->cons.tail,
						     memory_order_acquire) + size;
			/* Release: hands our acquire on to the producers
			 * that use this bound (pairs with the load above;
			 * on AArch64 a relaxed store would hand on the value
			 * without the ordering).  A racing refresh may store
			 * an older bound: that only lags, which is safe. */
			atomic_store_explicit(&r->prod.limit, limit,
					      memory_order_release);
			room = (int32_t)(limit - head);
		}
		want = room <= 0 ? 0 : (uint32_t)room < n ? (uint32_t)room : n;
		if (want == 0)
			return 0;
		/* Relaxed CAS: it only hands out positions; the slot ordering
		 * comes from the acquire above and the publish below.  On
		 * failure head is reloaded and room recomputed. */
		if (ioc_likely(atomic_compare_exchange_weak_explicit(
			    &r->prod.head, &head, head + want,
			    memory_order_relaxed, memory_order_relaxed))) {
			*headp = head;
			return want;
		}
	}
}

static inline void ioc__ring_mp_publish(struct ioc_ring *r, uint32_t head,
					uint32_t n)
{
	/* Wait for the producers that reserved before us.  Acquire pairs
	 * with their release store below, so their slot writes happen before
	 * our release and a consumer that acquires our tail sees them too
	 * (on a weakly ordered CPU such as AArch64, without it a consumer
	 * could see our tail but not an earlier producer's slots). */
	if (ioc_unlikely(atomic_load_explicit(&r->prod.tail,
					      memory_order_acquire) != head))
		ioc__ring_wait_turn(&r->prod.tail, head);
	/* Release pairs with the consumers' acquire load of prod.tail; as in
	 * the single-producer publish, on AArch64 without it the tail could
	 * be seen before the slot writes. */
	atomic_store_explicit(&r->prod.tail, head + n, memory_order_release);
}

/* ---- consumer side ---------------------------------------------------- */

static inline uint32_t ioc__ring_sc_reserve(struct ioc_ring *r, uint32_t n,
					    uint32_t *tailp)
{
	/* Relaxed: only this consumer writes cons.tail. */
	uint32_t tail = atomic_load_explicit(&r->cons.tail, memory_order_relaxed);
	/* Relaxed: only this consumer uses cons.limit. */
	uint32_t limit = atomic_load_explicit(&r->cons.limit, memory_order_relaxed);
	uint32_t avail = limit - tail;

	if (ioc_unlikely(avail < n)) {
		/* Acquire pairs with the release store of prod.tail in the
		 * producer's publish: the slots below it are written.  On a
		 * weakly ordered CPU such as AArch64, without this acquire the
		 * slot reads could be satisfied before this load, with values
		 * from before the producer wrote them. */
		limit = atomic_load_explicit(&r->prod.tail, memory_order_acquire);
		atomic_store_explicit(&r->cons.limit, limit, memory_order_relaxed);
		avail = limit - tail;
		if (avail < n)
			n = avail;
	}
	*tailp = tail;
	return n;
}

static inline void ioc__ring_sc_release(struct ioc_ring *r, uint32_t tail,
					uint32_t n)
{
	/* Release pairs with the producers' acquire load of cons.tail: our
	 * reads of the slots are done before they may be rewritten.  On a
	 * weakly ordered CPU such as AArch64, without this release a slot
	 * read still in flight could return the producer's next lap. */
	atomic_store_explicit(&r->cons.tail, tail + n, memory_order_release);
}

/* ---- pointer rings -------------------------------------------------- */

static inline void ioc__ring_put_ptrs(struct ioc_ring *r, uint32_t head,
				      void *const *objs, uint32_t n)
{
	_Atomic(uintptr_t) *s = ioc__ring_ptrs(r);
	uint32_t mask = r->prod.mask;

	/* Relaxed stores: published by the release of prod.tail.  Atomic
	 * because a lock-free MC consumer may still be reading a stale copy
	 * of the slot (its CAS will then fail and discard what it read). */
	for (uint32_t i = 0; i < n; i++)
		atomic_store_explicit(&s[(head + i) & mask],
				      (uintptr_t)objs[i], memory_order_relaxed);
}

static inline void ioc__ring_get_ptrs(struct ioc_ring *r, uint32_t tail,
				      void **objs, uint32_t n)
{
	_Atomic(uintptr_t) *s = ioc__ring_ptrs(r);
	uint32_t mask = r->cons.mask;

	/* Relaxed loads: ordered after the acquire of prod.tail. */
	for (uint32_t i = 0; i < n; i++)
		objs[i] = (void *)atomic_load_explicit(&s[(tail + i) & mask],
						       memory_order_relaxed);
}

/* Multi consumer: positions published at or after `from`, at most n, using
 * the consumers' shared cached bound (refreshed from prod.tail when short). */
static inline uint32_t ioc__ring_mc_avail(struct ioc_ring *r, uint32_t from,
					  uint32_t n)
{
	uint32_t limit;
	int32_t avail;

	/* One element: the cached bound saves a load only when several
	 * elements wait, and costs a load and a branch when one does; read
	 * the producers' tail straight away (acquire, as below). */
	if (__builtin_constant_p(n) && n == 1) {
		limit = atomic_load_explicit(&r->prod.tail, memory_order_acquire);
		if ((int32_t)(limit - from) <= 0)
			return 0;
		return 1;
	}
	/* Acquire pairs with the release store below by whichever consumer
	 * last refreshed the bound (on AArch64, without it our slot reads are
	 * not ordered after the slot writes the refresher saw published). */
	limit = atomic_load_explicit(&r->cons.limit, memory_order_acquire);
	avail = (int32_t)(limit - from);  /* signed: it may lag */

	if (avail < (int32_t)n) {
		/* Acquire pairs with the producers' release of prod.tail. */
		limit = atomic_load_explicit(&r->prod.tail, memory_order_acquire);
		avail = (int32_t)(limit - from);
		/* Release: hands our acquire on to the consumers that use
		 * this bound.  A racing older store only makes it lag.  Not
		 * worth a store when we are about to take everything. */
		if (avail > (int32_t)n)
			atomic_store_explicit(&r->cons.limit, limit,
					      memory_order_release);
	}
	return avail <= 0 ? 0 : (uint32_t)avail < n ? (uint32_t)avail : n;
}

/* Lock-free multi-consumer pop of pointers: read, then claim with a CAS. */
static inline uint32_t ioc__ring_mc_pop_ptrs(struct ioc_ring *r, void **objs,
					     uint32_t n)
{
	uint32_t tail = atomic_load_explicit(&r->cons.tail, memory_order_relaxed);

	for (;;) {
		uint32_t got = ioc__ring_mc_avail(r, tail, n);

		if (got == 0)
			return 0;
		ioc__ring_get_ptrs(r, tail, objs, got);
		/* Release on success pairs with the producers' acquire load of
		 * cons.tail (our slot reads come first; on a weakly ordered CPU
		 * such as AArch64 a relaxed CAS would let a producer overwrite
		 * a slot we are still reading).  On failure another consumer
		 * advanced: tail is reloaded, the copies discarded. */
		if (ioc_likely(atomic_compare_exchange_weak_explicit(
			    &r->cons.tail, &tail, tail + got,
			    memory_order_release, memory_order_relaxed)))
			return got;
	}
}

/* SPSC, push one pointer.  Wait-free.  Returns false when full. */
static inline bool ioc_ring_push_spsc(struct ioc_ring *r, void *obj)
{
	uint32_t head;

	if (!ioc__ring_sp_reserve(r, 1, &head))
		return false;
	ioc__ring_put_ptrs(r, head, &obj, 1);
	ioc__ring_sp_publish(r, head, 1);
	return true;
}

/* SPSC, push up to n pointers; returns how many.  Wait-free. */
static inline unsigned ioc_ring_push_burst_spsc(struct ioc_ring *r,
						void *const *objs, unsigned n)
{
	uint32_t head;

	n = ioc__ring_sp_reserve(r, n, &head);
	if (n) {
		ioc__ring_put_ptrs(r, head, objs, n);
		ioc__ring_sp_publish(r, head, n);
	}
	return n;
}

/* SPSC, pop one pointer into *obj.  Wait-free.  Returns false when empty. */
static inline bool ioc_ring_pop_spsc(struct ioc_ring *r, void **obj)
{
	uint32_t tail;

	if (!ioc__ring_sc_reserve(r, 1, &tail))
		return false;
	ioc__ring_get_ptrs(r, tail, obj, 1);
	ioc__ring_sc_release(r, tail, 1);
	return true;
}

/* SPSC, pop up to n pointers; returns how many.  Wait-free. */
static inline unsigned ioc_ring_pop_burst_spsc(struct ioc_ring *r, void **objs,
					       unsigned n)
{
	uint32_t tail;

	n = ioc__ring_sc_reserve(r, n, &tail);
	if (n) {
		ioc__ring_get_ptrs(r, tail, objs, n);
		ioc__ring_sc_release(r, tail, n);
	}
	return n;
}

/* MPSC/MPMC push of one pointer.  Reservation lock-free; publication waits
 * for earlier producers (blocking if one is preempted, see the top).
 * Returns false when full. */
static inline bool ioc_ring_push_mpsc(struct ioc_ring *r, void *obj)
{
	/* Read before the CAS (a compiler barrier) so it stays in a
	 * register instead of being loaded again after it. */
	uint32_t head, mask = r->prod.mask;

	if (!ioc__ring_mp_reserve(r, 1, &head))
		return false;
	/* Relaxed: published by the release in ioc__ring_mp_publish(), as
	 * in ioc__ring_put_ptrs(). */
	atomic_store_explicit(&ioc__ring_ptrs(r)[head & mask], (uintptr_t)obj,
			      memory_order_relaxed);
	ioc__ring_mp_publish(r, head, 1);
	return true;
}

/* MPSC push of up to n pointers; returns how many.  As ioc_ring_push_mpsc. */
static inline unsigned ioc_ring_push_burst_mpsc(struct ioc_ring *r,
						void *const *objs, unsigned n)
{
	uint32_t head;

	n = ioc__ring_mp_reserve(r, n, &head);
	if (n) {
		ioc__ring_put_ptrs(r, head, objs, n);
		ioc__ring_mp_publish(r, head, n);
	}
	return n;
}

/* MPSC pop (the single consumer).  Wait-free. */
static inline bool ioc_ring_pop_mpsc(struct ioc_ring *r, void **obj)
{
	return ioc_ring_pop_spsc(r, obj);
}

static inline unsigned ioc_ring_pop_burst_mpsc(struct ioc_ring *r, void **objs,
					       unsigned n)
{
	return ioc_ring_pop_burst_spsc(r, objs, n);
}

/* MPMC push: as ioc_ring_push_mpsc. */
static inline bool ioc_ring_push_mpmc(struct ioc_ring *r, void *obj)
{
	return ioc_ring_push_mpsc(r, obj);
}

static inline unsigned ioc_ring_push_burst_mpmc(struct ioc_ring *r,
						void *const *objs, unsigned n)
{
	return ioc_ring_push_burst_mpsc(r, objs, n);
}

/* MPMC pop of one pointer.  Lock-free. */
static inline bool ioc_ring_pop_mpmc(struct ioc_ring *r, void **obj)
{
	return ioc__ring_mc_pop_ptrs(r, obj, 1) == 1;
}

/* MPMC pop of up to n pointers; returns how many.  Lock-free. */
static inline unsigned ioc_ring_pop_burst_mpmc(struct ioc_ring *r, void **objs,
					       unsigned n)
{
	return ioc__ring_mc_pop_ptrs(r, objs, n);
}

/* ---- element rings ---------------------------------------------------- */

static inline void ioc__ring_put_elems(struct ioc_ring *r, uint32_t head,
				       const void *elems, uint32_t n)
{
	uint32_t es = r->prod.esize, size = r->prod.mask + 1;
	uint32_t idx = head & r->prod.mask;
	uint32_t first = size - idx < n ? size - idx : n;

	memcpy(r->slots + (size_t)idx * es, elems, (size_t)first * es);
	if (first < n)
		memcpy(r->slots, (const unsigned char *)elems + (size_t)first * es,
		       (size_t)(n - first) * es);
}

static inline void ioc__ring_get_elems(struct ioc_ring *r, uint32_t tail,
				       void *elems, uint32_t n)
{
	uint32_t es = r->cons.esize, size = r->cons.mask + 1;
	uint32_t idx = tail & r->cons.mask;
	uint32_t first = size - idx < n ? size - idx : n;

	memcpy(elems, r->slots + (size_t)idx * es, (size_t)first * es);
	if (first < n)
		memcpy((unsigned char *)elems + (size_t)first * es, r->slots,
		       (size_t)(n - first) * es);
}

/* Multi consumer of elements: reserve on cons.head, copy, release in order. */
static inline uint32_t ioc__ring_mc_pop_elems(struct ioc_ring *r, void *elems,
					      uint32_t n)
{
	uint32_t head = atomic_load_explicit(&r->cons.head, memory_order_relaxed);
	uint32_t got;

	do {
		got = ioc__ring_mc_avail(r, head, n);
		if (got == 0)
			return 0;
		/* Relaxed CAS: hands out positions only. */
	} while (!atomic_compare_exchange_weak_explicit(&r->cons.head, &head,
							head + got,
							memory_order_relaxed,
							memory_order_relaxed));
	ioc__ring_get_elems(r, head, elems, got);
	/* Wait for earlier consumers; acquire pairs with their release below
	 * so their slot reads also happen before our release (on AArch64,
	 * without it a producer acquiring our tail could overwrite a slot an
	 * earlier consumer is still copying). */
	if (ioc_unlikely(atomic_load_explicit(&r->cons.tail,
					      memory_order_acquire) != head))
		ioc__ring_wait_turn(&r->cons.tail, head);
	/* Release pairs with the producers' acquire load of cons.tail. */
	atomic_store_explicit(&r->cons.tail, head + got, memory_order_release);
	return got;
}

/* SPSC, push one esize-byte element (copied).  Wait-free. */
static inline bool ioc_ring_push_elem_spsc(struct ioc_ring *r, const void *elem)
{
	uint32_t head;

	if (!ioc__ring_sp_reserve(r, 1, &head))
		return false;
	ioc__ring_put_elems(r, head, elem, 1);
	ioc__ring_sp_publish(r, head, 1);
	return true;
}

/* SPSC, push up to n contiguous elements; returns how many.  Wait-free. */
static inline unsigned ioc_ring_push_elem_burst_spsc(struct ioc_ring *r,
						     const void *elems,
						     unsigned n)
{
	uint32_t head;

	n = ioc__ring_sp_reserve(r, n, &head);
	if (n) {
		ioc__ring_put_elems(r, head, elems, n);
		ioc__ring_sp_publish(r, head, n);
	}
	return n;
}

/* SPSC, pop one element into elem.  Wait-free. */
static inline bool ioc_ring_pop_elem_spsc(struct ioc_ring *r, void *elem)
{
	uint32_t tail;

	if (!ioc__ring_sc_reserve(r, 1, &tail))
		return false;
	ioc__ring_get_elems(r, tail, elem, 1);
	ioc__ring_sc_release(r, tail, 1);
	return true;
}

/* SPSC, pop up to n elements; returns how many.  Wait-free. */
static inline unsigned ioc_ring_pop_elem_burst_spsc(struct ioc_ring *r,
						    void *elems, unsigned n)
{
	uint32_t tail;

	n = ioc__ring_sc_reserve(r, n, &tail);
	if (n) {
		ioc__ring_get_elems(r, tail, elems, n);
		ioc__ring_sc_release(r, tail, n);
	}
	return n;
}

/* MPSC/MPMC push of one element: reservation lock-free, publication waits
 * for earlier producers. */
static inline bool ioc_ring_push_elem_mpsc(struct ioc_ring *r, const void *elem)
{
	uint32_t head;

	if (!ioc__ring_mp_reserve(r, 1, &head))
		return false;
	ioc__ring_put_elems(r, head, elem, 1);
	ioc__ring_mp_publish(r, head, 1);
	return true;
}

static inline unsigned ioc_ring_push_elem_burst_mpsc(struct ioc_ring *r,
						     const void *elems,
						     unsigned n)
{
	uint32_t head;

	n = ioc__ring_mp_reserve(r, n, &head);
	if (n) {
		ioc__ring_put_elems(r, head, elems, n);
		ioc__ring_mp_publish(r, head, n);
	}
	return n;
}

/* MPSC pop (the single consumer).  Wait-free. */
static inline bool ioc_ring_pop_elem_mpsc(struct ioc_ring *r, void *elem)
{
	return ioc_ring_pop_elem_spsc(r, elem);
}

static inline unsigned ioc_ring_pop_elem_burst_mpsc(struct ioc_ring *r,
						    void *elems, unsigned n)
{
	return ioc_ring_pop_elem_burst_spsc(r, elems, n);
}

static inline bool ioc_ring_push_elem_mpmc(struct ioc_ring *r, const void *elem)
{
	return ioc_ring_push_elem_mpsc(r, elem);
}

static inline unsigned ioc_ring_push_elem_burst_mpmc(struct ioc_ring *r,
						     const void *elems,
						     unsigned n)
{
	return ioc_ring_push_elem_burst_mpsc(r, elems, n);
}

/* MPMC pop of one element.  Reservation lock-free; release waits for
 * earlier consumers (blocking if one is preempted mid-copy). */
static inline bool ioc_ring_pop_elem_mpmc(struct ioc_ring *r, void *elem)
{
	return ioc__ring_mc_pop_elems(r, elem, 1) == 1;
}

static inline unsigned ioc_ring_pop_elem_burst_mpmc(struct ioc_ring *r,
						    void *elems, unsigned n)
{
	return ioc__ring_mc_pop_elems(r, elems, n);
}

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_RING_H */
