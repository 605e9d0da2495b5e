/*
 * Protocol drivers over the block layer: "file" and "host_device" (a raw
 * file or block device through struct ioc_blk, io_uring or the thread
 * pool), "null-co" (the block layer's null driver), and the "raw" format
 * driver that passes requests to its file child, with QEMU's offset and
 * size to serve a slice of it.
 *
 * Each request is one coroutine call into the block layer, which runs it
 * on the calling loop.  Flag values are the block layer's (node.h), so
 * they pass through unchanged.  Persistent dirty bitmaps live in sidecar
 * files beside the image and are loaded at open, as QEMU loads a qcow2
 * image's.  The ioc_blk is handed to front ends (ioc_node_blk()) for the
 * zero-copy paths that only a plain file has: a raw node without offset
 * or size hands its child's on, since it changes nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node-int.h"

static const char *const aio_values[] = { "threads", "native", "io_uring", NULL };

static const struct ioc__qmp_arg file_opts[] = {
	{ "filename", IOC_QMP_STR, false },
	{ "aio", IOC_QMP_ENUM, true, .values = aio_values },
	{ NULL },
};

/* A node's facts from its image. */
static void set_from_blk(struct ioc_node *n, struct ioc_blk *blk,
			 const struct ioc_blk_info *info)
{
	n->opaque = blk;
	n->size = info->size;
	n->read_only = info->read_only;
	n->can_discard = info->can_discard;
	n->can_fast_zero = info->can_zero;
	n->can_block_status = true;
	n->min_align = info->min_align > 1 ? info->min_align : 1;
	n->opt_align = info->opt_align > 1 ? info->opt_align : 1;
}

static int file_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	const char *path = ioc__node_opt_str(opts, "filename", "");
	const char *aio = ioc__node_opt_str(opts, "aio", "io_uring");
	struct ioc_blk_opts bo = { .read_only = n->read_only };
	struct ioc_blk_info info;
	struct ioc_blk *blk;
	int ret;

	if (strcmp(aio, "native") == 0) {
		snprintf(err, errlen, "aio=native is not supported; use aio=io_uring");
		return -ENOTSUP;
	}
	/* QEMU's default is threads; iocore's is io_uring where the loop has
	 * a ring (the block layer falls back to threads otherwise). */
	bo.aio = !json_object_get(opts, "aio") ? IOC_BLK_AIO_AUTO :
		 strcmp(aio, "threads") == 0 ? IOC_BLK_AIO_THREADS : IOC_BLK_AIO_IO_URING;
	bo.cache = n->direct ? IOC_BLK_CACHE_NONE : IOC_BLK_CACHE_WRITEBACK;
	ret = ioc_blk_open(&blk, path, &bo);
	if (ret < 0) {
		snprintf(err, errlen, "Could not open '%s': %s", path, ioc_strerror(ret));
		return ret;
	}
	ioc_blk_get_info(blk, &info);
	if (info.is_blockdev != (n->drv == &ioc__node_drv_host_device) &&
	    n->drv == &ioc__node_drv_host_device) {
		ioc_blk_close(blk);
		snprintf(err, errlen, "'host_device' driver requires '%s' to be either a "
			 "character or block device", path);
		return -EINVAL;
	}
	ret = ioc_blk_dirty_load(blk);
	if (ret < 0) {
		ioc_blk_close(blk);
		snprintf(err, errlen, "Could not load the dirty bitmaps of '%s': %s", path,
			 ioc_strerror(ret));
		return ret;
	}
	set_from_blk(n, blk, &info);
	ioc__node_set_filename(n, path);
	return 0;
}

static void file_close(struct ioc_node *n)
{
	ioc_blk_close(n->opaque);
}

static int ioc_coroutine_fn file_preadv(struct ioc_node *n, uint64_t off,
					const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return ioc_blk_co_preadv(n->opaque, off, iov, iovcnt, flags);
}

static int ioc_coroutine_fn file_pwritev(struct ioc_node *n, uint64_t off,
					 const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return ioc_blk_co_pwritev(n->opaque, off, iov, iovcnt, flags);
}

static int ioc_coroutine_fn file_flush(struct ioc_node *n, uint32_t flags)
{
	return ioc_blk_co_flush(n->opaque, 0);
}

static int ioc_coroutine_fn file_discard(struct ioc_node *n, uint64_t off, uint64_t len,
					 uint32_t flags)
{
	return ioc_blk_co_discard(n->opaque, off, len, 0);
}

