/*
 * Inflight tracking for a split ring: what a back end killed at any
 * instruction leaves for the next one to finish.
 *
 * Problem: requests complete out of order (io_uring), so after a crash
 * the avail ring cannot say which of the entries taken were completed;
 * the used ring says which completions the guest may have seen.  The
 * front end keeps a region for us (vhost-user.rst, "Inflight I/O
 * tracking"): per head a flag, a pop counter and a list link, per ring
 * the last batch's head and the used index the region agrees with.
 *
 * Design, the stores in program order (a kill stops the process between
 * two instructions; every store before it is in the shared pages then,
 * so the order that matters is the compiler's, pinned by release stores):
 *  pop:   counter, then inflight = 1 (release).  Killed between: not in
 *         flight, and since restart sets last_avail = used->idx + the
 *         flags set, the entry is taken from the avail ring again.
 *  push:  the used entry, then next = last_batch_head, last_batch_head
 *         = head: unread while used->idx is unchanged.
 *  flush: used->idx (release, vring.c), then each flag of the batch
 *         cleared, then the region's used_idx (release).  Killed between
 *         the first and the last: used->idx != used_idx, and the restart
 *         clears the batch list (used->idx - used_idx entries from
 *         last_batch_head) itself, as the dead one was doing.
 * So at every point each entry taken is exactly one of: published in the
 * used ring, or flagged; the restart resubmits the flagged ones sorted
 * by counter before taking new entries, and a kill during that restart
 * leaves the same state.  A request resubmitted runs again whole (a
 * write written twice, a read read twice: the guest has not seen it).
 *
 * Every index read back from the region is bounded by the ring's size:
 * the front end can write the region, and the worst it can make us do is
 * resubmit its own guest's descriptors.
 *
 * Rejected: a copy of the batch's heads in our own memory (the list in
 * the region is what the next back end can read); clearing flags before
 * publishing used->idx (a kill between loses completed requests' place
 * in the guest's view: neither flagged nor published).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vub-int.h"

#ifdef IOC_VUB_CRASH_POINTS
long ioc__vub_crash_budget = -1;
unsigned long ioc__vub_crash_stores;
#endif

void ioc__vub_inflight_pop(struct ioc__vub_vring *vr, uint16_t head)
{
	struct vub_inflight_state *st = &vr->inflight->desc[head];

	/* Release: the counter is stored before the flag that makes it
	 * count, wherever a kill stops us.  The reader is the next back
	 * end's ioc__vub_vring_inflight_start(), after our death and its
	 * own mmap of the region (both full barriers); its acquire loads
	 * pair with these release stores when it is not. */
	IOC_VUB_STORE(&st->counter, vr->counter++, __ATOMIC_RELAXED);
	IOC_VUB_STORE(&st->inflight, 1, __ATOMIC_RELEASE);
}

void ioc__vub_inflight_push(struct ioc__vub_vring *vr, uint16_t head)
{
	struct vub_inflight_queue *q = vr->inflight;

	if (head >= vr->num)
		return;
	/* Relaxed: ordered before used->idx by flush's release store. */
	IOC_VUB_STORE(&q->desc[head].next, __atomic_load_n(&q->last_batch_head, __ATOMIC_RELAXED),
		      __ATOMIC_RELAXED);
	IOC_VUB_STORE(&q->last_batch_head, head, __ATOMIC_RELAXED);
}

/* Clear the inflight flags of the batch list: n entries from
 * last_batch_head.  Bounded by the ring whatever the region says. */
static void clear_batch(struct ioc__vub_vring *vr, uint16_t n)
{
	struct vub_inflight_queue *q = vr->inflight;
	uint16_t h = __atomic_load_n(&q->last_batch_head, __ATOMIC_RELAXED);

	for (unsigned i = 0; i < n && i < vr->num && h < vr->num; i++) {
		IOC_VUB_STORE(&q->desc[h].inflight, 0, __ATOMIC_RELAXED);
		h = __atomic_load_n(&q->desc[h].next, __ATOMIC_RELAXED);
	}
}

