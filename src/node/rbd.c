/*
 * Ceph RBD block nodes (driver "rbd", QEMU's BlockdevOptionsRbd) on
 * librbd's C API.
 *
 * The problem: librbd completes requests on its own threads, while a
 * node's requests come from coroutines on any loop, each of which must
 * resume on its home loop.  QEMU's per-request callback schedules a bottom
 * half: a thread hop per request, through librbd's one callback thread.
 *
 * The design: the image's completion notification is an eventfd
 * (rbd_set_image_notification); librbd queues each finished request and
 * signals it.  Each loop that submits registers the eventfd the first time
 * it does (rbd_loop_register); whichever registered loop wakes first takes
 * the queue (rbd_poll_io_events) and finishes each request with
 * ioc_co_await_done(), which enters the coroutine in place when it is at
 * home there and posts it to its loop otherwise.  One loop per node (an
 * NBD export's usual case): no hop beyond librbd's eventfd write.  Cost:
 * a signal wakes every registered loop (fine for a few; a loop past
 * RBD_MAX_LOOPS relies on the others).  Synchronous calls (diff, resize,
 * and in a coroutine an open or a hand-over's flush and lock) run on the
 * loop's thread pool: a slow cluster never stalls a loop.
 *
 * Locking: a writable node takes the exclusive lock at open
 * (rbd_lock_acquire), so librbd will not hand it over: a second iocore
 * writer is refused at open, naming the owner; QEMU's write fails with
 * EROFS.  __org.iocore_lock=auto keeps librbd's cooperative default (the
 * lock moves to whoever writes, as between two QEMUs in a migration).
 * Persistent dirty bitmaps live in the cluster beside the image, written
 * only by the lock holder (rbd-bitmap.c, with what lock=auto does).
 *
 * Faults: __org.iocore_timeout (seconds) sets librados' OSD, monitor and
 * mount timeouts; a request that times out fails with EIO.  The default,
 * 0, waits forever, as QEMU and the kernel client do: an OSD restart or a
 * peering pause is ordinary in Ceph and ends by itself, while a guest file
 * system that sees EIO remounts read-only (an open: client_mount_timeout).
 *
 * Rejected: a completion thread per node (a second hop), rbd_aio_wait_
 * for_complete (blocks a loop), one image handle per loop (separate lock
 * owners, fighting over the exclusive lock).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <rados/librados.h>
#include <rbd/librbd.h>
#pragma GCC diagnostic pop

#include "iocore/co.h"
#include "iocore/pool.h"
#include "node/node.h"
#include "node/rbd.h"
#include "node/node-int.h"
#include "node/rbd-bitmap.h"

/* Loops that register the event fd; the others rely on them. */
#define RBD_MAX_LOOPS IOC_NODE_MAX_SLOTS
/* Completions taken per rbd_poll_io_events() call. */
#define RBD_POLL_BATCH 32
/* rbd_diff_iterate2 callback's "stop here" (any value librbd never uses). */
#define RBD_DIFF_STOP (-9000)

enum { RBD_LOCK_EXCLUSIVE, RBD_LOCK_AUTO };

struct rbd_node {
	rados_t cluster;
	rados_ioctx_t io;
	rbd_image_t image;
	struct rbd_bitmaps *bm;         /* persistent bitmaps (rbd-bitmap.c) */
	int efd;                        /* the image's completion eventfd */
	uint64_t features;
	uint64_t obj_size;
	/* Loops with efd registered: appended under reg_lock, read
	 * lock-free (nloops: release store in rbd_loop_register, acquire
	 * load in rbd_loop_registered). */
	pthread_mutex_t reg_lock;
	_Atomic unsigned nloops;
	struct ioc_loop *loops[RBD_MAX_LOOPS];
	char name[256];                 /* pool/[ns/]image[@snap], for messages */
	/* Hand-over (rbd_node_inactivate()): whether this node takes the
	 * exclusive lock, the bitmaps' mode and what names the image for
	 * another host (ioc_node_shared_id()). */
	bool take_lock;
	enum rbd_bm_mode bm_mode;
	char pool[128], ns[128];
	char shared[1024];               /* the shared id; "": none (too long) */
};

/* ---- options --------------------------------------------------------- */

static const char *const rbd_auth_modes[] = { "cephx", "none", NULL };
static const char *const rbd_lock_modes[] = { "exclusive", "auto", NULL };

static const struct ioc__qmp_arg rbd_server_members[] = {
	{ .name = "host", .type = IOC_QMP_STR },
	{ .name = "port", .type = IOC_QMP_STR },
	{ 0 },
};

