/*
 * qcow2's refcounts: reading them, allocating clusters, freeing them late.
 *
 * Problem: every cluster the driver allocates must be counted before
 * anything on disk points at it, and every cluster it drops must stay
 * counted until nothing on disk points at it any more, or a crash leaves
 * a cluster that two owners share.  Refcount blocks can be 1 to 64 bits
 * an entry, the table can fill up, and a new refcount block has to be
 * counted in some refcount block too.
 *
 * Design: refcount blocks are read once and kept (lock held for all of
 * this file), changed in memory and marked dirty; ioc__qcow2_writeback()
 * writes them before the L2 slices that need them, with a flush between.
 * Decrements never happen in place: ioc__qcow2_defer_free() queues them
 * and writeback applies them after the L2 slices that dropped the
 * clusters are on disk and flushed, so a dropped cluster cannot be
 * reused (and overwritten) while an L2 entry on disk still points at it.
 * A missing refcount block goes into the first usable cluster of the
 * range it covers (it is free: its refcount is zero by definition) and
 * counts itself.  A full table grows into clusters past everything the
 * old one covers, with new blocks that count themselves and the table;
 * the header switches to it in one write after both are flushed.
 *
 * Rejected: a refcount block cache with eviction (QEMU's): blocks are
 * 1/(8 * cluster / refcount_bits) of the file, small enough to keep for
 * the images this serves, and keeping them makes the writeback order
 * one loop.  Cost: memory grows with the allocated part of the file
 * (64 KiB clusters, 16-bit refcounts: 2 MiB per 64 GiB).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "node/node.h"
#include "qcow2.h"
#include "util/buf.h"

/* Everything here runs with the driver's lock held: the file size is
 * loaded relaxed (its only writer is ensure_file(), under the same lock),
 * as are slice keys (changed only under it too). */

static uint64_t rb_entries(const struct q2_state *q)
{
	return 1ull << q->rb_bits;
}

int ioc__qcow2_refcount_init(struct q2_state *q, char *err, size_t errlen)
{
	uint64_t n = q->rt_entries;

	q->rt = malloc(n * 8);
	q->rb = calloc(n, sizeof(*q->rb));
	q->rb_dirty = calloc(n, sizeof(*q->rb_dirty));
	if (!q->rt || !q->rb || !q->rb_dirty) {
		snprintf(err, errlen, "Could not allocate the reference count table");
		return -ENOMEM;
	}
	int ret = ioc__qcow2_pread(q, q->rt_off, q->rt, n * 8);
	if (ret < 0) {
		snprintf(err, errlen, "Could not read the reference count table");
		return ret;
	}
	for (uint64_t i = 0; i < n; i++)
		q->rt[i] = be64toh(q->rt[i]);
	q->free_hint = 1;
	return 0;
}

void ioc__qcow2_refcount_free(struct q2_state *q)
{
	for (uint64_t i = 0; q->rb && i < q->rt_entries; i++)
		free(q->rb[i]);
	free(q->rb);
	free(q->rb_dirty);
	free(q->rt);
	free(q->pending);
	free(q->grace);
	q->grace = NULL;
	q->rb = NULL;
	q->rt = NULL;
	q->pending = NULL;
}

/* The block of table index i, read if needed; NULL in *out when the
 * table has no block there (all refcounts zero). */
static int load_block(struct q2_state *q, uint64_t i, uint8_t **out)
{
	uint64_t off = q->rt[i] & Q2_RTE_OFFSET_MASK;
	uint64_t fsz = atomic_load_explicit(&q->file_size, memory_order_relaxed);
	int ret;

	*out = NULL;
	if (q->rb[i]) {
		*out = q->rb[i];
		return 0;
	}
	if (!off)
		return 0;
	if ((q->rt[i] & 0x1ff) || (off & (q->cs - 1)) || off < q->cs || off > fsz ||
	    fsz - off < q->cs)
		return -EIO;    /* a refcount block outside the image data */
	q->rb[i] = aligned_alloc(4096, (q->cs + 4095) & ~4095ull);
	if (!q->rb[i])
		return -ENOMEM;
	ret = ioc__qcow2_pread(q, off, q->rb[i], q->cs);
	if (ret < 0) {
		free(q->rb[i]);
		q->rb[i] = NULL;
		return ret;
	}
	*out = q->rb[i];
	return 0;
}

