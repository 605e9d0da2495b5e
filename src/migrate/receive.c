/*
 * The migration receiver (receive.h), answering END with an ACK once the
 * image is durable and verified.  Problem: decoding must use every core, yet
 * the stream comes in order from one socket, and a pass may rewrite an
 * earlier pass's block, whose write must not land last.  The peer is
 * untrusted: memory stays bounded whatever lengths it claims, no record
 * writes outside the image, and each failure says where and why.  Design:
 *  - The image is a writable node (a file, a qcow2 image...).  Its requests
 *    are coroutines on an I/O thread of the receiver's own (sync.c: a hop
 *    per record, never per block); the node checks every range.
 *  - The caller's thread reads, blocking, every header and payload whole
 *    before use.  A DATA_ZSTD record becomes a job owning its payload: a
 *    worker decodes it, takes its blocks' CRCs, checks the record's CRC
 *    combined from them (each byte read once) and writes the range, waiting
 *    for it.  The reader checks DATA_RAW itself and keeps a few of their
 *    writes in flight (apply_raw()).  A per-pass bitmap of blocks seen
 *    keeps a pass's records disjoint, so their writes need no order and a
 *    lying sender cannot race two on one.
 *  - At PASS and END the reader drains all writes: that orders the passes.
 *    It applies ZERO records itself (the node's write-zeroes, may-unmap),
 *    never alongside a write on its blocks.  MIRROR records (a client write
 *    the sender waits for) may overlap anything: the reader collects the
 *    writes busy on their blocks (a bitmap), writes the record and answers
 *    MACK with the count applied, so it lands in stream order.
 *  - Memory: jobs are collected before their payload and decoded bytes
 *    would pass 64 MiB; add one MAX_CHUNK record and a zstd context each.
 *  - Sleeps and wakes: the reader sleeps in read() (woken by data, EOF, or
 *    shutdown(2) of the socket by whoever sets the cancel flag; poll() on a
 *    non-blocking socket, same wakes) and in ioc_wq_wait_done() (wq.c's
 *    handshake); reader and workers in ioc_node_call_wait() (sync.c's: the
 *    request's coroutine stores done, then FUTEX_WAKEs).  Workers sleep
 *    otherwise only in the workqueue; the dctx pool's mutex covers a push.
 *  - END: drain, flush the node, image checksum from the block CRCs,
 *    compare, ACK.  A failure drains, then ACKs the errno if the socket
 *    takes it without blocking (never over the caller's blocking hooks,
 *    TLS: the sender then sees the stream close).
 * Rejected: an in-order workqueue, or writes on the reader alone (one
 * writer was the zip decoder's bottleneck); the node's writes on the
 * host's main loop (its control channel would queue behind the image).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zstd.h>

#include "iocore/common.h"
#include "iocore/loop.h"
#include "iocore/wq.h"
#include "node/node.h"
#include "stream-int.h"
#include "receive.h"

#define RECV_MAX_IN_FLIGHT (64u << 20)  /* payload + decoded bytes of jobs */
#define RAW_SLOTS 8                     /* DATA_RAW writes in flight */
#define RAW_SLOT_MAX (4u << 20)         /* a larger one is written alone */

struct recv;

struct job {
	struct ioc_wq_job wj;
	struct recv *rv;
	struct ioc_mig_rec rec;
	uint64_t recno;
	uint8_t *payload;
	uint8_t *out;           /* payload itself for DATA_RAW */
	size_t bytes;           /* counted in rv->in_flight_bytes */
	/* Written by the worker, read by the reader after it collects the
	 * job (ordered by the workqueue's done-ring handoff). */
	int err;
	const char *what;
	uint32_t got_crc;
};

/* A DATA_RAW record's write, posted to the node's I/O thread. */
struct raw_slot {
	struct ioc_node_call call;
	uint8_t *buf;
	uint32_t cap;
	bool busy;              /* posted, not yet waited for */
	struct ioc_mig_rec rec;
	uint64_t recno;
};

struct recv {
	const struct ioc_mig_recv_opts *o;
	struct ioc_mig_recv_stats *st;
	struct ioc_mig_hdr hdr;
	struct ioc_mig_crcs *crcs;
	struct ioc_wq *wq;
	uint64_t in_flight_bytes;
	uint64_t *seen;         /* blocks written in the current pass */
	uint64_t *busy;         /* blocks of DATA jobs and raw writes in flight */
	uint64_t mirrors;       /* MIRROR records applied (MACK's count) */
	struct ioc_iothread *io; /* runs the node's requests (node_write()) */
	struct ioc_loop *io_loop;
	struct raw_slot raw[RAW_SLOTS]; /* a ring, apply_raw()'s */
	unsigned raw_next;
	pthread_mutex_t dctx_lock;
	ZSTD_DCtx **dctx;       /* free contexts */
	unsigned ndctx, dctx_cap;
	int err;                /* the first error; why holds its reason */
	char *why;
	size_t whylen;
};

