/*
 * Private state of the block layer, shared by blk.c, its backends
 * (blk-uring.c, blk-threads.c), the request helpers below them (request.c)
 * and the tests' fault hook.
 */
#ifndef IOC_BLK_INT_H
#define IOC_BLK_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>

#include "iocore/blk.h"
#include "iocore/pool.h"

enum blk_op {
	BLK_OP_READ,
	BLK_OP_WRITE,
	BLK_OP_FLUSH,
	BLK_OP_DISCARD,
	BLK_OP_ZEROES,
};

/* Capabilities that start optimistic and are cleared, once, when the
 * kernel says -EOPNOTSUPP.  Relaxed atomics: a stale bit costs one extra
 * failing syscall, never a wrong result. */
enum {
	BLK_CAP_PUNCH      = 1u << 0, /* fallocate PUNCH_HOLE|KEEP_SIZE */
	BLK_CAP_ZERO_RANGE = 1u << 1, /* fallocate ZERO_RANGE */
	BLK_CAP_DSYNC      = 1u << 2, /* pwritev2 RWF_DSYNC */
	BLK_CAP_NOWAIT     = 1u << 3, /* preadv2 RWF_NOWAIT */
	BLK_CAP_ALLOC      = 1u << 4, /* fallocate mode 0 (KEEP_SIZE) */
	BLK_CAP_CACHESTAT  = 1u << 5, /* cachestat(2), fast path without NOWAIT */
	BLK_CAP_SPLICE     = 1u << 6, /* splice(2) from the image to a pipe */
};

/*
 * Fault hook, for tests.  Called before every transfer attempt of a read or
 * write (a short transfer is retried, and the retry is a new attempt) and
 * before flush, discard and write-zeroes, on whichever thread performs the
 * attempt (a pool worker with the threads backend): it must be thread-safe.
 * Return 0 to proceed, -errno to fail the attempt with that error, or n > 0
 * to transfer at most n bytes in this attempt (a short transfer; rounded
 * down to the request alignment with cache=none, ignored if that is 0).
 * Set it while no request is in flight.  Requests with a hook installed skip
 * the inline fast path.  Cost when unset: one predictable branch.
 */
typedef int64_t ioc__blk_fault_fn(void *opaque, enum blk_op op,
				   uint64_t offset, uint64_t len);
void ioc__blk_set_fault(struct ioc_blk *blk, ioc__blk_fault_fn *fn, void *opaque);

/* How the inline fast path reads, for tests to force each one (the default
 * is chosen at open: PLAIN for tmpfs without swap, else NOWAIT, falling
 * back to CACHESTAT when the file system refuses RWF_NOWAIT). */
enum blk_fast_how {
	BLK_FAST_PLAIN,     /* preadv: reads that never wait for I/O */
	BLK_FAST_NOWAIT,    /* preadv2(RWF_NOWAIT) */
	BLK_FAST_CACHESTAT, /* cachestat(2), then preadv */
};
void ioc__blk_set_fast_how(struct ioc_blk *blk, enum blk_fast_how how);

static inline uint64_t align_down(uint64_t x, uint64_t a)
{
	return x / a * a;
}

static inline uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* Operations that may turn data into holes drop the region before they
 * are submitted and again when they complete, so a block status that
 * looked before or during the operation cannot store what it saw
 * (ioc__blk_data_store() checks the generation it started with). */
static inline bool blk_may_punch(enum blk_op op)
{
	return op == BLK_OP_DISCARD || op == BLK_OP_ZEROES;
}


struct blk_req;

struct ioc_blk {
	int fd;
	enum ioc_blk_driver driver;
	enum ioc_blk_aio aio;        /* resolved: IO_URING or THREADS */
	bool o_direct;
	bool read_only;
	bool is_blockdev;
	bool fast_path;
	bool null_read_zeroes;
	int64_t null_latency_ns;
	bool never_waits;            /* tmpfs without swap: reads do no I/O */
	/* ioc_blk_map_read(): the image mapped shared, read-only, as of
	 * open (map_len bytes; NULL: not mapped), and which MAP_FILL-sized
	 * pieces of it have had their page tables filled (relaxed bits). */
	const uint8_t *map;
	uint64_t map_len;
	_Atomic uint64_t *map_filled;
	_Atomic bool map_broken;     /* a copy failed, or a hole: lend no more */
	_Atomic bool map_touched;    /* written through the mapping since the
				      * last flush: the file's mtime is due */
	uint32_t mem_align;          /* buffer alignment for O_DIRECT, else 1 */
	uint32_t req_align;          /* offset/length alignment, else 1 */
	uint32_t opt_align;
	uint32_t dev_align;          /* logical block size of a device, else 1 */
	_Atomic uint64_t size;       /* written by truncate; relaxed */
	_Atomic unsigned caps;       /* BLK_CAP_*; relaxed */
	_Atomic int fp_credit;       /* fast-path misses left before it backs off */

