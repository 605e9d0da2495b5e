/*
 * Block nodes: what every front end (NBD, vhost-user-blk) serves, and what
 * every job (migration, bitmaps) watches.  A node is an instance of a
 * driver (raw file, qcow2, rbd, iocore's compressed image...) with a name,
 * a size, capabilities and children; front ends call the ioc_node_co_*
 * functions, which count the request in the node's statistics, run the
 * driver and then the node's write notifiers.  Drivers reach their
 * children (a qcow2 node's file, its backing node) through the same calls.
 *
 * Threads: a node serves requests from coroutines on any loop at once; its
 * driver runs each request on the calling loop.  Opening, closing,
 * notifier changes and drains come from the main (control) thread.
 * Private to the daemon layers: not part of libiocore's API.
 */
#ifndef IOC_NODE_H
#define IOC_NODE_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "iocore/blk.h"
#include "iocore/co.h"
#include "iocore/loop.h"
#include "qmp/schema.h"   /* struct ioc__qmp_arg */
#include "util/latch.h"

#define IOC_NODE_NAME_MAX    128
/* Loops that may submit to one node; a thread past the last slot shares
 * it with atomic adds (node.c, "Slots"). */
#define IOC_NODE_MAX_SLOTS   64

struct ioc_node;
struct ioc_node_graph;

/* Request flags (the values of IOC_BLK_*, so the file driver passes them
 * through). */
enum {
	IOC_NODE_FUA         = IOC_BLK_FUA,         /* write: durable on completion */
	IOC_NODE_MAY_UNMAP   = IOC_BLK_MAY_UNMAP,   /* write_zeroes: may free space */
	IOC_NODE_NO_FALLBACK = IOC_BLK_NO_FALLBACK, /* write_zeroes: -ENOTSUP unless fast */
};

/* Block status bits.  DATA: the layer that answered stores data there;
 * ZERO: reads as zeroes; ALLOCATED: some layer of this node's chain (this
 * one or a backing one) decides the contents (qemu:allocation-depth > 0). */
enum {
	IOC_NODE_ST_DATA      = 1u << 0,
	IOC_NODE_ST_ZERO      = 1u << 1,
	IOC_NODE_ST_ALLOCATED = 1u << 2,
};

/* Operation kinds, for statistics and notifiers. */
enum ioc_node_op {
	IOC_NODE_OP_READ, IOC_NODE_OP_WRITE, IOC_NODE_OP_FLUSH, IOC_NODE_OP_DISCARD,
	IOC_NODE_OP_ZERO, IOC_NODE_OP_STATUS, IOC_NODE_OP_N,
};

/*
 * A driver.  Every I/O member runs in a coroutine on the caller's loop,
 * may yield, and returns 0 (or what it says) or -errno.  Requests are
 * inside the node (offset + length <= size): the node layer checks that,
 * the read-only flag and the flags before the driver sees them.
 */
