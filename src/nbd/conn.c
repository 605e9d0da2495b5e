/*
 * One NBD connection on its I/O thread: reading and parsing, a coroutine
 * per request, gathered replies, bounds, and the end of the connection.
 *
 * Problem.  A client pipelines many requests, a hostile one sends garbage,
 * never reads or stalls mid-message; per request the server must spend as
 * little CPU as possible (the client competes for the same cores), and no
 * client may hurt another.
 *
 * Design.
 * - A connection lives on one I/O thread at a time (server.c hands it
 *   over with a task; an export's own loop takes it after the handshake,
 *   "The move"): fd handlers, a bottom half, timers, coroutines, no lock.
 * - Reading: recv() as much as fits and parse every complete request in
 *   it (transmission.c); a short recv means the socket is empty.  A WRITE
 *   payload still arriving goes into a tmpfs image's map (wmap_begin(),
 *   whole blocks from 4 KiB), a large one's buffer, or a pipe.
 * - Resting (rest_maybe()): with the socket empty, every reply out and 8
 *   or more unread by a Unix-socket client (SIOCOUTQ), the client is the
 *   bottleneck: stop reading for rest_ns, then take a batch.
 * - One pool coroutine per request runs it and queues the reply; replies
 *   go out in one sendmsg() of up to 64 iovecs per parse batch or bottom
 *   half.  READ data is read into the reply's buffer, lent by a tmpfs
 *   image's map (map_reads), or spliced into a pipe (zc_read_min).
 * - Bounds: max_inflight requests and IOC_NBD_INFLIGHT_BYTES of payload,
 *   beyond which the connection stops reading, so a client that never
 *   reads stalls only itself; a handshake deadline; a protocol violation
 *   closes the connection.
 * - TLS (tls.c): the same handlers run the GnuTLS handshake and records;
 *   bytes GnuTLS already decrypted raise no event, so the bottom half
 *   comes back for them.
 * - The end: EOF or NBD_CMD_DISC stop reading; freed once every request
 *   is answered or dropped.
 *
 * Rejected (bench/nbd/NOTES.md): a coroutine per connection reading in a
 * loop (QEMU: a switch per request, a stack per idle client); a sendmsg
 * per reply; edge-triggered sockets; reads through io_uring; MSG_ZEROCOPY
 * (Unix sockets refuse it); resting on TCP (SIOCOUTQ counts unacked bytes).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "iocore/co.h"
#include "nbd-int.h"
#include "node/node.h"
#include "util/list.h"

#define IOC_NBD_IN_CAP          (128u << 10)
#define IOC_NBD_INFLIGHT_BYTES  (64u << 20)
#define IOC_NBD_SEND_IOV        64
#define IOC_NBD_SOCK_BUF        (2 << 20)
#define IOC_NBD_FREE_REQS       64
#define IOC_NBD_FLUSH_EVERY     16
#define IOC_NBD_KEEP_BUF        (1u << 20)
#define IOC_NBD_DIRECT_MIN      (16u << 10) /* payload left: recv it directly */
#define IOC_NBD_WMAP_MIN        4096u       /* payload left: recv it into the mapping */
#define IOC_NBD_REST_REPLIES    8      /* unread replies: the client is busy */
#define IOC_NBD_REST_RING       (IOC_NBD_REST_REPLIES + 1)
#define IOC_NBD_REST_SLACK      (64u << 10) /* see client_busy() */
#define IOC_NBD_REST_START_NS   50000  /* a rest's first length */
#define IOC_NBD_REST_MIN_NS     25000  /* shorter: stop resting a while */
#define IOC_NBD_REST_OFF_NS     100000000 /* the first pause in resting */
#define IOC_NBD_REST_OFF_SHIFT  4      /* pauses double up to 16x */
#define IOC_NBD_REQ_HS          0xffff /* a request carrying handshake output */
#define IOC_NBD_TLS_RECORD      16384  /* TLS's largest record payload */
#define IOC_NBD_PIPES           16     /* zero-copy pipes per connection */
#define IOC_NBD_KEEP_PIPES      8      /* of which kept idle */

struct conn {
	struct ioc__nbd_conn core;
	struct ioc__nbd_export *counted; /* the export counted as chosen */
	struct ioc_task start_task;     /* hand-offs: from the accepting
					 * thread, then to its export's loop */
	struct ioc_task kill_task;      /* shutdown grace expired */
	struct nbd_thread *t;
	struct conn *next, *prev;       /* the thread's connections */
	int fd;
	struct ioc_timer hs_timer;
	struct ioc_bh *bh;              /* send replies, resume, reap */
	struct ioc__nbd_req *sq_head, **sq_tail; /* replies to send, in order */
	struct ioc__nbd_req *free_reqs;
	unsigned nfree;
	unsigned queued;                /* replies queued since the last flush */
	unsigned inflight;              /* parsed, reply not fully sent */
	uint64_t inflight_bytes;
	bool reg_read, reg_write;       /* current fd handler registration */
	bool want_write;                /* socket full, replies waiting */
	bool stalled;                   /* stopped parsing at a bound */
	bool eof;                       /* read nothing more */
	bool draining;                  /* server stopping: read until empty */
	bool dead;                      /* socket unusable: drop replies */
	bool started;                   /* registered with the loop */
	bool hdr_first;                 /* a payload came in directly: receive
					 * the next request's header alone */
	bool zc_wr_off;                 /* the socket refused to splice out */
	/* The partial WRITE's payload goes into the image's mapping here
	 * (map_write; NULL: not now): see wmap_begin(). */
	uint8_t *wmap;
	/* Its payload's bytes from wmap_from to partial_got wait in the
	 * request's buf (wmap_held) until their block is whole. */
	uint64_t wmap_from;
	bool wmap_held;
	int wmap_err;                   /* a held block failed to store */
	struct ioc_node_cut wmap_cut;   /* inside the node while wmap is set */

	/* Resting (see rest_maybe()): reading paused for rest_ns while the
	 * client has a backlog of our replies to read. */
	struct ioc_timer rest_timer;
	bool rest_unix;                 /* AF_UNIX: SIOCOUTQ counts unread bytes */
	bool resting;                   /* rest_timer pending, not reading */
	bool rest_again;                /* the last rest left the client busy */
	bool rested;                    /* conn_process() after a rest */
	bool behind;                    /* resting: lend small reads too */
	bool emptied;                   /* tx_process() found the socket empty */
	bool rx_big;                    /* ... and took a large WRITE's payload */
	unsigned rx_reqs;               /* ... and this many requests */
	unsigned rest_off_shift;        /* pauses in a row */
	uint32_t rest_ns;
	int64_t rest_off_until;         /* no rest before this (ns) */
	uint64_t sent_bytes;            /* in the clear, all sent */
	uint64_t reply_end[IOC_NBD_REST_RING]; /* where the last replies end */
	unsigned reply_n;               /* replies sent */

	/* TLS (tls.c).  STARTTLS queues its ACK in the clear (ACKED); once
	 * the ACK is out, the handshake (HANDSHAKE); then every byte goes
	 * through the session (ON). */
	enum { TLS_NONE, TLS_ACKED, TLS_HANDSHAKE, TLS_ON } tls_state;
	struct ioc__nbd_tls *tls;
	bool tls_want_write;            /* GnuTLS waits to write */
	uint8_t *tls_out;               /* plaintext handed to GnuTLS: one record */
	size_t tls_out_off, tls_out_len;

	/* Zero-copy reads: idle pipes, and how many are open in all. */
	struct ioc__nbd_pipe *pipes;
	unsigned npipes, nfree_pipes;
	size_t pipe_refused;            /* a pipe size the kernel refused, or 0 */
	size_t page;

	struct ioc__nbd_stats st;       /* this connection's requests */
};


static void conn_process(struct conn *c);
static void conn_maybe_reap(struct conn *c);


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

/* ---- zero-copy pipes ----------------------------------------------------------- */

static void pipe_close(struct conn *c, struct ioc__nbd_pipe *p)
{
	close(p->rfd);
	close(p->wfd);
	free(p);
	c->npipes--;
}