static const char *type_name(uint32_t t)
{
	static const char *const names[] = {
		"?", "DATA_RAW", "DATA_ZSTD", "ZERO", "PASS", "END", "ACK", "MIRROR",
		"MACK", "HANDOVER", "READY",
	};

	return t < IOC_ARRAY_SIZE(names) ? names[t] : "?";
}

static int fail(struct recv *rv, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct recv *rv, int err, const char *fmt, ...)
{
	va_list ap;

	if (rv->err)
		return rv->err;
	rv->err = err;
	if (rv->why && rv->whylen) {
		va_start(ap, fmt);
		vsnprintf(rv->why, rv->whylen, fmt, ap);
		va_end(ap);
	}
	return err;
}

static bool cancelled(struct recv *rv)
{
	/* Acquire: pairs with the store of whoever cancels (a relaxed store
	 * would do too; the flag publishes nothing else). */
	return rv->o->cancel && atomic_load_explicit(rv->o->cancel, memory_order_acquire);
}

/* Sleep until fd is ready for events (woken by the kernel: data, room,
 * hang-up or error).  Only for a non-blocking fd, where read() and send()
 * would not sleep themselves. */
static int wait_fd(int fd, short events)
{
	struct pollfd pfd = { .fd = fd, .events = events };

	while (poll(&pfd, 1, -1) < 0)
		if (errno != EINTR)
			return -errno;
	return 0;
}

/* Read exactly n bytes of what (the stream header when recno is 0, else
 * record recno's "header" or "payload"); EOF part-way is a truncated
 * stream, EOF before a record header a stream that stopped before END. */
static int read_full(struct recv *rv, void *buf, size_t n, const char *what,
		     uint64_t recno)
{
	uint8_t *p = buf;
	size_t got = 0;
	char part[64];

	if (recno == 0)
		snprintf(part, sizeof(part), "the stream %s", what);
	else
		snprintf(part, sizeof(part), "record %llu's %s", (unsigned long long)recno,
			 what);
	while (got < n) {
		ssize_t r;

		if (rv->o->tr) {
			r = rv->o->tr->recv(rv->o->tr->t, p + got, n - got);
			if (r < 0) {
				errno = (int)-r;
				r = -1;
			}
		} else {
			r = read(rv->o->fd, p + got, n - got);
		}

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
		    wait_fd(rv->o->fd, POLLIN) == 0)
			continue; /* a non-blocking socket: wait as read() would */
		if (r <= 0 && cancelled(rv))
			return fail(rv, -ECANCELED, "cancelled while reading %s", part);
		if (r < 0)
			return fail(rv, -errno, "reading %s at stream byte %llu: %s", part,
				    (unsigned long long)rv->st->wire_bytes, strerror(errno));
		if (r == 0) {
			if (got == 0 && recno > 0 && strcmp(what, "header") == 0)
				return fail(rv, -EPROTO,
					    "stream truncated: EOF before END, after %llu records "
					    "(stream byte %llu)",
					    (unsigned long long)(recno - 1),
					    (unsigned long long)rv->st->wire_bytes);
			return fail(rv, -EPROTO,
				    "stream truncated: EOF after %zu of %zu bytes of %s "
				    "(stream byte %llu)", got, n, part,
				    (unsigned long long)rv->st->wire_bytes);
		}
		got += (size_t)r;
		rv->st->wire_bytes += (uint64_t)r;
	}
	return 0;
}

static int send_all(int fd, const void *buf, size_t n, int flags)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t r = send(fd, p, n, flags | MSG_NOSIGNAL);

		if (r < 0 && errno == ENOTSOCK)
			r = write(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
		    !(flags & MSG_DONTWAIT) && wait_fd(fd, POLLOUT) == 0)
			continue;
		if (r < 0)
			return -errno;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* An answer to the sender: ACK or MACK. */
