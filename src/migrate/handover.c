/*
 * Hand-over migration: an export whose node is on shared storage (an rbd
 * image, which the destination opens too) moves to another iocore-nbd
 * without copying a byte, with capability __org.iocore_handover.
 *
 * Problem.  Copying an image that both hosts already see costs its whole
 * size; what must move is only the right to write it (the exclusive lock)
 * and what the writer keeps beside it (its persistent bitmaps), and at no
 * moment may both hosts write.
 *
 * Design.  Setup: the thread connects and sends a header with the
 * hand-over flag.  Active: it asks the main loop (ho_req, answered on
 * cond) to hold the node (the gate drains running requests) and to
 * inactivate it (flush, bitmaps back, lock released).  Device: HANDOVER
 * names the image (its shared id) and size; the destination checks both
 * against the node it opened inactive, activates it (takes the lock,
 * loads the bitmaps), serves it, answers READY.  Completed: the node
 * stays shut, host.retire() sends the clients away.  A failure or cancel
 * before READY: the node is activated again and the source serves on.
 * The lock decides every race: a destination that took it keeps it; the
 * source, unable to take it back, stays shut (failed).  Each node change
 * is a coroutine on the main loop (ho_co_fn()), its librbd and RADOS
 * calls on the loop's thread pool: a stopped OSD stalls them for ever,
 * and QMP (query-migrate, migrate_cancel) must go on.  One runs at a
 * time; the join, _finish and ioc__mig_free() wait for it (struct
 * ioc__mig, ho_co); meanwhile the held (or not yet served) node takes no
 * request and n->changing refuses the bitmap commands.
 *
 * Sleep/wake handshakes: the thread sets ho_req under lock and schedules
 * the bottom half; the coroutine sets ho_answered under lock, broadcasts
 * cond; the thread waits on cond for it or cancel (set and broadcast under
 * the lock by migrate_cancel and ioc__mig_free()): no wake is lost, no
 * free waits for an answer.  The connect and READY wait poll the socket
 * and an eventfd (m->ho_wake) to their deadline; a cancel sets the flag,
 * then under the lock writes the eventfd, shuts the socket (and TLS) down.
 *
 * Rejected: node changes on the migration thread (racing the bitmap
 * commands) or blocking the main loop; librbd's lock=auto (a destination
 * writing while the source may still write); copying (nothing to gain).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "migrate-int.h"
#include "receive.h"
#include "stream.h"
#include "util/socket.h"

#define HO_CONNECT_TIMEOUT_MS 30000
#define HO_BLOCK              IOC_MIG_MIN_BLOCK

/* What the thread asks of the main loop; BACK is _finish's own. */
enum { HO_REQ_NONE, HO_REQ_LET_GO, HO_REQ_TAKE, HO_REQ_BACK };

struct ho_src {
	struct ioc__mig *m;
	struct ioc__mig_params p;
	char uri[256];
	char id[IOC_MIG_MAX_SHARED_ID + 1];
	uint64_t size;
	int sock;
	void *tls;
	int wake;               /* m->ho_wake */
	char why[256];
};

static bool ho_cancelled(struct ioc__mig *m)
{
	/* relaxed: a request to stop; see struct ioc__mig. */
	return atomic_load_explicit(&m->cancel, memory_order_relaxed);
}

