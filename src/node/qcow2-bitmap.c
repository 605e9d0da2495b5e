/*
 * qcow2's persistent dirty bitmaps (docs/interop/qcow2.txt, "Bitmaps
 * extension"), kept in the image as QEMU keeps them.
 *
 * Problem: a bitmap of `qemu-img bitmap --add` must be served and kept up
 * to date while the node is open, one added over QMP with persistent: true
 * must be in the image after a clean stop, and an image not closed cleanly
 * must say its bitmaps are stale.  Directory, tables and entries are input.
 *
 * Design.  The bits live where every bitmap lives, in the block layer: the
 * node owns an image of the null driver sized like the guest view
 * (n->dirty_set), its write notifier marks it in guest offsets, and the
 * QMP commands, NBD's meta context and the queries reach it through
 * ioc_node_dirty_blk() unchanged.  This file is the block layer's store
 * (add, remove) plus open and close.  b->e is the directory this node
 * writes; the bits are written only at a clean close, as QEMU does, and
 * while open every bitmap on disk is flagged in_use: a crash leaves them
 * inconsistent, never wrong.
 *
 * Crash order, for every change of the directory (in_use set at a
 * read-write open before the first guest write, add and remove, the
 * close): (1) new data clusters, tables, then a new directory, from the
 * refcount allocator, written and flushed with their refcounts (a crash
 * leaks them); (2) the commit: the header extension (count, size, offset)
 * rewritten in one write inside one 512-byte sector, flushed; (3) then the
 * old directory, tables and data go to the deferred frees.  Where (2) is
 * not one sector write (the extension is new, goes, or straddles a
 * sector), autoclear bit 0 is cleared before and set after, each flushed:
 * while it is clear readers ignore the extension, so a crash loses the
 * bitmaps, never makes them lie.  test-qcow2-crash.c crashes at each write.
 *
 * Rejected: a second bitmap implementation for qcow2 (marking, NBD and QMP
 * exist once), and writing bits as they change (in_use is the contract).
 * Limits: qcow2's, which are QEMU's and the block layer's: 65535 bitmaps,
 * names of 1 to 1023 bytes, granularity 512 bytes to 2 GiB, a directory
 * of at most 64 MiB (the parser refuses an image past them, with the
 * reason); no resize while a node has bitmaps.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node-int.h"
#include "qcow2.h"
#include "util/endian.h"

/* An entry of the directory this node writes. */
struct q2_bm {
	char *name;
	unsigned gran_bits;
	uint32_t flags;                /* Q2_BME_*, as on disk */
	uint64_t table_off;
	uint32_t table_size;
	uint64_t *table;               /* its entries, host-endian; NULL: not read */
};

struct q2_bitmaps {
	struct q2_state *q;
	struct ioc_blk *set;           /* the node's bitmaps (null driver) */
	struct ioc_node_notifier nt;
	bool notifying;
	struct q2_bm *e;
	size_t n;
	bool loading;                  /* adds are the image's own: no I/O */
	uint64_t dir_off, dir_size;    /* the directory on disk (0: none) */
};

#define ERR(...) snprintf(err, errlen, __VA_ARGS__)




static uint64_t clusters_of(const struct q2_state *q, uint64_t bytes)
{
	return (bytes + q->cs - 1) >> q->cluster_bits;
}

/* ---- allocation -------------------------------------------------------- */

/* n contiguous clusters (lock held).  A run broken by a used cluster goes
 * back to the deferred frees and the search goes on past it; the
 * allocator's hint only moves forward until a writeback, so it ends. */
