/*
 * The NBD server on the iocore runtime: exports, listeners, I/O threads,
 * accepting, and the graceful stop.  The life of a connection is conn.c;
 * the protocol is handshake.c and transmission.c.
 *
 * Design.
 * - N I/O threads, each running one loop.  The thread that starts the
 *   server watches the listening sockets on its own loop; an accepted
 *   socket goes to the next I/O thread round-robin through ioc_loop_post()
 *   (an embedded task: lock-free, no allocation on the target side).  From
 *   then on the connection is touched by its I/O thread only; the only
 *   cross-thread state is a few counters.
 * - An export may name a loop of the caller's (the storage daemon's
 *   iothread=): its connections move there once their handshake chose
 *   it (conn.c, "The move"), and each such loop is one more thread of
 *   the server's for everything that visits every thread (a deletion's
 *   sweep, the stop, the retirement, the reports), though the server
 *   neither starts nor stops it.
 * - Out of fds (EMFILE) the listener stays readable with the connection
 *   queued: it is unwatched for 100 ms instead of spinning.
 * - Stop: stop accepting; each I/O thread closes connections still in the
 *   handshake and lets the others answer everything already received (see
 *   conn.c); the stopping thread runs its loop until no connection is
 *   left, closes leftovers after a grace period (clients that never read
 *   their replies), then flushes every export and joins the threads.
 *
 * Alternatives rejected.  One thread per connection with blocking I/O
 * (nbdkit's default) spends a wakeup per request; an accept() on every
 * I/O thread (SO_REUSEPORT) spreads connections by hash, which with a
 * handful of long-lived clients balances worse than round-robin.
 *
 * Cost notes.  Round-robin placement ignores load; connections are
 * long-lived and similar, so this has been good enough.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "iocore/co.h"
#include "node/node.h"
#include "util/log.h"
#include "util/socket.h"
#include "nbd-int.h"

#define IOC_NBD_STOP_GRACE_NS   (10ll * 1000000000)

void ioc__nbd_log(struct ioc_nbd_server *srv, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ioc__vlog(srv->opts.log, srv->opts.log_opaque, fmt, ap);
	va_end(ap);
}


void ioc__nbd_event(struct ioc_nbd_server *srv, const char *name, json_t *data)
{
	if (srv->hooks.event)
		srv->hooks.event(srv->hooks.opaque, name, data);
	else
		json_decref(data);
}

/* ---- what a job over the server needs (nbd.h) ---------------------------- */

struct ioc_loop *ioc_nbd_server_main_loop(struct ioc_nbd_server *srv)
{
	return srv->main_loop;
}

void ioc_nbd_server_event(struct ioc_nbd_server *srv, const char *name, void *data)
{
	ioc__nbd_event(srv, name, data);
}

void ioc_nbd_server_log(struct ioc_nbd_server *srv, const char *msg)
{
	ioc__nbd_log(srv, "%s", msg);
}

bool ioc_nbd_server_serving(struct ioc_nbd_server *srv)
{
	/* Relaxed: written on this (the main) loop. */
	return srv->serving && !atomic_load_explicit(&srv->retiring, memory_order_relaxed);
}

bool ioc_nbd_server_waiting(struct ioc_nbd_server *srv)
{
	return srv->started && !srv->serving && srv->opts.defer_serving;
}

void ioc_nbd_server_set_job(struct ioc_nbd_server *srv, void *job, void (*stop)(void *job))
{
	srv->job = job;
	srv->job_stop = stop;
}

void *ioc_nbd_server_job(struct ioc_nbd_server *srv)
{
	return srv->job;
}

static void stop_job(struct ioc_nbd_server *srv)
{
	void *job = srv->job;

	if (!job)
		return;
	srv->job = NULL;
	srv->job_stop(job);
}

bool ioc_nbd_server_has_tls(struct ioc_nbd_server *srv)
{
	return srv->tls != NULL;
}

int ioc_nbd_server_tls_accept(struct ioc_nbd_server *srv, int fd, void **sess,
			      char *err, size_t errlen)
{
	struct ioc__nbd_tls *t = NULL;
	int r = ioc__nbd_tls_mig_accept(&t, srv->tls, fd, err, errlen);

	*sess = t;
	return r;
}

int ioc_nbd_server_tls_connect(struct ioc_nbd_server *srv, int fd, const char *hostname,
			       bool step, void **sess, char *err, size_t errlen)
{
	struct ioc__nbd_tls *t = NULL;
	int r = ioc__nbd_tls_mig_connect(&t, srv->tls, fd, hostname, step, err, errlen);

	*sess = t;
	return r;
}

