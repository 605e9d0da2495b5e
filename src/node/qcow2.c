/*
 * The "qcow2" driver: QEMU's format (docs/interop/qcow2.txt) over a file.
 *
 * Problem: serve reads from coroutines on several loops at once without
 * a global lock, allocate on write so that no crash leaves an L2 entry
 * pointing at garbage or at a cluster someone else owns, and never touch
 * an internal snapshot's clusters (refcount > 1).
 *
 * Design.  The geometry and header are fixed after open and read freely;
 * the active L1 table is an array of atomics; L2 tables come through a
 * slice cache whose hits take no lock (qcow2-cache.c).  One coroutine
 * mutex covers metadata changes and cache misses: a read takes it only
 * on a miss, a write only to allocate (a cluster this image owns alone,
 * COPIED, is written in place without it).  An allocating write takes
 * it to allocate and record its guest cluster as in flight, drops it to
 * read the untouched part through the old mapping (copy-on-write is the
 * read path, once) and write the data, and takes it again to change the
 * L2 entry; other changes to that guest cluster wait for the record.
 *
 * Crash ordering, kept by every change:
 *  1. data before the L2 entry: an entry changes in memory only after
 *     its data write completed, and writeback flushes before it writes
 *     L2 slices;
 *  2. refcount increase before the L2 entry: refcount blocks are written
 *     and flushed first (lazy-refcounts: unordered, the image is marked
 *     dirty while open, and a writable open of a dirty image counts its
 *     refcounts again, qcow2-check.c);
 *  3. L2 before L1: a new table (zeroed, or copied from a shared one) is
 *     written and flushed with its refcount before its L1 entry;
 *  4. L2 entry removal before the refcount decrease: dropped clusters are
 *     decremented after the slices that dropped them are flushed, so none
 *     is reused while an entry on disk points at it;
 *  5. a refcount block before the table entry naming it, a new refcount
 *     table before the header naming it (qcow2-refcount.c).
 * A guest flush (and FUA) runs the writeback: all of it is durable after.
 *
 * Rejected: writethrough metadata (a flush per allocation); in-flight
 * records by byte range: one per cluster is simpler, and only writes
 * into the same cluster wait.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node-int.h"
#include "qcow2.h"
#include "util/iov.h"

#define Q2_DEFAULT_L2_CACHE_MAX (32ull << 20)
#define Q2_DEFAULT_CLEAN_INTERVAL 600
#define Q2_MIN_SLOTS 8
#define Q2_MAX_SLOTS (1u << 20)
#define Q2_MAX_DIR (8u << 20)

static const struct ioc__qmp_arg qcow2_opts[] = {
	{ "file", IOC_QMP_REF, false },
	{ "backing", IOC_QMP_REF, true },
	{ "lazy-refcounts", IOC_QMP_BOOL, true },
	{ "pass-discard-request", IOC_QMP_BOOL, true },
	{ "pass-discard-snapshot", IOC_QMP_BOOL, true },
	{ "pass-discard-other", IOC_QMP_BOOL, true },
	{ "cache-size", IOC_QMP_SIZE, true },
	{ "l2-cache-size", IOC_QMP_SIZE, true },
	{ "l2-cache-entry-size", IOC_QMP_SIZE, true },
	{ "refcount-cache-size", IOC_QMP_SIZE, true },
	{ "cache-clean-interval", IOC_QMP_INT, true, 0, UINT32_MAX },
	{ NULL },
};

/* ---- child I/O ---------------------------------------------------------- */

int ioc__qcow2_pread(struct q2_state *q, uint64_t off, void *buf, size_t len)
{
	return ioc_node_co_pread(q->file, off, buf, len, 0);
}

int ioc__qcow2_pwrite(struct q2_state *q, uint64_t off, const void *buf, size_t len)
{
	return ioc_node_co_pwrite(q->file, off, buf, len, 0);
}

int ioc__qcow2_flush_file(struct q2_state *q)
{
	return ioc_node_co_flush(q->file, 0);
}

int ioc__qcow2_header_put64(struct q2_state *q, uint64_t off, uint64_t *field, uint64_t v)
{
	uint64_t be = htobe64(v);
	int ret = ioc__qcow2_pwrite(q, off, &be, 8);

	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret == 0)
		*field = v;
	return ret;
}

/* Relaxed: the size only grows, under the lock; a stale one makes an
 * entry past the old end look damaged, and map_run() then looks again
 * under the lock, where it is current. */
static uint64_t file_size(struct q2_state *q)
{
	return atomic_load_explicit(&q->file_size, memory_order_relaxed);
}

static struct q2_geom geom(struct q2_state *q)
{
	struct q2_geom g = q->geom;

	g.file_size = file_size(q);
	return g;
}

/* ---- iovecs --------------------------------------------------------------- */

/* The part [skip, skip+len) of iov as a new vector (malloc'd). */
static struct iovec *iov_part(const struct iovec *iov, int cnt, size_t skip, size_t len,
			      int *outcnt)
{
	struct iovec *o = malloc((size_t)(cnt ? cnt : 1) * sizeof(*o));
	int n = 0, i = 0;

	if (!o)
		return NULL;
	while (ioc__iov_piece(iov, cnt, &i, &skip, &len, &o[n]))
		n++;
	*outcnt = n;
	return o;
}

/* Copy between iov[skip..] and buf (to_iov: into the vector). */
static void iov_copy(const struct iovec *iov, int cnt, size_t skip, void *buf, size_t len,
		     bool to_iov)
{
	char *b = buf;
	struct iovec p;
	int i = 0;

	while (ioc__iov_piece(iov, cnt, &i, &skip, &len, &p)) {
		if (to_iov)
			memcpy(p.iov_base, b, p.iov_len);
		else
			memcpy(b, p.iov_base, p.iov_len);
		b += p.iov_len;
	}
}

static void iov_zero(const struct iovec *iov, int cnt, size_t skip, size_t len)
{
	struct iovec p;
	int i = 0;

	while (ioc__iov_piece(iov, cnt, &i, &skip, &len, &p))
		memset(p.iov_base, 0, p.iov_len);
}

typedef int ioc_coroutine_fn child_io_fn(struct ioc_node *n, uint64_t off,
					 const struct iovec *iov, int iovcnt, uint32_t flags);

static int child_io(child_io_fn *fn, struct ioc_node *c, uint64_t off,
		    const struct iovec *iov, int cnt, size_t skip, size_t len, uint32_t flags)
{
	int n, ret;
	struct iovec *p = iov_part(iov, cnt, skip, len, &n);

	if (!p)
		return -ENOMEM;
	ret = fn(c, off, p, n, flags);
	free(p);
	return ret;
}

/* ---- in-flight requests ------------------------------------------------------ */

/*
 * A read, or a write in place, maps without the lock and then does its
 * I/O: a cluster it mapped may be dropped meanwhile (a discard, a
 * copy-on-write), and must not be freed and reused until that I/O is
 * done.  Such requests count themselves in a shard of two counter sets,
 * picked by the epoch's parity when they enter; freeing (writeback, lock
 * held) flips the epoch after the entries dropping the clusters changed,
 * and frees once the old parity's counters are all zero, which it checks
 * at each writeback and never waits for (SRCU's two counter sets).  A
 * request that entered after the check maps after the entries changed
 * (the fences below), so it cannot use a freed cluster.  Cost per
 * request: an atomic add and sub on this thread's shard and a fence.
 */
static unsigned my_shard(void)
{
	static _Atomic unsigned next;
	static _Thread_local unsigned shard = UINT32_MAX;

	if (shard == UINT32_MAX)
		shard = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) % Q2_SHARDS;
	return shard;
}

struct q2_ticket {
	unsigned parity, shard;
};

static struct q2_ticket enter_io(struct q2_state *q)
{
	struct q2_ticket t = { atomic_load(&q->epoch) & 1, my_shard() };

	atomic_fetch_add_explicit(&q->inflight[t.parity][t.shard].n, 1, memory_order_seq_cst);
	/* Pairs with the fence in ioc__qcow2_drained(): our count is seen
	 * there, or our lookups see the changed entries. */
	atomic_thread_fence(memory_order_seq_cst);
	return t;
}

