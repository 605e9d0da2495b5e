/*
 * Guest memory and the split virtqueue, seen from the device.
 *
 * Problem: every address in a ring comes from the guest or the front end
 * and may be hostile: outside guest memory, straddling regions, looping,
 * longer than the ring, changing while we read it.  None of that may
 * crash us or touch memory outside the regions we were handed; the worst
 * is a stopped ring.  And the walker is on the data path: a few loads per
 * descriptor.
 *
 * Design: the memory table is a short array of regions, searched
 * linearly; a translation succeeds inside one region only, and a buffer
 * that crosses regions becomes several iovecs.  Each descriptor is read
 * once into a local copy (a compiler barrier after: we use what we
 * checked).  A chain visits at most as many descriptors as its table
 * holds, which bounds loops without marking; an indirect table is one
 * nonzero multiple of 16 bytes in one region, negotiated, not nested.
 * Readable descriptors come before writable ones.  A fault breaks the
 * ring with a reason (virtio's "needs reset").  With inflight tracking
 * (inflight.c) pop, push and flush also note each request in the region
 * the front end keeps for a restart.
 *
 * Notification: push fills used entries unseen; flush publishes used->idx
 * once per batch and signals the call eventfd at most once, as the driver
 * asked (EVENT_IDX or NO_INTERRUPT).  arm asks for the next kick and
 * re-reads avail->idx after a full fence, so no request is left unseen.
 *
 * Dirty logging (LOG_ALL, a live migration): every byte written into
 * guest memory marks its guest-physical page after the write (data and
 * status through log_write, used entries in push, used->idx in flush),
 * each an atomic OR with release order: a front end whose exchange sees
 * the bit sees the write, and one that cleared the word before our OR
 * finds the bit in its next pass.
 *
 * Rejected: copying descriptor tables out of guest memory (a cost on every
 * request for what is checked per entry anyway); marking visited
 * descriptors to find loops (a bitmap per ring for what a count bounds).
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "vub-int.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "virtio 1.0 rings are little-endian; this walker reads them natively");

#define compiler_barrier() __asm__ __volatile__("" ::: "memory")

void *ioc__vub_gpa(const struct ioc__vub_mem *mem, uint64_t gpa, uint64_t len,
		   uint64_t *contig)
{
	for (unsigned i = 0; i < mem->n; i++) {
		const struct ioc__vub_region *r = &mem->r[i];

		if (gpa >= r->gpa && gpa - r->gpa < r->size) {
			uint64_t off = gpa - r->gpa, left = r->size - off;

			if (contig)
				*contig = left;
			else if (len > left)
				return NULL;
			return r->host + off;
		}
	}
	return NULL;
}

void *ioc__vub_uva(const struct ioc__vub_mem *mem, uint64_t uva, uint64_t len)
{
	for (unsigned i = 0; i < mem->n; i++) {
		const struct ioc__vub_region *r = &mem->r[i];

		if (uva >= r->uva && uva - r->uva < r->size) {
			uint64_t off = uva - r->uva;

			if (len > r->size - off)
				return NULL;
			return r->host + off;
		}
	}
	return NULL;
}

/* ---- the dirty log ---------------------------------------------------- */

void ioc__vub_log_gpa(const struct ioc__vub_log *log, uint64_t gpa, uint64_t len)
{
	uint64_t first, last;

	if (!log || !len || gpa / VUB_LOG_PAGE / 8 >= log->size)
		return;
	first = gpa / VUB_LOG_PAGE;
	last = (len - 1 > UINT64_MAX - gpa ? UINT64_MAX : gpa + len - 1) / VUB_LOG_PAGE;
	/* One OR per page: a 1 MiB request is 256 ORs, against the copy
	 * of a megabyte that came before them. */
	for (uint64_t p = first; p <= last && p / 8 < log->size; p++) {
		/* Release: the writes to page p (made by this thread, or by
		 * the kernel before the completion this thread took) come
		 * first.  Pairs with the front end's atomic exchange that
		 * reads and clears the word before it copies the pages. */
		if (log->words && p / 64 < log->size / 8)
			__atomic_fetch_or((uint64_t *)(void *)log->bits + p / 64,
					  1ull << (p % 64), __ATOMIC_RELEASE);
		else
			__atomic_fetch_or(log->bits + p / 8, (uint8_t)(1u << (p % 8)),
					  __ATOMIC_RELEASE);
	}
}