int ioc_nbd_tls_session_handshake(void *sess, bool *want_write, char *err, size_t errlen)
{
	return ioc__nbd_tls_mig_handshake(sess, want_write, err, errlen);
}

ssize_t ioc_nbd_tls_session_recv(void *sess, void *buf, size_t len)
{
	return ioc__nbd_tls_mig_recv(sess, buf, len);
}

ssize_t ioc_nbd_tls_session_send(void *sess, const void *buf, size_t len)
{
	return ioc__nbd_tls_mig_send(sess, buf, len);
}

void ioc_nbd_tls_session_end(void *sess, bool bye)
{
	if (bye)
		ioc__nbd_tls_bye(sess);
	ioc__nbd_tls_free(sess);
}

int ioc_nbd_server_set_hooks(struct ioc_nbd_server *srv,
			     const struct ioc_nbd_server_hooks *hooks)
{
	if (hooks && (srv->hooks.event || srv->hooks.stopping))
		return -EBUSY;
	srv->hooks = hooks ? *hooks : (struct ioc_nbd_server_hooks){ 0 };
	return 0;
}

/* ---- accepting ---------------------------------------------------------------------- */

static void on_accept(void *opaque);

static void listener_resume(void *opaque)
{
	struct listener *l = opaque;

	if (!atomic_load_explicit(&l->srv->stopping, memory_order_relaxed))
		ioc_loop_set_fd(l->srv->main_loop, l->fd, on_accept, NULL, NULL,
				NULL, l);
}

static void on_accept(void *opaque)
{
	struct listener *l = opaque;
	struct ioc_nbd_server *srv = l->srv;

	for (int i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			/* Out of fds or memory: the pending connection stays
			 * queued and the listener stays readable, so stop
			 * watching it for a while instead of spinning. */
			ioc__nbd_log(srv, "accept: %s; pausing 100 ms", strerror(errno));
			ioc_loop_set_fd(srv->main_loop, l->fd, NULL, NULL, NULL, NULL, NULL);
			ioc_timer_arm_in(&l->backoff, 100 * 1000000);
			return;
		}
		uint64_t open = atomic_load_explicit(&srv->nconns, memory_order_relaxed);
		if (srv->opts.max_connections && open >= srv->opts.max_connections) {
			ioc__nbd_log(srv, "refusing a connection: %u already open",
			     srv->opts.max_connections);
			close(fd);
			atomic_fetch_add_explicit(&srv->refused, 1, memory_order_relaxed);
			continue;
		}
		struct nbd_thread *t = &srv->threads[srv->next_thread++ % srv->nthreads];
		/* Counted before the hand-over, so the I/O thread's decrement
		 * can never come first.  relaxed: the increment happens on the
		 * stopping thread itself, before it stops; the decrement
		 * (conn.c) and the stop loop order themselves with seq_cst. */
		atomic_fetch_add_explicit(&srv->nconns, 1, memory_order_relaxed);
		if (ioc__nbd_conn_accept(t, fd) < 0) {
			atomic_fetch_sub_explicit(&srv->nconns, 1, memory_order_relaxed);
			close(fd);
			continue;
		}
		atomic_fetch_add_explicit(&srv->accepted, 1, memory_order_relaxed);
	}
}

/* ---- server --------------------------------------------------------------------------- */

