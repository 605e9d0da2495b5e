/*
 * qcow2's repair at open: the refcounts of an image left dirty.
 *
 * Problem: with lazy refcounts the driver writes L2 entries before the
 * refcounts that cover them, and marks the image dirty while it is open;
 * after a crash the refcount blocks on disk may count too little (a
 * cluster in use reads as free, and would be handed out twice) or too
 * much (a leak).  QEMU repairs such an image when it opens it writable;
 * so must we, or the image cannot be written again without qemu-img.
 *
 * Design: the refcounts are a cache of what the metadata says, so they
 * are counted again from it: the header, the refcount table and the
 * blocks it names, the active L1 table and every snapshot's, each L2
 * table they name, every data cluster (and the clusters a compressed
 * one's sectors span) an L2 entry names, the snapshot table, the bitmap
 * directory and its tables.  One 32-bit count and one byte of flags per
 * cluster of the file; an L2 table shared by several L1 tables is read
 * once and counted with its multiplicity, so the reads are bounded by
 * the file's size (checked: a budget).  A cluster named in two roles
 * (an L2 entry into the header, a refcount block inside an L2 table), a
 * cluster that must be owned alone named twice (metadata, or an entry
 * with COPIED), or a name past the file's end is corruption: the open is
 * refused with what is wrong, and nothing is written.
 *
 * Then the blocks: a range that needs a block and has none gets one in a
 * free cluster of its own range (it counts itself, so no other block
 * changes for it); those are written and flushed before the table names
 * them; then every block whose contents differ is rewritten in place;
 * a flush; only then the dirty bit goes.  Nothing the count reads (L1,
 * L2, snapshots, bitmaps, where the blocks are) is changed before the
 * dirty bit is cleared, and only clusters the count found free are
 * written, so a crash during the repair leaves an image still dirty that
 * the next open counts the same way.
 *
 * Rejected: QEMU's rebuild of the whole refcount structure at the end
 * of the file (needed when the table itself is lost, which the driver's
 * own ordering never does); a repair that also grows the table: refused,
 * with qemu-img check -r all named, as is an image over CK_MAX_CLUSTERS.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/node.h"
#include "qcow2.h"

/* 32M clusters: 160 MiB of counts and flags at most (2 TiB of 64 KiB
 * clusters, 16 GiB of 512-byte ones). */
#define CK_MAX_CLUSTERS (1ull << 25)

enum ck_kind { K_FREE, K_META, K_L2, K_DATA, K_COMP };

#define F_KIND   0x07
#define F_EXCL   0x08           /* must be owned alone */
#define F_ACTIVE 0x10           /* an L2 table the active L1 names */

static const char *const kind_name[] = {
	"free", "metadata", "an L2 table", "a data cluster", "compressed data",
};

struct ck {
	struct q2_state *q;
	struct q2_geom g;
	uint64_t n;             /* clusters in the file */
	uint32_t *rc;
	uint8_t *fl;
	uint64_t budget;        /* table bytes left to read */
	char *err;
	size_t errlen;
};

#define CKERR(c, ...) snprintf((c)->err, (c)->errlen, "Could not repair dirty image: " __VA_ARGS__)

static int ck_read(struct ck *c, uint64_t off, void *buf, uint64_t len, const char *what)
{
	int ret;

	if (len > c->budget) {
		CKERR(c, "%s: more metadata than the file holds", what);
		return -EIO;
	}
	c->budget -= len;
	ret = ioc__qcow2_pread(c->q, off, buf, (size_t)len);
	if (ret < 0)
		CKERR(c, "could not read %s: %s", what, ioc_strerror(ret));
	return ret;
}

