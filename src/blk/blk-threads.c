/*
 * Thread-pool backend of the block layer, and the synchronous forms of
 * every operation (also used by the io_uring backend for what io_uring
 * cannot express as one operation: ioctls, the write-zeroes fallback
 * chain, read-modify-write for cache=none).
 *
 * Each request is one pool job running preadv2/pwritev2 (retrying short
 * transfers through the shared accounting in blk.c) or the fallocate /
 * ioctl chain, and completes on the submitting loop through the pool's
 * completion task.  The worker owns the request's state while the job
 * runs; the pool's submit and completion hand-offs order it with the loop.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "blk-int.h"

/* The zero-writing fallback goes in chunks of this size. */
#define ZERO_CHUNK (1u << 20)

static bool unsupported(int err)
{
	return err == EOPNOTSUPP || err == ENOTTY || err == ENOSYS;
}

int64_t ioc__blk_sync_rw(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;
	bool fua = r->op == BLK_OP_WRITE && (r->flags & IOC_BLK_FUA);
	bool need_sync = false;

	for (;;) {
		uint64_t max = r->io_len - r->done;
		uint64_t pos = r->io_offset + r->done;
		const struct iovec *iov;
		ssize_t n;
		int cnt, a;

		if (ioc_unlikely(blk->fault)) {
			int64_t f = ioc__blk_fault_check(r, pos, max);

			if (f < 0)
				return f;
			if (f > 0)
				max = (uint64_t)f;
		}
		cnt = ioc__blk_rw_slice(r, max, &iov);
		if (cnt < 0)
			return cnt;
		if (r->op == BLK_OP_READ) {
			n = preadv2(blk->fd, iov, cnt, (off_t)pos, 0);
		} else {
			int rwf = fua && (blk_caps(blk) & BLK_CAP_DSYNC) ? RWF_DSYNC : 0;

			n = pwritev2(blk->fd, iov, cnt, (off_t)pos, rwf);
			if (n < 0 && rwf && (errno == EOPNOTSUPP || errno == EINVAL)) {
				blk_cap_clear(blk, BLK_CAP_DSYNC);
				continue;
			}
			if (fua && !rwf)
				need_sync = true;
		}
		if (n < 0 && errno == EINTR)
			continue;
		a = ioc__blk_rw_account(r, n < 0 ? -errno : n);
		if (a < 0)
			return a;
		if (a == 0)
			break;
	}
	if (need_sync && fdatasync(blk->fd) < 0)
		return -errno;
	return 0;
}

/* A whole pread or pwrite, resumed after a short count.  buf is only
 * written to by a read. */