int ioc_nbd_server_new(struct ioc_nbd_server **out,
		       const struct ioc_nbd_server_opts *opts)
{
	struct ioc_nbd_server *srv = calloc(1, sizeof(*srv));

	if (!srv)
		return -ENOMEM;
	if (opts)
		srv->opts = *opts;
	if (!srv->opts.iothreads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		srv->opts.iothreads = n > 0 ? (unsigned)n : 1;
	}
	if (srv->opts.iothreads > 256)
		srv->opts.iothreads = 256;
	if (!srv->opts.max_inflight)
		srv->opts.max_inflight = 128;
	if (!srv->opts.handshake_timeout_ns)
		srv->opts.handshake_timeout_ns = 10ll * 1000000000;
	srv->cfg.exports = srv->exports;
	/* Spliced reads are off unless asked for: on this project's machines
	 * the client's receive costs more than the server saves (NOTES.md). */
	srv->zc_read_min = srv->opts.splice_read_min;
	srv->zc_write_min = IOC_NBD_ZC_WRITE_MIN;
	/* For tests only: "off", "refuse" (sockets refuse splice, reads
	 * spliced from IOC_NBD_ZC_WRITE_MIN up) or a threshold in bytes for
	 * both. */
	const char *zc = getenv("IOC_NBD_TEST_SPLICE");
	if (zc && strcmp(zc, "off") == 0)
		srv->zc_write_min = 0;
	else if (zc && strcmp(zc, "refuse") == 0)
		srv->zc_refuse = true, srv->zc_read_min = IOC_NBD_ZC_WRITE_MIN;
	else if (zc && *zc)
		srv->zc_read_min = srv->zc_write_min = strtoul(zc, NULL, 0);
	/* For tests and A/B runs: "off" sends every READ from a buffer,
	 * "all" lends reads of any size on any thread. */
	const char *map = getenv("IOC_NBD_TEST_MAP");
	srv->map_reads = !(map && strcmp(map, "off") == 0);
	srv->map_all = map && strcmp(map, "all") == 0;
	map = getenv("IOC_NBD_TEST_MAPW");
	srv->map_writes = !(map && strcmp(map, "off") == 0);
	srv->rest_max_ns = srv->opts.rest_max_ns == 0 ? IOC_NBD_REST_MAX_NS :
			   srv->opts.rest_max_ns < 0 ? 0 :
			   srv->opts.rest_max_ns > UINT32_MAX ? UINT32_MAX :
			   (uint32_t)srv->opts.rest_max_ns;
	ioc__latch_init(&srv->retired);
	*out = srv;
	return 0;
}

/* ---- exports while serving ---------------------------------------------------
 *
 * The storage daemon adds and deletes exports while clients are connected
 * (QMP's block-export-add and block-export-del).  Handshakes on the I/O
 * threads read the slots without a lock: a new export is filled in, then
 * published by a release store of its slot (and of nexports when the
 * slots grow), which the handshake's acquire loads pair with.
 *
 * Deleting: mark the export gone and empty its slot, then run a sweep on
 * every I/O thread (ioc_loop_call(): the barrier).  After it no handshake
 * can still hold the export without having counted it (conn.c counts the
 * chosen export in the same callback that chose it), and the sweep closed
 * every connection that had.  The export is freed, and the caller told, by
 * whichever comes last: the deleter finding no connection left, or the
 * last connection's release posting gone_task to the main loop; an
 * exchange of reaped picks exactly one.  Safe mode refuses while any
 * connection uses the export, as QEMU does; hard mode closes them.  A slot
 * is reused only once its export is reaped (its connections and their
 * counters are gone by then).
 */

static struct ioc__nbd_export *slot_export(struct ioc_nbd_server *srv, unsigned i)
{
	return ioc__nbd_cfg_export(&srv->cfg, i);
}

/* ---- exports on a loop of their own ----------------------------------------
 *
 * An export with opts.loop has its connections served there after the
 * handshake (conn.c, "The move").  Each such loop is a struct nbd_thread
 * like the server's own (its connections, its stop, kill and retire
 * tasks, its counters), shared by every export on it: placed[] holds
 * them, each counting the exports not yet reaped that use it.  When the
 * last is reaped the record goes idle, after a round trip to its loop
 * (place_put()): every task posted there before (a stop's, a
 * retirement's) has run by then, and so has the callback of the last
 * connection's close, which may have posted the reaping.  An idle record
 * is reused for the next loop, and records are freed with the server
 * only, so a report reading them from any thread never meets a freed one.
 * The loop itself is the caller's: the server never stops it, and after
 * place_put() (or ioc_nbd_server_stop()) posts nothing more to it.
 */

static struct nbd_thread *place_get(struct ioc_nbd_server *srv, struct ioc_loop *loop)
{
	struct nbd_thread *idle = NULL;
	int hole = -1;

	for (int i = 0; i < IOC_NBD_MAX_EXPORTS; i++) {
		struct nbd_thread *t = srv->placed[i];

		if (!t) {
			if (hole < 0)
				hole = i;
		} else if (t->exports && t->loop == loop) {
			t->exports++;
			return t;
		} else if (!t->exports && !idle) {
			idle = t;
		}
	}
	/* At most one record per export in use, and idle ones are reused:
	 * a hole is left when none is idle. */
	if (!idle) {
		if (hole < 0 || !(idle = aligned_alloc(IOC_CACHELINE, sizeof(*idle))))
			return NULL;
		memset(idle, 0, sizeof(*idle));
		idle->srv = srv;
		idle->placed = true;
		/* Release: pairs with the acquire load in
		 * ioc_nbd_server_get_stats(), which may run on any thread. */
		__atomic_store_n(&srv->placed[hole], idle, __ATOMIC_RELEASE);
	}
	idle->loop = loop;
	idle->exports = 1;
	return idle;
}