int ioc__qcow2_rc_get_cluster(struct q2_state *q, uint64_t cluster, uint64_t *rc)
{
	uint64_t i = cluster >> q->rb_bits;
	uint8_t *b;
	int ret;

	*rc = 0;
	if (i >= q->rt_entries)
		return 0;
	ret = load_block(q, i, &b);
	if (ret < 0 || !b)
		return ret;
	*rc = ioc__qcow2_rc_get(b, q->h.refcount_order, cluster & (rb_entries(q) - 1));
	return 0;
}

/*
 * The file covers [0, end).  It grows by a step (a sixteenth of its
 * size, 1 to 64 MiB), not by the cluster: one truncate for many
 * allocations, each of which would otherwise pay a thread pool round
 * trip with the lock held.  The rest of a step is a hole no refcount
 * counts (qemu-img check does not mind it; later allocations use it,
 * and qcow2.c writes only the data into a new cluster that is a hole).
 * A file that cannot grow that far grows to end.
 */
static int ensure_file(struct q2_state *q, uint64_t end)
{
	uint64_t fsz = atomic_load_explicit(&q->file_size, memory_order_relaxed);
	uint64_t step = fsz / 16, want;
	int ret;

	if (end <= fsz)
		return 0;
	if (step < (1u << 20))
		step = 1u << 20;
	if (step > (64u << 20))
		step = 64u << 20;
	want = (end + step - 1) / step * step;
	ret = ioc_node_co_truncate(q->file, want);
	if (ret < 0) {
		want = end;
		ret = ioc_node_co_truncate(q->file, end);
	}
	if (ret < 0)
		return ret;
	end = want;
	/* Relaxed: lockless readers that see an older size look again
	 * under the lock (qcow2.c, file_size()). */
	atomic_store_explicit(&q->file_size, end, memory_order_relaxed);
	return 0;
}

/* Clusters the driver must never place metadata in, whatever the
 * refcounts say (they are wrong if these read as free). */
static bool reserved_cluster(const struct q2_state *q, uint64_t c)
{
	uint64_t off = c << q->cluster_bits;

	if (c == 0)
		return true;
	if (off >= q->rt_off && off < q->rt_off + ((uint64_t)q->rt_clusters << q->cluster_bits))
		return true;
	if (q->l1_size && off + q->cs > q->l1_off && off < q->l1_off + (uint64_t)q->l1_size * 8)
		return true;
	return false;
}

static int write_rt_entry(struct q2_state *q, uint64_t i)
{
	uint64_t be = htobe64(q->rt[i]);

	return ioc__qcow2_pwrite(q, q->rt_off + i * 8, &be, 8);
}

/* A new block for table index i, in its own range and counting itself. */
static int alloc_block(struct q2_state *q, uint64_t i)
{
	uint64_t c = i << q->rb_bits, end = c + rb_entries(q);
	uint8_t *b;
	int ret;

	while (c < end && reserved_cluster(q, c))
		c++;
	if (c == end)
		return -EIO;
	b = aligned_alloc(4096, (q->cs + 4095) & ~4095ull);
	if (!b)
		return -ENOMEM;
	memset(b, 0, q->cs);
	ioc__qcow2_rc_set(b, q->h.refcount_order, c & (rb_entries(q) - 1), 1);
	ret = ensure_file(q, (c + 1) << q->cluster_bits);
	/* The block on disk and flushed before the table points at it. */
	if (ret == 0)
		ret = ioc__qcow2_pwrite(q, c << q->cluster_bits, b, q->cs);
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret < 0) {
		free(b);
		return ret;
	}
	q->rt[i] = c << q->cluster_bits;
	ret = write_rt_entry(q, i);
	if (ret < 0) {
		q->rt[i] = 0;
		free(b);
		return ret;
	}
	q->rb[i] = b;
	q->rb_dirty[i] = false;
	if (q->free_hint == c)
		q->free_hint = c + 1;
	return 0;
}

