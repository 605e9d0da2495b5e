/*
 * The node layer: one place where every request of every front end is
 * counted, drained and watched, whatever driver serves it.
 *
 * Problem: a front end that calls its storage directly (the NBD server
 * did) owns the statistics, the quiesce gate and the write hooks, so a
 * second front end gets none of them and a migration has to be taught
 * about each protocol.
 *
 * Design: a node is a driver instance in a graph of named nodes.  Front
 * ends call ioc_node_co_*, which dispatch through the driver's const ops
 * table and add the outcome to this loop's slot of the node's counters;
 * writes then run the node's notifier list (dirty tracking, a migration's
 * mirror).  Each loop that submits gets a slot (graph-wide index, kept in
 * a thread-local), so counters have one writer and the drain needs no
 * shared counter (drain.c).
 *
 * Rejected: a filter node per job spliced into the graph (QEMU's mirror
 * top): the same effect with a graph rewrite at every start and stop; a
 * notifier list is one acquire load per write when empty.  Per-node
 * atomic counters: one cache line bounced between I/O threads per request.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "node-int.h"
#include "rbd.h"

/* ---- drivers ---------------------------------------------------------- */

static const struct ioc_node_drv *const drivers[] = {
	&ioc__node_drv_file,
	&ioc__node_drv_host_device,
	&ioc__node_drv_null_co,
	&ioc__node_drv_raw,
	&ioc__node_drv_zip,
	&ioc__node_drv_zip_overlay,
	&ioc__node_drv_qcow2,
	IOC_NODE_RBD_DRV_ENTRY
};

const struct ioc_node_drv *ioc_node_drv_find(const char *name)
{
	for (size_t i = 0; name && i < IOC_ARRAY_SIZE(drivers); i++)
		if (strcmp(drivers[i]->name, name) == 0)
			return drivers[i];
	return NULL;
}

/* The members every node has (QEMU's BlockdevOptions base). */
static const char *const discard_values[] = { "ignore", "off", "unmap", "on", NULL };
static const char *const dz_values[] = { "off", "on", "unmap", NULL };
static const struct ioc__qmp_arg cache_members[] = {
	{ "direct", IOC_QMP_BOOL, true }, { "no-flush", IOC_QMP_BOOL, true }, { NULL },
};
static const struct ioc__qmp_arg common_opts[] = {
	{ "driver", IOC_QMP_STR, false },
	{ "node-name", IOC_QMP_STR, true },
	{ "read-only", IOC_QMP_BOOL, true },
	{ "auto-read-only", IOC_QMP_BOOL, true },
	{ "force-share", IOC_QMP_BOOL, true },
	{ "discard", IOC_QMP_ENUM, true, .values = discard_values },
	{ "detect-zeroes", IOC_QMP_ENUM, true, .values = dz_values },
	{ "cache", IOC_QMP_OBJECT, true, .members = cache_members },
	{ NULL },
};

static struct ioc__qmp_variant variants[IOC_ARRAY_SIZE(drivers) + 1];
static struct ioc__qmp_arg blockdev_spec;
static pthread_once_t spec_once = PTHREAD_ONCE_INIT;

static void spec_init(void)
{
	for (size_t i = 0; i < IOC_ARRAY_SIZE(drivers); i++)
		variants[i] = (struct ioc__qmp_variant){ drivers[i]->name, drivers[i]->opts };
	blockdev_spec = (struct ioc__qmp_arg){
		.name = "", .type = IOC_QMP_OBJECT, .members = common_opts,
		.tag = "driver", .variants = variants,
	};
}

const struct ioc__qmp_arg *ioc_node_blockdev_spec(void)
{
	pthread_once(&spec_once, spec_init);
	return &blockdev_spec;
}

bool ioc_node_check_opts(json_t *opts, unsigned flags, char *err, size_t errlen)
{
	return ioc__qmp_check_value(ioc_node_blockdev_spec(), opts, flags, err, errlen);
}

/* ---- slots ------------------------------------------------------------ */

/* Slots: each loop that submits to a graph's nodes has an index there, the
 * same for every node of the graph, found under the graph's lock on its
 * first request and cached in a thread-local keyed by the graph's
 * generation (a later graph at the same address has another). */