static int place_barrier_fn(void *arg)
{
	return 0;
}

/* An export of t is reaped. */
static void place_put(struct nbd_thread *t)
{
	struct ioc_nbd_server *srv = t->srv;

	if (--t->exports)
		return;
	/* The round trip: tasks are run in the order they were posted, and
	 * only between callbacks (see the essay above). */
	if (srv->started)
		ioc_loop_call(t->loop, place_barrier_fn, NULL);
	t->loop = NULL;
}

unsigned ioc__nbd_threads_end(const struct ioc_nbd_server *srv)
{
	return srv->nthreads + IOC_NBD_MAX_EXPORTS;
}

struct nbd_thread *ioc__nbd_thread_at(struct ioc_nbd_server *srv, unsigned i)
{
	struct nbd_thread *t;

	if (i < srv->nthreads)
		return &srv->threads[i];
	i -= srv->nthreads;
	t = i < IOC_NBD_MAX_EXPORTS ? srv->placed[i] : NULL;
	return t && t->exports ? t : NULL;
}

int ioc_nbd_server_add_export(struct ioc_nbd_server *srv,
			      const struct ioc_nbd_export_opts *opts)
{
	struct ioc__nbd_export *e;
	const char *name = opts->name ? opts->name : "";
	unsigned slot = srv->cfg.nexports;

	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		struct ioc__nbd_export *x = slot_export(srv, i);

		if (x && strcmp(x->name, name) == 0)
			return -EEXIST;
		if (!x && !srv->dying[i] && slot == srv->cfg.nexports)
			slot = i;
	}
	if (slot == IOC_NBD_MAX_EXPORTS)
		return -ENOSPC;
	struct ioc_node *n = opts->node;
	int r = 0;

	if ((!!opts->node + !!opts->blk + !!opts->zip) != 1 || (opts->zip_overlay && !opts->zip))
		return -EINVAL;
	/* An image the caller opened: served through a node made over it. */
	if (!srv->graph && !n && (r = ioc_node_graph_new(&srv->graph)) < 0)
		return r;
	if (opts->blk)
		r = ioc_node_wrap_blk(srv->graph, opts->blk, name, &n);
	else if (opts->zip)
		r = ioc_node_wrap_zip(srv->graph, opts->zip, opts->zip_overlay, name, &n);
	if (r < 0)
		return r;
	r = ioc__nbd_node_export_new(&e, opts, n, !opts->node);
	if (r < 0) {
		if (!opts->node)
			ioc_node_unref(n);
		return r;
	}
	if (opts->loop && !(e->place = place_get(srv, opts->loop))) {
		ioc__nbd_export_free(e);
		return -ENOMEM;
	}
	e->index = slot;
	e->srv = srv;
	/* Release: pairs with the handshake's acquire loads (above). */
	__atomic_store_n(&srv->exports[slot], e, __ATOMIC_RELEASE);
	if (slot == srv->cfg.nexports)
		__atomic_store_n(&srv->cfg.nexports, slot + 1, __ATOMIC_RELEASE);
	return 0;
}

static int leave_node_fn(void *arg)
{
	ioc_node_loop_exit(arg);
	return 0;
}

static void export_reap(struct ioc__nbd_export *e)
{
	struct ioc_nbd_server *srv = e->srv;
	bool shared = false;

	srv->dying[e->index] = NULL;
	/* Its last connection is gone: the I/O threads submit to its node no
	 * more (unless another export serves it), so its driver drops what it
	 * keeps on their loops now; thread_leave_nodes() will not see it. */
	for (unsigned i = 0; i < srv->cfg.nexports && !shared; i++)
		shared = (srv->exports[i] && srv->exports[i]->node == e->node) ||
			 (srv->dying[i] && srv->dying[i]->node == e->node);
	for (unsigned t = 0; !shared && srv->threads && t < srv->nthreads; t++)
		ioc_loop_call(srv->threads[t].loop, leave_node_fn, e->node);
	/* Its loop (if it has one) is its owner's to leave the node. */
	if (e->place)
		place_put(e->place);
	if (e->deleted)
		e->deleted(e->deleted_opaque, e->name);
	ioc__nbd_export_free(e);
}

