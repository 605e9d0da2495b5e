/*
 * The NBD server on the iocore runtime: listeners, I/O threads, and the
 * life of a connection.
 *
 * Problem.  Serve many clients, each pipelining up to ~64+ small requests,
 * at the lowest CPU cost per request, on a machine where the client (fio,
 * qemu) competes for the same few cores; and survive hostile clients.
 *
 * Design.
 * - N I/O threads, each running one loop.  The thread that starts the
 *   server watches the listening sockets; an accepted socket goes to the
 *   next I/O thread round-robin through ioc_loop_post() (an embedded task,
 *   lock-free, no allocation on the target side).  From then on the
 *   connection is touched by its I/O thread only: no lock on the data
 *   path, and the only cross-thread state is a few relaxed counters.
 * - Reading: the fd handler recv()s as much as fits into the connection's
 *   input buffer and parses every complete request in it (protocol core,
 *   proto.c), so one recv carries many requests.  A large WRITE payload
 *   that is still arriving is received straight into its request buffer.
 * - One coroutine per request, from the coroutine pool.  It runs the
 *   request against the block layer (yielding while the I/O is in flight;
 *   with the block layer's inline fast path a cached read never yields)
 *   and queues the finished reply on the connection.
 * - Writing: finished replies are sent together by one sendmsg() with up
 *   to 64 iovecs, from a bottom half that runs once per loop iteration
 *   (or right after a parse batch), so a burst of completions costs one
 *   syscall.  READ data is read by the block layer straight into the
 *   request buffer the reply iovec points at.
 * - Bounds: at most max_inflight requests (parsed, not yet fully sent)
 *   and IOC_NBD_INFLIGHT_BYTES of payload per connection; beyond that the
 *   connection stops reading until replies drain.  A client that never
 *   reads its replies thus stalls only itself, with bounded memory.  The
 *   handshake has a deadline (a loop timer).  Protocol violations close
 *   that one connection.
 * - Shutdown: stop accepting; every connection reads what the client has
 *   already sent (until the socket is empty once), finishes and answers
 *   all of it, then closes; then the exports are flushed.  Clients still
 *   in the handshake are closed at once.  A grace period bounds clients
 *   that never read their replies.
 *
 * Alternatives rejected.  A coroutine per connection reading requests in
 * a loop (QEMU) serialises parsing with a context switch per request and
 * holds a stack per idle client.  One thread per connection with blocking
 * I/O (nbdkit's default) spends a wakeup per request and shares the
 * backend across threads.  Sending each reply as it completes costs a
 * syscall per request; the bottom half batches without adding latency
 * beyond the current loop iteration.
 *
 * Cost notes.  Per connection: ~1 KiB of state plus a 128 KiB input
 * buffer (untouched pages are not resident).  Per in-flight request: the
 * request object (~2 KiB, recycled through a per-connection free list)
 * and its data buffer.  Round-robin placement ignores load; connections
 * are long-lived and similar, so this has been good enough.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "iocore/co.h"
#include "nbd-server.h"

#define IOC_NBD_IN_CAP          (128u << 10)
#define IOC_NBD_INFLIGHT_BYTES  (64u << 20)
#define IOC_NBD_SEND_IOV        64
#define IOC_NBD_SOCK_BUF        (2 << 20)
#define IOC_NBD_FREE_REQS       64
#define IOC_NBD_KEEP_BUF        (1u << 20)
#define IOC_NBD_MAX_EXPORTS     64
#define IOC_NBD_MAX_LISTENERS   16
#define IOC_NBD_STOP_GRACE_NS   (10ll * 1000000000)
#define IOC_NBD_REQ_HS          0xffff /* a request carrying handshake output */

struct nbd_thread;