void ioc__vub_inflight_published(struct ioc__vub_vring *vr, uint16_t n)
{
	/* After the release store of used->idx (flush), so a kill before
	 * the used_idx store below leaves the batch for the restart. */
	clear_batch(vr, n);
	/* Release: the clears above before it; read with an acquire load
	 * by ioc__vub_vring_inflight_start() in the next back end. */
	IOC_VUB_STORE(&vr->inflight->used_idx, vr->used_idx, __ATOMIC_RELEASE);
}

uint64_t ioc__vub_inflight_queue_bytes(unsigned queue_size)
{
	uint64_t b = sizeof(struct vub_inflight_queue) +
		     (uint64_t)queue_size * sizeof(struct vub_inflight_state);

	return (b + VUB_INFLIGHT_ALIGN - 1) & ~(uint64_t)(VUB_INFLIGHT_ALIGN - 1);
}

static int by_counter(const void *a, const void *b)
{
	const struct ioc__vub_resubmit *x = a, *y = b;

	if (x->counter != y->counter)
		return x->counter < y->counter ? -1 : 1;
	return (x->head > y->head) - (x->head < y->head);
}

int ioc__vub_vring_inflight_start(struct ioc__vub_vring *vr,
				  struct ioc__vub_resubmit *resubmit)
{
	struct vub_inflight_queue *q = vr->inflight;
	uint16_t used, ver, done;
	uint64_t next = 0;
	unsigned n = 0;

	if (!q)
		return 0;
	/* Acquire: pairs with the release stores of version (dev.c's
	 * inflight_init()), used_idx (ioc__vub_inflight_published()) and
	 * the flags (ioc__vub_inflight_pop()) of whoever wrote the region
	 * last.  A dead back end's stores are in memory before the front
	 * end can hand the region over, so only their order matters. */
	ver = __atomic_load_n(&q->version, __ATOMIC_ACQUIRE);
	used = __atomic_load_n(&vr->used->idx, __ATOMIC_RELAXED);
	if (ver == 0) {
		/* Not set up yet (the front end zeroed it): nothing was in
		 * flight.  The ring goes on from the used ring's index. */
		memset(q->desc, 0, (size_t)vr->num * sizeof(q->desc[0]));
		q->features = 0;
		q->desc_num = (uint16_t)vr->num;
		q->last_batch_head = 0;
		q->used_idx = used;
		__atomic_store_n(&q->version, VUB_INFLIGHT_VERSION, __ATOMIC_RELEASE);
		vr->counter = 1;
		vr->last_avail = used;
		return 0;
	}
	if (ver != VUB_INFLIGHT_VERSION) {
		vr->why = "inflight region of an unknown version";
		return -EINVAL;
	}
	if (__atomic_load_n(&q->desc_num, __ATOMIC_RELAXED) < vr->num) {
		vr->why = "inflight region smaller than the ring";
		return -EINVAL;
	}
	done = __atomic_load_n(&q->used_idx, __ATOMIC_ACQUIRE);
	if (done != used) {
		/* A batch was published and its flags not all cleared. */
		clear_batch(vr, (uint16_t)(used - done));
		IOC_VUB_STORE(&q->used_idx, used, __ATOMIC_RELEASE);
	}
	for (unsigned h = 0; h < vr->num; h++) {
		uint8_t f = __atomic_load_n(&q->desc[h].inflight, __ATOMIC_RELAXED);

		if (f != 1) {
			if (f)   /* garbage: not a request of ours */
				__atomic_store_n(&q->desc[h].inflight, 0, __ATOMIC_RELAXED);
			continue;
		}
		resubmit[n].head = (uint16_t)h;
		resubmit[n].counter = __atomic_load_n(&q->desc[h].counter, __ATOMIC_RELAXED);
		if (resubmit[n].counter >= next)
			next = resubmit[n].counter + 1;
		n++;
	}
	/* O(n log n) once per start, n at most the ring's size. */
	qsort(resubmit, n, sizeof(resubmit[0]), by_counter);
	vr->counter = next ? next : 1;
	vr->last_avail = (uint16_t)(used + n);
	return (int)n;
}