static void export_gone_task(struct ioc_task *task)
{
	struct nbd_gone *g = ioc_container_of(task, struct nbd_gone, task);

	export_reap(g->srv->dying[g->index]);
}

void ioc__nbd_export_release(struct ioc__nbd_export *e)
{
	struct ioc_nbd_server *srv = e->srv;

	/* seq_cst: the total order with the deleter's store of gone and load
	 * of conns (ioc_nbd_server_del_export()). */
	if (atomic_fetch_sub_explicit(&e->conns, 1, memory_order_seq_cst) == 1 &&
	    atomic_load_explicit(&e->gone, memory_order_seq_cst) &&
	    !atomic_exchange_explicit(&e->reaped, true, memory_order_acq_rel)) {
		srv->gone[e->index].task.fn = export_gone_task;
		srv->gone[e->index].srv = srv;
		srv->gone[e->index].index = e->index;
		ioc_loop_post(srv->main_loop, &srv->gone[e->index].task);
	}
}

struct sweep {
	struct nbd_thread *t;
	struct ioc__nbd_export *e;
};

static int sweep_fn(void *arg)
{
	struct sweep *s = arg;

	return ioc__nbd_thread_kill_export(s->t, s->e);
}

int ioc_nbd_server_del_export(struct ioc_nbd_server *srv, const char *name, bool hard,
			      void (*deleted)(void *opaque, const char *name), void *opaque)
{
	struct ioc__nbd_export *e = NULL;

	for (unsigned i = 0; i < srv->cfg.nexports && !e; i++) {
		struct ioc__nbd_export *x = slot_export(srv, i);

		if (x && strcmp(x->name, name) == 0)
			e = x;
	}
	if (!e)
		return -ENOENT;
	if (!hard && atomic_load_explicit(&e->conns, memory_order_seq_cst) > 0)
		return -EBUSY;
	e->deleted = deleted;
	e->deleted_opaque = opaque;
	atomic_store_explicit(&e->gone, true, memory_order_seq_cst);
	srv->dying[e->index] = e;
	/* Release: pairs with the handshake's acquire load of the slot. */
	__atomic_store_n(&srv->exports[e->index], NULL, __ATOMIC_RELEASE);
	for (unsigned i = 0; srv->started && i < ioc__nbd_threads_end(srv); i++) {
		struct sweep s = { ioc__nbd_thread_at(srv, i), e };

		if (s.t)
			ioc_loop_call(s.t->loop, sweep_fn, &s);
	}
	/* seq_cst: see ioc__nbd_export_release(). */
	if (atomic_load_explicit(&e->conns, memory_order_seq_cst) == 0 &&
	    !atomic_exchange_explicit(&e->reaped, true, memory_order_acq_rel))
		export_reap(e);
	return 0;
}

unsigned ioc_nbd_server_export_clients(struct ioc_nbd_server *srv, const char *name)
{
	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		struct ioc__nbd_export *x = slot_export(srv, i);

		if (x && strcmp(x->name, name) == 0)
			return atomic_load_explicit(&x->conns, memory_order_relaxed);
	}
	return 0;
}

int ioc_nbd_server_set_tls(struct ioc_nbd_server *srv,
			   const struct ioc_nbd_tls_opts *opts,
			   char *err, size_t errlen)
{
	struct ioc__nbd_tls_creds *cr = NULL;
	char dummy[8];
	int r;

	if (!err) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	if (srv->started) {
		snprintf(err, errlen, "server already started");
		return -EBUSY;
	}
	if (opts->mode != IOC_NBD_TLS_OFF) {
		if (opts->mode != IOC_NBD_TLS_ON && opts->mode != IOC_NBD_TLS_REQUIRE) {
			snprintf(err, errlen, "unknown TLS mode %d", (int)opts->mode);
			return -EINVAL;
		}
		r = ioc__nbd_tls_creds_new(&cr, opts, err, errlen);
		if (r < 0)
			return r;
	}
	ioc__nbd_tls_creds_free(srv->tls);
	srv->tls = cr;
	/* The protocol core has its own copy of the modes (it builds without
	 * the public headers' dependencies); the values are the same. */
	_Static_assert((int)IOC__NBD_TLS_OFF == (int)IOC_NBD_TLS_OFF &&
		       (int)IOC__NBD_TLS_ON == (int)IOC_NBD_TLS_ON &&
		       (int)IOC__NBD_TLS_REQUIRE == (int)IOC_NBD_TLS_REQUIRE,
		       "TLS modes differ");
	srv->cfg.tls = (enum ioc__nbd_tls_mode)opts->mode;
	return 0;
}

