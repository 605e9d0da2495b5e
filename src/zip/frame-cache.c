/*
 * Frame cache: decoded frames of a compressed image, shared by every
 * connection and I/O thread reading it.  Problem: a hit costs a memcpy, a
 * miss a decode; threads hit the same hot frames, and two readers of a cold
 * frame must not both decode it.  A first pass (scan, boot, cold benchmark)
 * touches most frames once: keeping each in fresh memory costs more than its
 * decode (faults, heap growth) and pushes out frames read again.
 *
 * Design: 16 shards by key hash, each with its own mutex, hash chains, CLOCK
 * ring (the main cache) and FIFO (probation), so threads on different frames
 * rarely share a lock.  A miss makes a BUSY entry its creator decodes; later
 * readers take a reference and queue a waiter (on their stack) under the
 * shard lock; publish sets READY under that lock and wakes the queue after
 * unlocking.  A waiter queued before the change is on the list publish
 * takes, one arriving after sees READY: both decide under the lock, so no
 * wakeup is lost, and the lock (or ioc_co_await) orders the decoder's writes
 * before the readers'.  Admission, after S3-FIFO's small queue and ghost: a
 * new entry goes on probation (a FIFO of a sixteenth of the budget), its
 * data in a pooled, already touched buffer.  Over its share, probation's
 * oldest idle entry moves to the ring if read again meanwhile (a second
 * reader, a sequential walk's next 4 KiB), else leaves: buffer to the pool,
 * key to the ghost (a direct-mapped table of dropped keys, a slot per frame
 * the ring holds, aged by collisions).  A miss the ghost holds goes straight
 * to the ring.  CLOCK passes entries in use (referenced or BUSY), clears
 * reference bits and evicts the first idle entry with a clear bit, trying
 * shards in turn, one lock at a time; with every entry in use the cache
 * overshoots and each put evicts until back under budget.  Evicted entries
 * live until their last reference goes.  Freed buffers return to the pool
 * while it holds under probation's share, else to malloc; it starts full (up
 * to 16 MiB, touched at creation) lest a first pass fault in a buffer per
 * miss.  FAILED entries leave the table at once: a transient read error is
 * retried, a corrupt frame fails every time.
 *
 * Rejected: admitting every miss (a scan fills the budget with fresh memory
 * for frames never read again); a doorkeeper without probation (a sequential
 * 4 KiB walk would decode each frame twice, once to note it); a bit per
 * frame of the image (grows with the image, not the budget); one locked LRU
 * (every hit writes its head); a lock-free hash (much more code where a
 * memcpy is paid anyway); per-thread caches (all decode the same frames).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "iocore/common.h"
#include "frame-cache.h"

#define NSHARDS 16u
#define PREFILL (16u << 20)     /* probation buffers made at creation */

struct shard {
	pthread_mutex_t lock;
	struct ioc__zip_fentry **buckets;
	size_t mask;
	struct ioc__zip_fentry *hand;   /* CLOCK hand; NULL when the ring is empty */
	struct ioc__zip_fentry *fifo;   /* probation's oldest; NULL when empty */
	size_t count;                   /* entries in the table */
	uint64_t *ghost;                /* key + 1 of dropped entries; 0 = empty */
	size_t gmask;
	uint64_t hits, misses, evictions, admitted; /* under lock */
} IOC_CACHE_ALIGNED;