struct ioc_node_drv {
	const char *name;      /* QEMU's name: "file", "qcow2", "rbd", "__org.iocore_zip" */
	/* The driver's own --blockdev / blockdev-add members (beside the ones
	 * every node has: driver, node-name, read-only, discard, cache,
	 * detect-zeroes, auto-read-only, force-share).  The daemon checks
	 * options against it before open. */
	const struct ioc__qmp_arg *opts;
	/* Open n from opts (checked).  Set n->opaque, n->size and the
	 * capabilities; children through ioc_node_open_child().  On failure
	 * fill err (the message QEMU would give) and free what was made. */
	int (*open)(struct ioc_node *n, json_t *opts, char *err, size_t errlen);
	/* No request in flight; the node layer then drops the children. */
	void (*close)(struct ioc_node *n);
	int (*co_preadv)(struct ioc_node *n, uint64_t off, const struct iovec *iov,
			 int iovcnt, uint32_t flags);
	int (*co_pwritev)(struct ioc_node *n, uint64_t off, const struct iovec *iov,
			  int iovcnt, uint32_t flags);
	int (*co_flush)(struct ioc_node *n, uint32_t flags);
	/* NULL: discard is a no-op (it is a hint). */
	int (*co_discard)(struct ioc_node *n, uint64_t off, uint64_t len, uint32_t flags);
	/* NULL: the node layer writes zero buffers (-ENOTSUP with NO_FALLBACK). */
	int (*co_write_zeroes)(struct ioc_node *n, uint64_t off, uint64_t len,
			       uint32_t flags);
	/* IOC_NODE_ST_* of the run at off, its length (> 0, <= len) in *pnum;
	 * *depth, when not NULL, the qemu:allocation-depth of the run (0 none,
	 * 1 this node, 2 its backing node...).  NULL: all DATA|ALLOCATED,
	 * depth 1. */
	int (*co_block_status)(struct ioc_node *n, uint64_t off, uint64_t len,
			       uint64_t *pnum, unsigned *depth);
	/* block_resize (NULL: -ENOTSUP).  On success the driver updates n->size. */
	int (*co_truncate)(struct ioc_node *n, uint64_t size);
	/* Members of the driver's own in query-named-block-nodes' "image"
	 * (format-specific, cluster size...) added to obj.  NULL: none. */
	void (*info)(struct ioc_node *n, json_t *image);
	/* The ioc_blk under a plain file node, for the zero-copy paths and
	 * bitmaps that live in the block layer; NULL for every other driver. */
	struct ioc_blk *(*blk)(struct ioc_node *n);
	/* The calling loop will submit to n no more (it is about to stop):
	 * drop what the driver keeps on it (a watched fd).  On that loop's
	 * thread, no request of its in flight.  NULL: nothing kept. */
	void (*loop_exit)(struct ioc_node *n);
	/* Shared storage, an image that other hosts open too (rbd): what
	 * names it across hosts ("rbd:POOL/NS/IMAGE;cluster=FSID"), so both
	 * ends of a hand-over can check they mean one image.  NULL (or no
	 * hook): not shared storage.  Valid while the node is open. */
	const char *(*shared_id)(struct ioc_node *n);
	/* Let the image go to another host, and take it back (active.c):
	 * inactivate flushes, writes what the driver keeps beside the image
	 * back (persistent bitmaps, in use cleared) and gives up the image's
	 * ownership (an exclusive lock); activate takes it and loads that
	 * state again.  On failure each leaves the node as it found it, with
	 * err set.  Main thread, with no request inside the node (held, or
	 * not served yet), perhaps in a coroutine: then the storage's
	 * blocking calls go to the loop's thread pool (the main loop goes
	 * on).  NULL: the node cannot be handed over. */
	int (*inactivate)(struct ioc_node *n, char *err, size_t errlen);
	int (*activate)(struct ioc_node *n, char *err, size_t errlen);
};

/* Counters of one loop's requests (QEMU's BlockAcctStats without the
 * timed intervals).  One writer per slot: relaxed load + store. */
struct ioc_node_opstat {
	_Atomic uint64_t ops, bytes, failed, ns;
};
struct ioc_node_stats {
	struct ioc_node_opstat op[IOC_NODE_OP_N];
	_Atomic uint64_t wr_highest;    /* end of the furthest write */
};

/*
 * Write notifiers: after a write, write-zeroes or discard completes on the
 * driver (failed ones too, with its result), each notifier's fn runs in the
 * request's coroutine and may yield (a migration waits there until the
 * range reached its destination).  Its return replaces the result when
 * negative.  Added and removed on the main thread while the node is
 * drained or with requests running: the list is read with one acquire load
 * per write (node.c, "Notifiers").
 */
struct ioc_node_notifier {
	int (*fn)(struct ioc_node_notifier *nt, struct ioc_node *n, enum ioc_node_op op,
		  uint64_t off, uint64_t len, int ret);
	struct ioc_node_notifier *next;
};

