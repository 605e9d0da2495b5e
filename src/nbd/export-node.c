/*
 * An export of a block node (src/node): each NBD operation is one call
 * into the node layer, which counts it in the node's statistics, runs the
 * node's driver (a file, a qcow2 image, an rbd image, a compressed image)
 * and its write notifiers.  This is how the storage daemon exports: any
 * driver, one set of counters per node whatever front end asks.
 *
 * The zero-copy paths (splice, the image mapping) reach past the node into
 * the file under it (ioc_node_blk()), so they are offered only where that
 * changes nothing: a node that passes requests to a file unchanged, no
 * detect-zeroes, and for writes no write notifier at the time of the
 * request; what they serve is counted in the node's statistics all the
 * same (ioc_node_account()).  Dirty bitmaps are the node's (ioc_node_dirty_blk():
 * a qcow2 node's own, or those of the file under a node that passes
 * requests to it unchanged), and only those the export names (QEMU's "bitmaps");
 * qemu:allocation-depth only when asked for.  CAN_MULTI_CONN follows the
 * node's multi_conn.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "node/node.h"
#include "nbd-int.h"

/* The backend: the node and what the export shows of it. */
struct nd {
	struct ioc_node *n;
	struct ioc_blk *blk;            /* zero-copy paths into it, or NULL */
	bool own;                       /* the export holds n's reference */
	bool all_bitmaps;               /* every consistent one (iocore-nbd) */
	unsigned nbitmaps;
	char (*bitmaps)[IOC_NBD_BITMAP_NAME_MAX];
	struct ioc__nbd_backend_ops ops;
};

#define N(be) (((struct nd *)(be))->n)

static int ioc_coroutine_fn nd_pread(void *be, uint64_t off, void *buf, size_t len,
				     uint32_t flags)
{
	return ioc_node_co_pread(N(be), off, buf, len, 0);
}

static int ioc_coroutine_fn nd_pwrite(void *be, uint64_t off, const void *buf,
				      size_t len, uint32_t flags)
{
	return ioc_node_co_pwrite(N(be), off, buf, len,
				  (flags & IOC_NBD_BE_FUA) ? IOC_NODE_FUA : 0);
}

static int ioc_coroutine_fn nd_flush(void *be, uint32_t flags)
{
	return ioc_node_co_flush(N(be), 0);
}

static int ioc_coroutine_fn nd_trim(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	return ioc_node_co_discard(N(be), off, len, 0);
}

static int ioc_coroutine_fn nd_zero(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	uint32_t f = 0;

	if (flags & IOC_NBD_BE_FUA)
		f |= IOC_NODE_FUA;
	if (flags & IOC_NBD_BE_MAY_TRIM)
		f |= IOC_NODE_MAY_UNMAP;
	if (flags & IOC_NBD_BE_FAST_ONLY)
		f |= IOC_NODE_NO_FALLBACK;
	return ioc_node_co_write_zeroes(N(be), off, len, f);
}

static int ioc_coroutine_fn nd_block_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_node_co_block_status(N(be), off, len, pnum, NULL);

	if (st < 0)
		return st;
	return ((st & IOC_NODE_ST_DATA) ? 0 : NBD_STATE_HOLE) |
	       ((st & IOC_NODE_ST_ZERO) ? NBD_STATE_ZERO : 0);
}

static int ioc_coroutine_fn nd_depth_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	unsigned depth = 1;
	int st = ioc_node_co_block_status(N(be), off, len, pnum, &depth);

	if (st < 0)
		return st;
	return (st & IOC_NODE_ST_ALLOCATED) ? (int)depth : 0;
}

_Static_assert(IOC_NBD_BITMAP_NAME_MAX == IOC_BLK_DIRTY_NAME_MAX,
	       "a context names any bitmap");

/* Whether a client may use bm (an inconsistent one is not served). */
static bool servable(struct ioc_blk_dirty *bm, struct ioc_blk_dirty_info *info)
{
	ioc_blk_dirty_get_info(bm, info);
	return !info->inconsistent;
}