struct conn {
	struct ioc__nbd_conn core;
	struct ioc_task start_task;     /* handoff from the accepting thread */
	struct ioc_task kill_task;      /* shutdown grace expired */
	struct nbd_thread *t;
	struct conn *next, *prev;       /* the thread's connections */
	int fd;
	struct ioc_timer hs_timer;
	struct ioc_bh *bh;              /* send replies, resume, reap */
	struct ioc__nbd_req *sq_head, **sq_tail; /* replies to send, in order */
	struct ioc__nbd_req *free_reqs;
	unsigned nfree;
	unsigned inflight;              /* parsed, reply not fully sent */
	uint64_t inflight_bytes;
	bool reg_read, reg_write;       /* current fd handler registration */
	bool want_write;                /* socket full, replies waiting */
	bool stalled;                   /* stopped parsing at a bound */
	bool eof;                       /* read nothing more */
	bool draining;                  /* server stopping: read until empty */
	bool dead;                      /* socket unusable: drop replies */
	bool started;                   /* registered with the loop */
};

struct nbd_thread {
	struct ioc_nbd_server *srv;
	struct ioc_iothread *th;
	struct ioc_loop *loop;
	struct conn *conns;             /* loop thread only */
	struct ioc_task stop_task;
	struct ioc_task kill_task;
	_Atomic uint64_t requests;      /* written by this thread only */
} IOC_CACHE_ALIGNED;

struct listener {
	struct ioc_nbd_server *srv;
	int fd;
	struct ioc_timer backoff;       /* re-arm after EMFILE and friends */
};

struct ioc_nbd_server {
	struct ioc_nbd_server_opts opts;
	struct ioc__nbd_cfg cfg;
	struct ioc__nbd_export *exports[IOC_NBD_MAX_EXPORTS];
	struct listener listeners[IOC_NBD_MAX_LISTENERS];
	unsigned nlisteners;
	struct ioc_loop *main_loop;
	struct nbd_thread *threads;
	unsigned nthreads, next_thread;
	_Atomic uint64_t nconns;        /* open connections */
	_Atomic uint64_t accepted, refused;
	_Atomic int stopping;
	bool started;
};

static void conn_process(struct conn *c);
static void conn_maybe_reap(struct conn *c);

