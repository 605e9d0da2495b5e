/*
 * io_uring backend of the block layer: reads, writes, flushes and hole
 * punching as SQEs on the current loop's ring.
 *
 * The loop hands out SQEs (ioc_loop_get_sqe) and submits them all at the
 * end of its iteration, so a burst of requests from many coroutines costs
 * one io_uring_enter; completions come back as callbacks on the same loop.
 * Short transfers are resubmitted for the remainder (ioc__blk_rw_account
 * decides, shared with the other backends).  Anything that is not a single
 * io_uring operation (write-zeroes chains, ioctls, FUA on a kernel without
 * RWF_DSYNC) goes to the thread pool instead, and so does every request of
 * a loop without a ring.
 *
 * Cost: no allocation; one SQE per attempt.  The request's iovec must stay
 * valid until the CQE (it lives in the caller's request or in r->tmp_iov).
 * On a file system without non-blocking reads (tmpfs: no FMODE_NOWAIT)
 * io_uring hands every read to its io-wq, and as such reads never block,
 * one io-wq worker does them all: that kernel thread is the bottleneck,
 * for QEMU and for us alike (measured: ~1.8 us of CPU per 4 KiB read in a
 * bare liburing loop, close to all we spend per request).  There the
 * thread pool, whose workers spread over the cores, is faster; io_uring
 * stays what -i io_uring means, and the fast path avoids both.
 */
#include <errno.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <liburing.h>

#include "blk-int.h"

static void uring_cb(struct ioc_uring_op *op, int res, uint32_t cqe_flags)
{
	struct blk_req *r = ioc_container_of(op, struct blk_req, u.uop);
	struct ioc_blk *blk = r->blk;
	int a;

	(void)cqe_flags;
	switch ((enum blk_op)r->op) {
	case BLK_OP_READ:
	case BLK_OP_WRITE:
		if (res == -EINTR || res == -EAGAIN) {
			ioc__blk_uring_submit(r);
			return;
		}
		if (r->op == BLK_OP_WRITE && (r->flags & IOC_BLK_FUA) &&
		    (res == -EOPNOTSUPP || res == -EINVAL) &&
		    (blk_caps(blk) &
		     BLK_CAP_DSYNC)) {
			/* No RWF_DSYNC here: write and fdatasync on the pool. */
			blk_cap_clear(blk, BLK_CAP_DSYNC);
			ioc__blk_threads_submit(r);
			return;
		}
		a = ioc__blk_rw_account(r, res);
		if (a > 0)
			ioc__blk_uring_submit(r);
		else
			ioc__blk_finish(r, a);
		return;
	case BLK_OP_DISCARD:
		if (res == -EOPNOTSUPP) {
			blk_cap_clear(blk, BLK_CAP_PUNCH);
			res = 0; /* a hint that cannot be honoured */
		}
		ioc__blk_finish(r, res);
		return;
	case BLK_OP_ZEROES:
		if (res == -EOPNOTSUPP) {
			/* The pool's chain knows the other ways. */
			blk_cap_clear(blk, BLK_CAP_PUNCH);
			ioc__blk_threads_submit(r);
			return;
		}
		if (res == 0 && (r->flags & IOC_BLK_FUA)) {
			r->op = BLK_OP_FLUSH;
			ioc__blk_uring_submit(r);
			return;
		}
		ioc__blk_finish(r, res);
		return;
	case BLK_OP_FLUSH:
		ioc__blk_finish(r, res);
		return;
	}
}

void ioc__blk_uring_submit(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;
	uint64_t max = r->io_len - r->done;
	uint64_t pos = r->io_offset + r->done;
	const struct iovec *iov = NULL;
	bool wr = r->op == BLK_OP_WRITE;
	struct io_uring_sqe *sqe;
	int cnt = 0;

	if (ioc_unlikely(blk->fault)) {
		int64_t f = ioc__blk_fault_check(r, pos, max);

		if (f < 0) {
			ioc__blk_finish(r, f);
			return;
		}
		if (f > 0)
			max = (uint64_t)f;
	}
	if (r->op == BLK_OP_READ || r->op == BLK_OP_WRITE) {
		cnt = ioc__blk_rw_slice(r, max, &iov);
		if (cnt < 0) {
			ioc__blk_finish(r, cnt);
			return;
		}
	}
	r->u.uop.cb = uring_cb;
	sqe = ioc_loop_get_sqe(r->loop, &r->u.uop);
	if (!sqe) {
		ioc__blk_threads_submit(r);
		return;
	}
	switch ((enum blk_op)r->op) {
	case BLK_OP_READ:
	case BLK_OP_WRITE:
		/* One buffer: READ and WRITE spare the kernel importing an
		 * iovec.  (The io_uring_prep_read() family, by opcode.) */
		if (cnt == 1 && iov[0].iov_len <= UINT32_MAX)
			io_uring_prep_rw(wr ? IORING_OP_WRITE : IORING_OP_READ, sqe,
					 blk->fd, iov[0].iov_base,
					 (unsigned)iov[0].iov_len, pos);
		else
			io_uring_prep_rw(wr ? IORING_OP_WRITEV : IORING_OP_READV, sqe,
					 blk->fd, iov, (unsigned)cnt, pos);
		if (wr)
			sqe->rw_flags = (r->flags & IOC_BLK_FUA) ? RWF_DSYNC : 0;
		break;
	case BLK_OP_FLUSH:
		io_uring_prep_fsync(sqe, blk->fd, IORING_FSYNC_DATASYNC);
		break;
	case BLK_OP_DISCARD:
	case BLK_OP_ZEROES:
		io_uring_prep_fallocate(sqe, blk->fd,
					FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					(off_t)r->offset, (off_t)r->len);
		break;
	}
	io_uring_sqe_set_data(sqe, &r->u.uop);
}
