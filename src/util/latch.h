/*
 * A count-down latch: one thread waits until others have each reported
 * once.  The node drain (src/node/drain.c) and the NBD server's gate
 * (src/nbd/conn.c) wait this way for every loop to apply a new state.
 *
 * Sleep/wake handshake: the waiter sets the count under the mutex before
 * it asks anyone to report; each reporter decrements it under the mutex
 * and broadcasts at 0; the waiter sleeps on the condvar only while the
 * count is positive, rechecking under the mutex, so no wakeup is lost.
 * Internal; header-only (a mutex, a condvar and a count need no more).
 */
#ifndef IOC_UTIL_LATCH_H
#define IOC_UTIL_LATCH_H

#include <pthread.h>

struct ioc__latch {
	pthread_mutex_t lock;   /* guards pending, with cond */
	pthread_cond_t cond;
	unsigned pending;       /* reports still awaited */
};

static inline void ioc__latch_init(struct ioc__latch *l)
{
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cond, NULL);
	l->pending = 0;
}

static inline void ioc__latch_destroy(struct ioc__latch *l)
{
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
}

/* Await n reports (before asking for them). */
static inline void ioc__latch_set(struct ioc__latch *l, unsigned n)
{
	pthread_mutex_lock(&l->lock);
	l->pending = n;
	pthread_mutex_unlock(&l->lock);
}

/* One report (any thread); the last one wakes the waiter. */
static inline void ioc__latch_report(struct ioc__latch *l)
{
	pthread_mutex_lock(&l->lock);
	if (--l->pending == 0)
		pthread_cond_broadcast(&l->cond);
	pthread_mutex_unlock(&l->lock);
}

/* Wait until every report awaited has come, after giving up unused ones
 * first: a waiter that set more than it asked for (its count not yet
 * known) gives the difference back here. */
static inline void ioc__latch_wait(struct ioc__latch *l, unsigned unused)
{
	pthread_mutex_lock(&l->lock);
	l->pending -= unused;
	while (l->pending > 0)
		pthread_cond_wait(&l->cond, &l->lock);
	pthread_mutex_unlock(&l->lock);
}

#endif /* IOC_UTIL_LATCH_H */