static void slog(struct ioc_nbd_server *srv, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void slog(struct ioc_nbd_server *srv, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!srv->opts.log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	srv->opts.log(srv->opts.log_opaque, msg);
}

/* ---- requests -------------------------------------------------------------- */

static struct ioc__nbd_req *req_alloc(void *opaque, size_t len)
{
	struct conn *c = opaque;
	struct ioc__nbd_req *r = c->free_reqs;

	if (r) {
		c->free_reqs = r->next;
		c->nfree--;
	} else {
		r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
	}
	if (len > r->buf_cap) {
		free(r->buf);
		r->buf = NULL;
		r->buf_cap = 0;
		/* Page aligned so O_DIRECT (--cache none) never bounces. */
		size_t cap = len < 4096 ? 4096 : (len + 4095) & ~(size_t)4095;
		if (posix_memalign((void **)&r->buf, 4096, cap) != 0) {
			r->next = c->free_reqs;
			c->free_reqs = r;
			c->nfree++;
			return NULL;
		}
		r->buf_cap = cap;
	}
	r->transport = c;
	return r;
}

static void req_free(struct ioc__nbd_req *r)
{
	free(r->buf);
	free(r->ext);
	free(r);
}

static uint64_t req_bytes(const struct ioc__nbd_req *r)
{
	return (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) && !r->error
	       ? r->len : 0;
}

/* A request is done (reply sent, or dropped): recycle it. */
static void req_release(struct conn *c, struct ioc__nbd_req *r)
{
	c->inflight--;
	c->inflight_bytes -= req_bytes(r);
	free(r->ext);
	r->ext = NULL;
	if (c->nfree >= IOC_NBD_FREE_REQS || r->buf_cap > IOC_NBD_KEEP_BUF) {
		req_free(r);
		return;
	}
	r->next = c->free_reqs;
	c->free_reqs = r;
	c->nfree++;
}

static bool conn_bounded(const struct conn *c)
{
	const struct ioc_nbd_server *srv = c->t->srv;

	return c->inflight >= srv->opts.max_inflight ||
	       c->inflight_bytes >= IOC_NBD_INFLIGHT_BYTES;
}

/* ---- sending ----------------------------------------------------------------- */

static void queue_reply(struct conn *c, struct ioc__nbd_req *r)
{
	if (r->no_reply || c->dead) {
		req_release(c, r);
		ioc_bh_schedule(c->bh); /* may resume reading or reap */
		return;
	}
	r->next = NULL;
	*c->sq_tail = r;
	c->sq_tail = &r->next;
	ioc_bh_schedule(c->bh);
}

/* Handshake output travels in the send queue like a reply, so it is
 * ordered with (and bounded like) everything else. */
static int queue_hs_output(struct conn *c)
{
	struct ioc__nbd_conn *core = &c->core;

	if (!core->out_len)
		return 0;
	struct ioc__nbd_req *r = req_alloc(c, core->out_len);
	if (!r)
		return -ENOMEM;
	memcpy(r->buf, core->out, core->out_len);
	r->type = IOC_NBD_REQ_HS;
	r->error = 0;
	r->len = 0;
	r->no_reply = false;
	r->iov[0].iov_base = r->buf;
	r->iov[0].iov_len = core->out_len;
	r->iovcnt = 1;
	r->iov_done = 0;
	r->iov_off = 0;
	core->out_len = 0;
	c->inflight++;
	queue_reply(c, r);
	return 0;
}

static void conn_kill(struct conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	c->eof = true;
	shutdown(c->fd, SHUT_RDWR);
	while (c->sq_head) {
		struct ioc__nbd_req *r = c->sq_head;
		c->sq_head = r->next;
		req_release(c, r);
	}
	c->sq_tail = &c->sq_head;
}

/* Send queued replies, as many per sendmsg as fit. */
static void conn_flush(struct conn *c)
{
	struct iovec iov[IOC_NBD_SEND_IOV];

	while (c->sq_head && !c->dead) {
		int n = ioc__nbd_gather(c->sq_head, iov, IOC_NBD_SEND_IOV);
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t s = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (s < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				c->want_write = true;
				return;
			}
			slog(c->t->srv, "%s: send: %s", c->core.peer, strerror(errno));
			conn_kill(c);
			return;
		}
		unsigned done = ioc__nbd_sent(c->sq_head, (size_t)s);
		while (done--) {
			struct ioc__nbd_req *r = c->sq_head;
			c->sq_head = r->next;
			req_release(c, r);
		}
	}
	if (!c->sq_head)
		c->sq_tail = &c->sq_head;
	c->want_write = false;
}

static void on_read(void *opaque);
static void on_write(void *opaque);

static void update_handlers(struct conn *c)
{
	bool r = !c->eof && !c->dead && !conn_bounded(c);
	bool w = c->want_write && !c->dead;

	if (!c->started || (r == c->reg_read && w == c->reg_write))
		return;
	if (ioc_loop_set_fd(c->t->loop, c->fd, r ? on_read : NULL,
			    w ? on_write : NULL, NULL, NULL, c) < 0) {
		conn_kill(c);
		r = w = false;
	}
	c->reg_read = r;
	c->reg_write = w;
}

/* ---- request coroutines ------------------------------------------------------- */

static void ioc_coroutine_fn req_co(void *opaque)
{
	struct ioc__nbd_req *r = opaque;
	struct conn *c = r->transport;

	ioc__nbd_execute(&c->core, r);
	queue_reply(c, r);
}