int ioc_nbd_server_add_listener(struct ioc_nbd_server *srv, int fd)
{
	if (srv->serving || (srv->started && !srv->opts.defer_serving))
		return -EBUSY;
	if (srv->nlisteners == IOC_NBD_MAX_LISTENERS)
		return -ENOSPC;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	srv->listeners[srv->nlisteners].srv = srv;
	srv->listeners[srv->nlisteners].fd = fd;
	srv->nlisteners++;
	return 0;
}

static int watch_listeners(struct ioc_nbd_server *srv)
{
	for (unsigned i = 0; i < srv->nlisteners; i++) {
		ioc_timer_init(&srv->listeners[i].backoff, srv->main_loop,
			       listener_resume, &srv->listeners[i]);
		int r = ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd, on_accept,
					NULL, NULL, NULL, &srv->listeners[i]);
		if (r < 0) {
			while (i-- > 0)
				ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd,
						NULL, NULL, NULL, NULL, NULL);
			return r;
		}
	}
	srv->serving = true;
	return 0;
}

int ioc_nbd_server_serve(struct ioc_nbd_server *srv)
{
	if (!srv->started || srv->serving || !srv->opts.defer_serving)
		return -EBUSY;
	if (!srv->cfg.nexports && !srv->opts.allow_empty)
		return -EINVAL;
	return watch_listeners(srv);
}

void ioc__nbd_close_listeners(struct ioc_nbd_server *srv)
{
	for (unsigned i = 0; i < srv->nlisteners; i++) {
		if (srv->serving) {
			ioc_timer_cancel(&srv->listeners[i].backoff);
			ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd, NULL, NULL,
					NULL, NULL, NULL);
		}
		close(srv->listeners[i].fd);
	}
	srv->nlisteners = 0;
}

int ioc_nbd_server_start(struct ioc_nbd_server *srv)
{
	int r;

	if (srv->started)
		return -EBUSY;
	if (!srv->cfg.nexports && !srv->opts.defer_serving && !srv->opts.allow_empty)
		return -EINVAL;
	srv->main_loop = ioc_loop_current();
	if (!srv->main_loop)
		return -EINVAL;
	srv->threads = aligned_alloc(IOC_CACHELINE,
				     sizeof(*srv->threads) * srv->opts.iothreads);
	if (!srv->threads)
		return -ENOMEM;
	memset(srv->threads, 0, sizeof(*srv->threads) * srv->opts.iothreads);
	for (unsigned i = 0; i < srv->opts.iothreads; i++) {
		struct nbd_thread *t = &srv->threads[i];
		struct ioc_iothread_opts to = {
			.name = "ioc-nbd-io",
			.cpu = -1,
			.loop = srv->opts.loop,
		};
		t->srv = srv;
		r = ioc_iothread_start(&t->th, &to);
		if (r < 0)
			goto fail;
		t->loop = ioc_iothread_loop(t->th);
		srv->nthreads++;
	}
	if (!srv->opts.defer_serving) {
		r = watch_listeners(srv);
		if (r < 0)
			goto fail;
	}
	srv->started = true;
	return 0;
fail:
	for (unsigned i = 0; i < srv->nlisteners; i++)
		ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd, NULL, NULL,
				NULL, NULL, NULL);
	for (unsigned i = 0; i < srv->nthreads; i++)
		ioc_iothread_stop(srv->threads[i].th);
	srv->nthreads = 0;
	free(srv->threads);
	srv->threads = NULL;
	return r;
}

/* On an I/O thread about to stop: it submits to the exports' nodes no
 * more (their drivers drop what they keep on its loop). */
static int thread_leave_nodes(void *arg)
{
	struct ioc_nbd_server *srv = arg;

	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		if (srv->exports[i])
			ioc_node_loop_exit(srv->exports[i]->node);
		if (srv->dying[i])
			ioc_node_loop_exit(srv->dying[i]->node);
	}
	return 0;
}

struct flush_job {
	struct ioc_nbd_server *srv;
	int ret;
	bool done;
};

static void ioc_coroutine_fn flush_co(void *opaque)
{
	struct flush_job *j = opaque;

	for (unsigned i = 0; i < j->srv->cfg.nexports; i++) {
		struct ioc__nbd_export *e = j->srv->exports[i];
		if (!e || e->read_only)
			continue;
		int r = e->ops->flush(e->be, 0);
		if (r < 0 && !j->ret)
			j->ret = r;
	}
	j->done = true;
	ioc_loop_notify(j->srv->main_loop);
}

