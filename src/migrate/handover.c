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
 * Design.  The copy's engine (source.c: a coroutine on the migration's
 * I/O thread) talks.  Setup: it connects, sends a hand-over header.
 * Active: it asks the main loop (ho_req) to hold the node (the gate
 * drains running requests) and to inactivate it (flush, bitmaps back,
 * lock released).  Device: HANDOVER names the image (its shared id) and
 * size; the destination checks both against the node it opened inactive,
 * activates it (takes the lock, loads the bitmaps), serves it, answers
 * READY.  Completed: the node stays shut, host.retire() sends the clients
 * away.  A failure or cancel before READY: the node is activated again
 * and the source serves on.  The lock decides every race: a destination
 * that took it keeps it; the source, unable to take it back, stays shut
 * (failed).  Each node change is a coroutine on the main loop
 * (ho_co_fn()), its drain, librbd and RADOS calls on the loop's thread
 * pool: a stopped OSD stalls them for ever, and QMP (query-migrate,
 * migrate_cancel) must go on.  One runs at a time; the join, _finish and
 * ioc__mig_free() wait for it (struct ioc__mig, ho_co); meanwhile the
 * held node takes no request and n->changing refuses the bitmap commands.
 *
 * Sleep/wake handshakes: the asker sets ho_req under the lock and
 * schedules the bottom half; the coroutine sets ho_answered under the
 * lock, then kicks the engine (engine_kick()'s handshake: a kick before
 * its sleep ends that sleep at once) or broadcasts cond (the
 * destination's thread).  The asker looks at ho_answered and cancel
 * under the lock before each sleep: no wake is lost.  A cancel sets the
 * flag, then kicks (or broadcasts) and shuts the socket down.
 *
 * Rejected: node changes on the engine (racing the bitmap commands) or
 * blocking the main loop; librbd's lock=auto (a destination writing
 * while the source may still write); copying (nothing to gain).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate-int.h"
#include "receive.h"
#include "stream.h"

#define HO_BLOCK IOC_MIG_MIN_BLOCK

/* What the engine asks of the main loop; BACK is _finish's own. */
enum { HO_REQ_NONE, HO_REQ_LET_GO, HO_REQ_TAKE, HO_REQ_BACK };

static bool ho_cancelled(struct ioc__mig *m)
{
	/* relaxed: a request to stop; see struct ioc__mig. */
	return atomic_load_explicit(&m->cancel, memory_order_relaxed);
}

/* Under lock: ask the main loop to do req (the handshake is in the
 * essay). */
static void ask_main_locked(struct ioc__mig *m, int req)
{
	m->ho_req = req;
	m->ho_answered = false;
	ioc_bh_schedule(m->bh);
}

/* The destination's thread: ask and wait for the answer on cond.
 * -ECANCELED when cancelled first. */
static int ask_main(struct ioc__mig *m, int req, char *why, size_t whylen)
{
	int ret;

	pthread_mutex_lock(&m->lock);
	ask_main_locked(m, req);
	while (!m->ho_answered && !ho_cancelled(m))
		pthread_cond_wait(&m->cond, &m->lock);
	ret = m->ho_answered ? m->ho_ret : -ECANCELED;
	if (ret < 0 && m->ho_answered)
		snprintf(why, whylen, "%s", m->ho_why);
	pthread_mutex_unlock(&m->lock);
	return ret;
}

/* ---- the source (on the engine) ------------------------------------------ */

/* The engine: ask and sleep until the answer's kick (or a cancel's). */
static int ioc_coroutine_fn ask_main_co(struct ioc__mig_src *s, struct ioc__mig *m, int req)
{
	int ret;

	pthread_mutex_lock(&m->lock);
	ask_main_locked(m, req);
	while (!m->ho_answered && !ho_cancelled(m)) {
		pthread_mutex_unlock(&m->lock);
		ioc__mig_src_wait(s);
		pthread_mutex_lock(&m->lock);
	}
	ret = m->ho_answered ? m->ho_ret : -ECANCELED;
	if (ret < 0 && m->ho_answered)
		ret = ioc__mig_src_fail(s, ret, "%s", m->ho_why);
	pthread_mutex_unlock(&m->lock);
	return ret;
}

/* The destination's answer: READY (or ACK, a receiver's failure), within
 * __org.iocore_handover-timeout. */