static int alloc_run(struct q2_state *q, uint64_t n, uint64_t *out)
{
	uint64_t start = 0, got = 0, c;
	int ret = 0;

	while (got < n) {
		ret = ioc__qcow2_alloc_cluster(q, &c);
		if (ret < 0)
			break;
		if (got && c != start + (got << q->cluster_bits)) {
			ret = ioc__qcow2_defer_free(q, start, got << q->cluster_bits);
			got = 0;
			if (ret < 0) {
				(void)ioc__qcow2_defer_free(q, c, q->cs);
				return ret;
			}
		}
		if (!got)
			start = c;
		got++;
	}
	if (ret < 0) {
		if (got)
			(void)ioc__qcow2_defer_free(q, start, got << q->cluster_bits);
		return ret;
	}
	*out = start;
	return 0;
}

/* The clusters of a table and its data, to the deferred frees. */
static void free_table(struct q2_state *q, uint64_t off, uint32_t size, const uint64_t *tab)
{
	for (uint32_t i = 0; tab && i < size; i++)
		if (tab[i] & Q2_BTE_OFFSET_MASK)
			(void)ioc__qcow2_defer_free(q, tab[i] & Q2_BTE_OFFSET_MASK, q->cs);
	if (off && size)
		(void)ioc__qcow2_defer_free(q, off, (uint64_t)size * 8);
}

/* Read and check a table of size entries at off. */
static int read_table(struct q2_state *q, uint64_t off, uint32_t size, uint64_t **out,
		      char *err, size_t errlen)
{
	uint64_t *t = malloc((size_t)size * 8);
	int ret;

	*out = NULL;
	if (!t)
		return -ENOMEM;
	ret = ioc__qcow2_pread(q, off, t, (size_t)size * 8);
	for (uint32_t i = 0; ret == 0 && i < size; i++) {
		t[i] = be64toh(t[i]);
		ret = ioc__qcow2_check_bitmap_te(t[i], q->cluster_bits,
						 atomic_load(&q->file_size), err, errlen);
	}
	if (ret < 0) {
		free(t);
		return ret;
	}
	*out = t;
	return 0;
}

/* Write a table (host-endian entries) into new clusters. */
static int write_table(struct q2_state *q, const uint64_t *tab, uint32_t size,
		       uint64_t *off)
{
	uint64_t nc = clusters_of(q, (uint64_t)size * 8);
	uint8_t *buf = calloc(nc, q->cs);
	int ret;

	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0; tab && i < size; i++)
		ioc__put_be64(buf + (size_t)i * 8, tab[i]);
	ret = alloc_run(q, nc, off);
	if (ret == 0) {
		ret = ioc__qcow2_pwrite(q, *off, buf, nc << q->cluster_bits);
		if (ret < 0)
			(void)ioc__qcow2_defer_free(q, *off, nc << q->cluster_bits);
	}
	free(buf);
	return ret;
}

/* ---- the header ---------------------------------------------------------- */

static int put_autoclear(struct q2_state *q, bool on)
{
	return ioc__qcow2_header_put64(q, Q2_OFF_AUTOCLEAR, &q->h.autoclear,
				       on ? Q2_AUTOCLEAR_BITMAPS : 0);
}

/*
 * Make the header's bitmaps extension say b's directory (present), or
 * take it out: the commit.  An extension whose 24 bytes lie in one
 * 512-byte sector, under a set autoclear bit, is rewritten in place in
 * one write (disks write a sector whole).  Otherwise the autoclear bit is
 * cleared first and set after, so a torn write is never believed: the
 * extension is updated in place, or inserted before the end marker (the
 * backing file name, which QEMU places right after the extensions, moved
 * to the cluster's end first, with the header's offset switched to it in
 * one 8-byte write), or removed with the extensions after it moved up.
 */
