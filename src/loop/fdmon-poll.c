/*
 * fd monitoring with ppoll(2): the portable fallback.
 *
 * A dense pollfd array (swap-remove, each handler remembers its index) and
 * a parallel array of handlers.  Every wait costs O(registered fds) in the
 * kernel and here; that is the nature of poll(2) and why it is the last
 * choice.  Timeouts have ns resolution (ppoll takes a timespec).
 */
#include <errno.h>
#include <stdlib.h>

#include "loop-int.h"

static int poll_init(struct ioc_loop *loop)
{
	loop->pfds = NULL;
	loop->pfd_h = NULL;
	loop->npfds = loop->pfds_cap = 0;
	return 0;
}

static void poll_fini(struct ioc_loop *loop)
{
	free(loop->pfds);
	free(loop->pfd_h);
	loop->pfds = NULL;
	loop->pfd_h = NULL;
}

static int poll_grow(struct ioc_loop *loop)
{
	unsigned cap = loop->pfds_cap ? loop->pfds_cap * 2 : 16;
	struct pollfd *p = realloc(loop->pfds, cap * sizeof(*p));
	struct ioc_handler **h;

	if (!p)
		return -ENOMEM;
	loop->pfds = p;
	h = realloc(loop->pfd_h, cap * sizeof(*h));
	if (!h)
		return -ENOMEM;
	loop->pfd_h = h;
	loop->pfds_cap = cap;
	return 0;
}

static int poll_update(struct ioc_loop *loop, struct ioc_handler *h,
		       uint32_t old)
{
	if (!old && h->events) {
		if (loop->npfds == loop->pfds_cap) {
			int r = poll_grow(loop);

			if (r < 0)
				return r;
		}
		h->pfd_idx = (int)loop->npfds++;
		loop->pfds[h->pfd_idx] = (struct pollfd){
			.fd = h->fd, .events = (short)h->events };
		loop->pfd_h[h->pfd_idx] = h;
	} else if (old && !h->events) {
		unsigned idx = (unsigned)h->pfd_idx, last = --loop->npfds;

		if (idx != last) {
			loop->pfds[idx] = loop->pfds[last];
			loop->pfd_h[idx] = loop->pfd_h[last];
			loop->pfd_h[idx]->pfd_idx = (int)idx;
		}
		h->pfd_idx = -1;
	} else if (h->events) {
		loop->pfds[h->pfd_idx].events = (short)h->events;
	}
	return 0;
}

static int poll_wait(struct ioc_loop *loop, int64_t timeout_ns)
{
	struct timespec ts, *tsp = ioc__wait_timespec(timeout_ns, &ts);
	int n;

	n = ppoll(loop->pfds, loop->npfds, tsp, NULL);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	for (unsigned i = 0, left = (unsigned)n; i < loop->npfds && left; i++) {
		if (loop->pfds[i].revents) {
			ioc__loop_ready(loop, loop->pfd_h[i],
					(uint16_t)loop->pfds[i].revents);
			left--;
		}
	}
	return n;
}

const struct ioc_fdmon_ops ioc__fdmon_poll_ops = {
	.name = "poll",
	.caps = 0,
	.init = poll_init,
	.fini = poll_fini,
	.update = poll_update,
	.wait = poll_wait,
};