void ioc__vub_log_iov(const struct ioc__vub_log *log, const struct ioc__vub_mem *mem,
		      const struct iovec *iov, unsigned n, size_t len)
{
	for (unsigned i = 0; i < n && len; i++) {
		const uint8_t *h = iov[i].iov_base;
		size_t l = iov[i].iov_len < len ? iov[i].iov_len : len;

		len -= l;
		for (unsigned k = 0; k < mem->n; k++) {
			const struct ioc__vub_region *r = &mem->r[k];

			/* The walker made every iovec inside one region. */
			if (h >= r->host && (uint64_t)(h - r->host) < r->size) {
				ioc__vub_log_gpa(log, r->gpa + (uint64_t)(h - r->host), l);
				break;
			}
		}
	}
}

void ioc__vub_vring_log_write(const struct ioc__vub_vring *vr, const struct iovec *iov,
			      unsigned n, size_t len)
{
	if (vr->log && vr->mem)
		ioc__vub_log_iov(vr->log, vr->mem, iov, n, len);
}

static int map_fail(struct ioc__vub_vring *vr, const char *why)
{
	vr->why = why;
	vr->desc = NULL;
	vr->avail = NULL;
	vr->used = NULL;
	return -EINVAL;
}

int ioc__vub_vring_map(struct ioc__vub_vring *vr, const struct ioc__vub_mem *mem)
{
	uint64_t n = vr->num;

	if (!mem)
		return map_fail(vr, "no memory table");
	if (n == 0 || n > 32768 || (n & (n - 1)))
		return map_fail(vr, "ring size not a power of two up to 32768");
	if ((vr->desc_uva & 15) || (vr->avail_uva & 1) || (vr->used_uva & 3))
		return map_fail(vr, "ring address misaligned");
	vr->desc = ioc__vub_uva(mem, vr->desc_uva, 16 * n);
	vr->avail = ioc__vub_uva(mem, vr->avail_uva, 6 + 2 * n);
	vr->used = ioc__vub_uva(mem, vr->used_uva, 6 + 8 * n);
	if (!vr->desc || !vr->avail || !vr->used)
		return map_fail(vr, "ring outside guest memory");
	/* Aligned addresses can still land misaligned here: a region's
	 * mapping starts at the front end's mmap_offset, any number. */
	if (((uintptr_t)vr->desc & 15) || ((uintptr_t)vr->avail & 1) ||
	    ((uintptr_t)vr->used & 3))
		return map_fail(vr, "ring misaligned in our mapping");
	vr->mem = mem;
	vr->broken = false;
	vr->why = NULL;
	return 0;
}

static inline uint16_t *used_event(struct ioc__vub_vring *vr)
{
	return &vr->avail->ring[vr->num];
}

static inline uint16_t *avail_event(struct ioc__vub_vring *vr)
{
	return (uint16_t *)&vr->used->ring[vr->num];
}

static inline uint16_t avail_idx_acquire(struct ioc__vub_vring *vr)
{
	/* Pairs with the driver's write barrier between filling avail->ring
	 * (and the descriptors) and its store of avail->idx. */
	return __atomic_load_n(&vr->avail->idx, __ATOMIC_ACQUIRE);
}

bool ioc__vub_vring_avail(struct ioc__vub_vring *vr)
{
	if (!vr->avail || vr->broken)
		return false;
	/* Relaxed: a hint for the poll callback; pop re-reads it with the
	 * acquire load before touching the entries. */
	return __atomic_load_n(&vr->avail->idx, __ATOMIC_RELAXED) != vr->last_avail;
}

static int fault(struct ioc__vub_vring *vr, const char *why)
{
	vr->broken = true;
	vr->why = why;
	return -EPROTO;
}