/* A bigger table covering index need, with its blocks, past everything
 * the old table covers and the file's end. */
static int grow_table(struct q2_state *q, uint64_t need)
{
	uint64_t per_cluster = q->cs / 8, rbe = rb_entries(q);
	uint64_t fsz = atomic_load_explicit(&q->file_size, memory_order_relaxed);
	uint64_t start = (fsz + q->cs - 1) >> q->cluster_bits;
	uint64_t new_entries, new_clusters, nb = 1, start_idx;
	uint64_t *nrt = NULL;
	uint8_t **nrb = NULL, *blocks = NULL;
	bool *ndirty = NULL;
	uint8_t hdr[12];
	int ret = -ENOMEM;

	if (start < q->rt_entries * rbe)
		start = q->rt_entries * rbe;
	start = (start + rbe - 1) & ~(rbe - 1);
	start_idx = start / rbe;
	for (;;) {
		uint64_t want = need + 1;

		if (want < start_idx + nb)
			want = start_idx + nb;
		if (want < q->rt_entries + q->rt_entries / 2)
			want = q->rt_entries + q->rt_entries / 2;
		new_clusters = (want + per_cluster - 1) / per_cluster;
		new_entries = new_clusters * per_cluster;
		if (new_entries * 8 > Q2_MAX_REFTABLE_BYTES)
			return -EFBIG;
		if (nb * rbe >= nb + new_clusters && start_idx + nb <= new_entries)
			break;
		nb++;
	}
	nrt = calloc(new_entries, 8);
	nrb = calloc(new_entries, sizeof(*nrb));
	ndirty = calloc(new_entries, sizeof(*ndirty));
	blocks = aligned_alloc(4096, ((nb + new_clusters) * q->cs + 4095) & ~4095ull);
	if (!nrt || !nrb || !ndirty || !blocks)
		goto fail;
	memset(blocks, 0, (nb + new_clusters) * q->cs);
	for (uint64_t c = 0; c < nb + new_clusters; c++)
		ioc__qcow2_rc_set(blocks + (c / rbe) * q->cs, q->h.refcount_order, c % rbe, 1);
	memcpy(nrt, q->rt, q->rt_entries * 8);
	for (uint64_t j = 0; j < nb; j++)
		nrt[start_idx + j] = (start + j) << q->cluster_bits;
	/* The table itself, big-endian, after the blocks. */
	uint8_t *tab = blocks + nb * q->cs;
	for (uint64_t j = 0; j < new_entries; j++) {
		uint64_t be = htobe64(nrt[j]);

		memcpy(tab + j * 8, &be, 8);
	}
	ret = ensure_file(q, (start + nb + new_clusters) << q->cluster_bits);
	if (ret == 0)
		ret = ioc__qcow2_pwrite(q, start << q->cluster_bits, blocks,
					(nb + new_clusters) * q->cs);
	if (ret == 0)
		ret = ioc__qcow2_write_refblocks(q, false);
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret < 0)
		goto fail;
	{
		uint64_t be_off = htobe64((start + nb) << q->cluster_bits);
		uint32_t be_cl = htobe32((uint32_t)new_clusters);

		memcpy(hdr, &be_off, 8);
		memcpy(hdr + 8, &be_cl, 4);
	}
	ret = ioc__qcow2_pwrite(q, Q2_OFF_REFTABLE, hdr, sizeof(hdr));
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret < 0)
		goto fail;

	uint64_t old_off = q->rt_off, old_clusters = q->rt_clusters;

	memcpy(nrb, q->rb, q->rt_entries * sizeof(*nrb));
	memcpy(ndirty, q->rb_dirty, q->rt_entries * sizeof(*ndirty));
	for (uint64_t j = 0; j < nb; j++) {
		nrb[start_idx + j] = aligned_alloc(4096, (q->cs + 4095) & ~4095ull);
		if (nrb[start_idx + j])
			memcpy(nrb[start_idx + j], blocks + j * q->cs, q->cs);
	}
	free(q->rt);
	free(q->rb);
	free(q->rb_dirty);
	q->rt = nrt;
	q->rb = nrb;
	q->rb_dirty = ndirty;
	q->rt_entries = new_entries;
	q->rt_clusters = (uint32_t)new_clusters;
	q->rt_off = (start + nb) << q->cluster_bits;
	free(blocks);
	/* The old table's clusters are free once the header is durable
	 * (it is: flushed above). */
	return ioc__qcow2_defer_free(q, old_off, old_clusters << q->cluster_bits);
