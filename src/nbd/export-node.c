/*
 * An export of a block node (src/node): each NBD operation is one call
 * into the node layer, which counts it in the node's statistics, runs the
 * node's driver (a file, a qcow2 image, an rbd image, a compressed image)
 * and its write notifiers.  This is how the storage daemon exports: any
 * driver, one set of counters per node whatever front end asks.
 *
 * The zero-copy paths (splice, the image mapping) are not offered: they
 * reach past the node into a file, where its statistics and notifiers
 * would not see them.  Dirty bitmaps are those of the file under the node
 * (ioc_node_blk()), offered when the node passes requests to a file
 * unchanged.  CAN_MULTI_CONN follows the node's multi_conn.
 */
#include <errno.h>
#include <string.h>

#include "node/node.h"
#include "nbd-int.h"

static int ioc_coroutine_fn nd_pread(void *be, uint64_t off, void *buf, size_t len,
				     uint32_t flags)
{
	return ioc_node_co_pread(be, off, buf, len, 0);
}

static int ioc_coroutine_fn nd_pwrite(void *be, uint64_t off, const void *buf,
				      size_t len, uint32_t flags)
{
	return ioc_node_co_pwrite(be, off, buf, len,
				  (flags & IOC_NBD_BE_FUA) ? IOC_NODE_FUA : 0);
}

static int ioc_coroutine_fn nd_flush(void *be, uint32_t flags)
{
	return ioc_node_co_flush(be, 0);
}

static int ioc_coroutine_fn nd_trim(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	int r = ioc_node_co_discard(be, off, len, 0);

	if (r == 0 && (flags & IOC_NBD_BE_FUA))
		r = ioc_node_co_flush(be, 0);
	return r;
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
	return ioc_node_co_write_zeroes(be, off, len, f);
}

static int ioc_coroutine_fn nd_block_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_node_co_block_status(be, off, len, pnum, NULL);

	if (st < 0)
		return st;
	return ((st & IOC_NODE_ST_DATA) ? 0 : NBD_STATE_HOLE) |
	       ((st & IOC_NODE_ST_ZERO) ? NBD_STATE_ZERO : 0);
}

static int ioc_coroutine_fn nd_depth_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	unsigned depth = 1;
	int st = ioc_node_co_block_status(be, off, len, pnum, &depth);

	if (st < 0)
		return st;
	return (st & IOC_NODE_ST_ALLOCATED) ? (int)depth : 0;
}

static int nd_dirty_names(void *be, char (*names)[IOC_NBD_BITMAP_NAME_MAX], int max)
{
	struct ioc_blk *blk = ioc_node_blk(be);
	struct ioc_blk_dirty_info info[IOC_BLK_DIRTY_MAX];
	int n = blk ? ioc_blk_dirty_list(blk, info, IOC_BLK_DIRTY_MAX) : 0, k = 0;

	for (int i = 0; i < n && i < IOC_BLK_DIRTY_MAX; i++) {
		if (info[i].inconsistent)
			continue;
		if (k < max)
			memcpy(names[k], info[i].name, IOC_NBD_BITMAP_NAME_MAX);
		k++;
	}
	return k;
}

static int nd_dirty_status(void *be, const char *name, uint64_t off, uint64_t len,
			   uint64_t *pnum, uint32_t flags)
{
	struct ioc_blk *blk = ioc_node_blk(be);
	struct ioc_blk_dirty *bm = blk ? ioc_blk_dirty_find(blk, name) : NULL;

	if (!bm)
		return -ENOENT;
	return ioc_blk_dirty_extent(bm, off, len, pnum);
}

static const struct ioc__nbd_backend_ops node_ops = {
	.pread = nd_pread,
	.pwrite = nd_pwrite,
	.flush = nd_flush,
	.trim = nd_trim,
	.zero = nd_zero,
	.block_status = nd_block_status,
	.cache = NULL, /* a hint: answered at once */
	.dirty_names = nd_dirty_names,
	.dirty_status = nd_dirty_status,
	.depth_status = nd_depth_status,
};

int ioc__nbd_node_export_new(struct ioc__nbd_export **out,
			     const struct ioc_nbd_export_opts *opts)
{
	struct ioc_node *n = opts->node;
	struct ioc__nbd_export *e;
	int ret;

	if (!n || opts->blk || opts->zip)
		return -EINVAL;
	ret = ioc__nbd_export_alloc(&e, opts);
	if (ret < 0)
		return ret;
	e->size = n->size;
	e->read_only = opts->read_only || n->read_only;
	e->can_trim = true;         /* a hint the node may ignore (discard=) */
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
	e->ops = &node_ops;
	e->be = n;
	e->blk = ioc_node_blk(n);
	e->node = n;
	*out = e;
	return 0;
}
