/*
 * qcow2's L2 slice cache: hits without a lock, misses under the driver's.
 *
 * Problem: every guest read translates through an L2 entry, from
 * coroutines on several loops at once.  A cache behind one lock (QEMU's
 * qcow2 holds s->lock for each lookup) makes every reader of a node
 * queue on one cache line and one mutex even when nothing is missing.
 *
 * Design: a fixed array of slots, never freed while the node is open, and
 * a directory with one pointer per (L1 index, slice of its table).  A
 * reader loads the directory pointer, pins the slot with one atomic add,
 * and keeps it if the slot was not being refilled (the BUSY bit) and
 * still holds the key it wants (the slice's host offset).  A refill, under
 * the driver's lock, takes a slot only by CAS of its pins from 0 to BUSY,
 * so it never changes a slot a reader holds, and a reader that pins
 * during a refill sees BUSY and backs off (its add and sub cancel out
 * whatever the refill stores).  Readers hold pins only while they copy
 * entries out, never across I/O, so a claim finds a free slot at once
 * unless every slot is pinned at that instant (then it spins).  LRU is by
 * miss epochs: a hit stores the current epoch into its slot when it
 * differs, so hits write no shared line.
 *
 * Rejected: a hash table under a reader-writer lock (every hit writes the
 * lock word); RCU (no grace-period machinery in the project, and the
 * slots are few enough to keep); dropping the directory for a hash on the
 * key (collisions need chains, and chains need a lock or RCU again).
 * Cost: the directory is l1_size * slices-per-table pointers, which the
 * driver bounds at open.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "qcow2.h"

#define Q2_SLICE_BUSY 0x80000000u

int ioc__qcow2_cache_init(struct q2_cache *c, unsigned nslots, size_t slice_bytes,
			  size_t ndir)
{
	memset(c, 0, sizeof(*c));
	c->slots = calloc(nslots, sizeof(*c->slots));
	c->dir = calloc(ndir ? ndir : 1, sizeof(*c->dir));
	if (!c->slots || !c->dir) {
		free(c->slots);
		free(c->dir);
		return -ENOMEM;
	}
	c->nslots = nslots;
	c->slice_bytes = slice_bytes;
	c->ndir = ndir;
	atomic_init(&c->tick, 1);
	return 0;
}

void ioc__qcow2_cache_destroy(struct q2_cache *c)
{
	for (unsigned i = 0; c->slots && i < c->nslots; i++)
		free(c->slots[i].data);
	free(c->slots);
	free(c->dir);
	memset(c, 0, sizeof(*c));
}

struct q2_slice *ioc__qcow2_cache_lookup(struct q2_cache *c, size_t d, uint64_t key)
{
	/* Pairs with the release store in ioc__qcow2_cache_publish(). */
	struct q2_slice *s = atomic_load_explicit(&c->dir[d], memory_order_acquire);
	uint32_t p;
	uint64_t t;

	if (!s)
		return NULL;
	/* Pairs with the CAS in claim_slot(): either it sees our pin and
	 * leaves the slot, or we see its BUSY and leave it.  The acquire
	 * also pairs with publish's release of BUSY, for the data. */
	p = atomic_fetch_add_explicit(&s->pins, 1, memory_order_seq_cst);
	if ((p & Q2_SLICE_BUSY) ||
	    atomic_load_explicit(&s->key, memory_order_acquire) != key) {
		ioc__qcow2_cache_unpin(s);
		return NULL;
	}
	/* LRU hints, relaxed: a stale epoch only misorders an eviction. */
	t = atomic_load_explicit(&c->tick, memory_order_relaxed);
	if (atomic_load_explicit(&s->used, memory_order_relaxed) != t)
		atomic_store_explicit(&s->used, t, memory_order_relaxed);
	return s;
}

void ioc__qcow2_cache_unpin(struct q2_slice *s)
{
	/* Release: our reads of the data happen before a refill's CAS
	 * (claim_slot) can see zero pins. */
	atomic_fetch_sub_explicit(&s->pins, 1, memory_order_release);
}

/* Take s for a refill: only when nobody holds it.  Lock held. */
static bool claim_slot(struct q2_cache *c, struct q2_slice *s)
{
	uint32_t zero = 0;
	uint64_t key;

	if (s->dirty)
		return false;
	/* Pairs with the fetch_add in ioc__qcow2_cache_lookup(). */
	if (!atomic_compare_exchange_strong_explicit(&s->pins, &zero, Q2_SLICE_BUSY,
						     memory_order_seq_cst,
						     memory_order_relaxed))
		return false;
	key = atomic_load_explicit(&s->key, memory_order_relaxed);
	if (key) {
		struct q2_slice *me = s;

		/* Only if the directory still points here (forget() may have
		 * moved it on). */
		atomic_compare_exchange_strong_explicit(&c->dir[s->dir], &me, NULL,
							memory_order_release,
							memory_order_relaxed);
		/* Relaxed: BUSY keeps readers off the key until publish()'s
		 * release of it. */
		atomic_store_explicit(&s->key, 0, memory_order_relaxed);
	}
	return true;
}

