/*
 * iocore's compressed images as nodes: "__org.iocore_zip" serves the
 * decompressed data of a seekable zstd or gzip file read-only (frames
 * decoded on the calling loop's pool, one frame cache shared by every
 * loop), and "__org.iocore_zip-overlay" is its copy-on-write overlay: a
 * writable node over a compressed node as its backing, keeping every
 * change in the overlay file and never writing the compressed one.
 *
 * Block status reports the frames known to be all zero as zero holes, so
 * copying clients skip them; allocation depth is 1 for what the overlay
 * holds and 2 for the base beneath, as QEMU reports a qcow2 file over its
 * backing file.  Both image interfaces take one buffer: a request with
 * several iovecs (vhost-user-blk's scattered guest pages) is bounced.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/zip.h"
#include "node-int.h"

static const struct ioc__qmp_arg zip_opts[] = {
	{ "filename", IOC_QMP_STR, false },
	{ "frame-cache", IOC_QMP_SIZE, true },
	{ "readahead", IOC_QMP_BOOL, true },
	{ NULL },
};

static void zip_log(void *opaque, const char *msg)
{
	fprintf(stderr, "%s\n", msg);
}

static int zip_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	const char *path = ioc__node_opt_str(opts, "filename", "");
	struct ioc_zip_image_opts zo = {
		.frame_cache = (size_t)ioc__node_opt_int(opts, "frame-cache", 0),
		.no_readahead = !ioc__node_opt_bool(opts, "readahead", true),
		.log = zip_log,
	};
	struct ioc_zip_image_info info;
	struct ioc_zip_image *img;
	char msg[256] = "";
	int ret = ioc_zip_image_open(&img, path, &zo, msg, sizeof(msg));

	if (ret < 0) {
		snprintf(err, errlen, "Could not open '%s': %s", path,
			 *msg ? msg : ioc_strerror(ret));
		return ret;
	}
	ioc_zip_image_get_info(img, &info);
	n->opaque = img;
	n->size = info.size;
	n->read_only = true;
	n->can_block_status = true;
	ioc__node_set_filename(n, path);
	return 0;
}

static void zip_close(struct ioc_node *n)
{
	ioc_zip_image_close(n->opaque);
}

/* Both images read into one buffer: a request of several iovecs is
 * bounced through one. */
static int ioc_coroutine_fn read_flat(struct ioc_node *n, uint64_t off,
				      const struct iovec *iov, int iovcnt,
				      int (*rd)(struct ioc_node *, uint64_t, void *, size_t))
{
	size_t len = 0;
	bool bounced;
	void *buf;
	int ret;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	buf = ioc__node_iov_flat(iov, iovcnt, len, &bounced);
	if (!buf)
		return -ENOMEM;
	ret = rd(n, off, buf, len);
	if (bounced) {
		if (ret >= 0)
			ioc__node_iov_scatter(iov, iovcnt, buf, len);
		free(buf);
	}
	return ret;
}

static int ioc_coroutine_fn zip_read(struct ioc_node *n, uint64_t off, void *buf, size_t len)
{
	return ioc_zip_image_co_pread(n->opaque, off, buf, len, 0);
}

static int ioc_coroutine_fn zip_preadv(struct ioc_node *n, uint64_t off,
				       const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return read_flat(n, off, iov, iovcnt, zip_read);
}

static int ioc_coroutine_fn zip_pwritev(struct ioc_node *n, uint64_t off,
					const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return -EPERM;
}

static int ioc_coroutine_fn zip_flush(struct ioc_node *n, uint32_t flags)
{
	return 0;
}

static int ioc_coroutine_fn zip_status(struct ioc_node *n, uint64_t off, uint64_t len,
				       uint64_t *pnum, unsigned *depth)
{
	int st = ioc_zip_image_block_status(n->opaque, off, len, pnum, 0);

	if (depth)
		*depth = 1;
	if (st < 0)
		return st;
	return ((st & IOC_ZIP_STATUS_ZERO) ? IOC_NODE_ST_ZERO : IOC_NODE_ST_DATA) |
	       IOC_NODE_ST_ALLOCATED;
}