fail:
	free(nrt);
	free(nrb);
	free(ndirty);
	free(blocks);
	return ret;
}

/* The block for cluster c exists (allocated or grown as needed). */
static int ensure_block(struct q2_state *q, uint64_t c, uint8_t **out)
{
	uint64_t i = c >> q->rb_bits;
	int ret;

	if (i >= q->rt_entries) {
		ret = grow_table(q, i);
		if (ret < 0)
			return ret;
	}
	ret = load_block(q, i, out);
	if (ret < 0 || *out)
		return ret;
	ret = alloc_block(q, i);
	if (ret < 0)
		return ret;
	*out = q->rb[i];
	return 0;
}

static int rc_add(struct q2_state *q, uint64_t c, int64_t delta, bool *now_free)
{
	uint8_t *b;
	uint64_t v;
	int ret = ensure_block(q, c, &b);

	if (ret < 0)
		return ret;
	v = ioc__qcow2_rc_get(b, q->h.refcount_order, c & (rb_entries(q) - 1));
	if ((delta < 0 && v < (uint64_t)-delta) || (delta > 0 && q->rc_max - v < (uint64_t)delta))
		return -EIO;    /* underflow (corrupt) or overflow */
	v += (uint64_t)delta;
	ioc__qcow2_rc_set(b, q->h.refcount_order, c & (rb_entries(q) - 1), v);
	q->rb_dirty[c >> q->rb_bits] = true;
	if (now_free)
		*now_free = v == 0;
	return 0;
}

int ioc__qcow2_alloc_cluster(struct q2_state *q, uint64_t *host)
{
	for (;;) {
		uint64_t c = q->free_hint, rc = 1;
		uint8_t *b;
		int ret;

		/* The first cluster with refcount zero. */
		for (;; c++) {
			if (reserved_cluster(q, c))
				continue;
			ret = ioc__qcow2_rc_get_cluster(q, c, &rc);
			if (ret < 0)
				return ret;
			if (rc == 0)
				break;
		}
		q->free_hint = c;
		/* Its block may have to be made first, and may land on c:
		 * then look again. */
		uint64_t i = c >> q->rb_bits;

		if (i >= q->rt_entries || !(q->rt[i] & Q2_RTE_OFFSET_MASK)) {
			ret = ensure_block(q, c, &b);
			if (ret < 0)
				return ret;
			continue;
		}
		ret = ensure_file(q, (c + 1) << q->cluster_bits);
		if (ret == 0)
			ret = rc_add(q, c, 1, NULL);
		if (ret < 0)
			return ret;
		q->free_hint = c + 1;
		*host = c << q->cluster_bits;
		return 0;
	}
}

int ioc__qcow2_defer_free(struct q2_state *q, uint64_t off, uint64_t len)
{
	uint64_t first = off >> q->cluster_bits;
	uint64_t last = (off + len - 1) >> q->cluster_bits;

	if (!len)
		return 0;
	for (uint64_t c = first; c <= last; c++) {
		if (q->npending == q->cap_pending) {
			uint64_t *p = ioc__array_grow(q->pending, &q->cap_pending,
						      q->npending + 1, 64, sizeof(*p));

			if (!p)
				return -ENOMEM;
			q->pending = p;
		}
		q->pending[q->npending++] = c;
	}
	return 0;
}