static void start_request(struct conn *c, struct ioc__nbd_req *r)
{
	struct nbd_thread *t = c->t;

	c->inflight++;
	c->inflight_bytes += req_bytes(r);
	/* relaxed: a statistic; only this thread writes it. */
	atomic_store_explicit(&t->requests,
			      atomic_load_explicit(&t->requests, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	if (r->type == NBD_CMD_DISC || r->error) {
		ioc__nbd_execute(&c->core, r); /* no backend call: builds the reply */
		queue_reply(c, r);
		return;
	}
	struct ioc_co *co = ioc_co_create(req_co, r);
	if (!co) {
		ioc__nbd_reply_error(&c->core, r, NBD_ENOMEM, "out of memory");
		queue_reply(c, r);
		return;
	}
	ioc_co_enter(co);
}

/* ---- reading -------------------------------------------------------------------- */

static ssize_t conn_recv(struct conn *c, void *buf, size_t len)
{
	for (;;) {
		ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
		if (n >= 0 || errno != EINTR)
			return n < 0 ? -errno : n;
	}
}

/* The socket said "nothing more" (EOF, error or, when draining, EAGAIN). */
static bool handle_recv_end(struct conn *c, ssize_t n)
{
	if (n == -EAGAIN || n == -EWOULDBLOCK) {
		if (c->draining)
			c->eof = true;
		return true;
	}
	if (n == 0) {
		c->eof = true; /* finish what was received, then close */
		return true;
	}
	slog(c->t->srv, "%s: recv: %s", c->core.peer, strerror((int)-n));
	conn_kill(c);
	return true;
}

static void hs_process(struct conn *c)
{
	struct ioc__nbd_conn *core = &c->core;

	while (!c->eof && !c->dead) {
		int st = ioc__nbd_hs_step(core);
		if (queue_hs_output(c) < 0) {
			conn_kill(c);
			return;
		}
		if (st == IOC_NBD_READY) {
			ioc_timer_cancel(&c->hs_timer);
			slog(c->t->srv, "%s: export \"%s\"%s%s", core->peer, core->exp->name,
			     core->structured ? ", structured replies" : "",
			     core->extended ? ", extended headers" : "");
			return;
		}
		if (st == IOC_NBD_CLOSE) {
			c->eof = true; /* ABORT: close once the ACK is sent */
			return;
		}
		if (st < 0) {
			slog(c->t->srv, "%s: handshake: %s", core->peer,
			     st == -EPROTO ? "protocol violation" : strerror(-st));
			conn_kill(c);
			return;
		}
		if (conn_bounded(c)) {
			c->stalled = true;
			return;
		}
		ioc__nbd_conn_compact(core);
		ssize_t n = conn_recv(c, core->in + core->in_end,
				      core->in_cap - core->in_end);
		if (n > 0) {
			core->in_end += (size_t)n;
			continue;
		}
		if (n == 0)
			slog(c->t->srv, "%s: closed during handshake", core->peer);
		if (n == 0 || (n != -EAGAIN && n != -EWOULDBLOCK)) {
			conn_kill(c);
			return;
		}
		handle_recv_end(c, n);
		return;
	}
}

static void tx_process(struct conn *c)
{
	struct ioc__nbd_conn *core = &c->core;
	int reads = 0;
	bool drained = false;

	while (!c->dead) {
		/* Parse every complete request in the buffer. */
		while (!c->eof || core->in_start < core->in_end) {
			struct ioc__nbd_req *r;
			if (conn_bounded(c)) {
				c->stalled = true;
				return;
			}
			int st = ioc__nbd_parse_request(core, req_alloc, c, &r);
			if (st == IOC_NBD_READY) {
				start_request(c, r);
				continue;
			}
			if (st == IOC_NBD_CLOSE) {
				c->eof = true; /* NBD_CMD_DISC */
				return;
			}
			if (st < 0) {
				slog(c->t->srv, "%s: %s", core->peer,
				     st == -EPROTO ? "protocol violation" : strerror(-st));
				conn_kill(c);
				return;
			}
			break; /* need more input */
		}
		if (c->eof || ++reads > 4)
			return;
		/* A short read emptied the socket: stop here rather than pay a
		 * recv that returns EAGAIN (the fd handler fires again when
		 * more arrives).  For a draining connection, empty is the end. */
		if (drained) {
			if (c->draining)
				c->eof = true;
			return;
		}
		/* A big payload still arriving goes straight into its buffer. */
		struct ioc__nbd_req *p = core->partial;
		ssize_t n;
		size_t want;
		if (p && !p->error && core->in_start == core->in_end &&
		    p->len - core->partial_got >= 65536) {
			want = (size_t)(p->len - core->partial_got);
			n = conn_recv(c, p->buf + core->partial_got, want);
			if (n > 0) {
				drained = (size_t)n < want;
				struct ioc__nbd_req *done =
					ioc__nbd_payload_arrived(core, (size_t)n);
				if (done)
					start_request(c, done);
				continue;
			}
		} else {
			ioc__nbd_conn_compact(core);
			want = core->in_cap - core->in_end;
			n = conn_recv(c, core->in + core->in_end, want);
			if (n > 0) {
				drained = (size_t)n < want;
				core->in_end += (size_t)n;
				continue;
			}
		}
		handle_recv_end(c, n);
		return;
	}
}

/* Run everything that can make progress now; then send, re-arm, reap. */
static void conn_process(struct conn *c)
{
	c->stalled = false;
	if (c->core.phase != IOC_NBD_PHASE_TRANSMISSION)
		hs_process(c);
	if (c->core.phase == IOC_NBD_PHASE_TRANSMISSION && !c->dead)
		tx_process(c);
	conn_flush(c);
	update_handlers(c);
	conn_maybe_reap(c);
}

static void on_read(void *opaque)
{
	conn_process(opaque);
}

static void on_write(void *opaque)
{
	struct conn *c = opaque;

	conn_flush(c);
	if (c->stalled && !conn_bounded(c))
		conn_process(c);
	else {
		update_handlers(c);
		conn_maybe_reap(c);
	}
}

/* Once per loop iteration after requests completed: send their replies,
 * resume a connection that stopped at a bound, or reap a finished one. */
static void conn_bh(void *opaque)
{
	struct conn *c = opaque;

	conn_flush(c);
	if (c->stalled && !conn_bounded(c) && !c->dead)
		conn_process(c);
	else {
		update_handlers(c);
		conn_maybe_reap(c);
	}
}

static void hs_timeout(void *opaque)
{
	struct conn *c = opaque;

	if (c->core.phase == IOC_NBD_PHASE_TRANSMISSION)
		return;
	slog(c->t->srv, "%s: handshake timed out", c->core.peer);
	conn_kill(c);
	update_handlers(c);
	conn_maybe_reap(c);
}

/* ---- connection life ------------------------------------------------------------ */

static void conn_destroy(struct conn *c)
{
	struct nbd_thread *t = c->t;
	struct ioc_nbd_server *srv = t->srv;

	if (c->started) {
		if (c->reg_read || c->reg_write)
			ioc_loop_set_fd(t->loop, c->fd, NULL, NULL, NULL, NULL, NULL);
		ioc_timer_cancel(&c->hs_timer);
	}
	if (c->bh)
		ioc_bh_delete(c->bh);
	close(c->fd);
	if (c->core.partial) {
		req_free(c->core.partial);
		c->core.partial = NULL;
	}
	while (c->free_reqs) {
		struct ioc__nbd_req *r = c->free_reqs;
		c->free_reqs = r->next;
		req_free(r);
	}
	ioc__nbd_conn_destroy(&c->core);
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	slog(srv, "%s: closed", c->core.peer);
	free(c);
	/*
	 * seq_cst pairs with ioc_nbd_server_stop(): it stores stopping and
	 * then loads nconns; we decrement and then load stopping.  In the
	 * single total order one of us sees the other's write, so either the
	 * stopper sees the new count or we see stopping and wake it: no lost
	 * wakeup (and the stopper re-checks on a timer besides).
	 */
	atomic_fetch_sub_explicit(&srv->nconns, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&srv->stopping, memory_order_seq_cst))
		ioc_loop_notify(srv->main_loop);
}

static void conn_maybe_reap(struct conn *c)
{
	if (c->eof && c->inflight == 0 && !c->sq_head)
		conn_destroy(c);
}

static void format_peer(char *buf, size_t len, int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[48], serv[8];

	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 &&
	    (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) &&
	    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv,
			sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0)
		snprintf(buf, len, "%.48s:%.8s", host, serv);
	else
		snprintf(buf, len, "unix:%d", fd);
}