static int ioc_coroutine_fn file_zero(struct ioc_node *n, uint64_t off, uint64_t len,
				      uint32_t flags)
{
	return ioc_blk_co_write_zeroes(n->opaque, off, len, flags);
}

static int ioc_coroutine_fn file_status(struct ioc_node *n, uint64_t off, uint64_t len,
					uint64_t *pnum, unsigned *depth)
{
	int st = ioc_blk_co_block_status(n->opaque, off, len, pnum, 0);

	if (depth)
		*depth = 1;
	if (st == -ENOTSUP || st == -EOPNOTSUPP) {
		*pnum = len; /* unknown: data, which is always safe */
		return IOC_NODE_ST_DATA | IOC_NODE_ST_ALLOCATED;
	}
	if (st < 0)
		return st;
	/* A protocol node decides every byte of itself. */
	return ((st & IOC_BLK_STATUS_DATA) ? IOC_NODE_ST_DATA : 0) |
	       ((st & IOC_BLK_STATUS_ZERO) ? IOC_NODE_ST_ZERO : 0) | IOC_NODE_ST_ALLOCATED;
}

static int ioc_coroutine_fn file_truncate(struct ioc_node *n, uint64_t size)
{
	int ret = ioc_blk_co_truncate(n->opaque, size, 0);

	if (ret == 0)
		n->size = size;
	return ret;
}

static struct ioc_blk *file_blk(struct ioc_node *n)
{
	return n->opaque;
}

/* The I/O of every driver over an ioc_blk of its own. */
#define BLK_IO                                  \
	.close = file_close,                    \
	.co_preadv = file_preadv,               \
	.co_pwritev = file_pwritev,             \
	.co_flush = file_flush,                 \
	.co_discard = file_discard,             \
	.co_write_zeroes = file_zero,           \
	.co_block_status = file_status

const struct ioc_node_drv ioc__node_drv_file = {
	.name = "file", .opts = file_opts, .open = file_open, BLK_IO,
	.co_truncate = file_truncate, .blk = file_blk,
};

const struct ioc_node_drv ioc__node_drv_host_device = {
	.name = "host_device", .opts = file_opts, .open = file_open, BLK_IO,
	.co_truncate = file_truncate, .blk = file_blk,
};

int ioc_node_wrap_blk(struct ioc_node_graph *g, struct ioc_blk *blk, const char *name,
		      struct ioc_node **out)
{
	struct ioc_blk_info info;
	const struct ioc_node_drv *drv;
	struct ioc_node *n;

	ioc_blk_get_info(blk, &info);
	drv = info.is_blockdev ? &ioc__node_drv_host_device :
	      info.path ? &ioc__node_drv_file : &ioc__node_drv_null_co;
	n = ioc__node_new(g, drv, name);
	if (!n)
		return -ENOMEM;
	n->borrowed = true;
	set_from_blk(n, blk, &info);
	n->discard_unmap = true; /* the caller's image: trims reach it */
	n->direct = info.direct;
	n->filename = info.path;
	*out = n;
	return 0;
}

/* ---- null-co --------------------------------------------------------------- */

static const struct ioc__qmp_arg null_opts[] = {
	{ "size", IOC_QMP_SIZE, true },
	{ "read-zeroes", IOC_QMP_BOOL, true },
	{ "latency-ns", IOC_QMP_INT, true, .min = 0, .max = INT64_MAX },
	{ NULL },
};

static int null_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	struct ioc_blk_opts bo = {
		.driver = IOC_BLK_DRIVER_NULL,
		.null_size = (uint64_t)ioc__node_opt_int(opts, "size", 1ll << 30),
		.null_read_zeroes = ioc__node_opt_bool(opts, "read-zeroes", false),
		.null_latency_ns = ioc__node_opt_int(opts, "latency-ns", 0),
		.read_only = n->read_only,
	};
	struct ioc_blk *blk;
	int ret = ioc_blk_open(&blk, NULL, &bo);

	if (ret < 0) {
		snprintf(err, errlen, "Could not open the null device: %s", ioc_strerror(ret));
		return ret;
	}
	n->opaque = blk;
	n->size = bo.null_size;
	n->can_discard = n->can_fast_zero = n->can_block_status = true;
	return 0;
}

const struct ioc_node_drv ioc__node_drv_null_co = {
	.name = "null-co", .opts = null_opts, .open = null_open, BLK_IO,
};

/* ---- raw ------------------------------------------------------------------- */

static const struct ioc__qmp_arg raw_opts[] = {
	{ "file", IOC_QMP_REF, false },
	{ "offset", IOC_QMP_SIZE, true },
	{ "size", IOC_QMP_SIZE, true },
	{ NULL },
};

