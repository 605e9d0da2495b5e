/*
 * Live migration, the destination: iocore-nbd --incoming.
 *
 * Problem.  The destination must take a whole image from a source that
 * keeps changing it, and must never serve anything but exactly the
 * source's final image: not a partial one after the source died, not a
 * corrupted one, and not at all before the source has stopped serving.
 *
 * Design.  The front end waits for the image (host.waiting: the NBD
 * server runs with opts.defer_serving: I/O threads and the control
 * socket, no NBD listener watched and no export).  The front end opens
 * the image as a writable node (opts.dest: a file node for a raw image, a
 * qcow2 node for a qcow2 one) and keeps it until done.  This file listens
 * on the migration URI (on the main loop), accepts one connection, closes
 * the listener, and runs ioc_mig_receive() into that node (receive.c:
 * records applied with decompress-threads workers through the node on an
 * I/O thread of the receiver's, the whole-image checksum, the ACK) on a
 * thread of its own, publishing its progress for query-migrate.  When the
 * thread ends the main loop reports completed or failed and calls the
 * owner's done callback, which starts serving only on success (iocore-nbd
 * exits non-zero otherwise).  The source stops serving only after it read
 * the ACK, which the receiver sends only once the node is flushed and the
 * image verified.
 *
 * TLS.  When the host offers TLS (the server's --tls on or require) the
 * stream must be TLS: the receiving thread does a blocking server
 * handshake with the server's credentials (client certificates required with
 * --tls-verify-peer) before anything else, and a source speaking plain
 * text fails it, so the destination reports failed and never serves.
 *
 * Rejected: serving a read-only view during the transfer (clients would
 * see a mix of old and new blocks); accepting several streams (one
 * source, one image); opening the image file here and writing it past the
 * node layer (only raw images could be received, a qcow2 file would be
 * overwritten with raw bytes).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "migrate-int.h"
#include "receive.h"
#include "util/socket.h"

struct dest_args {
	struct ioc__mig *m;
	int fd;
	unsigned threads;
};

static void progress(void *opaque, const struct ioc_mig_recv_stats *rs)
{
	struct ioc__mig *m = opaque;

	pthread_mutex_lock(&m->lock);
	if (m->status == IOC_MIG_ST_SETUP && rs->image_size) {
		m->st.total = rs->image_size;
		m->t_setup = ioc__mig_now_ms();
		ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	}
	m->st.transferred = rs->wire_bytes;
	m->st.normal_bytes = rs->data_bytes;
	m->st.read_bytes = rs->data_bytes + rs->zero_bytes;
	if (rs->passes > m->st.dirty_sync_count) {
		m->st.dirty_sync_count = rs->passes;
		ioc__mig_event_locked(m, "MIGRATION_PASS", (int64_t)rs->passes);
	}
	pthread_mutex_unlock(&m->lock);
}

static void *dest_thread(void *opaque)
{
	struct dest_args *a = opaque;
	struct ioc__mig *m = a->m;
	struct ioc_mig_recv_stats st = { 0 };
	char why[512] = "";
	const struct ioc__mig_tls_ops *ops = m->host.tls;
	void *tls = NULL;
	struct ioc_mig_transport tr = { ops ? ops->recv : NULL, ops ? ops->send : NULL, NULL };
	int ret;

	if (ops) {
		char e[384] = "";

		ret = ops->accept(m->host.opaque, a->fd, &tls, e, sizeof(e));
		if (ret < 0) {
			snprintf(why, sizeof(why), "TLS handshake with the source failed "
				 "(this destination requires TLS: set tls-creds on the "
				 "source): %s", e);
			goto out;
		}
		tr.t = tls;
	}
	if (m->in_node) {
		/* Shared storage: handed over, not copied (handover.c). */
		struct ioc_mig_recv_opts o = {
			.fd = a->fd, .cancel = &m->cancel,
			.tr = tls ? &tr : NULL,
		};

		ret = ioc__mig_handover_receive(m, &o, why, sizeof(why));
		goto out;
	}
	struct ioc_mig_recv_opts o = {
		.fd = a->fd, .node = m->in_dest, .threads = a->threads,
		.cancel = &m->cancel, .progress = progress, .opaque = m,
		.tr = tls ? &tr : NULL,
	};

	ret = ioc_mig_receive(&o, &st, why, sizeof(why));
out:
	if (tls)
		ops->end(tls, ret == 0);
	pthread_mutex_lock(&m->lock);
	m->sock = -1;
	close(a->fd);
	m->result = ret;
	if (ret < 0)
		snprintf(m->error, sizeof(m->error), "%.*s", (int)sizeof(m->error) - 1,
			 why[0] ? why : strerror(-ret));
	m->thread_done = true;
	ioc_bh_schedule(m->bh);
	pthread_mutex_unlock(&m->lock);
	free(a);
	return NULL;
}

static void finish_failed(struct ioc__mig *m, int r, const char *why)
{
	pthread_mutex_lock(&m->lock);
	m->result = r;
	snprintf(m->error, sizeof(m->error), "%s", why);
	m->t_end = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, IOC_MIG_ST_FAILED);
	pthread_mutex_unlock(&m->lock);
	ioc_bh_schedule(m->bh);
	if (m->in_done)
		m->in_done(m->in_opaque, r, why);
}