static void conn_start(struct ioc_task *task)
{
	struct conn *c = ioc_container_of(task, struct conn, start_task);
	struct nbd_thread *t = c->t;
	struct ioc_nbd_server *srv = t->srv;

	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	c->sq_tail = &c->sq_head;
	if (ioc__nbd_conn_init(&c->core, &srv->cfg, IOC_NBD_IN_CAP) < 0 ||
	    !(c->bh = ioc_bh_new(t->loop, conn_bh, c))) {
		c->eof = c->dead = true;
		conn_destroy(c);
		return;
	}
	if (srv->opts.log)
		format_peer(c->core.peer, sizeof(c->core.peer), c->fd);
	ioc_timer_init(&c->hs_timer, t->loop, hs_timeout, c);
	c->started = true;
	/* relaxed: the stop flag is re-checked by every stop task too. */
	if (atomic_load_explicit(&srv->stopping, memory_order_relaxed)) {
		c->eof = c->dead = true;
		conn_destroy(c);
		return;
	}
	if (srv->opts.handshake_timeout_ns > 0)
		ioc_timer_arm_in(&c->hs_timer, srv->opts.handshake_timeout_ns);
	slog(srv, "%s: connected (I/O thread %u)", c->core.peer,
	     (unsigned)(t - srv->threads));
	ioc__nbd_hs_start(&c->core);
	if (queue_hs_output(c) < 0)
		conn_kill(c);
	conn_process(c);
}