static void leave_io(struct q2_state *q, struct q2_ticket t)
{
	/* Release: the I/O is done before a drained() that sees zero. */
	atomic_fetch_sub_explicit(&q->inflight[t.parity][t.shard].n, 1, memory_order_release);
}

unsigned ioc__qcow2_flip(struct q2_state *q)
{
	return atomic_fetch_add(&q->epoch, 1) & 1;
}

bool ioc__qcow2_drained(struct q2_state *q, unsigned p)
{
	long sum = 0;

	/* Pairs with the fence in enter_io(). */
	atomic_thread_fence(memory_order_seq_cst);
	for (unsigned i = 0; i < Q2_SHARDS; i++)
		sum += atomic_load_explicit(&q->inflight[p][i].n, memory_order_acquire);
	return sum == 0;
}

/* ---- L2 lookups ------------------------------------------------------------ */

static size_t slices_per_table(const struct q2_state *q)
{
	return (size_t)1 << (q->l2_bits - q->slice_bits);
}

static uint64_t load_word(const struct q2_slice *s, size_t i, int mo)
{
	return be64toh(__atomic_load_n(&s->data[i], mo));
}

static void store_word(struct q2_slice *s, size_t i, uint64_t v, int mo)
{
	__atomic_store_n(&s->data[i], htobe64(v), mo);
}

/* Entry i of a slice: the entry, and the bitmap with extended L2.  The
 * bitmap is loaded first: see store_entry() for the order. */
static void load_entry(const struct q2_state *q, const struct q2_slice *s, size_t i,
		       uint64_t *e, uint64_t *bm)
{
	if (q->words == 2) {
		/* Pairs with the release store of the bitmap in store_entry(). */
		*bm = load_word(s, 2 * i + 1, __ATOMIC_ACQUIRE);
		*e = load_word(s, 2 * i, __ATOMIC_RELAXED);
	} else {
		*bm = 0;
		*e = load_word(s, i, __ATOMIC_ACQUIRE);
	}
}

/* Lock held.  A reader sees an entry and bitmap that belong together,
 * or a pair decode_l2e() refuses (then it retries under the lock): an
 * entry gaining subclusters stores the entry first, an entry losing
 * them stores the bitmap first. */
static void store_entry(struct q2_state *q, struct q2_slice *s, size_t i, uint64_t e,
			uint64_t bm, bool gaining)
{
	if (q->words == 2) {
		if (gaining) {
			store_word(s, 2 * i, e, __ATOMIC_RELAXED);
			store_word(s, 2 * i + 1, bm, __ATOMIC_RELEASE);
		} else {
			store_word(s, 2 * i + 1, bm, __ATOMIC_RELEASE);
			store_word(s, 2 * i, e, __ATOMIC_RELEASE);
		}
	} else {
		store_word(s, i, e, __ATOMIC_RELEASE);
	}
	s->dirty = true;
}

/* Lock held: the slice (d, key) from the cache or the file, pinned. */
static int load_slice(struct q2_state *q, size_t d, uint64_t key, struct q2_slice **out)
{
	struct q2_slice *s = ioc__qcow2_cache_lookup(&q->cache, d, key);
	int ret;

	if (s) {
		*out = s;
		return 0;
	}
	ioc__qcow2_cache_clean(&q->cache, (uint64_t)ioc_now_ns(), false);
	s = ioc__qcow2_cache_claim(&q->cache);
	if (!s) {
		/* Every slot dirty: write them back and take a clean one. */
		ret = ioc__qcow2_writeback(q, false);
		if (ret < 0)
			return ret;
		s = ioc__qcow2_cache_claim(&q->cache);
		if (!s)
			return -ENOMEM;
	}
	ret = ioc__qcow2_pread(q, key, s->data, q->cache.slice_bytes);
	if (ret < 0) {
		ioc__qcow2_cache_abandon(s);
		return ret;
	}
	ioc__qcow2_cache_publish(&q->cache, s, d, key);
	*out = s;
	return 0;
}

/* A run of guest bytes with one kind of mapping. */
struct q2_run {
	enum q2_kind kind;
	uint64_t host;          /* Q2_DATA: the host offset of the run's start */
	uint64_t len;
	uint64_t l2e;           /* Q2_COMPRESSED: the entry */
	bool writable;          /* Q2_DATA: owned alone (COPIED), write in place */
};

/*
 * The mapping of [off, off+max) from its start, as far as it stays one
 * kind (and, for data, contiguous on the host) within one L2 slice.
 * Without the lock on a hit; a miss (and an entry that looks torn, see
 * store_entry()) goes again under the lock.
 */
static int map_run(struct q2_state *q, uint64_t off, uint64_t max, bool locked,
		   struct q2_run *r)
{
	unsigned cb = q->cluster_bits;
	uint64_t gidx = off >> cb, l1i = gidx >> q->l2_bits;
	uint64_t unit = 1ull << q->sub_bits, l1e, l2off, end, pos;
	struct q2_geom g;
	struct q2_slice *s;
	bool took = false;
	int ret = 0;

	memset(r, 0, sizeof(*r));
	if (l1i >= q->l1_size)
		return -EIO;
again:
	/* The file's size as of now: an entry stored after it was loaded
	 * may point past it, and then looks damaged; that goes again under
	 * the lock below, where the size is current. */
	g = geom(q);
	/* Pairs with the release store in l2_prepare(). */
	l1e = atomic_load_explicit(&q->l1[l1i], memory_order_acquire);
	l2off = l1e & Q2_L1E_OFFSET_MASK;
	if (!l2off) {
		uint64_t cover = (l1i + 1) << (q->l2_bits + cb);

		r->kind = Q2_UNALLOC;
		r->len = cover - off < max ? cover - off : max;
		goto out;
	}
	if (ioc__qcow2_check_l1e(&g, l1e, NULL, 0) < 0) {
		ret = -EIO;
		goto out;
	}
	uint64_t ti = gidx & ((1ull << q->l2_bits) - 1);
	uint64_t sl = ti >> q->slice_bits;
	size_t d = (size_t)(l1i * slices_per_table(q) + sl);
	uint64_t key = l2off + sl * q->cache.slice_bytes;
	uint64_t slice_end = ((l1i << q->l2_bits) + ((sl + 1) << q->slice_bits)) << cb;

	s = ioc__qcow2_cache_lookup(&q->cache, d, key);
	if (!s) {
		if (!locked && !took) {
			ioc_co_mutex_lock(&q->lock);
			took = true;
			goto again;     /* the L1 entry may have moved meanwhile */
		}
		ret = load_slice(q, d, key, &s);
		if (ret < 0)
			goto out;
	}
	end = off + max < slice_end ? off + max : slice_end;
	for (pos = off; pos < end;) {
		uint64_t c = pos >> cb, e, bm, host;
		size_t i = (size_t)(c & ((1ull << q->slice_bits) - 1));
		unsigned sc = (unsigned)((pos & (q->cs - 1)) >> q->sub_bits);
		uint64_t unit_end = (pos | (unit - 1)) + 1, step;
		enum q2_kind k;

		if (unit_end > end)
			unit_end = end;
		step = unit_end - pos;
		load_entry(q, s, i, &e, &bm);
		ret = ioc__qcow2_decode_l2e(&g, e, bm, sc, &k, &host, NULL, 0);
		if (ret < 0)
			break;
		if (pos == off) {
			r->kind = k;
			if (k == Q2_COMPRESSED) {
				uint64_t cend = (c + 1) << cb;

				r->l2e = e;
				r->len = (cend < end ? cend : end) - off;
				break;
			}
			if (k == Q2_DATA) {
				r->host = host + (pos & (q->cs - 1));
				r->writable = (l1e & Q2_OFLAG_COPIED) && (e & Q2_OFLAG_COPIED);
			}
		} else {
			bool w = (l1e & Q2_OFLAG_COPIED) && (e & Q2_OFLAG_COPIED);

			if (k != r->kind)
				break;
			if (k == Q2_DATA && (host + (pos & (q->cs - 1)) != r->host + r->len ||
					     w != r->writable))
				break;
		}
		r->len += step;
		pos = unit_end;
	}
	ioc__qcow2_cache_unpin(s);
	if (ret < 0 && !locked && !took) {
		/* Maybe a torn pair: look again with writers excluded. */
		ioc_co_mutex_lock(&q->lock);
		took = true;
		ret = 0;
		memset(r, 0, sizeof(*r));
		goto again;
	}
out:
	if (took)
		ioc_co_mutex_unlock(&q->lock);
	if (ret == 0 && r->len == 0)
		ret = -EIO;
	return ret;
}