static int send_rec(struct recv *rv, uint32_t type, uint64_t offset, uint32_t sum,
		    int flags)
{
	struct ioc_mig_rec a = { .type = type, .offset = offset, .data_crc = sum };
	uint8_t buf[IOC_MIG_REC_SIZE];

	ioc_mig_rec_encode(&a, buf);
	if (rv->o->tr) {
		/* A blocking transport: only the success ACK is sent through
		 * it (one that might block after a failure is skipped, as a
		 * full plain socket skips it). */
		size_t done = 0;

		if (flags & MSG_DONTWAIT)
			return -EAGAIN;
		while (done < sizeof(buf)) {
			ssize_t r = rv->o->tr->send(rv->o->tr->t, buf + done, sizeof(buf) - done);

			if (r < 0)
				return (int)r;
			done += (size_t)r;
		}
		return 0;
	}
	return send_all(rv->o->fd, buf, sizeof(buf), flags);
}

static int send_ack(struct recv *rv, int err, uint32_t sum, int flags)
{
	return send_rec(rv, IOC_MIG_ACK, (uint64_t)(err < 0 ? -err : err), sum, flags);
}

/* ---- zstd contexts ------------------------------------------------- */

static ZSTD_DCtx *dctx_get(struct recv *rv)
{
	ZSTD_DCtx *d = NULL;

	pthread_mutex_lock(&rv->dctx_lock);
	if (rv->ndctx)
		d = rv->dctx[--rv->ndctx];
	pthread_mutex_unlock(&rv->dctx_lock);
	return d ? d : ZSTD_createDCtx();
}

static void dctx_put(struct recv *rv, ZSTD_DCtx *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&rv->dctx_lock);
	if (rv->ndctx < rv->dctx_cap) {
		rv->dctx[rv->ndctx++] = d;
		d = NULL;
	}
	pthread_mutex_unlock(&rv->dctx_lock);
	ZSTD_freeDCtx(d);
}

/* ---- writing ------------------------------------------------------- */

/* Write one record's range through the node, from the reader or a worker:
 * a hop to the I/O thread and back per record (sync.c), the node checks
 * the range against its size. */
static int node_write(struct recv *rv, const uint8_t *p, uint64_t n, uint64_t off)
{
	return ioc_node_pwrite_sync(rv->io_loop, rv->o->node, off, p, (size_t)n, 0);
}

/* Runs on a worker: decode, check, write. */
static void data_job(struct ioc_wq_job *wj)
{
	struct job *j = ioc_container_of(wj, struct job, wj);
	struct recv *rv = j->rv;
	ZSTD_DCtx *d = NULL;
	uint32_t crc;
	int r;

	if (j->rec.type == IOC_MIG_DATA_ZSTD) {
		d = dctx_get(rv); /* NULL: ZSTD_decompress makes its own */
		j->out = malloc(j->rec.length);
		if (!j->out) {
			dctx_put(rv, d);
			j->err = -ENOMEM;
			j->what = "cannot allocate the decoded buffer";
			return;
		}
	}
	r = ioc__mig_payload_decode(&j->rec, j->payload, j->out, d, &j->what);
	dctx_put(rv, d);
	if (r < 0) {
		j->err = r;
		return;
	}
	crc = ioc_mig_crcs_set(rv->crcs, j->rec.offset, j->rec.length, j->out);
	if (crc != j->rec.data_crc) {
		j->err = -EBADMSG;
		j->what = "data CRC mismatch";
		j->got_crc = crc;
		return;
	}
	r = node_write(rv, j->out, j->rec.length, j->rec.offset);
	if (r < 0) {
		j->err = r;
		j->what = "cannot write to the image";
	}
}

static void job_free(struct job *j)
{
	if (j->out != j->payload)
		free(j->out);
	free(j->payload);
	free(j);
}

/* Set or clear the busy bits of the blocks of a DATA record (reader). */
static void mark_busy(struct recv *rv, const struct ioc_mig_rec *r, bool on)
{
	uint32_t bs = rv->hdr.block_size;

	for (uint64_t b = r->offset / bs; b <= (r->offset + r->length - 1) / bs; b++) {
		if (on)
			rv->busy[b / 64] |= UINT64_C(1) << (b % 64);
		else
			rv->busy[b / 64] &= ~(UINT64_C(1) << (b % 64));
	}
}

static bool any_busy(struct recv *rv, const struct ioc_mig_rec *r)
{
	uint32_t bs = rv->hdr.block_size;

	for (uint64_t b = r->offset / bs; b <= (r->offset + r->length - 1) / bs; b++)
		if (rv->busy[b / 64] & UINT64_C(1) << (b % 64))
			return true;
	return false;
}

/* Wait for a raw slot's write; its failure goes to rv->err. */
static int raw_wait(struct recv *rv, struct raw_slot *s)
{
	int ret = ioc_node_call_wait(&s->call);

	s->busy = false;
	mark_busy(rv, &s->rec, false);
	if (ret < 0)
		return fail(rv, ret, "record %llu (DATA_RAW) at image offset %llu, length "
			    "%u: cannot write to the image (%s)",
			    (unsigned long long)s->recno, (unsigned long long)s->rec.offset,
			    (unsigned)s->rec.length, strerror(-ret));
	rv->st->data_bytes += s->rec.length;
	return 0;
}