static int rw_full(int fd, char *buf, uint64_t len, uint64_t off, bool wr)
{
	while (len) {
		ssize_t n = wr ? pwrite(fd, buf, len, (off_t)off)
				  : pread(fd, buf, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0) {
			if (wr)
				return -EIO;
			memset(buf, 0, len); /* past the end reads as zero */
			return 0;
		}
		buf += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

int ioc__blk_pread_full(int fd, void *p, uint64_t len, uint64_t off)
{
	return rw_full(fd, p, len, off, false);
}

int ioc__blk_pwrite_full(int fd, const void *p, uint64_t len, uint64_t off)
{
	return rw_full(fd, (char *)p, len, off, true);
}

/*
 * Write len bytes from iov (or zeroes when iov is NULL) at off, on an
 * O_DIRECT descriptor with any alignment: read the partial head and tail
 * blocks, merge, write the aligned region.  The caller holds the tracking
 * that keeps overlapping writes out.  When the aligned region reaches past
 * an unaligned end of file, the size is put back afterwards.
 */
static int rmw_write(struct ioc_blk *blk, uint64_t off, const struct iovec *iov,
		     int iovcnt, uint64_t len)
{
	uint64_t al = blk->req_align;
	uint64_t a0 = align_down(off, al), a1 = align_up(off + len, al);
	uint64_t size = blk_size(blk);
	size_t balign = blk->mem_align > al ? blk->mem_align : al;
	char *buf = NULL;
	int ret;

	if (balign < sizeof(void *))
		balign = sizeof(void *);
	if (posix_memalign((void **)&buf, balign, a1 - a0))
		return -ENOMEM;
	if (off != a0) {
		ret = ioc__blk_pread_full(blk->fd, buf, al, a0);
		if (ret < 0)
			goto out;
	}
	if (off + len != a1 && (a1 - al != a0 || off == a0)) {
		ret = ioc__blk_pread_full(blk->fd, buf + (a1 - al - a0), al, a1 - al);
		if (ret < 0)
			goto out;
	}
	if (iov) {
		char *p = buf + (off - a0);

		for (int i = 0; i < iovcnt; i++) {
			memcpy(p, iov[i].iov_base, iov[i].iov_len);
			p += iov[i].iov_len;
		}
	} else {
		memset(buf + (off - a0), 0, len);
	}
	ret = ioc__blk_pwrite_full(blk->fd, buf, a1 - a0, a0);
	if (ret == 0 && a1 > size && !blk->is_blockdev &&
	    ftruncate(blk->fd, (off_t)size) < 0)
		ret = -errno;
out:
	free(buf);
	return ret;
}

int64_t ioc__blk_sync_rmw(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;
	int ret;

	if (ioc_unlikely(blk->fault)) {
		int64_t f = ioc__blk_fault_check(r, r->offset, r->len);

		if (f < 0)
			return f;
	}
	ret = rmw_write(blk, r->offset, r->iov, r->iovcnt, r->len);
	if (ret == 0 && (r->flags & IOC_BLK_FUA) && fdatasync(blk->fd) < 0)
		ret = -errno;
	return ret;
}

/* The last resort of write-zeroes: write them. */
static int write_zero_bytes(struct ioc_blk *blk, uint64_t off, uint64_t len)
{
	uint64_t al = blk->req_align;
	char *zero = NULL;
	int ret = 0;

	if (posix_memalign((void **)&zero, blk->mem_align > 4096 ? blk->mem_align : 4096,
			   ZERO_CHUNK))
		return -ENOMEM;
	memset(zero, 0, ZERO_CHUNK);
	while (len && ret == 0) {
		uint64_t n = len < ZERO_CHUNK ? len : ZERO_CHUNK;

		if (blk->o_direct && (off % al || n % al)) {
			/* A misaligned head or tail: up to the next boundary
			 * by read-modify-write. */
			uint64_t end = align_up(off + 1, al);

			if (n > end - off)
				n = end - off;
			ret = rmw_write(blk, off, NULL, 0, n);
		} else {
			ret = ioc__blk_pwrite_full(blk->fd, zero, n, off);
		}
		off += n;
		len -= n;
	}
	free(zero);
	return ret;
}

static int do_zeroes_aligned(struct ioc_blk *blk, uint64_t off, uint64_t len,
			     uint32_t flags);

/*
 * A device only takes fallocate/ioctls on whole logical blocks: the partial
 * head and tail get their zeroes written, the middle takes the fast way.
 */
static int do_zeroes(struct ioc_blk *blk, uint64_t off, uint64_t len, uint32_t flags)
{
	uint64_t al = blk->dev_align, end = off + len;
	uint64_t m0 = align_up(off, al), m1 = align_down(end, al);
	int ret;

	if (al <= 1 || (off % al == 0 && len % al == 0))
		return do_zeroes_aligned(blk, off, len, flags);
	if (m0 >= m1)
		return (flags & IOC_BLK_NO_FALLBACK) ? -ENOTSUP :
			write_zero_bytes(blk, off, len);
	if (flags & IOC_BLK_NO_FALLBACK)
		return -ENOTSUP;
	ret = write_zero_bytes(blk, off, m0 - off);
	if (ret == 0 && end > m1)
		ret = write_zero_bytes(blk, m1, end - m1);
	if (ret == 0)
		ret = do_zeroes_aligned(blk, m0, m1 - m0, flags);
	return ret;
}

/* One way of zeroing, mode (KEEP_SIZE added): 0 done, -errno failed, 1
 * not supported here (cap cleared: the next way is tried, now and later). */
static int try_fallocate(struct ioc_blk *blk, int mode, unsigned cap,
			 uint64_t off, uint64_t len)
{
	if (fallocate(blk->fd, mode | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) == 0)
		return 0;
	if (!unsupported(errno))
		return -errno;
	blk_cap_clear(blk, cap);
	return 1;
}

static int do_zeroes_aligned(struct ioc_blk *blk, uint64_t off, uint64_t len,
			     uint32_t flags)
{
	unsigned caps = blk_caps(blk);
	int ret;

	if ((flags & IOC_BLK_MAY_UNMAP) && (caps & BLK_CAP_PUNCH)) {
		ret = try_fallocate(blk, FALLOC_FL_PUNCH_HOLE, BLK_CAP_PUNCH, off, len);
		if (ret <= 0)
			return ret;
	}
	if (caps & BLK_CAP_ZERO_RANGE) {
		ret = try_fallocate(blk, FALLOC_FL_ZERO_RANGE, BLK_CAP_ZERO_RANGE, off, len);
		if (ret <= 0)
			return ret;
	}
	caps = blk_caps(blk);
	if (!blk->is_blockdev && (caps & BLK_CAP_PUNCH)) {
		/* tmpfs and others without ZERO_RANGE: a hole, then allocate
		 * it again, gives allocated zeroes. */
		ret = try_fallocate(blk, FALLOC_FL_PUNCH_HOLE, BLK_CAP_PUNCH, off, len);
		if (ret < 0)
			return ret;
		if (ret == 0) {
			if (!(caps & BLK_CAP_ALLOC))
				return 0;
			ret = try_fallocate(blk, 0, BLK_CAP_ALLOC, off, len);
			/* Without ALLOC, holes read as zeroes: still correct. */
			return ret < 0 ? ret : 0;
		}
	}
	if (blk->is_blockdev) {
		uint64_t range[2] = { off, len };

		if (ioctl(blk->fd, BLKZEROOUT, range) == 0)
			return 0;
		if (!unsupported(errno) && errno != EINVAL)
			return -errno;
	}
	if (flags & IOC_BLK_NO_FALLBACK)
		return -ENOTSUP;
	return write_zero_bytes(blk, off, len);
}

static int do_discard(struct ioc_blk *blk, uint64_t off, uint64_t len)
{
	if (blk->is_blockdev) {
		/* Only whole logical blocks; the partial ends are left. */
		uint64_t m0 = align_up(off, blk->dev_align);
		uint64_t m1 = align_down(off + len, blk->dev_align);
		uint64_t range[2] = { m0, m1 - m0 };

		if (m0 >= m1 || ioctl(blk->fd, BLKDISCARD, range) == 0)
			return 0;
	} else if (blk_caps(blk) & BLK_CAP_PUNCH) {
		if (fallocate(blk->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)off, (off_t)len) == 0)
			return 0;
		if (unsupported(errno))
			blk_cap_clear(blk, BLK_CAP_PUNCH);
	} else {
		return 0;
	}
	/* Discard is a hint: where it cannot be done, doing nothing is right. */
	return unsupported(errno) || errno == EINVAL ? 0 : -errno;
}

int64_t ioc__blk_sync_op(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;

	if (r->op == BLK_OP_READ || r->op == BLK_OP_WRITE)
		return ioc__blk_sync_rw(r);
	if (ioc_unlikely(blk->fault)) {
		int64_t f = ioc__blk_fault_check(r, r->offset, r->len);

		if (f < 0)
			return f;
	}
	switch ((enum blk_op)r->op) {
	case BLK_OP_FLUSH:
		return fdatasync(blk->fd) < 0 ? -errno : 0;
	case BLK_OP_DISCARD:
		return do_discard(blk, r->offset, r->len);
	case BLK_OP_ZEROES: {
		int ret = do_zeroes(blk, r->offset, r->len, r->flags);

		if (ret == 0 && (r->flags & IOC_BLK_FUA) && fdatasync(blk->fd) < 0)
			ret = -errno;
		return ret;
	}
	default:
		return -EINVAL;
	}
}

static int64_t threads_work(void *arg)
{
	struct blk_req *r = arg;

	if (r->rmw)
		return ioc__blk_sync_rmw(r);
	return ioc__blk_sync_op(r);
}

static void threads_done(void *opaque, int64_t ret)
{
	ioc__blk_finish(opaque, ret);
}

void ioc__blk_threads_submit(struct blk_req *r)
{
	struct ioc_pool *pool = ioc_pool_for_loop(r->loop);

	if (!pool) {
		ioc__blk_finish(r, -ENOMEM);
		return;
	}
	ioc_pool_submit(pool, &r->u.preq, threads_work, r, threads_done, r);
}