int ioc__qcow2_write_refblocks(struct q2_state *q, bool flush)
{
	bool any = false;
	int ret;

	for (uint64_t i = 0; i < q->rt_entries; i++) {
		if (!q->rb_dirty[i])
			continue;
		ret = ioc__qcow2_pwrite(q, q->rt[i] & Q2_RTE_OFFSET_MASK, q->rb[i], q->cs);
		if (ret < 0)
			return ret;
		q->rb_dirty[i] = false;
		any = true;
	}
	if (any && flush)
		return ioc__qcow2_flush_file(q);
	return 0;
}

static int apply_frees(struct q2_state *q)
{
	size_t n = q->ngrace;
	uint64_t *freed = q->grace;
	int ret = 0;

	q->grace = NULL;
	q->ngrace = 0;
	for (size_t i = 0; i < n && ret == 0; i++) {
		bool now_free = false;

		ret = rc_add(q, freed[i], -1, &now_free);
		if (ret == 0 && now_free) {
			if (freed[i] < q->free_hint)
				q->free_hint = freed[i];
			if (q->pass_discard)
				(void)ioc_node_co_discard(q->file, freed[i] << q->cluster_bits, q->cs,
							  0);
		}
	}
	free(freed);
	/* Written now, durable with the next flush: a decrement lost in a
	 * crash is a leak, never a cluster with two owners. */
	if (ret == 0)
		ret = ioc__qcow2_write_refblocks(q, false);
	return ret;
}

int ioc__qcow2_writeback(struct q2_state *q, bool flush)
{
	bool flushed = false, rb_dirty = false, l2_dirty = false;
	int ret;

	for (uint64_t i = 0; i < q->rt_entries && !rb_dirty; i++)
		rb_dirty = q->rb_dirty[i];
	for (unsigned i = 0; i < q->cache.nslots && !l2_dirty; i++)
		l2_dirty = q->cache.slots[i].dirty;
	/* 1. Refcount increases, durable before any L2 entry that needs
	 * them.  Lazy refcounts: after the L2 slices, unordered, and only
	 * when asked to flush (the image is marked dirty while open). */
	if (rb_dirty && !q->lazy) {
		ret = ioc__qcow2_write_refblocks(q, true);
		if (ret < 0)
			return ret;
		flushed = true;
	}
	/* 2. L2 slices, after the data they point to (written and
	 * completed before an entry changed in memory) is flushed. */
	if (l2_dirty) {
		if (!flushed) {
			ret = ioc__qcow2_flush_file(q);
			if (ret < 0)
				return ret;
		}
		for (unsigned i = 0; i < q->cache.nslots; i++) {
			struct q2_slice *s = &q->cache.slots[i];

			if (!s->dirty)
				continue;
			ret = ioc__qcow2_pwrite(q, atomic_load_explicit(&s->key,
									memory_order_relaxed),
						s->data, q->cache.slice_bytes);
			if (ret < 0)
				return ret;
			s->dirty = false;
		}
		flushed = false;
	}
	if (q->lazy && rb_dirty && flush) {
		ret = ioc__qcow2_write_refblocks(q, false);
		if (ret < 0)
			return ret;
	}
	if (!flushed && (l2_dirty || flush || q->npending)) {
		ret = ioc__qcow2_flush_file(q);
		if (ret < 0)
			return ret;
	}
	/* 3. Decrements: nothing on disk points at these clusters now;
	 * once no lockless request that may still use them is running
	 * (qcow2.c, "In-flight requests"), they go. */
	if (q->ngrace && ioc__qcow2_drained(q, q->grace_parity)) {
		ret = apply_frees(q);
		if (ret < 0)
			return ret;
	}
	if (!q->ngrace && q->npending) {
		q->grace = q->pending;
		q->ngrace = q->npending;
		q->pending = NULL;
		q->npending = q->cap_pending = 0;
		q->grace_parity = ioc__qcow2_flip(q);
		if (ioc__qcow2_drained(q, q->grace_parity)) {
			ret = apply_frees(q);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}