static int nd_dirty_names(void *be, const char **names, int max)
{
	struct nd *d = be;
	struct ioc_blk *blk = ioc_node_dirty_blk(d->n);
	struct ioc_blk_dirty_info *info;
	struct ioc_blk_dirty **v = NULL;
	int k = 0, n;

	if (!blk)
		return 0;
	info = malloc(sizeof(*info));
	if (!info)
		return -ENOMEM;
	if (d->all_bitmaps) {
		n = ioc_blk_dirty_handles(blk, NULL, 0);
		v = n > 0 ? malloc((size_t)n * sizeof(*v)) : NULL;
		if (n > 0 && !v) {
			free(info);
			return -ENOMEM;
		}
		n = v ? ioc_blk_dirty_handles(blk, v, n) : 0;
		for (int i = 0; i < n; i++) {
			if (!servable(v[i], info))
				continue;
			if (k < max)
				names[k] = ioc_blk_dirty_name(v[i]);
			k++;
		}
		free(v);
		free(info);
		return k;
	}
	for (unsigned i = 0; i < d->nbitmaps; i++) {
		struct ioc_blk_dirty *bm = ioc_blk_dirty_find(blk, d->bitmaps[i]);

		if (!bm || !servable(bm, info))
			continue;
		if (k < max)
			names[k] = ioc_blk_dirty_name(bm);
		k++;
	}
	free(info);
	return k;
}

static int nd_dirty_status(void *be, const char *name, uint64_t off, uint64_t len,
			   uint64_t *pnum, uint32_t flags)
{
	struct ioc_blk *blk = ioc_node_dirty_blk(N(be));
	struct ioc_blk_dirty *bm = blk ? ioc_blk_dirty_find(blk, name) : NULL;

	if (!bm)
		return -ENOENT;
	return ioc_blk_dirty_extent(bm, off, len, pnum);
}

/* ---- zero-copy paths into the file under the node ----------------------- */

static ssize_t nd_splice_read(void *be, uint64_t off, size_t len, int pipe_fd,
			      uint32_t flags)
{
	struct nd *d = be;
	int64_t t0 = ioc_now_ns();
	ssize_t n = ioc_blk_splice_read(d->blk, off, len, pipe_fd, 0);

	/* Only a whole read is this request's; a short one is read again. */
	if (n == (ssize_t)len)
		ioc_node_account(d->n, IOC_NODE_OP_READ, off, len, 0, t0);
	return n;
}

static const void *nd_map_read(void *be, uint64_t off, size_t len)
{
	struct nd *d = be;
	int64_t t0 = ioc_now_ns();
	const void *p = ioc_blk_map_read(d->blk, off, len);

	if (p)
		ioc_node_account(d->n, IOC_NODE_OP_READ, off, len, 0, t0);
	return p;
}

static int nd_map_fault(void *be, uint64_t off, void *buf, size_t len)
{
	return ioc_blk_map_fault(((struct nd *)be)->blk, off, buf, len);
}

/* Writes past the node only while nothing must see them there. */
static bool writes_bypass(struct nd *d)
{
	/* Acquire: pairs with the release store in ioc_node_add_notifier(). */
	return !d->n->detect_zeroes &&
	       !atomic_load_explicit(&d->n->notifiers, memory_order_acquire);
}

static void *nd_map_write(void *be, uint64_t off, size_t len, uint32_t flags)
{
	struct nd *d = be;

	if (!writes_bypass(d))
		return NULL;
	return ioc_blk_map_write(d->blk, off, len, (flags & IOC_NBD_BE_FUA) ? IOC_BLK_FUA : 0);
}

static int nd_map_written(void *be, uint64_t off, size_t len)
{
	struct nd *d = be;
	int64_t t0 = ioc_now_ns();
	int r = ioc_blk_map_written(d->blk, off, len);

	if (len)
		ioc_node_account(d->n, IOC_NODE_OP_WRITE, off, len, r, t0);
	return r;
}

static int nd_map_store(void *be, uint64_t off, const void *buf, size_t len)
{
	return ioc_blk_map_store(((struct nd *)be)->blk, off, buf, len);
}

static int ioc_coroutine_fn nd_splice_write(void *be, uint64_t off, size_t len,
					    int pipe_fd, uint32_t flags)
{
	struct nd *d = be;
	int64_t t0 = ioc_now_ns();
	int r;

	if (!writes_bypass(d))
		return -ENOTSUP;
	r = ioc_blk_co_splice_write(d->blk, off, len, pipe_fd,
				    (flags & IOC_NBD_BE_FUA) ? IOC_BLK_FUA : 0);
	if (len && r != -ENOTSUP)
		ioc_node_account(d->n, IOC_NODE_OP_WRITE, off, len, r, t0);
	return r;
}