/* Wait for every raw write in flight; returns rv->err. */
static int raw_drain(struct recv *rv)
{
	for (unsigned i = 0; i < RAW_SLOTS; i++) {
		struct raw_slot *s = &rv->raw[(rv->raw_next + i) % RAW_SLOTS];

		if (s->busy)
			(void)raw_wait(rv, s);
	}
	return rv->err;
}

/* Collect finished jobs, waiting for at least one when block is set and
 * something is in flight.  A job's failure goes to rv->err (the first one
 * wins); returns the count collected, or the workqueue's -errno. */
static int collect(struct recv *rv, bool block)
{
	struct ioc_wq_job *done[32];
	int n;

	if (!rv->wq)
		return 0;
	n = block ? ioc_wq_wait_done(rv->wq, done, IOC_ARRAY_SIZE(done), -1)
		  : ioc_wq_poll_done(rv->wq, done, IOC_ARRAY_SIZE(done));
	if (n < 0)
		return fail(rv, n, "workqueue: %s", strerror(-n));
	for (int i = 0; i < n; i++) {
		struct job *j = ioc_container_of(done[i], struct job, wj);

		rv->in_flight_bytes -= j->bytes;
		mark_busy(rv, &j->rec, false);
		if (j->err == -EBADMSG && j->got_crc)
			fail(rv, j->err, "record %llu (%s) at image offset %llu: %s "
			     "(computed 0x%08x, record says 0x%08x)",
			     (unsigned long long)j->recno, type_name(j->rec.type),
			     (unsigned long long)j->rec.offset, j->what,
			     (unsigned)j->got_crc, (unsigned)j->rec.data_crc);
		else if (j->err)
			fail(rv, j->err, "record %llu (%s) at image offset %llu, "
			     "length %u: %s (%s)",
			     (unsigned long long)j->recno, type_name(j->rec.type),
			     (unsigned long long)j->rec.offset, (unsigned)j->rec.length,
			     j->what, strerror(-j->err));
		else
			rv->st->data_bytes += j->rec.length;
		job_free(j);
	}
	return n;
}

/* Collect one or more jobs; returns rv->err (0 while all is well). */
static int reap(struct recv *rv, bool block)
{
	int n = collect(rv, block);

	return n < 0 ? n : rv->err;
}

/* Collect every job and raw write in flight, failed or not. */
static void drain(struct recv *rv)
{
	(void)raw_drain(rv);
	while (rv->wq && ioc_wq_in_flight(rv->wq))
		if (collect(rv, true) < 0)
			break; /* the workqueue itself failed */
}

/* A ZERO record: the node's write-zeroes, which may free the range (a
 * file node punches a hole, else zeroes it in place or writes zeroes). */
static int write_zeros(struct recv *rv, uint64_t off, uint64_t len)
{
	return ioc_node_write_zeroes_sync(rv->io_loop, rv->o->node, off, len,
					  IOC_NODE_MAY_UNMAP);
}

/* The I/O thread the node's requests run on, with its loop. */
static int start_io(struct recv *rv)
{
	struct ioc_iothread_opts io = { .name = "ioc-migwr", .cpu = -1 };
	int ret = ioc_iothread_start(&rv->io, &io);

	if (ret < 0)
		return fail(rv, ret, "cannot start the image's I/O thread: %s",
			    strerror(-ret));
	rv->io_loop = ioc_iothread_loop(rv->io);
	return 0;
}

static int io_loop_exit(void *arg)
{
	ioc_node_loop_exit(arg);
	return 0;
}

/* The node takes the sender's size: a node that can be resized (a file)
 * is, one that cannot (a block device, a qcow2 image) must be large
 * enough. */
static int size_image(struct recv *rv)
{
	struct ioc_node *n = rv->o->node;
	uint64_t size = rv->hdr.image_size;
	int ret;

	if (n->size == size)
		return 0;
	ret = ioc_node_truncate_sync(rv->io_loop, n, size);
	if (ret == 0)
		return 0;
	if (n->size >= size)
		return 0; /* its tail past the sender's image is never read back */
	if (ret == -ENOTSUP || ret == -EOPNOTSUPP || ret == -EINVAL)
		return fail(rv, -ENOSPC, "image: %s node of %llu bytes is smaller than "
			    "the sender's image (%llu bytes)", n->drv->name,
			    (unsigned long long)n->size, (unsigned long long)size);
	return fail(rv, ret, "image: cannot resize to %llu bytes: %s",
		    (unsigned long long)size, strerror(-ret));
}

