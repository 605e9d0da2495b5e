/*
 * fd monitoring with io_uring poll requests (QEMU's fdmon-io_uring design).
 *
 * Problem: epoll can only be asked with a syscall, so userspace polling of
 * a few active handlers risks starving the others for up to poll_ns.  With
 * io_uring, fd readiness arrives as CQEs (or, with DEFER_TASKRUN, as the
 * IORING_SQ_TASKRUN flag) in shared memory, so the adaptive polling loop
 * watches every fd for free and the polled set can be as small as the
 * active handlers.
 *
 * Design: each handler owns one poll request whose user_data is its
 * embedded struct ioc_uring_op.  By default it is QEMU's one-shot POLL_ADD,
 * re-armed after each event: re-arming checks readiness again, which gives
 * the level-triggered behaviour epoll and poll have.  A handler declared
 * edge (ioc_loop_set_fd_edge(): its callbacks drain the fd) keeps one
 * multishot poll armed instead, saving an SQE and a poll-arm per event;
 * multishot poll is edge-triggered (no new CQE while the fd stays ready,
 * and IORING_POLL_ADD_LEVEL is refused with it), hence the opt-in.
 * Arming is deferred to a per-loop list flushed before each io_uring_enter,
 * so every re-arm of an iteration goes out with its wait in one syscall,
 * and registration of 10,000 fds needs no SQ space at set_fd time.
 * Changing the wanted events updates the armed request in place
 * (POLL_REMOVE with IORING_POLL_UPDATE_EVENTS; a server toggling POLLOUT
 * around a full socket does this often); removal cancels it.  A removed
 * handler stays allocated until the request's final CQE (backend_busy).
 *
 * Wakeups: the loop's eventfd is an internal edge handler (multishot).
 * Cross-loop IORING_OP_MSG_RING wakeups were tried and dropped:
 * cross-thread.c says why.
 *
 * Rejected: IORING_OP_EPOLL_CTL + one epoll fd (two levels of readiness,
 * and still a syscall to read events); cancel + re-arm on every mask
 * change (two SQEs and a CQE instead of one SQE).
 */
#include <errno.h>

#include "loop-int.h"

static void queue_arm(struct ioc_loop *loop, struct ioc_handler *h)
{
	if (h->on_arm)
		return;
	h->on_arm = true;
	IOC__FIFO_APPEND(loop->arm_head, loop->arm_tail, h, h, arm_next);
}

static void unqueue_arm(struct ioc_loop *loop, struct ioc_handler *h)
{
	struct ioc_handler **pp = &loop->arm_head, *prev = NULL;

	if (!h->on_arm)
		return;
	/* O(queued arms), which is short: it empties every iteration. */
	while (*pp && *pp != h) {
		prev = *pp;
		pp = &(*pp)->arm_next;
	}
	if (*pp) {
		*pp = h->arm_next;
		if (loop->arm_tail == h)
			loop->arm_tail = prev;
	}
	h->on_arm = false;
}

static void poll_cqe(struct ioc_uring_op *op, int res, uint32_t flags)
{
	struct ioc_handler *h = ioc_container_of(op, struct ioc_handler, uop);
	struct ioc_loop *loop = h->loop;
	bool more = flags & IORING_CQE_F_MORE;

	if (!more) {
		h->armed_events = 0;
		h->cancel_sent = false;
		h->poll_multishot = false;
	}
	if (!h->deleted) {
		if (res > 0)
			ioc__loop_ready(loop, h, (uint32_t)res);
		else if (res < 0 && res != -ECANCELED)
			ioc__loop_ready(loop, h, res == -EBADF ? POLLNVAL :
					POLLERR);
	}
	if (more)
		return;
	if (h->deleted || !h->events) {
		h->backend_busy = false;
		if (h->deleted)
			ioc__loop_handler_released(loop, h);
	} else if (res != -EBADF) {
		queue_arm(loop, h); /* one-shot ended (or multishot stopped) */
	} else {
		h->backend_busy = false; /* closed under us: stop watching */
	}
}

static int ur_init(struct ioc_loop *loop)
{
	int r = ioc__uring_setup(loop, true);

	if (r < 0)
		return r;
	loop->ring_private = false;
	return 0;
}

static void ur_fini(struct ioc_loop *loop)
{
	if (!loop->has_ring)
		return;
	io_uring_queue_exit(&loop->ring);
	loop->has_ring = false;
	loop->arm_head = loop->arm_tail = NULL;
}

static void send_cancel(struct ioc_loop *loop, struct ioc_handler *h)
{
	struct io_uring_sqe *sqe = ioc__uring_sqe(loop);

	if (!sqe)
		return; /* SQ full before the ring runs: cannot happen armed */
	io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)&h->uop);
	io_uring_sqe_set_data(sqe, NULL);
	sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
	h->cancel_sent = true;
}