static int write_ext(struct q2_bitmaps *b, bool present)
{
	struct q2_state *q = b->q;
	uint64_t fsz = atomic_load(&q->file_size);
	size_t len = fsz < q->cs ? (size_t)fsz : (size_t)q->cs;
	size_t off = q->h.header_len, end, pb = 0, pend = 0;
	uint8_t *buf = malloc(len), d[40] = { 0 };
	bool have_end = false;
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = ioc__qcow2_pread(q, 0, buf, len);
	if (ret < 0)
		goto out;
	end = q->h.backing_off ? (size_t)q->h.backing_off : len;
	if (end > len)
		end = len;
	while (off + 8 <= end) {
		uint32_t type = ioc__get_be32(buf + off), l = ioc__get_be32(buf + off + 4);

		if (type == Q2_EXT_END) {
			pend = off;
			have_end = true;
			break;
		}
		if (l > end - off - 8) {
			ret = -EINVAL;
			goto out;
		}
		if (type == Q2_EXT_BITMAPS)
			pb = off;
		off += 8 + (((size_t)l + 7) & ~(size_t)7);
	}
	ret = -ENOSPC;                 /* no end marker: no room to say more */
	if (!have_end)
		goto out;
	ioc__put_be32(d, Q2_EXT_BITMAPS);
	ioc__put_be32(d + 4, 24);
	ioc__put_be32(d + 8, (uint32_t)b->n);
	ioc__put_be64(d + 16, b->dir_size);
	ioc__put_be64(d + 24, b->dir_off);
	if (present && pb && (pb + 8) / 512 == (pb + 31) / 512 &&
	    (q->h.autoclear & Q2_AUTOCLEAR_BITMAPS)) {
		ret = ioc__qcow2_pwrite(q, pb + 8, d + 8, 24);
		if (ret == 0)
			ret = ioc__qcow2_flush_file(q);
		goto out;
	}
	if (q->h.autoclear & Q2_AUTOCLEAR_BITMAPS) {
		ret = put_autoclear(q, false);
		if (ret < 0)
			goto out;
	}
	if (present && pb) {
		ret = ioc__qcow2_pwrite(q, pb + 8, d + 8, 24);
	} else if (present) {
		size_t need = pend + sizeof(d);

		ret = -ENOSPC;         /* no room in the header cluster */
		if (q->h.backing_off && need > q->h.backing_off) {
			uint64_t noff = (q->cs - q->h.backing_len) & ~7ull, be = htobe64(noff);

			/* The copy must not touch the name in use until the
			 * header points at it. */
			if (q->h.backing_len > q->cs || noff < need ||
			    noff < q->h.backing_off + q->h.backing_len ||
			    noff + q->h.backing_len > len)
				goto out;
			ret = ioc__qcow2_pwrite(q, noff, buf + q->h.backing_off,
						q->h.backing_len);
			if (ret == 0)
				ret = ioc__qcow2_flush_file(q);
			if (ret == 0)
				ret = ioc__qcow2_pwrite(q, 8, &be, 8);
			if (ret == 0)
				ret = ioc__qcow2_flush_file(q);
			if (ret < 0)
				goto out;
			q->h.backing_off = noff;
		} else if (need > len) {
			goto out;
		}
		ret = ioc__qcow2_pwrite(q, pend, d, sizeof(d));
	} else if (pb) {
		size_t next = pb + 32, tail = pend + 8;

		memmove(buf + pb, buf + next, tail - next);
		memset(buf + tail - 32, 0, 32);
		ret = ioc__qcow2_pwrite(q, pb, buf + pb, tail - pb);
	} else {
		ret = 0;
	}
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret == 0 && present)
		ret = put_autoclear(q, true);
out:
	free(buf);
	return ret;
}

/* ---- the directory --------------------------------------------------------- */

static size_t entry_len(const struct q2_bm *m)
{
	return (Q2_BME_HDR_LEN + strlen(m->name) + 7) & ~(size_t)7;
}

static uint8_t *build_dir(const struct q2_bitmaps *b, size_t *len)
{
	size_t total = 0, off = 0;
	uint8_t *dir;

	for (size_t i = 0; i < b->n; i++)
		total += entry_len(&b->e[i]);
	dir = calloc(1, total ? total : 1);
	if (!dir)
		return NULL;
	for (size_t i = 0; i < b->n; i++) {
		const struct q2_bm *m = &b->e[i];
		size_t nl = strlen(m->name);

		ioc__put_be64(dir + off, m->table_off);
		ioc__put_be32(dir + off + 8, m->table_size);
		ioc__put_be32(dir + off + 12, m->flags);
		dir[off + 16] = Q2_BME_TYPE_DIRTY;
		dir[off + 17] = (uint8_t)m->gran_bits;
		dir[off + 18] = (uint8_t)(nl >> 8);
		dir[off + 19] = (uint8_t)nl;
		memcpy(dir + off + Q2_BME_HDR_LEN, m->name, nl);
		off += entry_len(m);
	}
	*len = total;
	return dir;
}