/* Mark the blocks of a DATA or ZERO record as seen in this pass; a block
 * already seen means two records of one pass overlap. */
static int claim_blocks(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	uint32_t bs = rv->hdr.block_size;
	uint64_t first = r->offset / bs;
	uint64_t last = (r->offset + r->length - 1) / bs;

	for (uint64_t b = first; b <= last; b++) {
		uint64_t bit = UINT64_C(1) << (b % 64);

		if (rv->seen[b / 64] & bit)
			return fail(rv, -EPROTO, "record %llu (%s) at image offset %llu: "
				    "block %llu already written in this pass",
				    (unsigned long long)recno, type_name(r->type),
				    (unsigned long long)r->offset, (unsigned long long)b);
		rv->seen[b / 64] |= bit;
	}
	return 0;
}

static int start_data(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	size_t need = sizeof(struct job) + r->payload_len +
		      (r->type == IOC_MIG_DATA_ZSTD ? r->length : 0);
	struct job *j;
	int ret;

	/* Memory bound: collect jobs until this one fits (or is alone). */
	while (rv->in_flight_bytes && rv->in_flight_bytes + need > RECV_MAX_IN_FLIGHT)
		if (reap(rv, true) < 0)
			return rv->err;
	if (!rv->wq) {
		struct ioc_wq_opts wo = {
			.workers = rv->o->threads, .policy = IOC_WQ_LEAST_LOADED,
			.name = "ioc-migrecv",
		};

		ret = ioc_wq_new(&rv->wq, &wo);
		if (ret < 0)
			return fail(rv, ret, "cannot start the decompression workers: %s",
				    strerror(-ret));
		rv->dctx_cap = ioc_wq_workers(rv->wq);
		rv->dctx = calloc(rv->dctx_cap, sizeof(*rv->dctx));
		if (!rv->dctx)
			return fail(rv, -ENOMEM, "out of memory");
	}
	j = calloc(1, sizeof(*j));
	if (j)
		j->payload = malloc(r->payload_len);
	if (!j || !j->payload) {
		free(j);
		return fail(rv, -ENOMEM, "record %llu: cannot allocate %u payload bytes",
			    (unsigned long long)recno, (unsigned)r->payload_len);
	}
	j->wj.fn = data_job;
	j->rv = rv;
	j->rec = *r;
	j->recno = recno;
	j->bytes = need;
	if (r->type == IOC_MIG_DATA_RAW)
		j->out = j->payload;
	ret = read_full(rv, j->payload, r->payload_len, "payload", recno);
	if (ret < 0) {
		job_free(j);
		return ret;
	}
	while ((ret = ioc_wq_submit(rv->wq, &j->wj)) == -EAGAIN)
		if (reap(rv, true) < 0)
			break;
	if (ret < 0) {
		job_free(j);
		return fail(rv, ret, "workqueue: %s", strerror(-ret));
	}
	rv->in_flight_bytes += need;
	mark_busy(rv, r, true);
	return 0;
}

/*
 * A DATA_RAW record is applied by the reader itself, from a ring of kept
 * buffers: its work is a CRC and a write, less than handing it to a worker
 * costs.  A worker pulls the 256 KiB the reader just wrote into its own
 * core's cache, a malloc of that size is an mmap with fresh pages to
 * fault and zero, and two workers writing one tmpfs file queue on its
 * inode lock (bench/migrate/NOTES.md).  The write is posted to the node's
 * I/O thread and waited for only when its slot comes round again, so the
 * reader reads the next record while RAW_SLOTS writes are in flight.
 * Order: its pass's records do not overlap it, earlier passes were
 * drained at PASS, and a MIRROR waits for the ring first.
 */