/* Main loop: the source connected. */
static void on_incoming(void *opaque)
{
	struct ioc__mig *m = opaque;
	struct ioc_loop *loop = m->host.main_loop;
	struct dest_args *a;
	int fd, r;

	fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return; /* EAGAIN and friends: wait for the next */
	ioc_loop_set_fd(loop, m->listen_fd, NULL, NULL, NULL, NULL, NULL);
	close(m->listen_fd);
	m->listen_fd = -1;
	int one = 1, buf = 4 << 20;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	a = calloc(1, sizeof(*a));
	if (!a) {
		close(fd);
		finish_failed(m, -ENOMEM, "out of memory");
		return;
	}
	a->m = m;
	a->fd = fd;
	pthread_mutex_lock(&m->lock);
	a->threads = m->p.decompress_threads;
	m->sock = fd;
	m->thread_done = false;
	pthread_mutex_unlock(&m->lock);
	r = pthread_create(&m->thread, NULL, dest_thread, a);
	if (r != 0) {
		free(a);
		close(fd);
		pthread_mutex_lock(&m->lock);
		m->sock = -1;
		pthread_mutex_unlock(&m->lock);
		finish_failed(m, -r, "Cannot start the receiving thread");
		return;
	}
	m->thread_running = true;
	ioc__mig_log(m, "incoming migration: connected%s", m->host.tls ? " (TLS)" : "");
}

void ioc__mig_incoming_finish(struct ioc__mig *m)
{
	int result;
	char why[256];

	pthread_mutex_lock(&m->lock);
	result = m->result;
	snprintf(why, sizeof(why), "%s", m->error);
	m->t_end = ioc__mig_now_ms();
	/* A stream with no data block never went active. */
	if (result == 0)
		ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	ioc__mig_set_status_locked(m, ioc__mig_end_status(m->status, result));
	pthread_mutex_unlock(&m->lock);
	/* A hand-over destination serves already (in_serve). */
	if (m->in_done && !(m->in_node && result == 0))
		m->in_done(m->in_opaque, result, result == 0 ? "" : why);
}

int ioc__mig_incoming_start(struct ioc__mig *m, const char *uri,
				char *err, size_t errlen)
{
	char host[256], port[16];
	int fd, r;

	if (ioc__mig_parse_uri(uri, host, sizeof(host), port, sizeof(port)) < 0) {
		snprintf(err, errlen, "Invalid migration URI '%s' (tcp:ADDR:PORT)", uri);
		return -EINVAL;
	}
	fd = ioc__listen_tcp(host[0] ? host : NULL, port, 1024);
	if (fd < 0) {
		snprintf(err, errlen, "Cannot listen on %s: %s", uri, strerror(-fd));
		return fd;
	}
	r = ioc_loop_set_fd(m->host.main_loop, fd, on_incoming, NULL, NULL, NULL, m);
	if (r < 0) {
		close(fd);
		snprintf(err, errlen, "Cannot watch %s: %s", uri, strerror(-r));
		return r;
	}
	m->listen_fd = fd;
	pthread_mutex_lock(&m->lock);
	memset(&m->st, 0, sizeof(m->st));
	m->t_start = ioc__mig_now_ms();
	snprintf(m->uri, sizeof(m->uri), "%s", uri);
	ioc__mig_begin_locked(m);
	pthread_mutex_unlock(&m->lock);
	ioc__mig_log(m, "incoming migration: listening on %s", uri);
	return 0;
}

int ioc__mig_incoming_setup(struct ioc__mig *m, const struct ioc__mig_incoming_opts *o,
				char *err, size_t errlen)
{
	if (!m->host.waiting(m->host.opaque)) {
		snprintf(err, errlen, "the server must be started with defer_serving");
		return -EBUSY;
	}
	if (m->incoming) {
		snprintf(err, errlen, "an incoming migration is already set up");
		return -EBUSY;
	}
	m->incoming = true;
	snprintf(m->image, sizeof(m->image), "%s", o->image);
	m->in_done = o->done;
	m->in_opaque = o->opaque;
	m->in_node = o->node;
	m->in_dest = o->node ? NULL : o->dest;
	m->in_serve = o->serve;
	m->handover = o->node != NULL;
	if (o->node && (!o->serve || !ioc_node_shared_id(o->node) ||
			ioc_node_is_active(o->node))) {
		snprintf(err, errlen, "a hand-over needs a node on shared storage, opened "
			 "inactive, and a serve callback");
		m->incoming = false;
		return -EINVAL;
	}
	if (!o->node && (!o->dest || o->dest->read_only)) {
		snprintf(err, errlen, "an incoming copy needs a writable node to receive "
			 "%.400s into", o->image);
		m->incoming = false;
		return -EINVAL;
	}
	if (!o->uri || strcmp(o->uri, "defer") == 0)
		return 0;
	return ioc__mig_incoming_start(m, o->uri, err, errlen);
}

json_t *ioc__mig_incoming(struct ioc__mig *m, json_t *args, struct ioc__qmp_err *err)
{
	const char *uri = json_string_value(json_object_get(args, "uri"));
	int status;

	if (!m->incoming) {
		snprintf(err->desc, sizeof(err->desc),
			 "'-incoming' was not specified on the command line");
		return NULL;
	}
	pthread_mutex_lock(&m->lock);
	status = m->status;
	pthread_mutex_unlock(&m->lock);
	if (status != IOC_MIG_ST_NONE || m->listen_fd >= 0) {
		snprintf(err->desc, sizeof(err->desc),
			 "The incoming migration has already been started");
		return NULL;
	}
	if (ioc__mig_incoming_start(m, uri, err->desc, sizeof(err->desc)) < 0)
		return NULL;
	return json_object();
}