/* ---- reads ---------------------------------------------------------------- */

static int read_compressed(struct q2_state *q, const struct q2_run *r, uint64_t off,
			   const struct iovec *iov, int cnt, size_t skip)
{
	struct q2_geom g = geom(q);
	uint64_t coff, clen;
	uint8_t *in = NULL, *out = NULL;
	int ret = ioc__qcow2_compressed_extent(&g, r->l2e, &coff, &clen, NULL, 0);

	if (ret < 0)
		return ret;
	in = malloc(clen);
	out = malloc(q->cs);
	ret = -ENOMEM;
	if (!in || !out)
		goto out;
	ret = ioc__qcow2_pread(q, coff, in, clen);
	if (ret < 0)
		goto out;
	ret = ioc__qcow2_decompress(q->h.compression, in, clen, out, q->cs);
	if (ret < 0)
		goto out;
	iov_copy(iov, cnt, skip, out + (off & (q->cs - 1)), r->len, true);
out:
	free(in);
	free(out);
	return ret;
}

static int read_backing(struct q2_state *q, uint64_t off, uint64_t len,
			const struct iovec *iov, int cnt, size_t skip)
{
	uint64_t bsize = q->backing ? q->backing->size : 0, have = 0;
	int ret = 0;

	if (off < bsize)
		have = bsize - off < len ? bsize - off : len;
	if (have)
		ret = child_io(ioc_node_co_preadv, q->backing, off, iov, cnt, skip, have, 0);
	if (ret == 0 && have < len)
		iov_zero(iov, cnt, skip + have, len - have);
	return ret;
}

/* Read [off, off+len) into iov from skip; locked: the caller holds the
 * mutex (a copy-on-write reading the old contents). */
static int read_range(struct q2_state *q, uint64_t off, uint64_t len, const struct iovec *iov,
		      int cnt, size_t skip, bool locked)
{
	while (len) {
		struct q2_run r;
		int ret = map_run(q, off, len, locked, &r);

		if (ret < 0)
			return ret;
		switch (r.kind) {
		case Q2_DATA: {
			uint64_t fsz = file_size(q), have = 0;

			if (r.host < fsz)
				have = fsz - r.host < r.len ? fsz - r.host : r.len;
			if (have)
				ret = child_io(ioc_node_co_preadv, q->file, r.host, iov, cnt, skip,
					       have, 0);
			if (ret == 0 && have < r.len)   /* past the file's end: zeroes */
				iov_zero(iov, cnt, skip + have, r.len - have);
			break;
		}
		case Q2_ZERO:
			iov_zero(iov, cnt, skip, r.len);
			break;
		case Q2_UNALLOC:
			ret = read_backing(q, off, r.len, iov, cnt, skip);
			break;
		case Q2_COMPRESSED:
			ret = read_compressed(q, &r, off, iov, cnt, skip);
			break;
		}
		if (ret < 0)
			return ret;
		off += r.len;
		skip += r.len;
		len -= r.len;
	}
	return 0;
}

static int ioc_coroutine_fn q2_preadv(struct ioc_node *n, uint64_t off,
				      const struct iovec *iov, int iovcnt, uint32_t flags)
{
	struct q2_state *q = n->opaque;
	struct q2_ticket t = enter_io(q);
	size_t len = 0;
	int ret;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	ret = read_range(q, off, len, iov, iovcnt, 0, false);
	leave_io(q, t);
	return ret;
}

/* ---- allocation ------------------------------------------------------------ */

static int write_l1_entry(struct q2_state *q, uint64_t l1i, uint64_t v)
{
	uint64_t be = htobe64(v);

	return ioc__qcow2_pwrite(q, q->l1_off + l1i * 8, &be, 8);
}

/*
 * Lock held: the slice holding guest cluster gidx's entry, pinned, in a
 * table this image owns alone; *idx its index in the slice.  A missing
 * table is made (zeroed), a shared one (an internal snapshot's) copied.
 */
static int l2_prepare(struct q2_state *q, uint64_t gidx, struct q2_slice **out, size_t *idx)
{
	uint64_t l1i = gidx >> q->l2_bits;
	uint64_t l1e = atomic_load_explicit(&q->l1[l1i], memory_order_relaxed);
	uint64_t old = l1e & Q2_L1E_OFFSET_MASK;
	struct q2_geom g = geom(q);
	int ret;

	if (l1i >= q->l1_size)
		return -EIO;
	if (old && ioc__qcow2_check_l1e(&g, l1e, NULL, 0) < 0)
		return -EIO;
	if (!old || !(l1e & Q2_OFLAG_COPIED)) {
		uint64_t nt;
		uint8_t *t = aligned_alloc(4096, (q->cs + 4095) & ~4095ull);

		if (!t)
			return -ENOMEM;
		ret = ioc__qcow2_alloc_cluster(q, &nt);
		if (ret == 0) {
			if (old)
				ret = ioc__qcow2_pread(q, old, t, q->cs);
			else
				memset(t, 0, q->cs);
		}
		/* Rule 3: the table and its refcount durable before L1. */
		if (ret == 0)
			ret = ioc__qcow2_pwrite(q, nt, t, q->cs);
		if (ret == 0)
			ret = ioc__qcow2_write_refblocks(q, false);
		if (ret == 0)
			ret = ioc__qcow2_flush_file(q);
		if (ret == 0)
			ret = write_l1_entry(q, l1i, nt | Q2_OFLAG_COPIED);
		free(t);
		if (ret < 0)
			return ret;
		for (size_t k = 0; k < slices_per_table(q); k++)
			ioc__qcow2_cache_forget(&q->cache, l1i * slices_per_table(q) + k);
		/* Pairs with the acquire load in map_run(). */
		atomic_store_explicit(&q->l1[l1i], nt | Q2_OFLAG_COPIED, memory_order_release);
		if (old) {
			ret = ioc__qcow2_defer_free(q, old, q->cs);
			if (ret < 0)
				return ret;
		}
		l1e = nt | Q2_OFLAG_COPIED;
	}
	uint64_t ti = gidx & ((1ull << q->l2_bits) - 1);
	uint64_t sl = ti >> q->slice_bits;

	*idx = (size_t)(ti & ((1ull << q->slice_bits) - 1));
	return load_slice(q, (size_t)(l1i * slices_per_table(q) + sl),
			  (l1e & Q2_L1E_OFFSET_MASK) + sl * q->cache.slice_bytes, out);
}

/* Lock held: queue the host clusters an entry held for a decrement. */
static int drop_entry(struct q2_state *q, uint64_t e)
{
	struct q2_geom g = geom(q);

	if (e & Q2_OFLAG_COMPRESSED) {
		uint64_t coff, clen;
		int ret = ioc__qcow2_compressed_extent(&g, e, &coff, &clen, NULL, 0);

		return ret < 0 ? ret : ioc__qcow2_defer_free(q, coff, clen);
	}
	if (e & Q2_L2E_OFFSET_MASK)
		return ioc__qcow2_defer_free(q, e & Q2_L2E_OFFSET_MASK, q->cs);
	return 0;
}

static uint32_t sc_mask(unsigned first, unsigned last)
{
	return (uint32_t)((last >= 31 ? 0xffffffffu : ((1u << (last + 1)) - 1)) &
			  ~((1u << first) - 1));
}

/*
 * In-flight allocations.  An allocating write records its guest cluster
 * here (lock held) before it drops the lock for its data write, and
 * removes it once the L2 entry changed; every other change to that
 * cluster's entry (another allocating write, zeroing, discard) waits for
 * the record to go first, so the entry a write read before its data
 * write is the entry it replaces after it.  The records live on the
 * writers' stacks; the list is as long as the allocating writes in
 * flight (a queue depth), so a linear scan.
 *
 * Sleep and wake: a waiter finds the record and queues itself on it with
 * the lock held (ioc_co_queue_wait() drops it only once queued); the
 * owner unlinks the record and wakes its queue with the lock held too.
 * So a waiter either finds no record or is on the queue before the
 * owner wakes it: no wake-up is lost.  A woken waiter looks again (a
 * new record for the cluster may exist by then).
 */
