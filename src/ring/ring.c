/*
 * Lockless rings: the out-of-line parts (creation and the slow wait).
 *
 * The problem: the thread pool, the workqueue and the loop hand objects
 * between threads millions of times a second; a mutex-protected queue costs
 * a contended lock round trip per element and sleeps under contention.
 *
 * The design (see include/iocore/ring.h): a bounded power-of-two array with
 * free-running 32-bit producer and consumer indices on separate cache lines,
 * DPDK/ck style head/tail pairs for the multi-threaded sides, and a cached
 * copy of the other side's index for the single-threaded sides.  Everything
 * on the hot path is static inline in the header so a burst compiles to a
 * loop of plain moves and one release store.
 *
 * Alternatives rejected:
 *   - Vyukov's per-slot sequence numbers: no publication wait for producers,
 *     but doubles the slot size of a pointer ring, makes bursts a CAS per
 *     element, and still stalls consumers at a reserved-but-unwritten slot.
 *   - Linked (unbounded) MPSC queues: allocate or need intrusive nodes and
 *     give no back-pressure; callers here want "full" as a signal.
 *
 * Cost notes: with one producer and one consumer each side reads the
 * other's line about once per lap (once per `size` elements) when the ring
 * runs near full or empty, and never otherwise.  With several producers,
 * every push is one CAS on the shared producer line plus the in-order
 * publication wait; a producer preempted between the two stalls the others
 * for up to a time slice, which is why the wait yields the CPU.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>

#include "iocore/ring.h"

void ioc__ring_wait_turn(_Atomic uint32_t *idx, uint32_t want)
{
	unsigned spins = 0;

	/* Acquire pairs with the release store of *idx by the thread whose
	 * turn came before ours (see ioc__ring_mp_publish and
	 * ioc__ring_mc_pop_elems).  On a weakly ordered CPU such as AArch64,
	 * without it our release would not carry that thread's slot accesses
	 * along; on x86-64 it is a plain load. */
	while (atomic_load_explicit(idx, memory_order_acquire) != want) {
		/* The thread we wait for may be preempted; on an
		 * oversubscribed machine spinning a whole time slice would
		 * only delay it, so give the CPU away now and then. */
		if (++spins % 128 == 0)
			sched_yield();
		else
			ioc_ring_relax();
	}
}

size_t ioc_ring_memsize(uint32_t size, uint32_t esize)
{
	if (size < 2 || size > IOC_RING_MAX_SIZE || (size & (size - 1)) ||
	    esize == 0 || esize > 65536)
		return 0;
	return sizeof(struct ioc_ring) + (size_t)size * esize;
}

int ioc_ring_init(struct ioc_ring *r, uint32_t size, uint32_t esize)
{
	if (!ioc_ring_memsize(size, esize))
		return -EINVAL;
	memset(r, 0, sizeof(*r));
	r->prod.mask = r->cons.mask = size - 1;
	r->prod.esize = r->cons.esize = esize;
	atomic_init(&r->prod.limit, size);  /* every slot is free */
	atomic_init(&r->cons.limit, 0);     /* nothing published */
	/* Plain initialisation: the ring is handed to other threads by
	 * whatever publishes the pointer to it (thread creation, a lock). */
	atomic_init(&r->prod.head, 0);
	atomic_init(&r->prod.tail, 0);
	atomic_init(&r->cons.head, 0);
	atomic_init(&r->cons.tail, 0);
	return 0;
}

int ioc_ring_new_elem(struct ioc_ring **out, uint32_t size, uint32_t esize)
{
	size_t bytes = ioc_ring_memsize(size, esize);
	struct ioc_ring *r;

	*out = NULL;
	if (!bytes)
		return -EINVAL;
	bytes = (bytes + IOC_CACHELINE - 1) & ~(size_t)(IOC_CACHELINE - 1);
	r = aligned_alloc(IOC_CACHELINE, bytes);
	if (!r)
		return -ENOMEM;
	ioc_ring_init(r, size, esize);
	*out = r;
	return 0;
}

int ioc_ring_new(struct ioc_ring **out, uint32_t size)
{
	return ioc_ring_new_elem(out, size, sizeof(void *));
}

void ioc_ring_free(struct ioc_ring *r)
{
	free(r);
}
