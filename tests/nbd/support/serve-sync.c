/*
 * The blocking transport: one connected socket served on the calling
 * thread, with blocking recv/sendmsg, executing requests one after another.
 *
 * It exists so the protocol core can be driven without the runtime: the
 * libFuzzer target and the protocol tests run it over a socketpair with the
 * in-memory backend.  It still batches like the real server: everything a
 * recv returned is parsed and executed, then all replies go out in one
 * gathered sendmsg.  Not a production server (no concurrency, no timeout).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nbd-client.h"   /* cl_write() */
#include "nbd-support.h"

#define SYNC_IN_CAP (256u << 10)
#define SYNC_IOV_MAX 64

static struct ioc__nbd_req *sync_alloc(void *opaque, size_t len)
{
	struct ioc__nbd_req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	if (len) {
		if (posix_memalign((void **)&r->buf, 4096, len) != 0) {
			free(r);
			return NULL;
		}
		r->buf_cap = len;
	}
	return r;
}

static void sync_free(struct ioc__nbd_req *r)
{
	free(r->buf);
	free(r->ext);
	free(r);
}

/* Send every queued reply with as few sendmsg calls as possible. */
static int flush_queue(int fd, struct ioc__nbd_req **head)
{
	struct iovec iov[SYNC_IOV_MAX];

	while (*head) {
		int n = ioc__nbd_gather(*head, iov, SYNC_IOV_MAX);
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		unsigned done = ioc__nbd_sent(*head, (size_t)r);
		while (done--) {
			struct ioc__nbd_req *q = *head;
			*head = q->next;
			sync_free(q);
		}
	}
	return 0;
}

static ssize_t fill(int fd, struct ioc__nbd_conn *c)
{
	ioc__nbd_conn_compact(c);
	for (;;) {
		ssize_t r = recv(fd, c->in + c->in_end, c->in_cap - c->in_end, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r > 0)
			c->in_end += (size_t)r;
		return r < 0 ? -errno : r;
	}
}

int ioc__nbd_serve_sync(int fd, const struct ioc__nbd_cfg *cfg)
{
	struct ioc__nbd_conn c;
	struct ioc__nbd_req *head = NULL, **tail = &head;
	int ret = ioc__nbd_conn_init(&c, cfg, SYNC_IN_CAP);

	if (ret < 0)
		return ret;
	ioc__nbd_hs_start(&c);
	for (;;) {
		int st = ioc__nbd_hs_step(&c);
		if (c.out_len) {
			ret = cl_write(fd, c.out, c.out_len);
			c.out_len = 0;
			if (ret < 0)
				goto out;
		}
		if (st == IOC_NBD_READY)
			break;
		if (st == IOC_NBD_STARTTLS) {
			ret = -ENOTSUP; /* no TLS in the blocking transport */
			goto out;
		}
		if (st != IOC_NBD_MORE) {
			ret = st == IOC_NBD_CLOSE ? 0 : st;
			goto out;
		}
		ssize_t n = fill(fd, &c);
		if (n <= 0) {
			ret = (int)n;
			goto out;
		}
	}

	for (;;) {
		struct ioc__nbd_req *r;
		int st;

		while ((st = ioc__nbd_parse_request(&c, sync_alloc, NULL, &r)) ==
		       IOC_NBD_READY) {
			ioc__nbd_execute(&c, r);
			if (r->no_reply) {
				sync_free(r);
				continue;
			}
			*tail = r;
			tail = &r->next;
		}
		ret = flush_queue(fd, &head);
		tail = &head;
		if (ret < 0 || st == IOC_NBD_CLOSE)
			goto out;
		if (st < 0) {
			ret = st;
			goto out;
		}
		ssize_t n = fill(fd, &c);
		if (n <= 0) {
			ret = (int)n;
			goto out;
		}
	}
out:
	while (head) {
		struct ioc__nbd_req *q = head;
		head = q->next;
		sync_free(q);
	}
	if (c.partial)
		sync_free(c.partial);
	ioc__nbd_conn_destroy(&c);
	return ret;
}