struct q2_alloc {
	uint64_t gidx;
	struct q2_alloc *next;
	struct ioc_co_queue waiters;   /* lock held */
};

/* Lock held: until no allocation of guest cluster gidx is in flight. */
static void wait_allocs(struct q2_state *q, uint64_t gidx)
{
	for (;;) {
		struct q2_alloc *a = q->allocs;

		while (a && a->gidx != gidx)
			a = a->next;
		if (!a)
			return;
		/* Drops the lock while waiting; a is gone when this returns
		 * (its owner removed it and woke us, then returned). */
		ioc_co_queue_wait(&a->waiters, &q->lock);
	}
}

static void alloc_begin(struct q2_state *q, struct q2_alloc *a, uint64_t gidx)
{
	a->gidx = gidx;
	ioc_co_queue_init(&a->waiters);
	a->next = q->allocs;
	q->allocs = a;
}

static void alloc_end(struct q2_state *q, struct q2_alloc *a)
{
	struct q2_alloc **pp = &q->allocs;

	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	/* Lock held: the waiters resume once we drop it. */
	ioc_co_queue_restart_all(&a->waiters);
}

static bool is_zero(const uint8_t *p, size_t n)
{
	if (n < 16)
		return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
	for (int i = 0; i < 16; i++)
		if (p[i])
			return false;
	return memcmp(p, p + 16, n - 16) == 0;
}

/*
 * Whether writing only the data of a new cluster is enough: the copied
 * parts of buf (covering [cov_start, cov_end) of the cluster, the data
 * at [da, db) of buf) are zeroes and the host cluster already reads as
 * zeroes (a hole, typically the file's fresh end: a truncate made it).
 * The file decides the latter (SEEK_DATA for a file, data for a device).
 */
static bool fresh_zero(struct q2_state *q, uint64_t target, const uint8_t *buf, uint64_t da,
		       uint64_t db, uint64_t cov_start, uint64_t cov_end)
{
	uint64_t len = cov_end - cov_start, pnum = 0;
	int st;

	if (!is_zero(buf, da) || !is_zero(buf + db, len - db))
		return false;
	st = ioc_node_co_block_status(q->file, target + cov_start, len, &pnum, NULL);
	return st >= 0 && (st & IOC_NODE_ST_ZERO) && pnum >= len;
}

/*
 * Lock held on entry and on return, dropped in between: write
 * [off, off+*len) (inside one cluster) from iov at skip into a cluster
 * that needs allocating or filling: a new cluster, or the image's own
 * cluster when it has it (a preallocated zero cluster, subclusters not
 * yet allocated).  The caller waited for the cluster's in-flight
 * allocations.  *len may come back shorter: a write into its own
 * cluster stops at the first subcluster already allocated, which
 * lockless writers may be writing in place (the caller goes on there).
 *
 * Under the lock: the L2 table made ours, the host cluster allocated
 * (its refcount raised in memory), the allocation recorded.  Without
 * it: the untouched part of the covered subclusters read through the
 * old mapping (which cannot change meanwhile, see wait_allocs()), and
 * the data written.  Under the lock again: the L2 entry, then the old
 * cluster queued for its decrement.  Rule 1 holds because the entry
 * changes after the data write completed; rule 2 because writeback
 * writes the raised refcount before any slice.
 */
static int alloc_write(struct q2_state *q, uint64_t off, uint64_t *len,
		       const struct iovec *iov, int cnt, size_t skip)
{
	uint64_t gidx = off >> q->cluster_bits;
	uint64_t cstart = off & ~(q->cs - 1), a = off - cstart, b = a + *len;
	uint64_t e, bm, e2, bm2, host_old, target = 0, cov_start, cov_end;
	struct q2_slice *s = NULL;
	struct q2_alloc rec;
	struct q2_ticket t;
	size_t idx;
	uint8_t *buf = NULL;
	bool comp, reuse;
	uint32_t alloc_old = 0, zero_old = 0, need, cov;
	unsigned first, last;
	int ret = l2_prepare(q, gidx, &s, &idx);

	if (ret < 0)
		return ret;
	load_entry(q, s, idx, &e, &bm);
	ioc__qcow2_cache_unpin(s);
	s = NULL;
	comp = e & Q2_OFLAG_COMPRESSED;
	host_old = comp ? 0 : e & Q2_L2E_OFFSET_MASK;
	if (q->words == 2 && !comp) {
		alloc_old = (uint32_t)bm;
		zero_old = (uint32_t)(bm >> 32);
	}
	reuse = host_old && (e & Q2_OFLAG_COPIED);
	first = (unsigned)(a >> q->sub_bits);
	last = (unsigned)((b - 1) >> q->sub_bits);
	if (reuse && q->words == 2) {
		/* Stop before the first allocated subcluster after the
		 * first one (which is not: the caller found it so). */
		uint32_t later = alloc_old & ~sc_mask(0, first);

		if (later && (unsigned)__builtin_ctz(later) <= last) {
			last = (unsigned)__builtin_ctz(later) - 1;
			b = (uint64_t)(last + 1) << q->sub_bits;
			*len = b - a;
		}
	}
	need = sc_mask(first, last);
	if (!reuse)
		need |= comp ? sc_mask(0, q->nsub - 1) : alloc_old;
	if (q->nsub == 1)
		need = 1;
	first = (unsigned)__builtin_ctz(need);
	last = 31u - (unsigned)__builtin_clz(need);
	cov = sc_mask(first, last);
	cov_start = (uint64_t)first << q->sub_bits;
	cov_end = (uint64_t)(last + 1) << q->sub_bits;

	buf = aligned_alloc(4096, (cov_end - cov_start + 4095) & ~4095ull);
	if (!buf)
		return -ENOMEM;
	if (reuse) {
		target = host_old;
	} else {
		ret = ioc__qcow2_alloc_cluster(q, &target);
		if (ret < 0)
			goto out;
	}
	alloc_begin(q, &rec, gidx);
	ioc_co_mutex_unlock(&q->lock);

	/* The old contents around the write, through the old mapping; the
	 * ticket keeps the clusters it reads from being reused. */
	t = enter_io(q);
	{
		struct iovec biov = { buf, cov_end - cov_start };

		if (a > cov_start)
			ret = read_range(q, cstart + cov_start, a - cov_start, &biov, 1, 0, false);
		if (ret == 0 && cov_end > b)
			ret = read_range(q, cstart + b, cov_end - b, &biov, 1, b - cov_start,
					 false);
	}
	if (ret == 0) {
		uint64_t w0 = cov_start, w1 = cov_end;

		iov_copy(iov, cnt, skip, buf + (a - cov_start), b - a, false);
		if (!reuse && fresh_zero(q, target, buf, a - cov_start, b - cov_start,
					 cov_start, cov_end)) {
			/* The rest already reads as zeroes there: only the
			 * data, in 4 KiB units (O_DIRECT). */
			w0 = a & ~4095ull;
			w1 = (b + 4095) & ~4095ull;
			if (w0 < cov_start)
				w0 = cov_start;
			if (w1 > cov_end)
				w1 = cov_end;
		}
		/* Rule 1: the data first. */
		ret = ioc__qcow2_pwrite(q, target + w0, buf + (w0 - cov_start), w1 - w0);
	}
	leave_io(q, t);

	ioc_co_mutex_lock(&q->lock);
	if (ret == 0)
		ret = l2_prepare(q, gidx, &s, &idx);
	if (ret == 0) {
		/* Nothing else changes this entry while rec is listed. */
		load_entry(q, s, idx, &e2, &bm2);
		if (e2 != e || bm2 != bm)
			ret = -EIO;
	}
	if (ret == 0) {
		if (q->words == 2) {
			uint32_t alloc = alloc_old | cov;

			store_entry(q, s, idx, target | Q2_OFLAG_COPIED,
				    (uint64_t)(zero_old & ~alloc) << 32 | alloc, true);
		} else {
			store_entry(q, s, idx, target | Q2_OFLAG_COPIED, 0, true);
		}
		if (!reuse)
			ret = drop_entry(q, e);
	} else if (!reuse) {
		/* Nothing points at the new cluster: give it back (a failure
		 * to queue it is a leak, not damage). */
		(void)ioc__qcow2_defer_free(q, target, q->cs);
	}
	alloc_end(q, &rec);
out:
	if (s)
		ioc__qcow2_cache_unpin(s);
	free(buf);
	return ret;
}