struct ioc_node_cut;

/* One loop's share of a node: its counters, and its side of the drain. */
struct ioc_node_slot {
	_Atomic(struct ioc_loop *) loop; /* set by the loop's first request */
	struct ioc_node_stats st;
	unsigned executing;             /* requests inside, this loop's */
	bool draining;                  /* a drain waits for executing == 0 */
	struct ioc_co_queue held;       /* requests waiting while drained */
	struct ioc_node_cut *cuts;      /* inside without a coroutine */
	struct ioc_task task;           /* the drain change to apply here */
	struct ioc_node *node;
} IOC_CACHE_ALIGNED;

enum { IOC_NODE_GATE_OPEN = 0, IOC_NODE_GATE_HOLD, IOC_NODE_GATE_SHUT };

struct ioc_node {
	char name[IOC_NODE_NAME_MAX];   /* node-name ("#blockN" when implicit) */
	const struct ioc_node_drv *drv;
	void *opaque;                   /* the driver's */
	struct ioc_node_graph *graph;
	/* The driver keeps it current; a resize changes it while other loops
	 * check ranges against it (seq_cst: rare stores, plain loads on x86). */
	_Atomic uint64_t size;
	bool read_only;
	bool can_discard, can_fast_zero, can_block_status;
	bool multi_conn;                /* a flush covers every writer's writes */
	bool explicit_name;             /* named by the user (not #blockN) */
	bool in_graph;                  /* the graph holds a reference */
	bool borrowed;                  /* opaque is the caller's: not closed */
	bool detect_zeroes_unmap;       /* detect-zeroes: off, on, unmap */
	bool detect_zeroes;
	bool discard_unmap;             /* discard=unmap (else ignore) */
	bool no_flush;                  /* cache.no-flush: flushes succeed at once */
	bool direct;                    /* cache.direct (shown in queries) */
	uint32_t min_align, opt_align;  /* request alignment (1: any) */
	const char *filename;           /* shown in query-named-block-nodes */
	char *filename_buf;
	json_t *opts;                   /* as opened (for blockdev-add's echo) */

	/* Children, each holding a reference: "file", "backing". */
	struct ioc_node *file, *backing;

	unsigned refs;                  /* graph + parents + exports; main thread */
	unsigned users;                 /* exports and jobs that block deletion */
	char user_desc[64];             /* what uses it, for the error message */

	_Atomic(struct ioc_node_notifier *) notifiers;
	/* The node's dirty bitmaps when its driver keeps them itself (a
	 * qcow2 node's, in guest offsets: ioc_node_dirty_blk()); set at open. */
	struct ioc_blk *dirty_set;

	/* Handed to another host (active.c): changes fail with -EROFS.
	 * Stored on the main thread with no request inside, loaded relaxed
	 * by each change (the drain that preceded the store orders it). */
	atomic_bool inactive;
	/* Main thread: the driver's inactivate or activate runs (active.c;
	 * it may sleep in a coroutine while the main loop goes on). */
	bool changing;

	_Atomic int gate;               /* IOC_NODE_GATE_* */
	struct ioc__latch gate_applied; /* loops yet to apply a change */
	struct ioc_node_slot slot[IOC_NODE_MAX_SLOTS];
};

/* ---- the graph: every node of a daemon, by name ---------------------- */

struct ioc_node_graph;
int ioc_node_graph_new(struct ioc_node_graph **out);
/* Close every node (no export may use them any more). */
void ioc_node_graph_free(struct ioc_node_graph *g);
struct ioc_node *ioc_node_find(struct ioc_node_graph *g, const char *name);
/* Nodes in creation order; returns how many (stores at most max). */
unsigned ioc_node_list(struct ioc_node_graph *g, struct ioc_node **out, unsigned max);
/* Drivers by name; NULL when there is none. */
const struct ioc_node_drv *ioc_node_drv_find(const char *name);
/* A loop that submitted to the graph's nodes goes away: free its slot. */
void ioc_node_graph_detach_loop(struct ioc_node_graph *g, struct ioc_loop *loop);
/* The calling loop will submit to n and its children no more: each
 * driver drops its state on this loop (loop_exit), and the loop leaves
 * the graph (ioc_node_graph_detach_loop).  On the loop's thread, before
 * it stops; a loop owner that submitted to a node calls it for each. */