static int apply_raw(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	bool alone = r->length > RAW_SLOT_MAX;
	struct raw_slot *s;
	uint32_t crc;
	int ret;

	if (alone) {
		/* Memory: one large buffer at a time, with the ring empty. */
		if (raw_drain(rv) < 0)
			return rv->err;
		s = &rv->raw[rv->raw_next];
	} else {
		s = &rv->raw[rv->raw_next];
		rv->raw_next = (rv->raw_next + 1) % RAW_SLOTS;
		if (s->busy && raw_wait(rv, s) < 0)
			return rv->err;
	}
	if (r->length > s->cap) {
		uint8_t *b = malloc(r->length);

		if (!b)
			return fail(rv, -ENOMEM, "record %llu: cannot allocate %u payload bytes",
				    (unsigned long long)recno, (unsigned)r->length);
		free(s->buf);
		s->buf = b;
		s->cap = r->length;
	}
	ret = read_full(rv, s->buf, r->payload_len, "payload", recno);
	if (ret < 0)
		return ret;
	crc = ioc_mig_crcs_set(rv->crcs, r->offset, r->length, s->buf);
	if (crc != r->data_crc)
		return fail(rv, -EBADMSG, "record %llu (DATA_RAW) at image offset %llu: data "
			    "CRC mismatch (computed 0x%08x, record says 0x%08x)",
			    (unsigned long long)recno, (unsigned long long)r->offset,
			    (unsigned)crc, (unsigned)r->data_crc);
	s->rec = *r;
	s->recno = recno;
	s->busy = true;
	mark_busy(rv, r, true);
	ioc_node_pwrite_post(rv->io_loop, &s->call, rv->o->node, r->offset, s->buf,
			     r->length, 0);
	if (alone) {
		ret = raw_wait(rv, s);
		if (s->cap > RAW_SLOT_MAX) {
			free(s->buf); /* not kept: the ring's buffers stay small */
			s->buf = NULL;
			s->cap = 0;
		}
		return ret < 0 ? rv->err : 0;
	}
	return 0;
}

/* A MIRROR record: after every earlier record on its blocks (the DATA jobs
 * in flight on them are collected first; ZERO and MIRROR records were
 * applied by this thread already), before any later one (applied here,
 * before the next record is read).  Then MACK. */
static int apply_mirror(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	uint8_t *buf = malloc(r->length);
	const char *what = NULL;
	uint32_t crc;
	int ret;

	if (!buf)
		return fail(rv, -ENOMEM, "record %llu: cannot allocate %u payload bytes",
			    (unsigned long long)recno, (unsigned)r->length);
	ret = read_full(rv, buf, r->payload_len, "payload", recno);
	if (ret == 0 && any_busy(rv, r))
		ret = raw_drain(rv);
	while (ret == 0 && any_busy(rv, r))
		ret = reap(rv, true);
	if (ret < 0) {
		free(buf);
		return ret;
	}
	ret = ioc__mig_payload_decode(r, buf, buf, NULL, &what);
	crc = ioc_mig_crcs_set(rv->crcs, r->offset, r->length, buf);
	if (ret == 0 && crc != r->data_crc)
		ret = fail(rv, -EBADMSG, "record %llu (MIRROR) at image offset %llu: data "
			   "CRC mismatch (computed 0x%08x, record says 0x%08x)",
			   (unsigned long long)recno, (unsigned long long)r->offset,
			   (unsigned)crc, (unsigned)r->data_crc);
	else if (ret < 0)
		ret = fail(rv, ret, "record %llu (MIRROR): %s", (unsigned long long)recno, what);
	if (ret == 0 && (ret = node_write(rv, buf, r->length, r->offset)) < 0)
		ret = fail(rv, ret, "record %llu (MIRROR) at image offset %llu: cannot "
			   "write to the image: %s", (unsigned long long)recno,
			   (unsigned long long)r->offset, strerror(-ret));
	free(buf);
	if (ret < 0)
		return ret;
	rv->st->data_bytes += r->length;
	rv->mirrors++;
	ret = send_rec(rv, IOC_MIG_MACK, rv->mirrors, 0, 0);
	if (ret < 0)
		return fail(rv, ret, "record %llu (MIRROR): cannot send MACK: %s",
			    (unsigned long long)recno, strerror(-ret));
	return 0;
}

static int apply_zero(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	int ret = write_zeros(rv, r->offset, r->length);

	if (ret < 0)
		return fail(rv, ret, "record %llu (ZERO) at image offset %llu, length %u: "
			    "cannot zero the image: %s", (unsigned long long)recno,
			    (unsigned long long)r->offset, (unsigned)r->length,
			    strerror(-ret));
	ioc_mig_crcs_set(rv->crcs, r->offset, r->length, NULL);
	rv->st->zero_bytes += r->length;
	return 0;
}