static int ioc_coroutine_fn q2_pwritev(struct ioc_node *n, uint64_t off,
				       const struct iovec *iov, int iovcnt, uint32_t flags)
{
	struct q2_state *q = n->opaque;
	size_t len = 0, done = 0;
	int ret = 0;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	if (q->failed)
		return -EIO;
	while (done < len) {
		uint64_t pos = off + done, step = 0;
		struct q2_run r;

		struct q2_ticket t = enter_io(q);

		ret = map_run(q, pos, len - done, false, &r);
		if (ret == 0 && r.kind == Q2_DATA && r.writable) {
			ret = r.host + r.len > file_size(q) ? -EIO :
			      child_io(ioc_node_co_pwritev, q->file, r.host, iov, iovcnt, done,
				       r.len, 0);
			leave_io(q, t);
			if (ret < 0)
				break;
			done += r.len;
			continue;
		}
		leave_io(q, t);
		if (ret < 0)
			break;
		ioc_co_mutex_lock(&q->lock);
		wait_allocs(q, pos >> q->cluster_bits);
		ret = map_run(q, pos, len - done, true, &r);
		if (ret == 0 && r.kind == Q2_DATA && r.writable) {
			/* Allocated meanwhile: in place, without the lock. */
			ioc_co_mutex_unlock(&q->lock);
			continue;
		}
		if (ret == 0) {
			uint64_t cend = (pos | (q->cs - 1)) + 1;

			step = cend - pos < len - done ? cend - pos : len - done;
			ret = alloc_write(q, pos, &step, iov, iovcnt, done);
		}
		ioc_co_mutex_unlock(&q->lock);
		if (ret < 0)
			break;
		done += step;
	}
	if (ret == 0 && (flags & IOC_NODE_FUA)) {
		ioc_co_mutex_lock(&q->lock);
		ret = ioc__qcow2_writeback(q, true);
		ioc_co_mutex_unlock(&q->lock);
	}
	return ret;
}

static int ioc_coroutine_fn q2_flush(struct ioc_node *n, uint32_t flags)
{
	struct q2_state *q = n->opaque;
	int ret;

	if (!q->rw)
		return 0;
	ioc_co_mutex_lock(&q->lock);
	ret = ioc__qcow2_writeback(q, true);
	if (ret < 0)
		q->failed = true;
	ioc__qcow2_cache_clean(&q->cache, (uint64_t)ioc_now_ns(), false);
	ioc_co_mutex_unlock(&q->lock);
	return ret;
}

/* ---- zeroes and discard ---------------------------------------------------- */

/* Write zero buffers over [off, off+len) (the part no flag can cover). */
static int write_zero_data(struct ioc_node *n, uint64_t off, uint64_t len)
{
	size_t chunk = len < (1u << 20) ? (size_t)len : (1u << 20);
	void *z = calloc(1, chunk ? chunk : 1);
	int ret = 0;

	if (!z)
		return -ENOMEM;
	while (len && ret == 0) {
		struct iovec iov = { z, len < chunk ? (size_t)len : chunk };

		ret = q2_pwritev(n, off, &iov, 1, 0);
		off += iov.iov_len;
		len -= iov.iov_len;
	}
	free(z);
	return ret;
}

enum { Q2_OP_ZERO, Q2_OP_ZERO_UNMAP, Q2_OP_DISCARD };

/* Lock held: zero or discard subclusters [first, last] of cluster gidx,
 * as QEMU's zero_in_l2_slice()/discard_in_l2_slice() would. */
static int change_cluster(struct q2_state *q, uint64_t gidx, unsigned first, unsigned last,
			  int op)
{
	uint64_t l1e = atomic_load_explicit(&q->l1[gidx >> q->l2_bits], memory_order_relaxed);
	bool whole = first == 0 && last == q->nsub - 1;
	bool v3 = q->h.version >= 3;
	uint64_t e = 0, bm = 0, ne, nbm;
	struct q2_slice *s = NULL;
	size_t idx = 0;
	int ret;

	if (!(l1e & Q2_L1E_OFFSET_MASK)) {
		/* No table: unallocated.  Nothing to do when that already
		 * reads as what is asked. */
		if (!q->backing || (op == Q2_OP_DISCARD && !v3))
			return 0;
	}
	ret = l2_prepare(q, gidx, &s, &idx);
	if (ret < 0)
		return ret;
	load_entry(q, s, idx, &e, &bm);
	bool comp = e & Q2_OFLAG_COMPRESSED;
	bool allocated = comp || (e & Q2_L2E_OFFSET_MASK);
	bool unmap;

	if (!whole && (comp || q->words == 1)) {
		ret = -ENOTSUP;         /* the caller writes zero data instead */
		goto out;
	}
	if (op == Q2_OP_DISCARD) {
		unmap = allocated;
		if (!q->backing && !allocated && (q->words == 1 ? true : !(uint32_t)bm)) {
			goto out;       /* unallocated, nothing behind: reads zeroes */
		}
		ne = 0;
		nbm = q->words == 2 ? 0xffffffff00000000ull : 0;
		if (q->words == 1 && v3)
			ne = Q2_OFLAG_ZERO;
	} else {
		unmap = comp || (op == Q2_OP_ZERO_UNMAP && allocated);
		if (q->words == 2 && !whole) {
			uint32_t m = sc_mask(first, last);

			unmap = false;
			ne = e;
			nbm = (bm & ~(uint64_t)m) | (uint64_t)m << 32;
		} else {
			ne = unmap ? 0 : e;
			nbm = q->words == 2 ? 0xffffffff00000000ull : 0;
			if (q->words == 1)
				ne |= Q2_OFLAG_ZERO;
		}
	}
	if (unmap && q->words == 1)
		ne &= ~(Q2_L2E_OFFSET_MASK | Q2_OFLAG_COPIED);
	if (ne == e && nbm == bm)
		goto out;
	store_entry(q, s, idx, ne, nbm, false);
	if (unmap)
		ret = drop_entry(q, e);
out:
	ioc__qcow2_cache_unpin(s);
	return ret;
}

/* Zero or discard the aligned units of [off, off+len); partial units are
 * left to the caller. */
static int change_range(struct q2_state *q, uint64_t off, uint64_t len, int op)
{
	uint64_t unit = 1ull << q->sub_bits;
	int ret = 0;

	ioc_co_mutex_lock(&q->lock);
	while (len && ret == 0) {
		uint64_t gidx = off >> q->cluster_bits;
		uint64_t cend = (gidx + 1) << q->cluster_bits;
		uint64_t n = cend - off < len ? cend - off : len;
		unsigned first = (unsigned)((off & (q->cs - 1)) / unit);
		unsigned last = (unsigned)(((off + n - 1) & (q->cs - 1)) / unit);

		wait_allocs(q, gidx);
		ret = change_cluster(q, gidx, first, last, op);
		off += n;
		len -= n;
	}
	ioc_co_mutex_unlock(&q->lock);
	return ret;
}

