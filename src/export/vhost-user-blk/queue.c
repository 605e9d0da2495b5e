/*
 * The data path of one virtqueue: a handler on its I/O thread's loop.
 *
 * Problem: a busy queue should be served without a syscall per request
 * (no eventfd read, no kick from the guest), an idle one should cost
 * nothing, and a guest that stops kicking while we poll must not be left
 * waiting.  Completions arrive one by one from the node; the guest should
 * see them in batches, with one interrupt per batch at most.
 *
 * Design: the kick eventfd is an fd handler with a poll callback that
 * compares avail->idx with the last index taken.  The loop calls it in
 * its adaptive polling while the queue was recently active, and stops
 * after poll_idle_ns without work (then the kick wakes it, level-
 * triggered: a kick that lands while we poll is read on the next round).
 * A pass takes every available request (as many as free slots: a slot is
 * a preallocated request, one per ring entry, so a guest that reposts
 * faster than we complete cannot make us allocate) and starts each in its
 * own coroutine (blk.c), then arms the next kick (EVENT_IDX avail_event)
 * and looks again, so a request made while arming is not missed.  Each
 * completion goes on the used ring unpublished and schedules the queue's
 * flush BH; the BH publishes used->idx and signals once for everything
 * completed since (vring.c decides whether the driver wants it).  A
 * NOFD kick ("poll, no eventfd") is served by the same pass from a 1 ms
 * timer.
 *
 * Control changes (start, stop, a new call fd, a new memory table) come
 * from the connection's coroutine after it moved to this loop, so they
 * never race the data path.  Stop and remap wait for the queue's in-flight
 * requests: the waiter parks in drain_waiter and the completion that
 * brings inflight to 0 wakes it (both on this loop's thread).
 *
 * Inflight tracking (inflight.c): at start, the heads the region says
 * were in flight when the last back end died are resubmitted in the
 * order first taken, before any new avail entry, as slots free up.
 *
 * Rejected: a dedicated polling thread per queue (SPDK's reactor: a CPU
 * burned whether the guest is busy or not); publishing used->idx on every
 * completion (one interrupt per request under load).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "vub-export.h"

#define NOFD_POLL_NS 1000000
#define MAX_SLOTS    1024     /* requests in flight per queue */

static void process(struct ioc__vub_queue *q);

static void ring_fault(struct ioc__vub_queue *q)
{
	ioc__vub_log(q->exp, "queue %u stopped: %s", q->index,
		     q->vr.why ? q->vr.why : "ring fault");
	if (q->err_fd >= 0) {
		uint64_t one = 1;

		if (write(q->err_fd, &one, sizeof(one)) < 0) {
			/* A full eventfd: the front end has been told. */
		}
	}
}

static void flush_bh(void *opaque)
{
	struct ioc__vub_queue *q = opaque;

	q->flush_pending = false;
	ioc__vub_vring_flush(&q->vr);
	if (q->starved) {
		q->starved = false;
		process(q);
	}
}

