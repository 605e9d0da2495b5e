/*
 * The vhost-user-blk export object: its socket, its one connection, its
 * queues.
 *
 * Problem: the daemon creates an export on a node and a socket, and the
 * front end may come, go and come back (a QEMU restart, a reconnecting
 * chardev) any number of times; each time the device must start from
 * nothing, with no fd, mapping or request of the last one left behind.
 * Deleting the export must wait for the requests still in flight.
 *
 * Design: the listening socket is an fd handler on the control loop.  An
 * accepted connection is served by one coroutine there: read a message,
 * dispatch it (dev.c), repeat; at the end of the stream or on a
 * protocol error, reset the device (stop every queue, drain, unmap, close)
 * and end.  A second front end while one is connected is accepted and
 * closed at once with a log line, so it fails fast; but when the current
 * one has already hung up (a QEMU restart racing our teardown) the new
 * connection waits in the backlog until the teardown is done.  Queues and their request slots belong to the export and are
 * reused by each connection; queue i is pinned to loops[i % nloops] for
 * the export's life.  close() shuts the connection's socket down, which
 * ends the coroutine through its normal path; its last act frees the
 * export and calls the closer back.  free() is close() and a wait for
 * that call (yielding in a coroutine, else polling the control loop).
 *
 * Rejected: leaving every second front end in the listen backlog (it
 * would hang in its first GET_FEATURES until the first one leaves); a thread
 * per connection (the control path is a few hundred messages per boot).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "vub-export.h"
#include "util/socket.h"

void ioc__vub_log(struct ioc__vub_export *e, const char *fmt, ...)
{
	char line[512];
	int n;
	va_list ap;

	n = snprintf(line, sizeof(line), "vhost-user-blk export '%s': ", e->id);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (e->log)
		e->log(e->log_opaque, line);
	else
		fprintf(stderr, "%s\n", line);
}

static void accept_cb(void *opaque);

/* Nothing of e runs any more: free it and tell the closer. */
static void finish(struct ioc__vub_export *e)
{
	void (*done)(void *opaque) = e->done;
	void *opaque = e->done_opaque;

	for (unsigned i = 0; i < e->num_queues; i++)
		ioc__vub_queue_fini(&e->q[i]);
	ioc_node_unref(e->node);
	free(e->socket_path);
	free(e);
	if (done)
		done(opaque);
}

static void ioc_coroutine_fn conn_co(void *opaque)
{
	struct ioc__vub_conn *c = opaque;
	struct ioc__vub_export *e = c->exp;
	struct ioc__vub_msg m;

	for (;;) {
		const char *why = NULL;
		char nb[32];
		int r;

		m.request = 0;
		r = ioc__vub_msg_recv(c->fd, &m, &why);

		if (r == -ECONNRESET) {
			ioc__vub_log(e, "front end disconnected");
			break;
		}
		if (r < 0) {
			if (why)
				ioc__vub_log(e, "closing the connection: %s (%s)", why,
					     ioc__vub_msg_name(m.request, nb, sizeof(nb)));
			else
				ioc__vub_log(e, "closing the connection: %s", ioc_strerror(r));
			break;
		}
		if (ioc__vub_dev_dispatch(c, &m) < 0)
			break;
	}
	ioc__vub_dev_reset(c);
	close(c->fd);
	free(c);
	e->conn = NULL;
	if (e->closing)
		finish(e);
	else if (e->listen_fd >= 0)
		ioc_loop_set_fd(e->ctrl, e->listen_fd, accept_cb, NULL, NULL, NULL, e);
}

/* Has the peer of fd closed its end? */
static bool peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void accept_cb(void *opaque)
{
	struct ioc__vub_export *e = opaque;
	struct ioc__vub_conn *c;
	struct ioc_co *co;
	int fd;

	if (e->conn && peer_gone(e->conn->fd)) {
		/* The front end is restarting: leave the new connection in
		 * the backlog until the old one is torn down (conn_co
		 * listens again then). */
		ioc_loop_set_fd(e->ctrl, e->listen_fd, NULL, NULL, NULL, NULL, NULL);
		return;
	}
	fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			ioc__vub_log(e, "accept: %s", ioc_strerror(errno));
		return;
	}
	if (e->conn) {
		ioc__vub_log(e, "refusing a second front end (one is connected)");
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	co = c ? ioc_co_create(conn_co, c) : NULL;
	if (!co) {
		ioc__vub_log(e, "refusing a front end: out of memory");
		free(c);
		close(fd);
		return;
	}
	c->exp = e;
	c->fd = fd;
	c->backend_fd = -1;
	c->log_fd = -1;
	e->conn = c;
	e->connections++;
	ioc__vub_log(e, "front end connected");
	ioc_co_enter(co);
}