static int ioc_coroutine_fn q2_write_zeroes(struct ioc_node *n, uint64_t off, uint64_t len,
					    uint32_t flags)
{
	struct q2_state *q = n->opaque;
	uint64_t unit = q->h.version >= 3 ? 1ull << q->sub_bits : 0;
	uint64_t head_end, tail_start;
	int ret = 0;

	if (q->failed)
		return -EIO;
	if (!unit) {
		/* Version 2 has no zero flag. */
		if (flags & IOC_NODE_NO_FALLBACK)
			return -ENOTSUP;
		return write_zero_data(n, off, len);
	}
	/* The end of the image counts as aligned (QEMU's rule too). */
	head_end = (off + unit - 1) & ~(unit - 1);
	tail_start = off + len == n->size ? off + len : (off + len) & ~(unit - 1);
	/* NO_FALLBACK: all by flag, or nothing written. */
	if ((flags & IOC_NODE_NO_FALLBACK) &&
	    (head_end >= tail_start || head_end > off || tail_start < off + len))
		return -ENOTSUP;
	if (head_end >= tail_start) {
		ret = write_zero_data(n, off, len);
		goto out;
	}
	if (head_end > off)
		ret = write_zero_data(n, off, head_end - off);
	if (ret == 0) {
		/* Whole units by flag; for a compressed cluster partly
		 * covered (-ENOTSUP), zero data. */
		uint64_t p = head_end;

		while (p < tail_start && ret == 0) {
			uint64_t cend = (p | (q->cs - 1)) + 1;
			uint64_t e = cend < tail_start ? cend : tail_start;

			ret = change_range(q, p, e - p, (flags & IOC_NODE_MAY_UNMAP) ?
					   Q2_OP_ZERO_UNMAP : Q2_OP_ZERO);
			if (ret == -ENOTSUP)
				ret = (flags & IOC_NODE_NO_FALLBACK) ? -ENOTSUP :
				      write_zero_data(n, p, e - p);
			p = e;
		}
	}
	if (ret == 0 && tail_start < off + len)
		ret = write_zero_data(n, tail_start, off + len - tail_start);
out:
	if (ret == 0 && (flags & IOC_NODE_FUA))
		ret = q2_flush(n, 0);
	return ret;
}

static int ioc_coroutine_fn q2_discard(struct ioc_node *n, uint64_t off, uint64_t len,
				       uint32_t flags)
{
	struct q2_state *q = n->opaque;
	uint64_t start = (off + q->cs - 1) & ~(q->cs - 1);
	uint64_t end = off + len == n->size ? off + len : (off + len) & ~(q->cs - 1);

	if (q->failed)
		return -EIO;
	/* Without the zero flag (version 2) a discarded cluster would show
	 * the backing file's stale data: nothing is done, as in QEMU. */
	if (q->h.version < 3 && q->backing)
		return 0;
	/* Partial clusters are ignored, as QEMU ignores them (a hint). */
	if (start >= end)
		return 0;
	return change_range(q, start, end - start, Q2_OP_DISCARD);
}

/* ---- block status ---------------------------------------------------------- */

static int ioc_coroutine_fn q2_block_status(struct ioc_node *n, uint64_t off, uint64_t len,
					    uint64_t *pnum, unsigned *depth)
{
	struct q2_state *q = n->opaque;
	struct q2_run r;
	unsigned d = 1;
	int st, ret = map_run(q, off, len, false, &r);

	if (ret < 0)
		return ret;
	*pnum = r.len;
	switch (r.kind) {
	case Q2_DATA:
	case Q2_COMPRESSED:
		st = IOC_NODE_ST_DATA | IOC_NODE_ST_ALLOCATED;
		break;
	case Q2_ZERO:
		st = IOC_NODE_ST_ZERO | IOC_NODE_ST_ALLOCATED;
		break;
	default:
		d = 0;
		st = IOC_NODE_ST_ZERO;
		if (q->backing && off < q->backing->size) {
			uint64_t want = q->backing->size - off < r.len ? q->backing->size - off
								       : r.len;
			unsigned bd = 0;

			st = ioc_node_co_block_status(q->backing, off, want, pnum, &bd);
			if (st < 0)
				return st;
			d = bd ? bd + 1 : 0;
		}
		break;
	}
	if (depth)
		*depth = d;
	return st;
}

/* ---- resize ---------------------------------------------------------------- */

/* Growth inside what the active L1 table already maps (QEMU's limits on
 * the rest).  A bigger L1 table would have to be swapped under readers
 * that index it without the lock: not supported yet. */
static int ioc_coroutine_fn q2_truncate(struct ioc_node *n, uint64_t size)
{
	struct q2_state *q = n->opaque;
	uint64_t cover = (uint64_t)q->l1_size << (q->l2_bits + q->cluster_bits), be;
	int ret;

	if (size & 511)
		return -EINVAL;         /* "The new size must be a multiple of 512" */
	if (size < n->size || q->h.nb_snapshots)
		return -ENOTSUP;        /* shrinking; "Can't resize an image which has snapshots" */
	if (size > cover)
		return -ENOTSUP;        /* the L1 table would have to grow */
	if (size == n->size)
		return 0;
	ret = ioc__qcow2_bitmaps_resize(q, size);
	if (ret < 0)
		return ret;
	ioc_co_mutex_lock(&q->lock);
	be = htobe64(size);
	ret = ioc__qcow2_pwrite(q, 24, &be, 8);
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret == 0) {
		q->h.size = size;
		n->size = size;
	}
	ioc_co_mutex_unlock(&q->lock);
	return ret;
}

/* ---- open and close -------------------------------------------------------- */

/* Run fn(arg) in a coroutine to its end: open and close come from the
 * main thread outside any coroutine, and the child's I/O needs one. */
struct sync_run {
	void (*fn)(void *);
	void *arg;
	bool done;
};

static void ioc_coroutine_fn sync_entry(void *opaque)
{
	struct sync_run *r = opaque;

	r->fn(r->arg);
	r->done = true;
}

static int run_sync(struct ioc_node *n, void (*fn)(void *), void *arg)
{
	struct sync_run r = { fn, arg, false };
	struct ioc_loop *loop = ioc_loop_current();
	bool temp = false;
	struct ioc_co *co;

	if (ioc_co_self()) {
		fn(arg);
		return 0;
	}
	if (!loop) {
		int ret = ioc_loop_new(&loop, NULL);

		if (ret < 0)
			return ret;
		temp = true;
	}
	co = ioc_co_create(sync_entry, &r);
	if (!co) {
		if (temp)
			ioc_loop_free(loop);
		return -ENOMEM;
	}
	ioc_co_enter(co);
	while (!r.done)
		ioc_loop_poll(loop, true);
	if (temp) {
		ioc_node_graph_detach_loop(n->graph, loop);
		ioc_loop_free(loop);
	}
	return 0;
}

int ioc__qcow2_run_sync(struct ioc_node *n, void (*fn)(void *), void *arg)
{
	return run_sync(n, fn, arg);
}

struct open_args {
	struct ioc_node *n;
	json_t *opts;
	char *err;
	size_t errlen;
	int ret;
};

static int set_incompat(struct q2_state *q, uint64_t v)
{
	return ioc__qcow2_header_put64(q, Q2_OFF_INCOMPAT, &q->h.incompat, v);
}

static int read_snapshots(struct q2_state *q, char *err, size_t errlen)
{
	uint64_t off = q->h.snapshots_off, total = 0, fsz = file_size(q), end = off;
	uint8_t hdr[Q2_SNAPSHOT_HDR_LEN];

	for (uint32_t i = 0; i < q->h.nb_snapshots; i++) {
		int64_t len;
		int ret;

		if (off > fsz || fsz - off < sizeof(hdr)) {
			snprintf(err, errlen, "Snapshot table offset invalid (entry %u is past "
				 "the end of the file)", i);
			return -EINVAL;
		}
		ret = ioc__qcow2_pread(q, off, hdr, sizeof(hdr));
		if (ret < 0) {
			snprintf(err, errlen, "Failed to read snapshot table");
			return ret;
		}
		len = ioc__qcow2_parse_snapshot(hdr, &q->h, fsz, i, err, errlen);
		if (len < 0)
			return (int)len;
		end = off + (uint64_t)len;
		len = (len + 7) & ~7ll;
		total += (uint64_t)len;
		if (total > Q2_MAX_SNAPSHOTS_BYTES) {
			snprintf(err, errlen, "Snapshot table too large");
			return -EFBIG;
		}
		off += (uint64_t)len;
	}
	if (q->h.nb_snapshots && end > fsz) {
		snprintf(err, errlen, "Snapshot table offset invalid (it ends past the end "
			 "of the file)");
		return -EINVAL;
	}
	return 0;
}