struct ioc__zip_fcache {
	struct shard shards[NSHARDS];
	size_t budget, fifo_budget, slot;
	/* Bytes of data held by the table (ring and probation) and by
	 * probation alone: added at insert, subtracted at removal or
	 * promotion; relaxed, they only steer eviction. */
	_Atomic size_t bytes IOC_CACHE_ALIGNED;
	_Atomic size_t fifo_bytes;
	/* Shard to start evicting from: relaxed fetch_add, no pairing (any
	 * value is a valid start; it only spreads evictions). */
	_Atomic unsigned next_victim;
	/* Recycled buffers of slot bytes, LIFO (the last freed is the
	 * likeliest still in the CPU's caches). */
	pthread_mutex_t pool_lock IOC_CACHE_ALIGNED;
	void **pool;
	size_t pool_n, pool_max;
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

static size_t ghost_slot(const struct shard *s, uint64_t key)
{
	return (size_t)(mix(key) >> 40) & s->gmask;
}

int ioc__zip_fcache_new(struct ioc__zip_fcache **out, size_t budget, size_t nkeys_hint,
			size_t slot)
{
	struct ioc__zip_fcache *c = aligned_alloc(IOC_CACHELINE,
						 (sizeof(*c) + IOC_CACHELINE - 1) &
						 ~(size_t)(IOC_CACHELINE - 1));
	size_t nb = 16, ng = 8, ring_keys;

	if (!c)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->pool_lock, NULL);
	for (unsigned i = 0; i < NSHARDS; i++)
		pthread_mutex_init(&c->shards[i].lock, NULL);
	c->budget = budget;
	c->fifo_budget = budget / 16;
	c->slot = slot;
	/* The ghost remembers about as many keys as the ring holds frames. */
	ring_keys = (budget - c->fifo_budget) / (slot > 4096 ? slot : 4096);
	while (nb < nkeys_hint / NSHARDS && nb < (1u << 20))
		nb <<= 1;
	while (ng < ring_keys / NSHARDS && ng < (1u << 20))
		ng <<= 1;
	if (slot) {
		c->pool_max = c->fifo_budget / slot > 8 ? c->fifo_budget / slot : 8;
		c->pool = calloc(c->pool_max, sizeof(*c->pool));
		if (!c->pool) {
			ioc__zip_fcache_free(c);
			return -ENOMEM;
		}
		/* Probation's buffers (up to PREFILL bytes of them) made and
		 * touched now: the first misses would otherwise each fault a
		 * fresh buffer in, ~10 us for 16 KiB, as much as its decode.
		 * Short of memory, the misses make the rest. */
		while (c->pool_n < c->pool_max && (c->pool_n + 1) * slot <= PREFILL) {
			void *p = malloc(slot);

			if (!p)
				break;
			memset(p, 0, slot);
			c->pool[c->pool_n++] = p;
		}
	}
	for (unsigned i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->shards[i];

		s->mask = nb - 1;
		s->buckets = calloc(nb, sizeof(*s->buckets));
		s->gmask = ng - 1;
		s->ghost = calloc(ng, sizeof(*s->ghost));
		if (!s->buckets || !s->ghost) {
			ioc__zip_fcache_free(c);
			return -ENOMEM;
		}
	}
	*out = c;
	return 0;
}

/* ---- buffers -------------------------------------------------------- */

static void *buf_get(struct ioc__zip_fcache *c, size_t len, bool *pooled)
{
	void *p = NULL;

	*pooled = c->slot && len <= c->slot;
	if (!*pooled)
		return malloc(len ? len : 1);
	pthread_mutex_lock(&c->pool_lock);
	if (c->pool_n)
		p = c->pool[--c->pool_n];
	pthread_mutex_unlock(&c->pool_lock);
	return p ? p : malloc(c->slot);
}

static void buf_put(struct ioc__zip_fcache *c, void *p, bool pooled)
{
	if (pooled) {
		pthread_mutex_lock(&c->pool_lock);
		if (c->pool_n < c->pool_max) {
			c->pool[c->pool_n++] = p;
			p = NULL;
		}
		pthread_mutex_unlock(&c->pool_lock);
	}
	free(p);
}

static void entry_free(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e)
{
	buf_put(c, e->data, e->pooled);
	free(e);
}

static void unref(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e)
{
	/* Pairs with the other decrements: the thread that frees sees every
	 * write made by earlier holders. */
	if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
		entry_free(c, e);
}

/* ---- rings ---------------------------------------------------------- */

/* Append e to the circular list whose oldest is *head (the tail is the
 * entry before it: for the CLOCK ring, just behind the hand, the last
 * place it looks). */
static void ring_add(struct ioc__zip_fentry **head, struct ioc__zip_fentry *e)
{
	struct ioc__zip_fentry *h = *head;

	if (h) {
		e->cnext = h;
		e->cprev = h->cprev;
		h->cprev->cnext = e;
		h->cprev = e;
	} else {
		e->cnext = e->cprev = e;
		*head = e;
	}
}

static void ring_del(struct ioc__zip_fentry **head, struct ioc__zip_fentry *e)
{
	if (e->cnext == e) {
		*head = NULL;
	} else {
		e->cprev->cnext = e->cnext;
		e->cnext->cprev = e->cprev;
		if (*head == e)
			*head = e->cnext;
	}
}

/* Remove e from its shard's table and ring or FIFO.  Shard lock held.
 * The table's reference is the caller's to drop (after unlocking). */
static void detach(struct ioc__zip_fcache *c, struct shard *s, struct ioc__zip_fentry *e)
{
	size_t b = (size_t)(mix(e->key) / NSHARDS) & s->mask;
	struct ioc__zip_fentry **pp = &s->buckets[b];

	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	if (e->probation) {
		ring_del(&s->fifo, e);
		atomic_fetch_sub_explicit(&c->fifo_bytes, e->len, memory_order_relaxed);
	} else if (!e->inplace) {
		ring_del(&s->hand, e);
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

		while (s->hand || s->fifo) {
			struct ioc__zip_fentry *e = s->hand ? s->hand : s->fifo;

			detach(c, s, e);
			unref(c, e);
		}
		free(s->buckets);
		free(s->ghost);
		pthread_mutex_destroy(&s->lock);
	}
	while (c->pool_n)
		free(c->pool[--c->pool_n]);
	free(c->pool);
	pthread_mutex_destroy(&c->pool_lock);
	free(c);
}

