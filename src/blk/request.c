/*
 * The block layer's request helpers, shared by blk.c and every backend
 * (blk-uring.c, blk-threads.c): short-transfer accounting and slicing, the
 * fault hook's check, completion (bounce copy-out, dirty-bitmap marking,
 * untracking, delivery to the caller) and the known-data region that block
 * status remembers.
 *
 * They live below both so that calls run one way: blk.c dispatches to a
 * backend, a backend completes through these helpers, and nothing here
 * calls back up.  The one way back up, restarting a request that waited
 * behind a tracked write, is a task whose function blk.c set when the
 * request queued.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "blk-int.h"
#include "util/iov.h"

void ioc__blk_iov_memset(const struct iovec *iov, int iovcnt, uint64_t skip,
		       int c, uint64_t len)
{
	size_t sk = (size_t)skip, ln = (size_t)len;
	struct iovec p;
	int i = 0;

	while (ioc__iov_piece(iov, iovcnt, &i, &sk, &ln, &p))
		memset(p.iov_base, c, p.iov_len);
}

void ioc__blk_iov_to_buf(const struct iovec *iov, int iovcnt, void *buf)
{
	char *p = buf;

	for (int i = 0; i < iovcnt; i++) {
		memcpy(p, iov[i].iov_base, iov[i].iov_len);
		p += iov[i].iov_len;
	}
}

void ioc__blk_iov_from_buf(const struct iovec *iov, int iovcnt, const void *buf)
{
	const char *p = buf;

	for (int i = 0; i < iovcnt; i++) {
		memcpy(iov[i].iov_base, p, iov[i].iov_len);
		p += iov[i].iov_len;
	}
}

int64_t ioc__blk_fault_check(struct blk_req *r, uint64_t offset, uint64_t len)
{
	struct ioc_blk *blk = r->blk;
	int64_t f = blk->fault(blk->fault_opaque, (enum blk_op)r->op, offset, len);

	if (f > 0 && blk->o_direct)
		f = (int64_t)align_down((uint64_t)f, blk->req_align);
	if (f > 0 && (uint64_t)f >= len)
		f = 0;
	return f;
}

/* ---- short transfers ------------------------------------------------- */

int ioc__blk_rw_slice(struct blk_req *r, uint64_t max, const struct iovec **out)
{
	uint64_t skip = r->done;
	int n = 0;

	if (skip == 0 && max >= r->io_len) {
		*out = r->iov;
		return r->iovcnt;
	}
	if (!r->tmp_iov) {
		r->tmp_iov = malloc(sizeof(struct iovec) * (size_t)r->iovcnt);
		if (!r->tmp_iov)
			return -ENOMEM;
	}
	for (int i = 0; i < r->iovcnt && max; i++) {
		if (skip >= r->iov[i].iov_len) {
			skip -= r->iov[i].iov_len;
			continue;
		}
		uint64_t len = r->iov[i].iov_len - skip;

		if (len > max)
			len = max;
		r->tmp_iov[n].iov_base = (char *)r->iov[i].iov_base + skip;
		r->tmp_iov[n].iov_len = len;
		n++;
		max -= len;
		skip = 0;
	}
	assert(n > 0);
	*out = r->tmp_iov;
	return n;
}

int ioc__blk_rw_account(struct blk_req *r, int64_t res)
{
	if (res < 0)
		return (int)res;
	if (res == 0) {
		if (r->op != BLK_OP_READ)
			return -EIO; /* a write that makes no progress */
		goto eof;
	}
	r->done += (uint64_t)res;
	assert(r->done <= r->io_len);
	if (r->done == r->io_len)
		return 0;
	/* With O_DIRECT a transfer only stops at a misaligned position at the
	 * end of the file. */
	if (r->op == BLK_OP_READ && r->blk->o_direct &&
	    r->done % r->blk->req_align)
		goto eof;
	return 1;
eof:
	/* The file ended before the request (it shrank, or the aligned bounce
	 * region reaches past an unaligned end): the rest reads as zeroes. */
	ioc__blk_iov_memset(r->iov, r->iovcnt, r->done, 0, r->io_len - r->done);
	r->done = r->io_len;
	return 0;
}

/* ---- tracking for cache=none ----------------------------------------- */

static void track_end(struct blk_req *r)
{
	struct ioc_blk *blk = r->blk;
	struct blk_req **pp, *w;

	pthread_mutex_lock(&blk->track_lock);
	for (pp = &blk->tracked; *pp != r; pp = &(*pp)->track_next)
		assert(*pp);
	*pp = r->track_next;
	w = r->waiters;
	r->waiters = NULL;
	r->tracked = false;
	pthread_mutex_unlock(&blk->track_lock);
	/* Each waiter starts over on its own loop (it may conflict again with
	 * another request and queue there), through the restart task blk.c's
	 * track_begin() set when it queued (read after the unlock above,
	 * which orders it). */
	while (w) {
		struct blk_req *next = w->wait_next;

		ioc_loop_post(w->loop, &w->u.task);
		w = next;
	}
}

/* ---- completion ------------------------------------------------------ */

static void deliver_task(struct ioc_task *task)
{
	struct blk_req *r = ioc_container_of(task, struct blk_req, u.task);
	struct ioc_blk_req *req = blk_public_of(r);

	req->cb(req, (int)r->ret);
}