static void zip_info(struct ioc_node *n, json_t *image)
{
	struct ioc_zip_image_info zi;

	ioc_zip_image_get_info(n->opaque, &zi);
	json_object_set_new(image, "__org.iocore_zip", json_pack(
		"{s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
		"frames", (json_int_t)zi.frames, "zero-frames", (json_int_t)zi.zero_frames,
		"indexed-by", zi.indexed_by ? zi.indexed_by : "",
		"frame-cache-size", (json_int_t)zi.cache_budget,
		"frame-cache-bytes", (json_int_t)zi.cache_bytes,
		"cache-hits", (json_int_t)zi.cache_hits,
		"cache-misses", (json_int_t)zi.cache_misses,
		"cache-evictions", (json_int_t)zi.cache_evictions,
		"cache-admitted", (json_int_t)zi.cache_admitted,
		"decodes", (json_int_t)zi.decodes,
		"readahead-decodes", (json_int_t)zi.readaheads,
		"in-place-decodes", (json_int_t)zi.direct_decodes,
		"stored-reads", (json_int_t)zi.stored_reads,
		"stored-checks", (json_int_t)zi.stored_checks,
		"page-checks", (json_int_t)zi.page_checks,
		"streaming-reads", (json_int_t)zi.stream_reads,
		"errors", (json_int_t)zi.errors));
}

const struct ioc_node_drv ioc__node_drv_zip = {
	.name = "__org.iocore_zip",
	.opts = zip_opts,
	.open = zip_open,
	.close = zip_close,
	.co_preadv = zip_preadv,
	.co_pwritev = zip_pwritev,
	.co_flush = zip_flush,
	.co_block_status = zip_status,
	.info = zip_info,
};

static struct ioc_node *zip_wrap(struct ioc_node_graph *g, struct ioc_zip_image *img,
				 const char *name)
{
	struct ioc_zip_image_info info;
	struct ioc_node *n = ioc__node_new(g, &ioc__node_drv_zip, name);

	if (!n)
		return NULL;
	ioc_zip_image_get_info(img, &info);
	n->borrowed = true;
	n->opaque = img;
	n->size = info.size;
	n->read_only = true;
	n->can_block_status = true;
	n->filename = info.path;
	return n;
}

/* ---- the overlay ------------------------------------------------------- */

static const struct ioc__qmp_arg overlay_opts[] = {
	{ "filename", IOC_QMP_STR, false },
	{ "backing", IOC_QMP_REF, false },
	{ NULL },
};

static int overlay_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	const char *path = ioc__node_opt_str(opts, "filename", "");
	struct ioc_zip_overlay *ov;
	char msg[256] = "";
	int ret;

	ret = ioc_node_open_child(n, json_object_get(opts, "backing"), "backing",
				  &n->backing, err, errlen);
	if (ret < 0)
		return ret;
	if (n->backing->drv != &ioc__node_drv_zip) {
		snprintf(err, errlen, "Node '%s' is not a compressed image (driver %s)",
			 n->backing->name, n->backing->drv->name);
		goto fail;
	}
	ret = ioc_zip_overlay_open(&ov, n->backing->opaque, path, msg, sizeof(msg));
	if (ret < 0) {
		snprintf(err, errlen, "Could not open '%s': %s", path,
			 *msg ? msg : ioc_strerror(ret));
		goto fail;
	}
	n->opaque = ov;
	n->size = ioc_zip_overlay_size(ov);
	n->can_discard = n->can_fast_zero = n->can_block_status = true;
	n->discard_unmap = true; /* a discard is a zeroed range of the overlay */
	ioc__node_set_filename(n, path);
	return 0;
fail:
	ioc_node_unref(n->backing);
	n->backing = NULL;
	return ret < 0 ? ret : -EINVAL;
}

static void overlay_close(struct ioc_node *n)
{
	ioc_zip_overlay_close(n->opaque);
}

static int ioc_coroutine_fn overlay_read(struct ioc_node *n, uint64_t off, void *buf,
					 size_t len)
{
	return ioc_zip_overlay_co_pread(n->opaque, off, buf, len, 0);
}

static int ioc_coroutine_fn overlay_preadv(struct ioc_node *n, uint64_t off,
					   const struct iovec *iov, int iovcnt,
					   uint32_t flags)
{
	return read_flat(n, off, iov, iovcnt, overlay_read);
}