/* Steps (1)-(3) of the essay for b->e as it is now (lock held). */
static int sync_dir(struct q2_bitmaps *b)
{
	struct q2_state *q = b->q;
	uint64_t old_off = b->dir_off, old_size = b->dir_size, off = 0;
	size_t len = 0;
	uint8_t *dir = NULL;
	int ret = 0;

	if (b->n) {
		uint64_t nc;

		dir = build_dir(b, &len);
		if (!dir)
			return -ENOMEM;
		nc = clusters_of(q, len);
		ret = alloc_run(q, nc, &off);
		if (ret == 0) {
			uint8_t *pad = realloc(dir, nc << q->cluster_bits);

			ret = pad ? 0 : -ENOMEM;
			if (pad) {
				dir = pad;
				memset(dir + len, 0, (nc << q->cluster_bits) - len);
				ret = ioc__qcow2_pwrite(q, off, dir, nc << q->cluster_bits);
			}
			if (ret < 0)
				(void)ioc__qcow2_defer_free(q, off, nc << q->cluster_bits);
		}
		free(dir);
		if (ret < 0)
			return ret;
	}
	/* (1) everything new and its refcounts durable before anything
	 * points at it. */
	ret = ioc__qcow2_write_refblocks(q, false);
	if (ret == 0)
		ret = ioc__qcow2_flush_file(q);
	if (ret < 0)
		return ret;
	b->dir_off = off;
	b->dir_size = len;
	/* Failed: the header names the old directory or this one; the next
	 * commit frees this one (the old may leak), never one in use. */
	ret = write_ext(b, b->n > 0);
	if (ret < 0)
		return ret;
	if (old_size)
		(void)ioc__qcow2_defer_free(q, old_off, old_size);
	return 0;
}

/* ---- the store: add and remove over QMP ---------------------------------- */

struct store_call {
	struct q2_bitmaps *b;
	const struct ioc_blk_dirty_info *info;
	const char *name;
	int ret;
};

static void ioc_coroutine_fn add_co(void *opaque)
{
	struct store_call *c = opaque;
	struct q2_bitmaps *b = c->b;
	struct q2_state *q = b->q;
	unsigned gb = (unsigned)__builtin_ctzll(c->info->granularity);
	uint64_t ts = ioc__qcow2_bitmap_table_size(q->h.size, gb, q->cluster_bits), off = 0;
	struct q2_bm m = { 0 }, *e;
	size_t dlen;
	int ret;

	if (!q->rw) {
		c->ret = -EROFS;
		return;
	}
	if (q->h.version < 3) {
		c->ret = -ENOTSUP;    /* no autoclear bits: QEMU refuses v2 too */
		return;
	}
	if (ts == 0 || ts > Q2_BME_MAX_TABLE || (ts << q->cluster_bits) > Q2_BME_MAX_PHYS ||
	    strlen(c->info->name) > Q2_BME_MAX_NAME) {
		c->ret = -EINVAL;
		return;
	}
	/* The header's count and the directory's size have limits too. */
	dlen = (Q2_BME_HDR_LEN + strlen(c->info->name) + 7) & ~(size_t)7;
	for (size_t i = 0; i < b->n; i++)
		dlen += entry_len(&b->e[i]);
	if (b->n >= Q2_MAX_BITMAPS || dlen > Q2_MAX_BITMAP_DIR) {
		c->ret = -ENOSPC;
		return;
	}
	e = realloc(b->e, (b->n + 1) * sizeof(*e));
	if (!e) {
		c->ret = -ENOMEM;
		return;
	}
	b->e = e;
	m.name = strdup(c->info->name);
	m.table = calloc(ts, 8);
	ret = m.name && m.table ? 0 : -ENOMEM;
	ioc_co_mutex_lock(&q->lock);
	/* An all-zero table: the bitmap is in use, its bits are in memory. */
	if (ret == 0)
		ret = write_table(q, NULL, (uint32_t)ts, &off);
	if (ret == 0) {
		m.gran_bits = gb;
		m.flags = Q2_BME_IN_USE | (c->info->recording ? Q2_BME_AUTO : 0);
		m.table_off = off;
		m.table_size = (uint32_t)ts;
		b->e[b->n++] = m;
		ret = sync_dir(b);
		if (ret < 0) {
			/* The header may name it already: its table leaks
			 * rather than be freed under it. */
			b->n--;
		} else {
			(void)ioc__qcow2_writeback(q, true);   /* the old directory's frees */
		}
	}
	ioc_co_mutex_unlock(&q->lock);
	if (ret < 0) {
		free(m.name);
		free(m.table);
	}
	c->ret = ret;
}