static int ho_fail(char *why, size_t len, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int ho_fail(char *why, size_t len, int err, const char *fmt, ...)
{
	va_list ap;

	if (!why[0]) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return err;
}

/* Ask the main loop to do req and wait for its answer (the handshake is
 * in the essay).  -ECANCELED when cancelled first. */
static int ask_main(struct ioc__mig *m, int req, char *why, size_t whylen)
{
	int ret;

	pthread_mutex_lock(&m->lock);
	m->ho_req = req;
	m->ho_answered = false;
	ioc_bh_schedule(m->bh);
	while (!m->ho_answered && !ho_cancelled(m))
		pthread_cond_wait(&m->cond, &m->lock);
	ret = m->ho_answered ? m->ho_ret : -ECANCELED;
	if (ret < 0 && m->ho_answered)
		snprintf(why, whylen, "%s", m->ho_why);
	pthread_mutex_unlock(&m->lock);
	return ret;
}

/* ---- the source (its thread) --------------------------------------------- */

/* Sleep until fd has events, a cancel writes the wake eventfd, or left_ms
 * pass (the caller checks its deadline).  Returns fd's revents (0: none
 * yet), or -ECANCELED once cancelled: the flag is set before the write
 * (the handshake in the essay). */
static int ho_poll(struct ho_src *s, int fd, short events, int64_t left_ms)
{
	struct pollfd pf[2] = { { fd, events, 0 }, { s->wake, POLLIN, 0 } };

	if (ho_cancelled(s->m))
		return -ECANCELED;
	if (left_ms > INT_MAX)
		left_ms = INT_MAX;
	if (poll(pf, 2, left_ms < 0 ? 0 : (int)left_ms) < 0)
		pf[0].revents = 0; /* EINTR: the caller looks again */
	return ho_cancelled(s->m) ? -ECANCELED : pf[0].revents;
}

/* While a connect is in progress. */
static int ho_connect_wait(void *opaque, int fd, int64_t left_ms)
{
	int r = ho_poll(opaque, fd, POLLOUT, left_ms);

	return r < 0 ? r : 0;
}

static int ho_connect(struct ho_src *s)
{
	char host[256], port[16];
	bool unresolved;
	int fd;

	if (ioc__mig_parse_uri(s->uri, host, sizeof(host), port, sizeof(port)) < 0)
		return ho_fail(s->why, sizeof(s->why), -EINVAL, "Invalid URI '%s'", s->uri);
	fd = ioc__connect_tcp(host, port, HO_CONNECT_TIMEOUT_MS, ho_connect_wait, s,
			      &unresolved);
	if (fd == -ECANCELED)
		return fd;
	if (fd < 0 && unresolved)
		return ho_fail(s->why, sizeof(s->why), fd, "Cannot resolve '%s'", host);
	if (fd < 0)
		return ho_fail(s->why, sizeof(s->why), fd, "Failed to connect to '%s': %s",
			       s->uri, strerror(-fd));
	/* Blocking from here; a cancel shuts the socket down to wake it. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	pthread_mutex_lock(&s->m->lock);
	s->m->sock = fd;
	pthread_mutex_unlock(&s->m->lock);
	s->sock = fd;
	if (ho_cancelled(s->m))
		return -ECANCELED;
	if (s->p.tls_creds[0]) {
		const char *name = s->p.tls_hostname[0] ? s->p.tls_hostname : host;
		char e[200] = "";
		int r;

		if (!s->m->host.tls)
			return ho_fail(s->why, sizeof(s->why), -EINVAL, "tls-creds is set but "
				       "this server has no TLS credentials");
		r = s->m->host.tls->connect(s->m->host.opaque, fd, name, false, &s->tls, e,
					    sizeof(e));
		if (r < 0)
			return ho_cancelled(s->m) ? -ECANCELED :
			       ho_fail(s->why, sizeof(s->why), r,
				       "TLS handshake with the destination failed: %s", e);
	}
	return 0;
}

static int ho_send(struct ho_src *s, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = s->tls ? s->m->host.tls->send(s->tls, p, len)
				   : send(s->sock, p, len, MSG_NOSIGNAL);

		if (n < 0 && !s->tls && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? (s->tls ? (int)-n : errno) : EPIPE;

			return ho_cancelled(s->m) ? -ECANCELED :
			       ho_fail(s->why, sizeof(s->why), -e,
				       "Unable to write to the destination: %s", strerror(e));
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The destination's answer: READY (or ACK, a receiver's failure), within
 * __org.iocore_handover-timeout. */
static int ho_wait_ready(struct ho_src *s, const struct ioc_mig_hdr *h)
{
	int64_t deadline = ioc__mig_now_ms() + s->p.handover_timeout;
	uint8_t buf[IOC_MIG_REC_SIZE];
	struct ioc_mig_rec r;
	const char *what = NULL;
	size_t got = 0;

	while (got < sizeof(buf)) {
		int64_t left = deadline - ioc__mig_now_ms();
		ssize_t n;
		int ret;

		if (left < 0)
			return ho_fail(s->why, sizeof(s->why), -ETIMEDOUT,
				       "No answer from the destination within %u ms",
				       s->p.handover_timeout);
		/* READY is one TLS record, read whole by the first receive:
		 * no decrypted bytes wait in the session when this polls. */
		ret = ho_poll(s, s->sock, POLLIN, left);
		if (ret < 0)
			return ret;
		if (ret == 0)
			continue;
		n = s->tls ? s->m->host.tls->recv(s->tls, buf + got, sizeof(buf) - got)
			   : recv(s->sock, buf + got, sizeof(buf) - got, 0);
		if (n < 0 && !s->tls && errno == EINTR)
			continue;
		if (n <= 0)
			return ho_cancelled(s->m) ? -ECANCELED :
			       ho_fail(s->why, sizeof(s->why), -EPIPE,
				       "The destination closed the stream before it was ready");
		got += (size_t)n;
	}
	if (ioc_mig_rec_decode(buf, h, &r, &what) < 0 ||
	    (r.type != IOC_MIG_READY && r.type != IOC_MIG_ACK))
		return ho_fail(s->why, sizeof(s->why), -EPROTO,
			       "Bad answer from the destination: %s", what ? what : "not READY");
	if (r.offset != 0) {
		int e = r.offset > 4095 ? EPROTO : (int)r.offset;

		return ho_fail(s->why, sizeof(s->why), -e, "The destination refused the "
			       "hand-over: %s (its log says why)", strerror(e));
	}
	return 0;
}

static int ho_run(struct ho_src *s)
{
	struct ioc__mig *m = s->m;
	struct ioc_mig_hdr h = { .version = IOC_MIG_VERSION, .flags = IOC_MIG_F_HANDOVER,
				 .image_size = s->size, .block_size = HO_BLOCK };
	size_t idlen = strlen(s->id);
	struct ioc_mig_rec r = { .type = IOC_MIG_HANDOVER, .offset = s->size,
				 .length = (uint32_t)idlen, .payload_len = (uint32_t)idlen,
				 .data_crc = ioc_mig_crc(s->id, idlen) };
	uint8_t buf[IOC_MIG_HDR_SIZE + IOC_MIG_REC_SIZE + IOC_MIG_MAX_SHARED_ID];
	int ret = ho_connect(s);

	if (ret < 0)
		return ret;
	ioc_mig_hdr_encode(&h, buf);
	ret = ho_send(s, buf, IOC_MIG_HDR_SIZE);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	m->st.transferred += IOC_MIG_HDR_SIZE;
	m->t_setup = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	pthread_mutex_unlock(&m->lock);
	/* Hold and let go: the main loop's work (the essay). */
	ret = ask_main(m, HO_REQ_LET_GO, s->why, sizeof(s->why));
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	ioc__mig_set_status_locked(m, IOC_MIG_ST_DEVICE);
	pthread_mutex_unlock(&m->lock);
	ioc_mig_rec_encode(&r, buf);
	memcpy(buf + IOC_MIG_REC_SIZE, s->id, idlen);
	ret = ho_send(s, buf, IOC_MIG_REC_SIZE + idlen);
	if (ret < 0)
		return ret;
	ret = ho_wait_ready(s, &h);
	pthread_mutex_lock(&m->lock);
	m->st.transferred += IOC_MIG_REC_SIZE + idlen + (ret == 0 ? IOC_MIG_REC_SIZE : 0);
	if (ret == 0) {
		/* The destination serves: no way back, whatever a cancel says. */
		m->end_sent = true;
		m->downtime_ns = ioc_now_ns() - m->ho_t_hold;
	}
	pthread_mutex_unlock(&m->lock);
	return ret;
}

static void *ho_thread(void *opaque)
{
	struct ho_src *s = opaque;
	struct ioc__mig *m = s->m;
	int ret = ho_run(s);

	if (s->tls)
		m->host.tls->end(s->tls, ret == 0);
	if (ret < 0 && ret != -ECANCELED && ho_cancelled(m))
		ret = -ECANCELED;
	pthread_mutex_lock(&m->lock);
	m->ho_wake = -1; /* under the lock: no cancel writes it any more */
	close(s->wake);
	if (m->sock >= 0) {
		close(m->sock);
		m->sock = -1;
	}
	m->result = ret;
	if (ret < 0 && ret != -ECANCELED)
		snprintf(m->error, sizeof(m->error), "%s", s->why[0] ? s->why : strerror(-ret));
	m->thread_done = true;
	ioc_bh_schedule(m->bh);
	pthread_mutex_unlock(&m->lock);
	free(s);
	return NULL;
}

json_t *ioc__mig_handover_start(struct ioc__mig *m, struct ioc_node *n,
				    const char *uri, struct ioc__qmp_err *err)
{
	const char *id = ioc_node_shared_id(n);
	struct ho_src *s;
	int r;

	if (!m->p.handover) {
		ioc__qmp_errf(err, "Node '%s' is on shared storage (%s): set the capability "
			      "__org.iocore_handover to hand it over (nothing is copied)",
			      n->name, id);
		return NULL;
	}
	if (!id) {
		ioc__qmp_errf(err, "The capability __org.iocore_handover needs an export of "
			      "shared storage (an rbd node); node '%s' (driver %s) is not: "
			      "migrate it without the capability, which copies it", n->name,
			      n->drv->name);
		return NULL;
	}
	if (m->p.pause_before_switchover) {
		/* The hold lasts milliseconds; a pause in it would hold the
		 * clients for as long as the caller waits. */
		ioc__qmp_errf(err, "Capability pause-before-switchover is not supported with "
			      "__org.iocore_handover");
		return NULL;
	}
	if (strlen(id) > IOC_MIG_MAX_SHARED_ID || !n->size) {
		ioc__qmp_errf(err, "Node '%s' cannot be handed over (its name is too long, "
			      "or it is empty)", n->name);
		return NULL;
	}
	if (!ioc_node_is_active(n)) {
		ioc__qmp_errf(err, "Node '%s' is inactive: it was handed over already", n->name);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		ioc__qmp_errf(err, "out of memory");
		return NULL;
	}
	s->m = m;
	s->p = m->p;
	s->size = n->size;
	s->sock = -1;
	s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake < 0) {
		r = errno;
		free(s);
		return ioc__mig_job_failed_start(m, r, err);
	}
	snprintf(s->uri, sizeof(s->uri), "%s", uri);
	snprintf(s->id, sizeof(s->id), "%s", id);
	m->node = n;
	m->blk = NULL;
	m->bm = NULL;
	m->nt_added = false;
	m->handover = true;
	m->let_go = false;
	/* No thread runs yet: pthread_create() orders these. */
	m->ho_req = HO_REQ_NONE;
	m->ho_answered = false;
	m->ho_wake = s->wake;
	ioc__mig_job_begin(m, uri, n->size, 0);
	r = pthread_create(&m->thread, NULL, ho_thread, s);
	if (r != 0) {
		m->ho_wake = -1;
		close(s->wake);
		free(s);
		return ioc__mig_job_failed_start(m, r, err);
	}
	m->thread_running = true;
	ioc__mig_log(m, "migration: handing %s over to %s", id, uri);
	return json_object();
}

/* ---- the main loop's part --------------------------------------------------- */

/* Answer the thread's request (the handshake is in the essay). */
static void ho_answer(struct ioc__mig *m, int ret, const char *why)
{
	pthread_mutex_lock(&m->lock);
	m->ho_ret = ret;
	snprintf(m->ho_why, sizeof(m->ho_why), "%s", why);
	m->ho_answered = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
}

static void ho_end(struct ioc__mig *m, int back, const char *why);

/* The node change, in a coroutine on the main loop (the essay; the
 * handshake with the finish and free paths is at struct ioc__mig's
 * ho_co). */
static void ioc_coroutine_fn ho_co_fn(void *opaque)
{
	struct ioc__mig *m = opaque;
	char why[256] = "";
	int ret;

	if (m->ho_doing == HO_REQ_BACK) {
		ho_end(m, ioc_node_activate(m->node, why, sizeof(why)), why);
		goto out;
	}
	if (m->ho_doing == HO_REQ_LET_GO) {
		int64_t t = ioc_now_ns();

		ioc_node_set_gate(m->node, IOC_NODE_GATE_HOLD);
		pthread_mutex_lock(&m->lock);
		m->ho_t_hold = t;
		pthread_mutex_unlock(&m->lock);
		/* A cancel meanwhile: _finish activates it again. */
		ret = ioc_node_inactivate(m->node, why, sizeof(why));
		m->let_go = ret == 0;
	} else {
		ret = ioc_node_activate(m->in_node, why, sizeof(why));
		/* Relaxed: cancel is set on this thread (struct ioc__mig).  A
		 * cancel while the lock was taken: the thread stopped waiting
		 * and refuses the source, so let the image go again. */
		char e2[256];

		if (ret == 0 && ho_cancelled(m)) {
			ret = -ECANCELED;
			if (ioc_node_inactivate(m->in_node, e2, sizeof(e2)) < 0)
				ioc__mig_log(m, "incoming hand-over: cancelled, and the image "
						 "could not be let go again: %s", e2);
		} else if (ret == 0 && m->in_serve) {
			ret = m->in_serve(m->in_opaque, m->in_node, why, sizeof(why));
			if (ret < 0)
				(void)ioc_node_inactivate(m->in_node, e2, sizeof(e2));
		}
	}
	ho_answer(m, ret, why);
out:
	ioc_bh_schedule(m->bh);
	m->ho_co = NULL;        /* the last touch of m */
}

/* Start ho_co_fn() for req; false on -ENOMEM. */
static bool ho_co_start(struct ioc__mig *m, int req)
{
	struct ioc_co *co = ioc_co_create(ho_co_fn, m);

	if (!co)
		return false;
	m->ho_doing = req;
	m->ho_co = co;
	/* It runs until librbd's first call on the pool, or to its end:
	 * co is not touched after this. */
	ioc_co_enter(co);
	return true;
}

void ioc__mig_handover_bh(struct ioc__mig *m)
{
	int req;

	/* One change at a time: a request made meanwhile stays in ho_req
	 * for the bottom half that the running one schedules at its end. */
	if (m->ho_co)
		return;
	pthread_mutex_lock(&m->lock);
	req = m->ho_req;
	m->ho_req = HO_REQ_NONE;
	pthread_mutex_unlock(&m->lock);
	if (req != HO_REQ_NONE && !ho_cancelled(m) && !ho_co_start(m, req))
		ho_answer(m, -ENOMEM, "out of memory");
}

/* The source's end, its node given back or not: back is that
 * activation's result (0 when the node was not let go). */
static void ho_end(struct ioc__mig *m, int back, const char *why)
{
	int result;

	pthread_mutex_lock(&m->lock);
	result = m->result;
	pthread_mutex_unlock(&m->lock);
	if (result == 0) {
		/* The destination serves the image: NBD_ESHUTDOWN to held and
		 * new requests, the clients go. */
		ioc_node_set_gate(m->node, IOC_NODE_GATE_SHUT);
		m->host.retire(m->host.opaque);
		ioc__mig_log(m, "migration completed: handed over, no longer serving");
	} else if (back < 0) {
		/* The lock is elsewhere (a destination that took it after
		 * all): serving now could mean two writers. */
		ioc_node_set_gate(m->node, IOC_NODE_GATE_SHUT);
		m->host.retire(m->host.opaque);
		char first[96];

		pthread_mutex_lock(&m->lock);
		snprintf(first, sizeof(first), "%.95s", m->error[0] ? m->error : "cancelled");
		snprintf(m->error, sizeof(m->error), "%.95s; and the image could not be "
			 "taken back (%.100s): not serving", first, why);
		result = m->result = -EBUSY;
		pthread_mutex_unlock(&m->lock);
	} else if (atomic_load_explicit(&m->node->gate, memory_order_relaxed) !=
		   IOC_NODE_GATE_OPEN) {
		/* Relaxed: the gate is only changed on this thread. */
		ioc_node_set_gate(m->node, IOC_NODE_GATE_OPEN);
	}
	m->let_go = false;
	ioc__mig_job_end(m, result);
}

void ioc__mig_handover_finish(struct ioc__mig *m)
{
	char why[256] = "";
	int result;

	pthread_mutex_lock(&m->lock);
	result = m->result;
	m->ho_req = HO_REQ_NONE;
	pthread_mutex_unlock(&m->lock);
	if (result == 0 || !m->let_go)
		ho_end(m, 0, "");
	else if (!ho_co_start(m, HO_REQ_BACK))
		/* No coroutine: taken back here, the loop waiting. */
		ho_end(m, ioc_node_activate(m->node, why, sizeof(why)), why);
}

/* ---- the destination (its thread) -------------------------------------------- */

int ioc__mig_handover_receive(struct ioc__mig *m, const struct ioc_mig_recv_opts *o,
				  char *why, size_t whylen)
{
	char id[IOC_MIG_MAX_SHARED_ID + 1];
	const char *mine = ioc_node_shared_id(m->in_node);
	uint64_t size = 0;
	int ret = ioc_mig_receive_handover(o, id, sizeof(id), &size, why, whylen);

	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	m->st.total = size;
	m->st.transferred = IOC_MIG_HDR_SIZE + IOC_MIG_REC_SIZE + strlen(id);
	m->t_setup = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	pthread_mutex_unlock(&m->lock);
	if (!mine || strcmp(id, mine) != 0) {
		snprintf(why, whylen, "the source hands over %.400s, but this destination "
			 "opened %.400s", id, mine ? mine : "no shared image");
		ret = -EXDEV;
	} else if (size != m->in_node->size) {
		snprintf(why, whylen, "the source's image has %llu bytes, this destination's "
			 "%llu", (unsigned long long)size,
			 (unsigned long long)m->in_node->size);
		ret = -EINVAL;
	} else {
		ret = ask_main(m, HO_REQ_TAKE, why, whylen);
	}
	/* After a refusal, tell the source (best effort): it takes its
	 * image back at once instead of at its timeout. */
	int r2 = ioc_mig_send_ready(o, ret);

	if (ret == 0 && r2 < 0)
		ioc__mig_log(m, "incoming hand-over: serving, but READY could not be "
				 "sent (%s): the source will fail to take the image back",
				 strerror(-r2));
	return ret;
}