void ioc__vub_queue_complete(struct ioc__vub_req *r, uint32_t used_len)
{
	struct ioc__vub_queue *q = r->q;

	ioc__vub_vring_push(&q->vr, r->e.head, used_len);
	r->next_free = q->free;
	q->free = r;
	q->inflight--;
	/* Relaxed load + store, one writer (this loop): a statistic read by
	 * ioc__vub_export_info() with a relaxed load. */
	atomic_store_explicit(&q->completed,
			      atomic_load_explicit(&q->completed, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	if (!q->flush_pending) {
		q->flush_pending = true;
		ioc_bh_schedule(q->flush_bh);
	}
	if (q->inflight == 0 && q->drain_waiter) {
		struct ioc_co *co = q->drain_waiter;

		q->drain_waiter = NULL;
		ioc_co_wake(co);
	}
}

static void process(struct ioc__vub_queue *q)
{
	if (!q->started || !q->enabled || q->vr.broken)
		return;
	/* Relaxed: guard.c's flag; the zeros it mapped are harmless until
	 * this pass sees it. */
	if (atomic_load_explicit(&q->exp->mem_shrunk, memory_order_relaxed)) {
		q->vr.broken = true;
		q->vr.why = "a file the front end passed (guest memory, its dirty log "
			    "or the inflight region) shrank under its mapping";
		ring_fault(q);
		return;
	}
	for (;;) {
		struct ioc__vub_req *r;
		int rc;

		while ((r = q->free)) {
			/* What was in flight before a restart goes first, in
			 * the order it was taken. */
			if (q->resubmit_pos < q->nresubmit)
				rc = ioc__vub_vring_pop_head(&q->vr,
							     q->resubmit[q->resubmit_pos++].head,
							     &r->e);
			else
				rc = ioc__vub_vring_pop(&q->vr, &r->e);
			if (rc == 0)
				break;
			if (rc < 0) {
				ring_fault(q);
				return;
			}
			q->free = r->next_free;
			q->inflight++;
			ioc__vub_blk_start(r);
		}
		if (!q->free) {
			/* Every slot busy: the next completion's flush
			 * comes back here. */
			q->starved = true;
			return;
		}
		if (!ioc__vub_vring_arm(&q->vr))
			return;
	}
}

static void kick_read(void *opaque)
{
	struct ioc__vub_queue *q = opaque;
	uint64_t v;

	if (read(q->kick_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: a poll round already took what the kick meant. */
	}
	process(q);
}

static bool kick_poll(void *opaque)
{
	struct ioc__vub_queue *q = opaque;

	return q->started && q->enabled && q->free && ioc__vub_vring_avail(&q->vr);
}

static void kick_poll_ready(void *opaque)
{
	process(opaque);
}

static void nofd_tick(void *opaque)
{
	struct ioc__vub_queue *q = opaque;

	process(q);
	if (q->started)
		ioc_timer_arm_in(&q->nofd_timer, NOFD_POLL_NS);
}

int ioc__vub_queue_init(struct ioc__vub_queue *q)
{
	q->kick_fd = q->err_fd = -1;
	q->vr.call_fd = -1;
	q->flush_bh = ioc_bh_new(q->loop, flush_bh, q);
	if (!q->flush_bh)
		return -ENOMEM;
	ioc_timer_init(&q->nofd_timer, q->loop, nofd_tick, q);
	return 0;
}

static int bh_delete(void *arg)
{
	struct ioc__vub_queue *q = arg;

	ioc_timer_cancel(&q->nofd_timer);
	ioc_bh_delete(q->flush_bh);
	return 0;
}

void ioc__vub_queue_fini(struct ioc__vub_queue *q)
{
	if (q->flush_bh)
		ioc_loop_call(q->loop, bh_delete, q);
	q->flush_bh = NULL;
	free(q->reqs);
	q->reqs = NULL;
	free(q->resubmit);
	q->resubmit = NULL;
}

static void ioc_coroutine_fn drain(struct ioc__vub_queue *q)
{
	while (q->inflight) {
		q->drain_waiter = ioc_co_self();
		ioc_co_yield();
	}
}

int ioc_coroutine_fn ioc__vub_queue_start(struct ioc__vub_queue *q,
					  const struct ioc__vub_mem *mem)
{
	int r;

	if (q->started)
		return 0;
	r = ioc__vub_vring_map(&q->vr, mem);
	if (r < 0)
		return r;
	/* A slot per ring entry, up to QEMU's largest ring: past that a
	 * ring of 32768 entries would pin 140 MiB of slots, and waiting for
	 * a free slot costs a larger ring nothing but depth. */
	unsigned want = q->vr.num < MAX_SLOTS ? q->vr.num : MAX_SLOTS;

	if (q->nreqs != want) {
		struct ioc__vub_req *reqs = calloc(want, sizeof(*reqs));

		if (!reqs)
			return -ENOMEM;
		free(q->reqs);
		q->reqs = reqs;
		q->nreqs = want;
	}
	q->free = NULL;
	for (unsigned i = 0; i < q->nreqs; i++) {
		q->reqs[i].q = q;
		q->reqs[i].next_free = q->free;
		q->free = &q->reqs[i];
	}
	/* The guest's used->idx is where we go on (0 on a fresh ring, the
	 * old value after a stop and restart).  Relaxed: only we write it,
	 * and our last write was before the stop that ordered it. */
	q->vr.used_idx = q->vr.published =
		__atomic_load_n(&q->vr.used->idx, __ATOMIC_RELAXED);
	q->vr.signalled_valid = false;
	q->inflight = 0;
	q->starved = false;
	q->nresubmit = q->resubmit_pos = 0;
	if (q->vr.inflight) {
		if (q->resubmit_cap < q->vr.num) {
			struct ioc__vub_resubmit *rs = calloc(q->vr.num, sizeof(*rs));

			if (!rs)
				return -ENOMEM;
			free(q->resubmit);
			q->resubmit = rs;
			q->resubmit_cap = q->vr.num;
		}
		r = ioc__vub_vring_inflight_start(&q->vr, q->resubmit);
		if (r < 0)
			return r;
		q->nresubmit = (unsigned)r;
		if (r > 0)
			ioc__vub_log(q->exp, "queue %u: resubmitting %d requests in flight "
				     "before the restart", q->index, r);
	}
	if (q->kick_fd >= 0) {
		r = ioc_loop_set_fd(q->loop, q->kick_fd, kick_read, NULL, kick_poll,
				    kick_poll_ready, q);
		if (r < 0)
			return r;
	} else {
		ioc_timer_arm_in(&q->nofd_timer, NOFD_POLL_NS);
	}
	q->started = true;
	q->enabled = q->want_enable;
	/* Requests made before the kick fd came are served now. */
	process(q);
	return 0;
}

void ioc_coroutine_fn ioc__vub_queue_stop(struct ioc__vub_queue *q)
{
	if (!q->started)
		return;
	q->started = false;
	if (q->kick_fd >= 0)
		ioc_loop_set_fd(q->loop, q->kick_fd, NULL, NULL, NULL, NULL, NULL);
	ioc_timer_cancel(&q->nofd_timer);
	drain(q);
	ioc_bh_cancel(q->flush_bh);
	q->flush_pending = false;
	ioc__vub_vring_flush(&q->vr);
}

void ioc_coroutine_fn ioc__vub_queue_remap(struct ioc__vub_queue *q,
					   const struct ioc__vub_mem *mem)
{
	bool was = q->enabled;

	if (!q->started)
		return;
	q->enabled = false;
	drain(q);
	ioc__vub_vring_flush(&q->vr);
	if (ioc__vub_vring_map(&q->vr, mem) < 0) {
		q->vr.broken = true;
		ring_fault(q);
		return;
	}
	q->enabled = was;
	process(q);
}

void ioc_coroutine_fn ioc__vub_queue_set_call(struct ioc__vub_queue *q, int fd)
{
	q->vr.call_fd = fd;
}

void ioc_coroutine_fn ioc__vub_queue_set_enable(struct ioc__vub_queue *q, bool on)
{
	q->want_enable = on;
	if (!q->started)
		return;
	q->enabled = on;
	if (on)
		process(q);
}