static void ioc_coroutine_fn remove_co(void *opaque)
{
	struct store_call *c = opaque;
	struct q2_bitmaps *b = c->b;
	struct q2_state *q = b->q;
	struct q2_bm m;
	size_t i;
	int ret;

	for (i = 0; i < b->n && strcmp(b->e[i].name, c->name) != 0; i++)
		;
	c->ret = 0;
	if (i == b->n)
		return;                /* not in the image: nothing to do (QEMU) */
	if (!q->rw) {
		c->ret = -EROFS;
		return;
	}
	m = b->e[i];
	ioc_co_mutex_lock(&q->lock);
	memmove(&b->e[i], &b->e[i + 1], (b->n - i - 1) * sizeof(*b->e));
	b->n--;
	ret = sync_dir(b);
	if (ret < 0) {
		memmove(&b->e[i + 1], &b->e[i], (b->n - i) * sizeof(*b->e));
		b->e[i] = m;
		b->n++;
	} else {
		char err[128];

		/* A stale table is read now to free its data; one that does
		 * not check (or is absurdly large) leaks instead. */
		if (!m.table && (uint64_t)m.table_size * 8 <= (32u << 20))
			(void)read_table(q, m.table_off, m.table_size, &m.table, err,
					 sizeof(err));
		free_table(q, m.table_off, m.table_size, m.table);
		free(m.name);
		free(m.table);
		/* The frees now rather than at the next guest flush. */
		(void)ioc__qcow2_writeback(q, true);
	}
	ioc_co_mutex_unlock(&q->lock);
	c->ret = ret;
}

static int store_add(void *opaque, const struct ioc_blk_dirty_info *info)
{
	struct store_call c = { opaque, info, NULL, 0 };
	int ret;

	if (c.b->loading)
		return 0;
	ret = ioc__qcow2_run_sync(c.b->q->node, add_co, &c);
	return ret < 0 ? ret : c.ret;
}

static int store_remove(void *opaque, const char *name)
{
	struct store_call c = { opaque, NULL, name, 0 };
	int ret = ioc__qcow2_run_sync(c.b->q->node, remove_co, &c);

	return ret < 0 ? ret : c.ret;
}

static const struct ioc_blk_dirty_store store = {
	.add = store_add,
	.remove = store_remove,
};

/* ---- open ------------------------------------------------------------------- */

