/*
 * fd monitoring with epoll(7), level-triggered.
 *
 * The kernel keeps the interest list, so a wait costs O(ready fds), not
 * O(registered).  Each epoll_event carries the handler pointer; a handler
 * removed after the wait returned may still sit on the ready queue, where
 * dispatch skips it (it is marked deleted and freed only after the
 * iteration).  Waits use epoll_pwait2 for ns timeouts, falling back to
 * epoll_wait with the timeout rounded up to whole ms.
 *
 * Rejected: edge-triggered mode (saves re-reporting a fd the callback did
 * not drain, but every callback would have to read until EAGAIN, which the
 * handler contract does not require).  Regular files cannot be watched
 * (EPERM): set_fd reports the error.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "loop-int.h"

#define EP_EVENTS 256

static int ep_init(struct ioc_loop *loop)
{
	loop->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (loop->epfd < 0)
		return -errno;
	loop->evbuf = calloc(EP_EVENTS, sizeof(struct epoll_event));
	if (!loop->evbuf) {
		close(loop->epfd);
		loop->epfd = -1;
		return -ENOMEM;
	}
	return 0;
}

static void ep_fini(struct ioc_loop *loop)
{
	if (loop->epfd >= 0)
		close(loop->epfd);
	loop->epfd = -1;
	free(loop->evbuf);
	loop->evbuf = NULL;
}

static int ep_update(struct ioc_loop *loop, struct ioc_handler *h,
		     uint32_t old)
{
	struct epoll_event ev = { .events = h->events, .data.ptr = h };
	int op;

	if (!old && !h->events)
		return 0;
	op = !old ? EPOLL_CTL_ADD : !h->events ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
	if (epoll_ctl(loop->epfd, op, h->fd, &ev) < 0) {
		/* A removal of an fd the caller already closed is fine. */
		return op == EPOLL_CTL_DEL ? 0 : -errno;
	}
	return 0;
}

static int ep_wait(struct ioc_loop *loop, int64_t timeout_ns)
{
	static atomic_bool no_pwait2;
	struct epoll_event *ev = loop->evbuf;
	struct timespec ts, *tsp = ioc__wait_timespec(timeout_ns, &ts);
	int n;

	/* no_pwait2 is a benign cache, relaxed: every thread computes the
	 * same value and nothing else is published with it. */
	n = -1;
	if (!atomic_load_explicit(&no_pwait2, memory_order_relaxed)) {
		n = epoll_pwait2(loop->epfd, ev, EP_EVENTS, tsp, NULL);
		if (n < 0 && errno == ENOSYS)
			atomic_store_explicit(&no_pwait2, true,
					      memory_order_relaxed);
	}
	if (atomic_load_explicit(&no_pwait2, memory_order_relaxed))
		n = epoll_wait(loop->epfd, ev, EP_EVENTS,
			       timeout_ns < 0 ? -1 :
			       (int)((timeout_ns + 999999) / 1000000));
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	for (int i = 0; i < n; i++)
		ioc__loop_ready(loop, ev[i].data.ptr, ev[i].events);
	return n;
}

const struct ioc_fdmon_ops ioc__fdmon_epoll_ops = {
	.name = "epoll",
	.caps = IOC_FDMON_CAP_CHEAP_CHECK,
	.init = ep_init,
	.fini = ep_fini,
	.update = ep_update,
	.wait = ep_wait,
};