/* Append [gpa, gpa + len) to e, one iovec per region it touches. */
static int add_buffer(struct ioc__vub_vring *vr, struct ioc__vub_elem *e,
		      uint64_t gpa, uint32_t len)
{
	uint64_t left = len;

	while (left) {
		uint64_t contig;
		void *host = ioc__vub_gpa(vr->mem, gpa, left, &contig);
		uint64_t chunk;

		if (!host)
			return fault(vr, "descriptor outside guest memory");
		chunk = left < contig ? left : contig;
		if (e->n_out + e->n_in >= VUB_REQ_IOV)
			return fault(vr, "request has too many segments");
		e->iov[e->n_out + e->n_in] = (struct iovec){ host, (size_t)chunk };
		gpa += chunk;
		left -= chunk;
		e->n_in += 1;   /* moved to n_out by the caller when readable */
	}
	return 0;
}

/* Walk the chain at head into e: iovecs, readable ones first. */
static int walk_chain(struct ioc__vub_vring *vr, uint16_t head, struct ioc__vub_elem *e)
{
	const uint8_t *table;   /* may be unaligned (an indirect table) */
	unsigned tnum, count = 0, i;
	bool in_indirect = false;

	e->n_out = e->n_in = 0;
	table = (const uint8_t *)vr->desc;
	tnum = vr->num;
	i = head;
	for (;;) {
		struct vring_desc d;

		if (++count > tnum)
			return fault(vr, "descriptor chain loops or outgrows its table");
		memcpy(&d, table + (size_t)i * sizeof(d), sizeof(d));
		compiler_barrier();
		if (d.flags & VRING_DESC_F_INDIRECT) {
			uint64_t contig;

			if (!vr->indirect)
				return fault(vr, "indirect descriptor not negotiated");
			if (in_indirect)
				return fault(vr, "indirect descriptor inside an indirect table");
			if (d.flags & VRING_DESC_F_NEXT)
				return fault(vr, "indirect descriptor with NEXT");
			if (d.len == 0 || d.len % sizeof(struct vring_desc) ||
			    d.len / sizeof(struct vring_desc) > VUB_INDIRECT_MAX)
				return fault(vr, "indirect table of bad size");
			table = ioc__vub_gpa(vr->mem, d.addr, d.len, &contig);
			if (!table || contig < d.len)
				return fault(vr, "indirect table outside guest memory");
			tnum = d.len / sizeof(struct vring_desc);
			in_indirect = true;
			count = 0;
			i = 0;
			continue;
		}
		if (d.flags & VRING_DESC_F_WRITE) {
			if (add_buffer(vr, e, d.addr, d.len) < 0)
				return -EPROTO;
		} else {
			unsigned before = e->n_in;

			if (e->n_in)
				return fault(vr, "readable descriptor after a writable one");
			if (add_buffer(vr, e, d.addr, d.len) < 0)
				return -EPROTO;
			e->n_out += e->n_in - before;
			e->n_in = before;
		}
		if (!(d.flags & VRING_DESC_F_NEXT))
			break;
		i = d.next;
		if (i >= tnum)
			return fault(vr, "next descriptor out of range");
	}
	e->head = head;
	return 1;
}

int ioc__vub_vring_pop(struct ioc__vub_vring *vr, struct ioc__vub_elem *e)
{
	uint16_t avail, head;
	int r;

	if (vr->broken || !vr->avail)
		return vr->broken ? -EPROTO : 0;
	avail = avail_idx_acquire(vr);
	if (avail == vr->last_avail)
		return 0;
	if ((uint16_t)(avail - vr->last_avail) > vr->num)
		return fault(vr, "avail index ran ahead of the ring");
	/* Relaxed: ordered after the acquire load of avail->idx above. */
	head = __atomic_load_n(&vr->avail->ring[vr->last_avail & (vr->num - 1)],
			       __ATOMIC_RELAXED);
	if (head >= vr->num)
		return fault(vr, "avail entry out of range");
	r = walk_chain(vr, head, e);
	if (r < 0)
		return r;
	vr->last_avail++;
	if (vr->inflight)
		ioc__vub_inflight_pop(vr, head);
	return 1;
}

