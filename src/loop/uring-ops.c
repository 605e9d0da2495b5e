/*
 * io_uring operations on the loop's ring (QEMU's aio_add_sqe idea).
 *
 * Problem: the block layer and the NBD server want to submit their own
 * io_uring operations and get completions on the loop thread, batched with
 * everything else the iteration submits, whatever fd monitoring backend
 * the loop uses.
 *
 * Design: one struct io_uring per loop.  With the io_uring backend it is
 * the backend's ring (fd polls and user operations share it, one
 * io_uring_enter per iteration submits and waits).  With epoll or poll a
 * small private ring is created on first use and its fd is registered as
 * an internal fd handler, so completions wake the loop like any fd.
 * Every SQE's user_data is a struct ioc_uring_op whose cb gets the CQE;
 * user_data 0 marks CQEs nobody waits for.  CQEs are copied out and the CQ
 * advanced before any callback runs, so a callback may submit, reap or
 * even run a nested iteration.
 *
 * Backend ring setup, best first: SINGLE_ISSUER + DEFER_TASKRUN (task work
 * runs only when the loop asks, no IPIs, batched), then COOP_TASKRUN, then
 * a plain ring.  TASKRUN_FLAG makes pending deferred work visible in the SQ
 * flags, which is what lets adaptive polling watch the ring from userspace
 * without a syscall.  SINGLE_ISSUER binds the ring to one task, and a loop
 * may be created on one thread and run on another, so the ring starts
 * R_DISABLED and the first thread that polls the loop enables it (and
 * registers the ring fd in its own table to skip fdget on every enter).
 * A thread that fills the SQ before the loop first runs enables it too, so
 * such a loop must then be run by that same thread (an iothread always is).
 *
 * The private ring is plain (no COOP/DEFER): with those, completions are
 * posted only when the task enters io_uring, but this loop sleeps in
 * epoll_wait/ppoll, where only a plain ring's task-work signal wakes it.
 *
 * Layering: these helpers sit below loop.c and the fdmon backends and call
 * neither; the public side (ioc_loop_get_sqe(), the private ring's fd
 * handler) is in loop.c.
 *
 * Costs: a copy of 16 bytes per CQE; one SQ-ready check per iteration.
 */
#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loop-int.h"

#define REAP_BATCH 32

static bool setup_denied(int r)
{
	/* Not a flag problem: io_uring itself is unavailable. */
	return r == -ENOSYS || r == -EPERM || r == -EACCES;
}

int ioc__uring_setup(struct ioc_loop *loop, bool backend)
{
	const unsigned base = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL;
	unsigned tries[4], ntries = 0;
	unsigned entries = loop->opts.uring_entries;
	int r = -EINVAL;

	if (backend) {
		unsigned fancy = IORING_SETUP_SINGLE_ISSUER |
				 IORING_SETUP_TASKRUN_FLAG |
				 IORING_SETUP_R_DISABLED;

		if (!(loop->ablate & IOC__LOOP_NO_DEFER))
			tries[ntries++] = base | fancy | IORING_SETUP_DEFER_TASKRUN;
		tries[ntries++] = base | fancy | IORING_SETUP_COOP_TASKRUN;
	}
	tries[ntries++] = base;
	tries[ntries++] = 0;

	for (unsigned i = 0; i < ntries; i++) {
		struct io_uring_params p;

		memset(&p, 0, sizeof(p));
		p.flags = tries[i];
		if (p.flags & IORING_SETUP_CQSIZE)
			p.cq_entries = entries * 4;
		r = io_uring_queue_init_params(entries, &loop->ring, &p);
		if (r == 0) {
			loop->has_ring = true;
			loop->ring_enabled = !(p.flags & IORING_SETUP_R_DISABLED);
			loop->ring_setup_flags = p.flags;
			return 0;
		}
		if (setup_denied(r))
			break;
	}
	loop->ring_error = r;
	return r;
}

/* On the thread that runs the loop, before its first submission. */
void ioc__uring_enable(struct ioc_loop *loop)
{
	/* liburing 2.3 declares io_uring_enable_rings() but does not export
	 * it: make the register call directly. */
	if (loop->ring_setup_flags & IORING_SETUP_R_DISABLED)
		syscall(__NR_io_uring_register, loop->ring.ring_fd,
			IORING_REGISTER_ENABLE_RINGS, NULL, 0);
	loop->ring_enabled = true;
	if (!(loop->ablate & IOC__LOOP_NO_REG_RING) &&
	    !loop->ring_private)
		io_uring_register_ring_fd(&loop->ring);
}

void ioc__loop_thread_exit(struct ioc_loop *loop)
{
	/* The registered ring fd lives in this thread's table: drop it
	 * here, so freeing the loop elsewhere cannot unregister another
	 * ring's slot in that thread's table. */
	if (loop->has_ring && loop->ring.int_flags & 1 /* INT_FLAG_REG_RING */)
		io_uring_unregister_ring_fd(&loop->ring);
}

static inline bool sq_flags_pending(struct io_uring *ring)
{
	return IO_URING_READ_ONCE(*ring->sq.kflags) &
	       (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW);
}

bool ioc__uring_pending(struct ioc_loop *loop)
{
	return io_uring_cq_ready(&loop->ring) || sq_flags_pending(&loop->ring);
}

int ioc__uring_reap(struct ioc_loop *loop)
{
	struct io_uring *ring = &loop->ring;
	int total = 0;

	for (;;) {
		struct { uint64_t data; int32_t res; uint32_t flags; } c[REAP_BATCH];
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;

		io_uring_for_each_cqe(ring, head, cqe) {
			c[n].data = cqe->user_data;
			c[n].res = cqe->res;
			c[n].flags = cqe->flags;
			if (++n == REAP_BATCH)
				break;
		}
		if (!n) {
			/* Overflowed CQEs wait in the kernel: flush them. */
			if (IO_URING_READ_ONCE(*ring->sq.kflags) &
			    IORING_SQ_CQ_OVERFLOW) {
				io_uring_get_events(ring);
				if (io_uring_cq_ready(ring))
					continue;
			}
			return total;
		}
		io_uring_cq_advance(ring, n);
		for (unsigned i = 0; i < n; i++) {
			struct ioc_uring_op *op =
				(struct ioc_uring_op *)(uintptr_t)c[i].data;

			if (op)
				op->cb(op, c[i].res, c[i].flags);
		}
		total += (int)n;
	}
}

struct io_uring_sqe *ioc__uring_sqe(struct ioc_loop *loop)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&loop->ring);

	if (ioc_unlikely(!sqe && !loop->ring_enabled) && ioc_loop_in_thread(loop))
		ioc__uring_enable(loop); /* SQ full before the first run */
	if (!sqe && loop->ring_enabled) {
		io_uring_submit(&loop->ring);
		sqe = io_uring_get_sqe(&loop->ring);
	}
	return sqe;
}