struct raw {
	uint64_t offset;
	bool slice;             /* offset or size given */
};

static int raw_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	struct raw *r = calloc(1, sizeof(*r));
	int ret;

	if (!r)
		return -ENOMEM;
	ret = ioc_node_open_child(n, json_object_get(opts, "file"), "file", &n->file, err,
				  errlen);
	if (ret < 0) {
		free(r);
		return ret;
	}
	r->offset = (uint64_t)ioc__node_opt_int(opts, "offset", 0);
	r->slice = json_object_get(opts, "offset") || json_object_get(opts, "size");
	if (r->offset > n->file->size) {
		snprintf(err, errlen, "The sum of offset (%llu) and size (0) has to be smaller "
			 "or equal to the actual size of the containing file (%llu)",
			 (unsigned long long)r->offset, (unsigned long long)n->file->size);
		goto fail;
	}
	n->size = (uint64_t)ioc__node_opt_int(opts, "size",
					      (int64_t)(n->file->size - r->offset));
	if (n->size > n->file->size - r->offset) {
		snprintf(err, errlen, "The sum of offset (%llu) and size (%llu) has to be "
			 "smaller or equal to the actual size of the containing file (%llu)",
			 (unsigned long long)r->offset, (unsigned long long)n->size,
			 (unsigned long long)n->file->size);
		goto fail;
	}
	n->read_only = n->read_only || n->file->read_only;
	n->can_discard = n->file->can_discard;
	n->can_fast_zero = n->file->can_fast_zero;
	n->can_block_status = n->file->can_block_status;
	n->min_align = n->file->min_align;
	n->opt_align = n->file->opt_align;
	n->filename = n->file->filename;
	n->opaque = r;
	return 0;
fail:
	ioc_node_unref(n->file);
	n->file = NULL;
	free(r);
	return -EINVAL;
}

static void raw_close(struct ioc_node *n)
{
	free(n->opaque);
}

static inline uint64_t raw_off(struct ioc_node *n)
{
	return ((struct raw *)n->opaque)->offset;
}

static int ioc_coroutine_fn raw_preadv(struct ioc_node *n, uint64_t off,
				       const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return ioc_node_co_preadv(n->file, off + raw_off(n), iov, iovcnt, flags);
}

static int ioc_coroutine_fn raw_pwritev(struct ioc_node *n, uint64_t off,
					const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return ioc_node_co_pwritev(n->file, off + raw_off(n), iov, iovcnt, flags);
}

static int ioc_coroutine_fn raw_flush(struct ioc_node *n, uint32_t flags)
{
	return ioc_node_co_flush(n->file, flags);
}

static int ioc_coroutine_fn raw_discard(struct ioc_node *n, uint64_t off, uint64_t len,
					uint32_t flags)
{
	return ioc_node_co_discard(n->file, off + raw_off(n), len, flags);
}

static int ioc_coroutine_fn raw_zero(struct ioc_node *n, uint64_t off, uint64_t len,
				     uint32_t flags)
{
	return ioc_node_co_write_zeroes(n->file, off + raw_off(n), len, flags);
}

static int ioc_coroutine_fn raw_status(struct ioc_node *n, uint64_t off, uint64_t len,
				       uint64_t *pnum, unsigned *depth)
{
	int st = ioc_node_co_block_status(n->file, off + raw_off(n), len, pnum, NULL);

	if (depth)
		*depth = 1;
	return st < 0 ? st : st | IOC_NODE_ST_ALLOCATED;
}

static int ioc_coroutine_fn raw_truncate(struct ioc_node *n, uint64_t size)
{
	int ret;

	if (((struct raw *)n->opaque)->slice)
		return -ENOTSUP;
	ret = ioc_node_co_truncate(n->file, size);
	if (ret == 0)
		n->size = n->file->size;
	return ret;
}

static struct ioc_blk *raw_blk(struct ioc_node *n)
{
	return ((struct raw *)n->opaque)->slice ? NULL : ioc_node_blk(n->file);
}

const struct ioc_node_drv ioc__node_drv_raw = {
	.name = "raw",
	.opts = raw_opts,
	.open = raw_open,
	.close = raw_close,
	.co_preadv = raw_preadv,
	.co_pwritev = raw_pwritev,
	.co_flush = raw_flush,
	.co_discard = raw_discard,
	.co_write_zeroes = raw_zero,
	.co_block_status = raw_status,
	.co_truncate = raw_truncate,
	.blk = raw_blk,
};