/* One more reference (mult of them) to the cluster at off, as kind. */
static int ref(struct ck *c, uint64_t off, enum ck_kind kind, bool excl, uint32_t mult,
	       const char *what)
{
	uint64_t i = off >> c->q->cluster_bits;
	unsigned had;

	if (i >= c->n) {
		CKERR(c, "%s at %#" PRIx64 " is past the end of the file", what, off);
		return -EIO;
	}
	had = c->fl[i] & F_KIND;
	if (had != K_FREE && had != kind) {
		CKERR(c, "cluster %#" PRIx64 " is both %s and %s (%s)",
		      i << c->q->cluster_bits, kind_name[had], kind_name[kind], what);
		return -EIO;
	}
	if ((excl || (c->fl[i] & F_EXCL)) && c->rc[i]) {
		CKERR(c, "cluster %#" PRIx64 " (%s) is referenced twice but may have only one "
		      "owner (%s)", i << c->q->cluster_bits, kind_name[had], what);
		return -EIO;
	}
	if (c->rc[i] > UINT32_MAX - mult) {
		CKERR(c, "cluster %#" PRIx64 " has too many references", i << c->q->cluster_bits);
		return -EIO;
	}
	c->rc[i] += mult;
	c->fl[i] = (uint8_t)((c->fl[i] & ~F_KIND) | kind | (excl ? F_EXCL : 0));
	return 0;
}

/* Every cluster [off, off+len) touches. */
static int ref_range(struct ck *c, uint64_t off, uint64_t len, enum ck_kind kind, bool excl,
		     uint32_t mult, const char *what)
{
	uint64_t cs = c->q->cs;

	if (!len)
		return 0;
	if (off > c->g.file_size || len > c->g.file_size - off) {
		CKERR(c, "%s at %#" PRIx64 " ends past the end of the file", what, off);
		return -EIO;
	}
	for (uint64_t o = off & ~(cs - 1); o < off + len; o += cs) {
		int ret = ref(c, o, kind, excl, mult, what);

		if (ret < 0)
			return ret;
	}
	return 0;
}

/* The L2 tables an L1 table (host-endian entries) names. */
static int walk_l1(struct ck *c, const uint64_t *l1, uint64_t n, bool active)
{
	char why[128];

	for (uint64_t i = 0; i < n; i++) {
		uint64_t e = l1[i], off = e & Q2_L1E_OFFSET_MASK;
		int ret;

		if (!off)
			continue;
		if (ioc__qcow2_check_l1e(&c->g, e, why, sizeof(why)) < 0) {
			CKERR(c, "%s L1 table: %s", active ? "active" : "snapshot", why);
			return -EIO;
		}
		ret = ref(c, off, K_L2, active && (e & Q2_OFLAG_COPIED), 1, "L2 table");
		if (ret < 0)
			return ret;
		if (active)
			c->fl[off >> c->q->cluster_bits] |= F_ACTIVE;
	}
	return 0;
}

static int walk_snapshots(struct ck *c)
{
	struct q2_state *q = c->q;
	uint64_t off = q->h.snapshots_off, end = off;
	uint8_t hdr[Q2_SNAPSHOT_HDR_LEN];
	uint64_t *l1 = NULL;
	int ret = 0;

	for (uint32_t s = 0; s < q->h.nb_snapshots; s++) {
		int64_t len;

		/* Checked at open (read_snapshots()): in the file, bounded. */
		ret = ck_read(c, off, hdr, sizeof(hdr), "the snapshot table");
		if (ret < 0)
			goto out;
		len = ioc__qcow2_parse_snapshot(hdr, &q->h, c->g.file_size, s, c->err, c->errlen);
		if (len < 0) {
			ret = (int)len;
			goto out;
		}
		uint64_t l1_off;
		uint32_t l1_n;

		memcpy(&l1_off, hdr, 8);
		memcpy(&l1_n, hdr + 8, 4);
		l1_off = be64toh(l1_off);
		l1_n = be32toh(l1_n);
		ret = ref_range(c, l1_off, (uint64_t)l1_n * 8, K_META, true, 1,
				"snapshot L1 table");
		if (ret < 0)
			goto out;
		if (l1_n) {
			l1 = malloc((size_t)l1_n * 8);
			ret = -ENOMEM;
			if (!l1) {
				CKERR(c, "out of memory");
				goto out;
			}
			ret = ck_read(c, l1_off, l1, (uint64_t)l1_n * 8, "a snapshot L1 table");
			if (ret < 0)
				goto out;
			for (uint32_t i = 0; i < l1_n; i++)
				l1[i] = be64toh(l1[i]);
			ret = walk_l1(c, l1, l1_n, false);
			if (ret < 0)
				goto out;
			free(l1);
			l1 = NULL;
		}
		end = off + (uint64_t)len;
		off += ((uint64_t)len + 7) & ~7ull;
	}
	if (q->h.nb_snapshots)
		ret = ref_range(c, q->h.snapshots_off, end - q->h.snapshots_off, K_META, true, 1,
				"snapshot table");
out:
	free(l1);
	return ret;
}