static void stop_tick(void *opaque)
{
	/* Only wakes the loop: the stop loop re-checks its conditions. */
}

int ioc_nbd_server_stop(struct ioc_nbd_server *srv)
{
	struct ioc_timer tick;
	struct flush_job job = { .srv = srv };

	if (!srv->started)
		return 0;
	/* The job first: a migration may hold requests at its node's gate
	 * (it opens the gate again when it fails). */
	stop_job(srv);
	if (srv->hooks.stopping)
		srv->hooks.stopping(srv->hooks.opaque);
	/* seq_cst: pairs with conn_destroy() (see there). */
	atomic_store_explicit(&srv->stopping, 1, memory_order_seq_cst);
	/* relaxed: handshakes only read it as a hint (handshake.c). */
	atomic_store_explicit(&srv->cfg.shutting_down, 1,
			      memory_order_relaxed);
	ioc__nbd_close_listeners(srv);
	for (unsigned i = 0; i < ioc__nbd_threads_end(srv); i++) {
		struct nbd_thread *t = ioc__nbd_thread_at(srv, i);

		if (t) {
			t->stop_task.fn = ioc__nbd_thread_stop;
			ioc_loop_post(t->loop, &t->stop_task);
		}
	}
	int64_t deadline = ioc_now_ns() + IOC_NBD_STOP_GRACE_NS;
	bool killed = false, told = false;
	ioc_timer_init(&tick, srv->main_loop, stop_tick, NULL);
	while (atomic_load_explicit(&srv->nconns, memory_order_seq_cst) > 0) {
		if (killed && !told && ioc_now_ns() >= deadline + IOC_NBD_STOP_GRACE_NS) {
			/* A killed connection waits only for its requests in
			 * flight, which a node that does not answer holds.  Not
			 * given up on: a node's write-back cache (librbd's) may
			 * hold acknowledged writes that only its flush saves. */
			fprintf(stderr, "NBD server: %llu connection(s) still have requests in "
				"flight; waiting for them\n", (unsigned long long)
				atomic_load_explicit(&srv->nconns, memory_order_seq_cst));
			told = true;
		}
		if (!killed && ioc_now_ns() >= deadline) {
			/* seq_cst, as the first store: a connection on its way
			 * to its export's loop is killed when it arrives
			 * (conn.c, conn_arrive()). */
			atomic_store_explicit(&srv->stopping, 2, memory_order_seq_cst);
			for (unsigned i = 0; i < ioc__nbd_threads_end(srv); i++) {
				struct nbd_thread *t = ioc__nbd_thread_at(srv, i);

				if (t) {
					t->kill_task.fn = ioc__nbd_thread_kill;
					ioc_loop_post(t->loop, &t->kill_task);
				}
			}
			killed = true;
		}
		ioc_timer_arm_in(&tick, 50 * 1000000);
		ioc_loop_poll(srv->main_loop, true);
	}
	/* Every connection is gone, so each export being deleted has been
	 * reaped or has its reaping posted here (a connection's release
	 * posts it before its nconns decrement): run them, so that none is
	 * left to run after the server is freed. */
	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		while (srv->dying[i]) {
			ioc_timer_arm_in(&tick, 50 * 1000000);
			ioc_loop_poll(srv->main_loop, true);
		}
	}
	/* Everything answered: make it durable. */
	struct ioc_co *co = ioc_co_create(flush_co, &job);
	if (!co) {
		job.ret = -ENOMEM;
	} else {
		ioc_co_enter(co);
		while (!job.done) {
			ioc_timer_arm_in(&tick, 50 * 1000000);
			ioc_loop_poll(srv->main_loop, true);
		}
	}
	ioc_timer_cancel(&tick);
	/* The exports' loops go on (they are their owners'): a round trip to
	 * each, so that the last connection's close has returned there and
	 * the stop's tasks have run (place_put() for why that suffices). */
	for (unsigned i = 0; i < IOC_NBD_MAX_EXPORTS; i++) {
		struct nbd_thread *t = srv->placed[i];

		if (t && t->exports)
			ioc_loop_call(t->loop, place_barrier_fn, NULL);
	}
	for (unsigned i = 0; i < srv->nthreads; i++) {
		ioc_iothread_call(srv->threads[i].th, thread_leave_nodes, srv);
		ioc_iothread_stop(srv->threads[i].th);
	}
	srv->nthreads = 0;
	srv->started = false;
	srv->serving = false;
	return job.ret;
}