/* One entry's bits into the set (not in use: its table was checked). */
static int load_bits(struct q2_state *q, struct ioc_blk_dirty *bm, const struct q2_bm *m,
		     char *err, size_t errlen)
{
	uint8_t *buf = malloc(q->cs);
	uint64_t per = q->cs * 8;
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0; i < m->table_size && ret == 0; i++) {
		uint64_t data = m->table[i] & Q2_BTE_OFFSET_MASK;

		if (!data && !(m->table[i] & Q2_BTE_ALL_ONES))
			continue;
		if (data) {
			ret = ioc__qcow2_pread(q, data, buf, q->cs);
			if (ret < 0)
				ERR("Could not read bitmap '%s' from image: %s", m->name,
				    ioc_strerror(ret));
		} else {
			memset(buf, 0xff, q->cs);
		}
		if (ret == 0)
			ret = ioc_blk_dirty_import(bm, i * per, buf, q->cs);
	}
	free(buf);
	return ret;
}

static int load(struct q2_bitmaps *b, char *err, size_t errlen)
{
	struct q2_state *q = b->q;
	uint64_t fsz = atomic_load(&q->file_size), doff = q->h.bitmap_dir_off;
	uint64_t dsize = q->h.bitmap_dir_size;
	struct q2_bitmap_entry *ent = NULL;
	uint8_t *dir = NULL;
	bool changed = false;
	int ret;

	if (dsize == 0) {
		ERR("Requested bitmap directory size is zero");
		return -EINVAL;
	}
	if (doff < q->cs || doff > fsz || fsz - doff < dsize) {
		ERR("bitmaps_ext: bitmap directory offset %#" PRIx64 " invalid (%s)", doff,
		    doff < q->cs ? "it overlaps the image header" :
		    "the directory ends past the end of the file");
		return -EINVAL;
	}
	dir = malloc((size_t)dsize);
	ent = calloc(q->h.nb_bitmaps, sizeof(*ent));
	b->e = calloc(q->h.nb_bitmaps, sizeof(*b->e));
	ret = -ENOMEM;
	if (!dir || !ent || !b->e)
		goto out;
	ret = ioc__qcow2_pread(q, doff, dir, (size_t)dsize);
	if (ret < 0) {
		ERR("Failed to read bitmap directory: %s", ioc_strerror(ret));
		goto out;
	}
	ret = ioc__qcow2_parse_bitmap_dir(dir, (size_t)dsize, q->h.nb_bitmaps, q->h.size,
					  q->cluster_bits, fsz, ent, err, errlen);
	if (ret < 0)
		goto out;
	/* What the directory's parser let through, the block layer takes:
	 * its limits are qcow2's (count, name length, granularity). */
	_Static_assert(IOC_BLK_DIRTY_MAX >= Q2_MAX_BITMAPS &&
		       IOC_BLK_DIRTY_NAME_MAX > Q2_BME_MAX_NAME &&
		       IOC_BLK_DIRTY_GRAN_MIN <= (1u << Q2_BME_MIN_GRAN_BITS) &&
		       IOC_BLK_DIRTY_GRAN_MAX >= (1ull << Q2_BME_MAX_GRAN_BITS),
		       "qcow2's bitmap limits are within the block layer's");
	for (uint32_t i = 0; i < q->h.nb_bitmaps; i++) {
		struct q2_bitmap_entry *x = &ent[i];
		struct q2_bm *m = &b->e[b->n];
		struct ioc_blk_dirty *bm = NULL;
		bool in_use = x->flags & Q2_BME_IN_USE;

		m->name = strndup(x->name, x->name_len);
		if (!m->name) {
			ret = -ENOMEM;
			goto out;
		}
		m->gran_bits = x->gran_bits;
		m->flags = x->flags;
		m->table_off = x->table_off;
		m->table_size = x->table_size;
		b->n++;
		if (!in_use) {
			if (x->table_size != ioc__qcow2_bitmap_table_size(q->h.size, x->gran_bits,
									  q->cluster_bits)) {
				ERR("Could not read bitmap '%s' from image: bitmap_table_size "
				    "%" PRIu32 " does not match the image size", m->name,
				    x->table_size);
				ret = -EINVAL;
				goto out;
			}
			char why[160];

			ret = read_table(q, x->table_off, x->table_size, &m->table, why,
					 sizeof(why));
			if (ret < 0) {
				ERR("Could not read bitmap_table table from image for bitmap "
				    "'%s': %s", m->name, ret == -EINVAL ? why : ioc_strerror(ret));
				goto out;
			}
		}
		b->loading = true;
		ret = ioc_blk_dirty_add(b->set, &(struct ioc_blk_dirty_opts){
			.name = m->name, .granularity = 1ull << x->gran_bits,
			.persistent = true, .disabled = !(x->flags & Q2_BME_AUTO),
			.inconsistent = in_use }, &bm);
		b->loading = false;
		if (ret < 0) {
			ERR("Could not load bitmap '%s': %s", m->name, ioc_strerror(ret));
			goto out;
		}
		if (!in_use) {
			ret = load_bits(q, bm, m, err, errlen);
			if (ret < 0)
				goto out;
			/* Open read-write: in use from now on (written below). */
			if (q->rw) {
				m->flags |= Q2_BME_IN_USE;
				changed = true;
			}
		}
	}
	b->dir_off = doff;
	b->dir_size = dsize;
	if (changed) {
		/* A new directory with the flags set, committed like any
		 * other (not in place: a crash keeps the old one whole). */
		ret = sync_dir(b);
		/* No request runs yet: the old directory goes now, not leaked
		 * by a crash before the first flush. */
		if (ret == 0)
			ret = ioc__qcow2_writeback(q, true);
		if (ret < 0)
			ERR("Can't update bitmap directory: %s", ioc_strerror(ret));
	}
out:
	free(dir);
	free(ent);
	return ret;
}