/* The bitmap directory (docs/interop/qcow2.txt, "Bitmaps"), its tables
 * and the clusters they name. */
static int walk_bitmaps(struct ck *c)
{
	struct q2_state *q = c->q;
	uint64_t doff = q->h.bitmap_dir_off, dsize = q->h.bitmap_dir_size;
	struct q2_bitmap_entry *ent = NULL;
	uint8_t *dir = NULL;
	uint64_t *tab = NULL;
	int ret;

	ret = ref_range(c, doff, dsize, K_META, true, 1, "bitmap directory");
	if (ret < 0)
		return ret;
	dir = malloc(dsize ? (size_t)dsize : 1);
	if (!dir) {
		CKERR(c, "out of memory");
		return -ENOMEM;
	}
	ret = ck_read(c, doff, dir, dsize, "the bitmap directory");
	/* The bitmaps' own parser: a directory it refuses fails the open
	 * anyway, repaired or not. */
	if (ret == 0) {
		ent = calloc(q->h.nb_bitmaps ? q->h.nb_bitmaps : 1, sizeof(*ent));
		ret = ent ? ioc__qcow2_parse_bitmap_dir(dir, (size_t)dsize, q->h.nb_bitmaps,
							q->h.size, q->cluster_bits,
							c->g.file_size, ent, c->err, c->errlen)
			  : -ENOMEM;
		if (ret == -ENOMEM)
			CKERR(c, "out of memory");
	}
	for (uint32_t b = 0; ret == 0 && b < q->h.nb_bitmaps; b++) {
		uint64_t toff = ent[b].table_off;
		uint32_t tsize = ent[b].table_size;

		/* QEMU's limit is larger; this one keeps the buffer below
		 * the largest L1 table's. */
		if ((uint64_t)tsize * 8 > Q2_MAX_L1_BYTES) {
			CKERR(c, "bitmap table of %" PRIu32 " entries too large", tsize);
			ret = -EFBIG;
			break;
		}
		ret = ref_range(c, toff, (uint64_t)tsize * 8, K_META, true, 1, "bitmap table");
		if (ret < 0 || !tsize)
			continue;
		tab = malloc((size_t)tsize * 8);
		ret = -ENOMEM;
		if (!tab) {
			CKERR(c, "out of memory");
			break;
		}
		ret = ck_read(c, toff, tab, (uint64_t)tsize * 8, "a bitmap table");
		for (uint32_t i = 0; ret == 0 && i < tsize; i++) {
			uint64_t e = be64toh(tab[i]), off = e & Q2_L1E_OFFSET_MASK;

			if (!off)
				continue;
			if (off & (q->cs - 1)) {
				CKERR(c, "bitmap data cluster %#" PRIx64 " unaligned", off);
				ret = -EIO;
				break;
			}
			ret = ref(c, off, K_META, true, 1, "bitmap data");
		}
		free(tab);
		tab = NULL;
	}
	free(ent);
	free(dir);
	return ret;
}