	ioc__blk_fault_fn *fault;
	void *fault_opaque;

	/* The first write-back error a sync reported (a negative errno), 0
	 * while there has been none.  Sticky: once set, every later flush and
	 * FUA request fails with it (see "Write-back errors" in blk.c).
	 * Release store in blk_note_sync() (request.c), acquire loads in
	 * blk_wb_err(). */
	_Atomic int wb_err;

	/* cache=none only: writes in flight, so that a read-modify-write of
	 * a partial block never overlaps another write (see blk.c). */
	pthread_mutex_t track_lock;
	struct blk_req *tracked;

	/* One region known to hold data, [data_start, data_end), so block
	 * status inside it needs no lseek (see ioc_blk_co_block_status()).
	 * data_gen counts invalidations.  Writers hold data_lock; readers
	 * use the sequence count (odd while a writer is inside), so the
	 * hot path of every I/O thread writes no shared line. */
	pthread_mutex_t data_lock;
	_Atomic uint64_t data_seq;
	_Atomic uint64_t data_start, data_end, data_gen;

	char *path;                  /* image file; NULL for the null driver */
	/* Dirty bitmaps (dirty-bitmap.c).  Two published vectors of slots:
	 * dirty_all holds every bitmap (lookups, listing), dirty_rec only
	 * the recording ones, which is all a marker walks, NULL while there
	 * is none.  The vectors and their slots are published with release
	 * stores and read with acquire loads; a vector replaced (grown,
	 * compacted, emptied) and a removed bitmap wait on the retired
	 * lists until close (see "Sets" in dirty-bitmap.c). */
	struct blk_dirty_vec *_Atomic dirty_all;
	struct blk_dirty_vec *_Atomic dirty_rec;
	struct blk_dirty_vec *dirty_vec_retired;
	unsigned dirty_count;        /* bitmaps in dirty_all; control thread */
	struct ioc_blk_dirty *dirty_retired;
	uint64_t dirty_seq;
	const struct ioc_blk_dirty_store *dirty_store; /* persistent bitmaps' */
	void *dirty_store_opaque;

	/* Large inline writes (tmpfs without swap) run on this one-thread
	 * pool, so the calling loop goes on receiving (see "Large writes"
	 * in blk.c).  Created on first use: the CAS in blk_writer() is a
	 * release, the loads there acquire. */
	struct ioc_pool *_Atomic writer;
	/* Writes queued on or running in the writer (writer_run()): a hint,
	 * so relaxed; at IOC_BLK_WRITER_QUEUE a large write stays inline. */
	_Atomic unsigned writer_jobs;

	/* tmpfs images: the thread regrouping the page cache into huge
	 * pages (huge.c).  huge_stop: relaxed store at close, relaxed load
	 * per range there; the other fields are the thread's, read after
	 * the join. */
	pthread_t huge_thread;
	bool huge_running;
	_Atomic bool huge_stop;
	unsigned huge_done, huge_skipped;
	int huge_err;
};

/* huge.c: start the background pass over a tmpfs image (at open), stop
 * and join it (at close).  ioc__blk_huge_wait(): tests, join it and report
 * 2 MiB ranges collapsed and skipped; 0 or the -errno that ended it. */
void ioc__blk_huge_start(struct ioc_blk *blk);
void ioc__blk_huge_stop(struct ioc_blk *blk);
int ioc__blk_huge_wait(struct ioc_blk *blk, unsigned *done, unsigned *skipped);