static const struct ioc__qmp_arg rbd_opts[] = {
	{ .name = "pool", .type = IOC_QMP_STR },
	{ .name = "namespace", .type = IOC_QMP_STR, .optional = true },
	{ .name = "image", .type = IOC_QMP_STR },
	{ .name = "conf", .type = IOC_QMP_STR, .optional = true },
	{ .name = "snapshot", .type = IOC_QMP_STR, .optional = true },
	{ .name = "encrypt", .type = IOC_QMP_ANY, .optional = true, .open = true },
	{ .name = "user", .type = IOC_QMP_STR, .optional = true },
	{ .name = "auth-client-required", .type = IOC_QMP_ARRAY, .optional = true,
	  .elem = IOC_QMP_ENUM, .values = rbd_auth_modes },
	{ .name = "key-secret", .type = IOC_QMP_STR, .optional = true },
	{ .name = "server", .type = IOC_QMP_ARRAY, .optional = true,
	  .elem = IOC_QMP_OBJECT, .members = rbd_server_members },
	/* Seconds before a request to an unresponsive cluster fails with
	 * EIO; 0 (the default) waits forever (the essay above says why). */
	{ .name = "__org.iocore_timeout", .type = IOC_QMP_UINT, .optional = true,
	  .min = 0, .max = 86400 },
	{ .name = "__org.iocore_lock", .type = IOC_QMP_ENUM, .optional = true,
	  .values = rbd_lock_modes },
	/* Opened for an incoming hand-over: no lock taken, no bitmaps
	 * loaded, writes refused until the node is activated. */
	{ .name = "__org.iocore_inactive", .type = IOC_QMP_BOOL, .optional = true },
	/* Ceph settings (key: value), as the "rbd:" file name's pairs. */
	{ .name = "__org.iocore_conf", .type = IOC_QMP_OBJECT, .optional = true,
	  .open = true },
	{ 0 },
};

static const char *opt_str(json_t *opts, const char *key)
{
	return json_string_value(json_object_get(opts, key));
}

/* ---- completions ----------------------------------------------------- */

/*
 * The event fd's handler, on any registered loop.  The handshake with
 * librbd (AioCompletion::complete_event_socket): librbd pushes the
 * completion onto the image's queue, then writes the eventfd.  Here the
 * eventfd is read (reset) first and the queue taken after, so a push that
 * the take misses came after the reset and its write makes the fd
 * readable again: no completion waits without a signal.  Several loops
 * may run this at once; the queue is librbd's and thread-safe, and each
 * completion is taken once.
 *
 * After the first ioc_co_await_done() the node may be gone (a coroutine
 * entered in place can finish the last request, and the node be closed),
 * so every completion is taken and released first, and a full batch
 * re-signals the fd instead of polling again.
 */
/* A request's hand-off through librbd (submitted on one loop, its
 * completion polled on whichever loop wakes first) is ordered by librbd's
 * own locks, which ThreadSanitizer does not see (librbd is not built with
 * it): the annotations state that order, a release at submission and an
 * acquire where the completion is taken. */
#if IOC_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define rbd_tsan_release(p) __tsan_release(p)
#define rbd_tsan_acquire(p) __tsan_acquire(p)
#else
#define rbd_tsan_release(p) ((void)(p))
#define rbd_tsan_acquire(p) ((void)(p))
#endif

static void rbd_event_read(void *opaque)
{
	struct rbd_node *s = opaque;
	rbd_completion_t comps[RBD_POLL_BATCH];
	struct ioc_co_await *aw[RBD_POLL_BATCH];
	int64_t res[RBD_POLL_BATCH];
	eventfd_t v;
	int r;

	if (eventfd_read(s->efd, &v) < 0 && errno != EAGAIN)
		return;
	r = rbd_poll_io_events(s->image, comps, RBD_POLL_BATCH);
	if (r <= 0)
		return;
	if (r == RBD_POLL_BATCH)
		eventfd_write(s->efd, 1);
	for (int i = 0; i < r; i++) {
		aw[i] = rbd_aio_get_arg(comps[i]);
		rbd_tsan_acquire(aw[i]);
		res[i] = rbd_aio_get_return_value(comps[i]);
		rbd_aio_release(comps[i]);
	}
	for (int i = 0; i < r; i++)
		ioc_co_await_done(aw[i], res[i]);
}

static bool rbd_loop_registered(struct rbd_node *s, struct ioc_loop *loop)
{
	/* Pairs with the release store in rbd_loop_register(). */
	unsigned n = atomic_load_explicit(&s->nloops, memory_order_acquire);

	for (unsigned i = 0; i < n; i++)
		/* Relaxed: see rbd_node_loop_exit(). */
		if (__atomic_load_n(&s->loops[i], __ATOMIC_RELAXED) == loop)
			return true;
	return n == RBD_MAX_LOOPS;
}

/* Make sure the calling coroutine's loop watches the event fd.  O(loops)
 * per request; fine for the handful a node serves. */