/* Every L2 table once, its entries counted as often as L1 tables name it. */
static int walk_l2(struct ck *c)
{
	struct q2_state *q = c->q;
	unsigned words = q->words;
	uint64_t *t = aligned_alloc(4096, (q->cs + 4095) & ~4095ull);
	char why[128];
	int ret = 0;

	if (!t) {
		CKERR(c, "out of memory");
		return -ENOMEM;
	}
	for (uint64_t i = 1; i < c->n && ret == 0; i++) {
		if ((c->fl[i] & F_KIND) != K_L2)
			continue;
		/* Only L1 entries add to an L2 table's count, and no entry
		 * below can (ref() refuses a data reference to a table). */
		uint32_t mult = c->rc[i];
		bool active = c->fl[i] & F_ACTIVE;

		ret = ck_read(c, i << q->cluster_bits, t, q->cs, "an L2 table");
		for (uint64_t j = 0; ret == 0 && j < q->cs / 8; j += words) {
			uint64_t e = be64toh(t[j]), off, len;

			if (e & Q2_OFLAG_COMPRESSED) {
				if (ioc__qcow2_compressed_extent(&c->g, e, &off, &len, why,
								 sizeof(why)) < 0) {
					CKERR(c, "L2 table %#" PRIx64 ": %s", i << q->cluster_bits,
					      why);
					ret = -EIO;
					break;
				}
				ret = ref_range(c, off, len, K_COMP, false, mult,
						"compressed cluster");
				continue;
			}
			off = e & Q2_L2E_OFFSET_MASK;
			if (!off)
				continue;
			if (off & (q->cs - 1)) {
				CKERR(c, "L2 table %#" PRIx64 ": data cluster %#" PRIx64
				      " unaligned", i << q->cluster_bits, off);
				ret = -EIO;
				break;
			}
			ret = ref(c, off, K_DATA, active && (e & Q2_OFLAG_COPIED), mult,
				  "data cluster");
		}
	}
	free(t);
	return ret;
}

static int count_all(struct ck *c)
{
	struct q2_state *q = c->q;
	uint64_t *l1 = NULL;
	int ret;

	ret = ref(c, 0, K_META, true, 1, "header");
	if (ret == 0)
		ret = ref_range(c, q->rt_off, (uint64_t)q->rt_clusters << q->cluster_bits, K_META,
				true, 1, "refcount table");
	for (uint64_t i = 0; ret == 0 && i < q->rt_entries; i++) {
		uint64_t e = q->rt[i], off = e & Q2_RTE_OFFSET_MASK;

		if (!off)
			continue;
		if ((e & 0x1ff) || (off & (q->cs - 1))) {
			CKERR(c, "refcount block %" PRIu64 " at %#" PRIx64 " is invalid", i, e);
			ret = -EIO;
			break;
		}
		ret = ref(c, off, K_META, true, 1, "refcount block");
	}
	if (ret == 0)
		ret = ref_range(c, q->l1_off, (uint64_t)q->l1_size * 8, K_META, true, 1,
				"active L1 table");
	if (ret == 0 && q->l1_size) {
		l1 = malloc((size_t)q->l1_size * 8);
		if (!l1) {
			CKERR(c, "out of memory");
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < q->l1_size; i++)
			l1[i] = atomic_load_explicit(&q->l1[i], memory_order_relaxed);
		ret = walk_l1(c, l1, q->l1_size, true);
		free(l1);
	}
	if (ret == 0)
		ret = walk_snapshots(c);
	if (ret == 0 && q->h.has_bitmaps)
		ret = walk_bitmaps(c);
	if (ret == 0)
		ret = walk_l2(c);
	/* What must be owned alone, and what the width can count. */
	for (uint64_t i = 0; ret == 0 && i < c->n; i++) {
		unsigned k = c->fl[i] & F_KIND;

		if ((c->fl[i] & F_EXCL) && c->rc[i] > 1) {
			CKERR(c, "cluster %#" PRIx64 " (%s) is referenced %" PRIu32 " times but "
			      "may have only one owner", i << q->cluster_bits, kind_name[k], c->rc[i]);
			ret = -EIO;
		} else if (c->rc[i] > q->rc_max) {
			CKERR(c, "cluster %#" PRIx64 " is referenced %" PRIu32 " times, more than "
			      "%u-bit refcounts hold", i << q->cluster_bits, c->rc[i],
			      1u << q->h.refcount_order);
			ret = -EIO;
		} else if (c->rc[i] && (i >> q->rb_bits) >= q->rt_entries) {
			CKERR(c, "cluster %#" PRIx64 " is past what the refcount table covers "
			      "(repair it with 'qemu-img check -r all')", i << q->cluster_bits);
			ret = -ENOTSUP;
		}
	}
	return ret;
}

