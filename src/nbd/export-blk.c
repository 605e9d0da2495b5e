/*
 * The block-layer backend of an export: each NBD operation is one
 * coroutine call into the block layer, which runs it on the calling I/O
 * thread's loop (its io_uring, or its thread pool).  Nothing here is
 * shared between I/O threads except the immutable struct ioc_blk.
 *
 * CAN_MULTI_CONN is advertised: the server keeps no cache of its own, and
 * a flush is an fdatasync of the one file every connection writes to, so
 * a flush on one connection covers writes completed on all of them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/blk.h"
#include "nbd-int.h"

static int ioc_coroutine_fn be_pread(void *be, uint64_t off, void *buf, size_t len,
				     uint32_t flags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	return ioc_blk_co_preadv(be, off, &iov, 1, 0);
}

static int ioc_coroutine_fn be_pwrite(void *be, uint64_t off, const void *buf,
				      size_t len, uint32_t flags)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };

	return ioc_blk_co_pwritev(be, off, &iov, 1,
				  (flags & IOC_NBD_BE_FUA) ? IOC_BLK_FUA : 0);
}

static ssize_t be_splice_read(void *be, uint64_t off, size_t len, int pipe_fd,
			      uint32_t flags)
{
	return ioc_blk_splice_read(be, off, len, pipe_fd, 0);
}

static const void *be_map_read(void *be, uint64_t off, size_t len)
{
	return ioc_blk_map_read(be, off, len);
}

static int be_map_fault(void *be, uint64_t off, void *buf, size_t len)
{
	return ioc_blk_map_fault(be, off, buf, len);
}

static void *be_map_write(void *be, uint64_t off, size_t len, uint32_t flags)
{
	return ioc_blk_map_write(be, off, len, (flags & IOC_NBD_BE_FUA) ? IOC_BLK_FUA : 0);
}

static int be_map_written(void *be, uint64_t off, size_t len)
{
	return ioc_blk_map_written(be, off, len);
}

static int be_map_store(void *be, uint64_t off, const void *buf, size_t len)
{
	return ioc_blk_map_store(be, off, buf, len);
}

static int ioc_coroutine_fn be_splice_write(void *be, uint64_t off, size_t len,
					    int pipe_fd, uint32_t flags)
{
	return ioc_blk_co_splice_write(be, off, len, pipe_fd,
				       (flags & IOC_NBD_BE_FUA) ? IOC_BLK_FUA : 0);
}

static int ioc_coroutine_fn be_flush(void *be, uint32_t flags)
{
	return ioc_blk_co_flush(be, 0);
}

static int ioc_coroutine_fn be_trim(void *be, uint64_t off, uint64_t len,
				    uint32_t flags)
{
	return ioc_blk_co_discard(be, off, len, 0);
}

static int ioc_coroutine_fn be_zero(void *be, uint64_t off, uint64_t len,
				    uint32_t flags)
{
	uint32_t f = 0;

	if (flags & IOC_NBD_BE_FUA)
		f |= IOC_BLK_FUA;
	if (flags & IOC_NBD_BE_MAY_TRIM)
		f |= IOC_BLK_MAY_UNMAP;
	if (flags & IOC_NBD_BE_FAST_ONLY)
		f |= IOC_BLK_NO_FALLBACK;
	return ioc_blk_co_write_zeroes(be, off, len, f);
}

static int ioc_coroutine_fn be_block_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_blk_co_block_status(be, off, len, pnum, 0);

	if (st == -ENOTSUP || st == -EOPNOTSUPP) {
		*pnum = len; /* unknown: "allocated", which is always safe */
		return 0;
	}
	if (st < 0)
		return st;
	return ((st & IOC_BLK_STATUS_DATA) ? 0 : NBD_STATE_HOLE) |
	       ((st & IOC_BLK_STATUS_ZERO) ? NBD_STATE_ZERO : 0);
}

/* Dirty bitmaps: only consistent ones are offered. */
static int be_dirty_names(void *be, char (*names)[IOC_NBD_BITMAP_NAME_MAX], int max)
{
	struct ioc_blk_dirty_info info[IOC_BLK_DIRTY_MAX];
	int n = ioc_blk_dirty_list(be, info, IOC_BLK_DIRTY_MAX), k = 0;

	for (int i = 0; i < n && i < IOC_BLK_DIRTY_MAX; i++) {
		if (info[i].inconsistent)
			continue;
		if (k < max)
			memcpy(names[k], info[i].name, IOC_NBD_BITMAP_NAME_MAX);
		k++;
	}
	return k;
}

/* Looked up by name on every request: a bitmap removed meanwhile fails
 * the request rather than reporting a stale state.  Removed bitmaps stay
 * allocated until the image closes (dirty-bitmap.c), so the pointer
 * found stays valid while it is used. */
static int be_dirty_status(void *be, const char *name, uint64_t off, uint64_t len,
			   uint64_t *pnum, uint32_t flags)
{
	struct ioc_blk_dirty *bm = ioc_blk_dirty_find(be, name);

	if (!bm)
		return -ENOENT;
	return ioc_blk_dirty_extent(bm, off, len, pnum);
}

_Static_assert(IOC_NBD_BITMAP_NAME_MAX == IOC_BLK_DIRTY_NAME_MAX, "bitmap names");

static const struct ioc__nbd_backend_ops blk_ops = {
	.pread = be_pread,
	.pwrite = be_pwrite,
	.flush = be_flush,
	.trim = be_trim,
	.zero = be_zero,
	.block_status = be_block_status,
	.cache = NULL, /* a hint: answered at once */
	.dirty_names = be_dirty_names,
	.dirty_status = be_dirty_status,
	.splice_read = be_splice_read,
	.splice_write = be_splice_write,
	.map_read = be_map_read,
	.map_fault = be_map_fault,
	.map_write = be_map_write,
	.map_written = be_map_written,
	.map_store = be_map_store,
};

int ioc__nbd_blk_export_new(struct ioc__nbd_export **out,
			    const struct ioc_nbd_export_opts *opts)
{
	struct ioc_blk_info info;
	struct ioc__nbd_export *e;
	int ret;

	if (!opts->blk)
		return -EINVAL;
	ret = ioc__nbd_export_alloc(&e, opts);
	if (ret < 0)
		return ret;
	ioc_blk_get_info(opts->blk, &info);
	e->size = info.size;
	e->read_only = opts->read_only || info.read_only;
	e->can_trim = info.can_discard;
	e->can_zero = true; /* the block layer falls back to writing zeroes */
	e->can_fast_zero = info.can_zero;
	e->can_fua = true;  /* FUA is a write plus flush at worst */
	e->can_cache = true;
	e->can_block_status = true; /* without support: one "data" extent */
	e->multi_conn = true;
	/* The block layer bounces unaligned requests, so only clients that
	 * negotiate block sizes are held to min_align. */
	e->min_block = info.min_align > 1 ? info.min_align : 1;
	e->pref_block = info.opt_align > 4096 ? info.opt_align : 4096;
	if (e->pref_block > IOC_NBD_MAX_PAYLOAD)
		e->pref_block = IOC_NBD_MAX_PAYLOAD;
	e->max_block = IOC_NBD_MAX_PAYLOAD;
	e->ops = &blk_ops;
	e->be = opts->blk;
	e->blk = opts->blk;
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
