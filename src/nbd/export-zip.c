/*
 * The compressed-image backend of an export: reads come from an
 * ioc_zip_image (src/zip/image.c), which decodes frames on the calling
 * I/O thread's pool and keeps them in a frame cache shared by every
 * connection and I/O thread.  The export is read-only, unless it has a
 * copy-on-write overlay (src/zip/overlay.c): then it takes writes, TRIM
 * and WRITE_ZEROES (both read back as zeroes), FUA and flush, all kept in
 * the overlay file, and the compressed base is never written.
 *
 * Block status reports the frames the image knows to be all zero as
 * holes that read as zeroes, so structured reads send them as hole chunks
 * and clients copying the export (nbdcopy, qemu-img convert) skip them.
 * qemu:allocation-depth is 1 everywhere for an image alone; with an
 * overlay, 1 for what the overlay holds and 2 for the base beneath, the
 * numbers QEMU gives a qcow2 file and its backing file.
 *
 * CAN_MULTI_CONN is advertised: without an overlay nothing is written;
 * with one, a flush makes every write completed on any connection durable
 * (one file, one map).  CACHE is answered at once (a hint).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/zip.h"
#include "nbd-int.h"

static int ioc_coroutine_fn zx_pread(void *be, uint64_t off, void *buf, size_t len,
				     uint32_t flags)
{
	return ioc_zip_image_co_pread(be, off, buf, len, 0);
}

static int ioc_coroutine_fn zx_pwrite(void *be, uint64_t off, const void *buf,
				      size_t len, uint32_t flags)
{
	return -EPERM;
}

static int ioc_coroutine_fn zx_flush(void *be, uint32_t flags)
{
	return 0;
}

static int ioc_coroutine_fn zx_zero(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	return -EPERM;
}

static int ioc_coroutine_fn zx_block_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_zip_image_block_status(be, off, len, pnum, 0);

	if (st < 0)
		return st;
	return (st & IOC_ZIP_STATUS_ZERO) ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0;
}

/* qemu:allocation-depth: the image is the only layer. */
static int ioc_coroutine_fn zx_depth_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	*pnum = len;
	return 1;
}

/* ---- with an overlay ---- */

static int ioc_coroutine_fn ov_pread(void *be, uint64_t off, void *buf, size_t len,
				     uint32_t flags)
{
	return ioc_zip_overlay_co_pread(be, off, buf, len, 0);
}

static int ioc_coroutine_fn ov_pwrite(void *be, uint64_t off, const void *buf,
				      size_t len, uint32_t flags)
{
	return ioc_zip_overlay_co_pwrite(be, off, buf, len,
					 (flags & IOC_NBD_BE_FUA) ? IOC_ZIP_OVERLAY_FUA : 0);
}

static int ioc_coroutine_fn ov_flush(void *be, uint32_t flags)
{
	return ioc_zip_overlay_co_flush(be, 0);
}

static int ioc_coroutine_fn ov_zero(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	return ioc_zip_overlay_co_zero(be, off, len,
				       (flags & IOC_NBD_BE_FUA) ? IOC_ZIP_OVERLAY_FUA : 0);
}

static int ioc_coroutine_fn ov_trim(void *be, uint64_t off, uint64_t len, uint32_t flags)
{
	return ov_zero(be, off, len, flags);
}

static int ioc_coroutine_fn ov_block_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_zip_overlay_block_status(be, off, len, pnum, 0);

	if (st < 0)
		return st;
	return (st & IOC_ZIP_STATUS_ZERO) ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0;
}

/* qemu:allocation-depth as for a qcow2 file over a backing file: 1 where
 * the overlay decides the bytes (written or zeroed), 2 where the base
 * does. */
static int ioc_coroutine_fn ov_depth_status(void *be, uint64_t off, uint64_t len,
					    uint64_t *pnum, uint32_t flags)
{
	int st = ioc_zip_overlay_block_status(be, off, len, pnum, 0);

	if (st < 0)
		return st;
	return (st & IOC_ZIP_STATUS_OVERLAY) ? 1 : 2;
}

static const struct ioc__nbd_backend_ops overlay_ops = {
	.pread = ov_pread,
	.pwrite = ov_pwrite,
	.flush = ov_flush,
	.trim = ov_trim,
	.zero = ov_zero,
	.block_status = ov_block_status,
	.cache = NULL,
	.depth_status = ov_depth_status,
};

static const struct ioc__nbd_backend_ops zip_ops = {
	.pread = zx_pread,
	.pwrite = zx_pwrite,
	.flush = zx_flush,
	.trim = NULL,
	.zero = zx_zero,
	.block_status = zx_block_status,
	.cache = NULL,
	.depth_status = zx_depth_status,
};

int ioc__nbd_zip_export_new(struct ioc__nbd_export **out,
			    const struct ioc_nbd_export_opts *opts)
{
	struct ioc_zip_image_info info;
	struct ioc__nbd_export *e;
	int ret;

	if (!opts->zip || opts->blk)
		return -EINVAL;
	ret = ioc__nbd_export_alloc(&e, opts);
	if (ret < 0)
		return ret;
	ioc_zip_image_get_info(opts->zip, &info);
	e->size = info.size;
	e->read_only = true;
	e->ops = &zip_ops;
	e->be = opts->zip;
	e->zip = opts->zip;
	e->zip_overlay = opts->zip_overlay;
	if (opts->zip_overlay) {
		e->read_only = opts->read_only;
		e->can_trim = e->can_zero = e->can_fast_zero = e->can_fua = true;
		e->ops = &overlay_ops;
		e->be = opts->zip_overlay;
	}
	e->can_cache = true;
	e->can_block_status = true;
	e->multi_conn = true;
	e->min_block = 1;
	e->pref_block = 4096;
	e->max_block = IOC_NBD_MAX_PAYLOAD;
	*out = e;
	return 0;
}