/* The count of cluster i, the one new cluster past the file's end
 * (extra, when not UINT64_MAX) included. */
static uint64_t count_of(const struct ck *c, uint64_t i, uint64_t extra)
{
	if (i < c->n)
		return c->rc[i];
	return i == extra ? 1 : 0;
}

static void fill_block(const struct ck *c, uint64_t idx, uint64_t extra, uint8_t *b)
{
	struct q2_state *q = c->q;
	uint64_t per = 1ull << q->rb_bits, first = idx << q->rb_bits;

	memset(b, 0, q->cs);
	for (uint64_t j = 0; j < per && first + j < c->n + 1; j++)
		ioc__qcow2_rc_set(b, q->h.refcount_order, j, count_of(c, first + j, extra));
}

/* A free cluster of block idx's own range for the block itself. */
static int place_block(struct ck *c, uint64_t idx, uint64_t *extra, uint64_t *where)
{
	struct q2_state *q = c->q;
	uint64_t first = idx << q->rb_bits, end = first + (1ull << q->rb_bits);

	for (uint64_t i = first ? first : 1; i < end; i++) {
		if (i < c->n && (c->rc[i] || (c->fl[i] & F_KIND)))
			continue;
		if (i >= c->n) {
			if (*extra != UINT64_MAX || i != c->n)
				break;
			*extra = i;
		} else {
			c->rc[i] = 1;
			c->fl[i] = K_META | F_EXCL;
		}
		*where = i << q->cluster_bits;
		return 0;
	}
	CKERR(c, "no free cluster for refcount block %" PRIu64 " (repair it with "
	      "'qemu-img check -r all')", idx);
	return -ENOSPC;
}

static bool range_used(const struct ck *c, uint64_t idx)
{
	uint64_t first = idx << c->q->rb_bits, end = first + (1ull << c->q->rb_bits);

	for (uint64_t i = first; i < end && i < c->n; i++)
		if (c->rc[i])
			return true;
	return false;
}