/* A pipe for r's data: every page the read touches takes one slot. */
static struct ioc__nbd_pipe *zc_get(struct ioc__nbd_req *r)
{
	struct conn *c = r->transport;
	size_t need = (size_t)((r->offset & (c->page - 1)) + r->len + c->page - 1) &
		      ~(c->page - 1);
	struct ioc__nbd_pipe **pp, *p;
	int fds[2];

	for (pp = &c->pipes; (p = *pp); pp = &p->next) {
		if (p->cap >= need) {
			*pp = p->next;
			c->nfree_pipes--;
			return p;
		}
	}
	if (c->npipes >= IOC_NBD_PIPES || (c->pipe_refused && need >= c->pipe_refused))
		return NULL;
	if (!(p = malloc(sizeof(*p))))
		return NULL;
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		free(p);
		return NULL;
	}
	/* Beyond fs.pipe-max-size, or the user's pipe pages, the kernel
	 * refuses: such reads (and larger ones) are copied from then on. */
	int got = need > INT_MAX ? -1 : fcntl(fds[1], F_SETPIPE_SZ, (int)need);
	if (got < 0 || (size_t)got < need) {
		c->pipe_refused = need;
		close(fds[0]);
		close(fds[1]);
		free(p);
		return NULL;
	}
	p->rfd = fds[0];
	p->wfd = fds[1];
	p->cap = (size_t)got;
	p->fill = 0;
	c->npipes++;
	return p;
}

/* A pipe back from a request; one still holding data is closed. */
static void zc_put(struct ioc__nbd_req *r, struct ioc__nbd_pipe *p)
{
	struct conn *c = r->transport;

	if (p->fill || c->nfree_pipes >= IOC_NBD_KEEP_PIPES) {
		pipe_close(c, p);
		return;
	}
	p->next = c->pipes;
	c->pipes = p;
	c->nfree_pipes++;
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
	r->mapped = false; /* a recycled request lends nothing */
	r->wmap_len = 0;
	r->wmap_tried = false;
	if (r->pipe) {
		zc_put(r, r->pipe);
		r->pipe = NULL;
	}
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
	c->queued++;
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
	c->tls_out_len = 0;
	c->tls_want_write = false;
	shutdown(c->fd, SHUT_RDWR);
	while (c->sq_head) {
		struct ioc__nbd_req *r = c->sq_head;
		c->sq_head = r->next;
		req_release(c, r);
	}
	c->sq_tail = &c->sq_head;
}

/* The client broke the protocol, or its connection failed (st < 0): say
 * so, after what (a prefix such as "handshake: "), and kill it. */
static void conn_refuse(struct conn *c, const char *what, int st)
{
	ioc__nbd_log(c->t->srv, "%s: %s%s", c->core.peer, what,
		     st == -EPROTO ? "protocol violation" : strerror(-st));
	conn_kill(c);
}

/* Where each reply that bytes completes ends in the byte stream: see
 * client_busy().  Before ioc__nbd_sent() moves the iovecs on. */
static void note_sent(struct conn *c, size_t bytes)
{
	uint64_t pos = c->sent_bytes;
	size_t left = bytes;

	for (struct ioc__nbd_req *r = c->sq_head; r && left; r = r->next) {
		size_t rem = 0;

		for (int i = r->iov_done; i < r->iovcnt; i++)
			rem += r->iov[i].iov_len;
		rem -= r->iov_off;
		if (rem > left)
			break;
		left -= rem;
		pos += rem;
		c->reply_end[c->reply_n++ % IOC_NBD_REST_RING] = pos;
	}
	c->sent_bytes += bytes;
}

static void release_sent(struct conn *c, size_t bytes)
{
	if (c->rest_unix && c->tls_state == TLS_NONE)
		note_sent(c, bytes);
	unsigned done = ioc__nbd_sent(c->sq_head, bytes);

	while (done--) {
		struct ioc__nbd_req *r = c->sq_head;
		c->sq_head = r->next;
		req_release(c, r);
	}
}

/* Over TLS: hand GnuTLS up to one record of queued replies, gathered into
 * tls_out.  The staged bytes are always the next unsent bytes of the
 * queue, so they are accounted (and the requests released) only once
 * GnuTLS took them; after -EAGAIN the same buffer goes again. */
static ssize_t send_tls(struct conn *c, const char **msg)
{
	if (!c->tls_out_len) {
		struct iovec iov[IOC_NBD_SEND_IOV];
		int n = ioc__nbd_gather(c->sq_head, iov, IOC_NBD_SEND_IOV);
		size_t len = 0;

		for (int i = 0; i < n && len < IOC_NBD_TLS_RECORD; i++) {
			size_t k = iov[i].iov_len;

			if (k > IOC_NBD_TLS_RECORD - len)
				k = IOC_NBD_TLS_RECORD - len;
			memcpy(c->tls_out + len, iov[i].iov_base, k);
			len += k;
		}
		c->tls_out_off = 0;
		c->tls_out_len = len;
	}
	ssize_t s = ioc__nbd_tls_send(c->tls, c->tls_out + c->tls_out_off,
				      c->tls_out_len, msg);
	if (s > 0) {
		c->tls_out_off += (size_t)s;
		c->tls_out_len -= (size_t)s;
	}
	return s;
}

/* The socket refused splice(2) (EINVAL, EOPNOTSUPP): read what is left
 * of r's pipe into r->buf, where the reply iovec then points, and copy
 * from now on on this connection.  Returns 0 (nothing sent) or -errno. */
static ssize_t pipe_to_buf(struct conn *c, struct ioc__nbd_req *r, const char **msg)
{
	struct iovec *v = &r->iov[r->iov_done];
	size_t at = r->iov_off, left = v->iov_len - at;

	while (left) {
		ssize_t n = read(r->pipe->rfd, r->buf + at, left);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			*msg = "reply data lost from its pipe";
			return -EIO;
		}
		at += (size_t)n;
		left -= (size_t)n;
	}
	ioc__nbd_log(c->t->srv, "%s: splice to the socket refused: copying", c->core.peer);
	v->iov_base = r->buf;
	r->pipe->fill = 0;
	zc_put(r, r->pipe);
	r->pipe = NULL;
	c->core.zc_read_min = 0;
	return 0;
}

/* splice(2) between the socket and a pipe, resumed after EINTR; refused
 * with EINVAL where a test asks for a socket without splice. */
static ssize_t sock_splice(struct conn *c, int fd_in, int fd_out, size_t len,
			   unsigned flags)
{
	ssize_t n;

	if (c->t->srv->zc_refuse) {
		errno = EINVAL;
		return -1;
	}
	do
		n = splice(fd_in, NULL, fd_out, NULL, len, flags);
	while (n < 0 && errno == EINTR);
	return n;
}

/* The head request's data, from its pipe to the socket. */
static ssize_t send_pipe(struct conn *c, struct ioc__nbd_req *r, const char **msg)
{
	size_t left = r->iov[r->iov_done].iov_len - r->iov_off;
	unsigned fl = SPLICE_F_NONBLOCK | (r->next ? SPLICE_F_MORE : 0);

	ssize_t s = sock_splice(c, r->pipe->rfd, c->fd, left, fl);

	if (s > 0) {
		r->pipe->fill -= (size_t)s;
		return s;
	}
	if (s < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return -EAGAIN;
	if (s < 0 && (errno == EINVAL || errno == EOPNOTSUPP))
		return pipe_to_buf(c, r, msg);
	*msg = s == 0 ? "reply data lost from its pipe" : strerror(errno);
	return s == 0 ? -EIO : -errno;
}

/* In the clear: as many queued replies as one sendmsg takes, up to the
 * first whose data waits in a pipe; that data then goes by splice(2). */
static ssize_t send_plain(struct conn *c, const char **msg)
{
	struct iovec iov[IOC_NBD_SEND_IOV];
	bool at_pipe;

	if (ioc__nbd_at_pipe(c->sq_head))
		return send_pipe(c, c->sq_head, msg);

	int n = ioc__nbd_gather_upto_pipe(c->sq_head, iov, IOC_NBD_SEND_IOV, &at_pipe);
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)n };

	for (;;) {
		/* MSG_MORE: a header whose data follows by splice is not
		 * pushed out alone (TCP). */
		ssize_t s = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT |
				    (at_pipe ? MSG_MORE : 0));

		if (s >= 0)
			return s;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		if (errno == EFAULT) {
			/* Data lent from the image's mapping, cut short
			 * underneath: read it the ordinary way, then send
			 * again (0 bytes sent, conn_flush() comes back). */
			int k = ioc__nbd_unmap_reads(&c->core, c->sq_head);

			if (k > 0)
				return 0;
			errno = k < 0 ? -k : EFAULT;
		}
		*msg = strerror(errno);
		return -errno;
	}
}