static int listen_on(const char *path, char *err, size_t errlen)
{
	int fd = ioc__listen_unix(path, 4);

	if (fd == -ENAMETOOLONG)
		snprintf(err, errlen, "socket path '%s' is too long", path);
	else if (fd < 0)
		snprintf(err, errlen, "Failed to bind socket to %s: %s", path, ioc_strerror(fd));
	return fd;
}

int ioc__vub_export_new(struct ioc__vub_export **out, const struct ioc__vub_opts *o,
			char *err, size_t errlen)
{
	unsigned nq = o->num_queues ? o->num_queues : 1;
	uint32_t lbs = o->logical_block_size ? o->logical_block_size : 512;
	struct ioc_loop *ctrl = o->ctrl_loop ? o->ctrl_loop : ioc_loop_current();
	struct ioc__vub_export *e;
	int r;

	if (!o->node || !ctrl) {
		snprintf(err, errlen, "vhost-user-blk export needs a node and a control loop");
		return -EINVAL;
	}
	if (nq > IOC_VUB_MAX_QUEUES) {
		snprintf(err, errlen, "num-queues must be between 1 and %d", IOC_VUB_MAX_QUEUES);
		return -EINVAL;
	}
	if (lbs < 512 || lbs > 65536 || (lbs & (lbs - 1))) {
		snprintf(err, errlen, "logical-block-size must be a power of two between 512 and 65536");
		return -EINVAL;
	}
	if (o->writable && o->node->read_only) {
		snprintf(err, errlen, "Node '%s' is read only", o->node->name);
		return -EPERM;
	}
	if (!o->socket_path && o->listen_fd < 0) {
		snprintf(err, errlen, "vhost-user-blk export needs a socket");
		return -EINVAL;
	}
	e = calloc(1, sizeof(*e) + nq * sizeof(e->q[0]));
	if (!e)
		return -ENOMEM;
	snprintf(e->id, sizeof(e->id), "%s", o->id ? o->id : "");
	e->node = o->node;
	e->ctrl = ctrl;
	e->read_only = !o->writable;
	e->lbs = lbs;
	e->num_queues = nq;
	e->log = o->log;
	e->log_opaque = o->log_opaque;
	e->listen_fd = -1;
	atomic_init(&e->wce, true);
	ioc__vub_export_set_serial(e, o->serial);

	e->features = (1ull << VIRTIO_F_VERSION_1) | (1ull << VUB_F_PROTOCOL_FEATURES) |
		      (1ull << VIRTIO_RING_F_EVENT_IDX) | (1ull << VIRTIO_RING_F_INDIRECT_DESC) |
		      (1ull << VIRTIO_BLK_F_SEG_MAX) | (1ull << VIRTIO_BLK_F_BLK_SIZE) |
		      (1ull << VIRTIO_BLK_F_FLUSH) | (1ull << VIRTIO_BLK_F_CONFIG_WCE) |
		      (1ull << VIRTIO_BLK_F_MQ);
	e->features |= 1ull << VUB_F_LOG_ALL;   /* dirty logging: live migration */
	if (e->read_only)
		e->features |= 1ull << VIRTIO_BLK_F_RO;
	else
		e->features |= (1ull << VIRTIO_BLK_F_WRITE_ZEROES) |
			       (o->node->can_discard ? 1ull << VIRTIO_BLK_F_DISCARD : 0);
	e->protocol_features = (1ull << VUB_PROTO_F_MQ) | (1ull << VUB_PROTO_F_REPLY_ACK) |
			       (1ull << VUB_PROTO_F_BACKEND_REQ) | (1ull << VUB_PROTO_F_CONFIG) |
			       (1ull << VUB_PROTO_F_CONFIGURE_MEM_SLOTS);
	e->protocol_features |= 1ull << VUB_PROTO_F_LOG_SHMFD;

	e->protocol_features |= 1ull << VUB_PROTO_F_INFLIGHT_SHMFD;   /* inflight.c */

	for (unsigned i = 0; i < nq; i++) {
		struct ioc__vub_queue *q = &e->q[i];

		q->exp = e;
		q->index = i;
		q->loop = o->nloops ? o->loops[i % o->nloops] : ctrl;
		r = ioc__vub_queue_init(q);
		if (r < 0) {
			snprintf(err, errlen, "%s", ioc_strerror(r));
			goto fail;
		}
	}
	if (o->socket_path) {
		r = listen_on(o->socket_path, err, errlen);
		if (r < 0)
			goto fail;
		e->listen_fd = r;
		e->socket_path = strdup(o->socket_path);
		if (!e->socket_path) {
			r = -ENOMEM;
			goto fail;
		}
	} else {
		e->listen_fd = o->listen_fd;
		fcntl(e->listen_fd, F_SETFL, fcntl(e->listen_fd, F_GETFL) | O_NONBLOCK);
	}
	r = ioc_loop_set_fd(ctrl, e->listen_fd, accept_cb, NULL, NULL, NULL, e);
	if (r < 0) {
		snprintf(err, errlen, "%s", ioc_strerror(r));
		goto fail;
	}
	ioc_node_ref(e->node);
	*out = e;
	return 0;
fail:
	for (unsigned i = 0; i < nq; i++)
		ioc__vub_queue_fini(&e->q[i]);
	if (e->listen_fd >= 0)
		close(e->listen_fd);
	if (e->socket_path)
		unlink(e->socket_path);
	free(e->socket_path);
	free(e);
	return r;
}