static int finish(struct recv *rv, const struct ioc_mig_rec *r, uint64_t recno)
{
	uint64_t missing = 0;
	uint32_t sum = 0;
	int ret;

	drain(rv);
	if (rv->err)
		return rv->err;
	ret = ioc_node_flush_sync(rv->io_loop, rv->o->node);
	if (ret < 0)
		return fail(rv, ret, "END: flush of the image: %s", strerror(-ret));
	ret = ioc_mig_crcs_checksum(rv->crcs, &sum, &missing);
	if (ret == -ENODATA)
		return fail(rv, ret, "END (record %llu): block %llu (image offset %llu) "
			    "was never sent", (unsigned long long)recno,
			    (unsigned long long)missing,
			    (unsigned long long)(missing * rv->hdr.block_size));
	if (ret < 0)
		return fail(rv, ret, "END: image checksum: %s", strerror(-ret));
	if (sum != r->data_crc)
		return fail(rv, -EBADMSG, "END (record %llu): image checksum mismatch: "
			    "received image 0x%08x, sender's 0x%08x",
			    (unsigned long long)recno, (unsigned)sum, (unsigned)r->data_crc);
	ret = send_ack(rv, 0, sum, 0);
	if (ret < 0)
		return fail(rv, ret, "END: cannot send ACK: %s", strerror(-ret));
	return 0;
}

static int run(struct recv *rv)
{
	const struct ioc_mig_recv_opts *o = rv->o;
	uint8_t buf[IOC_MIG_REC_SIZE];
	const char *why = NULL;
	uint64_t recno;
	int ret;

	ret = read_full(rv, buf, IOC_MIG_HDR_SIZE, "header", 0);
	if (ret < 0)
		return ret;
	ret = ioc_mig_hdr_decode(buf, &rv->hdr, &why);
	if (ret < 0)
		return fail(rv, ret, "%s", why);
	if (rv->hdr.flags & IOC_MIG_F_HANDOVER)
		return fail(rv, -EPROTO, "header: the source hands over shared storage, "
			    "but this destination receives a copy into an image file");
	ret = ioc_mig_crcs_new(&rv->crcs, rv->hdr.image_size, rv->hdr.block_size);
	if (ret < 0)
		return fail(rv, ret, "header: cannot track %llu blocks: %s",
			    (unsigned long long)ioc__mig_nblocks(rv->hdr.image_size,
								 rv->hdr.block_size),
			    strerror(-ret));
	rv->seen = calloc((size_t)(ioc__mig_nblocks(rv->hdr.image_size,
						    rv->hdr.block_size) + 63) / 64,
			  sizeof(*rv->seen));
	rv->busy = calloc((size_t)(ioc__mig_nblocks(rv->hdr.image_size,
						    rv->hdr.block_size) + 63) / 64,
			  sizeof(*rv->busy));
	if (!rv->seen || !rv->busy)
		return fail(rv, -ENOMEM, "header: out of memory");
	ret = start_io(rv);
	if (ret < 0)
		return ret;
	ret = size_image(rv);
	if (ret < 0)
		return ret;
	rv->st->image_size = rv->hdr.image_size;

	for (recno = 1;; recno++) {
		uint64_t pos = rv->st->wire_bytes;
		struct ioc_mig_rec r;

		if (cancelled(rv))
			return fail(rv, -ECANCELED, "cancelled before record %llu",
				    (unsigned long long)recno);
		if (reap(rv, false) < 0)
			return rv->err;
		ret = read_full(rv, buf, IOC_MIG_REC_SIZE, "header", recno);
		if (ret < 0)
			return ret;
		ret = ioc_mig_rec_decode(buf, &rv->hdr, &r, &why);
		if (ret < 0)
			return fail(rv, ret, "record %llu at stream byte %llu (type %u, "
				    "offset %llu, length %u, payload_len %u): %s",
				    (unsigned long long)recno, (unsigned long long)pos,
				    (unsigned)r.type, (unsigned long long)r.offset,
				    (unsigned)r.length, (unsigned)r.payload_len, why);
		rv->st->records++;
		switch (r.type) {
		case IOC_MIG_DATA_RAW:
		case IOC_MIG_DATA_ZSTD:
		case IOC_MIG_ZERO:
			ret = claim_blocks(rv, &r, recno);
			if (ret < 0)
				break;
			ret = r.type == IOC_MIG_DATA_RAW ? apply_raw(rv, &r, recno) :
			      r.type == IOC_MIG_ZERO ? apply_zero(rv, &r, recno) :
			      start_data(rv, &r, recno);
			break;
		case IOC_MIG_MIRROR:
			ret = apply_mirror(rv, &r, recno);
			break;
		case IOC_MIG_PASS:
			/* Every write of the previous pass lands first. */
			drain(rv);
			if (rv->err)
				return rv->err;
			if (r.offset != rv->st->passes + 1)
				return fail(rv, -EPROTO, "record %llu (PASS) at stream byte %llu: "
					    "pass %llu after pass %llu",
					    (unsigned long long)recno, (unsigned long long)pos,
					    (unsigned long long)r.offset,
					    (unsigned long long)rv->st->passes);
			rv->st->passes++;
			memset(rv->seen, 0, (size_t)(ioc__mig_nblocks(rv->hdr.image_size,
						     rv->hdr.block_size) + 63) / 64 * 8);
			break;
		case IOC_MIG_END:
			ret = finish(rv, &r, recno);
			if (ret == 0 && o->progress)
				o->progress(o->opaque, rv->st);
			return ret;
		default:
			return fail(rv, -EPROTO, "record %llu at stream byte %llu: "
				    "%s from the sender", (unsigned long long)recno,
				    (unsigned long long)pos, type_name(r.type));
		}
		if (ret < 0)
			return ret;
		if (o->progress)
			o->progress(o->opaque, rv->st);
	}
}