static int rbd_loop_register(struct rbd_node *s)
{
	struct ioc_loop *loop = ioc_loop_current();
	unsigned n;
	int r = 0;

	if (!loop)
		return -EINVAL;
	if (rbd_loop_registered(s, loop))
		return 0;
	pthread_mutex_lock(&s->reg_lock);
	n = atomic_load_explicit(&s->nloops, memory_order_relaxed);
	if (!rbd_loop_registered(s, loop)) {
		unsigned slot = n;

		/* An entry a stopped loop left (rbd_node_loop_exit()) first. */
		for (unsigned i = 0; i < n && slot == n; i++)
			if (!__atomic_load_n(&s->loops[i], __ATOMIC_RELAXED))
				slot = i;
		r = slot == RBD_MAX_LOOPS ? -EMFILE :
		    ioc_loop_set_fd(loop, s->efd, rbd_event_read, NULL, NULL, NULL, s);
		if (r == 0) {
			__atomic_store_n(&s->loops[slot], loop, __ATOMIC_RELAXED);
			/* Pairs with the acquire load in rbd_loop_registered(). */
			if (slot == n)
				atomic_store_explicit(&s->nloops, n + 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&s->reg_lock);
	return r;
}

/* This loop stops: drop its handler (the node stays open for others).
 * Its entry becomes NULL rather than moving, so lock-free lookups of
 * other loops never miss theirs. */
static void rbd_node_loop_exit(struct ioc_node *n)
{
	struct rbd_node *s = n->opaque;
	struct ioc_loop *loop = ioc_loop_current();
	unsigned cnt;

	if (!s || !loop)
		return;
	pthread_mutex_lock(&s->reg_lock);
	cnt = atomic_load_explicit(&s->nloops, memory_order_relaxed);
	for (unsigned i = 0; i < cnt; i++) {
		if (__atomic_load_n(&s->loops[i], __ATOMIC_RELAXED) != loop)
			continue;
		ioc_loop_set_fd(loop, s->efd, NULL, NULL, NULL, NULL, NULL);
		/* Relaxed: other loops only compare it with themselves. */
		__atomic_store_n(&s->loops[i], NULL, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->reg_lock);
}

static int rbd_unregister_fn(void *arg)
{
	struct rbd_node *s = arg;
	struct ioc_loop *loop = ioc_loop_current();

	return ioc_loop_set_fd(loop, s->efd, NULL, NULL, NULL, NULL, NULL);
}

/* At close, on the main thread: each registered loop drops the handler
 * on its own thread (ioc_loop_call waits for it, and so for any handler
 * run in progress there).  Every loop that submitted must still run. */
static void rbd_loops_unregister(struct rbd_node *s)
{
	unsigned n = atomic_load_explicit(&s->nloops, memory_order_acquire);

	for (unsigned i = 0; i < n; i++) {
		struct ioc_loop *l = __atomic_load_n(&s->loops[i], __ATOMIC_RELAXED);

		if (!l)
			continue; /* its loop left (rbd_node_loop_exit()) */
		if (ioc_loop_current() == l || ioc_loop_in_thread(l))
			ioc_loop_set_fd(l, s->efd, NULL, NULL, NULL, NULL, NULL);
		else
			ioc_loop_call(l, rbd_unregister_fn, s);
	}
	/* No request is in flight and no loop runs the handler any more
	 * (each ioc_loop_call above returned): nothing reads it concurrently. */
	atomic_store_explicit(&s->nloops, 0, memory_order_relaxed);
}

/* librbd's errors as a block device's: an operation that timed out
 * (rados_osd_op_timeout) or a client the cluster blocklisted is EIO. */
static int rbd_io_errno(int64_t r)
{
	if (r >= 0)
		return 0;
	if (r == -ETIMEDOUT || r == -ESHUTDOWN)
		return -EIO;
	return (int)r;
}

enum rbd_op { RBD_READ, RBD_WRITE, RBD_DISCARD, RBD_ZERO, RBD_FLUSH };

static int ioc_coroutine_fn rbd_co_io(struct ioc_node *n, enum rbd_op op, uint64_t off,
				      uint64_t len, const struct iovec *iov, int iovcnt,
				      int zero_flags)
{
	struct rbd_node *s = n->opaque;
	struct ioc_co_await aw;
	rbd_completion_t c;
	int r;

	r = rbd_loop_register(s);
	if (r < 0)
		return r;
	ioc_co_await_init(&aw);
	rbd_tsan_release(&aw);
	/* No callback: completions come through the event fd only. */
	r = rbd_aio_create_completion(&aw, NULL, &c);
	if (r < 0)
		return r;
	switch (op) {
	case RBD_READ:
		r = rbd_aio_readv(s->image, iov, iovcnt, off, c);
		break;
	case RBD_WRITE:
		r = rbd_aio_writev(s->image, iov, iovcnt, off, c);
		break;
	case RBD_DISCARD:
		r = rbd_aio_discard(s->image, off, len, c);
		break;
	case RBD_ZERO:
		r = rbd_aio_write_zeroes(s->image, off, (size_t)len, c, zero_flags, 0);
		break;
	case RBD_FLUSH:
		r = rbd_aio_flush(s->image, c);
		break;
	}
	if (r < 0) {
		rbd_aio_release(c);
		return r;
	}
	return rbd_io_errno(ioc_co_await(&aw));
}

/* ---- I/O ------------------------------------------------------------- */

static size_t iov_len(const struct iovec *iov, int iovcnt)
{
	size_t len = 0;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	return len;
}

static int ioc_coroutine_fn rbd_co_preadv(struct ioc_node *n, uint64_t off,
					  const struct iovec *iov, int iovcnt, uint32_t flags)
{
	return rbd_co_io(n, RBD_READ, off, iov_len(iov, iovcnt), iov, iovcnt, 0);
}

static int ioc_coroutine_fn rbd_co_flush(struct ioc_node *n, uint32_t flags)
{
	return rbd_co_io(n, RBD_FLUSH, 0, 0, NULL, 0, 0);
}

/* FUA: librbd has no per-write flag, so a write then a flush (what QEMU's
 * generic layer does for rbd). */
static int ioc_coroutine_fn rbd_co_pwritev(struct ioc_node *n, uint64_t off,
					   const struct iovec *iov, int iovcnt, uint32_t flags)
{
	int r = rbd_co_io(n, RBD_WRITE, off, iov_len(iov, iovcnt), iov, iovcnt, 0);

	if (r == 0 && (flags & IOC_NODE_FUA))
		r = rbd_co_flush(n, 0);
	return r;
}

static int ioc_coroutine_fn rbd_co_discard(struct ioc_node *n, uint64_t off,
					   uint64_t len, uint32_t flags)
{
	return rbd_co_io(n, RBD_DISCARD, off, len, NULL, 0, 0);
}

/* Without MAY_UNMAP the zeroes are written (thick), as QEMU asks; with it
 * librbd discards whole objects and zeroes the edges.  Neither is
 * guaranteed fast, so NO_FALLBACK is refused (can_fast_zero is false). */
static int ioc_coroutine_fn rbd_co_write_zeroes(struct ioc_node *n, uint64_t off,
						uint64_t len, uint32_t flags)
{
	int zf = (flags & IOC_NODE_MAY_UNMAP) ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION;
	int r = 0;

	if (flags & IOC_NODE_NO_FALLBACK)
		return -ENOTSUP;
	while (len && r == 0) {
		uint64_t chunk = len < (1ull << 30) ? len : (1ull << 30);

		r = rbd_co_io(n, RBD_ZERO, off, chunk, NULL, 0, zf);
		off += chunk;
		len -= chunk;
	}
	if (r == 0 && (flags & IOC_NODE_FUA))
		r = rbd_co_flush(n, 0);
	return r;
}

/* ---- block status and resize (synchronous calls, on the pool) --------- */

struct rbd_diff {
	struct rbd_node *s;
	uint64_t off, end;      /* the range asked about */
	bool whole_object;
	bool found;             /* first data run: [start, stop) */
	uint64_t start, stop;
};

static int rbd_diff_cb(uint64_t offs, size_t len, int exists, void *opaque)
{
	struct rbd_diff *d = opaque;
	uint64_t lo = offs, hi = offs + len;

	if (!exists || hi <= d->off)
		return 0;
	if (lo < d->off)
		lo = d->off;
	if (hi > d->end)
		hi = d->end;
	if (lo >= hi)
		return 0;
	if (!d->found) {
		d->found = true;
		d->start = lo;
		d->stop = hi;
		/* A hole before the first data: that is the answer. */
		return lo > d->off ? RBD_DIFF_STOP : 0;
	}
	if (lo == d->stop) {
		d->stop = hi;
		return 0;
	}
	return RBD_DIFF_STOP;
}

static int64_t rbd_diff_fn(void *arg)
{
	struct rbd_diff *d = arg;
	/* Start object-aligned: librbd before 2022 reported wrong offsets
	 * for an unaligned start with whole_object (QEMU works around it
	 * the same way); the callback clips. */
	uint64_t from = d->whole_object ? d->off / d->s->obj_size * d->s->obj_size : d->off;
	int r = rbd_diff_iterate2(d->s->image, NULL, from, d->end - from, 1,
				  d->whole_object, rbd_diff_cb, d);

	return r == RBD_DIFF_STOP ? 0 : r;
}

static int ioc_coroutine_fn rbd_co_block_status(struct ioc_node *n, uint64_t off,
						uint64_t len, uint64_t *pnum,
						unsigned *depth)
{
	struct rbd_node *s = n->opaque;
	struct rbd_diff d = { .s = s, .off = off };
	uint64_t flags = 0;
	int64_t r;

	/* With fast-diff the object map answers per object, cheaply;
	 * without it librbd lists each object's extents, so ask about less. */
	d.whole_object = (s->features & RBD_FEATURE_FAST_DIFF) &&
			 rbd_get_flags(s->image, &flags) == 0 &&
			 !(flags & RBD_FLAG_FAST_DIFF_INVALID);
	if (!d.whole_object && len > 16 * s->obj_size)
		len = 16 * s->obj_size;
	d.end = off + len;
	r = ioc_pool_co_run(NULL, rbd_diff_fn, &d);
	if (r < 0)
		return rbd_io_errno(r);
	if (depth)
		*depth = 1;
	if (d.found && d.start == off) {
		*pnum = d.stop - off;
		return IOC_NODE_ST_DATA | IOC_NODE_ST_ALLOCATED;
	}
	*pnum = (d.found ? d.start : d.end) - off;
	return IOC_NODE_ST_ZERO | IOC_NODE_ST_ALLOCATED;
}

struct rbd_resize_arg {
	struct rbd_node *s;
	uint64_t size;
};

static int64_t rbd_resize_fn(void *arg)
{
	struct rbd_resize_arg *rs = arg;

	return rbd_resize(rs->s->image, rs->size);
}

static int ioc_coroutine_fn rbd_co_truncate(struct ioc_node *n, uint64_t size)
{
	struct rbd_resize_arg rs = { .s = n->opaque, .size = size };
	struct ioc_blk_dirty_info any;
	int64_t r;

	/* The bitmaps cover the old size: none may exist (as for qcow2). */
	if (n->dirty_set && ioc_blk_dirty_list(n->dirty_set, &any, 1) > 0)
		return -EBUSY;
	r = ioc_pool_co_run(NULL, rbd_resize_fn, &rs);
	if (r < 0)
		return rbd_io_errno(r);
	n->size = size;
	return ioc__rbd_bitmaps_resize(rs.s->bm, size);
}

/* ---- open and close -------------------------------------------------- */

/* The image's close flushes its cache and unwatches its header: it waits
 * for the OSDs (ioc__rbd_blocking()). */
static int64_t rbd_shut_fn(void *arg)
{
	struct rbd_node *s = arg;

	if (s->image)
		rbd_close(s->image);
	if (s->io)
		rados_ioctx_destroy(s->io);
	if (s->cluster)
		rados_shutdown(s->cluster);
	return 0;
}

static void rbd_node_free(struct rbd_node *s)
{
	ioc__rbd_bitmaps_free(s->bm);
	(void)ioc__rbd_blocking(rbd_shut_fn, s);
	if (s->efd >= 0)
		close(s->efd);
	pthread_mutex_destroy(&s->reg_lock);
	free(s);
}

static int conf_set(struct rbd_node *s, const char *key, const char *val,
		    char *err, size_t errlen)
{
	int r = rados_conf_set(s->cluster, key, val);

	if (r < 0)
		snprintf(err, errlen, "invalid conf option %s: %s", key, strerror(-r));
	return r;
}

/* The options that configure librados before it connects. */
static int rbd_configure(struct rbd_node *s, json_t *opts, bool direct, char *err,
			 size_t errlen)
{
	const char *conf = opt_str(opts, "conf");
	json_t *v, *extra = json_object_get(opts, "__org.iocore_conf");
	json_int_t timeout = json_integer_value(json_object_get(opts, "__org.iocore_timeout"));
	const char *key;
	int r;

	/* Discard reads back as zeroes, edges included (librbd's default
	 * skips a discard's unaligned head and tail): a discarded range then
	 * compares equal to zeroes, on a mirror's source and destination
	 * alike.  Costs a zero write per unaligned edge.  A conf file or
	 * the conf pairs may set it back. */
	if ((r = conf_set(s, "rbd_skip_partial_discard", "false", err, errlen)) < 0)
		return r;
	if (conf) {
		r = rados_conf_read_file(s->cluster, conf);
		if (r < 0) {
			snprintf(err, errlen, "error reading conf file %s: %s", conf,
				 strerror(-r));
			return r;
		}
	} else {
		/* The default search path (CEPH_CONF, /etc/ceph/...); none is
		 * fine (QEMU ignores it too): "server" may name the monitors. */
		rados_conf_read_file(s->cluster, NULL);
	}
	if (json_is_object(extra)) {
		json_object_foreach(extra, key, v) {
			if (!json_is_string(v)) {
				snprintf(err, errlen, "conf option %s: not a string", key);
				return -EINVAL;
			}
			if ((r = conf_set(s, key, json_string_value(v), err, errlen)) < 0)
				return r;
		}
	}
	v = json_object_get(opts, "server");
	if (json_is_array(v) && json_array_size(v)) {
		char hosts[1024];
		size_t i, len = 0;
		json_t *e;

		json_array_foreach(v, i, e) {
			const char *h = opt_str(e, "host"), *p = opt_str(e, "port");
			bool v6 = h && strchr(h, ':');

			if (!h || !p) {
				snprintf(err, errlen, "server.%zu needs host and port", i);
				return -EINVAL;
			}
			len += (size_t)snprintf(hosts + len, len < sizeof(hosts) ? sizeof(hosts) - len : 0,
						"%s%s%s%s:%s", i ? "," : "", v6 ? "[" : "",
						h, v6 ? "]" : "", p);
			if (len >= sizeof(hosts)) {
				snprintf(err, errlen, "server list too long");
				return -EINVAL;
			}
		}
		if ((r = conf_set(s, "mon_host", hosts, err, errlen)) < 0)
			return r;
	}
	v = json_object_get(opts, "auth-client-required");
	if (json_is_array(v) && json_array_size(v)) {
		char modes[64] = "";
		size_t i;
		json_t *e;

		json_array_foreach(v, i, e) {
			const char *m = json_string_value(e);

			if (!m || (strcmp(m, "cephx") && strcmp(m, "none"))) {
				snprintf(err, errlen, "auth-client-required: cephx or none");
				return -EINVAL;
			}
			if (strlen(modes) + strlen(m) + 2 > sizeof(modes))
				return -EINVAL;
			if (i)
				strcat(modes, ";");
			strcat(modes, m);
		}
		if ((r = conf_set(s, "auth_client_required", modes, err, errlen)) < 0)
			return r;
	}
	/* cache.direct=on is rbd_cache=false, as in QEMU. */
	if ((r = conf_set(s, "rbd_cache", direct ? "false" : "true", err, errlen)) < 0)
		return r;
	if (timeout > 0) {
		char t[32];

		snprintf(t, sizeof(t), "%" JSON_INTEGER_FORMAT, timeout);
		if ((r = conf_set(s, "rados_osd_op_timeout", t, err, errlen)) < 0 ||
		    (r = conf_set(s, "rados_mon_op_timeout", t, err, errlen)) < 0 ||
		    (r = conf_set(s, "client_mount_timeout", t, err, errlen)) < 0)
			return r;
	}
	return 0;
}

/* Take the exclusive lock, or say who has it. */
static int rbd_take_lock(struct rbd_node *s, char *err, size_t errlen)
{
	int r = rbd_lock_acquire(s->image, RBD_LOCK_MODE_EXCLUSIVE);
	char *owners[4];
	size_t nown = IOC_ARRAY_SIZE(owners);
	rbd_lock_mode_t mode;

	if (r == 0)
		return 0;
	if (rbd_lock_get_owners(s->image, &mode, owners, &nown) == 0 && nown > 0) {
		snprintf(err, errlen, "image %s is locked by another client (%s): %s",
			 s->name, owners[0], strerror(-r));
		rbd_lock_get_owners_cleanup(owners, nown);
	} else {
		snprintf(err, errlen, "could not lock image %s: %s", s->name, strerror(-r));
	}
	return r == -EROFS ? -EBUSY : r;
}

/* QEMU's name for an image without a file: "json:" and the options that
 * locate it, in QEMU's order and spacing. */
static char *filename_json(json_t *opts)
{
	static const char *const keys[] = { "pool", "namespace", "image", "snapshot",
					     "conf", "user" };
	json_t *o = json_object();
	char *s, *out = NULL;

	if (!o)
		return NULL;
	for (size_t i = 0; i < IOC_ARRAY_SIZE(keys); i++)
		if (opt_str(opts, keys[i]))
			json_object_set_new(o, keys[i], json_string(opt_str(opts, keys[i])));
	json_object_set_new(o, "driver", json_string("rbd"));
	s = json_dumps(o, JSON_PRESERVE_ORDER);
	json_decref(o);
	if (s && asprintf(&out, "json:%s", s) < 0)
		out = NULL;
	free(s);
	return out;
}

/* The image's snapshots as QEMU lists an rbd image's: the name as id and
 * name, the snapshot's size as vm-state-size, no dates.  NULL: none, or
 * librbd could not say (the query then goes without them, as QEMU's). */
static json_t *snapshots_json(struct rbd_node *s)
{
	rbd_snap_info_t *snaps = NULL;
	int max = 16, r;
	json_t *list;

	for (;;) {
		rbd_snap_info_t *m = realloc(snaps, (size_t)max * sizeof(*snaps));

		if (!m) {
			free(snaps);
			return NULL;
		}
		snaps = m;
		r = rbd_snap_list(s->image, snaps, &max);
		if (r != -ERANGE || max > 65536)
			break;
	}
	if (r <= 0) {
		free(snaps);
		return NULL;
	}
	list = json_array();
	for (int i = 0; i < r && list; i++)
		json_array_append_new(list, json_pack("{s:i,s:i,s:s,s:i,s:i,s:i,s:s,s:I}",
			"icount", 0, "vm-clock-nsec", 0, "name", snaps[i].name, "date-sec", 0,
			"date-nsec", 0, "vm-clock-sec", 0, "id", snaps[i].name,
			"vm-state-size", (json_int_t)snaps[i].size));
	rbd_snap_list_end(snaps);
	free(snaps);
	return list;
}

/* query-named-block-nodes: the object size as the cluster size, QEMU's
 * (empty) rbd format-specific part, the snapshots, and no actual-size
 * (QEMU has none for an image on a cluster). */
static void rbd_node_info(struct ioc_node *n, json_t *image)
{
	struct rbd_node *s = n->opaque;
	json_t *snaps = snapshots_json(s);

	json_object_del(image, "actual-size");
	if (snaps)
		json_object_set_new(image, "snapshots", snaps);
	json_object_set_new(image, "cluster-size", json_integer((json_int_t)s->obj_size));
	json_object_set_new(image, "format-specific",
			    json_pack("{s:s,s:{}}", "type", "rbd", "data"));
}

/* The image's persistent bitmaps into s->bm (n->dirty_set). */
static int rbd_bitmaps_load(struct ioc_node *n, struct rbd_node *s, char *err, size_t errlen)
{
	/* The bitmaps get an ioctx of their own: its last version is
	 * theirs, never one of librbd's ops. */
	rados_ioctx_t bio;
	int r = rados_ioctx_create(s->cluster, s->pool, &bio);

	if (r < 0) {
		snprintf(err, errlen, "error opening pool %s: %s", s->pool, strerror(-r));
		return r;
	}
	rados_ioctx_set_namespace(bio, s->ns);
	return ioc__rbd_bitmaps_open(n, s->cluster, bio, s->image, s->bm_mode, &s->bm, err,
				     errlen);
}

/* One librbd call on a node, for ioc__rbd_blocking(). */
struct rbd_call {
	struct rbd_node *s;
	char *err;
	size_t errlen;
};

static int64_t rbd_flush_fn(void *arg)
{
	struct rbd_call *c = arg;

	return rbd_flush(c->s->image);
}

static int64_t rbd_release_fn(void *arg)
{
	struct rbd_call *c = arg;

	return rbd_lock_release(c->s->image);
}

static int64_t rbd_take_fn(void *arg)
{
	struct rbd_call *c = arg;

	return rbd_take_lock(c->s, c->err, c->errlen);
}

/* The open's connect, pool and image. */
struct rbd_open_job {
	struct rbd_node *s;
	const char *pool, *ns, *image, *snap;
	bool read_only;
	char *err;
	size_t errlen;
};

static int64_t rbd_open_fn(void *arg)
{
	struct rbd_open_job *j = arg;
	struct rbd_node *s = j->s;
	int r = rados_connect(s->cluster);
	if (r < 0) {
		snprintf(j->err, j->errlen, "error connecting: %s", strerror(-r));
		return r;
	}
	r = rados_ioctx_create(s->cluster, j->pool, &s->io);
	if (r < 0) {
		s->io = NULL;
		snprintf(j->err, j->errlen, "error opening pool %s: %s", j->pool, strerror(-r));
		return r;
	}
	rados_ioctx_set_namespace(s->io, j->ns ? j->ns : "");
	r = j->read_only ? rbd_open_read_only(s->io, j->image, &s->image, j->snap)
			 : rbd_open(s->io, j->image, &s->image, NULL);
	if (r < 0) {
		s->image = NULL;
		snprintf(j->err, j->errlen, "error reading header from %s: %s", j->image,
			 strerror(-r));
	}
	return r;
}

static int rbd_node_open(struct ioc_node *n, json_t *opts, char *err, size_t errlen)
{
	const char *pool = opt_str(opts, "pool"), *image = opt_str(opts, "image");
	const char *ns = opt_str(opts, "namespace"), *snap = opt_str(opts, "snapshot");
	const char *user = opt_str(opts, "user"), *lock = opt_str(opts, "__org.iocore_lock");
	struct rbd_open_job job = { NULL, pool, ns, image, snap, false, err, errlen };
	struct rbd_node *s;
	int r;

	if (!pool || !image) {
		snprintf(err, errlen, "Parameter '%s' is missing", pool ? "image" : "pool");
		return -EINVAL;
	}
	if (json_object_get(opts, "encrypt")) {
		snprintf(err, errlen, "rbd encryption (encrypt) is not supported");
		return -ENOTSUP;
	}
	if (json_object_get(opts, "key-secret")) {
		snprintf(err, errlen, "key-secret is not supported (no secret objects); "
			 "give the key in a keyring file named by conf");
		return -ENOTSUP;
	}
	if (lock && strcmp(lock, "exclusive") && strcmp(lock, "auto")) {
		snprintf(err, errlen, "__org.iocore_lock: exclusive or auto");
		return -EINVAL;
	}
	if (snap && !n->read_only) {
		if (!json_is_true(json_object_get(opts, "auto-read-only"))) {
			snprintf(err, errlen, "rbd snapshots are always read-only");
			return -EINVAL;
		}
		n->read_only = true;
	}
	job.read_only = n->read_only;

	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	s->efd = -1;
	pthread_mutex_init(&s->reg_lock, NULL);
	snprintf(s->name, sizeof(s->name), "%.60s/%.60s%s%.60s%s%.60s", pool,
		 ns ? ns : "", ns && *ns ? "/" : "", image, snap ? "@" : "", snap ? snap : "");

	r = rados_create(&s->cluster, user);
	if (r < 0) {
		s->cluster = NULL;
		snprintf(err, errlen, "error initializing: %s", strerror(-r));
		goto fail;
	}
	if ((r = rbd_configure(s, opts, n->direct, err, errlen)) < 0)
		goto fail;
	job.s = s;
	if ((r = ioc__rbd_blocking(rbd_open_fn, &job)) < 0)
		goto fail;

	s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->efd < 0) {
		r = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(-r));
		goto fail;
	}
	r = rbd_set_image_notification(s->image, s->efd, EVENT_TYPE_EVENTFD);
	if (r < 0) {
		snprintf(err, errlen, "rbd_set_image_notification: %s", strerror(-r));
		goto fail;
	}
	{
		rbd_image_info_t info;
		uint64_t size = 0;

		if ((r = rbd_get_size(s->image, &size)) < 0 ||
		    (r = rbd_get_features(s->image, &s->features)) < 0 ||
		    (r = rbd_stat(s->image, &info, sizeof(info))) < 0) {
			snprintf(err, errlen, "error reading %s: %s", s->name, strerror(-r));
			goto fail;
		}
		s->obj_size = info.obj_size ? info.obj_size : (4u << 20);
		n->size = size;
	}
	s->take_lock = !n->read_only && (s->features & RBD_FEATURE_EXCLUSIVE_LOCK) &&
		       !(lock && !strcmp(lock, "auto"));
	s->bm_mode = n->read_only ? RBD_BM_READ :
		     lock && !strcmp(lock, "auto") ? RBD_BM_SHARED : RBD_BM_OWNER;
	snprintf(s->pool, sizeof(s->pool), "%s", pool);
	snprintf(s->ns, sizeof(s->ns), "%s", ns ? ns : "");
	{
		char fsid[64] = "";

		if (rados_cluster_fsid(s->cluster, fsid, sizeof(fsid)) < 0)
			fsid[0] = '\0';
		int len = snprintf(s->shared, sizeof(s->shared), "rbd:%s/%s/%s%s%s;cluster=%s",
				   pool, ns ? ns : "", image, snap ? "@" : "",
				   snap ? snap : "", fsid);

		/* Cut short, two images could share an id: none, then (the
		 * node is not handed over). */
		if (len < 0 || (size_t)len >= sizeof(s->shared))
			s->shared[0] = '\0';
	}
	if (ioc__node_opt_bool(opts, "__org.iocore_inactive", false)) {
		/* Another host has the image: take nothing until activated. */
		atomic_store_explicit(&n->inactive, true, memory_order_relaxed);
	} else {
		struct rbd_call c = { s, err, errlen };

		if (s->take_lock && (r = ioc__rbd_blocking(rbd_take_fn, &c)) < 0)
			goto fail;
		if ((r = rbd_bitmaps_load(n, s, err, errlen)) < 0)
			goto fail;
	}

	n->filename_buf = filename_json(opts);
	n->filename = n->filename_buf;
	n->opaque = s;
	n->can_discard = !n->read_only;
	n->can_fast_zero = false;
	n->can_block_status = true;
	/* One image handle per node: a flush covers every loop's writes. */
	n->multi_conn = true;
	n->min_align = 1;
	n->opt_align = s->obj_size <= UINT32_MAX ? (uint32_t)s->obj_size : 0;
	return 0;

fail:
	rbd_node_free(s);
	return r;
}

static void rbd_node_close(struct ioc_node *n)
{
	struct rbd_node *s = n->opaque;
	int r;

	if (!s)
		return;
	rbd_loops_unregister(s);
	r = ioc__rbd_bitmaps_close(s->bm);
	if (r < 0)
		fprintf(stderr, "rbd %s: could not write the dirty bitmaps back (%s); "
			"they will load inconsistent\n", s->name, ioc_strerror(r));
	rbd_node_free(s);
	n->opaque = NULL;
}

/* ---- hand-over -------------------------------------------------------- */

static const char *rbd_node_shared_id(struct ioc_node *n)
{
	struct rbd_node *s = n->opaque;

	return s && s->shared[0] ? s->shared : NULL;
}

static int rbd_lock_release_checked(struct rbd_node *s, char *err, size_t errlen)
{
	struct rbd_call c = { .s = s };
	int r = s->take_lock ? ioc__rbd_blocking(rbd_release_fn, &c) : 0;

	if (r < 0)
		snprintf(err, errlen, "could not release the lock of %s: %s", s->name,
			 strerror(-r));
	return r;
}

/* Flush, bitmaps back, lock released; undone in reverse on a failure.
 * The node is held (no request inside) throughout; the librbd calls go
 * through ioc__rbd_blocking() (the bitmaps' RADOS calls likewise, in
 * rbd-bitmap.c). */
static int rbd_node_inactivate(struct ioc_node *n, char *err, size_t errlen)
{
	struct rbd_node *s = n->opaque;
	struct rbd_call c = { .s = s };
	int r = ioc__rbd_blocking(rbd_flush_fn, &c);

	if (r < 0) {
		snprintf(err, errlen, "could not flush %s: %s", s->name, strerror(-r));
		return rbd_io_errno(r);
	}
	r = ioc__rbd_bitmaps_inactivate(s->bm);
	if (r < 0) {
		snprintf(err, errlen, "could not write the dirty bitmaps of %s back: %s",
			 s->name, ioc_strerror(r));
		return r;
	}
	r = rbd_lock_release_checked(s, err, errlen);
	if (r < 0) {
		char e2[512];

		(void)ioc__rbd_bitmaps_activate(s->bm, e2, sizeof(e2));
	}
	return r;
}

static int rbd_node_activate(struct ioc_node *n, char *err, size_t errlen)
{
	struct rbd_node *s = n->opaque;
	struct rbd_call c = { .s = s, .err = err, .errlen = errlen };
	int r;

	if (s->take_lock && (r = ioc__rbd_blocking(rbd_take_fn, &c)) < 0)
		return r;
	if (s->bm) {
		r = ioc__rbd_bitmaps_activate(s->bm, err, errlen);
	} else {
		/* Opened inactive: the bitmaps load now, as at an open. */
		r = rbd_bitmaps_load(n, s, err, errlen);
		if (r < 0) {
			/* A failed load leaves them half made (no request runs). */
			ioc__rbd_bitmaps_free(s->bm);
			s->bm = NULL;
		}
	}
	if (r < 0) {
		char e2[512];

		(void)rbd_lock_release_checked(s, e2, sizeof(e2));
	}
	return r;
}

const struct ioc_node_drv ioc__node_rbd_drv = {
	.name = "rbd",
	.opts = rbd_opts,
	.open = rbd_node_open,
	.close = rbd_node_close,
	.loop_exit = rbd_node_loop_exit,
	.co_preadv = rbd_co_preadv,
	.co_pwritev = rbd_co_pwritev,
	.co_flush = rbd_co_flush,
	.co_discard = rbd_co_discard,
	.co_write_zeroes = rbd_co_write_zeroes,
	.co_block_status = rbd_co_block_status,
	.co_truncate = rbd_co_truncate,
	.info = rbd_node_info,
	.shared_id = rbd_node_shared_id,
	.inactivate = rbd_node_inactivate,
	.activate = rbd_node_activate,
};