int ioc__qcow2_bitmaps_open(struct q2_state *q, char *err, size_t errlen)
{
	struct q2_bitmaps *b = calloc(1, sizeof(*b));
	struct ioc_blk_opts o = { .driver = IOC_BLK_DRIVER_NULL, .null_size = q->h.size };
	int ret;

	if (!b)
		return -ENOMEM;
	b->q = q;
	b->nt.fn = ioc__node_mark_dirty_set;
	q->bitmaps = b;
	ret = ioc_blk_open(&b->set, NULL, &o);
	if (ret < 0) {
		ERR("Could not make the node's bitmap set: %s", ioc_strerror(ret));
		return ret;
	}
	ioc_blk_dirty_set_store(b->set, &store, b);
	if (q->h.has_bitmaps) {
		ret = load(b, err, errlen);
		if (ret < 0)
			return ret;
	} else if (q->rw && (q->h.autoclear & Q2_AUTOCLEAR_BITMAPS)) {
		/* The bit without the extension says nothing: it goes. */
		ret = put_autoclear(q, false);
		if (ret < 0) {
			ERR("Could not update qcow2 header: %s", ioc_strerror(ret));
			return ret;
		}
	}
	q->node->dirty_set = b->set;
	ioc_node_add_notifier(q->node, &b->nt);
	b->notifying = true;
	return 0;
}

/* ---- close -------------------------------------------------------------------- */

/* The bits of bm into new data clusters and a new table: m then names
 * them; what it named before is returned in old (freed after the commit). */
static int store_bits(struct q2_state *q, struct q2_bm *m, struct ioc_blk_dirty *bm,
		      struct q2_bm *old)
{
	uint32_t ts = (uint32_t)ioc__qcow2_bitmap_table_size(q->h.size, m->gran_bits,
							     q->cluster_bits);
	uint64_t *tab = calloc(ts ? ts : 1, 8), per = q->cs * 8, off = 0;
	uint8_t *buf = malloc(q->cs);
	int ret = tab && buf ? 0 : -ENOMEM;