/*
 * Change the mask of the armed poll (POLL_REMOVE with UPDATE_EVENTS): one
 * SQE, no re-arm.  If the poll already fired, the update fails with
 * -ENOENT (its CQE is skipped only on success and ignored otherwise) and
 * the poll's own final CQE re-arms with the current mask.
 */
static void send_update(struct ioc_loop *loop, struct ioc_handler *h)
{
	struct io_uring_sqe *sqe = ioc__uring_sqe(loop);
	uint64_t ud = (uint64_t)(uintptr_t)&h->uop;

	if (!sqe) {
		send_cancel(loop, h);
		return;
	}
	/* new_user_data must be 0 without IORING_POLL_UPDATE_USER_DATA, or
	 * the kernel refuses the update with -EINVAL. */
	io_uring_prep_poll_update(sqe, ud, 0, h->events,
				  IORING_POLL_UPDATE_EVENTS |
				  (h->poll_multishot ? IORING_POLL_ADD_MULTI : 0));
	io_uring_sqe_set_data(sqe, NULL);
	sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
	h->armed_events = h->events;
}

static int ur_update(struct ioc_loop *loop, struct ioc_handler *h,
		     uint32_t old)
{
	(void)old;
	h->loop = loop;
	h->uop.cb = poll_cqe;
	if (h->deleted || !h->events) {
		unqueue_arm(loop, h);
		if (h->armed_events && !h->cancel_sent)
			send_cancel(loop, h);
		h->backend_busy = h->armed_events != 0;
		return 0;
	}
	if (h->armed_events) {
		/* Different mask in flight: update it in place. */
		if (h->armed_events != h->events && !h->cancel_sent)
			send_update(loop, h);
		return 0;
	}
	h->backend_busy = true;
	queue_arm(loop, h);
	return 0;
}

/* Arm queued polls; called before every submission. */
static void arm_pending(struct ioc_loop *loop)
{
	struct ioc_handler *h;

	if (!loop->ring_enabled)
		return;
	while ((h = loop->arm_head)) {
		struct io_uring_sqe *sqe;
		bool multi = h->edge &&
			!(loop->ablate & IOC__LOOP_NO_MULTISHOT);

		if (h->deleted || !h->events || h->armed_events) {
			loop->arm_head = h->arm_next;
			h->on_arm = false;
			continue;
		}
		sqe = ioc__uring_sqe(loop);
		if (!sqe)
			break;
		loop->arm_head = h->arm_next;
		h->on_arm = false;
		if (multi)
			io_uring_prep_poll_multishot(sqe, h->fd, h->events);
		else
			io_uring_prep_poll_add(sqe, h->fd, h->events);
		io_uring_sqe_set_data(sqe, &h->uop);
		h->armed_events = h->events;
		h->poll_multishot = multi;
		h->backend_busy = true;
	}
	if (!loop->arm_head)
		loop->arm_tail = NULL;
}

static int ur_flush(struct ioc_loop *loop)
{
	int r;

	if (!loop->ring_enabled)
		return 0;
	arm_pending(loop);
	if (!io_uring_sq_ready(&loop->ring))
		return 0;
	r = io_uring_submit(&loop->ring);
	return r < 0 ? r : 0;
}

static int ur_wait(struct ioc_loop *loop, int64_t timeout_ns)
{
	struct io_uring *ring = &loop->ring;

	arm_pending(loop);
	if (timeout_ns == 0) {
		if (io_uring_sq_ready(ring) ||
		    (IO_URING_READ_ONCE(*ring->sq.kflags) &
		     (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)))
			io_uring_submit_and_get_events(ring);
	} else if (!io_uring_cq_ready(ring)) {
		struct __kernel_timespec ts, *tsp = NULL;
		struct io_uring_cqe *cqe;

		if (timeout_ns > 0) {
			ts.tv_sec = timeout_ns / 1000000000;
			ts.tv_nsec = timeout_ns % 1000000000;
			tsp = &ts;
		}
		/* One enter: submit the iteration's SQEs and wait. -ETIME and
		 * -EINTR just end the wait. */
		io_uring_submit_and_wait_timeout(ring, &cqe, 1, tsp, NULL);
	} else if (io_uring_sq_ready(ring)) {
		io_uring_submit(ring);
	}
	return ioc__uring_reap(loop);
}

static bool ur_pending(struct ioc_loop *loop)
{
	return ioc__uring_pending(loop);
}

const struct ioc_fdmon_ops ioc__fdmon_uring_ops = {
	.name = "io_uring",
	.caps = IOC_FDMON_CAP_USERSPACE_POLL | IOC_FDMON_CAP_URING,
	.init = ur_init,
	.fini = ur_fini,
	.update = ur_update,
	.wait = ur_wait,
	.pending = ur_pending,
	.flush = ur_flush,
};
