/*
 * Frame cache: decoded frames of a compressed image, shared by every
 * connection and I/O thread that reads it.
 *
 * Problem: decoding a 256 KiB zstd frame costs ~100 us of CPU, a cache hit
 * a memcpy.  Readers on several I/O threads hit the same hot frames (a boot
 * disk's first megabytes), and two readers of one cold frame must not both
 * decode it.  nbdkit's xz filter keeps an LRU of 8 blocks per connection,
 * so every connection decodes the same frames again.
 *
 * Design: one cache per image, split into 16 shards by a hash of the key,
 * each with its own mutex, hash chains and CLOCK ring, so threads reading
 * different frames rarely meet on a lock and a hit costs one uncontended
 * lock/unlock plus a reference increment.  An entry is created BUSY by the
 * first reader that misses (it owns the decode); later readers take a
 * reference and queue a waiter (a node on their own stack holding a
 * struct ioc_co_await) under the shard lock.  Publish moves the entry to
 * READY under the same lock and wakes the queued waiters after unlocking;
 * a waiter queued before the state change is always in the list publish
 * takes, and one arriving after sees READY and does not queue: no lost
 * wakeup, because both sides decide under the shard lock.  Data written by
 * the decoder before publish is visible to readers through that lock (or
 * through ioc_co_await, which orders the wake after publish's unlock).
 *
 * Memory: a global byte count (atomic) of the data held by the table.  An
 * insert that pushes it past the budget evicts with CLOCK: the hand of a
 * shard passes entries that are in use (a reader's reference or BUSY) and
 * clears reference bits, and evicts the first idle entry whose bit is
 * clear; shards are tried in turn starting from the inserter's own, one
 * lock at a time (never two held together).  When every entry is in use
 * the cache overshoots, and each put evicts again until it is back under
 * the budget; evicted entries live until their last reference is dropped.
 *
 * Rejected: one global LRU list under one lock (every hit writes the list
 * head: the lock line bounces between I/O threads); a lock-free hash with
 * hazard pointers (much more code for a path that costs a memcpy of 4 KiB
 * or more anyway); per-thread caches (the duplication this replaces).
 * FAILED entries leave the table at once, so a transient read error is
 * retried by the next reader and a corrupt frame fails every time.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/common.h"
#include "frame-cache.h"

#define NSHARDS 16u

struct shard {
	pthread_mutex_t lock;
	struct ioc__zip_fentry **buckets;
	size_t mask;
	struct ioc__zip_fentry *hand;   /* CLOCK hand; NULL when empty */
	size_t count;                   /* entries in the table */
	uint64_t hits, misses, evictions; /* under lock */
} IOC_CACHE_ALIGNED;

struct ioc__zip_fcache {
	struct shard shards[NSHARDS];
	size_t budget;
	/* Bytes of data held by the table: added at insert, subtracted at
	 * removal; relaxed, it only steers eviction. */
	_Atomic size_t bytes IOC_CACHE_ALIGNED;
	/* Shard to start evicting from: relaxed fetch_add, no pairing (any
	 * value is a valid start; it only spreads evictions). */
	_Atomic unsigned next_victim;
};