static void nd_free(void *be)
{
	struct nd *d = be;

	if (d->own)
		ioc_node_unref(d->n);
	free(d->bitmaps);
	free(d);
}

int ioc__nbd_node_export_new(struct ioc__nbd_export **out,
			     const struct ioc_nbd_export_opts *opts, struct ioc_node *n,
			     bool own)
{
	struct ioc__nbd_export *e;
	struct nd *d;
	int ret;

	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->n = n;
	d->own = own;
	d->all_bitmaps = !opts->node; /* iocore-nbd offers every consistent one */
	for (const char *const *b = opts->bitmaps; b && *b; b++)
		d->nbitmaps++;
	d->bitmaps = calloc(d->nbitmaps ? d->nbitmaps : 1, sizeof(*d->bitmaps));
	if (!d->bitmaps) {
		free(d);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < d->nbitmaps; i++)
		snprintf(d->bitmaps[i], sizeof(d->bitmaps[i]), "%s", opts->bitmaps[i]);
	ret = ioc__nbd_export_alloc(&e, opts);
	if (ret < 0) {
		free(d->bitmaps);
		free(d);
		return ret;
	}
	d->ops = (struct ioc__nbd_backend_ops){
		.pread = nd_pread, .pwrite = nd_pwrite, .flush = nd_flush, .trim = nd_trim,
		.zero = nd_zero, .block_status = nd_block_status,
		.dirty_names = nd_dirty_names, .dirty_status = nd_dirty_status,
		/* iocore-nbd always offers qemu:allocation-depth; the daemon
		 * when asked, as QEMU. */
		.depth_status = opts->allocation_depth || !opts->node ? nd_depth_status : NULL,
	};
	d->blk = ioc_node_blk(n);
	if (d->blk && !n->detect_zeroes) {
		d->ops.splice_read = nd_splice_read;
		d->ops.map_read = nd_map_read;
		d->ops.map_fault = nd_map_fault;
		if (!n->read_only) {
			d->ops.splice_write = nd_splice_write;
			d->ops.map_write = nd_map_write;
			d->ops.map_written = nd_map_written;
			d->ops.map_store = nd_map_store;
		}
	}
	e->size = n->size;
	e->read_only = opts->read_only || n->read_only;
	e->can_trim = n->can_discard || n->discard_unmap;
	e->can_zero = true;         /* the node layer falls back to writing */
	e->can_fast_zero = n->can_fast_zero;
	e->can_fua = true;
	e->can_cache = true;
	e->can_block_status = true;
	e->multi_conn = n->multi_conn;
	e->min_block = n->min_align > 1 ? n->min_align : 1;
	e->pref_block = n->opt_align > 4096 ? n->opt_align : 4096;
	if (e->pref_block > IOC_NBD_MAX_PAYLOAD)
		e->pref_block = IOC_NBD_MAX_PAYLOAD;
	e->max_block = IOC_NBD_MAX_PAYLOAD;
	e->ops = &d->ops;
	e->be = d;
	e->be_free = nd_free;
	e->blk = d->blk;
	e->node = n;
	*out = e;
	return 0;
}

int ioc__nbd_export_alloc(struct ioc__nbd_export **out,
			  const struct ioc_nbd_export_opts *opts)
{
	struct ioc__nbd_export *e;

	*out = NULL;
	if (opts->name && strlen(opts->name) > IOC_NBD_MAX_STRING)
		return -ENAMETOOLONG;
	if (opts->description && strlen(opts->description) > IOC_NBD_MAX_STRING)
		return -ENAMETOOLONG;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->name = strdup(opts->name ? opts->name : "");
	e->description = opts->description ? strdup(opts->description) : NULL;
	if (!e->name || (opts->description && !e->description)) {
		ioc__nbd_export_free(e);
		return -ENOMEM;
	}
	*out = e;
	return 0;
}

void ioc__nbd_export_free(struct ioc__nbd_export *e)
{
	if (!e)
		return;
	if (e->be_free)
		e->be_free(e->be);
	free(e->name);
	free(e->description);
	free(e);
}