static _Thread_local struct { uint64_t gen; unsigned idx; } tls_slot;

static int slot_attach(struct ioc_node_graph *g, unsigned *idx)
{
	struct ioc_loop *loop = ioc_loop_current();
	int ret = -EMFILE;

	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < IOC_NODE_MAX_SLOTS; i++) {
		if (g->loops[i] == loop && loop) {
			*idx = i;
			ret = 0;
			goto out;
		}
	}
	for (unsigned i = 0; i < IOC_NODE_MAX_SLOTS; i++) {
		if (!g->loops[i]) {
			g->loops[i] = loop;
			if (i >= g->nslots)
				g->nslots = i + 1;
			*idx = i;
			ret = 0;
			goto out;
		}
	}
out:
	pthread_mutex_unlock(&g->lock);
	return ret;
}

/* The calling loop's slot of n.  A thread without a loop, or past the
 * last slot, gets NULL and is not counted (it cannot wait at a gate). */
static inline struct ioc_node_slot *my_slot(struct ioc_node *n)
{
	struct ioc_node_graph *g = n->graph;
	unsigned idx;

	if (ioc_likely(tls_slot.gen == g->gen))
		return &n->slot[tls_slot.idx];
	if (!ioc_loop_current() || slot_attach(g, &idx) < 0)
		return NULL;
	tls_slot.gen = g->gen;
	tls_slot.idx = idx;
	return &n->slot[idx];
}

static void loop_exit_tree(struct ioc_node *n)
{
	if (!n)
		return;
	if (n->drv->loop_exit && !n->borrowed)
		n->drv->loop_exit(n);
	loop_exit_tree(n->file);
	loop_exit_tree(n->backing);
}

void ioc_node_loop_exit(struct ioc_node *n)
{
	loop_exit_tree(n);
	ioc_node_graph_detach_loop(n->graph, ioc_loop_current());
}

void ioc_node_graph_detach_loop(struct ioc_node_graph *g, struct ioc_loop *loop)
{
	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < IOC_NODE_MAX_SLOTS; i++)
		if (g->loops[i] == loop)
			g->loops[i] = NULL;
	pthread_mutex_unlock(&g->lock);
	if (tls_slot.gen == g->gen)
		tls_slot.gen = 0;
}

/* ---- statistics ------------------------------------------------------- */

static inline void add_relaxed(_Atomic uint64_t *p, uint64_t v)
{
	/* One writer per slot: a relaxed load and store, read relaxed by
	 * ioc_node_get_stats() (a statistic, no ordering needed). */
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

static inline void account(struct ioc_node_slot *s, enum ioc_node_op op, uint64_t off,
			   uint64_t bytes, int ret, int64_t t0)
{
	struct ioc_node_opstat *o;

	if (!s)
		return;
	o = &s->st.op[op];
	add_relaxed(&o->ops, 1);
	if (ret < 0) {
		/* QEMU counts a failed request's bytes and time nowhere. */
		add_relaxed(&o->failed, 1);
		return;
	}
	add_relaxed(&o->bytes, bytes);
	add_relaxed(&o->ns, (uint64_t)(ioc_now_ns() - t0));
	if ((op == IOC_NODE_OP_WRITE || op == IOC_NODE_OP_ZERO) && ret >= 0 &&
	    off + bytes > atomic_load_explicit(&s->st.wr_highest, memory_order_relaxed))
		atomic_store_explicit(&s->st.wr_highest, off + bytes, memory_order_relaxed);
}

void ioc_node_account(struct ioc_node *n, enum ioc_node_op op, uint64_t off, uint64_t len,
		      int ret, int64_t t0)
{
	account(my_slot(n), op, off, len, ret, t0);
}

void ioc_node_get_stats(struct ioc_node *n, struct ioc_node_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < IOC_NODE_MAX_SLOTS; i++) {
		struct ioc_node_stats *s = &n->slot[i].st;

		for (int k = 0; k < IOC_NODE_OP_N; k++) {
			add_relaxed(&out->op[k].ops, atomic_load_explicit(&s->op[k].ops,
							memory_order_relaxed));
			add_relaxed(&out->op[k].bytes, atomic_load_explicit(&s->op[k].bytes,
							memory_order_relaxed));
			add_relaxed(&out->op[k].failed, atomic_load_explicit(&s->op[k].failed,
							memory_order_relaxed));
			add_relaxed(&out->op[k].ns, atomic_load_explicit(&s->op[k].ns,
							memory_order_relaxed));
		}
		uint64_t h = atomic_load_explicit(&s->wr_highest, memory_order_relaxed);

		if (h > atomic_load_explicit(&out->wr_highest, memory_order_relaxed))
			atomic_store_explicit(&out->wr_highest, h, memory_order_relaxed);
	}
}