static int ioc_coroutine_fn overlay_pwritev(struct ioc_node *n, uint64_t off,
					    const struct iovec *iov, int iovcnt,
					    uint32_t flags)
{
	uint32_t f = (flags & IOC_NODE_FUA) ? IOC_ZIP_OVERLAY_FUA : 0;
	size_t len = 0, at = 0;
	void *buf;
	int ret;

	if (iovcnt == 1)
		return ioc_zip_overlay_co_pwrite(n->opaque, off, iov[0].iov_base,
						 iov[0].iov_len, f);
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	for (int i = 0; i < iovcnt; i++) {
		memcpy((char *)buf + at, iov[i].iov_base, iov[i].iov_len);
		at += iov[i].iov_len;
	}
	ret = ioc_zip_overlay_co_pwrite(n->opaque, off, buf, len, f);
	free(buf);
	return ret;
}

static int ioc_coroutine_fn overlay_flush(struct ioc_node *n, uint32_t flags)
{
	return ioc_zip_overlay_co_flush(n->opaque, 0);
}

static int ioc_coroutine_fn overlay_zero(struct ioc_node *n, uint64_t off, uint64_t len,
					 uint32_t flags)
{
	return ioc_zip_overlay_co_zero(n->opaque, off, len,
				       (flags & IOC_NODE_FUA) ? IOC_ZIP_OVERLAY_FUA : 0);
}

static int ioc_coroutine_fn overlay_discard(struct ioc_node *n, uint64_t off,
					    uint64_t len, uint32_t flags)
{
	return overlay_zero(n, off, len, 0);
}

static int ioc_coroutine_fn overlay_status(struct ioc_node *n, uint64_t off, uint64_t len,
					   uint64_t *pnum, unsigned *depth)
{
	int st = ioc_zip_overlay_block_status(n->opaque, off, len, pnum, 0);

	if (st < 0)
		return st;
	if (depth)
		*depth = (st & IOC_ZIP_STATUS_OVERLAY) ? 1 : 2;
	return ((st & IOC_ZIP_STATUS_ZERO) ? IOC_NODE_ST_ZERO : IOC_NODE_ST_DATA) |
	       IOC_NODE_ST_ALLOCATED;
}

static void overlay_info(struct ioc_node *n, json_t *image)
{
	struct ioc_zip_overlay_info oi;

	ioc_zip_overlay_get_info(n->opaque, &oi);
	json_object_set_new(image, "cluster-size", json_integer((json_int_t)oi.cluster_size));
	json_object_set_new(image, "__org.iocore_zip-overlay", json_pack("{s:I,s:I}",
		"clusters-written", (json_int_t)oi.clusters_written,
		"clusters-zero", (json_int_t)oi.clusters_zero));
}

int ioc_node_wrap_zip(struct ioc_node_graph *g, struct ioc_zip_image *img,
		      struct ioc_zip_overlay *ov, const char *name, struct ioc_node **out)
{
	struct ioc_zip_overlay_info oi;
	struct ioc_node *z = zip_wrap(g, img, ov ? NULL : name), *n;

	if (!z)
		return -ENOMEM;
	if (!ov) {
		*out = z;
		return 0;
	}
	n = ioc__node_new(g, &ioc__node_drv_zip_overlay, name);
	if (!n) {
		ioc_node_unref(z);
		return -ENOMEM;
	}
	ioc_zip_overlay_get_info(ov, &oi);
	n->borrowed = true;
	n->opaque = ov;
	n->backing = z;
	n->size = oi.size;
	n->can_discard = n->can_fast_zero = n->can_block_status = true;
	n->discard_unmap = true;
	n->filename = oi.path;
	*out = n;
	return 0;
}

const struct ioc_node_drv ioc__node_drv_zip_overlay = {
	.name = "__org.iocore_zip-overlay",
	.opts = overlay_opts,
	.open = overlay_open,
	.close = overlay_close,
	.co_preadv = overlay_preadv,
	.co_pwritev = overlay_pwritev,
	.co_flush = overlay_flush,
	.co_discard = overlay_discard,
	.co_write_zeroes = overlay_zero,
	.co_block_status = overlay_status,
	.info = overlay_info,
};