void ioc__vub_export_close(struct ioc__vub_export *e, void (*done)(void *opaque),
			   void *opaque)
{
	e->closing = true;
	e->done = done;
	e->done_opaque = opaque;
	if (e->listen_fd >= 0) {
		ioc_loop_set_fd(e->ctrl, e->listen_fd, NULL, NULL, NULL, NULL, NULL);
		close(e->listen_fd);
		e->listen_fd = -1;
	}
	if (e->socket_path)
		unlink(e->socket_path);
	if (e->conn)
		/* The connection's coroutine sees the end of the stream,
		 * resets the device and calls finish(). */
		shutdown(e->conn->fd, SHUT_RDWR);
	else
		finish(e);
}

struct free_wait {
	bool gone;
	struct ioc_co_event ev;
};

static void free_done(void *opaque)
{
	struct free_wait *w = opaque;

	/* Both on the control loop's thread: the flag for the polling
	 * waiter, the event (set last: it may free w) for a coroutine. */
	w->gone = true;
	ioc_co_event_set(&w->ev);
}

void ioc__vub_export_free(struct ioc__vub_export *e)
{
	struct ioc_loop *ctrl;
	struct free_wait w = { .gone = false };

	if (!e)
		return;
	ctrl = e->ctrl;
	ioc_co_event_init(&w.ev);
	ioc__vub_export_close(e, free_done, &w);
	if (ioc_in_coroutine())
		ioc_co_event_wait(&w.ev);
	else
		while (!w.gone)
			ioc_loop_poll(ctrl, true);
}

void ioc__vub_export_set_serial(struct ioc__vub_export *e, const char *serial)
{
	/* Zero-padded, not terminated at 20 bytes: what GET_ID returns.  A
	 * request running meanwhile may see a mix (as on real hardware, a
	 * serial is not expected to change under I/O). */
	size_t n = serial ? strnlen(serial, sizeof(e->serial)) : 0;

	memset(e->serial, 0, sizeof(e->serial));
	memcpy(e->serial, serial ? serial : "", n);
}

int ioc__vub_export_config_changed(struct ioc__vub_export *e)
{
	if (!e->conn || e->conn->backend_fd < 0 ||
	    !(e->conn->protocol_features & (1ull << VUB_PROTO_F_CONFIG)))
		return -ENOTCONN;
	/* No NEED_REPLY: the front end answers on its own time, and
	 * nothing here would read the answer. */
	return ioc__vub_msg_send(e->conn->backend_fd, VUB_BACKEND_CONFIG_CHANGE_MSG,
				 VUB_VERSION, NULL, 0);
}

void ioc__vub_export_info(struct ioc__vub_export *e, struct ioc__vub_info *info)
{
	memset(info, 0, sizeof(*info));
	info->connected = e->conn != NULL;
	info->num_queues = e->num_queues;
	info->connections = e->connections;
	info->socket_path = e->socket_path;
	if (e->conn) {
		info->features = e->conn->features;
		info->protocol_features = e->conn->protocol_features;
	}
	for (unsigned i = 0; i < e->num_queues; i++) {
		info->queues_started += e->q[i].running;
		/* Relaxed: a statistic, stored relaxed by the queue's loop. */
		info->queue_requests[i] = atomic_load_explicit(&e->q[i].completed,
							       memory_order_relaxed);
		info->requests += info->queue_requests[i];
	}
}