	for (uint32_t i = 0; i < ts && ret == 0; i++) {
		bool any = false;

		ret = ioc_blk_dirty_export(bm, i * per, buf, q->cs);
		for (size_t k = 0; ret == 0 && k < q->cs && !any; k++)
			any = buf[k] != 0;
		if (ret < 0 || !any)
			continue;
		ret = ioc__qcow2_alloc_cluster(q, &tab[i]);
		if (ret == 0)
			ret = ioc__qcow2_pwrite(q, tab[i], buf, q->cs);
	}
	if (ret == 0)
		ret = write_table(q, tab, ts, &off);
	free(buf);
	if (ret < 0) {
		free_table(q, 0, ts, tab);
		free(tab);
		return ret;
	}
	*old = *m;
	m->table_off = off;
	m->table_size = ts;
	m->table = tab;
	return 0;
}

int ioc__qcow2_bitmaps_close(struct q2_state *q)
{
	struct q2_bitmaps *b = q->bitmaps;
	struct q2_bm *old;
	int ret = 0;

	if (!b || !q->rw || !b->n || q->failed)
		return 0;
	old = calloc(b->n, sizeof(*old));
	if (!old)
		return -ENOMEM;
	ioc_co_mutex_lock(&q->lock);
	for (size_t i = 0; i < b->n && ret == 0; i++) {
		struct q2_bm *m = &b->e[i];
		struct ioc_blk_dirty *bm = ioc_blk_dirty_find(b->set, m->name);
		struct ioc_blk_dirty_info info;

		if (!bm)
			continue;
		ioc_blk_dirty_get_info(bm, &info);
		if (info.inconsistent)
			continue;      /* stays as found: in use */
		ret = store_bits(q, m, bm, &old[i]);
		if (ret == 0)
			m->flags = info.recording ? Q2_BME_AUTO : 0;
	}
	if (ret == 0)
		ret = sync_dir(b);
	/* Committed: what the old directory named goes.  Failed: the new
	 * clusters leak, the bitmaps stay in use (inconsistent next time). */
	for (size_t i = 0; i < b->n; i++) {
		if (ret == 0 && old[i].table_off)
			free_table(q, old[i].table_off, old[i].table_size, old[i].table);
		free(old[i].table);
	}
	ioc_co_mutex_unlock(&q->lock);
	free(old);
	return ret;
}

void ioc__qcow2_bitmaps_free(struct q2_state *q)
{
	struct q2_bitmaps *b = q->bitmaps;

	if (!b)
		return;
	/* Close and failed opens: no request runs.  The node goes right
	 * after its driver state, so the notifier needs no drain. */
	if (b->notifying)
		(void)ioc__node_unlink_notifier(q->node, &b->nt);
	q->node->dirty_set = NULL;
	if (b->set)
		ioc_blk_close(b->set);
	for (size_t i = 0; i < b->n; i++) {
		free(b->e[i].name);
		free(b->e[i].table);
	}
	free(b->e);
	free(b);
	q->bitmaps = NULL;
}

int ioc__qcow2_bitmaps_resize(struct q2_state *q, uint64_t size)
{
	struct q2_bitmaps *b = q->bitmaps;
	struct ioc_blk_dirty_info info;

	if (!b)
		return 0;
	if (ioc_blk_dirty_list(b->set, &info, 1) > 0 || b->n)
		return -EBUSY;
	return ioc_blk_co_truncate(b->set, size, 0);
}

void ioc__qcow2_bitmaps_info(struct q2_state *q, json_t *data)
{
	struct q2_bitmaps *b = q->bitmaps;
	json_t *list;

	if (!b || !b->n)
		return;
	list = json_array();
	for (size_t i = 0; list && i < b->n; i++) {
		json_t *flags = json_array();

		if (flags && (b->e[i].flags & Q2_BME_IN_USE))
			json_array_append_new(flags, json_string("in-use"));
		if (flags && (b->e[i].flags & Q2_BME_AUTO))
			json_array_append_new(flags, json_string("auto"));
		json_array_append_new(list, json_pack("{s:o,s:s,s:I}", "flags", flags,
						      "name", b->e[i].name, "granularity",
						      (json_int_t)(1ll << b->e[i].gran_bits)));
	}
	json_object_set_new(data, "bitmaps", list);
}