void ioc__blk_deliver(struct blk_req *r, int64_t ret)
{
	struct ioc_blk_req *req = blk_public_of(r);

	if (r->submitting && !r->direct_cb) {
		r->ret = ret;
		r->u.task.fn = deliver_task;
		ioc_loop_post(r->loop, &r->u.task);
		return;
	}
	req->cb(req, (int)ret);
}

/* ---- the known-data region ---------------------------------------- */

/* Seqlock write side; the caller holds data_lock.  The relaxed store of
 * the odd count, then the release fence, order it before the field
 * stores; the final release store publishes them.  Pairs with the loads
 * in ioc__blk_data_lookup(). */
static void data_write(struct ioc_blk *blk, uint64_t start, uint64_t end, uint64_t gen)
{
	uint64_t seq = atomic_load_explicit(&blk->data_seq, memory_order_relaxed);

	atomic_store_explicit(&blk->data_seq, seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&blk->data_start, start, memory_order_relaxed);
	atomic_store_explicit(&blk->data_end, end, memory_order_relaxed);
	atomic_store_explicit(&blk->data_gen, gen, memory_order_relaxed);
	atomic_store_explicit(&blk->data_seq, seq + 2, memory_order_release);
}

void ioc__blk_data_invalidate(struct ioc_blk *blk)
{
	pthread_mutex_lock(&blk->data_lock);
	data_write(blk, 0, 0, atomic_load_explicit(&blk->data_gen,
						   memory_order_relaxed) + 1);
	pthread_mutex_unlock(&blk->data_lock);
}

/* Inside the region: the bytes of data from offset to its end.  Seqlock
 * read side: the acquire load of the count pairs with data_write()'s
 * final release store; the acquire fence orders the field loads before
 * the second load of the count, which a writer that started meanwhile
 * has made odd or larger (its fence pairs with ours). */
uint64_t ioc__blk_data_lookup(struct ioc_blk *blk, uint64_t offset, uint64_t *gen)
{
	uint64_t s1, s2, start, end;

	do {
		s1 = atomic_load_explicit(&blk->data_seq, memory_order_acquire);
		start = atomic_load_explicit(&blk->data_start, memory_order_relaxed);
		end = atomic_load_explicit(&blk->data_end, memory_order_relaxed);
		*gen = atomic_load_explicit(&blk->data_gen, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(&blk->data_seq, memory_order_relaxed);
	} while ((s1 & 1) || s1 != s2);
	return offset >= start && offset < end ? end - offset : 0;
}

void ioc__blk_data_store(struct ioc_blk *blk, uint64_t gen, uint64_t start, uint64_t end)
{
	pthread_mutex_lock(&blk->data_lock);
	/* Relaxed: data_gen changes only under data_lock, which we hold. */
	if (atomic_load_explicit(&blk->data_gen, memory_order_relaxed) == gen)
		data_write(blk, start, end, gen);
	pthread_mutex_unlock(&blk->data_lock);
}

/* A finished request's result, after the write-back error rule (blk.c's
 * "Write-back errors"): record the first write-back error, and fail a sync
 * that succeeded after one was recorded. */
static int64_t blk_note_sync(struct blk_req *r, int64_t ret)
{
	struct ioc_blk *blk = r->blk;
	enum blk_op op = (enum blk_op)r->op;

	if (!blk || !blk_is_sync(op, r->flags))
		return ret;
	if (ret < 0 && (op == BLK_OP_FLUSH ? ret != -ENOMEM : ret == -EIO)) {
		int expected = 0;

		/* Release: pairs with the acquire load in blk_wb_err().  Only
		 * the first error is kept. */
		atomic_compare_exchange_strong_explicit(&blk->wb_err, &expected,
							(int)ret, memory_order_release,
							memory_order_relaxed);
		return ret;
	}
	if (ret == 0) {
		int err = blk_wb_err(blk);

		if (err)
			return err;
	}
	return ret;
}

void ioc__blk_finish(struct blk_req *r, int64_t ret)
{
	if (r->bounce) {
		if (ret == 0 && r->op == BLK_OP_READ) {
			/* Copy the asked-for part of the aligned region out. */
			const char *src = (const char *)r->bounce +
				(r->offset - r->io_offset);

			ioc__blk_iov_from_buf(r->user_iov, r->user_iovcnt, src);
		}
		free(r->bounce);
		r->bounce = NULL;
	}
	free(r->tmp_iov);
	r->tmp_iov = NULL;
	if (blk_may_punch(r->op))
		ioc__blk_data_invalidate(r->blk);
	/* Dirty bitmaps: marked after the data reached the image and before
	 * the request completes (dirty-bitmap.c: the ordering rule).  A
	 * failed request is marked too: it may have changed part of its
	 * range (a short write, then an error). */
	if (r->op == BLK_OP_WRITE || blk_may_punch(r->op)) {
		int m = blk_dirty_mark(r->blk, r->offset, r->len);

		if (ret == 0)
			ret = m;
	}
	if (r->tracked)
		track_end(r);
	ret = blk_note_sync(r, ret);
	ioc__blk_deliver(r, ret);
}