/* ---- I/O -------------------------------------------------------------- */

static size_t iov_len(const struct iovec *iov, int iovcnt)
{
	size_t len = 0;

	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	return len;
}

static inline int check_range(struct ioc_node *n, uint64_t off, uint64_t len)
{
	return off > n->size || len > n->size - off ? -EINVAL : 0;
}

/* A change of [off, off + len) with flags out of allowed: 0 or -errno. */
static inline int check_change(struct ioc_node *n, uint64_t off, uint64_t len,
			       uint32_t flags, uint32_t allowed)
{
	if (flags & ~allowed)
		return -EINVAL;
	if (check_range(n, off, len))
		return -EINVAL;
	if (n->read_only)
		return -EPERM;
	/* Relaxed: see struct ioc_node's inactive. */
	return atomic_load_explicit(&n->inactive, memory_order_relaxed) ? -EROFS : 0;
}

/* Notifiers run on the request's coroutine; the list is read with one
 * acquire load, pairing with the release store in ioc_node_add_notifier(). */
static inline int notify(struct ioc_node *n, enum ioc_node_op op, uint64_t off,
			 uint64_t len, int ret)
{
	struct ioc_node_notifier *nt = atomic_load_explicit(&n->notifiers,
							    memory_order_acquire);

	for (; ioc_unlikely(nt != NULL); nt = nt->next) {
		int r = nt->fn(nt, n, op, off, len, ret);

		if (r < 0 && ret >= 0)
			ret = r;
	}
	return ret;
}

int ioc_coroutine_fn ioc_node_co_preadv(struct ioc_node *n, uint64_t off,
					const struct iovec *iov, int iovcnt, uint32_t flags)
{
	struct ioc_node_slot *s = my_slot(n);
	size_t len = iov_len(iov, iovcnt);
	int64_t t0 = ioc_now_ns();
	int ret = check_range(n, off, len);

	if (flags)
		ret = -EINVAL;
	if (ret == 0)
		ret = n->drv->co_preadv(n, off, iov, iovcnt, flags);
	account(s, IOC_NODE_OP_READ, off, len, ret, t0);
	return ret;
}

int ioc_coroutine_fn ioc_node_co_preadv_job(struct ioc_node *n, uint64_t off,
					    const struct iovec *iov, int iovcnt)
{
	int ret = check_range(n, off, iov_len(iov, iovcnt));

	return ret ? ret : n->drv->co_preadv(n, off, iov, iovcnt, 0);
}

static bool all_zero(const struct iovec *iov, int iovcnt)
{
	for (int i = 0; i < iovcnt; i++) {
		const uint8_t *p = iov[i].iov_base;
		size_t l = iov[i].iov_len;

		if (l && (p[0] || memcmp(p, p + 1, l - 1)))
			return false;
	}
	return true;
}

int ioc_coroutine_fn ioc_node_co_pwritev(struct ioc_node *n, uint64_t off,
					 const struct iovec *iov, int iovcnt, uint32_t flags)
{
	struct ioc_node_slot *s = my_slot(n);
	size_t len = iov_len(iov, iovcnt);
	int64_t t0 = ioc_now_ns();
	int ret = check_change(n, off, len, flags, IOC_NODE_FUA);

	if (ret == 0 && n->detect_zeroes && len && all_zero(iov, iovcnt) &&
	    n->drv->co_write_zeroes) {
		ret = n->drv->co_write_zeroes(n, off, len, flags |
					      (n->detect_zeroes_unmap ? IOC_NODE_MAY_UNMAP : 0));
		account(s, IOC_NODE_OP_ZERO, off, len, ret, t0);
		return notify(n, IOC_NODE_OP_ZERO, off, len, ret);
	}
	if (ret == 0)
		ret = n->drv->co_pwritev(n, off, iov, iovcnt, flags);
	account(s, IOC_NODE_OP_WRITE, off, len, ret, t0);
	if (ret == -EINVAL || ret == -EPERM || ret == -EROFS)
		return ret;
	return notify(n, IOC_NODE_OP_WRITE, off, len, ret);
}