/* Per-request state, inside struct ioc_blk_req's priv[]. */
struct blk_req {
	struct ioc_blk *blk;
	struct ioc_loop *loop;        /* completion loop */
	/* What the backend transfers: iov/iovcnt, io_len bytes at io_offset
	 * (the caller's request, or the aligned bounce region). */
	const struct iovec *iov;
	struct iovec *tmp_iov;        /* heap; iov sliced after a short transfer */
	void *bounce;                 /* heap, aligned; cache=none misalignment */
	const struct iovec *user_iov; /* caller's vector when bounced */
	int iovcnt;
	int user_iovcnt;
	uint64_t offset, len;         /* the request as asked */
	uint64_t io_offset, io_len;
	uint64_t done;                /* bytes of io_len transferred */
	int64_t ret;
	uint32_t flags;
	uint8_t op;                   /* enum blk_op */
	bool submitting;              /* inside the submitting call */
	bool direct_cb;               /* coroutine API: no deferral needed */
	bool tracked;
	bool rmw;                     /* whole request done by the rmw job */
	bool rmw_track;               /* may read-modify-write: track as rmw */
	bool use_pool;                /* this request goes to the pool */
	struct blk_req *track_next;   /* in blk->tracked */
	struct blk_req *waiters;      /* requests waiting for this one */
	struct blk_req *wait_next;
	struct iovec bounce_iov;
	union {
		struct ioc_uring_op uop;
		struct ioc_pool_req preq;
		struct ioc_task task;
		struct ioc_timer timer;   /* null driver with a latency */
	} u;
};

_Static_assert(sizeof(struct blk_req) <= sizeof(((struct ioc_blk_req *)0)->priv),
	       "struct blk_req must fit in ioc_blk_req.priv");

/*
 * The image's shared, relaxed state.  size: pairs with nothing; a request
 * racing with a truncate is checked against either size, as with any
 * concurrent resize, and a truncate is ordered with its own caller's later
 * requests by program order.  caps: a capability bit is only ever cleared,
 * after the kernel refused it; a stale set bit costs one more refused call.
 */
static inline uint64_t blk_size(const struct ioc_blk *blk)
{
	return atomic_load_explicit(&blk->size, memory_order_relaxed);
}

static inline void blk_set_size(struct ioc_blk *blk, uint64_t size)
{
	atomic_store_explicit(&blk->size, size, memory_order_relaxed);
}

static inline unsigned blk_caps(const struct ioc_blk *blk)
{
	return atomic_load_explicit(&blk->caps, memory_order_relaxed);
}

static inline void blk_cap_clear(struct ioc_blk *blk, unsigned cap)
{
	atomic_fetch_and_explicit(&blk->caps, ~cap, memory_order_relaxed);
}

/* Whether a request promises durability (see "Write-back errors" in
 * blk.c). */
static inline bool blk_is_sync(enum blk_op op, uint32_t flags)
{
	return op == BLK_OP_FLUSH ||
		((op == BLK_OP_WRITE || op == BLK_OP_ZEROES) && (flags & IOC_BLK_FUA));
}

/* Acquire: pairs with the release store in blk_note_sync() (request.c), so
 * a sync that sees the error also sees everything the failed sync's thread
 * did before recording it. */
static inline int blk_wb_err(const struct ioc_blk *blk)
{
	return atomic_load_explicit(&blk->wb_err, memory_order_acquire);
}

static inline struct blk_req *blk_req_of(struct ioc_blk_req *req)
{
	return (struct blk_req *)(void *)req->priv;
}

static inline struct ioc_blk_req *blk_public_of(struct blk_req *r)
{
	return ioc_container_of((void *)r, struct ioc_blk_req, priv);
}

/* Attempt size limit from the fault hook: 0 = proceed, <0 = fail, >0 = cap. */
int64_t ioc__blk_fault_check(struct blk_req *r, uint64_t offset, uint64_t len);

/* Results of one read/write attempt, shared by every backend: returns >0
 * when more must be transferred, 0 when done, or -errno. */
int ioc__blk_rw_account(struct blk_req *r, int64_t res);
/* The vector for the next attempt: what is left after r->done, capped at
 * max bytes.  Returns the vector count (>0) and the vector in *out, or
 * -ENOMEM. */
int ioc__blk_rw_slice(struct blk_req *r, uint64_t max, const struct iovec **out);

/* Completion of a request by any backend: bounce copy-out, tracking,
 * caller's callback. Loop thread. */