static int open_backing(struct q2_state *q, json_t *opts, char *err, size_t errlen)
{
	struct ioc_node *n = q->node;
	json_t *b = json_object_get(opts, "backing");
	const char *fmt = q->h.backing_fmt[0] ? q->h.backing_fmt : NULL;
	char path[4096];
	int ret;

	if (b && json_is_null(b))
		return 0;
	if (b)
		return ioc_node_open_child(n, b, "backing", &q->backing, err, errlen);
	if (!q->h.backing_file[0])
		return 0;
	if (strncmp(q->h.backing_file, "json:", 5) == 0 || strstr(q->h.backing_file, "://")) {
		snprintf(err, errlen, "Could not open backing file '%s': only file names are "
			 "supported", q->h.backing_file);
		return -ENOTSUP;
	}
	if (fmt && strcmp(fmt, "raw") != 0 && strcmp(fmt, "qcow2") != 0) {
		snprintf(err, errlen, "Unknown driver '%s'", fmt);
		return -ENOTSUP;
	}
	/* Relative names are relative to the image's directory. */
	const char *img = q->file->filename ? q->file->filename : "";
	const char *slash = strrchr(img, '/');

	if (q->h.backing_file[0] != '/' && slash)
		snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - img), img,
			 q->h.backing_file);
	else
		snprintf(path, sizeof(path), "%s", q->h.backing_file);
	ret = ioc_node_open_file(n, path, fmt, true, &q->backing, err, errlen);
	if (ret < 0 && !strstr(err, path)) {
		char inner[256];

		snprintf(inner, sizeof(inner), "%s", err);
		snprintf(err, errlen, "Could not open backing file '%s': %s", path, inner);
	}
	return ret;
}

static void ioc_coroutine_fn open_co(void *opaque)
{
	struct open_args *a = opaque;
	struct ioc_node *n = a->n;
	struct q2_state *q = n->opaque;
	char *err = a->err;
	size_t errlen = a->errlen;
	uint8_t *first = NULL;
	size_t first_len;
	int ret;

	atomic_init(&q->file_size, q->file->size);
	first_len = file_size(q) < (2u << 20) ? (size_t)file_size(q) : (2u << 20);
	first = malloc(first_len ? first_len : 1);
	ret = -ENOMEM;
	if (!first)
		goto out;
	ret = first_len ? ioc__qcow2_pread(q, 0, first, first_len) : 0;
	if (ret < 0) {
		snprintf(err, errlen, "Could not read qcow2 header: %s", ioc_strerror(ret));
		goto out;
	}
	ret = ioc__qcow2_parse_header(first, first_len, file_size(q), q->rw, &q->h, err,
				      errlen);
	if (ret < 0)
		goto out;

	q->cluster_bits = q->h.cluster_bits;
	q->cs = 1ull << q->cluster_bits;
	q->words = (q->h.incompat & Q2_INCOMPAT_EXT_L2) ? 2 : 1;
	q->l2_bits = q->cluster_bits - 3 - (q->words == 2);
	q->nsub = q->words == 2 ? 32 : 1;
	q->sub_bits = q->cluster_bits - (q->words == 2 ? 5 : 0);
	q->geom = (struct q2_geom){ q->cluster_bits, q->words == 2, q->h.version >= 3, 0 };
	q->rb_bits = q->cluster_bits + 3 - q->h.refcount_order;
	q->rc_max = q->h.refcount_order == 6 ? UINT64_MAX : (1ull << (1u << q->h.refcount_order)) - 1;
	q->l1_size = q->h.l1_size;
	q->l1_off = q->h.l1_off;
	q->rt_off = q->h.rt_off;
	q->rt_clusters = q->h.rt_clusters;
	q->rt_entries = (uint64_t)q->h.rt_clusters << (q->cluster_bits - 3);

	/* Options (QEMU's names and checks). */
	{
		json_t *o = a->opts;
		uint64_t max_l2 = ((q->h.size + q->cs - 1) / q->cs * 8 * q->words + q->cs - 1) &
				  ~(q->cs - 1);
		uint64_t l2_size = max_l2 < Q2_DEFAULT_L2_CACHE_MAX ? max_l2 : Q2_DEFAULT_L2_CACHE_MAX;
		uint64_t entry = (uint64_t)ioc__node_opt_int(o, "l2-cache-entry-size",
							      (int64_t)q->cs);
		int64_t interval = ioc__node_opt_int(o, "cache-clean-interval",
						     Q2_DEFAULT_CLEAN_INTERVAL);
		bool lazy_dflt = (q->h.compat & Q2_COMPAT_LAZY) != 0;

		if (json_object_get(o, "l2-cache-size") && json_object_get(o, "cache-size") &&
		    json_object_get(o, "refcount-cache-size")) {
			snprintf(err, errlen, "cache-size, l2-cache-size and refcount-cache-size "
				 "may not be set at the same time");
			ret = -EINVAL;
			goto out;
		}
		if (json_object_get(o, "l2-cache-size"))
			l2_size = (uint64_t)ioc__node_opt_int(o, "l2-cache-size", 0);
		else if (json_object_get(o, "cache-size"))
			l2_size = (uint64_t)ioc__node_opt_int(o, "cache-size", 0);
		if (l2_size > max_l2)
			l2_size = max_l2;
		if (l2_size < 2 * q->cs)
			l2_size = 2 * q->cs;
		if (entry < 512 || entry > q->cs || (entry & (entry - 1))) {
			snprintf(err, errlen, "L2 cache entry size must be a power of two between "
				 "512 and the cluster size (%" PRIu64 ")", q->cs);
			ret = -EINVAL;
			goto out;
		}
		if (interval < 0 || interval > UINT32_MAX) {
			snprintf(err, errlen, "Cache clean interval too big");
			ret = -EINVAL;
			goto out;
		}
		q->lazy = ioc__node_opt_bool(o, "lazy-refcounts", lazy_dflt);
		if (q->lazy && q->h.version < 3) {
			snprintf(err, errlen, "Lazy refcounts require a qcow2 image with at least "
				 "qemu 1.1 compatibility level");
			ret = -EINVAL;
			goto out;
		}
		q->pass_discard = ioc__node_opt_bool(o, "pass-discard-request", true);
		q->slice_bits = q->l2_bits - (unsigned)__builtin_ctzll(q->cs / entry);
		size_t ndir = (size_t)q->l1_size << (q->l2_bits - q->slice_bits);

		if (ndir > Q2_MAX_DIR) {
			snprintf(err, errlen, "l2-cache-entry-size %" PRIu64 " is too small for an "
				 "image of this size", entry);
			ret = -EINVAL;
			goto out;
		}
		uint64_t slots = l2_size / entry;

		if (slots < Q2_MIN_SLOTS)
			slots = Q2_MIN_SLOTS;
		if (slots > Q2_MAX_SLOTS)
			slots = Q2_MAX_SLOTS;   /* the slot array, not the slices, is eager */
		ret = ioc__qcow2_cache_init(&q->cache, (unsigned)slots, (size_t)entry, ndir);
		if (ret < 0) {
			snprintf(err, errlen, "Could not allocate the L2 cache");
			goto out;
		}
		q->cache.clean_interval_ns = (uint64_t)interval * 1000000000ull;
		q->cache.last_clean_ns = (uint64_t)ioc_now_ns();
	}

	/* The active L1 table (size bounded by the header checks). */
	q->l1 = calloc(q->l1_size ? q->l1_size : 1, sizeof(*q->l1));
	if (!q->l1) {
		snprintf(err, errlen, "Could not allocate L1 table");
		ret = -ENOMEM;
		goto out;
	}
	if (q->l1_size) {
		uint64_t *raw = malloc((size_t)q->l1_size * 8);

		ret = raw ? ioc__qcow2_pread(q, q->l1_off, raw, (size_t)q->l1_size * 8) : -ENOMEM;
		if (ret < 0) {
			free(raw);
			snprintf(err, errlen, "Could not read L1 table: %s", ioc_strerror(ret));
			goto out;
		}
		for (uint32_t i = 0; i < q->l1_size; i++)
			atomic_init(&q->l1[i], be64toh(raw[i]));
		free(raw);
	}
	ret = ioc__qcow2_refcount_init(q, err, errlen);
	if (ret < 0)
		goto out;
	ret = read_snapshots(q, err, errlen);
	if (ret < 0)
		goto out;
	/* A dirty image opened to write: its refcounts counted again first,
	 * as QEMU does (qcow2-check.c); read-only, they are not needed. */
	if (q->rw && (q->h.incompat & Q2_INCOMPAT_DIRTY)) {
		ret = ioc__qcow2_repair(q, err, errlen);
		if (ret < 0)
			goto out;
	}
	ret = open_backing(q, a->opts, err, errlen);
	if (ret < 0)
		goto out;
	n->backing = q->backing;
	ret = ioc__qcow2_bitmaps_open(q, err, errlen);
	if (ret < 0)
		goto out;

	if (q->rw) {
		/* Features we do not keep up to date: their autoclear bits go,
		 * as the format asks of a writer that does not know them (the
		 * bitmaps' is qcow2-bitmap.c's). */
		if (q->h.autoclear & ~Q2_AUTOCLEAR_BITMAPS) {
			ret = ioc__qcow2_header_put64(q, Q2_OFF_AUTOCLEAR, &q->h.autoclear,
						      q->h.autoclear & Q2_AUTOCLEAR_BITMAPS);
			if (ret < 0) {
				snprintf(err, errlen, "Could not update qcow2 header: %s",
					 ioc_strerror(ret));
				goto out;
			}
		}
		if (q->lazy) {
			ret = set_incompat(q, q->h.incompat | Q2_INCOMPAT_DIRTY);
			if (ret < 0) {
				snprintf(err, errlen, "Could not mark the image dirty: %s",
					 ioc_strerror(ret));
				goto out;
			}
			q->marked_dirty = true;
		}
	}
	ret = 0;
out:
	free(first);
	a->ret = ret;
}