static uint64_t mix(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

static struct shard *shard_of(struct ioc__zip_fcache *c, uint64_t key, size_t *bucket)
{
	uint64_t h = mix(key);
	struct shard *s = &c->shards[h % NSHARDS];

	*bucket = (size_t)(h / NSHARDS) & s->mask;
	return s;
}

int ioc__zip_fcache_new(struct ioc__zip_fcache **out, size_t budget, size_t nkeys_hint)
{
	struct ioc__zip_fcache *c = aligned_alloc(IOC_CACHELINE,
						 (sizeof(*c) + IOC_CACHELINE - 1) &
						 ~(size_t)(IOC_CACHELINE - 1));
	size_t nb = 16;

	if (!c)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	while (nb < nkeys_hint / NSHARDS && nb < (1u << 20))
		nb <<= 1;
	for (unsigned i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->shards[i];

		pthread_mutex_init(&s->lock, NULL);
		s->mask = nb - 1;
		s->buckets = calloc(nb, sizeof(*s->buckets));
		if (!s->buckets) {
			ioc__zip_fcache_free(c);
			return -ENOMEM;
		}
	}
	c->budget = budget;
	*out = c;
	return 0;
}

static void entry_free(struct ioc__zip_fentry *e)
{
	free(e->data);
	free(e);
}

static void unref(struct ioc__zip_fentry *e)
{
	/* Pairs with the other decrements: the thread that frees sees every
	 * write made by earlier holders. */
	if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
		entry_free(e);
}

/* Remove e from its shard's table and ring.  Shard lock held.  The
 * table's reference is the caller's to drop (after unlocking). */
static void detach(struct ioc__zip_fcache *c, struct shard *s, struct ioc__zip_fentry *e)
{
	size_t b = (size_t)(mix(e->key) / NSHARDS) & s->mask;
	struct ioc__zip_fentry **pp = &s->buckets[b];

	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	if (e->cnext == e) {
		s->hand = NULL;
	} else {
		e->cprev->cnext = e->cnext;
		e->cnext->cprev = e->cprev;
		if (s->hand == e)
			s->hand = e->cnext;
	}
	e->in_table = false;
	s->count--;
	atomic_fetch_sub_explicit(&c->bytes, e->len, memory_order_relaxed);
}

void ioc__zip_fcache_free(struct ioc__zip_fcache *c)
{
	if (!c)
		return;
	for (unsigned i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->shards[i];

		while (s->hand) {
			struct ioc__zip_fentry *e = s->hand;

			detach(c, s, e);
			unref(e);
		}
		free(s->buckets);
		pthread_mutex_destroy(&s->lock);
	}
	free(c);
}

static struct ioc__zip_fentry *lookup(struct shard *s, size_t b, uint64_t key)
{
	for (struct ioc__zip_fentry *e = s->buckets[b]; e; e = e->hnext)
		if (e->key == key)
			return e;
	return NULL;
}

/* One CLOCK sweep of s: evict one idle entry.  Returns the entry (the
 * table's reference now the caller's) or NULL.  Shard lock held. */
static struct ioc__zip_fentry *clock_evict(struct ioc__zip_fcache *c, struct shard *s)
{
	struct ioc__zip_fentry *e = s->hand;
	size_t steps = 0, limit;

	if (!e)
		return NULL;
	/* Two turns of the ring at most: the first clears reference bits. */
	limit = 2 * s->count + 1;
	while (steps++ < limit) {
		/* refs == 1: only the table holds it (increments happen under
		 * this lock, so it cannot change under us but downwards). */
		bool idle = e->state == IOC__ZIP_FC_READY &&
			    atomic_load_explicit(&e->refs, memory_order_relaxed) == 1;

		if (idle && !e->used) {
			detach(c, s, e);
			s->evictions++;
			return e;
		}
		if (idle)
			e->used = false;
		e = e->cnext;
		s->hand = e;
	}
	return NULL;
}

static void make_room(struct ioc__zip_fcache *c)
{
	unsigned start = atomic_fetch_add_explicit(&c->next_victim, 1, memory_order_relaxed);
	unsigned fruitless = 0;

	while (atomic_load_explicit(&c->bytes, memory_order_relaxed) > c->budget &&
	       fruitless < NSHARDS) {
		struct shard *s = &c->shards[start++ % NSHARDS];
		struct ioc__zip_fentry *victim;

		pthread_mutex_lock(&s->lock);
		victim = clock_evict(c, s);
		pthread_mutex_unlock(&s->lock);
		if (victim) {
			fruitless = 0;
			unref(victim);
		} else {
			fruitless++;
		}
	}
}

struct ioc__zip_fentry *ioc__zip_fcache_get(struct ioc__zip_fcache *c, uint64_t key,
					    size_t len, bool *created, int *state)
{
	size_t b;
	struct shard *s = shard_of(c, key, &b);
	struct ioc__zip_fentry *e, *fresh;

	*created = false;
	pthread_mutex_lock(&s->lock);
	e = lookup(s, b, key);
	if (e) {
		s->hits++;
		e->used = true;
		atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
		*state = e->state;
		pthread_mutex_unlock(&s->lock);
		return e;
	}
	pthread_mutex_unlock(&s->lock);

	/* Miss: allocate outside the lock, then insert unless another thread
	 * inserted first. */
	fresh = calloc(1, sizeof(*fresh));
	if (fresh)
		fresh->data = malloc(len ? len : 1);
	if (!fresh || !fresh->data) {
		free(fresh);
		return NULL;
	}
	fresh->key = key;
	fresh->len = len;
	fresh->state = IOC__ZIP_FC_BUSY;
	fresh->in_table = true;
	fresh->used = true;
	atomic_init(&fresh->refs, 2); /* the table's and the caller's */

	pthread_mutex_lock(&s->lock);
	e = lookup(s, b, key);
	if (e) {
		s->hits++;
		e->used = true;
		atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
		*state = e->state;
		pthread_mutex_unlock(&s->lock);
		entry_free(fresh);
		return e;
	}
	s->misses++;
	fresh->hnext = s->buckets[b];
	s->buckets[b] = fresh;
	if (s->hand) {
		/* Insert just behind the hand: the last place it looks. */
		fresh->cnext = s->hand;
		fresh->cprev = s->hand->cprev;
		s->hand->cprev->cnext = fresh;
		s->hand->cprev = fresh;
	} else {
		fresh->cnext = fresh->cprev = fresh;
		s->hand = fresh;
	}
	s->count++;
	atomic_fetch_add_explicit(&c->bytes, len, memory_order_relaxed);
	pthread_mutex_unlock(&s->lock);
	*created = true;
	*state = IOC__ZIP_FC_BUSY;
	make_room(c);
	return fresh;
}

bool ioc__zip_fcache_contains(struct ioc__zip_fcache *c, uint64_t key)
{
	size_t b;
	struct shard *s = shard_of(c, key, &b);
	bool r;

	pthread_mutex_lock(&s->lock);
	r = lookup(s, b, key) != NULL;
	pthread_mutex_unlock(&s->lock);
	return r;
}

bool ioc__zip_fcache_wait_prepare(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e,
				  struct ioc__zip_fc_waiter *w)
{
	size_t b;
	struct shard *s = shard_of(c, e->key, &b);
	bool done;

	pthread_mutex_lock(&s->lock);
	done = e->state != IOC__ZIP_FC_BUSY;
	if (!done) {
		/* Decided under the lock that publish takes before it changes
		 * the state: it will find w in the list. */
		ioc_co_await_init(&w->aw);
		w->next = e->waiters;
		e->waiters = w;
	}
	pthread_mutex_unlock(&s->lock);
	return done;
}

void ioc__zip_fcache_publish(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e, int error)
{
	size_t b;
	struct shard *s = shard_of(c, e->key, &b);
	struct ioc__zip_fc_waiter *w;
	bool dropped = false;

	pthread_mutex_lock(&s->lock);
	e->error = error;
	e->state = error ? IOC__ZIP_FC_FAILED : IOC__ZIP_FC_READY;
	w = e->waiters;
	e->waiters = NULL;
	if (error && e->in_table) {
		detach(c, s, e);
		dropped = true;
	}
	pthread_mutex_unlock(&s->lock);
	while (w) {
		/* w lives on the waiter's stack: read next before the wake,
		 * which may let it return and reuse that memory. */
		struct ioc__zip_fc_waiter *next = w->next;

		ioc_co_await_done(&w->aw, error);
		w = next;
	}
	if (dropped)
		unref(e);
}

void ioc__zip_fcache_put(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e)
{
	unref(e);
	/* An insert that found every entry in use left the cache over its
	 * budget: the entry just put may be the one to evict. */
	if (atomic_load_explicit(&c->bytes, memory_order_relaxed) > c->budget)
		make_room(c);
}

void ioc__zip_fcache_get_stats(struct ioc__zip_fcache *c, struct ioc__zip_fcache_stats *st)
{
	memset(st, 0, sizeof(*st));
	for (unsigned i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->shards[i];

		pthread_mutex_lock(&s->lock);
		st->hits += s->hits;
		st->misses += s->misses;
		st->evictions += s->evictions;
		pthread_mutex_unlock(&s->lock);
	}
	st->bytes = atomic_load_explicit(&c->bytes, memory_order_relaxed);
}