void ioc_node_loop_exit(struct ioc_node *n);
/* BlockdevOptions as a spec: the common members and a union on "driver"
 * over every driver's options.  ioc_node_check_opts() checks (and with
 * IOC_QMP_KEYVAL coerces) opts against it. */
const struct ioc__qmp_arg *ioc_node_blockdev_spec(void);
bool ioc_node_check_opts(json_t *opts, unsigned flags, char *err, size_t errlen);

/*
 * blockdev-add: open a node from options (a BlockdevOptions object: driver,
 * node-name, the common members, the driver's members; already coerced
 * from keyval strings when they came from the command line).  A top-level
 * node needs node-name.  Returns 0 with the node in the graph, or -errno
 * with err and *cls (QEMU's error class) set.
 */
int ioc_node_add(struct ioc_node_graph *g, json_t *opts, struct ioc_node **out,
		 const char **cls, char *err, size_t errlen);
/* blockdev-del: -ENOENT (not found), -EBUSY (used: err names by what). */
int ioc_node_del(struct ioc_node_graph *g, const char *name, const char **cls,
		 char *err, size_t errlen);

/* A driver's child: ref is a node name (a JSON string) or an inline
 * BlockdevOptions object, opened now under the implicit name "#blockN". */
int ioc_node_open_child(struct ioc_node *parent, json_t *ref, const char *role,
			struct ioc_node **out, char *err, size_t errlen);
/* A child opened from a file name and a format ("raw", "qcow2", NULL to
 * probe), as a backing file named in an image header is. */
int ioc_node_open_file(struct ioc_node *parent, const char *path, const char *format,
		       bool read_only, struct ioc_node **out, char *err, size_t errlen);

void ioc_node_ref(struct ioc_node *n);
void ioc_node_unref(struct ioc_node *n);
/* Exports and jobs: a user blocks blockdev-del.  desc says who. */
void ioc_node_use(struct ioc_node *n, const char *desc);
void ioc_node_unuse(struct ioc_node *n);

/*
 * Nodes over images the caller opened and keeps (not closed with the
 * node): a block-layer image as a "file" (or "host_device", "null-co")
 * node, a compressed image as an "__org.iocore_zip" node, and with an
 * overlay, an "__org.iocore_zip-overlay" node over it.  Not in the graph's
 * list; the caller holds the one reference.  name: its node-name.
 */
int ioc_node_wrap_blk(struct ioc_node_graph *g, struct ioc_blk *blk, const char *name,
		      struct ioc_node **out);
struct ioc_zip_image;
struct ioc_zip_overlay;
int ioc_node_wrap_zip(struct ioc_node_graph *g, struct ioc_zip_image *img,
		      struct ioc_zip_overlay *ov, const char *name, struct ioc_node **out);

/* ---- I/O: from a coroutine on any loop -------------------------------- */

int ioc_coroutine_fn ioc_node_co_preadv(struct ioc_node *n, uint64_t off,
					const struct iovec *iov, int iovcnt, uint32_t flags);
int ioc_coroutine_fn ioc_node_co_pwritev(struct ioc_node *n, uint64_t off,
					 const struct iovec *iov, int iovcnt, uint32_t flags);
/* A job's read (a migration's copy): ioc_node_co_preadv not counted in
 * n's statistics, which are its front ends' (query-blockstats).  The
 * driver's own requests to n's children are counted there as usual. */
int ioc_coroutine_fn ioc_node_co_preadv_job(struct ioc_node *n, uint64_t off,
					    const struct iovec *iov, int iovcnt);