void ioc__blk_finish(struct blk_req *r, int64_t ret);
/* The caller's callback, deferred through a task posted to the request's
 * loop when the request completes inside the call that submitted it. */
void ioc__blk_deliver(struct blk_req *r, int64_t ret);

/* The known-data region (request.c): drop it; the bytes of data from
 * offset to its end (0 outside), with the generation seen in *gen; store
 * [start, end) unless the region was dropped since gen. */
void ioc__blk_data_invalidate(struct ioc_blk *blk);
uint64_t ioc__blk_data_lookup(struct ioc_blk *blk, uint64_t offset, uint64_t *gen);
void ioc__blk_data_store(struct ioc_blk *blk, uint64_t gen, uint64_t start, uint64_t end);

/* Copies and fills over an iovec (request.c). */
void ioc__blk_iov_memset(const struct iovec *iov, int iovcnt, uint64_t skip,
			 int c, uint64_t len);
void ioc__blk_iov_to_buf(const struct iovec *iov, int iovcnt, void *buf);
void ioc__blk_iov_from_buf(const struct iovec *iov, int iovcnt, const void *buf);

/* Dirty bitmaps: mark [offset, offset+len) in every recording bitmap
 * after a write, write-zeroes or discard ran (whatever its result) and
 * before it completes.  0, or -errno when a persistent bitmap could not be made
 * durable (the request then fails with it).  Any thread. */
int ioc__blk_dirty_mark(struct ioc_blk *blk, uint64_t offset, uint64_t len);
static inline int blk_dirty_mark(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	/* Relaxed: a bitmap added while this request was in flight may or
	 * may not see it, as with any add racing a write; the vector is
	 * loaded again with acquire in ioc__blk_dirty_mark(). */
	if (ioc_likely(!atomic_load_explicit(&blk->dirty_rec, memory_order_relaxed)))
		return 0;
	return ioc__blk_dirty_mark(blk, offset, len);
}
/* Write-ahead for persistent bitmaps: make the bits of [offset,
 * offset+len) durable in every recording persistent bitmap before a
 * write, write-zeroes or discard is issued (dirty-bitmap.c).  0, or
 * -errno when the sidecar could not be written (the request then fails
 * before touching the image).  Any thread. */
int ioc__blk_dirty_prepare(struct ioc_blk *blk, uint64_t offset, uint64_t len);
static inline int blk_dirty_prepare(struct ioc_blk *blk, uint64_t offset, uint64_t len)
{
	/* Relaxed: as in blk_dirty_mark(). */
	if (ioc_likely(!atomic_load_explicit(&blk->dirty_rec, memory_order_relaxed)))
		return 0;
	return ioc__blk_dirty_prepare(blk, offset, len);
}
/* Write persistent bitmaps out cleanly and free every bitmap (close). */
void ioc__blk_dirty_close(struct ioc_blk *blk);

/* Sidecar parser (also the fuzz target's entry): checks a whole sidecar
 * file in buf against the image size and the name its file name gives.
 * Returns 0 and fills *gran, *flags and *words (pointing into buf) when
 * it is complete and consistent, else -EUCLEAN (*gran still set when
 * the header was readable, else 0). */
#define IOC__DIRTY_F_IN_USE   1u
#define IOC__DIRTY_F_DISABLED 2u
int ioc__blk_dirty_parse(const void *buf, size_t len, uint64_t image_size,
			 const char *name, uint64_t *gran, uint32_t *flags,
			 const uint8_t **words);

/* Backends. */
void ioc__blk_uring_submit(struct blk_req *r);   /* falls back to threads */
void ioc__blk_threads_submit(struct blk_req *r);
/* Synchronous forms run by pool workers (and by the rmw job). */
int64_t ioc__blk_sync_rw(struct blk_req *r);
int64_t ioc__blk_sync_op(struct blk_req *r);
int64_t ioc__blk_sync_rmw(struct blk_req *r);
/* Read len bytes at off into p, zeroes past the end of the file: 0 or
 * -errno (blk-threads.c). */
int ioc__blk_pread_full(int fd, void *p, uint64_t len, uint64_t off);
/* Write all len bytes of p at off: 0 or -errno (-EIO if the file takes
 * none). */
int ioc__blk_pwrite_full(int fd, const void *p, uint64_t len, uint64_t off);

#endif /* IOC_BLK_INT_H */