static struct ioc__zip_fentry *lookup(struct shard *s, size_t b, uint64_t key)
{
	for (struct ioc__zip_fentry *e = s->buckets[b]; e; e = e->hnext)
		if (e->key == key)
			return e;
	return NULL;
}

/* Only the table holds e and its data is final.  Shard lock held: the
 * reference count is raised only under it, so it cannot rise under us. */
static bool idle(const struct ioc__zip_fentry *e)
{
	return e->state == IOC__ZIP_FC_READY &&
	       atomic_load_explicit(&e->refs, memory_order_relaxed) == 1;
}

/* One CLOCK sweep of s's ring: evict one idle entry.  Returns the entry
 * (the table's reference now the caller's) or NULL.  Shard lock held. */
static struct ioc__zip_fentry *clock_evict(struct ioc__zip_fcache *c, struct shard *s)
{
	struct ioc__zip_fentry *e = s->hand;
	size_t steps = 0, limit;

	if (!e)
		return NULL;
	/* Two turns of the ring at most: the first clears reference bits. */
	limit = 2 * s->count + 1;
	while (steps++ < limit) {
		bool ok = idle(e);

		if (ok && !e->used) {
			detach(c, s, e);
			s->evictions++;
			return e;
		}
		if (ok)
			e->used = false;
		e = e->cnext;
		s->hand = e;
	}
	return NULL;
}

/* Take the oldest idle entry off s's probation: into the ring if it was
 * read again (returns NULL, *moved set), else out of the table with its
 * key in the ghost (returned: the table's reference is the caller's).
 * Entries in use are passed over (requeued behind the others).  Shard
 * lock held. */
static struct ioc__zip_fentry *fifo_evict(struct ioc__zip_fcache *c, struct shard *s,
					  bool *moved)
{
	size_t n = s->count + 1;

	*moved = false;
	while (s->fifo && n--) {
		struct ioc__zip_fentry *e = s->fifo;

		if (!idle(e)) {
			s->fifo = e->cnext;
			continue;
		}
		if (e->used) {
			ring_del(&s->fifo, e);
			atomic_fetch_sub_explicit(&c->fifo_bytes, e->len, memory_order_relaxed);
			e->probation = false;
			ring_add(&s->hand, e);
			s->admitted++;
			*moved = true;
			return NULL;
		}
		detach(c, s, e);
		s->ghost[ghost_slot(s, e->key)] = e->key + 1;
		s->evictions++;
		return e;
	}
	return NULL;
}

static void make_room(struct ioc__zip_fcache *c)
{
	unsigned start = atomic_fetch_add_explicit(&c->next_victim, 1, memory_order_relaxed);
	unsigned fruitless = 0;

	while (atomic_load_explicit(&c->fifo_bytes, memory_order_relaxed) > c->fifo_budget &&
	       fruitless < NSHARDS) {
		struct shard *s = &c->shards[start++ % NSHARDS];
		struct ioc__zip_fentry *victim;
		bool moved;

		pthread_mutex_lock(&s->lock);
		victim = fifo_evict(c, s, &moved);
		pthread_mutex_unlock(&s->lock);
		if (victim)
			unref(c, victim);
		fruitless = victim || moved ? 0 : fruitless + 1;
	}
	fruitless = 0;
	while (atomic_load_explicit(&c->bytes, memory_order_relaxed) > c->budget &&
	       fruitless < NSHARDS) {
		struct shard *s = &c->shards[start++ % NSHARDS];
		struct ioc__zip_fentry *victim;

		pthread_mutex_lock(&s->lock);
		victim = clock_evict(c, s);
		pthread_mutex_unlock(&s->lock);
		if (victim) {
			fruitless = 0;
			unref(c, victim);
		} else {
			fruitless++;
		}
	}
}

static bool over_budget(struct ioc__zip_fcache *c)
{
	return atomic_load_explicit(&c->bytes, memory_order_relaxed) > c->budget ||
	       atomic_load_explicit(&c->fifo_bytes, memory_order_relaxed) > c->fifo_budget;
}

/* A reader's reference to e, found in the table.  Shard lock held. */
static void hit(struct shard *s, struct ioc__zip_fentry *e, int *state)
{
	s->hits++;
	e->used = true;
	atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
	*state = e->state;
}