/* Send queued replies until the socket is full or the queue empty. */
static void conn_flush(struct conn *c)
{
	while (c->sq_head && !c->dead) {
		const char *msg = NULL;
		ssize_t s = c->tls_state == TLS_ON ? send_tls(c, &msg) : send_plain(c, &msg);

		if (s == -EAGAIN) {
			c->want_write = true;
			return;
		}
		if (s < 0) {
			ioc__nbd_log(c->t->srv, "%s: %ssend: %s", c->core.peer,
				     c->tls_state == TLS_ON ? "TLS " : "", msg);
			conn_kill(c);
			return;
		}
		release_sent(c, (size_t)s);
	}
	if (!c->sq_head)
		c->sq_tail = &c->sq_head;
	c->want_write = false;
	c->queued = 0;
}

static void on_read(void *opaque);
static void on_write(void *opaque);

static void update_handlers(struct conn *c)
{
	/* Not while STARTTLS's ACK waits to go out, nor while GnuTLS waits
	 * to write: input then cannot be consumed, and a readable socket
	 * would fire again and again. */
	bool r = !c->eof && !c->dead && !conn_bounded(c) && !c->resting &&
		 c->tls_state != TLS_ACKED && !c->tls_want_write;
	bool w = (c->want_write || c->tls_want_write) && !c->dead;

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

/* After an event: the fd's handlers as the state now wants, and a finished
 * connection reaped. */
static void conn_settle(struct conn *c)
{
	update_handlers(c);
	conn_maybe_reap(c);
}

/* ---- request coroutines ------------------------------------------------------- */

/* ---- statistics ------------------------------------------------------------- */

static void st_add(_Atomic uint64_t *p, uint64_t v)
{
	/* Relaxed load + store: this thread is the only writer; the control
	 * thread reads a statistic. */
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

void ioc__nbd_stats_account(struct ioc__nbd_stats *st, const struct ioc__nbd_req *r,
			    int64_t ns)
{
	int k;

	switch (r->type) {
	case NBD_CMD_READ: k = IOC_NBD_OP_READ; break;
	case NBD_CMD_WRITE: k = IOC_NBD_OP_WRITE; break;
	case NBD_CMD_FLUSH: k = IOC_NBD_OP_FLUSH; break;
	case NBD_CMD_TRIM: k = IOC_NBD_OP_TRIM; break;
	case NBD_CMD_WRITE_ZEROES: k = IOC_NBD_OP_ZERO; break;
	case NBD_CMD_BLOCK_STATUS: k = IOC_NBD_OP_STATUS; break;
	case NBD_CMD_CACHE: k = IOC_NBD_OP_CACHE; break;
	default: return;
	}
	st_add(&st->op[k].ops, 1);
	if (r->failed) {
		st_add(&st->op[k].failed, 1);
		return;
	}
	if (k != IOC_NBD_OP_FLUSH)
		st_add(&st->op[k].bytes, r->len);
	st_add(&st->op[k].ns, ns > 0 ? (uint64_t)ns : 0);
	if (k == IOC_NBD_OP_WRITE &&
	    r->offset + r->len > atomic_load_explicit(&st->wr_highest, memory_order_relaxed))
		atomic_store_explicit(&st->wr_highest, r->offset + r->len,
				      memory_order_relaxed);
}

static void account(struct conn *c, const struct ioc__nbd_req *r, int64_t ns)
{
	/* The export's counters are its node's (the node layer's). */
	ioc__nbd_stats_account(&c->st, r, ns);
}

unsigned ioc__nbd_thread_conn_info(struct nbd_thread *t, struct ioc_nbd_conn_info *out,
				   unsigned max)
{
	unsigned n = 0;

	for (struct conn *c = t->conns; c && n < max; c = c->next, n++) {
		struct ioc_nbd_conn_info *ci = &out[n];

		memset(ci, 0, sizeof(*ci));
		snprintf(ci->peer, sizeof(ci->peer), "%s", c->core.peer);
		if (c->core.exp)
			snprintf(ci->export_name, sizeof(ci->export_name), "%s",
				 c->core.exp->name);
		ci->thread = t->placed ? -1 : (int)(t - t->srv->threads);
		ci->thread_id = (long)syscall(SYS_gettid); /* we run on t */
		ci->transmission = c->core.phase == IOC_NBD_PHASE_TRANSMISSION;
		ci->tls = c->tls_state == TLS_ON;
		ci->inflight = c->inflight;
		/* relaxed: counters this thread writes (we run on it). */
		for (int k = 0; k < IOC_NBD_OP_N; k++) {
			ci->op[k].ops = atomic_load_explicit(&c->st.op[k].ops, memory_order_relaxed);
			ci->op[k].bytes = atomic_load_explicit(&c->st.op[k].bytes,
							       memory_order_relaxed);
			ci->op[k].failed = atomic_load_explicit(&c->st.op[k].failed,
								memory_order_relaxed);
			ci->op[k].ns = atomic_load_explicit(&c->st.op[k].ns, memory_order_relaxed);
		}
	}
	return n;
}

int ioc__nbd_thread_kill_export(struct nbd_thread *t, const struct ioc__nbd_export *e)
{
	int n = 0;

	for (struct conn *c = t->conns, *next; c; c = next) {
		next = c->next;
		if (c->core.exp != e && c->counted != e)
			continue;
		n++;
		conn_kill(c);
		conn_settle(c);
	}
	return n;
}

/* Connections still in the handshake are closed; the others read what
 * is already there, answer it, and close.  I/O thread. */
static void thread_drain_conns(struct nbd_thread *t)
{
	for (struct conn *c = t->conns, *next; c; c = next) {
		next = c->next;
		if (c->core.phase != IOC_NBD_PHASE_TRANSMISSION) {
			conn_kill(c);
			conn_settle(c);
			continue;
		}
		c->draining = true;
		conn_process(c);
	}
}

/* ---- the drain -------------------------------------------------------------
 *
 * Every request that reaches the node is inside it (ioc_node_co_enter()
 * to ioc_node_leave(), src/node/drain.c), so a node's drain (a migration's
 * switch-over, a notifier's removal) holds and waits for NBD clients as
 * for every other front end: a held request waits in the node layer, a
 * shut node answers NBD_ESHUTDOWN.  A payload received into the mapping
 * changes the image before its request runs: it enters without waiting
 * and a HOLD or SHUT cuts it short (wmap_cut()).  Telling the clients to
 * go once the destination of a migration has the image is the server's
 * (ioc_nbd_server_retire()): connections finish what they received and
 * close. */

static void retire_task(struct ioc_task *task)
{
	struct nbd_thread *t = ioc_container_of(task, struct nbd_thread, retire_task);

	thread_drain_conns(t); /* as at a server stop */
	ioc__latch_report(&t->srv->retired);
}

void ioc_nbd_server_retire(struct ioc_nbd_server *srv)
{
	unsigned n = 0;

	/* seq_cst, as the stop's store of stopping: see conn_arrive(). */
	atomic_store_explicit(&srv->retiring, true, memory_order_seq_cst);
	ioc__nbd_close_listeners(srv);
	if (!srv->nthreads)
		return;
	for (unsigned i = 0; i < ioc__nbd_threads_end(srv); i++)
		n += ioc__nbd_thread_at(srv, i) != NULL;
	ioc__latch_set(&srv->retired, n);
	for (unsigned i = 0; i < ioc__nbd_threads_end(srv); i++) {
		struct nbd_thread *t = ioc__nbd_thread_at(srv, i);

		if (t) {
			t->retire_task.fn = retire_task;
			ioc_loop_post(t->loop, &t->retire_task);
		}
	}
	ioc__latch_wait(&srv->retired, 0);
}

/* Small reads are lent from the image's mapping only while the thread
 * serves more than one connection (transmission.c, map_small): O(conns),
 * at connect and close only. */
static void conn_map_policy(struct conn *c)
{
	c->core.map_small = c->t->map_shared || c->t->srv->map_all || c->behind;
}

static void thread_map_policy(struct nbd_thread *t)
{
	t->map_shared = t->conns && t->conns->next;
	for (struct conn *c = t->conns; c; c = c->next)
		conn_map_policy(c);
}

static void ioc_coroutine_fn req_co(void *opaque)
{
	struct ioc__nbd_req *r = opaque;
	struct conn *c = r->transport;
	struct nbd_thread *t = c->t;
	struct ioc_node *n = c->core.exp->node;
	int64_t t0, t1;

	/* The hot path's one gate check (see "the drain" above). */
	if (ioc_node_co_enter(n) < 0) {
		ioc__nbd_reply_error(&c->core, r, NBD_ESHUTDOWN, "server is shutting down");
		account(c, r, 0);
		queue_reply(c, r);
		return;
	}
	/* One clock read per request: a request parsed right after one that
	 * finished inline starts where that one ended (t->clk, the parse of
	 * its header in between); anything else reads the clock. */
	t0 = t->clk ? t->clk : ioc_now_ns();
	t->clk = 0;
	ioc__nbd_execute(&c->core, r);
	t1 = ioc_now_ns();
	account(c, r, t1 - t0);
	ioc_node_leave(n);
	queue_reply(c, r);
	t->clk = t1;
}

static void start_request(struct conn *c, struct ioc__nbd_req *r)
{
	struct nbd_thread *t = c->t;

	c->inflight++;
	c->inflight_bytes += req_bytes(r);
	if (r->type == NBD_CMD_WRITE && r->len >= IOC_NBD_DIRECT_MIN)
		c->rx_big = true; /* see rest_maybe() */
	c->rx_reqs++;
	/* relaxed: a statistic; only this thread writes it. */
	atomic_store_explicit(&t->requests,
			      atomic_load_explicit(&t->requests, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	if (r->type == NBD_CMD_DISC || r->error) {
		ioc__nbd_execute(&c->core, r); /* no backend call: builds the reply */
		account(c, r, 0);
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

/* Bytes received, 0 at EOF, or -errno (-EAGAIN: nothing now).  A TLS
 * failure is logged here and comes back as -EPROTO. */
static ssize_t conn_recv(struct conn *c, void *buf, size_t len)
{
	if (c->tls_state == TLS_ON) {
		const char *msg = NULL;
		bool ww = false;
		ssize_t n = ioc__nbd_tls_recv(c->tls, buf, len, &ww, &msg);

		if (n == -EAGAIN)
			c->tls_want_write = ww;
		else if (n == -EPROTO)
			ioc__nbd_log(c->t->srv, "%s: TLS: %s", c->core.peer, msg);
		return n;
	}
	for (;;) {
		ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
		if (n >= 0 || errno != EINTR)
			return n < 0 ? -errno : n;
	}
}

/* In the clear: the rest of a payload into buf and, in the same recvmsg,
 * up to hlen bytes after it (the next request's header) into hdr, so a
 * stream of large WRITEs costs one recvmsg each and no memcpy.  Bytes
 * received in all, 0 at EOF, or -errno. */
static ssize_t conn_recv_hdr(struct conn *c, void *buf, size_t len, void *hdr, size_t hlen)
{
	struct iovec iov[2] = { { buf, len }, { hdr, hlen } };
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };

	for (;;) {
		ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT);
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
	if (!(n == -EPROTO && c->tls_state == TLS_ON)) /* TLS: logged already */
		ioc__nbd_log(c->t->srv, "%s: recv: %s", c->core.peer, strerror((int)-n));
	conn_kill(c);
	return true;
}

/* The STARTTLS ACK is out: start the session.  Handshake input can only
 * come now (handshake.c refused anything sent behind STARTTLS). */
static void tls_begin(struct conn *c)
{
	const char *msg = NULL;
	int r = ioc__nbd_tls_new(&c->tls, c->t->srv->tls, c->fd, &msg);

	if (r == 0 && !(c->tls_out = malloc(IOC_NBD_TLS_RECORD))) {
		r = -ENOMEM;
		msg = "out of memory";
	}
	if (r < 0) {
		ioc__nbd_log(c->t->srv, "%s: TLS: %s", c->core.peer, msg);
		conn_kill(c);
		return;
	}
	c->tls_state = TLS_HANDSHAKE;
}

/* One go at the TLS handshake.  True once it is done. */
static bool tls_handshake(struct conn *c)
{
	const char *msg = NULL;
	bool ww = false;
	int r = ioc__nbd_tls_handshake(c->tls, &ww, &msg);

	if (r == -EAGAIN) {
		c->tls_want_write = ww;
		return false;
	}
	c->tls_want_write = false;
	if (r < 0) {
		ioc__nbd_log(c->t->srv, "%s: TLS handshake failed: %s", c->core.peer, msg);
		conn_kill(c);
		return false;
	}
	c->tls_state = TLS_ON;
	if (c->t->srv->opts.log) {
		char desc[192];

		ioc__nbd_tls_describe(c->tls, desc, sizeof(desc));
		ioc__nbd_log(c->t->srv, "%s: TLS started: %s", c->core.peer, desc);
	}
	ioc__nbd_tls_started(&c->core);
	return true;
}

static void hs_process(struct conn *c)
{
	struct ioc__nbd_conn *core = &c->core;

	while (!c->eof && !c->dead) {
		if (c->tls_state == TLS_ACKED)
			return; /* conn_process() starts TLS once the ACK is out */
		if (c->tls_state == TLS_HANDSHAKE && !tls_handshake(c))
			return;
		int st = ioc__nbd_hs_step(core);
		if (queue_hs_output(c) < 0) {
			conn_kill(c);
			return;
		}
		if (st == IOC_NBD_STARTTLS) {
			c->tls_state = TLS_ACKED;
			return;
		}
		if (st == IOC_NBD_READY) {
			ioc_timer_cancel(&c->hs_timer);
			ioc__nbd_log(c->t->srv, "%s: export \"%s\"%s%s", core->peer, core->exp->name,
			     core->structured ? ", structured replies" : "",
			     core->extended ? ", extended headers" : "");
			return;
		}
		if (st == IOC_NBD_CLOSE) {
			c->eof = true; /* ABORT: close once the ACK is sent */
			return;
		}
		if (st < 0) {
			conn_refuse(c, "handshake: ", st);
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
			ioc__nbd_log(c->t->srv, "%s: closed during handshake", core->peer);
		if (n == 0 || (n != -EAGAIN && n != -EWOULDBLOCK)) {
			conn_kill(c);
			return;
		}
		handle_recv_end(c, n);
		return;
	}
}

/* A large WRITE's payload may be spliced from the socket into a pipe
 * (page references, no copy) and written from there with one copy. */
static bool zc_write_ok(const struct conn *c, const struct ioc__nbd_req *p)
{
	const struct ioc__nbd_export *e = c->core.exp;

	/* A zero length asks the backend whether it would write this. */
	return p->type == NBD_CMD_WRITE && c->core.zc_write_min && p->len >= c->core.zc_write_min &&
	       c->tls_state == TLS_NONE && !c->zc_wr_off && e->ops->splice_write &&
	       e->ops->splice_write(e->be, p->offset, 0, -1,
				    (p->flags & NBD_CMD_FLAG_FUA) ? IOC_NBD_BE_FUA : 0) == 0;
}

/*
 * A WRITE's payload of a block or more not yet received may instead be
 * received straight into the image's mapping (map_write): the kernel's one
 * copy lands in the page cache, and no pwritev follows.  From 4 KiB
 * (IOC_NBD_WMAP_MIN), not only from IOC_NBD_DIRECT_MIN: QEMU's client
 * writing 4 KiB blocks then costs a FIONREAD and a recvmsg per write where
 * it cost a pwritev and a share of a batched recv (the A/B runs are in
 * bench/nbd/NOTES.md); fio's small writes
 * mostly arrive whole in a batch and go the old way.  The bytes change the
 * image as they arrive, before the request runs, so from here until
 * wmap_end() the request is inside the node (ioc_node_enter_cut()): a
 * HOLD or SHUT ends it early (wmap_cut()), the rest of the payload then
 * going to buf and written the ordinary way.  Whole blocks
 * only: each receive asks for what the socket holds (FIONREAD) cut at a
 * block boundary of the image, and a block's first part that arrived
 * without its end waits in buf until it is whole, so a client that hangs
 * up in the middle of a payload leaves no block of it torn (the whole
 * blocks that arrived are written).  What came before (with the header,
 * now in buf) is stored at the start the same way.  Only in the clear (the
 * kernel copies: a file cut short is an EFAULT, not a SIGBUS).
 */
#define IOC_NBD_WMAP_BLOCK 4096u

#ifdef IOC_TSAN
/* ThreadSanitizer's dynamic annotations (see wmap_recv()). */
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#endif

static void wmap_begin(struct conn *c, struct ioc__nbd_req *p)
{
	const struct ioc__nbd_export *e = c->core.exp;
	struct nbd_thread *t = c->t;
	uint64_t got = c->core.partial_got, whole;

	if (p->wmap_tried)
		return;
	p->wmap_tried = true;
	if (p->type != NBD_CMD_WRITE || !t->srv->map_writes ||
	    p->len - got < IOC_NBD_WMAP_MIN ||
	    c->tls_state != TLS_NONE || !e->ops->map_write || !e->ops->map_store ||
	    !ioc_node_enter_cut(e->node, &c->wmap_cut))
		return;
	c->wmap = e->ops->map_write(e->be, p->offset, (size_t)p->len,
				    (p->flags & NBD_CMD_FLAG_FUA) && e->can_fua ?
				    IOC_NBD_BE_FUA : 0);
	if (!c->wmap) {
		ioc_node_leave_cut(e->node, &c->wmap_cut);
		return;
	}
	c->wmap_err = 0;
	/* What came with the header (in buf): its whole blocks now, the
	 * rest held. */
	whole = (p->offset + got) / IOC_NBD_WMAP_BLOCK * IOC_NBD_WMAP_BLOCK;
	whole = whole > p->offset ? whole - p->offset : 0;
	if (whole)
		c->wmap_err = e->ops->map_store(e->be, p->offset, p->buf, (size_t)whole);
	c->wmap_held = got > whole;
	c->wmap_from = whole;
}

/* No more of p's payload goes into the mapping: what is there (all of it
 * before a held block) is marked (dirty bitmaps), the rest comes from buf,
 * and the request leaves the node. */
static void wmap_end(struct conn *c, struct ioc__nbd_req *p, uint64_t got)
{
	const struct ioc__nbd_export *e = c->core.exp;
	uint64_t in = c->wmap_held ? c->wmap_from : got;
	int ret = in ? e->ops->map_written(e->be, p->offset, (size_t)in) : 0;

	p->wmap_len = in;
	p->wmap_ret = c->wmap_err ? c->wmap_err : ret;
	c->wmap = NULL;
	ioc_node_leave_cut(e->node, &c->wmap_cut);
}

/* A HOLD or SHUT of the node (on this thread): a payload arriving into
 * the mapping stops there, its bytes so far count as written, the rest
 * waits in buf for the gate. */
static void wmap_cut(struct ioc_node_cut *cut)
{
	struct conn *c = ioc_container_of(cut, struct conn, wmap_cut);

	wmap_end(c, c->core.partial, c->core.partial_got);
}

/* One receive of p's payload into the mapping (whole blocks) and buf (a
 * block's first part), and with the payload's end the next header into
 * in[] (as conn_recv_hdr()).  Bytes received in all, 0 at EOF or -errno;
 * *take: how many of them were asked for as payload. */
static ssize_t wmap_recv(struct conn *c, struct ioc__nbd_req *p, size_t hsz, size_t *take)
{
	struct ioc__nbd_conn *core = &c->core;
	const struct ioc__nbd_export *e = core->exp;
	const uint64_t B = IOC_NBD_WMAP_BLOCK;
	uint64_t got = core->partial_got, want = p->len - got, end, mid, nb = got;
	struct iovec iov[4];
	struct msghdr m = { .msg_iov = iov };
	int avail = 0;
	ssize_t n;

	*take = 0;
	for (;;) {
		if (ioctl(c->fd, FIONREAD, &avail) < 0)
			return -errno;
		if (avail > 0)
			break;
		/* Nothing there, says FIONREAD.  A receive into the mapping
		 * now could take a block's first part that arrives meanwhile,
		 * which a hang-up would leave torn: peek instead.  EAGAIN:
		 * wait; 0: the client is gone; a byte: look again. */
		do {
			n = recv(c->fd, &(char){ 0 }, 1, MSG_PEEK | MSG_DONTWAIT);
		} while (n < 0 && errno == EINTR);
		if (n <= 0)
			return n < 0 ? -errno : 0;
	}
	if ((uint64_t)avail >= want)
		avail = 0; /* all of it, the payload's last block too */
	end = avail ? got + (uint64_t)avail : p->len;
	/* [got, nb): the held block's rest, into buf; [nb, mid): whole
	 * blocks, into the mapping; [mid, end): a block's first part. */
	if (c->wmap_held) {
		nb = ((p->offset + c->wmap_from) / B + 1) * B - p->offset;
		if (nb > end)
			nb = end;
		iov[m.msg_iovlen++] = (struct iovec){ p->buf + got, (size_t)(nb - got) };
	}
	mid = end;
	if (end != p->len) {
		uint64_t edge = (p->offset + end) / B * B; /* in the image */

		mid = edge > p->offset + nb ? edge - p->offset : nb;
	}
	if (mid > nb)
		iov[m.msg_iovlen++] = (struct iovec){ c->wmap + nb, (size_t)(mid - nb) };
	if (end > mid)
		iov[m.msg_iovlen++] = (struct iovec){ p->buf + mid, (size_t)(end - mid) };
	if (end == p->len && hsz) {
		ioc__nbd_conn_compact(core);
		iov[m.msg_iovlen++] = (struct iovec){ core->in + core->in_end, hsz };
	}
	*take = (size_t)(end - got);
	/* The mapping is only ever touched by the kernel's copies (this
	 * receive, the sendmsg of lent replies, map_store's pwrite), never by
	 * loads and stores of ours.  ThreadSanitizer models the receive as
	 * stores of this thread, and two connections' copies of one range,
	 * ordered only through their client, as a race: leave them out. */
#ifdef IOC_TSAN
	AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
	do {
		n = recvmsg(c->fd, &m, MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
#ifdef IOC_TSAN
	AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
#endif
	if (n <= 0)
		return n < 0 ? -errno : 0;
	got += (uint64_t)n < *take ? (uint64_t)n : *take;
	if (c->wmap_held && got >= nb && (nb == p->len || (p->offset + nb) % B == 0)) {
		/* The held block is whole (or the payload's end): store it. */
		int r = e->ops->map_store(e->be, p->offset + c->wmap_from,
					  p->buf + c->wmap_from, (size_t)(nb - c->wmap_from));

		if (r < 0 && !c->wmap_err)
			c->wmap_err = r;
		c->wmap_held = false;
	}
	if (!c->wmap_held && got > mid) {
		c->wmap_held = true;
		c->wmap_from = mid;
	}
	return n;
}

/* Move what p's pipe holds (all of the payload received so far) into
 * p->buf and give the pipe back: the payload goes on the ordinary way. */
static ssize_t pipe_back_to_buf(struct conn *c, struct ioc__nbd_req *p)
{
	size_t got = 0, want = (size_t)c->core.partial_got;

	while (got < want) {
		ssize_t n = read(p->pipe->rfd, p->buf + got, want - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO;
		got += (size_t)n;
	}
	p->pipe->fill = 0;
	zc_put(p, p->pipe);
	p->pipe = NULL;
	return -ENOTSUP;
}

/* Splice up to want bytes of p's payload from the socket into its pipe.
 * Bytes, 0 at EOF, -EAGAIN, -ENOTSUP (the payload so far moved to p->buf:
 * go on with recv), or -errno. */
static ssize_t recv_to_pipe(struct conn *c, struct ioc__nbd_req *p, size_t want)
{
	ssize_t n = sock_splice(c, c->fd, p->pipe->wfd, want, SPLICE_F_NONBLOCK);

	if (n > 0)
		p->pipe->fill += (size_t)n;
	if (n >= 0)
		return n;
	if (errno == EAGAIN) {
		int avail = 0;

		/* Many small segments can fill the pipe's slots before the
		 * payload is in: the socket still has bytes then, and this
		 * payload takes the copy. */
		if (ioctl(c->fd, FIONREAD, &avail) == 0 && avail > 0)
			return pipe_back_to_buf(c, p);
		return -EAGAIN;
	}
	if (errno == EINVAL || errno == EOPNOTSUPP) {
		c->zc_wr_off = true;
		return pipe_back_to_buf(c, p);
	}
	return -errno;
}

/* Decrypted input waits inside GnuTLS: the socket may be empty, so do
 * not wait for it to become readable. */
static bool tls_pending(struct conn *c)
{
	return c->tls_state == TLS_ON && ioc__nbd_tls_pending(c->tls) > 0;
}

static void tx_process(struct conn *c)
{
	struct ioc__nbd_conn *core = &c->core;
	int reads = 0;
	bool drained = false;

	c->emptied = c->rx_big = false;
	c->rx_reqs = 0;
	while (!c->dead) {
		c->t->clk = 0; /* a recv came before: see req_co() */
		/* Parse every complete request in the buffer, unless the
		 * socket died: nobody would read those replies, and a client
		 * that queued thousands of large reads and hung up would
		 * otherwise keep this thread busy serving them. */
		while (!c->dead && (!c->eof || core->in_start < core->in_end)) {
			struct ioc__nbd_req *r;
			if (conn_bounded(c)) {
				c->stalled = true;
				return;
			}
			int st = ioc__nbd_parse_request(core, req_alloc, c, &r);
			if (st == IOC_NBD_READY) {
				start_request(c, r);
				/* A long batch sends as it goes, so the client
				 * works on early replies while we parse on. */
				if (c->queued >= IOC_NBD_FLUSH_EVERY) {
					conn_flush(c);
					c->t->clk = 0;
				}
				continue;
			}
			if (st == IOC_NBD_CLOSE) {
				c->eof = true; /* NBD_CMD_DISC */
				return;
			}
			if (st < 0) {
				conn_refuse(c, "", st);
				return;
			}
			break; /* need more input */
		}
		if (c->eof || (!c->hdr_first && ++reads > 4))
			return;
		/* A short read emptied the socket: stop here rather than pay a
		 * recv that returns EAGAIN (the fd handler fires again when
		 * more arrives).  For a draining connection, empty is the end. */
		if (drained) {
			if (c->draining)
				c->eof = true;
			c->emptied = true;
			return;
		}
		/* A big payload still arriving goes straight into its pipe
		 * (see recv_to_pipe()) or into its buffer. */
		struct ioc__nbd_req *p = core->partial;
		ssize_t n;
		size_t want;
		if (p && !p->error && core->in_start == core->in_end && !p->pipe &&
		    !c->wmap && !p->wmap_tried)
			wmap_begin(c, p);
		if (p && !p->error && core->in_start == core->in_end && !c->wmap &&
		    (p->pipe || (core->partial_got == 0 && zc_write_ok(c, p) &&
				 (p->pipe = zc_get(p))))) {
			want = (size_t)(p->len - core->partial_got);
			n = recv_to_pipe(c, p, want);
			if (n == -ENOTSUP)
				continue; /* now in buf: on the ordinary way */
			if (n > 0) {
				drained = (size_t)n < want;
				struct ioc__nbd_req *done =
					ioc__nbd_payload_arrived(core, (size_t)n);
				if (done) {
					c->t->clk = 0;
					start_request(c, done);
					c->hdr_first = true;
				}
				continue;
			}
		} else if (p && !p->error && core->in_start == core->in_end &&
		    (c->wmap || p->len - core->partial_got >= IOC_NBD_DIRECT_MIN)) {
			/* In the clear, the next request's header comes in
			 * the same recvmsg, into in[] (see conn_recv_hdr()). */
			size_t hsz = c->tls_state != TLS_NONE ? 0 :
				     core->extended ? NBD_EXT_REQUEST_SIZE : NBD_REQUEST_SIZE;
			bool emptied = false;
			want = (size_t)(p->len - core->partial_got);
			if (c->wmap) {
				size_t take;

				n = wmap_recv(c, p, hsz, &take);
				if (n == -EFAULT) {
					/* The image was cut short under the
					 * mapping: the rest into buf, written
					 * the ordinary way. */
					wmap_end(c, p, core->partial_got);
					continue;
				}
				if (take < want) {
					/* All the socket held: empty once it
					 * is in, as after a short recv. */
					hsz = 0;
					emptied = true;
				}
				want = take;
			} else {
				if (hsz)
					ioc__nbd_conn_compact(core);
				n = hsz ? conn_recv_hdr(c, p->buf + core->partial_got, want,
							core->in + core->in_end, hsz)
					: conn_recv(c, p->buf + core->partial_got, want);
			}
			if (n > 0) {
				size_t pay = (size_t)n < want ? (size_t)n : want;

				drained = (emptied || (size_t)n < want + hsz) && !tls_pending(c);
				core->in_end += (size_t)n - pay;
				if (c->wmap && core->partial_got + pay == p->len)
					wmap_end(c, p, p->len);
				struct ioc__nbd_req *done =
					ioc__nbd_payload_arrived(core, pay);
				if (done) {
					c->t->clk = 0;
					start_request(c, done);
					c->hdr_first = c->tls_state == TLS_NONE && (size_t)n == pay;
				}
				continue;
			}
		} else {
			ioc__nbd_conn_compact(core);
			want = core->in_cap - core->in_end;
			/* After a WRITE whose payload came in directly,
			 * another may follow: take its header alone, so that
			 * its payload goes straight into its buffer or the
			 * mapping rather than through in[]. */
			if (c->hdr_first && core->in_start == core->in_end) {
				size_t hsz = core->extended ? NBD_EXT_REQUEST_SIZE
							    : NBD_REQUEST_SIZE;
				if (want > hsz)
					want = hsz;
			}
			c->hdr_first = false;
			n = conn_recv(c, core->in + core->in_end, want);
			if (n > 0) {
				drained = (size_t)n < want && !tls_pending(c);
				core->in_end += (size_t)n;
				continue;
			}
		}
		c->emptied = n == -EAGAIN || n == -EWOULDBLOCK;
		handle_recv_end(c, n);
		return;
	}
}

/* ---- resting ----------------------------------------------------------------
 *
 * A client that cannot keep up (fio's one thread at queue depth 64, say)
 * has most of its requests answered and unread at any moment, and sends
 * the next one each time it has handled a reply.  Answered as they come,
 * each request costs this thread a wakeup, a recv, a sendmsg and the
 * client a wakeup too, and buys nothing: the client had replies to read
 * anyway.  So when tx_process() has emptied the socket, every reply is
 * out, no payload is arriving and the client has not read our last
 * IOC_NBD_REST_REPLIES replies (SIOCOUTQ on a Unix socket: bytes sent and
 * not yet read, against where those replies ended, note_sent()), the
 * connection stops reading for rest_ns.  What arrived meanwhile is read,
 * run and answered in one batch, and reads under IOC_NBD_MAP_ALONE_MIN
 * are lent from the image's mapping (behind: the early answer that made
 * lending cost a lone client is gone).
 *
 * The verdict comes at the rest's end (rest_end()): the client still
 * behind by as many replies never waited, so the next rest follows the
 * next batch without asking and is twice as long, up to rest_max_ns
 * (--rest-max-ns); a client that read everything may have waited for us,
 * so the next rest is half as long, and below IOC_NBD_REST_MIN_NS
 * resting stops for 100 ms, doubling to 1.6 s.  A rest that brought no
 * request ends resting until the client sends again: a client that
 * stopped reading and sending would otherwise cost a wakeup per rest
 * for as long as it stays connected.  A client with fewer
 * replies in flight never meets the rule, so latency at low depth is
 * untouched.  After a large WRITE's payload (rx_big) there is no rest:
 * such a client may be blocked sending into a full socket, with our
 * replies unread only because it is not reading. */

/* Bytes we sent that the client has not read yet, or -1. */
static int unread(const struct conn *c)
{
	int q;

	return ioctl(c->fd, SIOCOUTQ, &q) == 0 ? q : -1;
}

/* Has the client not yet read our last IOC_NBD_REST_REPLIES replies?  q
 * (SIOCOUTQ) is the kernel's memory for the unread bytes, not their
 * length: each buffer of up to ~36 KiB costs its bytes rounded up to
 * pages plus a head of up to ~5 KiB.  So a client counts as behind only
 * with more than 1.5 times the bytes of those replies plus
 * IOC_NBD_REST_SLACK unread, which fewer replies cannot reach.  Replies
 * of a few bytes (to writes) rarely reach the slack: a client that only
 * writes small blocks is not rested. */
static bool client_busy(const struct conn *c, int q)
{
	if (q <= 0 || c->reply_n <= IOC_NBD_REST_REPLIES)
		return false;
	uint64_t last = c->sent_bytes - c->reply_end[c->reply_n % IOC_NBD_REST_RING];
	return (uint64_t)q > last + last / 2 + IOC_NBD_REST_SLACK;
}

static uint32_t rest_start(const struct conn *c)
{
	uint32_t max = c->t->srv->rest_max_ns;

	return max < IOC_NBD_REST_START_NS ? max : IOC_NBD_REST_START_NS;
}

static void set_behind(struct conn *c, bool behind)
{
	if (c->behind != behind) {
		c->behind = behind;
		conn_map_policy(c);
	}
}

/* The socket is empty and every reply is out: rest rather than wake for
 * each request, if the client is busy reading replies. */
static void rest_maybe(struct conn *c)
{
	bool again = c->rest_again, rested = c->rested;

	if (c->resting)
		return;
	c->rest_again = c->rested = false;
	/* A rest that brought no request: the client stopped sending, and
	 * waiting on the socket costs nothing, where rests wake the thread. */
	if (rested && !c->rx_reqs && c->emptied)
		return;
	if (!c->rest_unix || c->eof || c->dead || c->draining ||
	    c->tls_state != TLS_NONE || c->core.phase != IOC_NBD_PHASE_TRANSMISSION)
		return;
	/* Replies fill the socket: the client is a full buffer behind, and
	 * lending cannot answer it sooner. */
	if (c->want_write) {
		set_behind(c, true);
		return;
	}
	if (!c->emptied || c->rx_big || c->stalled || c->core.partial)
		return;
	if (!again && ((c->rest_off_until && ioc_now_ns() < c->rest_off_until) ||
		       !client_busy(c, unread(c)))) {
		set_behind(c, false);
		return;
	}
	c->resting = true;
	set_behind(c, true);
	ioc_timer_arm_in(&c->rest_timer, c->rest_ns);
	/* Relaxed load + store: this thread is the only writer; the control
	 * socket reads it (cmd_query_polling()). */
	atomic_store_explicit(&c->t->rests,
		atomic_load_explicit(&c->t->rests, memory_order_relaxed) + 1,
		memory_order_relaxed);
}

static void rest_end(void *opaque)
{
	struct conn *c = opaque;
	uint32_t max = c->t->srv->rest_max_ns;
	int q = unread(c);

	c->resting = false;
	c->rested = true;
	if (client_busy(c, q)) {
		/* It never ran dry: rest again after this batch, longer. */
		c->rest_again = true;
		c->rest_off_shift = 0;
		c->rest_ns = c->rest_ns >= max / 2 ? max : c->rest_ns * 2;
	} else if (q == 0) {
		/* It read everything: it may have waited for us. */
		/* Relaxed: as in rest_maybe(). */
		atomic_store_explicit(&c->t->rests_late,
			atomic_load_explicit(&c->t->rests_late, memory_order_relaxed) + 1,
			memory_order_relaxed);
		if ((c->rest_ns /= 2) < IOC_NBD_REST_MIN_NS) {
			c->rest_ns = rest_start(c);
			c->rest_off_until = ioc_now_ns() +
				((int64_t)IOC_NBD_REST_OFF_NS << c->rest_off_shift);
			if (c->rest_off_shift < IOC_NBD_REST_OFF_SHIFT)
				c->rest_off_shift++;
		}
	}
	conn_process(c); /* rest_maybe() at its end: again, or not behind */
}

/* Count the export the handshake just chose in its conns (server.c,
 * "Exports while serving"), in the same callback that chose it, so that a
 * deletion's sweep of this thread finds every connection of the export
 * counted.  One that chose an export being deleted closes. */
static void conn_count_export(struct conn *c)
{
	struct ioc__nbd_export *e = (struct ioc__nbd_export *)c->core.exp;

	if (!e || e == c->counted)
		return;
	/* seq_cst, as the decrement in conn_destroy(): a total order with
	 * the deleter's store of gone and its load of conns. */
	atomic_fetch_add_explicit(&e->conns, 1, memory_order_seq_cst);
	c->counted = e;
	if (atomic_load_explicit(&e->gone, memory_order_seq_cst))
		conn_kill(c);
}

/* ---- the move ---------------------------------------------------------------
 *
 * An export with a loop of its own (ioc_nbd_export_opts.loop, the storage
 * daemon's iothread=) is served there, as QEMU serves an export in its
 * iothread's AioContext; the handshake runs where the connection was
 * accepted, since nothing names the export before it ends.  The move
 * happens in the callback whose handshake step chose the export (GO or
 * EXPORT_NAME) and counted it (conn_count_export()), before a request is
 * parsed, so every request runs on the export's loop.  There is no
 * coroutine to move: request coroutines start in transmission, on the
 * loop that will run them, and the handshake has none.
 *
 * Who owns what, when.  Until the move the accepting thread owns the
 * connection.  conn_move(), on that thread: a bottom half made for the
 * new loop replaces the old one (deleted here, its pending run dropped),
 * the fd's handlers leave this loop (with io_uring, its poll on this
 * loop's ring: the connection submits nothing else to a ring), the
 * timers (the handshake's is cancelled already; no rest in a handshake)
 * are cancelled, and the connection leaves this thread's list.  What is plain data goes as it
 * is: the input already received (requests sent behind the GO), the
 * queued GO reply, the TLS session, the idle zero-copy pipes, the
 * counters.  Posting start_task (release) hands the whole connection to
 * the new loop (acquire in its loop), and the old thread touches it no
 * more.  conn_arrive(), on the new loop: the connection joins that
 * thread's list, its timers are set up on it, and conn_process() sends
 * the reply, parses what is there and registers the fd there.  The node
 * learns the new loop at the first request (its slot, node.c); the old
 * loop never submitted to it for this connection.
 *
 * A deletion's sweep, a stop or a retirement that visits the new thread
 * before the connection arrives cannot find it there: conn_arrive()
 * checks for each (see there).  The connection stays counted in its
 * export and in nconns throughout, so neither the export nor the server
 * goes while it travels.
 */

static void conn_bh(void *opaque);
static void hs_timeout(void *opaque);

static void conn_arrive(struct ioc_task *task)
{
	struct conn *c = ioc_container_of(task, struct conn, start_task);
	struct nbd_thread *t = c->t;
	struct ioc_nbd_server *srv = t->srv;

	IOC__LIST_PUSH(t->conns, c, prev, next);
	thread_map_policy(t);
	ioc_timer_init(&c->hs_timer, t->loop, hs_timeout, c);
	ioc_timer_init(&c->rest_timer, t->loop, rest_end, c);
	ioc__nbd_log(srv, "%s: on its export's I/O thread", c->core.peer);
	/*
	 * A deleter stores gone, then sweeps every thread (ioc_loop_call());
	 * a stop stores stopping, then posts its tasks to every thread; a
	 * retirement stores retiring, then posts its task.  Each such visit
	 * of this thread either comes after this callback, and finds the
	 * connection in t->conns, or came before it: then the store
	 * happened before the visit ran here (the post's release, this
	 * loop's acquire), which ran before us on this thread, and we see
	 * it.  seq_cst for gone, as every access to it (server.c).
	 */
	if (atomic_load_explicit(&c->counted->gone, memory_order_seq_cst) ||
	    atomic_load_explicit(&srv->stopping, memory_order_seq_cst) > 1)
		conn_kill(c);
	else if (atomic_load_explicit(&srv->stopping, memory_order_seq_cst) ||
		 atomic_load_explicit(&srv->retiring, memory_order_seq_cst))
		c->draining = true;
	conn_process(c);
}

/* Leave for the export's loop, if it has one and this is not it.  True:
 * the connection is gone from this thread, which must not touch it
 * again.  False: it stays (it may have been killed). */
static bool conn_move(struct conn *c)
{
	const struct ioc__nbd_export *e = c->core.exp;
	struct nbd_thread *from = c->t, *to = e ? e->place : NULL;
	struct ioc_bh *bh;

	if (!to || to == from || c->dead || c->core.phase != IOC_NBD_PHASE_TRANSMISSION)
		return false;
	bh = ioc_bh_new(to->loop, conn_bh, c);
	if (!bh) {
		ioc__nbd_log(from->srv, "%s: cannot move to its export's I/O thread: %s",
			     c->core.peer, strerror(ENOMEM));
		conn_kill(c);
		return false;
	}
	if (c->reg_read || c->reg_write)
		ioc_loop_set_fd(from->loop, c->fd, NULL, NULL, NULL, NULL, NULL);
	c->reg_read = c->reg_write = false;
	ioc_timer_cancel(&c->hs_timer);
	ioc_timer_cancel(&c->rest_timer);
	ioc_bh_delete(c->bh);
	c->bh = bh;
	IOC__LIST_UNLINK(from->conns, c, prev, next);
	thread_map_policy(from);
	from->clk = 0;
	c->t = to;
	c->start_task.fn = conn_arrive;
	/* Release inside ioc_loop_post publishes *c to the new loop. */
	ioc_loop_post(to->loop, &c->start_task);
	return true;
}

/* Run everything that can make progress now; then send, re-arm, reap. */
static void conn_process(struct conn *c)
{
	c->stalled = false;
	if (c->core.phase != IOC_NBD_PHASE_TRANSMISSION) {
		hs_process(c);
		conn_count_export(c);
		if (conn_move(c))
			return;
	}
	if (c->core.phase == IOC_NBD_PHASE_TRANSMISSION && !c->dead)
		tx_process(c);
	conn_flush(c);
	if (c->tls_state == TLS_ACKED && !c->sq_head && !c->dead) {
		tls_begin(c);
		if (!c->dead) {
			hs_process(c);
			conn_count_export(c);
			if (conn_move(c))
				return;
		}
		conn_flush(c);
	}
	/* Stopped reading (the per-call cap) with input already decrypted:
	 * no readiness event will come for it, so come back from the BH. */
	if (!c->eof && !c->dead && !c->stalled && tls_pending(c)) {
		c->stalled = true;
		ioc_bh_schedule(c->bh);
	}
	rest_maybe(c);
	conn_settle(c);
}

static void on_read(void *opaque)
{
	conn_process(opaque);
}

static void on_write(void *opaque)
{
	struct conn *c = opaque;

	/* TLS may wait to write for its own sake (handshake, key update),
	 * and the STARTTLS ACK going out starts the handshake. */
	if (c->tls_state != TLS_NONE && (c->tls_want_write || c->tls_state != TLS_ON)) {
		c->tls_want_write = false;
		conn_process(c);
		return;
	}
	conn_flush(c);
	if (c->stalled && !conn_bounded(c))
		conn_process(c);
	else
		conn_settle(c);
}

/* Once per loop iteration after requests completed: send their replies,
 * resume a connection that stopped at a bound, or reap a finished one. */
static void conn_bh(void *opaque)
{
	struct conn *c = opaque;

	conn_flush(c);
	if (c->stalled && !conn_bounded(c) && !c->dead)
		conn_process(c);
	else
		conn_settle(c);
}

static void hs_timeout(void *opaque)
{
	struct conn *c = opaque;

	if (c->core.phase == IOC_NBD_PHASE_TRANSMISSION)
		return;
	ioc__nbd_log(c->t->srv, "%s: handshake timed out", c->core.peer);
	conn_kill(c);
	conn_settle(c);
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
		ioc_timer_cancel(&c->rest_timer);
	}
	if (c->bh)
		ioc_bh_delete(c->bh);
	if (c->tls) {
		if (c->tls_state == TLS_ON && !c->dead)
			ioc__nbd_tls_bye(c->tls);
		ioc__nbd_tls_free(c->tls);
	}
	free(c->tls_out);
	close(c->fd);
	if (c->core.partial) {
		if (c->wmap) /* what arrived is in the image */
			wmap_end(c, c->core.partial, c->core.partial_got);
		if (c->core.partial->pipe)
			zc_put(c->core.partial, c->core.partial->pipe);
		req_free(c->core.partial);
		c->core.partial = NULL;
	}
	while (c->pipes) {
		struct ioc__nbd_pipe *p = c->pipes;
		c->pipes = p->next;
		pipe_close(c, p);
	}
	while (c->free_reqs) {
		struct ioc__nbd_req *r = c->free_reqs;
		c->free_reqs = r->next;
		req_free(r);
	}
	ioc__nbd_conn_destroy(&c->core);
	IOC__LIST_UNLINK(t->conns, c, prev, next);
	ioc__nbd_log(srv, "%s: closed", c->core.peer);
	if (c->counted)
		ioc__nbd_export_release(c->counted);
	free(c);
	thread_map_policy(t);
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

	IOC__LIST_PUSH(t->conns, c, prev, next);
	c->sq_tail = &c->sq_head;
	if (ioc__nbd_conn_init(&c->core, &srv->cfg, IOC_NBD_IN_CAP) < 0 ||
	    !(c->bh = ioc_bh_new(t->loop, conn_bh, c))) {
		c->eof = c->dead = true;
		conn_destroy(c);
		return;
	}
	if (srv->opts.log)
		format_peer(c->core.peer, sizeof(c->core.peer), c->fd);
	c->page = (size_t)sysconf(_SC_PAGESIZE);
	c->core.zc_read_min = srv->zc_read_min;
	c->core.zc_write_min = srv->zc_write_min;
	c->core.map_reads = srv->map_reads; /* sendmsg: the kernel copies */
	thread_map_policy(t);
	c->core.zc_get = zc_get;
	c->core.zc_put = zc_put;
	ioc_timer_init(&c->hs_timer, t->loop, hs_timeout, c);
	ioc_timer_init(&c->rest_timer, t->loop, rest_end, c);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	c->rest_unix = srv->rest_max_ns && getsockname(c->fd, (struct sockaddr *)&ss, &sl) == 0 &&
		       ss.ss_family == AF_UNIX;
	c->rest_ns = rest_start(c);
	c->started = true;
	/* relaxed: the stop flag is re-checked by every stop task too. */
	if (atomic_load_explicit(&srv->stopping, memory_order_relaxed)) {
		c->eof = c->dead = true;
		conn_destroy(c);
		return;
	}
	if (srv->opts.handshake_timeout_ns > 0)
		ioc_timer_arm_in(&c->hs_timer, srv->opts.handshake_timeout_ns);
	ioc__nbd_log(srv, "%s: connected (I/O thread %u)", c->core.peer,
	     (unsigned)(t - srv->threads));
	ioc__nbd_hs_start(&c->core);
	if (queue_hs_output(c) < 0)
		conn_kill(c);
	conn_process(c);
}

/* Shutdown on one I/O thread. */
void ioc__nbd_thread_stop(struct ioc_task *task)
{
	thread_drain_conns(ioc_container_of(task, struct nbd_thread, stop_task));
}

/* The grace period is over: close whatever is left. */
void ioc__nbd_thread_kill(struct ioc_task *task)
{
	struct nbd_thread *t = ioc_container_of(task, struct nbd_thread, kill_task);
	struct conn *c = t->conns, *next;

	for (; c; c = next) {
		next = c->next;
		ioc__nbd_log(t->srv, "%s: closed at shutdown with replies pending", c->core.peer);
		conn_kill(c);
		conn_settle(c);
	}
}


int ioc__nbd_conn_accept(struct nbd_thread *t, int fd)
{
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	/* Best effort.  A deep queue of 4 KiB replies (64 in flight is
	 * 256 KiB) overflows the default send buffer, turning one gathered
	 * sendmsg into EAGAIN plus a POLLOUT round trip. */
	int one = 1, buf = IOC_NBD_SOCK_BUF;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
	c->fd = fd;
	c->t = t;
	c->start_task.fn = conn_start;
	c->wmap_cut.fn = wmap_cut;
	/* Release/acquire inside ioc_loop_post publishes *c to the I/O
	 * thread. */
	ioc_loop_post(t->loop, &c->start_task);
	return 0;
}