struct q2_slice *ioc__qcow2_cache_claim(struct q2_cache *c)
{
	/* A new LRU epoch (relaxed, a hint: see lookup()). */
	atomic_fetch_add_explicit(&c->tick, 1, memory_order_relaxed);
	c->misses++;
	for (;;) {
		struct q2_slice *best = NULL;
		bool any_dirty = false;

		/* An empty slot first, else the least recently used clean one. */
		for (unsigned i = 0; i < c->nslots; i++) {
			struct q2_slice *s = &c->slots[i];

			if (s->dirty) {
				any_dirty = true;
				continue;
			}
			if (atomic_load_explicit(&s->pins, memory_order_relaxed))
				continue;
			if (!atomic_load_explicit(&s->key, memory_order_relaxed)) {
				best = s;
				break;
			}
			if (!best || atomic_load_explicit(&s->used, memory_order_relaxed) <
				     atomic_load_explicit(&best->used, memory_order_relaxed))
				best = s;
		}
		/* Nothing free but dirty slots: the caller writes them back
		 * (the clean ones may be pinned by the caller itself). */
		if (!best && any_dirty)
			return NULL;
		if (best && claim_slot(c, best)) {
			if (!best->data) {
				best->data = aligned_alloc(4096, (c->slice_bytes + 4095) & ~4095ul);
				if (!best->data) {
					/* Empty and free again, as abandon(). */
					atomic_fetch_sub_explicit(&best->pins, Q2_SLICE_BUSY,
								  memory_order_release);
					return NULL;
				}
			}
			return best;
		}
		/* Every slot clean and pinned this instant by readers copying
		 * entries out (no reader yields while it holds a pin). */
		sched_yield();
	}
}

void ioc__qcow2_cache_abandon(struct q2_slice *s)
{
	/* Empty (key 0) and free again; pairs with lookup()'s fetch_add. */
	atomic_fetch_sub_explicit(&s->pins, Q2_SLICE_BUSY, memory_order_release);
}

void ioc__qcow2_cache_publish(struct q2_cache *c, struct q2_slice *s, size_t d,
			      uint64_t key)
{
	s->dir = (uint32_t)d;
	atomic_store_explicit(&s->used, atomic_load_explicit(&c->tick, memory_order_relaxed),
			      memory_order_relaxed);
	atomic_store_explicit(&s->key, key, memory_order_release);
	/* The caller's pin, then BUSY off: a reader that pinned meanwhile
	 * subtracts its own. Pairs with the fetch_add in lookup(). */
	atomic_fetch_add_explicit(&s->pins, 1, memory_order_relaxed);
	atomic_fetch_sub_explicit(&s->pins, Q2_SLICE_BUSY, memory_order_release);
	/* Pairs with the acquire load in ioc__qcow2_cache_lookup(). */
	atomic_store_explicit(&c->dir[d], s, memory_order_release);
}

void ioc__qcow2_cache_forget(struct q2_cache *c, size_t d)
{
	/* Pairs with the acquire load in lookup(): later readers miss.
	 * The slot keeps its key and data for readers that hold it; a
	 * claim recycles it. */
	atomic_store_explicit(&c->dir[d], NULL, memory_order_release);
}

void ioc__qcow2_cache_clean(struct q2_cache *c, uint64_t now_ns, bool all)
{
	uint64_t mark;

	if (!all && (!c->clean_interval_ns || now_ns - c->last_clean_ns < c->clean_interval_ns))
		return;
	/* Slots not hit since the previous pass are idle for an interval. */
	mark = atomic_fetch_add_explicit(&c->tick, 1, memory_order_relaxed);
	for (unsigned i = 0; i < c->nslots; i++) {
		struct q2_slice *s = &c->slots[i];

		if (!s->data || (!all && atomic_load_explicit(&s->used, memory_order_relaxed) >=
					 c->clean_epoch))
			continue;
		if (!claim_slot(c, s))
			continue;
		free(s->data);
		s->data = NULL;
		/* Empty and free again; pairs with lookup()'s fetch_add. */
		atomic_fetch_sub_explicit(&s->pins, Q2_SLICE_BUSY, memory_order_release);
	}
	c->clean_epoch = mark + 1;      /* hits from now on store mark + 1 or more */
	c->last_clean_ns = now_ns;
}
