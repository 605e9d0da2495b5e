/*
 * Private to src/zip: a cache of decoded frames shared by every thread
 * that reads a compressed image (see frame-cache.c for the design).
 *
 * An entry is found by key (the frame's number), holds one frame's
 * decoded bytes and is reference counted: a reader holds a reference from
 * ioc__zip_fcache_get() until ioc__zip_fcache_put(), and the data stays
 * valid that long even if the entry is evicted meanwhile.
 */
#ifndef IOC_ZIP_FRAME_CACHE_H
#define IOC_ZIP_FRAME_CACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "iocore/co.h"

struct ioc__zip_fcache;

enum {
	IOC__ZIP_FC_BUSY = 0,   /* being decoded by the thread that created it */
	IOC__ZIP_FC_READY,      /* data valid and immutable */
	IOC__ZIP_FC_FAILED,     /* decode failed: error says why */
};

/* A reader waiting for a BUSY entry: lives on the reader's stack, queued
 * under the entry's shard lock, woken by ioc__zip_fcache_publish(). */
struct ioc__zip_fc_waiter {
	struct ioc__zip_fc_waiter *next;
	struct ioc_co_await aw;
	/* For an entry decoded in place: where its publisher copies the
	 * waiter's part ([lo, lo + len) of the frame) before the wake. */
	uint8_t *dst;
	size_t lo, len;
};

struct ioc__zip_fentry {
	/* All under the shard lock. */
	struct ioc__zip_fentry *hnext;          /* hash chain */
	struct ioc__zip_fentry *cnext, *cprev;  /* CLOCK ring or FIFO */
	struct ioc__zip_fc_waiter *waiters;
	int state;
	int error;
	bool in_table;
	bool used;                              /* CLOCK reference bit; on
						 * probation: read again */
	bool probation;                         /* in the FIFO, not the ring */
	/* Immutable after creation. */
	bool pooled;                            /* data from the buffer pool */
	bool inplace;                           /* no data: decoded into its
						 * creator's buffer, in the
						 * table only while BUSY */
	uint64_t key;
	size_t len;
	/* Written by the creator until publish, read-only after. */
	uint8_t *data;
	/* The table holds one reference while in_table; each reader one.
	 * Incremented only under the shard lock (so an entry the table no
	 * longer holds is never revived); the decrement that reaches zero
	 * frees, and pairs (acq_rel) with every earlier decrement. */
	_Atomic uint32_t refs;
};

struct ioc__zip_fcache_stats {
	uint64_t hits, misses, evictions, bytes;
	uint64_t admitted;      /* kept past probation: read again, or a
				 * miss on a frame probation dropped lately */
	uint64_t probation_bytes;
};

/* budget: bytes of decoded data kept (entries in use may push past it
 * until they are put), a sixteenth of it on probation.  nkeys_hint sizes
 * the hash tables; slot is the usual entry size (the pool recycles
 * buffers of that size; 0: no pool). */
int ioc__zip_fcache_new(struct ioc__zip_fcache **out, size_t budget, size_t nkeys_hint,
			size_t slot);
/* No entry may be referenced any more. */
void ioc__zip_fcache_free(struct ioc__zip_fcache *c);

/* Find key, or create a BUSY entry of len bytes for it (*created = true:
 * the caller decodes into e->data and calls publish).  Returns the entry
 * with a reference for the caller, and in *state its state as seen then;
 * NULL on -ENOMEM.  Any thread. */
struct ioc__zip_fentry *ioc__zip_fcache_get(struct ioc__zip_fcache *c, uint64_t key,
					    size_t len, bool *created, int *state);
/* Find key (as get does), or claim it for a decode into the caller's own
 * buffer: a BUSY entry without data (*created = true) that later readers
 * find and wait on, and that ioc__zip_fcache_publish_inplace() serves and
 * takes out of the table.  NULL on -ENOMEM. */
struct ioc__zip_fentry *ioc__zip_fcache_claim(struct ioc__zip_fcache *c, uint64_t key,
					      bool *created, int *state);
/* The creator of an in-place entry decoded it into src (error 0) or
 * failed: copy each waiter's part out of src, take the entry out of the
 * table, wake the waiters.  The caller still puts its reference. */
void ioc__zip_fcache_publish_inplace(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e,
				     const uint8_t *src, int error);
/* Is key cached or being decoded?  (A hint: readahead skips it.) */
bool ioc__zip_fcache_contains(struct ioc__zip_fcache *c, uint64_t key);
/* If e is still BUSY, queue w (ioc_co_await_init done here) and return
 * false: the caller then ioc_co_await(&w->aw)s.  Otherwise return true
 * (nothing queued).  Either way e->state is final afterwards.  For an
 * in-place entry, w->dst, lo and len must be set: a wake with 0 means
 * the bytes are there; true returned means they are not (decode them). */
bool ioc__zip_fcache_wait_prepare(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e,
				  struct ioc__zip_fc_waiter *w);
/* The creator's decode finished (error 0 or -errno): make the entry
 * READY (or FAILED, and drop it from the table so a later read tries
 * again) and wake its waiters.  Any thread. */
void ioc__zip_fcache_publish(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e, int error);
/* Drop a reference.  Any thread. */
void ioc__zip_fcache_put(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e);
void ioc__zip_fcache_get_stats(struct ioc__zip_fcache *c, struct ioc__zip_fcache_stats *st);

#endif /* IOC_ZIP_FRAME_CACHE_H */