static int write_blocks(struct ck *c)
{
	struct q2_state *q = c->q;
	uint64_t *placed = calloc(q->rt_entries, sizeof(*placed));
	uint64_t extra = UINT64_MAX;
	size_t bsz = (q->cs + 4095) & ~4095ull;
	uint8_t *b = aligned_alloc(4096, bsz), *old = aligned_alloc(4096, bsz);
	bool any_new = false, any = false;
	int ret = -ENOMEM;

	if (!placed || !b || !old) {
		CKERR(c, "out of memory");
		goto out;
	}
	ret = 0;
	for (uint64_t i = 0; i < q->rt_entries && ret == 0; i++)
		if (!(q->rt[i] & Q2_RTE_OFFSET_MASK) && range_used(c, i)) {
			ret = place_block(c, i, &extra, &placed[i]);
			any_new = true;
		}
	if (ret < 0)
		goto out;
	/* New blocks: in clusters nothing names, durable before the table
	 * names them. */
	if (extra != UINT64_MAX) {
		ret = ioc_node_co_truncate(q->file, (extra + 1) << q->cluster_bits);
		if (ret < 0)
			goto io;
		atomic_store_explicit(&q->file_size, (extra + 1) << q->cluster_bits,
				      memory_order_relaxed);
	}
	for (uint64_t i = 0; i < q->rt_entries && ret == 0; i++) {
		if (!placed[i])
			continue;
		fill_block(c, i, extra, b);
		ret = ioc__qcow2_pwrite(q, placed[i], b, q->cs);
	}
	if (ret == 0 && any_new)
		ret = ioc__qcow2_flush_file(q);
	for (uint64_t i = 0; i < q->rt_entries && ret == 0; i++) {
		if (!placed[i])
			continue;
		uint64_t be = htobe64(placed[i]);

		ret = ioc__qcow2_pwrite(q, q->rt_off + i * 8, &be, 8);
		if (ret == 0)
			q->rt[i] = placed[i];
	}
	if (ret == 0 && any_new)
		ret = ioc__qcow2_flush_file(q);
	/* The blocks that were there: rewritten where they differ. */
	for (uint64_t i = 0; i < q->rt_entries && ret == 0; i++) {
		uint64_t off = q->rt[i] & Q2_RTE_OFFSET_MASK;

		if (!off || placed[i])
			continue;
		fill_block(c, i, extra, b);
		ret = ioc__qcow2_pread(q, off, old, q->cs);
		if (ret == 0 && memcmp(old, b, q->cs) != 0) {
			ret = ioc__qcow2_pwrite(q, off, b, q->cs);
			any = true;
		}
	}
	if (ret == 0 && any)
		ret = ioc__qcow2_flush_file(q);
io:
	if (ret < 0)
		CKERR(c, "could not write the refcounts: %s", ioc_strerror(ret));
out:
	free(placed);
	free(b);
	free(old);
	return ret;
}

int ioc__qcow2_repair(struct q2_state *q, char *err, size_t errlen)
{
	uint64_t fsz = atomic_load_explicit(&q->file_size, memory_order_relaxed);
	struct ck c = {
		.q = q,
		.g = q->geom,
		.n = (fsz + q->cs - 1) >> q->cluster_bits,
		.err = err,
		.errlen = errlen,
	};
	int ret;

	c.g.file_size = fsz;
	/* Tables are refused before they are read when they overlap one
	 * counted already, and each L2 table is read once: the walk reads at
	 * most the file's size and the snapshot headers.  The budget, twice
	 * that, is the bound a mistake here cannot pass. */
	c.budget = 2 * fsz + 2 * q->cs + (uint64_t)q->h.nb_snapshots * Q2_SNAPSHOT_HDR_LEN;
	if (c.n > CK_MAX_CLUSTERS) {
		CKERR(&c, "%" PRIu64 " clusters are more than this driver repairs (repair it "
		      "with 'qemu-img check -r all')", c.n);
		return -EFBIG;
	}
	c.rc = calloc(c.n ? c.n : 1, sizeof(*c.rc));
	c.fl = calloc(c.n ? c.n : 1, 1);
	ret = -ENOMEM;
	if (!c.rc || !c.fl) {
		CKERR(&c, "out of memory");
		goto out;
	}
	ret = count_all(&c);
	if (ret == 0)
		ret = write_blocks(&c);
	if (ret < 0)
		goto out;
	/* Every block read before is stale now. */
	for (uint64_t i = 0; i < q->rt_entries; i++) {
		free(q->rb[i]);
		q->rb[i] = NULL;
		q->rb_dirty[i] = false;
	}
	q->free_hint = 1;
	/* Durable (flushed above): the dirty bit goes. */
	ret = ioc__qcow2_header_put64(q, Q2_OFF_INCOMPAT, &q->h.incompat,
				      q->h.incompat & ~Q2_INCOMPAT_DIRTY);
	if (ret < 0) {
		CKERR(&c, "could not clear the dirty bit: %s", ioc_strerror(ret));
		goto out;
	}
out:
	free(c.rc);
	free(c.fl);
	return ret;
}