static int ioc_coroutine_fn ho_wait_ready(struct ioc__mig_src *s, unsigned timeout_ms,
					  const struct ioc_mig_hdr *h)
{
	uint8_t buf[IOC_MIG_REC_SIZE];
	struct ioc_mig_rec r;
	const char *what = NULL;
	int ret = ioc__mig_src_recv(s, buf, sizeof(buf),
				    ioc_now_ns() + (int64_t)timeout_ms * 1000000,
				    "it was ready");

	if (ret == -ETIMEDOUT)
		return ioc__mig_src_fail(s, ret, "No answer from the destination within %u ms",
					 timeout_ms);
	if (ret < 0)
		return ret;
	if (ioc_mig_rec_decode(buf, h, &r, &what) < 0 ||
	    (r.type != IOC_MIG_READY && r.type != IOC_MIG_ACK))
		return ioc__mig_src_fail(s, -EPROTO, "Bad answer from the destination: %s",
					 what ? what : "not READY");
	if (r.offset != 0) {
		int e = r.offset > 4095 ? EPROTO : (int)r.offset;

		return ioc__mig_src_fail(s, -e, "The destination refused the hand-over: %s "
					 "(its log says why)", strerror(e));
	}
	return 0;
}

int ioc_coroutine_fn ioc__mig_handover_run(struct ioc__mig_src *s, struct ioc__mig *m,
					   const struct ioc__mig_params *p, const char *uri,
					   uint64_t size)
{
	struct ioc_mig_hdr h = { .version = IOC_MIG_VERSION, .flags = IOC_MIG_F_HANDOVER,
				 .image_size = size, .block_size = HO_BLOCK };
	size_t idlen = strlen(m->ho_id);
	struct ioc_mig_rec r = { .type = IOC_MIG_HANDOVER, .offset = size,
				 .length = (uint32_t)idlen, .payload_len = (uint32_t)idlen,
				 .data_crc = ioc_mig_crc(m->ho_id, idlen) };
	uint8_t buf[IOC_MIG_HDR_SIZE + IOC_MIG_REC_SIZE + IOC_MIG_MAX_SHARED_ID];
	int ret = ioc__mig_src_connect(s, uri);

	if (ret < 0)
		return ret;
	ioc_mig_hdr_encode(&h, buf);
	ret = ioc__mig_src_send(s, buf, IOC_MIG_HDR_SIZE);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	m->st.transferred += IOC_MIG_HDR_SIZE;
	m->t_setup = ioc__mig_now_ms();
	ioc__mig_set_status_locked(m, IOC_MIG_ST_ACTIVE);
	pthread_mutex_unlock(&m->lock);
	/* Hold and let go: the main loop's work (the essay). */
	ret = ask_main_co(s, m, HO_REQ_LET_GO);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&m->lock);
	ioc__mig_set_status_locked(m, IOC_MIG_ST_DEVICE);
	pthread_mutex_unlock(&m->lock);
	ioc_mig_rec_encode(&r, buf);
	memcpy(buf + IOC_MIG_REC_SIZE, m->ho_id, idlen);
	ret = ioc__mig_src_send(s, buf, IOC_MIG_REC_SIZE + idlen);
	if (ret < 0)
		return ret;
	ret = ho_wait_ready(s, p->handover_timeout, &h);
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

json_t *ioc__mig_handover_start(struct ioc__mig *m, struct ioc_node *n,
				    const char *uri, struct ioc__qmp_err *err)
{
	const char *id = ioc_node_shared_id(n);
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
	snprintf(m->ho_id, sizeof(m->ho_id), "%s", id);
	m->node = n;
	m->blk = NULL;
	m->bm = NULL;
	m->nt_added = false;
	m->handover = true;
	m->let_go = false;
	/* The engine is not running yet: its start orders these. */
	m->ho_req = HO_REQ_NONE;
	m->ho_answered = false;
	ioc__mig_job_begin(m, uri, n->size, 0);
	r = ioc__mig_engine_start(m, &m->p, uri, n->size);
	if (r < 0)
		return ioc__mig_job_failed_start(m, -r, err);
	m->thread_running = true;
	ioc__mig_log(m, "migration: handing %s over to %s", id, uri);
	return json_object();
}

/* ---- the main loop's part --------------------------------------------------- */

/* Answer the engine's or the destination thread's request (the
 * handshake is in the essay). */
static void ho_answer(struct ioc__mig *m, int ret, const char *why)
{
	pthread_mutex_lock(&m->lock);
	m->ho_ret = ret;
	snprintf(m->ho_why, sizeof(m->ho_why), "%s", why);
	m->ho_answered = true;
	if (m->incoming)
		pthread_cond_broadcast(&m->cond);
	else
		ioc__mig_engine_kick(m);
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

		ioc_node_co_hold(m->node);
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