int ioc_coroutine_fn ioc_node_co_pread(struct ioc_node *n, uint64_t off, void *buf,
				       size_t len, uint32_t flags);
int ioc_coroutine_fn ioc_node_co_pwrite(struct ioc_node *n, uint64_t off,
					const void *buf, size_t len, uint32_t flags);
int ioc_coroutine_fn ioc_node_co_flush(struct ioc_node *n, uint32_t flags);
int ioc_coroutine_fn ioc_node_co_discard(struct ioc_node *n, uint64_t off, uint64_t len,
					 uint32_t flags);
int ioc_coroutine_fn ioc_node_co_write_zeroes(struct ioc_node *n, uint64_t off,
					      uint64_t len, uint32_t flags);
int ioc_coroutine_fn ioc_node_co_block_status(struct ioc_node *n, uint64_t off,
					      uint64_t len, uint64_t *pnum, unsigned *depth);
int ioc_coroutine_fn ioc_node_co_truncate(struct ioc_node *n, uint64_t size);

/*
 * From a thread without a loop (a migration receiver's workers): run
 * fn(arg) in a new coroutine on loop, which another thread runs, and sleep
 * until it returns (sync.c: the handshake).  Returns fn's value, or
 * -ENOMEM when no coroutine could be made.  Not from loop's own thread,
 * nor from a coroutine.  One hop per call: for requests of some size.
 */
int ioc_node_call_co(struct ioc_loop *loop, int (*fn)(void *arg), void *arg);
/* A request of the helpers below. */
struct ioc_node_req {
	struct ioc_node *n;
	enum ioc_node_op op;
	uint64_t off, len;
	const void *buf;
	uint32_t flags;
};
/* The same in two halves, so that one thread keeps several in flight:
 * post, then wait exactly once; the call stays put in between. */
struct ioc_node_call {
	struct ioc_task task;
	int (*fn)(void *arg);
	void *arg;
	int ret;
	atomic_int done;        /* store: the coroutine; load: ioc_node_call_wait() */
	struct ioc_node_req req; /* ioc_node_pwrite_post()'s */
};
void ioc_node_call_post(struct ioc_loop *loop, struct ioc_node_call *c,
			int (*fn)(void *arg), void *arg);
int ioc_node_call_wait(struct ioc_node_call *c);
/* ioc_node_co_pwrite() posted; buf stays valid until the wait. */
void ioc_node_pwrite_post(struct ioc_loop *loop, struct ioc_node_call *c,
			  struct ioc_node *n, uint64_t off, const void *buf, size_t len,
			  uint32_t flags);
/* ioc_node_co_pwrite, _write_zeroes, _flush and _truncate through it. */
int ioc_node_pwrite_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t off,
			 const void *buf, size_t len, uint32_t flags);
int ioc_node_write_zeroes_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t off,
			       uint64_t len, uint32_t flags);
int ioc_node_flush_sync(struct ioc_loop *loop, struct ioc_node *n);
int ioc_node_truncate_sync(struct ioc_loop *loop, struct ioc_node *n, uint64_t size);

/*
 * The drain, which every front end obeys: a front end brackets each request
 * with enter and leave.  enter returns 0 (inside), or -ESHUTDOWN when the
 * node is shut; while it is held, enter waits.  Coroutine on the loop that
 * then calls leave.
 */
int ioc_coroutine_fn ioc_node_co_enter(struct ioc_node *n);
void ioc_node_leave(struct ioc_node *n);
/* Move the gate (IOC_NODE_GATE_*) and return once every loop applied it:
 * HOLD returns when no request is inside; OPEN releases the held ones;
 * SHUT answers them -ESHUTDOWN.  Blocks: not from a loop that submits to
 * n.  One change at a time. */