/* Shutdown on one I/O thread: connections in the handshake are closed;
 * the others read what is already there, answer it, and close. */
static void thread_stop(struct ioc_task *task)
{
	struct nbd_thread *t = ioc_container_of(task, struct nbd_thread, stop_task);
	struct conn *c = t->conns, *next;

	for (; c; c = next) {
		next = c->next;
		if (c->core.phase != IOC_NBD_PHASE_TRANSMISSION) {
			conn_kill(c);
			update_handlers(c);
			conn_maybe_reap(c);
			continue;
		}
		c->draining = true;
		conn_process(c);
	}
}

/* The grace period is over: close whatever is left. */
static void thread_kill(struct ioc_task *task)
{
	struct nbd_thread *t = ioc_container_of(task, struct nbd_thread, kill_task);
	struct conn *c = t->conns, *next;

	for (; c; c = next) {
		next = c->next;
		slog(t->srv, "%s: closed at shutdown with replies pending", c->core.peer);
		conn_kill(c);
		update_handlers(c);
		conn_maybe_reap(c);
	}
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
			slog(srv, "accept: %s; pausing 100 ms", strerror(errno));
			ioc_loop_set_fd(srv->main_loop, l->fd, NULL, NULL, NULL, NULL, NULL);
			ioc_timer_arm_in(&l->backoff, 100 * 1000000);
			return;
		}
		uint64_t open = atomic_load_explicit(&srv->nconns, memory_order_relaxed);
		if (srv->opts.max_connections && open >= srv->opts.max_connections) {
			slog(srv, "refusing a connection: %u already open",
			     srv->opts.max_connections);
			close(fd);
			atomic_fetch_add_explicit(&srv->refused, 1, memory_order_relaxed);
			continue;
		}
		struct conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		/* Best effort.  A deep queue of 4 KiB replies (64 in flight is
		 * 256 KiB) overflows the default send buffer, turning one
		 * gathered sendmsg into EAGAIN plus a POLLOUT round trip. */
		int one = 1, buf = IOC_NBD_SOCK_BUF;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
		c->fd = fd;
		c->t = &srv->threads[srv->next_thread++ % srv->nthreads];
		c->start_task.fn = conn_start;
		/* relaxed: counters; the stopper's reads are ordered by seq_cst
		 * in conn_destroy / ioc_nbd_server_stop (the increment happens on
		 * the stopper's own thread, before it stops). */
		atomic_fetch_add_explicit(&srv->nconns, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&srv->accepted, 1, memory_order_relaxed);
		/* Release/acquire inside ioc_loop_post publishes *c to the
		 * I/O thread. */
		ioc_loop_post(c->t->loop, &c->start_task);
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
	*out = srv;
	return 0;
}

int ioc_nbd_server_add_export(struct ioc_nbd_server *srv,
			      const struct ioc_nbd_export_opts *opts)
{
	struct ioc__nbd_export *e;
	const char *name = opts->name ? opts->name : "";

	if (srv->started)
		return -EBUSY;
	if (srv->cfg.nexports == IOC_NBD_MAX_EXPORTS)
		return -ENOSPC;
	for (unsigned i = 0; i < srv->cfg.nexports; i++)
		if (strcmp(srv->exports[i]->name, name) == 0)
			return -EEXIST;
	int r = ioc__nbd_blk_export_new(&e, opts);
	if (r < 0)
		return r;
	srv->exports[srv->cfg.nexports++] = e;
	return 0;
}