int ioc__vub_vring_pop_head(struct ioc__vub_vring *vr, uint16_t head,
			    struct ioc__vub_elem *e)
{
	if (vr->broken || !vr->desc)
		return -EPROTO;
	if (head >= vr->num)
		return fault(vr, "resubmitted head out of range");
	return walk_chain(vr, head, e);
}

void ioc__vub_vring_push(struct ioc__vub_vring *vr, uint16_t head, uint32_t len)
{
	struct vring_used_elem *u = &vr->used->ring[vr->used_idx & (vr->num - 1)];

	/* Published by flush's release store of used->idx. */
	__atomic_store_n(&u->id, (uint32_t)head, __ATOMIC_RELAXED);
	__atomic_store_n(&u->len, len, __ATOMIC_RELAXED);
	if (vr->log && vr->log_used)
		ioc__vub_log_gpa(vr->log, vr->log_used_gpa + offsetof(struct vring_used, ring) +
				 (uint64_t)(vr->used_idx & (vr->num - 1)) * sizeof(*u), sizeof(*u));
	vr->used_idx++;
	if (vr->inflight)
		ioc__vub_inflight_push(vr, head);
}

bool ioc__vub_vring_flush(struct ioc__vub_vring *vr)
{
	uint16_t old = vr->published, now = vr->used_idx;
	bool need;

	if (!vr->used || old == now)
		return false;
	/* Pairs with the driver's read barrier between its load of
	 * used->idx and its reads of the used entries (and of the data we
	 * wrote into its buffers). */
	IOC_VUB_STORE(&vr->used->idx, now, __ATOMIC_RELEASE);
	if (vr->log && vr->log_used)
		ioc__vub_log_gpa(vr->log, vr->log_used_gpa + offsetof(struct vring_used, idx),
				 sizeof(vr->used->idx));
	vr->published = now;
	if (vr->inflight)
		ioc__vub_inflight_published(vr, (uint16_t)(now - old));
	if (vr->call_fd < 0)
		return false;
	/* The used->idx store above before the read of what the driver
	 * wants; pairs with the driver's full barrier between writing
	 * used_event (or clearing NO_INTERRUPT) and re-reading used->idx,
	 * so either it sees our entries or we see its request. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (vr->event_idx) {
		/* Relaxed: ordered by the fence above. */
		uint16_t ev = __atomic_load_n(used_event(vr), __ATOMIC_RELAXED);

		/* Did used->idx pass ev in this batch: ev in [old, now)?
		 * The first batch after a start signals whatever ev says:
		 * the driver's ev may predate entries an earlier back end
		 * published and died before signalling, and then no later
		 * batch would cross it until the index wraps. */
		need = !vr->signalled_valid ||
		       (uint16_t)(now - ev - 1) < (uint16_t)(now - old);
		vr->signalled_valid = true;
	} else {
		need = !(__atomic_load_n(&vr->avail->flags, __ATOMIC_RELAXED) &
			 VRING_AVAIL_F_NO_INTERRUPT);
	}
	if (need) {
		uint64_t one = 1;

		/* An eventfd counts: a full one (2^64 - 2 signals unread)
		 * fails with EAGAIN, and the driver has work anyway. */
		if (write(vr->call_fd, &one, sizeof(one)) < 0)
			return false;
	}
	return need;
}

bool ioc__vub_vring_arm(struct ioc__vub_vring *vr)
{
	if (!vr->avail || vr->broken)
		return false;
	/* Relaxed store, ordered before the re-read by the fence below. */
	if (vr->event_idx)
		__atomic_store_n(avail_event(vr), vr->last_avail, __ATOMIC_RELAXED);
	/* The avail_event store before the avail->idx load; pairs with the
	 * driver's full barrier between its avail->idx store and its read
	 * of avail_event (or of used->flags): either it sees our request
	 * and kicks, or we see its entry here. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&vr->avail->idx, __ATOMIC_RELAXED) != vr->last_avail;
}