/* cache-clean-interval: QEMU frees the slices unused for an interval on
 * a timer; so do we, from a coroutine on the opening loop (the lock is a
 * coroutine lock).  A miss also cleans when an interval has passed, for
 * nodes opened where no loop would run the timer. */
static void ioc_coroutine_fn clean_co(void *opaque)
{
	struct q2_state *q = opaque;

	ioc_co_mutex_lock(&q->lock);
	ioc__qcow2_cache_clean(&q->cache, (uint64_t)ioc_now_ns(), false);
	q->cleaned++;
	ioc_co_mutex_unlock(&q->lock);
	q->cleaning = false;
}

static void clean_timer_cb(void *opaque)
{
	struct q2_state *q = opaque;
	struct ioc_co *co;

	ioc_timer_arm_in(&q->clean_timer, (int64_t)q->cache.clean_interval_ns);
	if (q->cleaning)
		return;
	co = ioc_co_create(clean_co, q);
	if (!co)
		return;
	q->cleaning = true;
	ioc_co_enter(co);
}

size_t ioc__qcow2_cache_resident(struct ioc_node *n)
{
	struct q2_state *q = n->opaque;
	size_t k = 0;

	for (unsigned i = 0; i < q->cache.nslots; i++)
		k += q->cache.slots[i].data != NULL;
	return k;
}

uint64_t ioc__qcow2_clean_passes(struct ioc_node *n)
{
	return ((struct q2_state *)n->opaque)->cleaned;
}

static void q2_free(struct q2_state *q)
{
	ioc__qcow2_bitmaps_free(q);
	ioc__qcow2_cache_destroy(&q->cache);
	ioc__qcow2_refcount_free(q);
	free(q->l1);
	free(q);
}

static int q2_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	struct q2_state *q = calloc(1, sizeof(*q));
	struct open_args a = { n, opts, err, errlen, 0 };
	int ret;

	if (!q)
		return -ENOMEM;
	q->node = n;
	ioc_co_mutex_init(&q->lock);
	ret = ioc_node_open_child(n, json_object_get(opts, "file"), "file", &n->file, err,
				  errlen);
	if (ret < 0) {
		free(q);
		return ret;
	}
	q->file = n->file;
	n->read_only = n->read_only || n->file->read_only;
	q->rw = !n->read_only;
	n->opaque = q;
	ret = run_sync(n, open_co, &a);
	if (ret == 0)
		ret = a.ret;
	if (ret < 0) {
		if (!err[0])
			snprintf(err, errlen, "Could not open qcow2 image: %s", ioc_strerror(ret));
		ioc_node_unref(q->backing);
		n->backing = NULL;
		ioc_node_unref(n->file);
		n->file = NULL;
		n->opaque = NULL;
		q2_free(q);
		return ret;
	}
	/* The loop that opened the node runs its clean timer (none when
	 * open had to make a loop of its own: it is gone now). */
	q->clean_loop = q->cache.clean_interval_ns ? ioc_loop_current() : NULL;
	if (q->clean_loop) {
		ioc_timer_init(&q->clean_timer, q->clean_loop, clean_timer_cb, q);
		ioc_timer_arm_in(&q->clean_timer, (int64_t)q->cache.clean_interval_ns);
	}
	n->size = q->h.size;
	n->can_discard = true;
	n->can_fast_zero = q->h.version >= 3;
	n->can_block_status = true;
	n->multi_conn = true;
	n->min_align = 1;
	n->opt_align = (uint32_t)q->cs;
	n->filename = n->file->filename;
	return 0;
}

static void ioc_coroutine_fn close_co(void *opaque)
{
	struct q2_state *q = opaque;
	int ret;

	if (!q->rw)
		return;
	/* Persistent bitmaps first: the clusters they drop are freed by
	 * the writeback passes below. */
	(void)ioc__qcow2_bitmaps_close(q);
	ret = ioc__qcow2_writeback(q, true);
	/* No request is in flight: the frees waiting for one go now (the
	 * first pass may have started their wait). */
	for (int i = 0; i < 2 && ret == 0 && (q->ngrace || q->npending); i++)
		ret = ioc__qcow2_writeback(q, true);
	/* A clean stop: the dirty bit goes only once everything it covered
	 * is on disk. */
	if (ret == 0 && q->marked_dirty && !q->failed)
		(void)set_incompat(q, q->h.incompat & ~Q2_INCOMPAT_DIRTY);
}

static void q2_close(struct ioc_node *n)
{
	struct q2_state *q = n->opaque;

	if (!q)
		return;
	if (q->clean_loop) {
		ioc_timer_cancel(&q->clean_timer);
		while (q->cleaning)
			ioc_loop_poll(q->clean_loop, true);
	}
	(void)run_sync(n, close_co, q);
	q2_free(q);
	n->opaque = NULL;
}

static void q2_info(struct ioc_node *n, json_t *image)
{
	struct q2_state *q = n->opaque;
	json_t *data = json_pack("{s:s,s:b,s:i,s:b,s:b,s:s}",
				 "compat", q->h.version >= 3 ? "1.1" : "0.10",
				 "lazy-refcounts", q->lazy,
				 "refcount-bits", 1 << q->h.refcount_order,
				 "corrupt", (q->h.incompat & Q2_INCOMPAT_CORRUPT) != 0,
				 "extended-l2", q->words == 2,
				 "compression-type", q->h.compression == Q2_COMP_ZSTD ? "zstd" : "zlib");

	if (data)
		ioc__qcow2_bitmaps_info(q, data);
	json_object_set_new(image, "cluster-size", json_integer((json_int_t)q->cs));
	json_object_set_new(image, "dirty-flag",
			    json_boolean((q->h.incompat & Q2_INCOMPAT_DIRTY) != 0));
	if (data)
		json_object_set_new(image, "format-specific",
				    json_pack("{s:s,s:o}", "type", "qcow2", "data", data));
}

const struct ioc_node_drv ioc__node_drv_qcow2 = {
	.name = "qcow2",
	.opts = qcow2_opts,
	.open = q2_open,
	.close = q2_close,
	.co_preadv = q2_preadv,
	.co_pwritev = q2_pwritev,
	.co_flush = q2_flush,
	.co_discard = q2_discard,
	.co_write_zeroes = q2_write_zeroes,
	.co_block_status = q2_block_status,
	.co_truncate = q2_truncate,
	.info = q2_info,
};