int ioc_coroutine_fn ioc_node_co_pread(struct ioc_node *n, uint64_t off, void *buf,
				       size_t len, uint32_t flags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	return ioc_node_co_preadv(n, off, &iov, 1, flags);
}

int ioc_coroutine_fn ioc_node_co_pwrite(struct ioc_node *n, uint64_t off,
					const void *buf, size_t len, uint32_t flags)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };

	return ioc_node_co_pwritev(n, off, &iov, 1, flags);
}

int ioc_coroutine_fn ioc_node_co_flush(struct ioc_node *n, uint32_t flags)
{
	struct ioc_node_slot *s = my_slot(n);
	int64_t t0 = ioc_now_ns();
	int ret = flags ? -EINVAL : 0;

	if (ret == 0 && !n->no_flush)
		ret = n->drv->co_flush(n, flags);
	account(s, IOC_NODE_OP_FLUSH, 0, 0, ret, t0);
	return ret;
}

int ioc_coroutine_fn ioc_node_co_discard(struct ioc_node *n, uint64_t off, uint64_t len,
					 uint32_t flags)
{
	struct ioc_node_slot *s = my_slot(n);
	int64_t t0 = ioc_now_ns();
	int ret = check_change(n, off, len, flags, 0);

	if (ret < 0) {
		account(s, IOC_NODE_OP_DISCARD, off, len, ret, t0);
		return ret;
	}
	/* A hint: ignored unless discard=unmap, and where the driver has none. */
	if (n->discard_unmap && n->drv->co_discard)
		ret = n->drv->co_discard(n, off, len, flags);
	account(s, IOC_NODE_OP_DISCARD, off, len, ret, t0);
	return notify(n, IOC_NODE_OP_DISCARD, off, len, ret);
}

/* Zeroes written as data, 1 MiB at a time, for drivers without a way of
 * their own. */
static int ioc_coroutine_fn zero_fallback(struct ioc_node *n, uint64_t off, uint64_t len,
					  uint32_t flags)
{
	size_t chunk = len < (1u << 20) ? (size_t)len : (1u << 20);
	void *buf;
	int ret = 0;

	if (flags & IOC_NODE_NO_FALLBACK)
		return -ENOTSUP;
	if (!len)
		return 0;
	buf = calloc(1, chunk);
	if (!buf)
		return -ENOMEM;
	while (len && ret >= 0) {
		struct iovec iov = { buf, len < chunk ? (size_t)len : chunk };

		ret = n->drv->co_pwritev(n, off, &iov, 1, flags & IOC_NODE_FUA);
		off += iov.iov_len;
		len -= iov.iov_len;
	}
	free(buf);
	return ret;
}

int ioc_coroutine_fn ioc_node_co_write_zeroes(struct ioc_node *n, uint64_t off,
					      uint64_t len, uint32_t flags)
{
	struct ioc_node_slot *s = my_slot(n);
	int64_t t0 = ioc_now_ns();
	int ret = check_change(n, off, len, flags,
			       IOC_NODE_FUA | IOC_NODE_MAY_UNMAP | IOC_NODE_NO_FALLBACK);

	if (ret < 0) {
		account(s, IOC_NODE_OP_ZERO, off, len, ret, t0);
		return ret;
	}
	/* discard=ignore also keeps write-zeroes from unmapping (QEMU). */
	if (!n->discard_unmap)
		flags &= ~(uint32_t)IOC_NODE_MAY_UNMAP;
	ret = n->drv->co_write_zeroes ? n->drv->co_write_zeroes(n, off, len, flags)
				      : zero_fallback(n, off, len, flags);
	account(s, IOC_NODE_OP_ZERO, off, len, ret, t0);
	if (ret == -ENOTSUP && (flags & IOC_NODE_NO_FALLBACK))
		return ret; /* nothing was written */
	return notify(n, IOC_NODE_OP_ZERO, off, len, ret);
}