/* ---- hand-over --------------------------------------------------------- */

int ioc_mig_receive_handover(const struct ioc_mig_recv_opts *o, char *id, size_t idlen,
			     uint64_t *size, char *why, size_t whylen)
{
	struct ioc_mig_recv_stats st = { 0 };
	struct recv rv = { .o = o, .st = &st, .why = why, .whylen = whylen };
	uint8_t buf[IOC_MIG_MAX_SHARED_ID];
	const char *what = NULL;
	struct ioc_mig_rec r;
	int ret;

	if (why && whylen)
		why[0] = '\0';
	*size = 0;
	ret = read_full(&rv, buf, IOC_MIG_HDR_SIZE, "header", 0);
	if (ret < 0)
		return ret;
	ret = ioc_mig_hdr_decode(buf, &rv.hdr, &what);
	if (ret < 0)
		return fail(&rv, ret, "%s", what);
	if (!(rv.hdr.flags & IOC_MIG_F_HANDOVER))
		return fail(&rv, -EPROTO, "header: the source sends a copy, but this "
			    "destination waits for a hand-over of shared storage (set the "
			    "capability __org.iocore_handover on the source)");
	ret = read_full(&rv, buf, IOC_MIG_REC_SIZE, "header", 1);
	if (ret < 0)
		return ret;
	ret = ioc_mig_rec_decode(buf, &rv.hdr, &r, &what);
	if (ret < 0)
		return fail(&rv, ret, "record 1 (type %u, offset %llu, length %u): %s",
			    (unsigned)r.type, (unsigned long long)r.offset, (unsigned)r.length,
			    what);
	if (r.type != IOC_MIG_HANDOVER)
		return fail(&rv, -EPROTO, "record 1: %s from the sender, not HANDOVER",
			    type_name(r.type));
	ret = read_full(&rv, buf, r.payload_len, "payload", 1);
	if (ret < 0)
		return ret;
	ret = ioc_mig_handover_decode(&r, buf, id, idlen, &what);
	if (ret < 0)
		return fail(&rv, ret, "record 1 (HANDOVER): %s", what);
	*size = rv.hdr.image_size;
	return 0;
}

int ioc_mig_send_ready(const struct ioc_mig_recv_opts *o, int err)
{
	struct ioc_mig_recv_stats st = { 0 };
	struct recv rv = { .o = o, .st = &st };

	return send_rec(&rv, IOC_MIG_READY, (uint64_t)(err < 0 ? -err : err), 0, 0);
}

int ioc_mig_receive(const struct ioc_mig_recv_opts *o,
		    struct ioc_mig_recv_stats *st, char *why, size_t whylen)
{
	struct ioc_mig_recv_stats local;
	struct recv rv = {
		.o = o, .st = st ? st : &local, .why = why, .whylen = whylen,
	};
	int ret;

	memset(rv.st, 0, sizeof(*rv.st));
	if (why && whylen)
		why[0] = '\0';
	pthread_mutex_init(&rv.dctx_lock, NULL);
	ret = run(&rv);
	if (ret < 0) {
		/* The jobs own memory and may be writing: collect them all. */
		drain(&rv);
		/* Best effort: tell the sender, unless that would block. */
		(void)send_ack(&rv, ret, 0, MSG_DONTWAIT);
	}
	if (rv.wq)
		ioc_wq_free(rv.wq);
	if (rv.io) {
		/* No request in flight (drained): the node forgets the loop. */
		ioc_iothread_call(rv.io, io_loop_exit, o->node);
		ioc_iothread_stop(rv.io);
	}
	for (unsigned i = 0; i < rv.ndctx; i++)
		ZSTD_freeDCtx(rv.dctx[i]);
	free(rv.dctx);
	pthread_mutex_destroy(&rv.dctx_lock);
	for (unsigned i = 0; i < RAW_SLOTS; i++)
		free(rv.raw[i].buf);
	free(rv.seen);
	free(rv.busy);
	ioc_mig_crcs_free(rv.crcs);
	return ret;
}