void ioc_node_set_gate(struct ioc_node *n, int state);
/* HOLD from a coroutine on the main loop, whose loop may submit to n: the
 * wait for the running requests (one may wait on storage that stopped
 * answering, for ever) is a job on the loop's thread pool, from where
 * every loop drains its own, and the main loop goes on meanwhile, with
 * ioc_node_is_changing() true. */
void ioc_coroutine_fn ioc_node_co_hold(struct ioc_node *n);
/*
 * A change a front end makes outside a request's coroutine (a payload
 * received straight into the image's mapping): enter_cut is inside at
 * once (true) or not at all (false: the gate is not open).  While it is
 * inside, a HOLD or SHUT calls cut->fn on this loop, which must stop
 * changing the node and call leave_cut before it returns; so a drain
 * never waits for a client stalled in the middle of a payload.  Both on
 * the loop, which keeps cut until leave_cut.
 */
struct ioc_node_cut {
	void (*fn)(struct ioc_node_cut *cut);
	struct ioc_node_cut *next, *prev;
	struct ioc_node_slot *slot;     /* NULL: not counted */
};
bool ioc_node_enter_cut(struct ioc_node *n, struct ioc_node_cut *cut);
void ioc_node_leave_cut(struct ioc_node *n, struct ioc_node_cut *cut);

void ioc_node_add_notifier(struct ioc_node *n, struct ioc_node_notifier *nt);
/* Returns once no write is running nt->fn (a drain of the notifier). */
void ioc_node_remove_notifier(struct ioc_node *n, struct ioc_node_notifier *nt);

/* A request served outside the driver (a front end's zero-copy path into
 * the node's ioc_blk): count it as the node counts its own, t0 its start
 * (ioc_now_ns()).  Any loop. */
void ioc_node_account(struct ioc_node *n, enum ioc_node_op op, uint64_t off, uint64_t len,
		      int ret, int64_t t0);

/* The counters summed over the slots (relaxed reads: statistics). */
void ioc_node_get_stats(struct ioc_node *n, struct ioc_node_stats *out);
/* query-named-block-nodes' entry for n (a new reference). */
json_t *ioc_node_info_json(struct ioc_node *n);
/* Append to list n's entry with its dirty bitmaps, then with children
 * those of its implicit children (the named ones are listed on their own),
 * as QEMU lists every node once (query.c). */
void ioc_node_query_json(json_t *list, struct ioc_node *n, bool children);
/* query-blockstats' entry for n, with its children's as "parent" and
 * "backing" (a new reference). */
json_t *ioc_node_blockstats_json(struct ioc_node *n);
/*
 * Hand-over of a node on shared storage (active.c), main thread, no
 * request inside: ioc_node_inactivate() lets the image go (the driver's
 * inactivate), after which changes fail with -EROFS until
 * ioc_node_activate() takes it back (or a driver that opened it inactive
 * takes it for the first time).  -ENOTSUP when the driver has no such
 * hook; -EALREADY when the node already is in that state.  err says why.
 */
int ioc_node_inactivate(struct ioc_node *n, char *err, size_t errlen);
int ioc_node_activate(struct ioc_node *n, char *err, size_t errlen);
bool ioc_node_is_active(struct ioc_node *n);
/* Whether one of the two runs (in a coroutine that sleeps meanwhile, the
 * main loop going on): the control socket's bitmap commands refuse the
 * node until it ends.  Main thread. */
bool ioc_node_is_changing(struct ioc_node *n);
/* What names n's image across hosts, or NULL: not shared storage. */
const char *ioc_node_shared_id(struct ioc_node *n);

/* The block-layer image under a file node (or the file child of a
 * format node that passes requests through unchanged); NULL otherwise. */
struct ioc_blk *ioc_node_blk(struct ioc_node *n);
/* Where n's dirty bitmaps live: its driver's set (n->dirty_set), else the
 * image under it (ioc_node_blk()); NULL when it has none. */
struct ioc_blk *ioc_node_dirty_blk(struct ioc_node *n);

#endif /* IOC_NODE_H */