void ioc_nbd_server_free(struct ioc_nbd_server *srv)
{
	if (!srv)
		return;
	if (srv->started)
		ioc_nbd_server_stop(srv);
	stop_job(srv);
	for (unsigned i = 0; i < srv->nlisteners; i++)
		close(srv->listeners[i].fd);
	for (unsigned i = 0; i < srv->cfg.nexports; i++) {
		ioc__nbd_export_free(srv->exports[i]);
		/* Never started: a deletion reaped at once.  Stopped: the
		 * stop ran every reaping. */
		assert(!srv->dying[i]);
	}
	for (unsigned i = 0; i < IOC_NBD_MAX_EXPORTS; i++)
		free(srv->placed[i]);
	ioc__nbd_tls_creds_free(srv->tls);
	ioc_node_graph_free(srv->graph);
	free(srv->threads);
	ioc__latch_destroy(&srv->retired);
	free(srv);
}

void ioc_nbd_server_get_stats(struct ioc_nbd_server *srv,
			      struct ioc_nbd_server_stats *st)
{
	memset(st, 0, sizeof(*st));
	/* relaxed: statistics, no ordering implied. */
	st->accepted = atomic_load_explicit(&srv->accepted, memory_order_relaxed);
	st->refused = atomic_load_explicit(&srv->refused, memory_order_relaxed);
	st->connections = atomic_load_explicit(&srv->nconns, memory_order_relaxed);
	for (unsigned i = 0; i < srv->nthreads; i++)
		st->requests += atomic_load_explicit(&srv->threads[i].requests,
						     memory_order_relaxed);
	for (unsigned i = 0; i < IOC_NBD_MAX_EXPORTS; i++) {
		/* Acquire: pairs with the release store in place_get(). */
		struct nbd_thread *t = __atomic_load_n(&srv->placed[i], __ATOMIC_ACQUIRE);

		if (t)
			st->requests += atomic_load_explicit(&t->requests,
							     memory_order_relaxed);
	}
}

/* ---- what a control socket reports ------------------------------------------------------ */

unsigned ioc_nbd_server_exports(struct ioc_nbd_server *srv, struct ioc_nbd_export_info *out,
				unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < srv->cfg.nexports && n < max; i++)
		if (srv->exports[i])
			out[n++] = (struct ioc_nbd_export_info){ srv->exports[i]->name,
								 srv->exports[i]->node };
	return n;
}

bool ioc_nbd_server_stopping(struct ioc_nbd_server *srv)
{
	/* relaxed: a report of the state, ordering nothing. */
	return atomic_load_explicit(&srv->stopping, memory_order_relaxed);
}

struct conn_query {
	struct nbd_thread *t;
	struct ioc_nbd_conn_info *out;
	unsigned max, n;
};

static int conn_query_fn(void *arg)
{
	struct conn_query *cq = arg;

	cq->n = ioc__nbd_thread_conn_info(cq->t, cq->out, cq->max);
	return 0;
}

unsigned ioc_nbd_server_conns(struct ioc_nbd_server *srv, struct ioc_nbd_conn_info *out,
			      unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; srv->started && i < ioc__nbd_threads_end(srv) && n < max; i++) {
		struct conn_query cq = { ioc__nbd_thread_at(srv, i), out + n, max - n, 0 };

		if (!cq.t)
			continue;
		ioc_loop_call(cq.t->loop, conn_query_fn, &cq);
		n += cq.n;
	}
	return n;
}

unsigned ioc_nbd_server_nthreads(struct ioc_nbd_server *srv)
{
	return srv->nthreads;
}

int ioc_nbd_server_thread_poll(struct ioc_nbd_server *srv, unsigned t,
			       struct ioc_nbd_thread_poll *out)
{
	if (t >= srv->nthreads)
		return -ENOENT;
	ioc_loop_get_poll_stats(srv->threads[t].loop, &out->loop);
	/* relaxed: counters, written by that thread only (conn.c). */
	out->rests = atomic_load_explicit(&srv->threads[t].rests, memory_order_relaxed);
	out->rests_late = atomic_load_explicit(&srv->threads[t].rests_late,
					       memory_order_relaxed);
	return 0;
}

/* ---- listening sockets ------------------------------------------------------------------ */

int ioc_nbd_listen_unix(const char *path)
{
	return ioc__listen_unix(path, 1024);
}

int ioc_nbd_listen_tcp(const char *host, const char *port)
{
	return ioc__listen_tcp(host, port, 1024);
}