int ioc_nbd_server_add_listener(struct ioc_nbd_server *srv, int fd)
{
	if (srv->started)
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

int ioc_nbd_server_start(struct ioc_nbd_server *srv)
{
	int r;

	if (srv->started)
		return -EBUSY;
	if (!srv->cfg.nexports)
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
	for (unsigned i = 0; i < srv->nlisteners; i++) {
		ioc_timer_init(&srv->listeners[i].backoff, srv->main_loop,
			       listener_resume, &srv->listeners[i]);
		r = ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd, on_accept,
				    NULL, NULL, NULL, &srv->listeners[i]);
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
		if (e->read_only)
			continue;
		int r = e->ops->flush(e->be);
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
	/* seq_cst: pairs with conn_destroy() (see there). */
	atomic_store_explicit(&srv->stopping, 1, memory_order_seq_cst);
	/* relaxed: handshakes only read it as a hint (proto.c). */
	atomic_store_explicit((_Atomic int *)&srv->cfg.shutting_down, 1,
			      memory_order_relaxed);
	for (unsigned i = 0; i < srv->nlisteners; i++) {
		ioc_timer_cancel(&srv->listeners[i].backoff);
		ioc_loop_set_fd(srv->main_loop, srv->listeners[i].fd, NULL, NULL,
				NULL, NULL, NULL);
		close(srv->listeners[i].fd);
	}
	srv->nlisteners = 0;
	for (unsigned i = 0; i < srv->nthreads; i++) {
		srv->threads[i].stop_task.fn = thread_stop;
		ioc_loop_post(srv->threads[i].loop, &srv->threads[i].stop_task);
	}
	int64_t deadline = ioc_now_ns() + IOC_NBD_STOP_GRACE_NS;
	bool killed = false;
	ioc_timer_init(&tick, srv->main_loop, stop_tick, NULL);
	while (atomic_load_explicit(&srv->nconns, memory_order_seq_cst) > 0) {
		if (!killed && ioc_now_ns() >= deadline) {
			for (unsigned i = 0; i < srv->nthreads; i++) {
				srv->threads[i].kill_task.fn = thread_kill;
				ioc_loop_post(srv->threads[i].loop,
					      &srv->threads[i].kill_task);
			}
			killed = true;
		}
		ioc_timer_arm_in(&tick, 50 * 1000000);
		ioc_loop_poll(srv->main_loop, true);
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
	for (unsigned i = 0; i < srv->nthreads; i++)
		ioc_iothread_stop(srv->threads[i].th);
	srv->nthreads = 0;
	srv->started = false;
	return job.ret;
}

void ioc_nbd_server_free(struct ioc_nbd_server *srv)
{
	if (!srv)
		return;
	if (srv->started)
		ioc_nbd_server_stop(srv);
	for (unsigned i = 0; i < srv->nlisteners; i++)
		close(srv->listeners[i].fd);
	for (unsigned i = 0; i < srv->cfg.nexports; i++)
		ioc__nbd_blk_export_free(srv->exports[i]);
	free(srv->threads);
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
}

/* ---- listening sockets ------------------------------------------------------------------ */

int ioc_nbd_listen_unix(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	/* A stale socket from an earlier run is replaced; anything else is not. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1024) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

int ioc_nbd_listen_tcp(const char *host, const char *port)
{
	struct addrinfo hints = {
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
	};
	struct addrinfo *res, *ai;
	int fd = -EADDRNOTAVAIL;

	int r = getaddrinfo(host, port, &hints, &res);
	if (r != 0)
		return r == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		int one = 1;
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    ai->ai_protocol);
		if (fd < 0) {
			fd = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
			break;
		int e = -errno;
		close(fd);
		fd = e;
	}
	freeaddrinfo(res);
	return fd;
}