int ioc_coroutine_fn ioc_node_co_block_status(struct ioc_node *n, uint64_t off,
					      uint64_t len, uint64_t *pnum, unsigned *depth)
{
	if (off >= n->size)
		return -EINVAL;
	if (len > n->size - off)
		len = n->size - off;
	if (!n->drv->co_block_status) {
		*pnum = len;
		if (depth)
			*depth = 1;
		return IOC_NODE_ST_DATA | IOC_NODE_ST_ALLOCATED;
	}
	return n->drv->co_block_status(n, off, len, pnum, depth);
}

int ioc_coroutine_fn ioc_node_co_truncate(struct ioc_node *n, uint64_t size)
{
	if (n->read_only)
		return -EPERM;
	/* Relaxed: see struct ioc_node's inactive. */
	if (atomic_load_explicit(&n->inactive, memory_order_relaxed))
		return -EROFS;
	if (!n->drv->co_truncate)
		return -ENOTSUP;
	return n->drv->co_truncate(n, size);
}

struct ioc_blk *ioc_node_blk(struct ioc_node *n)
{
	return n->drv->blk ? n->drv->blk(n) : NULL;
}

struct ioc_blk *ioc_node_dirty_blk(struct ioc_node *n)
{
	return n->dirty_set ? n->dirty_set : ioc_node_blk(n);
}

/* ---- notifiers -------------------------------------------------------- */

void ioc_node_add_notifier(struct ioc_node *n, struct ioc_node_notifier *nt)
{
	nt->next = atomic_load_explicit(&n->notifiers, memory_order_relaxed);
	/* Release: pairs with the acquire load in notify(), which then sees
	 * nt and everything it points to. */
	atomic_store_explicit(&n->notifiers, nt, memory_order_release);
}

bool ioc__node_unlink_notifier(struct ioc_node *n, struct ioc_node_notifier *nt)
{
	struct ioc_node_notifier *p = atomic_load_explicit(&n->notifiers,
							   memory_order_relaxed);

	if (p == nt) {
		/* Release: pairs with notify()'s acquire (the rest of the list). */
		atomic_store_explicit(&n->notifiers, nt->next, memory_order_release);
		return true;
	}
	while (p && p->next != nt)
		p = p->next;
	if (!p)
		return false;
	p->next = nt->next;
	return true;
}

void ioc_node_remove_notifier(struct ioc_node *n, struct ioc_node_notifier *nt)
{
	int gate = atomic_load_explicit(&n->gate, memory_order_relaxed);

	if (!ioc__node_unlink_notifier(n, nt))
		return;
	/* A write that loaded the list before the store may still be in
	 * nt->fn: a drain waits for every request inside the node. */
	if (gate == IOC_NODE_GATE_OPEN) {
		ioc_node_set_gate(n, IOC_NODE_GATE_HOLD);
		ioc_node_set_gate(n, IOC_NODE_GATE_OPEN);
	}
}

int ioc__node_mark_dirty_set(struct ioc_node_notifier *nt, struct ioc_node *n,
			     enum ioc_node_op op, uint64_t off, uint64_t len, int ret)
{
	(void)nt;
	(void)op;
	(void)ret;
	/* A failed request may have changed part of its range: marked too. */
	(void)ioc_blk_dirty_mark(n->dirty_set, off, len);
	return 0;
}

struct ioc_node_slot *ioc__node_my_slot(struct ioc_node *n)
{
	return my_slot(n);
}

/* ---- helpers for drivers with single-buffer interfaces ------------------- */

void *ioc__node_iov_flat(const struct iovec *iov, int iovcnt, size_t len, bool *bounced)
{
	*bounced = iovcnt != 1;
	if (iovcnt == 1)
		return iov[0].iov_base;
	return malloc(len ? len : 1);
}

void ioc__node_iov_scatter(const struct iovec *iov, int iovcnt, const void *buf,
			   size_t len)
{
	const uint8_t *p = buf;

	for (int i = 0; i < iovcnt && len; i++) {
		size_t l = iov[i].iov_len < len ? iov[i].iov_len : len;

		memcpy(iov[i].iov_base, p, l);
		p += l;
		len -= l;
	}
}