/* get (inplace false: an entry with len bytes of data, on probation or,
 * if the ghost remembers key, in the ring) and claim (inplace true: no
 * data, in neither queue, only findable). */
static struct ioc__zip_fentry *find_or_add(struct ioc__zip_fcache *c, uint64_t key,
					   size_t len, bool inplace, bool *created,
					   int *state)
{
	size_t b, g;
	struct shard *s = shard_of(c, key, &b);
	struct ioc__zip_fentry *e, *fresh;

	*created = false;
	pthread_mutex_lock(&s->lock);
	e = lookup(s, b, key);
	if (e) {
		hit(s, e, state);
		pthread_mutex_unlock(&s->lock);
		return e;
	}
	pthread_mutex_unlock(&s->lock);

	/* Miss: allocate outside the lock, then insert unless another thread
	 * inserted first. */
	fresh = calloc(1, sizeof(*fresh));
	if (fresh && !inplace)
		fresh->data = buf_get(c, len, &fresh->pooled);
	if (!fresh || (!inplace && !fresh->data)) {
		free(fresh);
		return NULL;
	}
	fresh->key = key;
	fresh->len = inplace ? 0 : len;
	fresh->state = IOC__ZIP_FC_BUSY;
	fresh->in_table = true;
	fresh->inplace = inplace;
	atomic_init(&fresh->refs, 2); /* the table's and the caller's */

	pthread_mutex_lock(&s->lock);
	e = lookup(s, b, key);
	if (e) {
		hit(s, e, state);
		pthread_mutex_unlock(&s->lock);
		entry_free(c, fresh);
		return e;
	}
	fresh->hnext = s->buckets[b];
	s->buckets[b] = fresh;
	s->count++;
	if (!inplace) {
		s->misses++;
		g = ghost_slot(s, key);
		if (s->ghost[g] == key + 1) {
			/* Dropped from probation lately and wanted again:
			 * keep it. */
			s->ghost[g] = 0;
			s->admitted++;
			fresh->used = true;
			ring_add(&s->hand, fresh);
		} else {
			fresh->probation = true;
			ring_add(&s->fifo, fresh);
			atomic_fetch_add_explicit(&c->fifo_bytes, len, memory_order_relaxed);
		}
		atomic_fetch_add_explicit(&c->bytes, len, memory_order_relaxed);
	}
	pthread_mutex_unlock(&s->lock);
	*created = true;
	*state = IOC__ZIP_FC_BUSY;
	if (!inplace && over_budget(c))
		make_room(c);
	return fresh;
}

struct ioc__zip_fentry *ioc__zip_fcache_get(struct ioc__zip_fcache *c, uint64_t key,
					    size_t len, bool *created, int *state)
{
	return find_or_add(c, key, len, false, created, state);
}

struct ioc__zip_fentry *ioc__zip_fcache_claim(struct ioc__zip_fcache *c, uint64_t key,
					      bool *created, int *state)
{
	return find_or_add(c, key, 0, true, created, state);
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

/* Publish e: final state under the shard lock, then the queued waiters
 * woken after unlocking.  A failed entry, or one decoded in place (src:
 * where its bytes are, copied to each waiter's part first), leaves the
 * table. */
static void publish(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e,
		    const uint8_t *src, int error)
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
	if ((error || e->inplace) && e->in_table) {
		detach(c, s, e);
		dropped = true;
	}
	pthread_mutex_unlock(&s->lock);
	while (w) {
		/* w lives on the waiter's stack: read next before the wake,
		 * which may let it return and reuse that memory.  The copy
		 * comes before the wake, which orders it before the waiter's
		 * reads. */
		struct ioc__zip_fc_waiter *next = w->next;

		if (src && !error && w->len)
			memcpy(w->dst, src + w->lo, w->len);
		ioc_co_await_done(&w->aw, error);
		w = next;
	}
	if (dropped)
		unref(c, e);
}

void ioc__zip_fcache_publish(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e, int error)
{
	publish(c, e, NULL, error);
}

void ioc__zip_fcache_publish_inplace(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e,
				     const uint8_t *src, int error)
{
	publish(c, e, src, error);
}

void ioc__zip_fcache_put(struct ioc__zip_fcache *c, struct ioc__zip_fentry *e)
{
	unref(c, e);
	/* An insert that found every entry in use left the cache over its
	 * budget: the entry just put may be the one to evict. */
	if (over_budget(c))
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
		st->admitted += s->admitted;
		pthread_mutex_unlock(&s->lock);
	}
	st->bytes = atomic_load_explicit(&c->bytes, memory_order_relaxed);
	st->probation_bytes = atomic_load_explicit(&c->fifo_bytes, memory_order_relaxed);
}
